#!/usr/bin/env bash
# One prepared GPU check: the CUDA tests, the engine and compile what-if benchmarks and the demo on CUDA.
# Usage: scripts/gpu_check.sh [OUT_DIR]       (default: $OUT, else gpu_out)
#
# Everything runs with the venv's .venv/bin/python. Without a .venv it makes one:
#   - where the system python3 already holds a torch that sees the GPU (a GPU image,
#     maybe offline): a venv over it (--system-site-packages) with this package
#     installed editable, downloading nothing;
#   - else `make install TORCH_INDEX=`: PyPI's torch (the CUDA build on Linux x86-64)
#     and the torchrec-cuda extra. Export TORCH_INDEX=https://download.pytorch.org/whl/cu128
#     (say) for another CUDA build.
# Writes into OUT_DIR: device.txt, gpu_tests.log, engine_cuda.{json,log},
# compile_whatif_cuda.{json,log}, demo_cuda.log
# and the demo's report under demo/. Exits non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu_out}}
mkdir -p "$out"
py=.venv/bin/python
export PYTHONUNBUFFERED=1

sees_gpu() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

if ! sees_gpu "$py"; then
    if [ -x "$py" ]; then
        echo "gpu_check: .venv exists but its torch sees no GPU (a CPU build?);" \
             "remove it (make clean) and run again" >&2
        exit 1
    elif sees_gpu python3; then
        python3 -m venv --system-site-packages .venv &&
            "$py" -m pip install -q --no-deps --no-build-isolation -e . || exit 1
    else
        make install TORCH_INDEX="${TORCH_INDEX-}" || exit 1
    fi
    if ! sees_gpu "$py"; then
        echo "gpu_check: the torch in .venv sees no GPU" >&2
        exit 1
    fi
fi

status=0
"$py" -c "import torch; print('device:', torch.cuda.get_device_name(0), '| torch', torch.__version__)" \
    | tee "$out/device.txt" || status=1
"$py" -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tee "$out/gpu_tests.log" || status=1
"$py" benchmarks/engine.py --device cuda --runs 3 --json "$out/engine_cuda.json" 2>&1 \
    | tee "$out/engine_cuda.log" || status=1
"$py" benchmarks/compile_whatif.py --device cuda --json "$out/compile_whatif_cuda.json" 2>&1 \
    | tee "$out/compile_whatif_cuda.log" || status=1
if "$py" -c "import torchrec" 2>/dev/null; then
    "$py" examples/dlrm.py --device cuda --out "$out/demo" 2>&1 | tee "$out/demo_cuda.log" || status=1
else
    # The DLRM demo needs torchrec (make install TORCH_INDEX= installs it); the GPT
    # example exercises the same callback on CUDA without it.
    echo "gpu_check: torchrec is not installed: examples/gpt.py instead of the DLRM demo" \
        | tee "$out/demo_cuda.log"
    "$py" examples/gpt.py --device cuda --out "$out/demo" 2>&1 | tee -a "$out/demo_cuda.log" || status=1
fi
echo "gpu_check: $([ "$status" = 0 ] && echo ok || echo FAILED); outputs in $out"
exit "$status"
