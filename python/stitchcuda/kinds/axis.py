"""Reductions over a middle run of dims through reduce.cuh's axis kernel: x as [outer, red, inner],
out as [outer, inner] (``sum``, ``mean``, ``max``, ``min``); and softmax / log-softmax over such a
run, x and out both as [outer, red, inner] (:class:`AxisRowSpec`, lowered by :mod:`.row` where the
reduced dims are not innermost in memory: a softmax over the channels of channels-first data, read
and written in place of a transposing copy before it and another after).

Claimed by :mod:`.row`'s rule (a reduction over a contiguous run of non-trailing dims, or a whole
large tensor to one value). Lowering: the three groups of dims must each collapse to one stride,
else x is copied first; an integer result is reduced in float32 and cast; a long reduced axis
may split over blocks through a workspace (reduce.cuh decides by the device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .. import layout as L
from ..dtypes import ctype
from ..layout import View
from ..ops import EwInstr
from . import cxx
from .base import FLOAT_DTYPES, Proto, TaskKind, hooked_touched, reduction_hooks, view_bytes


@dataclass(frozen=True)
class AxisInput:
    """What reduce.cuh's middle-axis kernels read: x as [outer, red, inner] with its element
    strides (the fields :class:`AxisSpec` and :class:`AxisRowSpec` begin with), and where they write."""

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


@dataclass(frozen=True)
class AxisSpec(AxisInput):
    """reduce.cuh's middle-axis reduction: x as [outer, red, inner], out as [outer, inner];
    ``workspace`` (fp32, ``workspace_floats``) lets a long reduced axis split over blocks."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "axis")

    out_so: int
    out_si: int
    workspace: View | None = None
    workspace_floats: int = 0
    prologue: tuple[EwInstr, ...] = ()
    epilogue: tuple[EwInstr, ...] = ()


@dataclass(frozen=True)
class AxisProto(Proto):
    """A reduction over the contiguous run of dims ``d0:d1`` in the middle of x."""

    op: str = ""
    x: str = ""
    out: str = ""
    d0: int = 0
    d1: int = 0
    pro: tuple[str, ...] = ()
    epi: tuple[str, ...] = ()
    op_pro: tuple[EwInstr, ...] = ()
    op_epi: tuple[EwInstr, ...] = ()


@dataclass(frozen=True)
class AxisRowSpec(AxisInput):
    """reduce.cuh's softmax over a middle axis: x and out both as [outer, red, inner], each with its
    own element strides; ``op`` ``softmax`` or ``log_softmax``."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "axis_row")

    out_so: int
    out_sr: int
    out_si: int
    prologue: tuple[EwInstr, ...] = ()
    epilogue: tuple[EwInstr, ...] = ()


#: The ops :class:`AxisRowSpec` computes, and the shortest inner extent it is chosen for (fewer
#: threads along inner than a warp would leave most lanes of each load idle: rows after a copy
#: then serve better).
AXIS_ROW_OPS = ("softmax", "log_softmax")
AXIS_ROW_MIN_INNER = 32


# ---------------------------------------------------------------------- lower


def lower_axis(lw, pr: AxisProto, pre: list) -> None:
    x_t, out_t = pr.x, pr.out
    d0, d1 = pr.d0, pr.d1
    pro, epi = reduction_hooks(lw, pr)
    vx = lw.read(x_t, pre, pr.phase)

    def groups(v: View):
        return (L.collapse(v.shape[:d0], v.strides[:d0]), L.collapse(v.shape[d0:d1], v.strides[d0:d1]),
                L.collapse(v.shape[d1:], v.strides[d1:]))

    gs = groups(vx)
    order = kept_in_memory_order(vx, d0, d1) if any(g is None for g in gs) and vx.dtype in FLOAT_DTYPES else None
    if order is not None:  # (channels-last x reduced over a middle dim: no copy)
        emit_in_memory_order(lw, pr, vx, d0, d1, order, pro, epi)
        return
    if any(g is None for g in gs) or vx.dtype not in FLOAT_DTYPES:
        c = lw.copy_contiguous(x_t, vx, pre, pr.phase, why="reduction groups must collapse",
                               dtype=None if vx.dtype in FLOAT_DTYPES else "float32")
        vx = lw.views[c]
        gs = groups(vx)
    xs = vx.shape
    ow = d0

    def out_groups(v: View):
        if len(v.shape) == len(xs):  # keepdim
            return L.collapse(v.shape[:d0], v.strides[:d0]), L.collapse(v.shape[d1:], v.strides[d1:])
        return L.collapse(v.shape[:ow], v.strides[:ow]), L.collapse(v.shape[ow:], v.strides[ow:])

    emit_axis(lw, pr, vx, gs, out_groups, pro, epi, list(pr.ins) + [out_t, x_t])


def kept_in_memory_order(vx: View, d0: int, d1: int) -> tuple[int, ...] | None:
    """x's dims as [outer..., reduced d0:d1..., inner...] where the kept dims do not collapse in
    their logical order but do in the order of their strides (channels-last x reduced over depth:
    outer N, inner H, W, C): kept dims of larger strides than every reduced one first, then the
    reduced dims, then kept dims of smaller strides, each part by decreasing stride. None when a
    kept dim's stride falls among the reduced ones' or a part does not collapse."""
    nd = len(vx.shape)
    red = list(range(d0, d1))
    big = [d for d in red if vx.shape[d] > 1]
    if not big:
        return None
    lo, hi = min(vx.strides[d] for d in big), max(vx.strides[d] for d in big)
    outer, inner = [], []
    for d in (d for d in range(nd) if not d0 <= d < d1):
        if vx.shape[d] == 1 or vx.strides[d] > hi:
            outer.append(d)
        elif vx.strides[d] < lo:
            inner.append(d)
        else:
            return None
    outer.sort(key=lambda d: (vx.shape[d] > 1, -vx.strides[d]))  # (ones first: their stride is free)
    inner.sort(key=lambda d: -vx.strides[d])
    order = tuple(outer) + tuple(red) + tuple(inner)
    xp = L.permute(vx, order)
    cuts = (0, len(outer), len(outer) + len(red), nd)
    if any(L.collapse(xp.shape[a:b], xp.strides[a:b]) is None for a, b in zip(cuts, cuts[1:])):
        return None
    return order


def emit_in_memory_order(lw, pr, vx: View, d0: int, d1: int, order: tuple[int, ...], pro, epi) -> None:
    """The axis task of ``pr`` (an axis or a row reduction: its x, out, ins and hooks) over x
    permuted to ``order`` (:func:`kept_in_memory_order`); its result is written dense in the same
    order of the kept dims, so that it too stays in x's layout."""
    nd, k = len(vx.shape), d1 - d0
    n_outer = order.index(d0)
    xp = L.permute(vx, order)
    keep_order = tuple(d for d in order if not d0 <= d < d1)
    squeezed = tuple(d if d < d0 else d - k for d in keep_order)  # the same dims of a result without them

    def groups(v: View):
        return (L.collapse(v.shape[:n_outer], v.strides[:n_outer]),
                L.collapse(v.shape[n_outer:n_outer + k], v.strides[n_outer:n_outer + k]),
                L.collapse(v.shape[n_outer + k:], v.strides[n_outer + k:]))

    def out_groups(v: View):
        if len(v.shape) == nd:  # keepdim: the reduced dims are ones, their strides free
            p = L.permute(v, order)
            shape, strides = p.shape[:n_outer] + p.shape[n_outer + k:], p.strides[:n_outer] + p.strides[n_outer + k:]
        else:
            p = L.permute(v, squeezed)
            shape, strides = p.shape, p.strides
        return L.collapse(shape[:n_outer], strides[:n_outer]), L.collapse(shape[n_outer:], strides[n_outer:])

    if list(keep_order) == sorted(keep_order):
        dense_order = None  # (kept dims in their logical order already: contiguous, as elsewhere)
    elif len(lw.shape(pr.out)) == nd:
        dense_order = order  # keepdim
    else:
        dense_order = squeezed
    emit_axis(lw, pr, xp, groups(xp), out_groups, pro, epi, hooked_touched(lw, pr), order=dense_order)


def emit_axis(lw, pr, vx: View, gs, out_groups, pro, epi, touched: list[str],
              order: tuple[int, ...] | None = None) -> None:
    """The axis task of ``pr`` over x ``vx`` whose dim groups ``gs`` are ((outer, stride), (red,
    stride), (inner, stride)); ``out_groups(view)`` gives an output layout's (outer, inner) groups
    (None where one does not collapse). The result is written where a reader wants it when that
    layout collapses so, else (fresh) dense in ``order`` when given and it collapses so, else into
    a float32 buffer copied (and cast) after."""
    out_t = pr.out
    (outer, so), (red, sr), (inner, si) = gs
    vo, post = _result_view(lw, pr, lambda v: all(g is not None for g in out_groups(v)), order)
    (o_o, out_so), (o_i, out_si) = out_groups(vo)
    if inner <= 1:
        si, out_si = 1, 1
    if outer <= 1:
        so, out_so = 0, 0
    ws_floats = _axis_workspace_floats(outer, red, inner, si, so, sr, vx.itemsize)
    ws = None
    if ws_floats:
        wt = lw.alloc.add_tensor(f"{out_t}_ws", (ws_floats,), "float32")
        ws = lw.alloc.fresh(wt, "float32", (ws_floats,), pr.phase)
        lw.views[wt] = ws
    spec = AxisSpec("axis", pr.op, vx, outer, red, inner, so, sr, si, vo, out_so, out_si, ws, ws_floats,
                    pro, epi)
    lw.add(pr, pr.name, spec, [vx], [vo] + ([ws] if ws else []), touched=touched)
    _write_back(lw, pr, post)


def _result_view(lw, pr, fits, order: tuple[int, ...] | None = None) -> tuple[View, tuple[View, View] | None]:
    """Where an axis task writes ``pr.out``: where a reader wants it when ``fits`` (the layout's
    groups collapse) and its dtype is a float, else (fresh) dense in ``order``; failing both, a fresh
    float32 buffer and (it, the result's view) for :func:`_write_back` (an integer result, reduced
    in float32 then cast, or a layout the groups do not fit)."""
    vo = lw.out_view(pr, pr.out, lambda tv: tv.dtype in FLOAT_DTYPES and fits(tv), order=order)
    if vo.dtype in FLOAT_DTYPES and fits(vo):
        return vo, None
    tmp = lw.alloc.add_tensor(f"{pr.out}_f32", vo.shape, "float32")
    written = lw.alloc.fresh(tmp, "float32", vo.shape, pr.phase)
    lw.views[tmp] = written
    return written, (written, vo)


def _write_back(lw, pr, post: tuple[View, View] | None) -> None:
    """The copy of :func:`_result_view`'s float32 buffer into the result, when one was needed."""
    if post is not None:
        lw.append(lw.copy_task(f"{pr.name}_out", list(pr.nodes), post[0], post[1], pr.phase,
                               note="writes the float32 result in the reference's dtype and layout"))


def _axis_workspace_floats(outer: int, red: int, inner: int, si: int, so: int, sr: int, itemsize: int) -> int:
    """Upper bound of reduce.cuh's reduce_axis_workspace_floats over both vector widths."""
    if outer <= 0 or inner <= 0 or red < 1:
        return 0
    best = 0
    for vec in (1, 16 // itemsize):
        if vec > 1 and not (si == 1 and inner % vec == 0 and so % vec == 0 and sr % vec == 0):
            continue
        ivec = inner // vec if vec else inner
        bx = 32 if ivec >= 32 else 1 << max(0, (max(ivec, 1) - 1).bit_length())
        tiles = outer * (-(-ivec // bx))
        max_by = 256 // bx
        splits = 1
        if tiles < 512:
            by_rows = -(-red // (max_by * 8))
            want = -(-1024 // max(tiles, 1))
            splits = max(1, min(want, by_rows))
        rps = -(-red // splits)
        splits = -(-red // rps)
        if splits > 1:
            best = max(best, splits * outer * inner)
    return best


# ---------------------------------------------------------------------- cost, interpret, render


def cost_axis(spec: AxisSpec, ceil) -> tuple[float, float, float]:
    n = spec.outer * spec.red * spec.inner
    flops = n * (1 + len(spec.prologue)) + spec.outer * spec.inner * len(spec.epilogue)
    return float(flops), view_bytes(spec.x) + view_bytes(spec.out), ceil.fp32


def _read_x(mem, s: AxisSpec | AxisRowSpec, launch: str):
    """x as [outer, red, inner] through the prologue, for an axis kind's interpreter (None: an empty
    launch, nothing to write)."""
    assert s.outer * s.inner <= 0 or s.red >= 1, f"reduce.cuh: {launch} refuses red < 1"
    if s.outer * s.inner == 0:
        return None
    return mem.hook(s.prologue, mem.read(s.x, (s.outer, s.red, s.inner), (s.in_so, s.in_sr, s.in_si)))


def _render_head(a: AxisSpec | AxisRowSpec, n, fn: str, params: str) -> tuple[list[str], str, str]:
    """An axis task's hook functors, the launch's trailing hook arguments, and the start of its
    params: ``stitch::<params><Tin, Tout> ap{x, outer, red, inner, in strides,``."""
    pre, hk = cxx.hooks(fn, a.prologue, a.epilogue) if a.prologue or a.epilogue else ([], "")
    head = (f"  const stitch::{params}<{ctype(a.x.dtype)}, {ctype(a.out.dtype)}> ap{{{n('x')}, {a.outer}, {a.red}, "
            f"{a.inner}, {a.in_so}, {a.in_sr}, {a.in_si},")
    return pre, hk, head


def interpret_axis(mem, s: AxisSpec) -> None:
    import torch

    x = _read_x(mem, s, "launch_reduce_axis")
    if x is None:
        return
    r = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}[s.op](x, 1)
    mem.write(s.out, mem.hook(s.epilogue, r), (s.outer, s.inner), (s.out_so, s.out_si))


_AXIS_OP = {"sum": "Sum", "mean": "Mean", "max": "Max", "min": "Min"}


def render_axis(t, a: AxisSpec, n, fn: str) -> tuple[list[str], list[str]]:
    pre, hk, head = _render_head(a, n, fn, "AxisParams")
    ws = f"{n('workspace')}, {a.workspace_floats}" if a.workspace is not None else "nullptr, 0"
    body = [head,
            f"                                       {n('out')}, {a.out_so}, {a.out_si}, {ws}}};",
            f"  return cuda_check(stitch::launch_reduce_axis<stitch::AxisOp::{_AXIS_OP[a.op]}>(ap, stream{hk}),",
            f'                    "{t.name}");']
    return pre, body


AXIS = TaskKind("axis", AxisSpec, "reduction_template", cost_axis, interpret_axis, render_axis,
                lowers=((AxisProto, lower_axis),), headers=("stitch/reduce.cuh",))


# ---------------------------------------------------------------------- softmax over a middle axis


def emit_axis_row(lw, pr, vx: View, d0: int, d1: int, pro, epi) -> bool:
    """The softmax task of row proto ``pr`` over x's dims ``d0:d1`` read and written in place
    (:class:`AxisRowSpec`), when x's three groups of dims collapse, the inner extent is at least
    :data:`AXIS_ROW_MIN_INNER` and the result can be written so; False (nothing emitted) otherwise."""
    if pr.op not in AXIS_ROW_OPS or vx.dtype not in FLOAT_DTYPES:
        return False

    def groups(v: View):
        return (L.collapse(v.shape[:d0], v.strides[:d0]), L.collapse(v.shape[d0:d1], v.strides[d0:d1]),
                L.collapse(v.shape[d1:], v.strides[d1:]))

    gs = groups(vx)
    if any(g is None for g in gs) or gs[2][0] < AXIS_ROW_MIN_INNER:
        return False
    (outer, so), (red, sr), (inner, si) = gs
    out_t = pr.out
    vo, post = _result_view(lw, pr, lambda v: all(g is not None for g in groups(v)))
    (_, oso), (_, osr), (_, osi) = groups(vo)
    if outer <= 1:
        so, oso = 0, 0
    spec = AxisRowSpec("axis_row", pr.op, vx, outer, red, inner, so, sr, si, vo, oso, osr, osi, pro, epi)
    lw.add(pr, pr.name, spec, [vx], [vo], touched=hooked_touched(lw, pr))
    _write_back(lw, pr, post)
    return True


def cost_axis_row(spec: AxisRowSpec, ceil) -> tuple[float, float, float]:
    n = spec.outer * spec.red * spec.inner
    return float(n * (5 + len(spec.prologue) + len(spec.epilogue))), view_bytes(spec.x) + view_bytes(spec.out), ceil.fp32


def interpret_axis_row(mem, s: AxisRowSpec) -> None:
    import torch

    x = _read_x(mem, s, "launch_softmax_axis")
    if x is None:
        return
    y = torch.softmax(x, 1) if s.op == "softmax" else torch.log_softmax(x, 1)
    mem.write(s.out, mem.hook(s.epilogue, y), (s.outer, s.red, s.inner), (s.out_so, s.out_sr, s.out_si))


_AXIS_ROW_OP = {"softmax": "Softmax", "log_softmax": "LogSoftmax"}


def render_axis_row(t, a: AxisRowSpec, n, fn: str) -> tuple[list[str], list[str]]:
    pre, hk, head = _render_head(a, n, fn, "AxisRowParams")
    body = [head, f"                                         {n('out')}, {a.out_so}, {a.out_sr}, {a.out_si}}};"]
    body += cxx.call(t.name, f"stitch::launch_softmax_axis<stitch::RowOp::{_AXIS_ROW_OP[a.op]}>(ap, stream{hk})")
    return pre, body


AXIS_ROW = TaskKind("axis_row", AxisRowSpec, "reduction_template", cost_axis_row, interpret_axis_row,
                    render_axis_row, headers=("stitch/reduce.cuh",), scratch=frozenset())

__all__ = ["AxisSpec", "AxisProto", "AxisRowSpec", "AXIS", "AXIS_ROW", "emit_axis_row"]
