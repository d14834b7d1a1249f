"""Tuning files: the runtime's choices by measurement, kept across processes.

The runtime picks each GEMM's cuBLASLt algorithm and each convolution's cuDNN engine by timing the
candidates on the first call of a new shape (``stitchrt/tuning.h``); a program's first call pays for
that, in every process again. A tuning file carries the choices: ``tuning.txt`` in a program folder,
written by ``stitchcuda verify`` when the program passes (the choices its timed calls made) and by
:func:`save` (``Program.save_tuning()``), packed into the program's wheel, and imported by
``Program`` and by the wheel's loader before the first call, which then takes each choice instead of
timing.

A choice is the position of the chosen candidate in the library's own ranked list, so it holds only
where that list is the same: the same device, cuBLASLt, cuDNN, workspace and runtime build, which the
file's identity line records. A file made elsewhere is ignored, said in one line, never an error: the
plans are then timed as without it. The format is the runtime loader's (:mod:`stitchcuda.loader`,
which a wheel carries without stitchcuda):

    # stitchcuda tuning file (stitchrt/tuning.h): the runtime's choices by measurement
    # identity: sm_90 132 SMs 81079 MiB, cuBLASLt 130100, cuDNN 91900, workspace 33554432; runtime rt1a2b3c4d5e6f
    g 0 3 256 512 ...        kind (g GEMM, c convolution), split GELU, index, the plan key's words
"""

from __future__ import annotations

from pathlib import Path

from .loader import TUNING_FILE as FILE
from .loader import TUNING_HEAD, TUNING_IDENTITY, identity_line, parse_tuning, take_tuning


def identity_of(device_part: str) -> str:
    """The identity line for a runtime's ``st_tuning_identity`` text, with this installation's runtime."""
    from .paths import LIB_DIR

    return identity_line(device_part, Path(LIB_DIR) / "libstitchrt.so")


def identity() -> str:
    """What this process's choices hold for (the current device; needs a CUDA device)."""
    from . import _rt as rt

    return identity_of(rt.tuning_identity())


def render(choices: str, ident: str) -> str:
    """A tuning file's text: the head, the identity, the choice lines."""
    body = "".join(ln.strip() + "\n" for ln in choices.splitlines() if ln.strip())
    return f"{TUNING_HEAD}\n{TUNING_IDENTITY}{ident}\n{body}"


def _key(line: str) -> str:
    """A choice line's plan key: its kind and the key's words, without the choice."""
    parts = line.split()
    return " ".join(parts[:1] + parts[3:])


def merge_into(folder: str | Path, choices: str, ident: str) -> Path:
    """``choices`` (choice lines) merged into ``folder``'s tuning file: a newer choice for a key replaces the
    file's, the file's other keys stay; a file made elsewhere (another ``ident``) is replaced."""
    from .fsutil import atomic_write_text

    path = Path(folder) / FILE
    merged: dict[str, str] = {}
    if path.is_file():
        old, _ = parse_tuning(path.read_text(encoding="utf-8", errors="replace"), ident)
        merged.update((_key(ln), ln) for ln in old.splitlines())
    merged.update((_key(ln), ln.strip()) for ln in choices.splitlines() if ln.strip())
    atomic_write_text(path, render("\n".join(merged[k] for k in sorted(merged)), ident))
    return path


def save(folder: str | Path, ident: str | None = None) -> Path:
    """Write this process's choices (timed or imported) into ``folder``'s tuning file, merged with the
    ones already there when those were made here (a file made elsewhere is replaced)."""
    from . import _rt as rt

    return merge_into(folder, rt.tuning_export(), ident if ident is not None else identity())


def load(folder: str | Path) -> tuple[int, str]:
    """Import ``folder``'s tuning file, if it has one made here: (choices taken, why none were, or "").
    Through the binding (the runtime this process already has); a wheel's loader does the same through
    ctypes (:func:`stitchcuda.loader.import_tuning`). Never raises: a tuning file is an optimisation."""
    from . import _rt as rt

    return take_tuning(Path(folder), identity, rt.tuning_import)


__all__ = ["FILE", "identity_of", "identity", "render", "merge_into", "save", "load"]
