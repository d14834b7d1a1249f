"""The runtime where there is no GPU (CI): it builds, imports, checks arguments through the C ABI,
refuses GPU work with NoDeviceError, and everything a generated program compiles against
(runtime headers, templates, the example program, the host benchmark) compiles for sm_90."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
from pathlib import Path

import pytest

import stitchcuda
from stitchcuda import rt
from tests import ahead

REPO = Path(__file__).resolve().parents[1]
NO_GPU = not stitchcuda.has_gpu()

# st_status values (stitchrt.h)
ST_OK, ST_ERR_INVALID_ARGUMENT, ST_ERR_NO_DEVICE = 0, 1, 4
ST_FLOAT32, ST_FLOAT16, ST_BFLOAT16, ST_FLOAT64 = 0, 1, 2, 3
ST_POLICY_FP32, ST_POLICY_TF32, ST_POLICY_BF16 = 0, 1, 2
ST_EPI_NONE, ST_EPI_BIAS = 0, 1


class GemmArgs(ctypes.Structure):
    """st_gemm_args, field for field."""

    _fields_ = [
        ("policy", ctypes.c_int), ("epilogue", ctypes.c_int),
        ("m", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("batch", ctypes.c_int64),
        ("a", ctypes.c_void_p), ("lda", ctypes.c_int64), ("stride_a", ctypes.c_int64), ("trans_a", ctypes.c_int32),
        ("a_dtype", ctypes.c_int),
        ("b", ctypes.c_void_p), ("ldb", ctypes.c_int64), ("stride_b", ctypes.c_int64), ("trans_b", ctypes.c_int32),
        ("b_dtype", ctypes.c_int),
        ("c", ctypes.c_void_p), ("ldc", ctypes.c_int64), ("stride_c", ctypes.c_int64),
        ("out", ctypes.c_void_p), ("ldo", ctypes.c_int64), ("stride_out", ctypes.c_int64), ("out_dtype", ctypes.c_int),
        ("bias", ctypes.c_void_p),
        ("alpha", ctypes.c_float), ("beta", ctypes.c_float),
    ]


@pytest.fixture(scope="module")
def lib():
    so = stitchcuda.LIB_DIR / "libstitchrt.so"
    assert so.is_file(), f"{so} missing from the installed package"
    lib = ctypes.CDLL(str(so))
    lib.st_last_error.restype = ctypes.c_char_p
    lib.st_status_name.restype = ctypes.c_char_p
    lib.st_dtype_name.restype = ctypes.c_char_p
    lib.st_dtype_size.restype = ctypes.c_size_t
    lib.st_gemm.argtypes = [ctypes.POINTER(GemmArgs), ctypes.c_void_p]
    return lib


def valid_args(**over) -> GemmArgs:
    g = GemmArgs(policy=ST_POLICY_FP32, epilogue=ST_EPI_NONE, m=8, n=4, k=16, batch=1,
                 a=0x10000, lda=16, a_dtype=ST_FLOAT32, b=0x20000, ldb=4, b_dtype=ST_FLOAT32,
                 out=0x30000, ldo=4, out_dtype=ST_FLOAT32, alpha=1.0, beta=0.0)
    for k, v in over.items():
        setattr(g, k, v)
    return g


def test_package_imports_and_reports_version():
    assert re.fullmatch(r"\d+\.\d+\.\d+", rt.version())
    assert "mish" in rt.epilogue_ops() and "gelu_tanh" in rt.epilogue_ops()
    for name in ["StitchError", "ArgumentError", "CudaError", "CublasError", "NoDeviceError", "OutOfMemoryError"]:
        assert issubclass(getattr(stitchcuda, name), RuntimeError)
    assert issubclass(stitchcuda.ArgumentError, ValueError)


def test_stubs_cover_the_module():
    stub = (Path(stitchcuda.__file__).parent / "_rt.pyi").read_text()
    public = [n for n in dir(rt) if not n.startswith("_")]
    missing = [n for n in public if not re.search(rf"\b(def|class) {n}\b|^{n}:", stub, re.M)]
    assert not missing, f"_rt.pyi lacks {missing}"


def test_installed_layout_resolves_its_libraries():
    pkg = Path(stitchcuda.__file__).parent
    for rel in ["include/stitchrt/stitchrt.h", "include/stitchrt/program.h", "include/stitch/epilogue.cuh",
                "lib/libstitchrt.so", "examples/example_mlp.cu"]:
        assert (pkg / rel).is_file(), rel
    for so in [pkg / "lib" / "libstitchrt.so", Path(rt.__file__)]:
        out = subprocess.run(["ldd", str(so)], capture_output=True, text=True).stdout
        assert "not found" not in out, f"{so.name}: {out}"
        assert "libtorch" not in out, f"{so.name} must not depend on PyTorch"


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU behaviour")
def test_no_gpu_is_a_clear_error():
    assert rt.device_count() == 0
    assert not stitchcuda.has_gpu()
    with pytest.raises(stitchcuda.NoDeviceError, match="no CUDA device"):
        rt.require_device()
    torch = pytest.importorskip("torch")
    with pytest.raises(stitchcuda.NoDeviceError, match="no CUDA device"):
        rt.gemm(torch.ones(2, 2), torch.ones(2, 2))
    with pytest.raises(stitchcuda.NoDeviceError):
        rt.DeviceTensor([4, 4])
    with pytest.raises(stitchcuda.NoDeviceError):
        rt.plan_cache_stats()


def test_python_argument_errors_before_any_device_work():
    with pytest.raises(stitchcuda.ArgumentError, match="policy must be one of 'fp32', 'tf32', 'bf16', 'fp16'; got 'fp8'"):
        rt.gemm(None, None, policy="fp8")
    with pytest.raises(stitchcuda.ArgumentError, match="epilogue must be one of"):
        rt.gemm(None, None, epilogue="swish")
    with pytest.raises(stitchcuda.ArgumentError, match="unknown op 'swish'; known ops: scale"):
        rt.gemm(None, None, ops=["swish"])
    with pytest.raises(stitchcuda.ArgumentError, match="'scale' needs a value"):
        rt.gemm(None, None, ops=["scale"])
    with pytest.raises(stitchcuda.ArgumentError, match="at most 8 ops"):
        rt.gemm(None, None, ops=["relu"] * 9)


def call_gemm(lib, g: GemmArgs) -> tuple[int, str]:
    status = lib.st_gemm(ctypes.byref(g), None)
    return status, lib.st_last_error().decode()


@pytest.mark.parametrize("over,message", [
    (dict(a_dtype=ST_FLOAT64), "a has dtype float64, policy fp32 expects float32"),
    (dict(policy=ST_POLICY_BF16), "a has dtype float32, policy bf16 expects bfloat16"),
    (dict(out_dtype=ST_FLOAT16), "out has dtype float16, policy fp32 expects float32"),
    (dict(a=0x10002), "a is not aligned to its element size (4 bytes)"),
    (dict(out=0x30001), "out is not aligned to its element size"),
    (dict(lda=15), "lda=15 is smaller than a row of a (16)"),
    (dict(ldb=3), "ldb=3 is smaller than a row of b (4)"),
    (dict(ldo=2), "ldo=2 is smaller than a row of out (4)"),
    (dict(m=0), "m, n, k must be >= 1"),
    (dict(batch=0), "batch must be in [1, 2^31)"),
    (dict(epilogue=ST_EPI_BIAS), "adds a bias but bias is null"),
    (dict(beta=1.0), "beta != 0 needs c"),
    (dict(b=None), "a, b and out must be non-null"),
    (dict(batch=2, stride_out=8), "out batch items overlap"),
    (dict(epilogue=42), "epilogue 42 is not one of st_epilogue"),
])
def test_c_abi_gemm_argument_errors(lib, over, message):
    status, msg = call_gemm(lib, valid_args(**over))
    assert status == ST_ERR_INVALID_ARGUMENT, msg
    assert message in msg


@pytest.mark.parametrize("over,message", [
    (dict(policy=ST_POLICY_BF16), "the policy must be fp32 (the precision it stands in for), got bf16"),
    (dict(lda=15), "lda=15 is smaller than a row of a (16)"),
    (dict(beta=1.0), "beta != 0 needs c"),
])
def test_c_abi_split_tf32_gemm_argument_errors(lib, over, message):
    """The split-TF32 GEMM is an fp32 GEMM's arguments, judged as st_gemm judges them, before
    any device work."""
    lib.st_gemm_split_tf32.argtypes = [ctypes.POINTER(GemmArgs), ctypes.c_void_p]
    status = lib.st_gemm_split_tf32(ctypes.byref(valid_args(**over)), None)
    msg = lib.st_last_error().decode()
    assert status == ST_ERR_INVALID_ARGUMENT, msg
    assert message in msg


def test_c_abi_valid_gemm_without_gpu_is_no_device(lib):
    if not NO_GPU:
        pytest.skip("a GPU is present")
    status, msg = call_gemm(lib, valid_args())
    assert status == ST_ERR_NO_DEVICE, msg


def test_c_abi_names(lib):
    assert lib.st_status_name(ST_ERR_INVALID_ARGUMENT) == b"invalid argument"
    assert lib.st_dtype_name(ST_BFLOAT16) == b"bfloat16"
    assert lib.st_dtype_size(ST_BFLOAT16) == 2
    assert lib.st_version() == 100


# --------------------------------------------------------------------------- CUDA-graph runner

GRAPH_BODY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


def _graph_abi(lib):
    lib.st_graph_cache_create.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p)]
    lib.st_graph_cache_destroy.argtypes = [ctypes.c_void_p]
    lib.st_graph_cache_destroy.restype = None
    lib.st_graph_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int32,
                                 GRAPH_BODY, ctypes.c_void_p]
    lib.st_graph_cache_stats.argtypes = [ctypes.c_void_p] + [ctypes.POINTER(ctypes.c_int64)] * 3
    return lib


def _graph_stats(lib, g) -> tuple[int, int, int]:
    e, c, r = ctypes.c_int64(-1), ctypes.c_int64(-1), ctypes.c_int64(-1)
    assert lib.st_graph_cache_stats(g, ctypes.byref(e), ctypes.byref(c), ctypes.byref(r)) == ST_OK
    return e.value, c.value, r.value


def test_c_abi_graph_runner_checks_arguments_before_running_anything(lib):
    lib = _graph_abi(lib)
    out = ctypes.c_void_p(0x1234)
    assert lib.st_graph_cache_create(0, ctypes.byref(out)) == ST_ERR_INVALID_ARGUMENT
    assert "st_graph_cache_create: slots must be >= 1, got 0" in lib.st_last_error().decode()
    assert out.value is None, "out is cleared on failure"
    assert lib.st_graph_cache_create(4, None) == ST_ERR_INVALID_ARGUMENT
    assert "out is null" in lib.st_last_error().decode()
    assert lib.st_graph_cache_create(4, ctypes.byref(out)) == ST_OK and out.value
    g = out.value
    calls = []
    body = GRAPH_BODY(lambda ctx, stream: calls.append(stream) or ST_OK)
    key = (ctypes.c_void_p * 2)(0x1000, 0x2000)
    for args, message in [
        ((None, None, key, 2, body, None), "st_graph_run: cache is null"),
        ((g, None, key, -1, body, None), "st_graph_run: n_key must be >= 0, got -1"),
        ((g, None, None, 2, body, None), "st_graph_run: key is null but n_key is 2"),
        ((g, None, key, 2, GRAPH_BODY(), None), "st_graph_run: body is null"),
    ]:
        assert lib.st_graph_run(*args) == ST_ERR_INVALID_ARGUMENT, message
        assert message in lib.st_last_error().decode()
    assert calls == [], "a refused call must not run its body"
    assert _graph_stats(lib, g) == (0, 0, 0)
    assert lib.st_graph_cache_stats(None, None, None, None) == ST_ERR_INVALID_ARGUMENT
    assert "st_graph_cache_stats: cache is null" in lib.st_last_error().decode()
    lib.st_graph_cache_destroy(g)
    lib.st_graph_cache_destroy(None)


def test_c_abi_graph_runner_legacy_stream_without_a_device_runs_eagerly(lib):
    """The legacy default stream's runs go by a stream of the runtime's own where there is a device
    (tests/gpu/test_runtime_gpu.py); where that stream cannot be made, as here without a GPU, every
    run is eager on the caller's stream, and the body's status comes back as is."""
    lib = _graph_abi(lib)
    out = ctypes.c_void_p()
    assert lib.st_graph_cache_create(2, ctypes.byref(out)) == ST_OK
    g = out.value
    calls = []
    body = GRAPH_BODY(lambda ctx, stream: calls.append((ctx, stream)) or ST_OK)
    key = (ctypes.c_void_p * 3)(0x1000, 0x2000, 0x3000)
    for _ in range(3):
        assert lib.st_graph_run(g, None, key, 3, body, ctypes.c_void_p(0xC0FFEE)) == ST_OK
    assert calls == [(0xC0FFEE, None)] * 3
    assert _graph_stats(lib, g) == (3, 0, 0)
    failing = GRAPH_BODY(lambda ctx, stream: 6)  # ST_ERR_NOT_SUPPORTED
    assert lib.st_graph_run(g, None, key, 0, failing, None) == 6
    assert _graph_stats(lib, g) == (4, 0, 0)
    lib.st_graph_cache_destroy(g)


# --------------------------------------------------------------------------- compile checks


def nvcc_command(nvcc: str, src: Path, out: Path, *extra: str) -> list[str]:
    return [nvcc, "-arch=sm_90", "-std=c++17", "-O2", f"-I{stitchcuda.INCLUDE_DIR}", *extra, str(src), "-o", str(out)]


def nvcc_compile(nvcc: str, src: Path, out: Path, *extra: str) -> None:
    cmd = nvcc_command(nvcc, src, out, *extra)
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"nvcc failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}"


EPILOGUE_TU = r"""
#include "stitch/epilogue.cuh"
using namespace stitch;
template <class T, class F> cudaError_t run(const EpilogueParams<T>& p, F f) { return launch_epilogue(p, f, 0); }
#define ALL(T) \
  template cudaError_t run<T, Chain<Scale, LeakyRelu>>(const EpilogueParams<T>&, Chain<Scale, LeakyRelu>); \
  template cudaError_t run<T, Chain<BiasAdd, GeluErf, ResidualAdd>>(const EpilogueParams<T>&, Chain<BiasAdd, GeluErf, ResidualAdd>); \
  template cudaError_t run<T, Chain<Silu, Sigmoid, Tanh, Mish, Hardtanh, Clamp, GeluTanh, Relu>>(const EpilogueParams<T>&, Chain<Silu, Sigmoid, Tanh, Mish, Hardtanh, Clamp, GeluTanh, Relu>); \
  template cudaError_t run<T, Chain<DivScalar, AddScalar, Softplus, Hardswish, Elu, Abs, Exp, Square>>(const EpilogueParams<T>&, Chain<DivScalar, AddScalar, Softplus, Hardswish, Elu, Abs, Exp, Square>); \
  template cudaError_t run<T, RuntimeChain>(const EpilogueParams<T>&, RuntimeChain);
ALL(float)
ALL(__half)
ALL(__nv_bfloat16)
"""


def ahead_commands(out_dir: Path) -> dict[str, list[str]]:
    """The epilogue unit, the longest compile here (run in the background: tests/ahead.py)."""
    nvcc = ahead.nvcc()
    if nvcc is None:
        return {}
    src = out_dir / "epilogue_all.cu"
    src.write_text(EPILOGUE_TU)
    return {"epilogue": nvcc_command(nvcc, src, out_dir / "epilogue_all.o", "-c")}


def test_epilogue_template_compiles_for_sm90(nvcc, tmp_path):
    r = ahead.results(sys.modules[__name__], tmp_path)["epilogue"]
    assert r.returncode == 0, f"nvcc failed:\n{r.output[-4000:]}"


def test_example_program_compiles_and_links_for_sm90(nvcc, tmp_path):
    so = tmp_path / "example_mlp.so"
    nvcc_compile(nvcc, stitchcuda.PACKAGE_DIR / "examples" / "example_mlp.cu", so, "-shared", "-Xcompiler", "-fPIC",
                 f"-L{stitchcuda.LIB_DIR}", "-lstitchrt")
    syms = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True).stdout
    for sym in ["st_program_abi_version", "st_program_manifest", "st_program_create", "st_program_run",
                "st_program_destroy"]:
        assert re.search(rf"\bT {sym}\b", syms), f"{sym} not exported"
    # The ABI loader accepts it; creating it needs a GPU.
    lib = rt.ProgramLibrary(str(so))
    assert '"name": "example_mlp"' in lib.manifest
    if NO_GPU:
        import numpy as np

        with pytest.raises(stitchcuda.NoDeviceError):
            lib.create([np.zeros((512, 256), np.float32), np.zeros(512, np.float32),
                        np.zeros((128, 512), np.float32), np.zeros(128, np.float32)])


def test_program_loader_rejects_a_non_program(nvcc, tmp_path):
    src = tmp_path / "not_a_program.cu"
    src.write_text('extern "C" int something(void) { return 1; }\n')
    so = tmp_path / "not_a_program.so"
    nvcc_compile(nvcc, src, so, "-shared", "-Xcompiler", "-fPIC")
    with pytest.raises(stitchcuda.ArgumentError, match="does not export st_program_abi_version"):
        rt.ProgramLibrary(str(so))
    with pytest.raises(stitchcuda.ArgumentError, match="cannot load program"):
        rt.ProgramLibrary(str(tmp_path / "missing.so"))


# How a generated program's st_program_run hands its run to the runtime's graph runner (the
# snippet the Coder emits): it must compile against the installed headers.
GRAPH_RUNNER_PROGRAM = r"""
#include <cuda_runtime.h>
#include "stitchrt/program.h"

namespace {
constexpr int kNumInputs = 2, kNumOutputs = 1, kGraphKeys = kNumInputs + kNumOutputs + 1, kGraphSlots = 4;
struct Io { const void* in[kNumInputs]; void* out[kNumOutputs]; char* arena; };
struct st_program_state { st_graph_cache* graphs; };
st_status run_tasks(st_program_state*, const Io&, cudaStream_t) { return ST_OK; }

struct GraphRun { st_program_state* p; const Io* io; };
st_status graph_body(void* ctx, void* stream) {
  const GraphRun* r = static_cast<const GraphRun*>(ctx);
  return run_tasks(r->p, *r->io, static_cast<cudaStream_t>(stream));
}
st_status run_graph(st_program_state* p, const Io& io, void* stream) {
  const void* key[kGraphKeys];
  for (int i = 0; i < kNumInputs; ++i) key[i] = io.in[i];
  for (int i = 0; i < kNumOutputs; ++i) key[kNumInputs + i] = io.out[i];
  key[kGraphKeys - 1] = io.arena;
  GraphRun r{p, &io};
  return st_graph_run(p->graphs, stream, key, kGraphKeys, graph_body, &r);
}
}  // namespace

extern "C" st_status run_example(void* stream) {
  st_program_state p{};
  st_status s = st_graph_cache_create(kGraphSlots, &p.graphs);
  if (s != ST_OK) return s;
  Io io{};
  s = run_graph(&p, io, stream);
  st_graph_cache_destroy(p.graphs);
  return s;
}
"""


def test_graph_runner_snippet_compiles_and_links(nvcc, tmp_path):
    src = tmp_path / "graph_runner_program.cu"
    src.write_text(GRAPH_RUNNER_PROGRAM)
    nvcc_compile(nvcc, src, tmp_path / "graph_runner_program.so", "-shared", "-Xcompiler", "-fPIC",
                 f"-L{stitchcuda.LIB_DIR}", "-lstitchrt")


def _cublas_include() -> Path | None:
    try:
        import nvidia
    except ImportError:
        return None
    for base in nvidia.__path__:
        inc = Path(base) / "cu13" / "include"
        if (inc / "cublasLt.h").is_file():
            return inc
    return None


def test_host_benchmark_compiles(nvcc, tmp_path):
    inc = _cublas_include()
    if inc is None:
        pytest.skip("no nvidia-cublas headers")
    nvcc_compile(nvcc, REPO / "benchmarks" / "runtime_host.cu", tmp_path / "runtime_host.o", "-c", f"-I{inc}")
