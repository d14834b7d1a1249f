#!/usr/bin/env bash
# One full GPU session: install, self-check, GPU tests, runtime benchmarks; logs under $OUT.
#   OUT=/tmp/out STITCHCUDA_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/run_gpu.sh [tests...]
# Arguments are pytest paths (default: tests/gpu). Set SKIP_BENCH=1 to stop after the tests.
set -u -o pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export STITCHCUDA_CUDA_ARCHS=${STITCHCUDA_CUDA_ARCHS:-90}
log() { echo "== $* ($(date -u +%H:%M:%S))"; }

log "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m pip show nvidia-cublas scikit-build-core pybind11 2>/dev/null | grep -E "^(Name|Version)" | tee -a "$OUT/gpu.txt"

log "build and install"
env | grep -i -E "^(LDFLAGS|CXXFLAGS|CFLAGS|CC|CXX)=" || true
t0=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -q . > "$OUT/install.log" 2>&1 || { tail -50 "$OUT/install.log"; exit 1; }
echo "install took $(( $(date +%s) - t0 )) s"

log "selfcheck"
(cd /tmp && stitchcuda selfcheck) 2>&1 | tee "$OUT/selfcheck.log"

log "GPU tests"
tests=${*:-tests/gpu}
python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/pytest-gpu.xml" $tests 2>&1 | tee "$OUT/pytest-gpu.log" | tail -40
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0

log "runtime host benchmark (C++)"
PKG=$(python3 -c "import stitchcuda, os; print(os.path.dirname(stitchcuda.__file__))")
LT=$(python3 -c "import nvidia, os; print([os.path.join(p,'cu13') for p in nvidia.__path__ if os.path.exists(os.path.join(p,'cu13','lib','libcublasLt.so.13'))][0])")
nvcc -O2 -std=c++17 -arch=sm_90 benchmarks/runtime_host.cu -I"$PKG/include" -I"$LT/include" \
  -L"$PKG/lib" -lstitchrt -L"$LT/lib" -l:libcublasLt.so.13 -Xlinker -rpath,"$PKG/lib:$LT/lib" \
  -o /tmp/runtime_host || exit 1
# Overhead against bare cuBLASLt: the same algorithm and one launch on both sides.
STITCHCUDA_GEMM_AUTOTUNE=0 STITCHCUDA_GEMM_GELU=fused /tmp/runtime_host | tee "$OUT/runtime_host.json"
# As users get it (autotuned plans; the first call pays the tuning).
/tmp/runtime_host | tee "$OUT/runtime_host_tuned.json"

log "runtime benchmark (Python)"
python3 benchmarks/bench_runtime.py --out "$OUT/bench_runtime.json" 2>&1 | tee "$OUT/bench_runtime.log"
log "done"
