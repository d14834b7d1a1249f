"""Scans through scan.cuh: inclusive cumsum, cumprod, cummax, cummin and logcumsumexp along one dim.

Claim: every free scan node with its unary hooks; ``cumsum(x.flip(d), d).flip(d)`` is one reverse
scan. The indices of cummax / cummin are refused. Lowering: x and out as [outer, n, inner] around
the scanned dim (copied first when the dims do not collapse).
"""


from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .. import layout as L
from .. import ops
from ..dtypes import ctype
from ..ir import Node
from ..layout import View
from ..ops import EwInstr
from . import cxx
from .base import ClaimRule, Proto, TaskKind, copy_back, hooked_touched, outer_n_inner, readable, view_bytes, writable

A = ops.A


HEADER = "scan.cuh"


@dataclass(frozen=True)
class ScanSpec:
    """scan.cuh: inclusive scan of x viewed as [outer, n, inner] (strides ``in_so, in_sn, in_si``)
    along n into out (``out_so, out_sn, out_si``); ``op`` sum, prod, max, min or logsumexp;
    ``reverse`` scans from the end. fp32 accumulation. Hooks as RowSpec."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "scan")

    kind: str
    op: str
    x: View
    outer: int
    n: int
    inner: int
    in_so: int
    in_sn: int
    in_si: int
    out: View
    out_so: int
    out_sn: int
    out_si: int
    reverse: bool = False
    prologue: tuple[EwInstr, ...] = ()
    epilogue: tuple[EwInstr, ...] = ()


@dataclass(frozen=True)
class ScanProto(Proto):
    """An inclusive scan of x along ``dim`` (``reverse``: from the end), with hooks."""

    op: str = "sum"
    x: str = ""
    out: str = ""
    dim: int = 0
    reverse: bool = False
    pro: tuple[str, ...] = ()
    epi: tuple[str, ...] = ()


# ---------------------------------------------------------------------- claim


def claim(cx) -> None:
    """Claim every free scan node, in graph order."""
    ix = cx.ix
    for n in sorted(ix.nodes.values(), key=lambda m: ix.pos[m.name]):
        if ops.kind(n.op) == "scan" and cx.free(n):
            _scan(cx, n)


def _flip_of(cx, n: Node | None, dim: int) -> bool:
    if n is None or n.op != A + "flip.default" or not cx.free(n):
        return False
    nd = len(cx.ix.shape(n.inputs[0]))
    return [L.norm_dim(int(d), nd) for d in n.attr("dims")] == [dim]


def _scan(cx, n: Node) -> None:
    ix = cx.ix
    x = n.inputs[0]
    xs = ix.shape(x)
    op = {"cumsum": "sum", "cumprod": "prod", "logcumsumexp": "logsumexp", "cummax": "max",
          "cummin": "min"}[n.op.removeprefix(A).split(".")[0]]
    for extra in n.outputs[1:]:
        if cx.used(extra.name):
            raise cx.fail(n, f"the indices of cum{op} are used; only its values are supported")
    if ix.spec(x).dtype in ("float64", "complex64", "complex128"):
        raise cx.fail(n, f"scan over {ix.spec(x).dtype}")
    dim = L.norm_dim(int(n.attr("dim")), len(xs)) if xs else 0
    out = n.outputs[0].name
    nodes = [n.name]
    reverse = False
    # cumsum(x.flip(d), d).flip(d) is the reverse scan of x.
    p = ix.producer.get(x)
    u = ix.only_user(out)
    if xs and _flip_of(cx, p, dim) and ix.only_user(x) is not None and _flip_of(cx, u, dim):
        nodes = [p.name, n.name, u.name]
        x, out, reverse = p.inputs[0], u.outputs[0].name, True
    pro: list[str] = []
    epi: list[str] = []
    if not reverse:
        pro, x, epi, out = cx.hooks(n, x, out)
        nodes = pro + nodes + epi
    cx.claim(ScanProto(cx.name(nodes), tuple(nodes), (out,), (x,), op=op, x=x, out=out, dim=dim, reverse=reverse,
                       pro=tuple(pro), epi=tuple(epi)))


# ---------------------------------------------------------------------- lower


def lower(lw, pr: ScanProto, pre: list) -> None:
    pro, epi = lw.hook(pr.pro), lw.hook(pr.epi)
    vx = lw.read(pr.x, pre, pr.phase)
    d = pr.dim
    if vx.ndim == 0:
        vx = L.unsqueeze(vx, 0)
    vx = readable(lw, pr.x, vx, pre, pr.phase, [d, d + 1], "scans read [outer, n, inner]", float_only=False)
    vo, post = writable(lw, pr, pr.out, [d, d + 1] if lw.shape(pr.out) else [])
    wo = vo if vo.ndim else L.unsqueeze(vo, 0)
    outer, n, inner, so, sn, si = outer_n_inner(vx, d)
    _, _, _, oso, osn, osi = outer_n_inner(wo, d)
    spec = ScanSpec("scan", pr.op, vx, outer, n, inner, so, sn, si, vo, oso, osn, osi, pr.reverse, pro, epi)
    lw.add(pr, pr.name, spec, [vx], [vo], touched=hooked_touched(lw, pr))
    copy_back(lw, pr, post)


# ---------------------------------------------------------------------- cost, interpret, render


def cost(spec: ScanSpec, ceil) -> tuple[float, float, float]:
    n = spec.outer * spec.n * spec.inner
    return float(n * (1 + len(spec.prologue) + len(spec.epilogue))), \
        float(view_bytes(spec.x) + view_bytes(spec.out)), ceil.fp32


def interpret(mem, s: ScanSpec) -> None:
    x = mem.hook(s.prologue, mem.read(s.x, (s.outer, s.n, s.inner), (s.in_so, s.in_sn, s.in_si)))
    if s.reverse:
        x = x.flip(1)
    y = {"sum": lambda: x.cumsum(1), "prod": lambda: x.cumprod(1), "max": lambda: x.cummax(1).values,
         "min": lambda: x.cummin(1).values, "logsumexp": lambda: x.logcumsumexp(1)}[s.op]()
    if s.reverse:
        y = y.flip(1)
    mem.write(s.out, mem.hook(s.epilogue, y), (s.outer, s.n, s.inner), (s.out_so, s.out_sn, s.out_si))


_SCAN_OP = {"sum": "Sum", "prod": "Prod", "max": "Max", "min": "Min", "logsumexp": "LogSumExp"}


def render(t, c: ScanSpec, n, fn: str) -> tuple[list[str], list[str]]:
    pre, hk = cxx.hooks(fn, c.prologue, c.epilogue) if (c.prologue or c.epilogue) else ([], "")
    body = [f"  const stitch::ScanParams<{ctype(c.x.dtype)}, {ctype(c.out.dtype)}> sp{{{n('x')}, {c.outer}, {c.n}, "
            f"{c.inner}, {c.in_so}, {c.in_sn}, {c.in_si},",
            f"      {n('out')}, {c.out_so}, {c.out_sn}, {c.out_si}, {cxx.cbool(c.reverse)}}};"]
    return cxx.include(HEADER) + pre, body + cxx.call(t.name, f"stitch::launch_scan<stitch::ScanOp::{_SCAN_OP[c.op]}>(sp, stream{hk})")


KIND = TaskKind("scan", ScanSpec, "reduction_template", cost, interpret, render, lowers=((ScanProto, lower),),
                claims=(ClaimRule("fuse", 170, claim),), scratch=frozenset())

__all__ = ["ScanSpec", "ScanProto", "KIND"]
