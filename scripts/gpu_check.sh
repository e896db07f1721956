#!/usr/bin/env bash
# One prepared GPU check: the CUDA tests and the engine benchmark on CUDA.
# Usage: scripts/gpu_check.sh [OUT_DIR]   (needs a CUDA build of torch installed)
set -uo pipefail
out=${1:-${OUT:-gpu_check_out}}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
"$py" -c "import torch; print('device:', torch.cuda.get_device_name(0), 'torch', torch.__version__)" | tee "$out/device.txt"
"$py" -m pytest -q -m gpu tests 2>&1 | tee "$out/gpu_tests.log"
"$py" benchmarks/engine.py --device cuda --runs 3 --json "$out/engine_cuda.json" 2>&1 | tee "$out/engine_cuda.log"
