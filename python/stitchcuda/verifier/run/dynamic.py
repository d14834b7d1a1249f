"""The dynamic anti-hacking checks on repeated calls and changed elements: what a program that is
right on fresh buffers may still be hiding.

Each check fails only on its own signature, so a program that is merely wrong stays a WrongAnswer
and a cheat is named:

``no_output_reuse``        repeated calls on the same input buffers with new contents: outputs that
                           repeat the previous call's where the reference moved (a skip keyed by
                           address, or a cache of results)
``outputs_follow_inputs``  new input buffers into output buffers that still hold the previous
                           call's outputs: elements left as they were although the reference moved
``repeat_calls``           the same buffers called again (the path a program's own CUDA graph
                           replays after its first two calls): any other wrong answer there; outputs
                           the caller filled with a finite value must be overwritten too
``sensitivity``            one random element of one input changed (anywhere; in place and in fresh
                           buffers), then changes where a shortcut would not look (the start of each
                           axis of an input: the first step of a sequence, the start of a scan; the
                           far end of one), each grown (up to 1e5x) until it moves the reference: the
                           outputs that depend on it must move as the reference's do (a memo keyed by
                           a fingerprint of a few elements, a subsampled reduction, a recurrence
                           computed from its last steps only)
=========================  ==========================================================================

The stream checks are in :mod:`.stream_checks`, the precision claim in :mod:`.precision_claim`, the
timed calls in :mod:`.timed_calls`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..report.verdict import DynamicCheck
from .compare import errors
from .copies import Stash, count_same, nbytes
from .inputs import Change, apply_change, choose_change, edge_changes
from .session import Judged, LastTrial, Session, all_finite, any_poison, count_where, is_float, same_wrong_answer

#: Factors by which a sensitivity change grows when the reference did not move.
ESCALATION = (1.0, 30.0, 1000.0)
#: The same for the changes where a shortcut would not look: a recurrence that contracts what it
#: carries (a decay of 0.99 a step over a thousand steps) forgets an ordinary change.
EDGE_ESCALATION = (1.0, 30.0, 1e3, 1e5)


def dynamic_checks(s: Session, last: LastTrial) -> list[DynamicCheck]:
    """The sequences after the trials; ``last`` is the last plain trial. Failures go to the
    session; returns the checks that are not session bookkeeping (stream_ordered)."""
    from .stream_checks import stream_ordered

    repeated_calls(s)
    sensitivity(s, last)
    return [stream_ordered(s)]


# ------------------------------------------------------------------ same buffers, called again


def _classify(s: Session, label: str, jd: Judged, y: Sequence[torch.Tensor], prev: Stash | None,
              check: str, fill: float | None = None, fresh: Callable[[], bool] | None = None) -> None:
    """Name what went wrong on a repeated call: stale outputs (``check``) or another wrong answer.
    Only a program right on fresh buffers is named so; otherwise the plain trials already say it.
    ``prev``: the previous call's outputs (None, or kept nowhere: no failure is named stale).
    ``fresh``: asked before a failure is named ``repeat_calls``: whether the same inputs in fresh
    buffers are wrong too (:func:`_wrong_on_fresh_buffers`)."""
    if not s.plain_ok:
        return
    for k, (spec, o, bad) in enumerate(zip(s.out_specs, y, jd.bad)):
        if bad is None:
            continue
        n_stale = count_same(bad, o, prev, k, exclude=any_poison) if prev is not None and prev.available else 0
        if n_stale:
            s.fail(check, f"{label}: {n_stale} of {o.numel()} elements of output {spec.name} repeat the previous "
                          "call's values although the inputs changed")
            continue
        if fill is not None and is_float(o):
            n, _ = count_where(lambda b, c: b & ~(any_poison(c) | (c == fill)), [bad.reshape(o.shape), o])
        else:
            n, _ = count_where(lambda b, c: b & ~any_poison(c), [bad.reshape(o.shape), o])
        if n and fresh is not None:
            if fresh():
                return  # wrong on fresh buffers too: a wrong answer on this draw (the trial stays failed)
            fresh = None  # right there: asked once
        if n:  # (outputs left as filled: outputs_written says so)
            s.fail("repeat_calls", f"{label}: output {spec.name} wrong ({int(bad.sum().item())} of {o.numel()} "
                                   "elements) on a repeated call with the same buffers, though right on fresh "
                                   "buffers")


def repeated_calls(s: Session) -> None:
    """Six calls: new contents into the same input buffers (``X1``), then fresh input buffers
    (``X2``) into the same outputs, then ``X2`` unchanged with the outputs poisoned, then ``X1``
    again. Outputs are poisoned, kept or filled with a finite value in turn. A call wrong but not
    stale is run once more on the same inputs in fresh buffers (:func:`_wrong_on_fresh_buffers`).

    At most two sets of input buffers are alive (``X1``, and ``X2`` or a draw being copied into
    ``X1``); the previous call's outputs, which only name a failure (stale or not), are kept
    before the calls that keep their outputs, where the memory budget says (the host for
    multi-GiB outputs)."""
    ref, secret = s.ref, s.secret
    y = s.new_outputs()
    value = float(secret.rng("repeat-fill").uniform(-3.0, 3.0))
    steps = [  # (inputs, draw, fill, what, stale check)
        ("x1", 0, "poison0", "same buffers, call 1 (fresh)", ""),
        ("x1", 1, "keep", "same buffers, call 2 (new contents, outputs hold call 1's)", "no_output_reuse"),
        ("x1", 2, "const", "same buffers, call 3 (new contents, outputs filled by the caller)", "no_output_reuse"),
        ("x2", 3, "keep", "new input buffers into outputs holding call 3's", "outputs_follow_inputs"),
        ("x2", 3, "poison1", "same inputs as call 4, outputs poisoned", ""),
        ("x1", 4, "keep", "first buffers again, new contents", "no_output_reuse"),
    ]
    x1: list[torch.Tensor] = []
    x2: list[torch.Tensor] = []
    prev = Stash(s.budget.place("repeat_calls: the previous call's outputs", nbytes(y)))
    d = None
    for k, (which, di, fill, what, stale_check) in enumerate(steps):
        if which == "x1" and x2:
            x2 = []  # done with the second buffers (before the next draw: two input sets at most)
        xs = None  # it may still name the second buffers
        if k == 0 or di != steps[k - 1][1]:
            d = None  # noqa: F841 - one draw alive at a time (multi-GiB problems)
            d = ref.draw(secret.seed_for(f"repeat{di}"))
            if which == "x1" and not x1:
                x1 = s.own(d.program)
            elif which == "x1":
                for buf, v in zip(x1, d.program):
                    buf.copy_(v)
            elif s.budget.on_device(nbytes(d.program)):
                x2 = s.own(d.program)
            else:  # no room for a third input set: each tensor of the draw given up once copied
                x2 = []
                for k2 in range(len(d.program)):
                    x2.append(s.buffers.copy(d.program[k2], s.calls + k2, f"input {s.in_specs[k2].name}"))
                    d.program[k2] = None
            d.program = []
        xs = x1 if which == "x1" else x2
        if fill == "keep":
            prev.save(y)  # what the outputs hold before the call
        s.run(xs, y, fill=fill, what=what, value=value)
        jd = s.judge(f"repeat {k + 1}", y, d, xs)  # computed again for call 5: never before a call
        if fill == "const":
            s.left_unwritten(jd.bad, what, value)
        if not jd.trial.passed:
            _classify(s, what, jd, y, prev if fill == "keep" else None, stale_check or "repeat_calls",
                      value if fill == "const" else None,
                      fresh=lambda: _wrong_on_fresh_buffers(s, what, jd, d, xs, y))
        jd = None
    prev.drop()
    if s.plain_ok and not any(c in s.failures for c in ("no_output_reuse", "outputs_follow_inputs", "repeat_calls")):
        s.passes["no_output_reuse"] = "new contents in the same input buffers gave new outputs (4 calls)"
        s.passes["outputs_follow_inputs"] = "outputs changed with new input buffers into the same outputs"
        s.passes["repeat_calls"] = "6 calls on the same buffers right (outputs poisoned, kept and caller-filled)"


def _wrong_on_fresh_buffers(s: Session, what: str, jd: Judged, d, xs: Sequence[torch.Tensor],
                            y: Sequence[torch.Tensor]) -> bool:
    """The inputs of a repeated call that came out wrong (not stale, outputs ``y``), once more in
    buffers of their own, outputs poisoned: where that call writes every output, is wrong too and gives
    ``y``'s answer (:func:`.session.same_wrong_answer`, the timed calls' rule), the failure is this
    draw's, not the same buffers'. A program whose error sits at the tolerance (TF32 through a deep
    net) misses it on one draw in several, whichever buffers hold it; naming that a cheat
    (``repeat_calls``) would hide a plain wrong answer, which precision answers. Then no later check
    names a cheat either (``plain_ok``). Right there, outputs left unwritten or another answer: the
    repeated call did something else, and the failure stays ``repeat_calls``; so it does where a
    third set of buffers has no room on the device."""
    if not s.budget.on_device(nbytes(xs) + nbytes(jd.ref)):
        s.note(f"{what}: no room for the same inputs in fresh buffers; the failure is named as a repeated call's")
        return False
    xf = s.own(xs, "input (fresh)")
    yf = s.new_outputs()
    s.run(xf, yf, fill="poison0", what=f"{what}, again in fresh buffers")
    again = s.judge(f"{what}, again in fresh buffers", yf, d, xf, ref=jd.ref, record=False)
    if again.trial.passed or not same_wrong_answer(y, yf, s.tol):
        return False
    s.plain_ok = False
    s.note(f"{what}: wrong, and wrong again with the same inputs in fresh buffers: a wrong answer on this "
           "draw, not a repeated call's")
    return True


# ------------------------------------------------------------------ one element changed


def sensitivity(s: Session, last: LastTrial, n: int = 3) -> None:
    """``n`` trials from the last plain trial's state (its inputs drawn again from their seed, the
    program's outputs for them from the copy kept): one random element changed, in place (every
    trial but the last, the outputs holding the unchanged inputs' outputs) or in fresh buffers
    (the last trial, outputs poisoned); then the edge changes of :func:`.inputs.edge_changes` in
    those fresh buffers, outputs poisoned. The in-place buffers are given up before the fresh ones
    are made, so that one set of inputs is alive besides a transient copy."""
    rng = s.secret.rng("sensitivity")
    d = s.ref.draw(last.draw.seed)
    x = s.own_draw(d)
    base = last.outputs
    y = s.new_outputs()
    if base.available:
        base.restore_into(y)
    else:
        s.note("sensitivity: the unchanged inputs' outputs were kept nowhere (no room); the in-place trials poison "
               "the outputs instead of keeping them")
    ref = s.reference(d, x)
    eligible = [i for i in range(len(x)) if i not in s.lifted]
    names = [t.name for t in s.in_specs]
    shapes = [t.shape for t in s.in_specs]
    judged: list[str] = []
    # A problem of several GiB has room in its 30 s for one change at an edge, in place of the fresh
    # buffers' random one; any other gets them all.
    randoms = n - 1 if s.large else n
    for k in range(randoms):
        change = choose_change(rng, x, eligible)
        if change is None:
            s.note("sensitivity trials not applicable: no floating-point input")
            return
        in_place = k < n - 1
        if not in_place:
            x = s.own(x)  # the in-place buffers go: fresh ones, reused per escalation and by the edge trials
            y = None
            y = s.new_outputs()
        _one_change(s, d, x, y, ref, change, ESCALATION, f"sensitivity {k + 1}", in_place, base, judged, names, shapes)
    if s.large:
        x = s.own(x)
        y = None
        y = s.new_outputs()
    for k, change in enumerate(edge_changes(rng, x, eligible, max_axes=1 if s.large else 3, far=not s.large)):
        _one_change(s, d, x, y, ref, change, EDGE_ESCALATION, f"sensitivity at an edge {k + 1}", False, base, judged,
                    names, shapes)
    base.drop()
    if judged and s.plain_ok and "sensitivity" not in s.failures:
        s.passes["sensitivity"] = "outputs followed single-element changes: " + "; ".join(judged)


def _one_change(s: Session, d, x: list[torch.Tensor], y: list[torch.Tensor], ref: list[torch.Tensor], change: Change,
                factors: Sequence[float], label: str, in_place: bool, base: Stash, judged: list[str],
                names: Sequence[str], shapes: Sequence[Sequence[int]]) -> None:
    """One change, grown by ``factors`` until the reference's outputs move; the program's outputs must
    move with them. The changed elements are restored exactly afterwards."""
    flat = x[change.tensor].view(-1)
    old = flat[change.index].clone()
    how = "in place" if in_place else "fresh buffers"
    for factor in factors:
        c = change.scaled(factor)
        apply_change(x, c)
        keep = in_place and base.available
        if keep:
            base.restore_into(y)
        what = f"{label} ({how}: {c.describe(names, shapes)})"
        s.run(x, y, fill="keep" if keep else "poison0", what=what)
        r_new = s.reference(d, x)
        moved = _moved(s, ref, r_new)
        if moved:
            kind = "sensitivity at an edge" if "edge" in label else "sensitivity"
            jd = s.judge(f"{kind} ({how})", y, d, x, ref=r_new, varied=True)
            judged.append(c.describe(names, shapes))
            if not jd.trial.passed and s.plain_ok and "varied_inputs" not in s.failures:
                # (a program already shown to assume its inputs' range is named for that)
                _sensitivity_failure(s, what, jd, y, base if keep else None)
            jd = None
        r_new = None
        flat[change.index] = old  # restored exactly (not by subtracting delta), after any float64 reference
        if moved:
            return
    s.note(f"{label}: no change of {names[change.tensor]} up to {factors[-1]:g}x moved the reference's outputs "
           "beyond tolerance (elements they do not depend on)")


def _moved(s: Session, before: Sequence[torch.Tensor], after: Sequence[torch.Tensor]) -> bool:
    for a, b in zip(before, after):
        if not is_float(a):
            if not bool(torch.equal(a, b)):
                return True
            continue
        if not all_finite(b) and all_finite(a):
            return False  # the change broke the reference (an overflow): not a fair question
        if not errors(b, a, s.tol).passed:
            return True
    return False


def _sensitivity_failure(s: Session, what: str, jd: Judged, ys: Sequence[torch.Tensor], base: Stash | None) -> None:
    for k, (spec, o, bad) in enumerate(zip(s.out_specs, ys, jd.bad)):
        if bad is None:
            continue
        n_bad = int(bad.sum().item())
        stale = count_same(bad, o, base, k) if base is not None and base.available else 0
        how = (f"{stale} of the {n_bad} wrong elements kept their value from before the change (memoised, or the "
               "changed element was never read)") if stale else f"{n_bad} elements wrong"
        s.fail("sensitivity", f"{what}: output {spec.name} did not follow the change as the reference's did: {how}")
        return


__all__ = ["ESCALATION", "EDGE_ESCALATION", "dynamic_checks", "repeated_calls", "sensitivity"]
