"""Arg reductions through scan.cuh: argmax / argmin along a dim or over the whole tensor.

Claim: every free argmax / argmin, and the indices of ``max.dim`` / ``min.dim`` (whose values, when
read, are a row reduction of :mod:`.row`; when only the values are read the node is a row
reduction alone). Lowering: x as [outer, red, inner], out as [outer, inner]; NaN counts as the
extreme and the first extreme wins, as in PyTorch.
"""


from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from .. import layout as L
from .. import ops
from ..dtypes import ctype
from ..ir import Node
from ..layout import View
from ..ops import EwInstr
from . import cxx
from .base import (FLOAT_DTYPES, ClaimRule, Proto, TaskKind, copy_back, dim_groups, outer_n_inner, readable,
                   view_bytes, writable)

A = ops.A
from .row import claim_reduction


HEADER = "scan.cuh"


@dataclass(frozen=True)
class ArgSpec:
    """scan.cuh's arg reduction: the index (int64, along the reduced axis) of the first maximum
    (``op`` max) or minimum of x viewed as [outer, red, inner] (strides ``in_so, in_sr, in_si``)
    into out [outer, inner] (``out_so, out_si``); NaN counts as the extreme, as in PyTorch."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "arg")

    kind: str
    op: str
    x: View
    outer: int
    red: int
    inner: int
    in_so: int
    in_sr: int
    in_si: int
    out: View
    out_so: int
    out_si: int
    prologue: tuple[EwInstr, ...] = ()


@dataclass(frozen=True)
class ArgProto(Proto):
    """The index of the first max / min of x along ``dim`` (None: of the flattened tensor)."""

    op: str = "max"
    x: str = ""
    out: str = ""
    dim: int | None = None


# ---------------------------------------------------------------------- claim


def claim(cx) -> None:
    """Claim every free arg node, in graph order."""
    ix = cx.ix
    for n in sorted(ix.nodes.values(), key=lambda m: ix.pos[m.name]):
        if ops.kind(n.op) == "arg" and cx.free(n):
            _arg(cx, n)


def _arg(cx, n: Node) -> None:
    ix = cx.ix
    x = n.inputs[0]
    xs = ix.shape(x)
    op = "max" if n.op in (A + "max.dim", A + "argmax.default") else "min"
    if ix.spec(x).dtype not in FLOAT_DTYPES:
        raise cx.fail(n, f"arg reduction over {ix.spec(x).dtype}")
    d = n.attr("dim")
    dim = None if d is None else (L.norm_dim(int(d), len(xs)) if xs else 0)
    if n.op in (A + "max.dim", A + "min.dim"):
        values, indices = n.outputs[0].name, n.outputs[1].name
        if not cx.used(indices):
            claim_reduction(cx, n)  # values only: a row / axis reduction, hooks and all
            return
        if cx.used(values):
            claim_reduction(cx, n, hooks=False)
        cx.claim(ArgProto(f"{cx.name([n.name])}_indices", (n.name,), (indices,), (x,), op=op, x=x, out=indices,
                          dim=dim))
        return
    cx.claim(ArgProto(cx.name([n.name]), (n.name,), (n.outputs[0].name,), (x,), op=op, x=x,
                      out=n.outputs[0].name, dim=dim))


# ---------------------------------------------------------------------- lower


def lower(lw, pr: ArgProto, pre: list) -> None:
    vx = lw.read(pr.x, pre, pr.phase)
    if pr.dim is None or vx.ndim == 0:
        flat = L.reshape(vx, (vx.numel,))
        if flat is None:
            c = lw.copy_contiguous(pr.x, vx, pre, pr.phase, why="an arg reduction of the whole tensor")
            flat = L.reshape(lw.views[c], (vx.numel,))
        vx, d = flat, 0
        cut: list[int] = []
    else:
        d = pr.dim
        vx = readable(lw, pr.x, vx, pre, pr.phase, [d, d + 1], "arg reductions read [outer, red, inner]")
        # out is x's shape without the reduced dim, or with it as a unit dim: [outer, inner]
        cut = [d, d + 1] if len(lw.shape(pr.out)) == len(lw.shape(pr.x)) else [d]
    outer, red, inner, so, sr, si = outer_n_inner(vx, d)
    vo, post = writable(lw, pr, pr.out, cut)
    gs = dim_groups(vo, cut)
    (o_o, oso), (o_i, osi) = (gs[0], gs[-1]) if cut else ((1, 0), (1, 0))
    spec = ArgSpec("arg", pr.op, vx, outer, red, inner, so, sr, si, vo, oso if o_o > 1 else 0,
                   osi if o_i > 1 else 0)
    lw.add(pr, pr.name, spec, [vx], [vo], touched=list(pr.ins) + [pr.out, pr.x])
    copy_back(lw, pr, post)


# ---------------------------------------------------------------------- cost, interpret, render


def cost(spec: ArgSpec, ceil) -> tuple[float, float, float]:
    return float(spec.outer * spec.red * spec.inner), float(view_bytes(spec.x) + view_bytes(spec.out)), ceil.fp32


def interpret(mem, a: ArgSpec) -> None:
    import torch

    assert a.outer * a.inner <= 0 or a.red >= 1, "scan.cuh: launch_arg_reduce refuses red < 1"
    x = mem.hook(a.prologue, mem.read(a.x, (a.outer, a.red, a.inner), (a.in_so, a.in_sr, a.in_si)))
    # The first extreme (torch.argmax's documented choice), a NaN beating every number, an
    # infinite one included (scan.cuh: arg_better).
    if a.outer * a.inner == 0:
        return
    nan = torch.isnan(x)
    key = torch.where(nan, torch.full_like(x, -math.inf), x if a.op == "max" else -x)
    hit = torch.where(nan.any(1, keepdim=True), nan, key == key.amax(1, keepdim=True)).to(torch.int64)
    first = hit.argmax(1)  # the first index where the extreme is reached
    mem.write(a.out, first.double(), (a.outer, a.inner), (a.out_so, a.out_si))


def render(t, a: ArgSpec, n, fn: str) -> tuple[list[str], list[str]]:
    pre: list[str] = []
    hk = ""
    if a.prologue:
        pre = cxx.hook(f"{fn}_pro", a.prologue)
        hk = f", {fn}_pro{{}}"
    body = [f"  const stitch::ArgParams<{ctype(a.x.dtype)}> ap{{{n('x')}, {a.outer}, {a.red}, {a.inner}, {a.in_so}, "
            f"{a.in_sr}, {a.in_si}, {n('out')}, {a.out_so}, {a.out_si}}};"]
    op = {"max": "Max", "min": "Min"}[a.op]
    return cxx.include(HEADER) + pre, body + cxx.call(t.name, f"stitch::launch_arg_reduce<stitch::ArgOp::{op}>(ap, stream{hk})")


KIND = TaskKind("arg", ArgSpec, "reduction_template", cost, interpret, render, lowers=((ArgProto, lower),),
                claims=(ClaimRule("fuse", 150, claim),), scratch=frozenset())

__all__ = ["ArgSpec", "ArgProto", "KIND"]
