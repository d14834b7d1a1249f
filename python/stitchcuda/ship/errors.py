"""Exit codes, and every failure a command can meet as one line: the cause and what to do.

A command never shows a traceback (``STITCHCUDA_DEBUG=1`` brings it back, for a bug report).
:func:`explain` maps an exception to a :class:`Failure`: its exit code and its line. The codes
are the README's table ("The command"), which is their only source: a test reads it, and these
constants must be its rows, no more. An exception nobody put into words (a bug) exits 1, with a
line that says it is stitchcuda's failure, not the program's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

OK = 0
FAILED = 1
BAD_INPUT = 2
ENVIRONMENT = 3
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
    from ..errors import ArgumentError, MachineError, NoDeviceError, OutOfMemoryError

    # several lines by design, one per unsupported operator (capture's and the planner's): the first
    # line alone is a header ending in ':' that names nothing
    if _named(e, "UnsupportedOpError", "PlanError"):
        return Failure(BAD_INPUT, str(e).strip())
    if isinstance(e, ArgumentError) or _named(e, "ProgramError", "ModelNotFound", "ExportError", "ConstraintError"):
        return Failure(BAD_INPUT, _first_line(e))
    if isinstance(e, (MachineError, NoDeviceError, OutOfMemoryError)) or _named(e, "TrainUnavailable", "CannotJudge"):
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
    return Failure(FAILED, f"stitchcuda failed (a bug, not your program's fault): {type(e).__name__}: "
                           f"{_first_line(e)}; rerun with STITCHCUDA_DEBUG=1 for the traceback and report it")


def debug() -> bool:
    return os.environ.get("STITCHCUDA_DEBUG", "") not in ("", "0")


__all__ = ["OK", "FAILED", "BAD_INPUT", "ENVIRONMENT", "INTERRUPTED", "CommandError", "Failure",
           "explain", "debug"]
