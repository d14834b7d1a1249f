"""Spelling C++ for the kinds' renderers: literals, elementwise expressions, hook functors, calls.

Takes values and instruction lists; gives text. Elementwise instructions are spelled by the op
registry (:data:`stitchcuda.ops.INSTRS`), so an op added there renders everywhere. Nothing here
decides anything: a renderer hands over what its spec says.
"""

from __future__ import annotations

import math
import struct
from typing import Mapping, Sequence

from .. import ops
from ..ops import EwInstr


class CodeError(ValueError):
    """The plan holds something the coder cannot spell (a bug in the planner, or a mismatch)."""


def ident(name: str) -> str:
    """A C identifier made of ``name``."""
    s = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return s if not s or not s[0].isdigit() else "_" + s


def flit(x: float) -> str:
    """A float literal that reads back as the same float32 (PyTorch computes fp32 tensors'
    scalar operands in fp32 too)."""
    x = float(x)
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "-INFINITY"
    f = struct.unpack("f", struct.pack("f", x))[0]
    text = f"{f:.9g}"
    if "e" not in text and "." not in text and "inf" not in text:
        text += ".0"
    return text + "f"


def dlit(x: float) -> str:
    """A double literal that reads back as the same double."""
    text = repr(float(x))
    return text if any(ch in text for ch in ".e") else text + ".0"


def ilist(xs: Sequence[int]) -> str:
    return "{" + ", ".join(str(int(x)) for x in xs) + "}"


def cbool(x: bool) -> str:
    return "true" if x else "false"


def render_instrs(instrs: Sequence[EwInstr], leaf: Mapping[str, str], indent: str = "    ") -> tuple[list[str], str]:
    """C++ statements for an expression (the registry's spelling of each instruction) and the
    name holding its value."""
    lines = []
    result = "0.f"
    for i, ins in enumerate(instrs):
        entry = ops.INSTRS.get(ins.op)
        if entry is None:
            raise CodeError(f"no rendering for elementwise op {ins.op!r}")
        args = []
        for a in ins.args:
            if a.startswith("a"):
                args.append(leaf[a])
            elif a.startswith("t"):
                args.append(a)
            elif a.startswith("c"):
                args.append(flit(ins.consts[int(a[1:])]))
            else:
                raise CodeError(f"bad operand {a!r}")
        lines.append(f"{indent}const float t{i} = {entry.c.format(*args)};")
        result = f"t{i}"
    if not instrs:
        result = leaf.get("a0", "0.f")
    return lines, result


def functor(name: str, instrs: Sequence[EwInstr], n_inputs: int) -> list[str]:
    """A device functor computing ``instrs`` over ``n_inputs`` values (``a[k]``)."""
    leaf = {f"a{k}": f"a[{k}]" for k in range(max(n_inputs, 1))}
    body, result = render_instrs(instrs, leaf)
    return [f"struct {name} {{", "  __device__ float operator()(const float* a) const {"] + body + \
           [f"    return {result};", "  }", "};", ""]


def hook(name: str, instrs: Sequence[EwInstr]) -> list[str]:
    """A device functor of one value (a reduction's prologue or epilogue hook)."""
    body, result = render_instrs(instrs, {"a0": "x"})
    return [f"struct {name} {{", "  __device__ float operator()(float x) const {"] + body + \
           [f"    return {result};", "  }", "};", ""]


def hooks(fn: str, prologue, epilogue) -> tuple[list[str], str]:
    """Functors for a reduction's hooks (stitch::Identity for an empty one) and the call's
    trailing arguments."""
    pre: list[str] = []
    names = []
    for suffix, instrs in (("pro", prologue), ("epi", epilogue)):
        if instrs:
            pre += hook(f"{fn}_{suffix}", instrs)
            names.append(f"{fn}_{suffix}{{}}")
        else:
            names.append("stitch::Identity{}")
    return pre, ", " + ", ".join(names)


def include(header: str) -> list[str]:
    """Lines that include a template header right before the task that instantiates it (the
    standard headers are included once, at the top of the program)."""
    return ["}  // namespace task", "", f'#include "stitch/{header}"  // the template of the task below', "",
            "namespace task {", ""]


def call(task: str, expr: str) -> list[str]:
    """A task body returning a template launch's status, the error naming the task."""
    return [f"  return cuda_check({expr},", f'                    "{task}");']


__all__ = ["CodeError", "ident", "flit", "dlit", "ilist", "cbool", "render_instrs", "functor", "hook", "hooks",
           "include", "call"]
