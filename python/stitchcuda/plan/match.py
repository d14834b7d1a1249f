"""Pass 1–2, *check* and *match*: multi-node patterns become one task each.

Takes a :class:`~.graph.GraphIndex`, the policy, the constraints and the ceilings; gives a
:class:`~.fused.Fused` holding the protos of the patterns the kinds' *match* rules recognised
(the graph index is rewritten where a pattern becomes one synthetic node, then frozen).

*check*: every node's operator is one the registry maps (:func:`stitchcuda.ops.supported`),
every tensor has a dtype the runtime stores; otherwise :class:`~.specs.PlanError` names each.

*match*: the rules of :mod:`stitchcuda.kinds` with stage ``match``, in order — attention
(:mod:`~stitchcuda.kinds.attention`), RMS norm and logsumexp written out
(:mod:`~stitchcuda.kinds.row`), batch / group / instance norm (:mod:`~stitchcuda.kinds.norm`),
GPT-2's tanh GELU written out (:mod:`~stitchcuda.kinds.elementwise`).
"""

from __future__ import annotations

from .. import ops
from ..device import Ceilings
from ..dtypes import ABI_SIZES
from ..kinds import claim_rules
from .claims import Claims
from .constraints import Constraints
from .fused import Fused
from .graph import GraphIndex
from .specs import PlanError

_UNSTORABLE = ("float64", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2")


def check(ix: GraphIndex) -> None:
    """Raise :class:`PlanError` naming every node the planner cannot map."""
    bad = []
    supported = ops.supported()
    for n in ix.g.nodes:
        if n.op not in supported:
            bad.append((n.op, n.name, n.source, "no template or generator maps it yet"))
            continue
        for o in n.outputs:
            if o.dtype in _UNSTORABLE:
                bad.append((n.op, n.name, n.source, f"{o.dtype} tensors are not supported by the runtime"))
    for s in ix.g.inputs + ix.g.weights:
        if s.dtype not in ABI_SIZES:
            bad.append((f"{s.dtype} tensor", s.name, s.name, f"{s.dtype} cannot cross the program ABI"))
    if bad:
        raise PlanError(ix.name, bad)


def match(ix: GraphIndex, policy: str, constraints: Constraints, ceil: Ceilings) -> Fused:
    """Check the graph, then run every kind's *match* rules (:func:`stitchcuda.kinds.claim_rules`)
    over it; the index is frozen after them."""
    check(ix)
    cx = Claims(ix, policy, constraints, ceil)
    for rule in claim_rules("match"):
        rule.claim(cx)
    ix.freeze()
    return cx.result()


__all__ = ["check", "match"]
