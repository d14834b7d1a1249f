"""Exit codes, and every failure a command can meet as one line: the cause and what to do.

A command never shows a traceback (``STITCHCUDA_DEBUG=1`` brings it back, for a bug report).
:func:`explain` maps an exception to a :class:`Failure`: its exit code and its line.

====  ===================================================================================
code  meaning
====  ===================================================================================
0     done: built, verified and correct, written
1     the candidate failed: it does not compile, or the Verifier's verdict is not a pass
2     bad input: an argument, a reference, a program folder or a suite that cannot be used
3     this machine cannot do it: a missing dependency (PyTorch, matplotlib, nvcc), no GPU,
      out of memory, an unwritable cache
70    a bug in stitchcuda (the line says so; please report it with STITCHCUDA_DEBUG=1)
130   interrupted (Ctrl-C); nothing half-written is left behind
====  ===================================================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass

OK = 0
FAILED = 1
BAD_INPUT = 2
ENVIRONMENT = 3
INTERNAL = 70
INTERRUPTED = 130


class CommandError(Exception):
    """Raised by a command for a failure it has already put into words."""

    def __init__(self, message: str, code: int = BAD_INPUT):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Failure:
    code: int
    message: str


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _named(e: BaseException, *names: str) -> bool:
    return any(c.__name__ in names for c in type(e).__mro__)


def explain(e: BaseException) -> Failure:
    """The exit code and the message of an exception a command let through."""
    if isinstance(e, CommandError):
        return Failure(e.code, str(e))
    if isinstance(e, KeyboardInterrupt):
        return Failure(INTERRUPTED, "interrupted; nothing half-written was left behind")
    if isinstance(e, MemoryError):
        text = str(e).strip() or "out of host memory"
        return Failure(ENVIRONMENT, text if "memory" in text else f"out of host memory: {text}")
    if _named(e, "UnsupportedOpError"):  # several lines by design: one per unsupported operator
        return Failure(BAD_INPUT, str(e).strip())
    if _named(e, "BuildInputError", "CaptureError", "PlanError", "ManifestError", "ProblemError", "ProgramError",
              "SuiteError", "WheelError"):
        return Failure(BAD_INPUT, _first_line(e))
    if _named(e, "BuildEnvironmentError", "VerifyEnvironmentError", "ToolchainError", "NoDeviceError",
              "MissingExtra"):
        return Failure(ENVIRONMENT, _first_line(e))
    if isinstance(e, FileNotFoundError):
        return Failure(BAD_INPUT, _first_line(e) if e.filename is None else f"{e.filename}: no such file or folder")
    if isinstance(e, (IsADirectoryError, NotADirectoryError, PermissionError)):
        return Failure(BAD_INPUT, f"{e.filename or ''}: {e.strerror or _first_line(e)}".lstrip(": "))
    if isinstance(e, ImportError):
        missing = getattr(e, "name", None) or _first_line(e)
        return Failure(ENVIRONMENT, f"a Python package is missing: {missing} (pip install {missing}); "
                                    "stitchcuda doctor lists what this machine has")
    if isinstance(e, OSError):
        return Failure(ENVIRONMENT, f"{e.filename + ': ' if e.filename else ''}{e.strerror or _first_line(e)}")
    return Failure(INTERNAL, f"internal error: {type(e).__name__}: {_first_line(e)} (a bug in stitchcuda: "
                             "rerun with STITCHCUDA_DEBUG=1 for the traceback and report it)")


def debug() -> bool:
    return os.environ.get("STITCHCUDA_DEBUG", "") not in ("", "0")


__all__ = ["OK", "FAILED", "BAD_INPUT", "ENVIRONMENT", "INTERNAL", "INTERRUPTED", "CommandError", "Failure",
           "explain", "debug"]
