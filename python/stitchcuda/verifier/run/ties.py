"""Ties: index-valued outputs judged on inputs with exact ties, so that a different tie rule shows.

Random floating inputs almost never tie, so an argmax that returns the last of several maximal
elements, or a sort that breaks ties its own way, is right on every ordinary trial. Where the
program has an integer output (argmax, argmin, sort or top-k indices), one trial draws every
floating input from five small integers (:func:`.inputs.tie_inputs`): ties everywhere. Its integer
outputs must equal the reference's where the reference's rule is defined — PyTorch's argmax,
argmin, max and min along a dimension return the first maximal (minimal) element, a stable sort
keeps ties in order — and its other outputs are judged as always. Where every index-producing op of
the reference breaks ties by an unspecified rule (an unstable sort, top-k), the indices are not
judged and a note says so. A failure is the ``ties`` check (named only when the plain trials passed).
"""

from __future__ import annotations

import torch

from ..report.verdict import DynamicCheck
from .inputs import tie_inputs
from .session import Session

#: Reference ops whose tie rule PyTorch defines (the first occurrence; a stable sort's order).
DEFINED = ("argmax", "argmin", "max.dim", "min.dim", "sort.stable", "cummax", "cummin")
#: Reference ops that produce indices with ties broken by an unspecified rule.
UNSPECIFIED = ("sort.default", "topk", "kthvalue", "median.dim", "mode")


def index_outputs(s: Session) -> list[int]:
    return [k for k, spec in enumerate(s.out_specs) if spec.dtype.startswith(("int", "uint"))]


def tie_rule(s: Session) -> str:
    """``defined``, ``unspecified`` or ``unknown`` (no reference op list to go by: judged as defined)."""
    ops = [str(getattr(o, "op", "")) for o in getattr(getattr(s.ref, "manifest", None), "reference_ops", ()) or ()]
    if any(any(d in op for d in DEFINED) for op in ops):
        return "defined"
    if any(any(u in op for u in UNSPECIFIED) for op in ops):
        return "unspecified"
    return "unknown"


def ties(s: Session) -> DynamicCheck | None:
    """The ``ties`` check (module docstring); None when the program has no integer output."""
    idx = index_outputs(s)
    if not idx:
        return None
    rule = tie_rule(s)
    if rule == "unspecified":
        s.note("ties: the reference breaks ties by an unspecified rule (an unstable sort, top-k): its indices are not "
               "judged on tied inputs")
        return DynamicCheck("ties", "pass", "not judged: the reference's tie rule is unspecified")
    d = s.ref.draw(s.secret.seed_for("ties"))
    gen = torch.Generator(device=s.device).manual_seed(s.secret.seed_for("ties:gen"))
    d.program = [t if i in s.lifted else tie_inputs(t, gen) for i, t in enumerate(d.program)]
    x = s.own_draw(d)
    y = s.new_outputs()
    s.run(x, y, fill="poison0", what="tied inputs")
    jd = s.judge("tied inputs", y, d, x)
    wrong = [o for k, o in enumerate(jd.trial.outputs) if k in idx and not o.passed]
    if wrong and s.plain_ok:
        o = wrong[0]
        at = f" at [{', '.join(map(str, o.where))}]" if o.where else ""
        got = f" (expected {o.expected:.0f}, got {o.got:.0f})" if o.expected is not None and o.got is not None else ""
        return DynamicCheck("ties", "fail", f"output {o.name}: another index than the reference's on inputs with exact "
                                            f"ties{at}{got}: the program breaks ties by another rule")
    return DynamicCheck("ties", "pass", f"index outputs equal the reference's on inputs with exact ties ({len(idx)} "
                                        "output(s))")


__all__ = ["ties", "index_outputs", "tie_rule", "DEFINED", "UNSPECIFIED"]
