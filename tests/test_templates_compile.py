"""Every CUDA template instantiated for every storage type, compiled by nvcc (no GPU needed).

One translation unit per template (reduce, elementwise, attention, recurrent), each instantiating every
entry point for float, __half and __nv_bfloat16 plus a few hook / mixed-type combinations, and
the GPU tests' harness sources; all compiled in parallel with
`nvcc -arch=sm_90 -std=c++17 -c -I templates -I runtime/include` (attention also for sm_80, and on
sm_90 with ptxas' spill warnings on: no attention kernel may spill there). Skipped when nvcc is
absent.

The attention unit and the attention harness instantiate the same kernels (every head dim, type
and variant): on sm_90, where both are compiled with the same flags, they are one translation unit
(the harness, then the unit) and one nvcc call, whose result both tests read: the same kernels
through cicc and ptxas once, not twice (the attention units are most of this file's time).
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "templates"
RUNTIME_INCLUDE = REPO / "runtime" / "include"
HARNESS = REPO / "tests" / "gpu" / "harness"

STORAGE = ["float", "__half", "__nv_bfloat16"]

REDUCE_TU = r"""
#include "stitch/reduce.cuh"
using namespace stitch;

template <class T, class Tout>
void every_row_op(const T* x, Tout* y, const T* w, cudaStream_t s) {
  launch_softmax(x, 64, y, 64, 8, 64, s);
  launch_log_softmax(x, 64, y, 64, 8, 64, s);
  launch_logsumexp(x, 64, y, 1, 8, 64, s);
  launch_row_sum(x, 64, y, 1, 8, 64, s);
  launch_row_mean(x, 64, y, 1, 8, 64, s);
  launch_row_max(x, 64, y, 1, 8, 64, s);
  launch_row_min(x, 64, y, 1, 8, 64, s);
  launch_row_var(x, 64, y, 1, 8, 64, true, s);
  launch_layer_norm(x, 64, y, 64, w, w, 8, 64, 1e-5f, s);
  launch_rms_norm(x, 64, y, 64, w, 8, 64, 1e-6f, s);
  for (AxisParams<T, Tout> p : {AxisParams<T, Tout>{x, 2, 3, 4, 12, 4, 1, y, 4, 1}}) {
    launch_reduce_axis<AxisOp::Sum>(p, s);
    launch_reduce_axis<AxisOp::Mean>(p, s);
    launch_reduce_axis<AxisOp::Max>(p, s);
    launch_reduce_axis<AxisOp::Min>(p, s, Identity{}, EpHook<Relu>{});
  }
}

#define STORAGE_INSTANCES(T) \
  template void every_row_op<T, T>(const T*, T*, const T*, cudaStream_t);
STORAGE_INSTANCES(float)
STORAGE_INSTANCES(__half)
STORAGE_INSTANCES(__nv_bfloat16)

// Hooks (scale before softmax, GELU after a norm, sqrt after var) and mixed storage.
struct Sqrt { __device__ float operator()(float x) const { return sqrtf(x); } };
void hooks_and_mixed(const __half* xh, const __nv_bfloat16* xb, float* yf, __half* yh,
                     const float* wf, cudaStream_t s) {
  launch_softmax(xh, 64, yh, 64, 8, 64, s, EpHook<Scale>{{0.125f}});
  launch_softmax(xb, 64, yf, 64, 8, 64, s, Then<EpHook<Scale>, EpHook<AddScalar>>{{{2.f}}, {{1.f}}});
  launch_layer_norm<__nv_bfloat16, float, float>(xb, 64, yf, 64, wf, wf, 8, 64, 1e-5f, s,
                                                 Identity{}, EpHook<GeluErf>{});
  launch_rms_norm<__half, __half, float>(xh, 64, yh, 64, wf, 8, 64, 1e-6f, s, Identity{},
                                         EpHook<Silu>{});
  launch_row_var(xh, 64, yf, 1, 8, 64, false, s, Identity{}, Sqrt{});
  launch_row_mean(xb, 64, yf, 1, 8, 64, s, EpHook<Square>{});
  AxisParams<__nv_bfloat16, float> p{xb, 2, 3, 4, 12, 4, 1, yf, 4, 1};
  launch_reduce_axis<AxisOp::Mean>(p, s, EpHook<Square>{});
}
"""

ELEMENTWISE_TU = r"""
#include "stitch/elementwise.cuh"
using namespace stitch;

struct Fma { __device__ float operator()(float a, float b, float c) const { return a * b + c; } };
struct Lerp4 {
  __device__ float operator()(const float* a) const { return a[0] + a[3] * (a[1] - a[2]); }
};

template <class T>
void every_entry(const T* a, const T* b, const float* f, const bool* m, T* y, float* yf,
                 cudaStream_t s) {
  EwLayout<1> l1{}; EwLayout<2> l2{}; EwLayout<3> l3{}; EwLayout<4> l4{};
  launch_elementwise(EwUnary<EpHook<GeluErf>>{}, y, l1, s, a);
  launch_elementwise(EwAdd{}, y, l2, s, a, b);
  launch_elementwise(EwMul{}, yf, l2, s, a, f);
  launch_elementwise(EwDiv{}, y, l2, s, f, a);
  launch_elementwise(EwWhere{}, y, l3, s, m, a, b);
  launch_elementwise(Spread<3, Fma>{}, y, l3, s, a, b, f);
  launch_elementwise(Lerp4{}, y, l4, s, a, b, a, f);
  launch_elementwise(EwMax{}, (bool*)nullptr, l2, s, a, b);
  launch_strided_copy(a, y, l1, s);
  launch_strided_copy(a, yf, l1, s);
  launch_strided_copy(f, y, l1, s);
  const int64_t shape[4] = {2, 3, 4, 5}, stride[4] = {60, 20, 5, 1};
  const int perm[4] = {0, 2, 3, 1};
  launch_permute(a, shape, stride, 4, perm, y, s);
}

#define STORAGE_INSTANCES(T) \
  template void every_entry<T>(const T*, const T*, const float*, const bool*, T*, float*, cudaStream_t);
STORAGE_INSTANCES(float)
STORAGE_INSTANCES(__half)
STORAGE_INSTANCES(__nv_bfloat16)

void integer_storage(const int64_t* i64, const int32_t* i32, const uint8_t* u8, float* y,
                     int32_t* yi, cudaStream_t s) {
  EwLayout<2> l2{};
  launch_elementwise(EwAdd{}, y, l2, s, i64, i32);
  launch_elementwise(EwMul{}, yi, l2, s, u8, i32);
}
"""

ATTENTION_TU = r"""
#include "stitch/attention.cuh"
using namespace stitch;

// Every kernel at every head dim: the type's default, TF32 (float; the default otherwise), SIMT.
template <class T, int D>
void one_head_dim(const AttnParams<T>& p, cudaStream_t s) {
  static_assert(AttnHeadDim<D>::ok, "a supported head dim");
  launch_attention<T, D>(p, s);
  launch_attention<T, D>(p, s, /*allow_tf32=*/true);
  launch_attention_simt<T, D>(p, s);
}

template <class T>
void every_head_dim(const AttnParams<T>& p, unsigned char* blocks, cudaStream_t s) {
  one_head_dim<T, 16>(p, s);
  one_head_dim<T, 32>(p, s);
  one_head_dim<T, 48>(p, s);
  one_head_dim<T, 64>(p, s);
  one_head_dim<T, 80>(p, s);
  one_head_dim<T, 96>(p, s);
  one_head_dim<T, 112>(p, s);
  one_head_dim<T, 128>(p, s);
  launch_attention_mask_blocks<T>(p, blocks, s);
}

#define STORAGE_INSTANCES(T) \
  template void every_head_dim<T>(const AttnParams<T>&, unsigned char*, cudaStream_t);
STORAGE_INSTANCES(float)
STORAGE_INSTANCES(__half)
STORAGE_INSTANCES(__nv_bfloat16)

cudaError_t tf32_entry(const AttnParams<float>& p, cudaStream_t s) { return launch_attention_tf32<96>(p, s); }
static_assert(!AttnHeadDim<40>::ok && !AttnHeadDim<144>::ok && AttnHeadDim<96>::ok, "head dims");
"""

RECURRENT_TU = r"""
#include "stitch/recurrent.cuh"
using namespace stitch;

struct Tag {};

template <class T>
void every_cell(const RecurrentParams<T>& p, cudaStream_t s) {
  launch_recurrent<RnnMode::Lstm, T, Tag>(p, s);
  launch_recurrent<RnnMode::Gru, T, Tag>(p, s);
  launch_recurrent<RnnMode::RnnTanh, T, Tag>(p, s);
  launch_recurrent<RnnMode::RnnRelu, T, Tag>(p, s);
}

template void every_cell<float>(const RecurrentParams<float>&, cudaStream_t);
template void every_cell<__half>(const RecurrentParams<__half>&, cudaStream_t);
template void every_cell<__nv_bfloat16>(const RecurrentParams<__nv_bfloat16>&, cudaStream_t);
"""

# ptxas reports spills and local memory as warnings (which fail the test) where these are given:
# no attention kernel may spill on sm_90, the architecture the planner's programs target. (On
# sm_80 some 16-bit and TF32 instantiations at D >= 64 spill a few dozen bytes.)
NO_SPILLS = ("-Xptxas", "-warn-spills,-warn-lmem-usage")
EXTRA_FLAGS = {("attention", "sm_90"): NO_SPILLS, ("attention_harness", "sm_90"): NO_SPILLS,
               ("recurrent", "sm_90"): NO_SPILLS}

# name: (source text or harness path, archs)
UNITS = {
    "reduce": (REDUCE_TU, ("sm_90",)),
    "elementwise": (ELEMENTWISE_TU, ("sm_90",)),
    "attention": (ATTENTION_TU, ("sm_90", "sm_80")),
    "recurrent": (RECURRENT_TU, ("sm_90", "sm_80")),
    "reduce_harness": (HARNESS / "reduce_harness.cu", ("sm_90",)),
    "elementwise_harness": (HARNESS / "elementwise_harness.cu", ("sm_90",)),
    "attention_harness": (HARNESS / "attention_harness.cu", ("sm_90",)),
}


#: Units compiled together for an arch (same flags): one nvcc call, one result for each of them.
TOGETHER = {"sm_90": ("attention_harness", "attention")}


def _compile(nvcc: str, name: str, src: Path, out_dir: Path, arch: str):
    out = out_dir / f"{name}-{arch}.o"
    cmd = [nvcc, f"-arch={arch}", "-std=c++17", "-c", f"-I{TEMPLATES}", f"-I{RUNTIME_INCLUDE}",
           "-Xcompiler", "-Wall", *EXTRA_FLAGS.get((name, arch), ()), str(src), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def compiled(nvcc, tmp_path_factory):
    """Compile every unit for every arch, in parallel; {(name, arch): (returncode, output)}."""
    tmp = tmp_path_factory.mktemp("templates_compile")
    srcs = {}
    for name, (text, _) in UNITS.items():
        if isinstance(text, Path):
            srcs[name] = text
        else:
            srcs[name] = tmp / f"{name}.cu"
            srcs[name].write_text(text)
    jobs, same = [], {}
    for arch, names in TOGETHER.items():
        assert all(EXTRA_FLAGS.get((n, arch)) == EXTRA_FLAGS.get((names[0], arch)) for n in names), names
        joined = tmp / ("+".join(names) + ".cu")
        joined.write_text("".join(f'#include "{srcs[n]}"\n' for n in names))
        jobs.append((names[0], joined, arch))
        same.update({(n, arch): (names[0], arch) for n in names})
    jobs += [(name, srcs[name], arch) for name, (_, archs) in UNITS.items() for arch in archs
             if (name, arch) not in same]
    jobs.sort(key=lambda j: "attention" not in j[0])  # the longest first: no core idles at the end
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {(n, a): pool.submit(_compile, nvcc, n, s, tmp, a) for n, s, a in jobs}
        done = {key: f.result() for key, f in futures.items()}
    return {(n, a): done[same.get((n, a), (n, a))] for n, (_, archs) in UNITS.items() for a in archs}


@pytest.mark.parametrize("key", [(n, a) for n, (_, archs) in UNITS.items() for a in archs],
                         ids=lambda k: f"{k[0]}-{k[1]}")
def test_template_compiles(compiled, key):
    rc, output = compiled[key]
    assert rc == 0, f"nvcc failed for {key[0]} ({key[1]}):\n{output}"
    assert "warning" not in output.lower(), f"nvcc warned for {key[0]} ({key[1]}):\n{output}"
