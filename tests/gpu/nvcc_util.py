"""nvcc for the template tests: find it, compile a translation unit, build a cached .so.

One function owns the build cache (``build_shared_lib``): the key is a hash of nvcc's path and
version, the flags, the source and every header under templates/ and runtime/include/, so an edit
to a template rebuilds exactly what depends on it. A build writes to a temporary name and renames
into place, so concurrent test processes never load a half-written library.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
RUNTIME_INCLUDE = REPO / "runtime" / "include"
HARNESS_DIR = Path(__file__).resolve().parent / "harness"

# Bump when the cache layout or the build recipe changes.
CACHE_SCHEMA = 1


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


def _headers_digest() -> str:
    h = hashlib.sha256()
    for root in (TEMPLATES, RUNTIME_INCLUDE):
        for p in sorted(root.rglob("*")):
            if p.suffix in {".cuh", ".h", ".hpp"} and p.is_file():
                h.update(str(p.relative_to(REPO)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()


def default_cache_dir() -> Path:
    env = os.environ.get("STITCHCUDA_TEST_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "stitchcuda" / "test-harness"


def build_shared_lib(source: str, name: str, arch: str = "sm_90",
                     extra: tuple[str, ...] = (), cache_dir: Path | None = None,
                     nvcc: str | None = None) -> Path:
    """Compile ``source`` (CUDA C++ text) to ``<cache>/<name>-<hash>.so``; reuse it if present.

    Raises RuntimeError with nvcc's output when the build fails.
    """
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found (CUDACXX, CUDA_HOME, PATH, /usr/local/cuda)")
    flags = [*base_flags(arch), "-O3", "-lineinfo", "-shared", "-Xcompiler", "-fPIC", *extra]
    key = hashlib.sha256()
    for part in (str(CACHE_SCHEMA), nvcc, nvcc_version(nvcc), " ".join(flags), source,
                 _headers_digest()):
        key.update(part.encode())
        key.update(b"\0")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    lib = cache / f"{name}-{arch}-{key.hexdigest()[:16]}.so"
    if lib.is_file():
        return lib
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        src = Path(tmp) / f"{name}.cu"
        src.write_text(source)
        out = Path(tmp) / f"{name}.so"
        proc = subprocess.run([nvcc, *flags, str(src), "-o", str(out)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed for {name}:\n{proc.stdout}\n{proc.stderr}")
        os.replace(out, lib)  # atomic: a reader sees no file or the whole file
    return lib


def harness_source(name: str) -> str:
    """Text of tests/gpu/harness/<name>.cu."""
    return (HARNESS_DIR / f"{name}.cu").read_text()


I32, I64, F32, PTR = ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p

# Argument types of every extern "C" launcher in tests/gpu/harness/*.cu.
SIGNATURES = {
    "reduce_harness": {
        "row_reduce": [I32, I32, PTR, I64, PTR, I64, PTR, PTR, I64, I64, F32, I32, I32, PTR],
        "row_reduce_mixed": [I32, I32, PTR, I64, PTR, I64, PTR, PTR, I64, I64, F32, PTR],
        "reduce_axis": [I32, I32, PTR, I64, I64, I64, I64, I64, I64, PTR, I64, I64, PTR, I64,
                        PTR],
        "reduce_axis_ws_floats": [I32, PTR, I64, I64, I64, I64, I64, I64],
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
