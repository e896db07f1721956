PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The local CPU build of torch; an unpinned torch pulls a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PIP := $(BIN)/python -m pip

.PHONY: demo test lint typecheck install clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(FIND_LINKS) $(TORCH_PIN)
	$(PIP) install -q $(FIND_LINKS) $(TORCH_PIN) -e '.[dev]'
	# torchrec names the CUDA fbgemm-gpu as a dependency: install it without deps.
	$(PIP) install -q $(FIND_LINKS) $(TORCH_PIN) fbgemm-gpu-cpu==1.8.0 tensordict pyre-extensions
	$(PIP) install -q --no-deps torchrec==1.8.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/dlrm.py

test: $(STAMP)
	$(BIN)/python -m ruff check cb_callback integrations tests examples benchmarks
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/python -m ruff check cb_callback integrations tests examples benchmarks

typecheck: $(STAMP)
	$(BIN)/python -m mypy

clean:
	rm -rf $(VENV) build *.egg-info
