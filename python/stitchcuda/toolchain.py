"""Finding nvcc and compiling against the runtime: the one place that knows the flags.

Used by the self-check, the tests and the Coder's build cache, so that a program, a template
test and the example all compile the same way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import MachineError
from .paths import INCLUDE_DIR, LIB_DIR


class ToolchainError(MachineError):
    """nvcc is missing or failed; the message carries the command and its diagnostics."""


def _wheel_nvccs() -> list[str]:
    try:
        import nvidia
    except ImportError:
        return []
    return [str(Path(p) / "cu13" / "bin" / "nvcc") for p in nvidia.__path__]


def find_nvcc() -> Path | None:
    """nvcc from CUDACXX, CUDA_HOME / CUDA_PATH, PATH, /usr/local/cuda or NVIDIA's nvcc wheel
    (`pip install 'stitchcuda[cuda]'`); STITCHCUDA_CUDA_FROM_WHEELS=1 prefers the wheel."""
    candidates: list[str | None] = [os.environ.get("CUDACXX")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(str(Path(os.environ[var]) / "bin" / "nvcc"))
    candidates += [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    if os.environ.get("STITCHCUDA_CUDA_FROM_WHEELS") == "1":
        candidates = _wheel_nvccs() + candidates
    else:
        candidates += _wheel_nvccs()
    for c in candidates:
        if c and Path(c).is_file():
            if not os.access(c, os.X_OK):  # wheels may unpack without the execute bit
                try:
                    Path(c).chmod(Path(c).stat().st_mode | 0o111)
                except OSError:
                    continue
            return Path(c)
    return None


def nvcc_version(nvcc: Path) -> str:
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "release" in line:
            return line.strip()
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def default_arch() -> str:
    """sm_XY of device 0 when there is one, else STITCHCUDA_ARCH or sm_90."""
    env = os.environ.get("STITCHCUDA_ARCH")
    if env:
        return env
    from . import _rt as rt
    from .device import has_gpu

    if has_gpu():
        major, minor = rt.device_info(0)["compute_capability"]
        return f"sm_{major}{minor}"
    return "sm_90"


@dataclass(frozen=True)
class CompileResult:
    ok: bool
    command: tuple[str, ...]
    output: str  # nvcc's stderr + stdout
    seconds: float


def compile_program(src: Path, out: Path, arch: str | None = None, extra: tuple[str, ...] = (),
                    timeout: float = 600.0, export_all: bool = False) -> CompileResult:
    """Compile a program source into a shared library linked against libstitchrt.

    The library finds libstitchrt through an rpath to the installed package. Never raises on a
    compile error: the result carries nvcc's diagnostics (a failed build is a verdict).
    """
    import time

    nvcc = find_nvcc()
    if nvcc is None:
        raise ToolchainError("nvcc not found: install a CUDA 13 toolkit or `pip install nvidia-cuda-nvcc`, "
                             "or set CUDACXX")
    arch = arch or default_arch()
    # Hidden visibility: a program exports its five ABI entry points (marked ST_API) and nothing
    # that could interpose on the symbols of the process that loads it. Test harnesses
    # (``export_all``) export their plain extern "C" launchers.
    vis = "-fPIC" if export_all else "-fPIC,-fvisibility=hidden"
    cmd = (str(nvcc), "-shared", "-Xcompiler", vis, f"-arch={arch}", "-std=c++17", "-O3",
           "--expt-relaxed-constexpr", f"-I{INCLUDE_DIR}", *extra, str(src),
           f"-L{LIB_DIR}", "-lstitchrt", f"-Xlinker=-rpath,{LIB_DIR}", "-o", str(out))
    from .hostlock import busy

    t0 = time.monotonic()
    try:
        with busy():  # not while another worker of a suite on this host times (hostlock.py)
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return CompileResult(False, cmd, f"nvcc timed out after {timeout:.0f} s\n{e.stderr or ''}",
                             time.monotonic() - t0)
    return CompileResult(r.returncode == 0, cmd, (r.stderr or "") + (r.stdout or ""), time.monotonic() - t0)
