"""nvcc for the template tests: find it, compile a translation unit, build a .so.

Shared libraries are built through the project's one build cache (``stitchcuda.build``), whose
key covers the source, the flags and the installed headers, so an edit to a template rebuilds
exactly what depends on it.
"""

from __future__ import annotations

import ctypes
import subprocess
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
RUNTIME_INCLUDE = REPO / "runtime" / "include"
HARNESS_DIR = Path(__file__).resolve().parent / "harness"



def find_nvcc() -> str | None:
    """The package's own nvcc discovery (stitchcuda.toolchain), as a string; None if absent."""
    from stitchcuda.toolchain import find_nvcc as _find

    found = _find()
    return str(found) if found else None


@lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "unknown"


def include_flags() -> list[str]:
    return [f"-I{TEMPLATES}", f"-I{RUNTIME_INCLUDE}"]


def base_flags(arch: str = "sm_90") -> list[str]:
    return [f"-arch={arch}", "-std=c++17", *include_flags()]


def compile_object(nvcc: str, src: Path, out: Path, arch: str = "sm_90",
                   extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``nvcc -c`` one translation unit; returns the finished process (check returncode)."""
    cmd = [nvcc, *base_flags(arch), *extra, "-c", str(src), "-o", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def build_shared_lib(source: str, name: str, arch: str = "sm_90",
                     extra: tuple[str, ...] = (), cache_dir: Path | None = None) -> Path:
    """Compile ``source`` (CUDA C++ text) through the project's one build cache
    (:func:`stitchcuda.build.build`, every extern "C" symbol visible) and return the library.

    Raises RuntimeError with nvcc's output when the build fails.
    """
    from stitchcuda import build

    res = build.build(source, arch=arch, flags=("-lineinfo", *extra), cache=cache_dir, name=name, policy="",
                      export_all=True)
    if not res.ok:
        out = res.compile.output if res.compile is not None else res.message
        raise RuntimeError(f"nvcc failed for {name}:\n{out}")
    return Path(res.library)


def harness_source(name: str) -> str:
    """Text of tests/gpu/harness/<name>.cu."""
    return (HARNESS_DIR / f"{name}.cu").read_text()


I32, I64, F32, PTR = ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p

# Argument types of every extern "C" launcher in tests/gpu/harness/*.cu.
SIGNATURES = {
    "reduce_harness": {
        "row_reduce": [I32, I32, PTR, I64, PTR, I64, PTR, PTR, I64, I64, F32, I32, I32, PTR],
        "row_reduce_mixed": [I32, I32, PTR, I64, PTR, I64, PTR, PTR, I64, I64, F32, PTR],
        "row_norm_ws": [I32, I32, PTR, I64, PTR, I64, PTR, PTR, I64, I64, F32, PTR, I64, I32, PTR],
        "row_workspace_floats": [I64, I64],
        "reduce_axis": [I32, I32, PTR, I64, I64, I64, I64, I64, I64, PTR, I64, I64, PTR, I64,
                        PTR],
        "reduce_axis_ws_floats": [I32, PTR, I64, I64, I64, I64, I64, I64],
        "softmax_axis": [I32, I32, PTR, I64, I64, I64, I64, I64, I64, PTR, I64, I64, I64, I32, PTR],
    },
    "elementwise_harness": {
        "ew_add": [I32, PTR, PTR, PTR, I32, PTR, PTR, PTR, PTR, PTR],
        "ew_fma4": [I32, PTR, PTR, PTR, PTR, PTR, I32, PTR, PTR, PTR, PTR, PTR, PTR, PTR],
        "ew_where": [I32, PTR, PTR, PTR, PTR, I32, PTR, PTR, PTR, PTR, PTR, PTR],
        "ew_gelu": [I32, PTR, PTR, I32, PTR, PTR, PTR, PTR],
        "strided_copy": [I32, I32, PTR, PTR, I32, PTR, PTR, PTR, PTR],
        "permute": [I32, PTR, I32, PTR, PTR, PTR, PTR, PTR],
    },
    "attention_harness": {
        "attention": [I32, I32, I32, PTR, PTR, PTR, PTR, PTR, PTR, PTR, PTR, I32, I32, I32, I32,
                      I32, F32, I32, I64, I32, PTR, PTR, PTR],
    },
}


# Return types other than int (cudaError_t).
RESTYPES = {"reduce_axis_ws_floats": I64}


def load_harness(name: str, arch: str = "sm_90") -> ctypes.CDLL:
    """Build (or reuse) tests/gpu/harness/<name>.cu as a .so and load it with typed launchers."""
    lib = ctypes.CDLL(str(build_shared_lib(harness_source(name), name, arch=arch)))
    for fn, argtypes in SIGNATURES[name].items():
        f = getattr(lib, fn)
        f.argtypes = argtypes
        f.restype = RESTYPES.get(fn, I32)
    return lib
