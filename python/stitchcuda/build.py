"""The build cache: program source in, a compiled program library out.

One function owns the cache, :func:`build`: look for the built artifact; if it is not there,
take the entry's lock, look again (another process may have built it meanwhile), compile
with :func:`stitchcuda.toolchain.compile_program`, publish the library by an atomic rename.
A failed compile is a value (:class:`BuildResult` with ``ok`` False and nvcc's diagnostics),
never an exception.

Cache layout: ``<cache>/<key>/program.so`` beside ``program.cu`` (the source it was built
from) and ``build.json`` (command, seconds, diagnostics). ``<cache>`` is
``$STITCHCUDA_CACHE`` or ``~/.cache/stitchcuda``. The key hashes everything the library
depends on: the source, the target arch, the compiler flags, the nvcc release, the runtime
version, the installed template and runtime headers, and :data:`SCHEMA_VERSION` (bumped when
the build itself changes). ``STITCHCUDA_NEVER_COMPILE=1`` turns a miss into a failed result
instead of a compile — for deployed programs that must only ever load what was shipped.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from . import INCLUDE_DIR, toolchain
from .fsutil import atomic_write_text

SCHEMA_VERSION = 1
LIBRARY = "program.so"


@dataclass(frozen=True)
class BuildResult:
    """The verdict of one build: ``library`` is set when ``ok``; ``cached`` says it was found
    built; ``compile`` holds nvcc's command and output when this call compiled."""

    ok: bool
    key: str
    library: str | None
    cached: bool
    seconds: float
    arch: str
    message: str = ""
    compile: toolchain.CompileResult | None = None

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("ok", "key", "library", "cached", "seconds", "arch", "message")}
        if self.compile is not None:
            d["compile"] = {"ok": self.compile.ok, "command": list(self.compile.command),
                            "output": self.compile.output, "seconds": self.compile.seconds}
        return d


def cache_dir() -> Path:
    """``$STITCHCUDA_CACHE`` or ``~/.cache/stitchcuda``."""
    env = os.environ.get("STITCHCUDA_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "stitchcuda"


def never_compile() -> bool:
    return os.environ.get("STITCHCUDA_NEVER_COMPILE", "") not in ("", "0")


@functools.lru_cache(maxsize=None)
def _nvcc_release() -> str:
    nvcc = toolchain.find_nvcc()
    return toolchain.nvcc_version(nvcc) if nvcc else "none"


@functools.lru_cache(maxsize=None)
def _headers_hash() -> str:
    h = hashlib.sha256()
    root = Path(INCLUDE_DIR)
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _runtime_version() -> str:
    from . import rt

    return rt.version()


def cache_key(source: str, arch: str, flags: tuple[str, ...] = ()) -> str:
    """The cache entry of a source built for ``arch`` with extra nvcc ``flags``."""
    h = hashlib.sha256()
    for part in (f"schema={SCHEMA_VERSION}", f"arch={arch}", "flags=" + " ".join(flags), f"nvcc={_nvcc_release()}",
                 f"runtime={_runtime_version()}", f"headers={_headers_hash()}"):
        h.update(part.encode())
        h.update(b"\0")
    h.update(source.encode("utf-8"))
    return h.hexdigest()[:40]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def build(source: str | os.PathLike, *, arch: str | None = None, flags: tuple[str, ...] = (),
          cache: str | os.PathLike | None = None, timeout: float = 600.0) -> BuildResult:
    """Compile ``source`` (program text, or a path to a .cu file) into a cached library.

    ``arch`` defaults to the GPU's (``STITCHCUDA_ARCH`` or sm_90 without one). Returns a
    :class:`BuildResult`; ``library`` is the path of the cached ``program.so``.
    """
    t0 = time.monotonic()
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source and source.endswith(".cu")):
        source = Path(source).read_text(encoding="utf-8")
    arch = arch or toolchain.default_arch()
    root = Path(cache).expanduser() if cache is not None else cache_dir()
    key = cache_key(source, arch, tuple(flags))
    entry = root / key
    lib = entry / LIBRARY

    def result(ok: bool, cached: bool, message: str = "", res: toolchain.CompileResult | None = None) -> BuildResult:
        return BuildResult(ok, key, str(lib) if ok else None, cached, time.monotonic() - t0, arch, message, res)

    if lib.is_file():
        return result(True, True, "found in the build cache")
    if never_compile():
        return result(False, False, f"not in the build cache ({entry}) and STITCHCUDA_NEVER_COMPILE is set")
    with _locked(root / f"{key}.lock"):
        if lib.is_file():
            return result(True, True, "built by another process meanwhile")
        entry.mkdir(parents=True, exist_ok=True)
        src = entry / "program.cu"
        if not src.is_file() or src.read_text(encoding="utf-8") != source:
            atomic_write_text(src, source)
        tmp = entry / f".{LIBRARY}.{os.getpid()}.tmp"
        try:
            res = toolchain.compile_program(src, tmp, arch=arch, extra=tuple(flags), timeout=timeout)
        except toolchain.ToolchainError as e:
            return result(False, False, str(e))
        record = {"ok": res.ok, "arch": arch, "flags": list(flags), "command": list(res.command),
                  "seconds": round(res.seconds, 3), "output": res.output, "schema": SCHEMA_VERSION}
        atomic_write_text(entry / "build.json", json.dumps(record, indent=1) + "\n")
        if not res.ok:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            first = next((ln for ln in res.output.splitlines() if "error" in ln), res.output.strip()[:200])
            return result(False, False, f"nvcc failed: {first}", res)
        os.replace(tmp, lib)
        return result(True, False, f"compiled in {res.seconds:.1f} s", res)


def load(result: BuildResult):
    """The ``stitchcuda.rt.ProgramLibrary`` of a successful build."""
    if not result.ok or not result.library:
        raise RuntimeError(f"no library to load: {result.message}")
    from . import rt

    return rt.ProgramLibrary(result.library)


__all__ = ["SCHEMA_VERSION", "BuildResult", "cache_dir", "never_compile", "cache_key", "build", "load"]
