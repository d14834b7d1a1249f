"""Group norm with the elementwise ops after it in one kernel that reads x from memory once
(norm_stream.cuh), for tensors larger than L2 — **behind the loop**: measured slower than the
two-pass form, so only the norm strategy ``stream`` asks for it.

The two-pass form (:mod:`.norm`: the statistics task, then the affine fused with what follows)
reads x twice and writes once: three passes over the tensor, where two are the floor. Where x
fits in L2 the second read is free; where it does not (KernelBench 1:35, a 7.5 GB group norm:
7.76 ms on an H100 at tf32, three passes at the copy bandwidth) it is a third of the traffic.
norm_stream.cuh computes a row's statistics and writes its output a step later, while the row is
still in L2.

Measured (BENCHMARKS.md, "A group norm read once"; H200, tf32, both forms in one process): 1:35
6.88 ms against the two-pass form's 5.62; 2:21 2.96 against 2.61; 2:19 7.40 against 6.56; 2:85
2.03 against 1.03. Correct everywhere, but slow: 1:35's 15 GB of needed traffic in 6.88 ms is
2.2 TB/s, where the two-pass kernels move 22.5 GB at 4.0. By arithmetic on those times (no profile
was taken), a block spends about 4.9 us on a 16 KB tile whose bytes need 2.2 us at its share of
the bandwidth: the rest goes to the tile's ticket, its barriers and the wait for its row. The
level-2 problems lost more: their group norms read a channels-last convolution's result, which this
kernel's plan copies into rows first (the two-pass statistics read it in place). Not the default
until it wins.

Claim (*match*, before :mod:`.norm`), only under the norm strategy ``stream``
(:func:`stitchcuda.plan.choices` offers it on every group norm the kernel can take, and the loop's
Variants proposer measures it): a group norm over float32 data in a program that stores float32,
x and its result one group of a sample a row, with the elementwise ops after it as an epilogue
hook. It could win only where x leaves L2 (two-pass's second read then costs DRAM traffic) and
a row stays small (between a tile's two reads pass about two rows of reads and one of writes).
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
from ..precision import get as get_policy
from . import cxx
from .base import ClaimRule, TaskKind, view_bytes
from .norm import GroupNormProto, group_vectors

HEADER = "norm_stream.cuh"
#: norm_stream.cuh's kNsThreads * kNsPacks: packs a tile.
TILE_PACKS = 256 * 4


@dataclass(frozen=True)
class NormStreamSpec:
    """norm_stream.cuh: ``out = epilogue((x - mean) * rstd * weight[c] + bias[c])`` over x and out
    as ``rows`` x ``cols`` float32 (row r at ``r * ldi`` / ``r * ldo``, unit stride along it), row r
    group ``r % groups`` of sample ``r // groups`` (channels ``g * cpg ...``, ``cols / cpg`` elements
    each), biased variance over the row; ``workspace``: :func:`workspace_floats` floats."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "norm_stream")

    kind: str
    x: View
    out: View
    ldi: int
    ldo: int
    rows: int
    cols: int
    groups: int
    cpg: int
    weight: View | None
    bias: View | None
    eps: float
    workspace: View
    epilogue: tuple[EwInstr, ...] = ()


@dataclass(frozen=True)
class NormStreamProto(GroupNormProto):
    """The group norm, its epilogue hook's nodes ``epi`` and the tensor they write, ``out``."""

    out: str = ""
    epi: tuple[str, ...] = ()


def workspace_floats(rows: int, cols: int) -> int:
    """norm_stream.cuh's norm_stream_workspace_floats at its largest (one element a pack)."""
    tiles = -(-cols // TILE_PACKS)
    return rows * tiles * 3 + rows * 2 + rows + 1


# ---------------------------------------------------------------------- claim


def rows_of(g, n: Node) -> tuple[int, int, int, int] | None:
    """(samples, groups, channels a group, elements a row) of a group norm the kernel can take;
    ``g``: the graph or its index (anything whose ``spec(tensor)`` has shape and dtype)."""
    if ops.kind(n.op) != "group_norm" or not n.inputs:
        return None
    x = g.spec(n.inputs[0])
    groups = int(n.attr("group") or 0)
    if len(x.shape) < 3 or x.dtype != "float32" or groups < 1 or x.shape[1] % groups or \
            g.spec(n.outputs[0].name).dtype != "float32":
        return None
    cols = math.prod(x.shape[1:]) // groups
    return (x.shape[0], groups, x.shape[1] // groups, cols) if cols >= 1 else None


def streams(g, n: Node, option: str) -> bool:
    """Whether group norm ``n`` streams under the strategy ``option`` (the module docstring)."""
    return option == "stream" and rows_of(g, n) is not None


def claim(cx) -> None:
    ix = cx.ix
    for n in sorted(ix.nodes.values(), key=lambda m: ix.pos[m.name]):
        if not cx.free(n) or not streams(ix, n, cx.constraints.option(n.name, "auto")):
            continue
        if any(ix.users.get(o.name) or o.name in ix.graph_outputs for o in n.outputs[1:]):
            continue  # its mean / rstd are read: the two-pass form says why it cannot
        if get_policy(cx.policy_of([n.name])).storage != "float32":
            continue
        samples, groups, cpg, _ = rows_of(ix, n)
        a = ix.args(n, ops.args(n.op))
        x = a["input"][1]
        w = a["weight"][1] if a["weight"] and a["weight"][0] == "t" else None
        b = a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None
        _, _, epi, out = cx.hooks(n, x, n.outputs[0].name)
        if cx.absorbs_unfused(epi):
            epi, out = [], n.outputs[0].name
        nodes = [n.name] + epi
        cx.claim(NormStreamProto(cx.name(nodes), tuple(nodes), (out,), tuple(t for t in (x, w, b) if t), x=x,
                                 weight=w, bias=b, eps=float(n.attr("eps")), samples=samples, groups=groups,
                                 cpg=cpg, out=out, epi=tuple(epi)))


# ---------------------------------------------------------------------- lower


def _matrix(v: View | None, rows: int, cols: int) -> tuple[View, int] | None:
    """``v`` as rows x cols with unit stride along a row: (the view, its row stride), or None."""
    m = L.reshape(v, (rows, cols)) if v is not None and v.numel == rows * cols else None
    rc = L.rows_cols(m, 1) if m is not None else None
    return None if rc is None or any(s < 0 for s in m.strides) else (m, rc[2])


def lower(lw, pr: NormStreamProto, pre: list) -> None:
    rows = pr.samples * pr.groups
    vx = lw.read(pr.x, pre, pr.phase)
    cols = vx.numel // rows
    mx = _matrix(vx, rows, cols) if vx.dtype == "float32" else None
    if mx is None:
        cc = lw.copy_contiguous(pr.x, vx, pre, pr.phase, dtype="float32",
                                why="the streamed group norm reads float32 rows with unit stride")
        mx = _matrix(lw.views[cc], rows, cols)
    w, b = group_vectors(lw, pr, pre)
    vo = lw.out_view(pr, pr.out, lambda tv: tv.dtype == "float32" and _matrix(tv, rows, cols) is not None,
                     inplace=[pr.x])
    mo = _matrix(vo, rows, cols)
    if vo.dtype != "float32" or mo is None:
        raise AssertionError(f"{pr.name}: the streamed group norm writes float32 rows with unit stride")
    size = workspace_floats(rows, cols)
    wt = lw.alloc.add_tensor(f"{pr.out}_ns_ws", (size,), "float32")
    ws = lw.alloc.fresh(wt, "float32", (size,), pr.phase)
    lw.views[wt] = ws
    spec = NormStreamSpec("norm_stream", mx[0], mo[0], mx[1], mo[1], rows, cols, pr.groups, pr.cpg, w, b,
                          float(pr.eps), ws, lw.hook(pr.epi))
    lw.add(pr, pr.name, spec, [mx[0], w, b], [mo[0], ws], touched=list(pr.ins) + [pr.out] +
           [lw.ix.nodes[nm].outputs[0].name for nm in pr.epi])


# ---------------------------------------------------------------------- cost, interpret, render


def cost(spec: NormStreamSpec, ceil) -> tuple[float, float, float]:
    n = spec.rows * spec.cols
    nbytes = view_bytes(spec.x) + view_bytes(spec.out) + view_bytes(spec.weight) + view_bytes(spec.bias)
    return float((7 + len(spec.epilogue)) * n), float(nbytes), ceil.fp32


def interpret(mem, s: NormStreamSpec) -> None:
    import torch

    x = mem.read(s.x, (s.rows, s.cols), (s.ldi, 1))
    mean = x.mean(1, keepdim=True)
    rstd = torch.rsqrt(((x - mean) ** 2).mean(1, keepdim=True) + s.eps)
    c = s.groups * s.cpg
    hw = s.cols // s.cpg
    ch = ((torch.arange(s.rows, device=mem.device) % s.groups)[:, None] * s.cpg +
          torch.arange(s.cols, device=mem.device)[None, :] // hw)
    w = mem.read(s.weight, (c,), (1,))[ch] if s.weight is not None else 1.0
    b = mem.read(s.bias, (c,), (1,))[ch] if s.bias is not None else 0.0
    mem.write(s.out, mem.hook(s.epilogue, (x - mean) * rstd * w + b), (s.rows, s.cols), (s.ldo, 1))


def render(t, s: NormStreamSpec, n, fn: str) -> tuple[list[str], list[str]]:
    pre: list[str] = []
    epi = ""
    if s.epilogue:
        pre = cxx.hook(f"{fn}_epi", s.epilogue)
        epi = f", {fn}_epi{{}}"
    tw = ctype((s.weight or s.bias or s.x).dtype)
    null = f"static_cast<const {tw}*>(nullptr)"
    body = [f"  stitch::NormStreamParams<{tw}> p{{}};",
            f"  p.x = {n('x')}; p.out = {n('out')}; p.ldi = {s.ldi}; p.ldo = {s.ldo};",
            f"  p.rows = {s.rows}; p.cols = {s.cols}; p.hw = {s.cols // s.cpg}; p.groups = {s.groups}; "
            f"p.cpg = {s.cpg};",
            f"  p.weight = {n.opt('weight', null)}; p.bias = {n.opt('bias', null)}; p.eps = {cxx.flit(s.eps)}; "
            f"p.workspace = {n('workspace')};"]
    return cxx.include(HEADER) + pre, body + cxx.call(t.name, f"stitch::launch_norm_stream<{tw}>(p, stream{epi})")


KIND = TaskKind("norm_stream", NormStreamSpec, "reduction_template", cost, interpret, render,
                lowers=((NormStreamProto, lower),), claims=(ClaimRule("match", 29, claim),))

__all__ = ["NormStreamSpec", "NormStreamProto", "rows_of", "streams", "workspace_floats", "KIND"]
