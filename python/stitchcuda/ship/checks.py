"""The one rule of every command: its input is checked before the machine is asked anything.

Two kinds of check, both run before a command looks for PyTorch, nvcc, a GPU or an optional
package, and before it writes anything: the parser's types (:func:`count`, :func:`duration`,
:func:`days`, :func:`fraction`, :func:`arch`) check a value's form, so a bad one is the parser's
one-line error; a command's ``check`` (run by :func:`stitchcuda.cli.main` before the command)
checks what the values name with :func:`reference`, :func:`program_dir`, :func:`out_folder` and
:func:`nvcc_arch`. Each raises :class:`~stitchcuda.ship.errors.CommandError` (exit 2) or
``argparse.ArgumentTypeError`` with the one line to show.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .errors import CommandError


def count(low: int = 1):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"{n} is too small: at least {low}")
        return n
    parse.__name__ = "count"
    return parse


def duration(text: str) -> float:
    """A budget: 90s, 3m, 1h, 2m30s or plain seconds (the same everywhere)."""
    from ..workflow.state import parse_seconds

    try:
        return parse_seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def days(text: str) -> float:
    """An age in days: a finite number, 0 or more (a negative or NaN age would match every entry)."""
    import math

    try:
        d = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days") from None
    if not math.isfinite(d) or d < 0:
        raise argparse.ArgumentTypeError(f"{text}: an age is a finite number of days, 0 or more")
    return d


#: Baselines a verification or a suite may add to the four it always times.
EXTRA_BASELINES = ("max-autotune",)


def baselines(text: str) -> tuple[str, ...]:
    """Extra baselines, comma-separated: ``max-autotune`` (torch.compile(mode="max-autotune") at the policy)."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in EXTRA_BASELINES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{', '.join(bad) or repr(text)}: the extra baselines are "
                                         f"{', '.join(EXTRA_BASELINES)}")
    return names


def fraction(text: str) -> float:
    try:
        f = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= f < 1:
        raise argparse.ArgumentTypeError(f"{text}: a share from 0 up to (not including) 1")
    return f


def arch(text: str) -> str:
    """A CUDA target's name (sm_90); whether this nvcc builds it is checked later, still before any work."""
    from ..pipeline import BuildInputError, check_arch

    try:
        return check_arch(text, compiling=False)
    except BuildInputError as e:
        raise argparse.ArgumentTypeError(str(e).split(": ", 1)[-1]) from None


def reference(text: str, what: str = "reference") -> None:
    """A reference: ``kernelbench:LEVEL:ID`` or an existing .py file (not a folder)."""
    import re

    if re.fullmatch(r"kernelbench:\d+:\d+", text):
        return
    if text.startswith("kernelbench:"):
        raise CommandError(f"{text}: not a KernelBench name; use kernelbench:LEVEL:ID (e.g. kernelbench:1:19)")
    p = Path(text)
    if p.is_dir():
        raise CommandError(f"{text}: is a folder; the {what} is one KernelBench-format .py file (or kernelbench:LEVEL:ID)")
    if not p.is_file():
        raise CommandError(f"{text}: no such {what} file (a KernelBench-format .py file, or kernelbench:LEVEL:ID)")


def program_dir(text: str) -> None:
    from .. import manifest as mf

    p = Path(text)
    if not p.exists():
        raise CommandError(f"{text}: program folder not found (stitchcuda build writes one)")
    if not p.is_dir():
        raise CommandError(f"{text}: is a file, not a program folder")
    if not (p / mf.MANIFEST_FILE).is_file():
        raise CommandError(f"{p / mf.MANIFEST_FILE}: file not found: not a program folder (stitchcuda build writes one)")


def out_folder(text: str | None, flag: str = "--out") -> None:
    """A folder to write into: not a file, nor under one (created only when there is something to write)."""
    if text is None:
        return
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise CommandError(f"{flag} {text}: is a file, not a folder")
    blocker = next((a for a in p.absolute().parents if a.exists() and not a.is_dir()), None)
    if blocker is not None:
        raise CommandError(f"{flag} {text}: {blocker} is a file, not a folder")


def nvcc_arch(arch: str | None) -> None:
    """An --arch this nvcc cannot build is the input's fault; asked before any work (no nvcc: later, exit 3)."""
    if arch is not None:
        from ..pipeline import check_arch

        check_arch(arch, compiling=True)


__all__ = ["count", "duration", "days", "fraction", "arch", "reference", "program_dir", "out_folder", "nvcc_arch",
           "size_value"]


def size_value(text: str) -> tuple[str, int]:
    """``--at NAME=SIZE`` (a dynamic program's dimension and the size to judge it at)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip().isidentifier() or not value.strip().isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: write NAME=SIZE, e.g. batch=3")
    return name.strip(), int(value)
