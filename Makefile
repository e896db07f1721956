PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip

# --- which torch ---------------------------------------------------------------
# torch is pinned to the version the rest of the stack (fbgemm 1.8.0, torchrec 1.8.0)
# was tested with, and installed first, on its own, from TORCH_INDEX:
#   make install                       the CPU build from PyTorch's CPU index (default)
#   make TORCH_INDEX= install          PyPI's own build (on Linux x86-64: the multi-GB CUDA one)
#   make TORCH_INDEX=https://download.pytorch.org/whl/cu128 install   a given CUDA build
# Only torch (and its own dependencies, which PyTorch's index serves) comes from
# TORCH_INDEX; everything else from pip's usual index (PyPI).
TORCH_VERSION := 2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# The build the index names ("cpu", "cu128", ...; empty for PyPI's own).
TORCH_BUILD := $(notdir $(patsubst %/,%,$(TORCH_INDEX)))
# An optional local wheel cache, tried first for that build (torch-$(TORCH_VERSION)+cpu-*.whl
# for the CPU index), with the index as the fallback; ignored when it holds none (this
# machine has one; machines without one go straight to the index). `make WHEELS= install`
# skips it.
WHEELS ?= /opt/wheels
TORCH_CACHED := $(and $(TORCH_BUILD),$(WHEELS),$(wildcard $(WHEELS)/torch-$(TORCH_VERSION)+$(TORCH_BUILD)-*.whl))

# --- torchrec ------------------------------------------------------------------
# torchrec names the CUDA fbgemm-gpu as a dependency, so its dependencies come from
# pyproject's extra for this torch build ("torchrec": fbgemm-gpu-cpu; "torchrec-cuda":
# fbgemm-gpu) and torchrec itself is installed with --no-deps.
# `make TORCHREC_EXTRA= install` skips torchrec (its tests then skip), e.g. on macOS,
# where fbgemm has no wheels.
TORCHREC_VERSION := 1.8.0
TORCHREC_EXTRA ?= $(if $(filter cpu,$(TORCH_BUILD)),torchrec,torchrec-cuda)
comma := ,
EXTRAS = dev$(if $(TORCHREC_EXTRA),$(comma)$(TORCHREC_EXTRA))

.PHONY: demo test lint format typecheck install clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
ifneq ($(TORCH_INDEX),)
	$(if $(TORCH_CACHED),$(PIP) install -q --find-links $(WHEELS) 'torch==$(TORCH_VERSION)+$(TORCH_BUILD)' ||) \
	$(PIP) install -q --index-url $(TORCH_INDEX) 'torch==$(TORCH_VERSION)' || { \
	  echo "could not install torch $(TORCH_VERSION) from $(TORCH_INDEX): put its wheel in" \
	       "WHEELS=$(WHEELS), or take PyPI's build with 'make TORCH_INDEX= install'" >&2; exit 1; }
else
	$(PIP) install -q 'torch==$(TORCH_VERSION)'
endif
	# torch==$(TORCH_VERSION) again: the installed build satisfies it, so nothing replaces it.
	$(PIP) install -q 'torch==$(TORCH_VERSION)' -e '.[$(EXTRAS)]'
ifneq ($(TORCHREC_EXTRA),)
	$(PIP) install -q --no-deps torchrec==$(TORCHREC_VERSION)
endif
	$(BIN)/python -c "import torch; print('installed torch', torch.__version__)"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/dlrm.py

# The suite on every core (pytest-xdist, a file's tests on one worker: its shared fixtures run
# once); each test process computes on one thread (tests/conftest.py), so workers do not wait on
# each other's OpenMP barriers. Files are handed out costliest first (tests/durations.txt, written by
# scripts/test_durations.py; --no-loadscope-reorder keeps that order), so no worker waits long for the
# other at the end. The 15 slowest tests are printed: the cost stays visible.
test: $(STAMP)
	$(BIN)/python -m ruff check cb_callback integrations tests examples benchmarks
	$(BIN)/python -m ruff format --check cb_callback integrations tests examples benchmarks scripts
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=15

lint: $(STAMP)
	$(BIN)/python -m ruff check cb_callback integrations tests examples benchmarks
	$(BIN)/python -m ruff format --check cb_callback integrations tests examples benchmarks scripts

format: $(STAMP)
	$(BIN)/python -m ruff format cb_callback integrations tests examples benchmarks scripts

typecheck: $(STAMP)
	$(BIN)/python -m mypy

clean:
	rm -rf $(VENV) build *.egg-info
