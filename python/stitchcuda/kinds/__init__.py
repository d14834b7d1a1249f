"""Task kinds: one module per kind of task, each holding its claim rule, lowering, cost, interpreter
and renderer (:class:`~.base.TaskKind`), registered in :data:`KINDS`.

The planner claims nodes with :func:`claim_rules`, lowers each proto with :func:`lowering`, and
costs every task with :func:`of_spec` ``.cost``; the plan interpreter runs ``.interpret``; the
Coder spells ``.render``; the task contract reads ``.writes`` and ``.scratch``. Nothing dispatches
on a type's name. A new kind is one module here (its spec, proto, rules and functions, and a
``TaskKind`` value) plus one line in :data:`KINDS`, and its tests.

Kinds, in registration order (the order of the program's standard includes):

===================  =====================================================================
:mod:`.elementwise`   fused pointwise expressions (and the tanh-GELU pattern)
:mod:`.copy`          ``cat``, slice assignments, layout copies
:mod:`.row`           row reductions: softmax, norms, sum / mean / max / min / var, logsumexp
:mod:`.axis`          reductions over a middle run of dims, and softmax over one
:mod:`.attention`     fused attention (and its constant mask's summary)
:mod:`.gemm`          cuBLASLt GEMMs with their epilogue chains
:mod:`.conv`          cuDNN convolutions with a fused activation, channels-last under tensor cores
:mod:`.depthwise`     depthwise 2-d convolutions, a kernel of our own, in either layout
:mod:`.narrow_conv`   2-d convolutions over few input channels, on tensor cores, a kernel of our own
:mod:`.norm`          batch / group / instance norm statistics
:mod:`.norm_stream`   group norm read once, with its epilogue (behind the loop: the strategy ``stream``)
:mod:`.pool`          pooling
:mod:`.scan`          cumulative scans
:mod:`.arg`           argmax / argmin
:mod:`.gather`        gathers, indexing, flips, padding, repeats, nearest upsampling
:mod:`.iota`          ``arange``
:mod:`.recurrent`     RNN / GRU / LSTM layers
===================  =====================================================================
"""

from __future__ import annotations

from typing import Any, Callable, Union

from . import (arg, attention, axis, conv, copy, depthwise, elementwise, gather, gemm, iota, narrow_conv, norm,
               norm_stream, pool, recurrent, row, scan)
from .base import ClaimRule, Proto, TaskKind

KINDS: tuple[TaskKind, ...] = (
    elementwise.KIND, copy.KIND, row.ROW, axis.AXIS, axis.AXIS_ROW, attention.ATTENTION, attention.MASK_BLOCKS, gemm.KIND,
    conv.KIND, depthwise.KIND, narrow_conv.KIND, norm.BN_STATS, norm.GROUP_STATS,
    norm_stream.KIND, pool.KIND, scan.KIND, arg.KIND, gather.KIND,
    iota.KIND, recurrent.KIND,
)

_BY_SPEC: dict[type, TaskKind] = {k.spec: k for k in KINDS}
_LOWERINGS: dict[type, tuple[TaskKind, Callable[..., None]]] = {p: (k, fn) for k in KINDS for p, fn in k.lowers}

#: Every task spec type, for :class:`~stitchcuda.plan.specs.Task`'s ``params`` (JSON reads by tag).
TaskSpec = Union[tuple(k.spec for k in KINDS)]  # type: ignore[valid-type]
#: Every proto type.
AnyProto = Union[tuple(_LOWERINGS)]  # type: ignore[valid-type]


def of_spec(spec: Any) -> TaskKind:
    """The kind whose tasks carry ``spec``."""
    k = _BY_SPEC.get(type(spec))
    if k is None:
        raise KeyError(f"no task kind has spec {type(spec).__name__}")
    return k


def lowering(proto: Any) -> Callable[..., None]:
    """The function that lowers ``proto`` (``fn(lw, proto, pre)``)."""
    entry = _LOWERINGS.get(type(proto))
    if entry is None:
        raise KeyError(f"no task kind lowers {type(proto).__name__}")
    return entry[1]


def input_layouts(proto: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The (tensor, dim order) layouts ``proto`` wants its inputs written in (none by default)."""
    entry = _LOWERINGS.get(type(proto))
    if entry is None or entry[0].layouts is None:
        return ()
    return tuple(entry[0].layouts(proto))


def output_order(proto: Any, order_of: Callable[[str], Any]) -> tuple[int, ...] | None:
    """The dim order ``proto``'s result is dense in when nothing else asks (None: contiguous)."""
    entry = _LOWERINGS.get(type(proto))
    if entry is None or entry[0].out_order is None:
        return None
    return entry[0].out_order(proto, order_of)


def claim_rules(stage: str) -> list[ClaimRule]:
    """The claim rules of ``stage`` (``match`` or ``fuse``) in the order they run."""
    rules = [r for k in KINDS for r in k.claims if r.stage == stage]
    return sorted(rules, key=lambda r: r.order)


__all__ = ["KINDS", "TaskKind", "ClaimRule", "Proto", "TaskSpec", "AnyProto", "of_spec", "lowering", "input_layouts",
           "output_order", "claim_rules"]
