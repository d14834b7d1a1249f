"""The build cache: CUDA source in, a compiled library out. The only one in the project.

One function owns it, :func:`build`: look for the built artifact; if it is not there, take the
entry's lock, look again (another process may have built it meanwhile), compile with
:func:`stitchcuda.toolchain.compile_program`, publish the library by an atomic rename. A failed
compile is a value (:class:`BuildResult` with ``ok`` False and nvcc's diagnostics), never an
exception. The pipeline, the Verifier, ``Program.load``, ``check_task`` and the test harnesses
all build through it.

Entries are folders ``<cache>/<name>_<policy>_<arch>_<hash>/`` (``mlp_tf32_sm90_3fa81c…``)
holding ``program.so``, the ``program.cu`` it was built from and ``build.json`` (command,
seconds, diagnostics). ``<cache>`` is ``$STITCHCUDA_CACHE`` or ``~/.cache/stitchcuda``. The hash
covers everything the library depends on: the source, the target arch, the compiler flags, the
nvcc release, the runtime version, the installed template and runtime headers, the folder of the
install it links against (two virtual environments never share a library whose RUNPATH points
into the other) and :data:`SCHEMA_VERSION`. ``STITCHCUDA_NEVER_COMPILE=1`` turns a miss into a
failed result instead of a compile, for deployed programs that must only load what was shipped.
``stitchcuda cache list|clean`` reads and prunes the entries (:func:`entries`, :func:`clean`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from . import toolchain
from .fsutil import atomic_write_text
from .linking import LINK_FLAGS
from .paths import INCLUDE_DIR, LIB_DIR, cache_dir

SCHEMA_VERSION = 2
LIBRARY = "program.so"
RECORD = "build.json"
_ENTRY_RE = re.compile(r"^(?P<name>.+)_(?P<policy>[a-z0-9]*)_(?P<arch>sm\d+[a-z]?)_(?P<hash>[0-9a-f]{16,})$")


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
    entry: str = ""

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("ok", "key", "entry", "library", "cached", "seconds", "arch", "message")}
        if self.compile is not None:
            d["compile"] = {"ok": self.compile.ok, "command": list(self.compile.command),
                            "output": self.compile.output, "seconds": self.compile.seconds}
        return d


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
    # os.walk follows a linked folder (rglob does not before Python 3.13): a header reached through
    # a link still changes the key.
    files = sorted(Path(d) / f for d, _, fs in os.walk(root, followlinks=True) for f in fs)
    for p in files:
        if p.is_file():
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _install() -> str:
    """The install a library links against: the runtime's folder and its file's identity."""
    lib = Path(LIB_DIR) / "libstitchrt.so"
    try:
        st = lib.stat()
        ident = f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        ident = "absent"
    return f"{Path(LIB_DIR).resolve()}:{ident}"


def _runtime_version() -> str:
    from . import _rt as rt

    return rt.version()


def _slug(text: str, limit: int = 48) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_") or "program"
    return s[:limit]


def _flags(flags: tuple[str, ...], export_all: bool) -> tuple[str, ...]:
    """Every program is linked as the Verifier links it (-z defs, the sandbox's traced names), so
    that building and verifying share one cache entry; test harnesses (``export_all``) are not."""
    if export_all:
        return flags
    return LINK_FLAGS + tuple(f for f in flags if f not in LINK_FLAGS)


def cache_key(source: str, arch: str, flags: tuple[str, ...] = (), export_all: bool = False) -> str:
    """The hash of everything a library built from ``source`` for ``arch`` depends on."""
    flags = _flags(tuple(flags), export_all)
    h = hashlib.sha256()
    for part in (f"schema={SCHEMA_VERSION}", f"arch={arch}", "flags=" + " ".join(flags), f"export_all={export_all}",
                 f"nvcc={_nvcc_release()}", f"runtime={_runtime_version()}", f"headers={_headers_hash()}",
                 f"install={_install()}"):
        h.update(part.encode())
        h.update(b"\0")
    h.update(source.encode("utf-8"))
    return h.hexdigest()[:40]


def entry_name(key: str, name: str, policy: str, arch: str) -> str:
    """``<name>_<policy>_<arch>_<hash>``: readable in ``ls`` and in ``stitchcuda cache list``."""
    return f"{_slug(name)}_{_slug(policy, 8) if policy else ''}_{arch.replace('_', '')}_{key[:16]}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _label(source: str) -> tuple[str, str]:
    """(name, policy) from a generated program's header line, else ("program", "")."""
    m = re.search(r"^// program\.cu — (\S+): generated by .*$", source[:400], re.M)
    p = re.search(r"^// Precision policy: (\w+)", source[:2000], re.M)
    return (m.group(1) if m else "program"), (p.group(1) if p else "")


def build(source: str | os.PathLike, *, arch: str | None = None, flags: tuple[str, ...] = (),
          cache: str | os.PathLike | None = None, timeout: float = 600.0, name: str | None = None,
          policy: str | None = None, export_all: bool = False) -> BuildResult:
    """Compile ``source`` (program text, or a path to a .cu file) into a cached library.

    ``arch`` defaults to the GPU's (``STITCHCUDA_ARCH`` or sm_90 without one). ``name`` and
    ``policy`` only name the entry (read from a generated program's header when not given).
    ``export_all``: keep every extern "C" symbol visible (test harnesses; programs export only
    their ABI). Returns a :class:`BuildResult`; ``library`` is the cached ``program.so``.
    """
    t0 = time.monotonic()
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source and source.endswith(".cu")):
        source = Path(source).read_text(encoding="utf-8")
    flags = _flags(tuple(flags), export_all)
    arch = arch or toolchain.default_arch()
    root = Path(cache).expanduser() if cache is not None else cache_dir()
    key = cache_key(source, arch, tuple(flags), export_all)
    found_name, found_policy = _label(source)
    ename = entry_name(key, name or found_name, found_policy if policy is None else policy, arch)
    # The hash decides; the readable part is whatever the first build of this source named it.
    ename = next((d.name for d in root.glob(f"*_{key[:16]}") if (d / LIBRARY).is_file()), ename) \
        if root.is_dir() else ename
    entry = root / ename
    lib = entry / LIBRARY

    def result(ok: bool, cached: bool, message: str = "", res: toolchain.CompileResult | None = None) -> BuildResult:
        return BuildResult(ok, key, str(lib) if ok else None, cached, time.monotonic() - t0, arch, message, res, ename)

    if lib.is_file():
        return result(True, True, "found in the build cache")
    if never_compile():
        return result(False, False, f"not in the build cache ({entry}) and STITCHCUDA_NEVER_COMPILE is set")
    try:
        lock = _locked(root / ".locks" / f"{key}.lock")
        lock.__enter__()
    except OSError as e:
        return result(False, False, f"build cache {root} is not writable ({e.strerror or e}); "
                                    "set STITCHCUDA_CACHE to a writable folder")
    try:
        if lib.is_file():
            return result(True, True, "built by another process meanwhile")
        entry.mkdir(parents=True, exist_ok=True)
        src = entry / "program.cu"
        if not src.is_file() or src.read_text(encoding="utf-8") != source:
            atomic_write_text(src, source)
        tmp = entry / f".{LIBRARY}.{os.getpid()}.tmp"
        try:
            res = toolchain.compile_program(src, tmp, arch=arch, extra=tuple(flags), timeout=timeout,
                                            export_all=export_all)
        except toolchain.ToolchainError as e:
            return result(False, False, str(e))
        record = {"ok": res.ok, "name": name or found_name, "arch": arch, "flags": list(flags),
                  "command": list(res.command), "seconds": round(res.seconds, 3), "output": res.output,
                  "schema": SCHEMA_VERSION, "key": key, "built": time.strftime("%Y-%m-%dT%H:%M:%S")}
        atomic_write_text(entry / RECORD, json.dumps(record, indent=1) + "\n")
        if not res.ok:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            first = next((ln for ln in res.output.splitlines() if "error" in ln), res.output.strip()[:200])
            return result(False, False, f"nvcc failed: {first}", res)
        os.replace(tmp, lib)
        return result(True, False, f"compiled in {res.seconds:.1f} s", res)
    finally:
        lock.__exit__(None, None, None)


def load(result: BuildResult):
    """The ``stitchcuda.rt.ProgramLibrary`` of a successful build."""
    if not result.ok or not result.library:
        raise RuntimeError(f"no library to load: {result.message}")
    from . import _rt as rt

    return rt.ProgramLibrary(result.library)


# ---------------------------------------------------------------------- reading and pruning


@dataclass(frozen=True)
class CacheEntry:
    """One folder of the cache, as ``stitchcuda cache list`` shows it."""

    name: str
    path: Path
    program: str
    policy: str
    arch: str
    ok: bool          # a library is there
    bytes: int
    modified: float   # seconds since the epoch


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def entries(cache: str | os.PathLike | None = None) -> list[CacheEntry]:
    """Every entry of the cache, newest first."""
    root = Path(cache).expanduser() if cache is not None else cache_dir()
    out = []
    if not root.is_dir():
        return out
    for d in root.iterdir():
        m = _ENTRY_RE.match(d.name)
        if not d.is_dir() or m is None:
            continue
        lib = d / LIBRARY
        mtime = (lib if lib.is_file() else d).stat().st_mtime
        out.append(CacheEntry(d.name, d, m.group("name"), m.group("policy"), m.group("arch"), lib.is_file(),
                              _size(d), mtime))
    return sorted(out, key=lambda e: -e.modified)


def clean(cache: str | os.PathLike | None = None, *, older_than_s: float | None = None,
          failed_only: bool = False, program: str | None = None) -> tuple[int, int]:
    """Remove entries (all, or those older than ``older_than_s``, failed builds only, or one
    program's); returns (entries removed, bytes freed). Entries being built are skipped."""
    now = time.time()
    removed = freed = 0
    root = Path(cache).expanduser() if cache is not None else cache_dir()
    for e in entries(root):
        if older_than_s is not None and now - e.modified < older_than_s:
            continue
        if failed_only and e.ok:
            continue
        if program is not None and e.program != _slug(program):
            continue
        key = e.name.rsplit("_", 1)[-1]
        locks = list((root / ".locks").glob(f"{key}*.lock"))
        busy = False
        for lk in locks:
            with open(lk, "a+") as f:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(f.fileno(), fcntl.LOCK_UN)
                except OSError:
                    busy = True
        if busy:
            continue
        shutil.rmtree(e.path, ignore_errors=True)
        removed += 1
        freed += e.bytes
    return removed, freed


__all__ = ["SCHEMA_VERSION", "BuildResult", "CacheEntry", "cache_dir", "never_compile", "cache_key", "entry_name",
           "build", "load", "entries", "clean"]
