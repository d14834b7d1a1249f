# The environment every GPU script runs its commands in (sourced, from the clone's root): unbuffered
# Python, sm_90 builds, the KernelBench data in ./shared, the build cache under /tmp, and the wheels
# the setup installed into /tmp/site.
export PYTHONUNBUFFERED=1
export STITCHCUDA_CUDA_ARCHS=${STITCHCUDA_CUDA_ARCHS:-90}
export STITCHCUDA_SHARED=${STITCHCUDA_SHARED:-$PWD/shared}
export STITCHCUDA_KERNELBENCH=${STITCHCUDA_KERNELBENCH:-$STITCHCUDA_SHARED/kernelbench/dev.jsonl}
export STITCHCUDA_CACHE=${STITCHCUDA_CACHE:-/tmp/stitchcuda-cache}
if [ -d /tmp/site ]; then export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}; fi
