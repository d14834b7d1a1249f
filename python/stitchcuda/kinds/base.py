"""What every task kind is made of: :class:`TaskKind`, :class:`Proto`, :class:`ClaimRule`.

A *kind* is one sort of task — a GEMM, an elementwise group, a row reduction, a convolution —
and one :class:`TaskKind` value says everything the pipeline needs to know of it, in one place:

* ``claims``: its claim rules (:class:`ClaimRule`): which graph nodes become one of its protos,
  run by the planner's *match* (patterns over several nodes, before the graph index is frozen)
  or *fuse* stage, in ``order``;
* ``lowers``: for each proto type it owns, the function turning a proto into tasks over concrete
  buffer layouts (``lower(lw, proto, pre)``: ``lw`` is the planner's lowerer, ``pre`` the copies
  to run first);
* ``spec``: the frozen, JSON-serialisable dataclass its tasks carry (``Task.params``), with
  ``cost(spec, ceilings) -> (FLOPs, fewest bytes, peak FLOP/s)``,
  ``interpret(mem, spec)`` (the plan interpreter's model of the kernel, over byte buffers) and
  ``render(task, spec, names, fn) -> (lines before the function, body lines)`` (the C++ that calls
  its template);
* ``headers``: the template headers its tasks include; ``writes`` / ``scratch``: the spec's
  fields it writes and uses as workspace (the task contract's roles); ``strategy``: its label in
  the plan's table;
* ``layouts(proto)``: the layouts its protos want their inputs in, as (tensor, dim order) pairs,
  which *place* asks each input's producer to write (a channels-last convolution's input);
  ``out_order(proto, order_of)``: the dim order its result will be dense in when nothing else asks
  (``order_of(tensor)`` answers the same for its inputs; None: contiguous), so that a join of
  channels-last parts is laid out channels-last too.

Kinds take the planner's lowerer, the claim context and the interpreter's memory as arguments and
never import them: this package sits below :mod:`stitchcuda.plan`, :mod:`stitchcuda.code` and
:mod:`stitchcuda.check`, which dispatch through :data:`stitchcuda.kinds.KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .. import layout as L
from ..layout import View
from ..ops import EwInstr


@dataclass(frozen=True)
class Proto:
    """A task before layouts are known: what it computes over which graph tensors.

    ``nodes``: the (reference or synthetic) nodes it covers; ``outs``: the tensors it
    materialises; ``ins``: the tensors it reads; ``phase`` ``create``: computed once from weights.
    Each kind subclasses it with its own fields.
    """

    name: str
    nodes: tuple[str, ...]
    outs: tuple[str, ...]
    ins: tuple[str, ...]
    phase: str = "run"

    #: Nodes whose inputs the task reads directly (an elementwise group's members).
    @property
    def reading_nodes(self) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class ClaimRule:
    """One claim rule of a kind: ``claim(cx)`` claims free nodes through the claim context ``cx``.

    ``stage``: ``match`` (may rewrite the graph index: patterns over several nodes) or ``fuse``;
    rules run stage by stage in ascending ``order`` (what claims first wins a node).
    """

    stage: str
    order: int
    claim: Callable[[Any], None]


@dataclass(frozen=True)
class TaskKind:
    """One kind of task (see the module docstring)."""

    name: str
    spec: type
    strategy: str
    cost: Callable[[Any, Any], tuple[float, float, float]]
    interpret: Callable[[Any, Any], None]
    render: Callable[..., tuple[list[str], list[str]]]
    lowers: tuple[tuple[type, Callable[..., None]], ...] = ()
    claims: tuple[ClaimRule, ...] = ()
    headers: tuple[str, ...] = ()
    writes: frozenset[str] = frozenset({"out"})
    scratch: frozenset[str] = frozenset({"workspace"})
    layouts: Callable[[Any], tuple[tuple[str, tuple[int, ...]], ...]] | None = None
    out_order: Callable[[Any, Callable[[str], Any]], tuple[int, ...] | None] | None = None


def view_bytes(v: View | None) -> int:
    """Bytes a view can touch (0 for none)."""
    return 0 if v is None else v.footprint * v.itemsize


FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def int_list(v, n: int, default: int) -> tuple[int, ...]:
    """An int-list schema argument as ``n`` ints (a single value or an empty list repeats)."""
    if v is None or v == ():
        return (default,) * n
    if isinstance(v, (int, float)):
        return (int(v),) * n
    v = tuple(int(x) for x in v)
    return v * n if len(v) == 1 else v


def hooked_touched(lw, pr) -> list[str]:
    """The graph tensors a task with hooks touches (``Lowerer.add``'s ``touched``): its inputs, its
    x and result, and what its prologue and epilogue hook nodes write."""
    return list(pr.ins) + [pr.out, pr.x] + list(pr.pro + pr.epi) + \
        [lw.ix.nodes[nm].outputs[0].name for nm in pr.pro + pr.epi]


def reduction_hooks(lw, pr) -> tuple[tuple[EwInstr, ...], tuple[EwInstr, ...]]:
    """A reduction's prologue and epilogue: its hook nodes' instructions around the op's own
    transforms (prologue hook, then the op's; the op's, then the epilogue hook)."""
    return chain(lw.hook(pr.pro), pr.op_pro), chain(pr.op_epi, lw.hook(pr.epi))


def chain(first: Sequence[EwInstr], second: Sequence[EwInstr]) -> tuple[EwInstr, ...]:
    """The instructions of ``second`` applied to the result of ``first`` (both on input ``a0``)."""
    if not first:
        return tuple(second)
    if not second:
        return tuple(first)
    k = len(first)

    def arg(a: str) -> str:
        if a == "a0":
            return f"t{k - 1}"
        if a.startswith("t"):
            return f"t{int(a[1:]) + k}"
        return a

    return tuple(first) + tuple(EwInstr(i.op, tuple(arg(a) for a in i.args), i.consts) for i in second)



# ---------------------------------------------------------------------- lowering over [outer, n, inner]


def dim_groups(v: View, cuts: Sequence[int]) -> list[tuple[int, int] | None]:
    """(size, stride) of the dims of ``v`` between consecutive ``cuts``, each collapsed."""
    edges = [0] + list(cuts) + [v.ndim]
    return [L.collapse(v.shape[a:b], v.strides[a:b]) for a, b in zip(edges, edges[1:])]


def dense_block(lw, t: str, shape: tuple[int, ...], dtype: str, pre: list, phase: str, why: str) -> View:
    """Tensor ``t`` as one contiguous block of ``shape`` in ``dtype`` (a kernel's filters or bias): its
    own view where it is one, else a copy (made once, at create, when ``t`` is a weight or made of
    weights)."""
    v = lw.read(t, pre, phase)
    flat = L.reshape(v, shape)
    if flat is not None and flat.dtype == dtype and flat.is_contiguous():
        return flat
    at = "create" if lw.buffers[v.buffer].kind in ("weight", "const") else phase
    return L.reshape(lw.views[lw.copy_contiguous(t, v, pre, at, why=why, dtype=dtype)], shape)


def conv2d_reference(x, w, bias, out_shape: Sequence[int], stride, padding, dilation, groups: int = 1):
    """PyTorch's 2-d convolution (the plan interpreter's, in float64) with ``padding`` zeros before
    the first row and column and, after the last, as many as ``out_shape``'s extent reads (a folded
    asymmetric padding)."""
    import torch

    after = [max((o - 1) * st + d * (k - 1) + 1 - (i + p), 0) for o, st, d, k, i, p in
             zip(out_shape[2:], stride, dilation, w.shape[2:], x.shape[2:], padding)]
    x = torch.nn.functional.pad(x, (padding[1], after[1], padding[0], after[0]))
    y = torch.nn.functional.conv2d(x, w, bias, stride=stride, dilation=dilation, groups=groups)
    y = y[:, :, :out_shape[2], :out_shape[3]]
    assert tuple(y.shape) == tuple(out_shape), (tuple(y.shape), tuple(out_shape))
    return y


def readable(lw, t: str, v: View, pre: list, phase: str, cuts: Sequence[int], why: str,
             float_only: bool = True) -> View:
    """``v`` when its dims between ``cuts`` collapse (and, ``float_only``, it is a float type), else
    the view of a contiguous copy (``why`` names the reason) appended to ``pre``."""
    if any(g is None for g in dim_groups(v, cuts)) or (float_only and v.dtype not in FLOAT_DTYPES):
        c = lw.copy_contiguous(t, v, pre, phase, why=why, shape_view=v,
                               dtype=v.dtype if v.dtype in FLOAT_DTYPES or not float_only else "float32")
        v = lw.views[c]
    return v


def writable(lw, pr, t: str, cuts: Sequence[int]) -> tuple[View, tuple[View, View] | None]:
    """The view a kernel writes ``t`` through (its placement target when its dims collapse), and
    the (written, wanted) pair of a copy back when the kernel writes a fresh buffer instead."""
    vo = lw.out_view(pr, t, lambda tv: all(g is not None for g in dim_groups(tv, cuts)) and
                     all(s >= 0 for s in tv.strides))
    if all(g is not None for g in dim_groups(vo, cuts)):
        return vo, None
    tmp = lw.alloc.add_tensor(f"{t}_out", vo.shape, vo.dtype)
    w = lw.alloc.fresh(tmp, vo.dtype, vo.shape, pr.phase)
    lw.views[tmp] = w
    return w, (w, vo)


def copy_back(lw, pr, post: tuple[View, View] | None) -> None:
    """The copy from a fresh buffer back into the layout wanted (:func:`writable`'s pair), if any."""
    if post is not None:
        lw.append(lw.copy_task(f"{pr.name}_out", list(pr.nodes), post[0], post[1], pr.phase,
                               note="writes the result back in the reference's layout"))


def outer_n_inner(v: View, d: int) -> tuple[int, int, int, int, int, int]:
    """x as [outer, n, inner] around dim d: sizes and strides (unit dims get stride 0)."""
    (o, so), (n, sn), (i, si) = dim_groups(v, [d, d + 1])
    return o, n, i, (so if o > 1 else 0), (sn if n > 1 else 0), (si if i > 1 else 0)


__all__ = ["Proto", "ClaimRule", "TaskKind", "view_bytes", "FLOAT_DTYPES", "int_list", "chain", "reduction_hooks",
           "dim_groups", "readable", "writable", "copy_back", "outer_n_inner"]
