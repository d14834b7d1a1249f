"""The shapes a dynamic program is judged at, and a program folder seen at one of them.

A dynamic program serves every shape of its ranges; the Verifier judges it at its smallest shape,
at the sizes named at build to tune at, at shapes drawn from the run's seed between, and at its
largest (:func:`range_shapes`), each through the program folder as it is at that shape
(:func:`at_shape`: the manifest there, its ranges ending there).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Callable

from ... import manifest as mf
from ..report.profile import TimingTable
from .reference import ProblemError

Shape = tuple[tuple[str, int], ...]  # (dimension, size) for every dynamic dimension, in the manifest's order


def range_shapes(manifest: mf.Manifest, seed: int | None, between: int) -> list[Shape]:
    """Its smallest shape, those named at build to tune at, ``between`` drawn from ``seed`` (each
    dimension on its own, on its multiple), its largest last; [] for a static program."""
    if manifest.dynamic is None:
        return []
    dims = manifest.dynamic.dims
    rng = random.Random(seed)

    def pick(d: mf.DynamicDim) -> int:
        q = max(d.multiple_of, 1)
        return rng.randrange(-(-d.min // q), d.max // q + 1) * q

    smallest = tuple((d.name, d.min) for d in dims)
    largest = tuple((d.name, d.max) for d in dims)
    if smallest == largest:
        return [largest]
    middle = {t for t in manifest.dynamic.tuned_shapes() if t not in (smallest, largest)}
    drawn = 0
    for _ in range(between * 4):  # distinct draws; a narrow range has fewer to give
        if drawn == between:
            break
        shape = tuple((d.name, pick(d)) for d in dims)
        if shape not in middle and shape not in (smallest, largest):
            middle.add(shape)
            drawn += 1
    return [smallest, *sorted(middle), largest]


def shape_label(shape: Shape) -> str:
    return ", ".join(f"{n}={v}" for n, v in shape)


def progress_at(progress: Callable[[str], None] | None, shape: Shape) -> Callable[[str], None] | None:
    """A progress callback that says the shape first."""
    if progress is None:
        return None
    return lambda what: progress(f"at {shape_label(shape)}: {what}")


def at_shape(prog: mf.ProgramDir, values: dict[str, int]) -> mf.ProgramDir:
    """The program folder judged at one shape of its dynamic ranges: its manifest at those sizes, each
    range ending there (so the shapes it lists are its largest, as a manifest's are, and the
    reference's module-level sizes follow: :func:`.reference.at_largest`); sizes named to tune at
    belong to the whole range and are dropped."""
    try:
        manifest = prog.manifest.at(values)
    except mf.ShapeError as e:
        raise ProblemError("--at", str(e)) from None
    dims = tuple(dataclasses.replace(d, max=values[d.name], tuned=()) for d in manifest.dynamic.dims)
    return dataclasses.replace(prog, manifest=dataclasses.replace(
        manifest, dynamic=dataclasses.replace(manifest.dynamic, dims=dims)))


def timing_line(t: TimingTable | None) -> str:
    """One shape's timing in a few words: the program's median and its speed against each baseline."""
    if t is None:
        return ""
    parts = [f"{t.program.median_ms:.4g} ms"]
    for name, b in t.baselines():
        x = t.speedup(b)
        if b is not None and x is not None:
            parts.append(f"{x:.2f}x {name}")
    return ", ".join(parts)
