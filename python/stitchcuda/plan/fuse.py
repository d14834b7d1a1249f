"""Pass 3, *fuse*: every node left after *match* joins a task.

Takes the :class:`~.fused.Fused` *match* gave; runs the rules of :mod:`stitchcuda.kinds` with
stage ``fuse``, in order — convolutions with their activation (first, so that a reduction's
prologue hook does not take it), recurrent layers, reductions with their unary hooks, GEMMs with
their epilogue chains, ``cat``, arg reductions, pooling, scans, gathers, ``arange``, slice
assignments, and last the remaining elementwise nodes as groups — and gives every node in a proto.
A node the constraints ``unfuse`` starts a task of its own. A task raised above a 16-bit policy
keeps its results in float32.
"""

from __future__ import annotations

from ..device import Ceilings
from ..kinds import claim_rules
from ..precision import get as get_policy
from .claims import Claims
from .constraints import Constraints
from .fused import Fused


def fuse(prev: Fused, constraints: Constraints, ceil: Ceilings) -> Fused:
    """Claim every node *match* left (see the module docstring)."""
    cx = Claims(prev.index, prev.policy, constraints, ceil, prev=prev)
    for rule in claim_rules("fuse"):
        rule.claim(cx)
    storage = get_policy(prev.policy).storage
    for pr in cx.protos:
        task_policy = getattr(pr, "policy", "") or prev.policy
        if get_policy(task_policy).storage != storage:
            cx.keep_f32.update(pr.outs)
    return cx.result()


__all__ = ["fuse"]
