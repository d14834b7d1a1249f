"""Loading a reference: a KernelBench-format program (``class Model``, ``get_inputs()``,
``get_init_inputs()``) from a file or a source string, as a :class:`Reference`.

Takes a path or source text; gives a loaded module the frontend captures and the Verifier runs.
A program that fails to load, or lacks one of the three names, is a :class:`CaptureError` naming
the file and what is wrong.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import traceback
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import ArgumentError


class CaptureError(ArgumentError):
    """The reference could not be captured; the message says why and where."""


@dataclass
class Reference:
    """A loaded KernelBench-format program.

    ``filename`` is what tracebacks and :class:`UnsupportedOp` locations show: the file's
    path, or ``<name>`` for a program given as source (registered with ``linecache`` so
    its lines still appear).
    """

    name: str
    source: str
    filename: str
    module: types.ModuleType

    @property
    def Model(self) -> type[nn.Module]:
        return self.module.Model

    def get_inputs(self) -> list[Any]:
        return list(self.module.get_inputs())

    def get_init_inputs(self) -> list[Any]:
        return list(self.module.get_init_inputs())

    def instantiate(self, device: str | torch.device | None = None, seed: int | None = None) -> tuple[nn.Module, list[Any]]:
        """Build ``Model(*get_init_inputs())`` and ``get_inputs()``.

        ``device`` becomes the default device while both run, so the reference's own
        ``torch.rand(...)`` calls land there; ``"meta"`` gives shapes without memory or
        time, enough for capture (not for :func:`save_weights`). ``seed`` seeds torch's
        RNG first, as KernelBench's harness does.
        """
        if seed is not None:
            torch.manual_seed(seed)
        if device is None:
            return self._build_model(), self._call("get_inputs()", self.get_inputs)
        with torch.device(device):
            return self._build_model(), self._call("get_inputs()", self.get_inputs)

    def _build_model(self) -> nn.Module:
        init = self._call("get_init_inputs()", self.get_init_inputs)
        return self._call("Model(*get_init_inputs())", lambda: self.Model(*init))

    def _call(self, what: str, fn: Any) -> Any:
        """``fn()``; a failure becomes a CaptureError naming the reference's line (an
        allocation failure stays a MemoryError: the machine's problem, not the reference's)."""
        try:
            return fn()
        except CaptureError:
            raise
        except Exception as err:  # noqa: BLE001 - the reference's own code: say where it failed
            raise _reference_error(self, what, err) from err


def load_reference(path_or_source: str | os.PathLike, *, name: str | None = None) -> Reference:
    """Load a KernelBench-format program from a file path or from its source text.

    A ``PathLike``, or a one-line string naming an existing file, is read as a file;
    anything else is taken as source. ``name`` defaults to the file's stem, or
    ``"reference"`` for source. Raises :class:`CaptureError` if the program lacks
    ``Model``, ``get_inputs`` or ``get_init_inputs``.
    """
    if isinstance(path_or_source, os.PathLike) or _names_a_file(path_or_source):
        path = Path(path_or_source).resolve()
        source = path.read_text()
        name = name or path.stem
        filename = str(path)
    else:
        source = str(path_or_source)
        name = name or "reference"
        filename = f"<{name}>"
        # Let tracebacks, export stack traces and inspect see the lines of a source string.
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)

    module_name = "stitchcuda_reference_" + re.sub(r"\W", "_", name)
    module = types.ModuleType(module_name)
    module.__file__ = filename
    # Registered so that dataclasses, pickling and inspect can find the module by name.
    sys.modules[module_name] = module
    try:
        exec(compile(source, filename, "exec"), module.__dict__)
    except Exception as err:  # noqa: BLE001 - a broken reference is a typed error
        sys.modules.pop(module_name, None)
        raise CaptureError(f"{filename} failed to load: {type(err).__name__}: {err}") from err
    missing = [a for a in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, a)]
    if missing:
        raise CaptureError(f"{filename} is not a KernelBench-format program: it lacks {', '.join(missing)}")
    return Reference(name=name, source=source, filename=filename, module=module)


def _reference_error(ref: Reference, what: str, err: BaseException) -> BaseException:
    """One line for an exception raised by the reference's own code: where, what, and a hint
    for the usual causes (``.cuda()`` in ``get_inputs``, not enough host memory)."""
    text = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}".rstrip(": ")
    if "can't allocate memory" in str(err) or isinstance(err, MemoryError):
        return MemoryError(f"{ref.filename}: {what} ran out of host memory ({text})")
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == ref.filename]
    short = Path(ref.filename).name if not ref.filename.startswith("<") else ref.filename
    where = f"{short}:{frames[-1].lineno}" if frames else short
    line = frames[-1].line.strip() if frames and frames[-1].line else ""
    hint = ""
    if re.search(r"\.cuda\(|\.to\(\s*['\"]cuda|device\s*=\s*['\"]cuda", line) or "CUDA" in text:
        hint = ("; the reference puts tensors on the GPU itself: create them on the CPU (drop .cuda() / "
                "device='cuda'), stitchcuda places them where they run")
    return CaptureError(f"{where}: {what} raised {text}" + (f" (in `{line}`)" if line else "") + hint)


def _names_a_file(text: str) -> bool:
    if "\n" in text:
        return False
    try:
        return Path(text).is_file()
    except OSError:  # e.g. a one-line source longer than a file name may be
        return False


__all__ = ["CaptureError", "Reference", "load_reference"]
