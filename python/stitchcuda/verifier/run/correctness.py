"""Correctness: a candidate program run against its PyTorch reference, trial by trial.

The procedure (MEASURING.md, "Correct first"), on a :class:`Runner` (the program on one stream)
and a :class:`ReferenceLike` (fresh inputs and the reference's outputs for them), every random
choice from the verification's :class:`~.inputs.Secret`:

1. ``trials`` plain trials (default 5) on fresh inputs from the reference's ``get_inputs()``.
   Outputs are filled with a NaN poison before every run; after it every element must have been
   written and the inputs must be unchanged (a keyed hash of their bits). Trial 0 runs twice
   (a race shows as a difference beyond rounding).
2. ``varied`` trials (default 4) on inputs of other distributions (:mod:`.inputs`: scaled,
   offset, heavy-tailed, sparse, structured), kinds and parameters drawn per verification.
3. The dynamic anti-hacking sequences of :mod:`.dynamic`: repeated calls on the same buffers with
   new contents, single-element sensitivity, stream order, the precision claim.

Every output is judged by the :class:`~.session.Session` (the policy's tolerance, scaled for small
outputs, float64 only where the fp32 comparison fails).

Ordering is a defence: the candidate always runs *before* the reference's outputs for the same
inputs exist in the process, so no program can copy them out of device memory. Each set of
inputs gets its reference computed once.

Everything here is device-agnostic PyTorch: the CPU tests drive it with a fake runner whose
"program" is a Python callable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..report.verdict import DynamicCheck, TrialResult
from .compare import torch_dtype
from .copies import CopyBudget
from .inputs import Secret, choose_variations, vary
from .session import LastTrial, ReferenceLike, Runner, Session, all_finite, empty_outputs, is_float, own_inputs

#: Default number of varied-distribution trials.
VARIED_TRIALS = 4


@dataclass(frozen=True)
class CorrectnessResult:
    trials: tuple[TrialResult, ...]
    checks: tuple[DynamicCheck, ...]
    tolerance: float
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0
    calls: int = 0  # program calls made
    inconclusive: str = ""  # set when a check could not be judged for a reason not the candidate's

    @property
    def passed(self) -> bool:
        return (all(t.passed for t in self.trials) and not any(c.status == "fail" for c in self.checks)
                and not self.inconclusive)


# ------------------------------------------------------------------ the procedure


def check_correctness(runner: Runner, reference: ReferenceLike, *, precision: str = "fp32", trials: int = 5,
                      seed: int = 0, varied: int = VARIED_TRIALS, dynamic: bool = True,
                      budget: CopyBudget | None = None) -> CorrectnessResult:
    """Run the trials and the dynamic checks (module docstring) at ``precision``'s tolerance, the
    Verifier's own copies placed by ``budget`` (default: from the device's free memory).
    Raises only on a broken reference (ReferenceMismatch: outputs that do not match the manifest);
    exceptions from the program propagate."""
    from . import dynamic as dyn

    if trials < 1:
        raise ValueError("check_correctness: trials must be >= 1")
    t0 = time.monotonic()
    secret = Secret(seed)
    s = Session(runner, reference, precision, secret, budget)
    extra: list[DynamicCheck] = []
    with runner.context(), torch.no_grad():
        last: LastTrial | None = None
        for k in range(trials):
            d = x = y = j = None  # noqa: F841 - the previous trial's tensors go before the next are drawn
            d = reference.draw(secret.seed_for(f"trial{k}"))
            x = own_inputs(d, s.calls)
            y = empty_outputs(s.out_specs, s.device)
            s.run(x, y, fill=f"poison{k % 2}", what=f"trial {k}")
            y2 = None
            if dynamic and k == 0:
                y2 = empty_outputs(s.out_specs, s.device)
                s.run(x, y2, fill="poison1", what="trial 0, second run")
                extra.append(s.determinism(y, y2))
                del y2
            j = s.judge("", y, d, x)
            s.plain_nonfinite |= any(is_float(r) and not all_finite(r) for r in j.ref)
            if dynamic and k == 0:
                extra.append(dyn.precision_claim(s, d, x, y, j.ref))
            if dynamic and k == trials - 1:
                last = LastTrial(d, s.stash("sensitivity's starting outputs", y))
        d = x = y = j = None  # noqa: F841 - nothing of the plain trials stays on the device
        s.plain_ok = all(t.passed for t in s.trials) and not s.failures
        if varied > 0:
            _varied_trials(s, varied, s.plain_ok)
        if dynamic and last is not None:
            extra += dyn.dynamic_checks(s, last)
    for line in s.budget.notes:
        s.note(line)
    checks = _collect(s, extra, dynamic)
    return CorrectnessResult(tuple(s.trials), tuple(checks), s.tol, tuple(s.notes), tuple(s.warnings),
                             time.monotonic() - t0, s.calls, s.inconclusive)


def _varied_trials(s: Session, n: int, plain_ok: bool) -> None:
    ref = s.ref
    variations = choose_variations(s.secret.rng("varied"), n)
    failed: list[str] = []
    judged = 0
    for j, v in enumerate(variations):
        d = x = y = r = None  # noqa: F841 - the previous trial's tensors go before the next are drawn
        d = ref.draw(s.secret.seed_for(f"varied{j}"))
        gen = torch.Generator(device=s.device).manual_seed(s.secret.seed_for(f"varied{j}:gen"))
        x = [t if i in s.lifted else vary(t, v, gen) for i, t in enumerate(d.program)]
        if all(a is b for a, b in zip(x, d.program)):
            s.note("varied trials not applicable: no floating-point input")
            return
        d.program = x
        x = own_inputs(d, s.calls)
        y = empty_outputs(s.out_specs, s.device)
        s.run(x, y, fill="poison0", what=f"varied trial ({v.label})")
        r = s.reference(d, x)
        if not s.plain_nonfinite and any(is_float(t) and not all_finite(t) for t in r):
            s.note(f"varied trial ({v.label}) skipped: the reference itself gives NaN or Inf on these inputs")
            continue
        if any(_beyond_range(t, spec.dtype) for t, spec in zip(r, s.out_specs)):
            s.note(f"varied trial ({v.label}) skipped: the reference's outputs exceed what the program's output dtype "
                   "can hold")
            continue
        jd = s.judge(v.label, y, d, x, varied=True, distribution=True, ref=r)
        judged += 1
        if not jd.trial.passed:
            failed.append(f"trial {jd.trial.index} ({v.label})")
    if failed and plain_ok:
        s.fail("varied_inputs", "right on get_inputs()'s distribution, wrong on " + ", ".join(failed) +
               ": the program assumes properties of its inputs")
    elif judged:
        s.passes["varied_inputs"] = f"{judged} varied trials: " + ", ".join(v.label for v in variations)
    else:
        s.note("no varied trial could be judged (the reference gives NaN or Inf on every variation)")


def _beyond_range(t: torch.Tensor, dtype: str) -> bool:
    """Whether finite values of ``t`` exceed the largest finite value of ``dtype`` (a float16 output
    cannot hold 1e5, whatever the program does)."""
    want = torch_dtype(dtype)
    if not (is_float(t) and want.is_floating_point) or torch.finfo(want).max >= torch.finfo(t.dtype).max:
        return False
    from .compare import max_finite_abs

    return max_finite_abs(t) > torch.finfo(want).max


def _collect(s: Session, extra: list[DynamicCheck], dynamic: bool) -> list[DynamicCheck]:
    """Every dynamic check once: failures first by name, then the passes and what each established."""
    out = [DynamicCheck("outputs_written", "fail" if "outputs_written" in s.failures else "pass",
                        s.failures.get("outputs_written", "every element of every output was written")),
           DynamicCheck("inputs_unchanged", "fail" if "inputs_unchanged" in s.failures else "pass",
                        s.failures.get("inputs_unchanged", "inputs bit-identical after every run"))]
    if not dynamic:
        return out
    names = ("no_output_reuse", "outputs_follow_inputs", "repeat_calls", "sensitivity", "varied_inputs")
    for name in names:
        if name in s.failures:
            out.append(DynamicCheck(name, "fail", s.failures[name]))
        elif name in s.passes:
            out.append(DynamicCheck(name, "pass", s.passes[name]))
    out += extra
    return out


__all__ = ["VARIED_TRIALS", "CorrectnessResult", "check_correctness"]
