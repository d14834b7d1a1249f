#!/usr/bin/env bash
# The runtime's GPU session for the binding split, the CUDA-graph runner and cuDNN convolutions:
# install, runtime + graph-runner + convolution GPU tests, convolution benchmark; logs under $OUT.
#   OUT=/tmp/out bash benchmarks/run_conv_gpu.sh [all|install|tests|bench]...
# Each phase fits one 10-minute command; run them one by one when time is short
# (`install tests`, then `bench`). The install is kept between commands on a warm machine.
set -u -o pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export STITCHCUDA_CUDA_ARCHS=${STITCHCUDA_CUDA_ARCHS:-90}
phases=${*:-all}
want() { [[ " $phases " == *" all "* || " $phases " == *" $1 "* ]]; }
log() { echo "== $* ($(date -u +%H:%M:%S))"; }

if want install; then
  log "environment"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
  python3 -m pip show torch nvidia-cublas nvidia-cudnn-cu13 2>/dev/null | grep -E "^(Name|Version)" | tee -a "$OUT/gpu.txt"
  log "build and install"
  t0=$(date +%s)
  python3 -m pip install --no-build-isolation --no-deps -q . > "$OUT/install.log" 2>&1 || { tail -50 "$OUT/install.log"; exit 1; }
  echo "install took $(( $(date +%s) - t0 )) s" | tee -a "$OUT/gpu.txt"
  python3 -c "import torch; from stitchcuda import rt; print('cuDNN (torch)', torch.backends.cudnn.version(), 'runtime', rt.version())" | tee -a "$OUT/gpu.txt"
fi

if want tests; then
  log "GPU tests: runtime, graph runner, convolutions"
  # STITCHCUDA_CONV_LOG=1: one line per convolution plan (candidates, fused or not, chosen engine, time)
  # on stderr; -s lets it (and each case's seed) through pytest's capture.
  STITCHCUDA_CONV_LOG=1 timeout 560 python3 -m pytest -m gpu -q -s -rfE -p no:cacheprovider \
    --junitxml="$OUT/pytest-conv-gpu.xml" tests/gpu/test_runtime_gpu.py tests/gpu/test_conv_gpu.py \
    > "$OUT/pytest-conv-gpu.log" 2> "$OUT/conv-plans.log"
  echo "pytest exit $?"
  tail -40 "$OUT/pytest-conv-gpu.log"
  echo "fused plans: $(grep -c 'chose fused' "$OUT/conv-plans.log"), plain + pass: $(grep -c 'chose plain + ' "$OUT/conv-plans.log"), plain: $(grep -c 'chose plain engine' "$OUT/conv-plans.log")"
fi

if want bench; then
  log "convolution benchmark"
  timeout 560 python3 benchmarks/bench_conv.py --out "$OUT/bench_conv.md" 2>&1 | tee "$OUT/bench_conv.log" | tail -60
fi
log "done"
