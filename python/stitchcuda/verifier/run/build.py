"""Building a candidate for the run: through the project's one build cache, linked as the sandbox
rules need (``-z defs``, the traced names of :mod:`..static.sandbox`), beside the honest baseline
program those rules compare with."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ... import manifest as mf
from ..static import sandbox


class NoToolchain(RuntimeError):
    """Nothing could be compiled, for a reason that is not the candidate's (no nvcc, never-compile
    mode, an unwritable cache): the verification cannot finish here."""


@dataclass(frozen=True)
class CandidateBuild:
    """A candidate (or the honest baseline) built through the build cache: the library, or the
    compiler's output of a failed build (a verdict)."""

    ok: bool
    library: Path | None
    output: str
    seconds: float
    cached: bool = False


def build_candidate(prog: mf.ProgramDir, arch: str, timeout: float = 600.0) -> CandidateBuild:
    """Build program.cu through the project's one build cache, linked as :mod:`..static.sandbox` needs.

    Raises :class:`NoToolchain` when nothing could be compiled for a reason that is not the
    candidate's (no nvcc, never-compile mode, an unwritable cache); a compile error is a failed
    :class:`CandidateBuild` (a verdict)."""
    return _build(prog.source.read_text(encoding="utf-8"), arch, timeout, prog.manifest.name,
                  prog.manifest.precision, str(prog.source))


def _build(source: str, arch: str, timeout: float, name: str, policy: str, what: str) -> CandidateBuild:
    from ... import build as build_mod

    t0 = time.monotonic()
    out = build_mod.build(source, arch=arch, timeout=timeout, name=name, policy=policy, flags=sandbox.LINK_FLAGS)
    if out.ok and out.library:
        text = out.compile.output if out.compile is not None else _recorded_output(Path(out.library))
        return CandidateBuild(True, Path(out.library), text, time.monotonic() - t0, out.cached)
    if out.compile is None:  # nothing was compiled: no nvcc, never-compile mode, an unwritable cache
        raise NoToolchain(f"cannot build {what}: {out.message}")
    return CandidateBuild(False, None, out.compile.output, time.monotonic() - t0)


def _recorded_output(library: Path) -> str:
    """The compiler output a cached build recorded beside its library (build.json)."""
    import json

    try:
        return str(json.loads((library.parent / "build.json").read_text()).get("output", ""))
    except (OSError, ValueError):
        return ""


def build_baseline(arch: str) -> CandidateBuild:
    """The honest program the sandbox rules compare with: the package's example, built the same way."""
    from ...paths import EXAMPLES_DIR

    src = EXAMPLES_DIR / "example_mlp.cu"
    return _build(src.read_text(encoding="utf-8"), arch, 600.0, "sandbox_baseline", "fp32", str(src))


def environment_problem() -> str:
    """What keeps this machine from building and running candidates, or ""."""
    tmp = os.environ.get("TMPDIR")
    if tmp and not (os.path.isdir(tmp) and os.access(tmp, os.W_OK | os.X_OK)):
        return f"TMPDIR={tmp} is not a writable folder: the compiler and the child processes need it"
    try:
        with tempfile.TemporaryFile():
            pass
    except OSError as e:
        return f"no writable temporary folder ({e.strerror or e})"
    return ""


__all__ = ["CandidateBuild", "NoToolchain", "build_candidate", "build_baseline", "environment_problem"]
