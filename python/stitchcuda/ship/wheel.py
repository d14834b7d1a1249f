"""``stitchcuda wheel DIR``: a program folder as a wheel that runs with no PyTorch.

Two wheels come out, both ``py3-none-<platform>`` (they hold no Python extension: one wheel
serves every Python 3 version):

* ``NAME-<version>``: the package ``NAME`` with ``manifest.json``, ``weights.safetensors``, the
  verification report when there is one, ``sm_XY/program.so`` for each ``--arch`` and a loader of
  a few lines (``NAME.load(device=None)``);
* ``stitchcuda_runtime-<stitchcuda version>+rt<hash>``: the package ``stitchrt``,
  ``libstitchrt.so`` and :mod:`stitchcuda.loader` (ctypes over the program ABI, DLPack in
  and out), depending on NumPy, ``nvidia-cublas`` and ``nvidia-cudnn-cu13`` only.

Why a runtime wheel of its own rather than libstitchrt bundled into each program wheel: a
process loads one library per soname, so two program wheels each carrying a ``libstitchrt.so``
would silently share whichever loaded first; one runtime distribution, pinned exactly by each
program (``==<version>+rt<hash of the library>``), makes that sharing the declared, checked
case, and pip refuses to install programs built against two different runtimes side by side.
It also keeps each program wheel to its own code and weights (libstitchrt is ~6 MB).

Finding the runtime: a program library is linked with an rpath into the stitchcuda install it
was built in. The copy in the wheel has that rpath rewritten in place (the ELF string, as
``chrpath`` does) to ``$ORIGIN/../../stitchrt/lib`` — the runtime wheel's folder in the same
site-packages — and the loader preloads ``libstitchrt.so`` from wherever ``stitchrt`` is
installed, so a ``--target`` or ``--prefix`` install finds it too: the dynamic loader satisfies a
program's ``libstitchrt.so`` with the copy already loaded under that soname.
"""

from __future__ import annotations

import base64
import hashlib
import keyword
import re
import struct
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .. import manifest as mf
from ..errors import ArgumentError

RUNTIME_DIST = "stitchcuda_runtime"
RUNTIME_PACKAGE = "stitchrt"
RPATH = "$ORIGIN/../../stitchrt/lib"
_RESERVED = {"stitchcuda", RUNTIME_PACKAGE, "torch", "numpy", "cupy", "nvidia", "test", "tests"}


class WheelError(ArgumentError):
    """A program folder or a name that cannot make a wheel; one line."""


@dataclass(frozen=True)
class Wheels:
    name: str
    program: Path
    runtime: Path
    archs: tuple[str, ...]


def platform_tag() -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", sysconfig.get_platform())


def package_name(text: str) -> str:
    """A Python package name from a program name (``23_Softmax`` -> ``p23_softmax``)."""
    name = re.sub(r"\W+", "_", text).strip("_").lower() or "program"
    return f"p{name}" if name[0].isdigit() else name


def check_name(name: str) -> str:
    if not name.isidentifier() or keyword.iskeyword(name):
        raise WheelError(f"--name {name}: not a Python package name (letters, digits and _, not starting with a digit)")
    if name in _RESERVED or name in getattr(sys, "stdlib_module_names", ()):
        raise WheelError(f"--name {name}: taken by another package; choose another --name")
    return name


def check_version(version: str) -> str:
    if not re.fullmatch(r"\d+(\.\d+)*([a-z]+\d+)?(\+[A-Za-z0-9.]+)?", version):
        raise WheelError(f"--wheel-version {version}: not a version (e.g. 1.0.2)")
    return version


def check_verified(program_dir: str | Path, *, unverified: bool = False) -> tuple[bool, str]:
    """(True, the verdict) when the folder's report passed; else WheelError, or with ``unverified``
    (False, why not). A wheel says what was proven of what it holds."""
    from ..verifier.report.document import load_report

    report = Path(program_dir) / "report.json"
    if not report.is_file():
        why = f"{program_dir} has no verification report (report.json)"
    else:
        try:
            r = load_report(report)
        except Exception as e:  # noqa: BLE001 - an unreadable report proves nothing
            why = f"{report} cannot be read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        else:
            narrow = _judged_at_one_end(program_dir, r.shapes) if r.result.ok else ""
            if r.result.ok and not narrow:
                return True, r.result.verdict.summary() + (f" at {'; '.join(r.shapes)}" if r.shapes else "")
            why = (f"{program_dir}'s verification did not pass ({r.result.verdict.summary()})" if not r.result.ok else
                   f"{program_dir} is a dynamic program verified at {narrow} only, not across its range")
    if unverified:
        return False, why
    raise WheelError(f"{why}: run stitchcuda verify {program_dir} first, or pack it anyway with --unverified")


def _judged_at_one_end(program_dir: str | Path, shapes: tuple[str, ...]) -> str:
    """A dynamic program's report that misses its smallest or largest shape: the shapes it has ("" when it
    covers both, or the program is static). The wheel serves the whole range, so it is proven there."""
    from ..manifest import Manifest, ManifestError
    from ..verifier.run.shapes import shape_label

    try:
        dynamic = Manifest.load(program_dir).dynamic
    except (ManifestError, OSError):  # a manifest that cannot be read is refused where the wheel reads it
        return ""
    if dynamic is None:
        return ""
    ends = [shape_label(tuple((d.name, getattr(d, end)) for d in dynamic.dims)) for end in ("min", "max")]
    return "" if all(e in shapes for e in ends) else ("; ".join(shapes) or "one shape")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(path: Path, dist: str, version: str, files: dict[str, bytes], metadata: list[str]) -> Path:
    """A wheel (zip) with ``files``, METADATA, WHEEL and RECORD; written to a temporary name first."""
    info = f"{dist}-{version}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = ("\n".join(["Metadata-Version: 2.1", f"Name: {dist}", f"Version: {version}", *metadata])
                                 + "\n").encode()
    files[f"{info}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: stitchcuda\nRoot-Is-Purelib: false\n"
                              f"Tag: py3-none-{platform_tag()}\n").encode()
    record = [f"{n},{_record_hash(d)},{len(d)}" for n, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files.items():
            zi = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = (0o755 if n.endswith(".so") else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, d)
    tmp.replace(path)
    return path


# ---------------------------------------------------------------------- ELF: the rpath of a copy


def elf_runpath(data: bytes) -> tuple[int, str] | None:
    """(file offset, value) of the DT_RUNPATH (or DT_RPATH) string of a 64-bit little-endian ELF."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return None
    strtab = path_off = None
    for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == 0:
            break
        if tag == 5:
            strtab = val
        elif tag in (29, 15) and path_off is None:
            path_off = val
    if strtab is None or path_off is None:
        return None
    base = next((strtab - v + o for v, o, n in loads if v <= strtab < v + n), None)
    if base is None:
        return None
    start = base + path_off
    end = data.index(b"\0", start)
    return start, data[start:end].decode()


def set_runpath(data: bytes, value: str) -> bytes:
    """``data`` with its run path replaced by ``value`` in place (NUL-padded; never longer)."""
    found = elf_runpath(data)
    if found is None:
        raise WheelError("program.so has no run path to rewrite")
    start, old = found
    new = value.encode()
    if len(new) > len(old):
        raise WheelError(f"cannot rewrite the run path {old!r}: {value!r} is longer")
    out = bytearray(data)
    out[start:start + len(old)] = new + b"\0" * (len(old) - len(new))
    return bytes(out)


# ---------------------------------------------------------------------- the two wheels


def runtime_version() -> tuple[str, bytes]:
    """(version of the runtime wheel, libstitchrt.so): the package version plus the library's hash."""
    from ..paths import VERSION as __version__
    from ..paths import LIB_DIR

    lib = (Path(LIB_DIR) / "libstitchrt.so").read_bytes()
    return f"{__version__}+rt{hashlib.sha256(lib).hexdigest()[:12]}", lib


def runtime_wheel(out: Path) -> Path:
    version, lib = runtime_version()
    loader = (Path(__file__).parent.parent / "loader.py").read_bytes()
    files = {f"{RUNTIME_PACKAGE}/__init__.py": loader, f"{RUNTIME_PACKAGE}/lib/libstitchrt.so": lib}
    meta = ["Summary: The stitchcuda runtime: runs stitchcuda programs with NumPy, CuPy or PyTorch arrays, "
            "no PyTorch needed", "Requires-Python: >=3.8", "Requires-Dist: numpy>=1.23",
            "Requires-Dist: nvidia-cublas>=13.0,<14", "Requires-Dist: nvidia-cudnn-cu13>=9.0,<10"]
    return write_wheel(out / f"{RUNTIME_DIST}-{version}-py3-none-{platform_tag()}.whl", RUNTIME_DIST, version,
                       files, meta)


_INIT = '''"""{name}: the stitchcuda program {program} ({precision}; {archs}), packaged by `stitchcuda wheel`.

    import {name}
    m = {name}.load()   # on an NVIDIA GPU; no PyTorch needed
    y = m(x)            # NumPy, CuPy or PyTorch arrays in, the same kind out

Inputs: {inputs}
Outputs: {outputs}
"""

from pathlib import Path as _Path

import stitchrt as _stitchrt

PACKAGE = _Path(__file__).resolve().parent
ARCHS = {arch_tuple!r}
VERIFIED = {verified!r}
VERDICT = {verdict!r}


def load(device=None, prepare=True):
    """The program on ``device`` (default: the current CUDA device), prepared for its first call unless
    ``prepare=False``; stitchrt.NoCudaDeviceError without a device."""
    return _stitchrt.load_program(PACKAGE, device=device, prepare=prepare)
'''


def make_wheels(program_dir: str | Path, *, name: str | None = None, archs: list[str] | None = None,
                out: str | Path = "dist", version: str = "0.1.0", progress=None, unverified: bool = False) -> Wheels:
    """Write the program wheel and the runtime wheel of a program folder into ``out``.

    ``archs``: targets to include (default: the manifest's); each is built through the build
    cache unless the folder's own library is for it. Raises WheelError / ManifestError for bad
    input, BuildEnvironmentError when nothing can be compiled, CommandError (exit 1) when the
    program does not compile for an asked target. A folder whose report is not a pass (or that
    has none) is refused (WheelError) unless ``unverified``; then the wheel's metadata and its
    package (``VERIFIED = False``) say so."""
    from .. import build as B
    from ..pipeline import BuildEnvironmentError, check_arch
    from ..program import _prebuilt
    from .errors import FAILED, CommandError

    step = progress or (lambda stage: None)
    step("check")
    prog = mf.load_program_dir(program_dir, require_weights=True)
    m = prog.manifest
    name = check_name(name or package_name(m.name))
    check_version(version)
    verified, verdict = check_verified(program_dir, unverified=unverified)
    archs = list(dict.fromkeys(archs or [m.arch]))
    for a in archs:
        check_arch(a)
    source = prog.read_source()
    libraries: dict[str, bytes] = {}
    for a in archs:
        step(f"library for {a}")
        lib = _prebuilt(prog.root, m, a)
        if lib is None:
            res = B.build(source, arch=a, name=m.name, policy=m.precision)
            if not res.ok and res.compile is None:
                raise BuildEnvironmentError(res.message)
            if not res.ok:
                raise CommandError(f"{m.name} does not compile for {a}: {res.message}", FAILED)
            lib = res.library
        libraries[a] = set_runpath(Path(lib).read_bytes(), RPATH)
    step("wheels")
    out = Path(out)
    rt_wheel = runtime_wheel(out)
    rt_version = rt_wheel.name.split("-")[1]
    spec = lambda ts: ", ".join(f"{t.name} {t.dtype}{list(t.shape)}" for t in ts)  # noqa: E731
    files = {f"{name}/__init__.py": _INIT.format(name=name, program=m.name, precision=m.precision,
                                                 archs=", ".join(archs), arch_tuple=tuple(archs),
                                                 inputs=spec(m.inputs), outputs=spec(m.outputs), verified=verified,
                                                 verdict=verdict).encode(),
             f"{name}/manifest.json": prog.manifest_path.read_bytes()}
    if prog.weights is not None:
        files[f"{name}/weights.safetensors"] = prog.weights.read_bytes()
    for extra in ("report.json", "report.md", "reference.py", "tuning.txt"):  # tuning: stitchcuda.tuning
        if (prog.root / extra).is_file():
            files[f"{name}/{extra}"] = (prog.root / extra).read_bytes()
    for a, data in libraries.items():
        files[f"{name}/{a}/program.so"] = data
    meta = [f"Summary: stitchcuda program {m.name} ({m.precision}; {', '.join(archs)}); runs without PyTorch"
            + ("" if verified else "; UNVERIFIED: packed with --unverified"),
            f"Keywords: stitchcuda,{'verified' if verified else 'unverified'}",
            "Requires-Python: >=3.8", f"Requires-Dist: {RUNTIME_DIST.replace('_', '-')}=={rt_version}"]
    wheel = write_wheel(out / f"{name}-{version}-py3-none-{platform_tag()}.whl", name, version, files, meta)
    return Wheels(name, wheel, rt_wheel, tuple(archs))


__all__ = ["Wheels", "WheelError", "make_wheels", "runtime_wheel", "runtime_version", "package_name", "check_name",
           "elf_runpath", "set_runpath", "write_wheel", "platform_tag", "RPATH"]
