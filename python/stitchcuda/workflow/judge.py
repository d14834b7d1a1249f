"""The Verifier as the loop sees it: an injectable :class:`CandidateJudge`.

The loop asks two things: check one task body alone (``check_task``), and verify a whole
candidate program folder (``verify``). :class:`VerifierJudge` answers with the real ones
(:func:`stitchcuda.check.task.check_task` on the GPU, :func:`stitchcuda.verifier.verification.verify_program`
in its child processes); tests pass a scripted judge with the same two methods. A judge never
raises for a candidate's fault; it raises :class:`CannotJudge` when the machine cannot judge at
all (no GPU, no nvcc), which ends the run with that reason rather than recording a verdict
against anyone. The RL judge (:mod:`stitchcuda.rl.judge`) raises the same error for the same
reason.

Frugal by default: few trials and short timing loops per candidate, no torch.compile baselines,
no reference profile and no compute-sanitizer while searching; the final best is verified once
more with the baselines and the sanitizer (``final=True``), so its report has every ratio and
every check, and a best that fails there is set aside for the next (the loop's ``_final``). The
sanitizer was most of a search verification's time on a deep net (resnet50 at tf32 on an H200:
88.6 of 124.5 s), so the search spent its budget on it rather than on candidates.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol

from ..check.task import check_task
from ..code import Override
from ..verifier.report.profile import classify
from ..verifier.measure.timing import LoopSettings
from .state import Judgement, TaskTime, TaskVerdict


class CannotJudge(RuntimeError):
    """The machine cannot judge (no GPU, no nvcc, an unusable build cache): nobody's candidate or
    reply is at fault."""


class CandidateJudge(Protocol):
    """Judges the loop's candidates: one task body alone, and a whole program folder."""

    def check_task(self, problem: Any, plan: Any, task: str, override: Mapping[str, str]) -> TaskVerdict: ...

    def verify(self, problem: Any, program: Path, *, final: bool = False) -> Judgement: ...


@dataclass(frozen=True)
class JudgeOptions:
    trials: int = 3
    task_trials: int = 3
    varied: int = 2
    profile: bool = True
    timing_min_trials: int = 20
    timing_min_seconds: float = 0.1
    timing_max_seconds: float = 1.0
    profile_runs: int = 5
    sanitizer: bool = True  # compute-sanitizer in the final verification (the search never runs it)


class VerifierJudge:
    """The real Verifier (GPU). ``precision``: the policy every candidate is judged at (the run's)."""

    def __init__(self, precision: str, options: JudgeOptions = JudgeOptions()):
        self.precision = precision
        self.o = options

    def check_task(self, problem: Any, plan: Any, task: str, override: Mapping[str, str]) -> TaskVerdict:
        t0 = time.monotonic()
        r = check_task(plan, task, Override(override["source"], override.get("origin", "hand")), graph=problem.graph,
                       weights=problem.weights, device="auto", trials=self.o.task_trials, arch=problem.arch)
        return TaskVerdict(task, r.ok, r.stage, r.reason, r.ran, time.monotonic() - t0)

    def verify(self, problem: Any, program: Path, *, final: bool = False) -> Judgement:
        from ..verifier.verification import VerifyEnvironmentError, VerifyOptions, verify_program  # PyTorch

        o = self.o
        timing = LoopSettings() if final else LoopSettings(min_trials=o.timing_min_trials,
                                                           min_seconds=o.timing_min_seconds,
                                                           max_seconds=o.timing_max_seconds)
        opts = VerifyOptions(trials=5 if final else o.trials, varied=4 if final else o.varied, profile=o.profile,
                             compile=final, reference_profile=final, precision=self.precision, timing=timing,
                             profile_runs=20 if final else o.profile_runs, sanitizer=final and o.sanitizer,
                             command="stitchcuda optimize")
        t0 = time.monotonic()
        try:
            v = verify_program(program, None, opts)
        except VerifyEnvironmentError as e:
            raise CannotJudge(str(e)) from None
        return judgement_of(v.report, time.monotonic() - t0,
                            str(v.files.json) if v.files is not None else "")


def judgement_of(report: Any, seconds: float, path: str = "") -> Judgement:
    """A :class:`Judgement` from a VerificationReport."""
    res = report.result
    t = report.timings
    ms = t.program.median_ms if (t is not None and res.ok) else None
    base = tuple((k, getattr(t, k).median_ms) for k in ("eager_fp32", "eager_policy", "compile_fp32", "compile_policy")
                 if t is not None and getattr(t, k) is not None)
    tasks: list[TaskTime] = []
    prof = report.details.profile if report.details is not None else None
    if prof is not None:
        for tt in prof.tasks:
            _, _, eff = classify(tt.bytes, tt.flops, tt.per_run_ns, 1, report.ceilings, report.precision, True)
            tasks.append(TaskTime(tt.task, tt.per_run_ns / 1e3, eff))
    wrong = getattr(res.verdict, "output", "") if res.kind == "wrong_answer" else ""
    from ..verifier.run.session import POLICY_NOTE, policy_misses_too

    said = getattr(report.details, "correctness_notes", ()) if report.details is not None else ()
    # one note per failing output: where PyTorch misses on any of them, that one (the repair it asks
    # for is precision's), else the first
    at_policy = next((n for n in said if policy_misses_too(n)), next((n for n in said if POLICY_NOTE in n), "")) \
        if res.kind == "wrong_answer" else ""
    return Judgement(res.kind, res.verdict.summary(), ms, base, tuple(tasks), seconds, path, wrong,
                     reported_ratio(res.verdict) if res.kind == "wrong_answer" else None, at_policy)


def reported_ratio(v: Any) -> float | None:
    """A wrong answer's reported element (the worst violation): its error over the Verifier's bound
    ``atol + tol |expected|``; None without the numbers (a NaN, a non-finite expected value)."""
    from ..verifier.run.compare import bound

    e, g, tol = getattr(v, "expected", None), getattr(v, "got", None), getattr(v, "tolerance", 0.0)
    if e is None or g is None or not tol or not math.isfinite(e) or not math.isfinite(g):
        return None
    atol = v.atol if getattr(v, "atol", None) is not None else tol
    return abs(g - e) / bound(abs(e), tol, atol)


def verifier_values(problem: Any, plan: Any, device: str, seed: int = 0) -> tuple[dict[str, Any], list[Any]]:
    """Weights and inputs as the Verifier draws them for ``problem`` (its reference harness:
    parameters drawn away from their initial values, batch norms calibrated or parameters drawn
    again where the outputs would not depend on the inputs), by the names and in the order of
    ``plan``: what a model of the program's error must see, since the captured weights may not
    amplify as the judged ones do. Raises when the reference cannot be built here (no source)."""
    from ..verifier.run.harness import ReferenceHarness
    from ..verifier.run.reference import ReferenceSpec

    if not problem.source:
        raise ValueError("the problem has no reference source to draw from")
    manifest = problem.code(plan).manifest
    spec = ReferenceSpec(problem.name, problem.name, source=problem.source)
    h = ReferenceHarness(spec, manifest, device, weights_seed=seed)
    weights = {w.name: t for w, t in zip(manifest.weights, h.weights)}
    return weights, list(h.draw(seed ^ 0x5EED).program)


def estimated_tasks(plan: Any) -> tuple[TaskTime, ...]:
    """Per-task times from the plan's cost model (no profile): efficiency unknown, taken as 0.5."""
    return tuple(TaskTime(t.name, t.est_time_s * 1e6, 0.5, measured=False) for t in plan.tasks if t.phase == "run")


__all__ = ["CandidateJudge", "JudgeOptions", "VerifierJudge", "CannotJudge", "judgement_of", "estimated_tasks",
           "verifier_values", "reported_ratio"]
