"""Correctness: a candidate program run against its PyTorch reference, trial by trial.

The procedure (MEASURING.md, "Correct first"), on a :class:`~.session.Runner` (the program on one
stream) and a :class:`~.session.ReferenceLike` (fresh inputs and the reference's outputs for them),
every random choice from the verification's :class:`~.inputs.Secret`, every buffer the program sees
between guard zones (:mod:`.guards`, checked after every call):

1. ``trials`` plain trials (default 5) on fresh inputs from the reference's ``get_inputs()``.
   Outputs are filled with a NaN poison before every run; after it every element must have been
   written and the inputs must be unchanged (a keyed hash of their bits). The first three trials
   run twice, the second time under launch pressure (a race shows as a difference beyond
   rounding). The precision claim is measured on the first, the second and the last (random
   states for a stateful program). The references of the trials say whether the outputs depend on
   the inputs at all (:mod:`.parameters`: a degenerate reference proves nothing).
2. ``varied`` trials (default 4) on inputs of other distributions (:mod:`.inputs`: scaled,
   offset, heavy-tailed, sparse, structured), kinds and parameters drawn per verification.
3. The dynamic anti-hacking sequences: repeated calls on the same buffers with new contents,
   sensitivity to single elements and to the edges of the inputs (:mod:`.dynamic`); stream order,
   a captured call (:mod:`.stream_checks`); tied inputs for index outputs (:mod:`.ties`); memory
   over many calls (:mod:`..measure.memory`); what the runtime was asked to compute and on which
   stream (:mod:`.precision_claim`, where the runner logs it); the weights, unchanged.

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

from ..measure.memory import MemoryReading, leak_check
from ..report.verdict import DynamicCheck, TrialResult
from .compare import errors, torch_dtype
from .copies import CopyBudget
from . import cost
from .cost import Clock, TimedReference, TimedRunner
from .guards import GuardedBuffers
from .inputs import Secret, choose_variations, vary
from .parameters import independent_of_inputs
from .precision_claim import PrecisionEvidence, library_evidence, math_summary
from .session import LastTrial, ReferenceLike, Runner, Session, all_finite, is_float, one_determinism

#: Default number of varied-distribution trials.
VARIED_TRIALS = 4
#: Plain trials run twice (the second under launch pressure) for the determinism check.
TWICE = 3


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
    degenerate: str = ""  # why the reference's outputs prove nothing (they do not depend on its inputs)
    library: str = ""  # the library's arithmetic as the runner logged it ("st_gemm: tf32 x12")
    costs: tuple[tuple[str, float], ...] = ()  # seconds by kind of work (:mod:`.cost`), largest first

    @property
    def passed(self) -> bool:
        return (all(t.passed for t in self.trials) and not any(c.status == "fail" for c in self.checks)
                and not self.inconclusive)


# ------------------------------------------------------------------ the procedure


def check_correctness(runner: Runner, reference: ReferenceLike, *, precision: str = "fp32", trials: int = 5,
                      seed: int = 0, varied: int = VARIED_TRIALS, dynamic: bool = True,
                      budget: CopyBudget | None = None, buffers: GuardedBuffers | None = None,
                      weights: list[torch.Tensor] | tuple[torch.Tensor, ...] = (), leak: bool = True,
                      degenerate: str = "") -> CorrectnessResult:
    """Run the trials and the dynamic checks (module docstring) at ``precision``'s tolerance, the
    Verifier's own copies placed by ``budget`` (default: from the device's free memory), the
    program's buffers made by ``buffers`` (default: guarded PyTorch memory), ``weights`` (what the
    program's create() got) checked unchanged. Raises only on a broken reference
    (ReferenceMismatch: outputs that do not match the manifest); exceptions from the program
    propagate."""
    if trials < 1:
        raise ValueError("check_correctness: trials must be >= 1")
    t0 = time.monotonic()
    clock = Clock(torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None))
    runner, reference = TimedRunner(runner, clock), TimedReference(reference, clock)
    secret = Secret(seed)
    s = Session(runner, reference, precision, secret, budget, buffers, weights)
    extra: list[DynamicCheck] = []
    twice: list[DynamicCheck] = []
    evidence = PrecisionEvidence(s)
    measured = {0} if s.large else {0, min(1, trials - 1), trials - 1}
    twice_in = 1 if s.large else TWICE
    refs: list[list[torch.Tensor]] = []  # the first two trials' references, for degeneracy
    with runner.context(), torch.no_grad():
        last: LastTrial | None = None
        for k in range(trials):
            d = x = y = j = None  # noqa: F841 - the previous trial's tensors go before the next are drawn
            d = reference.draw(secret.seed_for(f"trial{k}"))
            x = s.own_draw(d)
            y = s.new_outputs()
            s.run(x, y, fill=f"poison{k % 2}", what=f"trial {k}")
            if dynamic and k < twice_in:
                y2 = s.new_outputs()
                s.run(x, y2, fill="poison1", what=f"trial {k}, again under launch pressure", pressure=True)
                twice.append(clock.timed(cost.DETERMINISM, s.determinism, y, y2,
                                         f"trial {k}, the second under launch pressure"))
                del y2
            j = clock.timed(cost.JUDGING, s.judge, "", y, d, x)
            s.plain_nonfinite |= any(is_float(r) and not all_finite(r) for r in j.ref)
            if k < 2 and s.budget.on_device(sum(r.numel() * r.element_size() for r in j.ref)):
                refs.append([r.clone() for r in j.ref])
            if dynamic and k in measured and evidence.wanted():
                clock.timed(cost.CLAIM, evidence.add, d, x, y, j.ref, j.trial.passed)
            if dynamic and k == trials - 1:
                last = LastTrial(d, s.stash("sensitivity's starting outputs", y))
        d = x = y = j = None  # noqa: F841 - nothing of the plain trials stays on the device
        # judged on the first two trials at the policy's tolerance where both could be kept; else the
        # reference side's judgment (``degenerate``: ReferenceHarness's, at tf32's) stands; either way
        # the varied trials may still clear it
        s.degenerate = independent_of_inputs(refs, s.tol, lambda a, b, tol: errors(a, b, tol).passed) \
            if len(refs) >= 2 else degenerate
        s.first_refs = refs[0] if s.degenerate and refs else None  # the varied trials may still move them
        refs = []
        if twice:
            extra.append(one_determinism(s, twice))
        if dynamic:
            extra.append(evidence.result())
        clock.timed(cost.WEIGHTS, s.check_weights, "after the plain trials")
        s.plain_ok = all(t.passed for t in s.trials) and not s.failures
        if varied > 0:
            clock.timed(cost.VARIED, _varied_trials, s, varied, s.plain_ok)
        s.first_refs = None
        if dynamic and last is not None:
            extra += clock.timed(cost.DYNAMIC, _dynamic_checks, s, last)
            if leak:
                extra += [c for c in (_leak(s),) if c is not None]
        clock.timed(cost.WEIGHTS, s.check_weights, "after the dynamic checks")
    library = _library_checks(s, extra)
    for line in s.budget.notes:
        s.note(line)
    if s.degenerate:
        s.note(f"degenerate reference: {s.degenerate}")
    checks = _collect(s, extra, dynamic)
    return CorrectnessResult(tuple(s.trials), tuple(checks), s.tol, tuple(s.notes), tuple(s.warnings),
                             time.monotonic() - t0, s.calls, s.inconclusive, s.degenerate, library, clock.parts())


def _dynamic_checks(s: Session, last: LastTrial) -> list[DynamicCheck]:
    """The dynamic checks on the last plain trial, then ties and stream capture where they apply."""
    from . import dynamic as dyn
    from .stream_checks import stream_capture
    from .ties import ties

    return dyn.dynamic_checks(s, last) + [c for c in (ties(s), stream_capture(s)) if c is not None]


def _leak(s: Session) -> DynamicCheck | None:
    """The ``memory_leak`` check, where the runner can read its memory (:mod:`..measure.memory`)."""
    runner = s.runner
    if not hasattr(runner, "memory"):
        return None
    d = s.ref.draw(s.secret.seed_for("leak"))
    x = s.own_draw(d)
    y = s.new_outputs()

    def calls(k: int) -> None:
        if hasattr(runner, "repeat"):
            runner.repeat(x, y, k)
        else:
            for _ in range(k):
                runner.run(x, y)
            runner.sync()
        s.calls += k

    def read() -> MemoryReading:
        return runner.memory()

    check = leak_check(calls, read)
    s.check_guards(x, y, "repeated calls for the memory check")
    return check


def _library_checks(s: Session, extra: list[DynamicCheck]) -> str:
    """What the runner logged of the program's runtime calls (:mod:`.precision_claim`): calls below
    the claimed policy fail the precision claim, calls on another stream ``runtime_stream``. Returns
    the library's arithmetic, for the report."""
    from .stream_checks import runtime_stream

    if not hasattr(s.runner, "library_calls"):
        return ""
    log = s.runner.library_calls()
    calls = log.get("calls", [])
    below = library_evidence(calls, s.policy)
    if below:
        extra[:] = [c for c in extra if c.name != "precision_claim"]
        extra.append(DynamicCheck("precision_claim", "fail", below))
    foreign = runtime_stream(log, "during the correctness trials")
    extra.append(foreign or DynamicCheck("runtime_stream", "pass", "every runtime call during a run was on the run's "
                                                                   "stream"))
    return math_summary(calls)


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
        x = s.own_draw(d)
        y = s.new_outputs()
        s.run(x, y, fill="poison0", what=f"varied trial ({v.label})")
        r = s.reference(d, x)
        if not s.plain_nonfinite and any(is_float(t) and not all_finite(t) for t in r):
            s.note(f"varied trial ({v.label}) skipped: the reference itself gives NaN or Inf on these inputs")
            continue
        if any(_beyond_range(t, spec.dtype) for t, spec in zip(r, s.out_specs)):
            s.note(f"varied trial ({v.label}) skipped: the reference's outputs exceed what the program's output dtype "
                   "can hold")
            continue
        if s.degenerate and s.first_refs is not None and \
                not all(errors(a, b, s.tol).passed for a, b in zip(r, s.first_refs) if is_float(a)):
            s.degenerate = ""  # outputs that move with the inputs once these leave get_inputs()'s distribution
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
                        s.failures.get("inputs_unchanged", "inputs bit-identical after every run")),
           DynamicCheck("memory_bounds", "fail" if "memory_bounds" in s.failures else "pass",
                        s.failures.get("memory_bounds", "every guard zone intact after every call")),
           DynamicCheck("weights_unchanged", "fail" if "weights_unchanged" in s.failures else "pass",
                        s.failures.get("weights_unchanged", "weights bit-identical after every phase"
                                       if s.weights else "no weights to check"))]
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
