"""Every CUDA template instantiated for every storage type, compiled by nvcc (no GPU needed).

One translation unit per template (reduce, elementwise, attention, recurrent), each instantiating every
entry point for float, __half and __nv_bfloat16 plus a few hook / mixed-type combinations, and
the GPU tests' harness sources; all compiled with
`nvcc -arch=sm_90 -std=c++17 -c -I templates -I runtime/include` (attention and recurrent also for
sm_80, and on sm_90 with ptxas' spill warnings on: no attention or recurrent kernel may spill
there). Skipped when nvcc is absent.

A template's unit and its GPU harness instantiate mostly the same kernels: on sm_90, where both
are compiled with the same flags, they are one translation unit (the harness, then the unit) and
one nvcc call, whose result both tests read: the same kernels through cicc and ptxas once, not
twice. The commands start in the background when the session starts (``ahead_commands``,
tests/ahead.py), longest first; the tests read their results.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests import ahead

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
  const AxisRowParams<T, Tout> q{x, 2, 3, 8, 24, 8, 1, y, 24, 8, 1};
  launch_softmax_axis<RowOp::Softmax>(q, s);
  launch_softmax_axis<RowOp::LogSoftmax>(q, s, EpHook<Scale>{{0.5f}}, EpHook<Relu>{});
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
  const AxisRowParams<__half, float> q{xh, 2, 20, 8, 160, 8, 1, yf, 160, 8, 1};
  launch_softmax_axis<RowOp::Softmax>(q, s);
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
  launch_elementwise_once(EwAdd{}, y, l2, s, a, b);  // (create-phase work: one kernel)
  launch_elementwise_once(Spread<3, Fma>{}, y, l3, s, a, b, f);
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

// Every kernel at every head dim: the type's default, TF32 (float; the default otherwise), SIMT,
// split TF32 (float).
template <class T, int D>
void one_head_dim(const AttnParams<T>& p, cudaStream_t s) {
  static_assert(AttnHeadDim<D>::ok, "a supported head dim");
  launch_attention<T, D>(p, s);
  launch_attention<T, D>(p, s, /*allow_tf32=*/true);
  launch_attention_simt<T, D>(p, s);
  if constexpr (std::is_same_v<T, float>) launch_attention_split_tf32<D>(p, s);
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


#: Units compiled together for an arch (the same flags): one translation unit and one nvcc call
#: per group, whose result each of its units reads.
TOGETHER = {"sm_90": (("attention_harness", "attention"), ("reduce_harness", "reduce"),
                      ("elementwise_harness", "elementwise"))}
#: nvcc's wall time on one core, roughly (s): the lane and the pool take the longest first, so
#: no core idles at the end.
COST = {"reduce_harness": 90, "attention_harness": 60, "attention": 55, "elementwise_harness": 25}


def _jobs() -> dict[str, tuple[tuple[str, ...], str]]:
    """{job key: (units, arch)}, longest first: each group of TOGETHER is one job, every other
    (unit, arch) its own."""
    grouped = {(n, a) for a, groups in TOGETHER.items() for g in groups for n in g}
    jobs = {f"{'+'.join(g)}-{a}": (g, a) for a, groups in TOGETHER.items() for g in groups}
    jobs.update({f"{n}-{a}": ((n,), a) for n, (_, archs) in UNITS.items() for a in archs if (n, a) not in grouped})
    return dict(sorted(jobs.items(), key=lambda kv: -COST.get(kv[1][0][0], 10)))


def _source(units: tuple[str, ...], out_dir: Path) -> Path:
    """The translation unit of ``units``: a harness file as it is, a unit's text written out, a
    group as one file that includes each of them in order."""
    if len(units) > 1:
        path = out_dir / ("+".join(units) + ".cu")
        path.write_text("".join(f'#include "{_source((n,), out_dir)}"\n' for n in units))
        return path
    text = UNITS[units[0]][0]
    if isinstance(text, Path):
        return text
    path = out_dir / f"{units[0]}.cu"
    path.write_text(text)
    return path


def ahead_commands(out_dir: Path) -> dict[str, list[str]]:
    """Every nvcc command of this file, longest first (run in the background: tests/ahead.py)."""
    nvcc = ahead.nvcc()
    if nvcc is None:
        return {}
    commands = {}
    for key, (units, arch) in _jobs().items():
        flags = {EXTRA_FLAGS.get((n, arch), ()) for n in units}
        assert len(flags) == 1, f"{units} on {arch}: one nvcc call needs the same flags"
        commands[key] = [nvcc, f"-arch={arch}", "-std=c++17", "-c", f"-I{TEMPLATES}", f"-I{RUNTIME_INCLUDE}",
                         "-Xcompiler", "-Wall", *flags.pop(), str(_source(units, out_dir)),
                         "-o", str(out_dir / f"{key}.o")]
    return commands


@pytest.fixture(scope="module")
def compiled(nvcc, tmp_path_factory):
    """Compile every unit for every arch (started in the background); {(name, arch): (returncode, output)}."""
    done = ahead.results(sys.modules[__name__], tmp_path_factory.mktemp("templates_compile"))
    return {(n, arch): (done[key].returncode, done[key].output)
            for key, (units, arch) in _jobs().items() for n in units}


@pytest.mark.parametrize("key", [(n, a) for n, (_, archs) in UNITS.items() for a in archs],
                         ids=lambda k: f"{k[0]}-{k[1]}")
def test_template_compiles(compiled, key):
    rc, output = compiled[key]
    assert rc == 0, f"nvcc failed for {key[0]} ({key[1]}):\n{output}"
    assert "warning" not in output.lower(), f"nvcc warned for {key[0]} ({key[1]}):\n{output}"
