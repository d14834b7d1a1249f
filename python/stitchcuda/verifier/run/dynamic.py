"""The dynamic anti-hacking checks: what a program that is right on fresh buffers may still be hiding.

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
                           buffers) by an amount that moves the reference's outputs: the outputs that
                           depend on it must move as the reference's do (a memo keyed by a fingerprint
                           of a few elements, a subsampled reduction)
``stream_ordered``         the stream is held by a sleep kernel, new inputs are copied in and the outputs
                           poisoned *on the stream*, the program runs, a snapshot is taken on the stream:
                           it must match the reference (work on another stream reads stale inputs or is
                           overwritten by the poison)
``precision_claim``        the candidate's mean error against the truth (float64 where it fits) compared
                           with the reference's at the claimed policy and at the next lower one: a tf32
                           claim computed in bf16 has bf16's error statistics
=========================  ==========================================================================

The timed calls are checked in :mod:`.timing` (``timed_calls``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..report.verdict import DynamicCheck
from .compare import close_mask, errors, fingerprint, mean_abs, mean_abs_error
from .copies import Stash, count_same, nbytes
from .inputs import Change, apply_change, choose_change
from .session import (Draw, Judged, LastTrial, Session, all_finite, any_poison, count_where, empty_outputs, fresh_copy,
                      is_float, poison_)

#: The policy whose arithmetic a dishonest claim of each policy would really use. Not fp16's:
#: bf16 runs at fp16's speed on tensor cores (nothing to gain), and an honest fp16 program
#: stores every intermediate in fp16 where PyTorch's autocast keeps softmax, norms and
#: reductions in fp32, so it can sit at bf16-autocast's error (measured on an H100:
#: models/norm_softmax under fp16, 2.1e-5 mean error against autocast fp16's 2.5e-6 and bf16's 2.0e-5).
LOWER = {"fp32": "tf32", "tf32": "bf16"}

#: Factors by which a sensitivity change grows when the reference did not move.
ESCALATION = (1.0, 30.0, 1000.0)


def dynamic_checks(s: Session, last: LastTrial) -> list[DynamicCheck]:
    """The sequences after the trials; ``last`` is the last plain trial. Failures go to the
    session; returns the checks that are not session bookkeeping (stream_ordered)."""
    repeated_calls(s)
    sensitivity(s, last)
    return [stream_ordered(s)]


# ------------------------------------------------------------------ same buffers, called again


def _classify(s: Session, label: str, jd: Judged, y: Sequence[torch.Tensor], prev: Stash | None,
              check: str, fill: float | None = None) -> None:
    """Name what went wrong on a repeated call: stale outputs (``check``) or another wrong answer.
    Only a program right on fresh buffers is named so; otherwise the plain trials already say it.
    ``prev``: the previous call's outputs (None, or kept nowhere: no failure is named stale)."""
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
        if n:  # (outputs left as filled: outputs_written says so)
            s.fail("repeat_calls", f"{label}: output {spec.name} wrong ({int(bad.sum().item())} of {o.numel()} "
                                   "elements) on a repeated call with the same buffers, though right on fresh "
                                   "buffers")


def repeated_calls(s: Session) -> None:
    """Six calls: new contents into the same input buffers (``X1``), then fresh input buffers
    (``X2``) into the same outputs, then ``X2`` unchanged with the outputs poisoned, then ``X1``
    again. Outputs are poisoned, kept or filled with a finite value in turn.

    At most two sets of input buffers are alive (``X1``, and ``X2`` or a draw being copied into
    ``X1``); the previous call's outputs, which only name a failure (stale or not), are kept
    before the calls that keep their outputs, where the memory budget says (the host for
    multi-GiB outputs)."""
    ref, secret = s.ref, s.secret
    y = empty_outputs(s.out_specs, s.device)
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
                x1 = [fresh_copy(t, s.calls) for t in d.program]
            elif which == "x1":
                for buf, v in zip(x1, d.program):
                    buf.copy_(v)
            elif s.budget.on_device(nbytes(d.program)):
                x2 = [fresh_copy(t, s.calls) for t in d.program]
            else:  # no room for a third input set: the draw itself (made while X1 is alive, never at its address)
                x2 = list(d.program)
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
                      value if fill == "const" else None)
        jd = None
    prev.drop()
    if s.plain_ok and not any(c in s.failures for c in ("no_output_reuse", "outputs_follow_inputs", "repeat_calls")):
        s.passes["no_output_reuse"] = "new contents in the same input buffers gave new outputs (4 calls)"
        s.passes["outputs_follow_inputs"] = "outputs changed with new input buffers into the same outputs"
        s.passes["repeat_calls"] = "6 calls on the same buffers right (outputs poisoned, kept and caller-filled)"


# ------------------------------------------------------------------ one element changed


def sensitivity(s: Session, last: LastTrial, n: int = 3) -> None:
    """``n`` trials from the last plain trial's state (its inputs drawn again from their seed, the
    program's outputs for them from the copy kept): one random element changed, in place (every
    trial but the last, the outputs holding the unchanged inputs' outputs) or in fresh buffers
    (the last trial, outputs poisoned). The in-place buffers are given up before the fresh ones
    are made, so that one set of inputs is alive besides a transient copy."""
    from .session import own_inputs

    rng = s.secret.rng("sensitivity")
    d = s.ref.draw(last.draw.seed)
    x = own_inputs(d, s.calls)
    base = last.outputs
    y = empty_outputs(s.out_specs, s.device)
    if base.available:
        base.restore_into(y)
    else:
        s.note("sensitivity: the unchanged inputs' outputs were kept nowhere (no room); the in-place trials poison "
               "the outputs instead of keeping them")
    ref = s.reference(d, x)
    eligible = [i for i in range(len(x)) if i not in s.lifted]
    names = [t.name for t in s.in_specs]
    shapes = [t.shape for t in s.in_specs]
    judged = []
    for k in range(n):
        change = choose_change(rng, x, eligible)
        if change is None:
            s.note("sensitivity trials not applicable: no floating-point input")
            return
        in_place = k < n - 1
        if not in_place:
            flat = old = None  # noqa: F841 - views of the in-place buffers
            x = [fresh_copy(t, s.calls) for t in x]  # the in-place buffers go: fresh ones, reused per escalation
            y = None
            y = empty_outputs(s.out_specs, s.device)
        for factor in ESCALATION:
            c = Change(change.tensor, change.index, change.delta * factor)
            flat = x[c.tensor].view(-1)
            old = flat[c.index].clone()
            apply_change(x, c)
            keep = in_place and base.available
            if keep:
                base.restore_into(y)
            what = f"sensitivity {k + 1} ({'in place' if in_place else 'fresh buffers'}: " \
                   f"{c.describe(names, shapes)})"
            s.run(x, y, fill="keep" if keep else "poison0", what=what)
            r_new = s.reference(d, x)
            moved = _moved(s, ref, r_new)
            if moved:
                jd = s.judge(f"sensitivity ({'in place' if in_place else 'fresh buffers'})", y, d, x, ref=r_new,
                             varied=True)
                judged.append(c.describe(names, shapes))
                if not jd.trial.passed and s.plain_ok:
                    _sensitivity_failure(s, what, jd, y, base if keep else None)
                jd = None
            r_new = None
            flat[c.index] = old  # restored exactly (not by subtracting delta), after any float64 reference
            if moved:
                break
        else:
            s.note(f"sensitivity {k + 1}: no change of {names[change.tensor]} up to {ESCALATION[-1]:g}x moved the "
                   "reference's outputs beyond tolerance (an element they do not depend on)")
    base.drop()
    if judged and s.plain_ok and "sensitivity" not in s.failures:
        s.passes["sensitivity"] = "outputs followed single-element changes: " + "; ".join(judged)


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


# ------------------------------------------------------------------ stream order


def stream_ordered(s: Session) -> DynamicCheck:
    runner, tol = s.runner, s.tol
    d = s.ref.draw(s.secret.seed_for("stream"))
    x = [fresh_copy(t, s.calls) for t in d.program]
    y = empty_outputs(s.out_specs, s.device)
    snap = [torch.empty_like(t) for t in y]
    new_inputs = d.program
    for t in x:  # stale contents until the held stream copies the new ones in
        if t.dtype.is_floating_point:
            t.zero_()
    runner.sync_device()

    def load():
        for xi, v in zip(x, new_inputs):
            xi.copy_(v)
        for yi in y:
            poison_(yi, 0)

    def take():
        for si, yi in zip(snap, y):
            si.copy_(yi)

    runner.hold()
    runner.ordered(load)
    runner.run(x, y)
    runner.ordered(take)
    runner.sync()
    s.calls += 1
    ref = s.reference(d, new_inputs)
    if all(bool(close_mask(a, r, tol).all().item()) for a, r in zip(snap, ref)):
        return DynamicCheck("stream_ordered", "pass", "outputs complete when the stream's work completed")
    runner.sync_device()
    for yi in y:
        poison_(yi, 0)
    runner.sync_device()  # the poison must land before the program, wherever it runs
    runner.run(x, y)
    runner.sync_device()
    s.calls += 1
    if all(bool(close_mask(a, r, tol).all().item()) for a, r in zip(y, ref)):
        bad = sum(int((~close_mask(a, r, tol)).sum().item()) for a, r in zip(snap, ref))
        return DynamicCheck("stream_ordered", "fail",
                            f"{bad} output elements were not final when the work queued on the given stream had "
                            "completed (right only after a device-wide synchronise): work runs on another stream")
    return DynamicCheck("stream_ordered", "pass", "inconclusive: the outputs are wrong even after a device-wide "
                                                  "synchronise (see the trials)")


# ------------------------------------------------------------------ the precision claim


def precision_claim(s: Session, d: Draw, x: list[torch.Tensor], y: list[torch.Tensor],
                    ref: list[torch.Tensor]) -> DynamicCheck:
    """Trial 0's outputs against the truth, beside the reference at the claimed and the lower policy.

    Applies to an output only where the lower policy's error is at least 4x the claimed one's (the
    two are told apart on this problem); fails when the candidate's mean error is at least a third
    of the lower policy's and 2.5x the claimed one's. (Rounding a GEMM's inputs to bf16 gives about
    8x the error of rounding them to TF32, 4x that of truncating them; PyTorch's bf16 reference also
    rounds its outputs, about 1.2x more. An honest TF32 program, even one using TF32 where PyTorch
    keeps fp32, stays at a fifth of the bf16 error or below.)"""
    lower = LOWER.get(s.policy)
    if s.trials and not s.trials[0].passed:
        return DynamicCheck("precision_claim", "pass", "not judged: trial 0 is wrong at any precision (a wrong answer)")
    if lower is None:
        return DynamicCheck("precision_claim", "pass", f"no policy below {s.policy}: nothing to tell apart")
    floats = [k for k, o in enumerate(y) if is_float(o)]
    side_by_side = s.budget.on_device(2 * sum(y[k].numel() * 4 for k in floats))
    na = DynamicCheck("precision_claim", "pass", f"not measurable here: PyTorch cannot compute the reference at "
                                                 f"{s.policy} and {lower} on {s.device.type}")
    same = DynamicCheck("precision_claim", "pass", f"{s.policy} and {lower} give the same results here: nothing "
                                                   "to tell apart")
    at = s.ref.forward_at(s.policy, d, x)
    if at is None:
        return na
    if side_by_side:
        low = s.ref.forward_at(lower, d, x)
        if low is None:
            return na
        if all(mean_abs_error(low[k], at[k]) <= 1e-6 * max(mean_abs(ref[k]), 1e-30) for k in floats):  # the two policies compute the same here (no GEMM): no float64 needed to say so
            return same
    else:  # one output-sized reference at a time: bit-identical results (no GEMM) are the same, by a keyed hash
        h_at = [fingerprint(at[k], s.key) for k in floats]
        at = None
        low = s.ref.forward_at(lower, d, x)
        if low is None:
            return na
        if all(fingerprint(low[k], s.key) == h for k, h in zip(floats, h_at)):
            return same
        low = None
    truth = s.ref.forward64(d, x) or ref
    truth_name = "float64" if truth is not ref else "fp32"
    e_r = {k: mean_abs_error(ref[k], truth[k]) if truth is not ref else 0.0 for k in floats}
    if at is None:  # computed again, one at a time
        at = s.ref.forward_at(s.policy, d, x)
        e_at = {k: mean_abs_error(at[k], truth[k]) for k in floats}
        at = None
        low = s.ref.forward_at(lower, d, x)
        e_low = {k: mean_abs_error(low[k], truth[k]) for k in floats}
        low = None
    else:
        e_at = {k: mean_abs_error(at[k], truth[k]) for k in floats}
        e_low = {k: mean_abs_error(low[k], truth[k]) for k in floats}
    told, lines = 0, []
    for k in floats:
        spec, o, t = s.out_specs[k], y[k], truth[k]
        e_c, base = mean_abs_error(o, t), max(e_at[k], e_r[k])
        if e_low[k] < 4 * base or e_low[k] == 0.0:
            continue
        told += 1
        lines.append(f"{spec.name}: {e_c:.3g} (reference at {s.policy} {e_at[k]:.3g}, at {lower} {e_low[k]:.3g})")
        if e_c >= e_low[k] / 3 and e_c >= 2.5 * base:
            return DynamicCheck("precision_claim", "fail",
                                f"output {spec.name}: mean |err| {e_c:.3g} against the {truth_name} reference matches "
                                f"{lower} arithmetic ({e_low[k]:.3g}), not the {s.policy} claimed ({e_at[k]:.3g})")
    if not told:
        return DynamicCheck("precision_claim", "pass", f"{s.policy} and {lower} give the same error here: nothing to "
                                                       "tell apart")
    return DynamicCheck("precision_claim", "pass", "mean |err| against " + truth_name + ": " + "; ".join(lines))


__all__ = ["LOWER", "ESCALATION", "dynamic_checks", "repeated_calls", "sensitivity", "stream_ordered",
           "precision_claim"]
