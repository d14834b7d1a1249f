"""The loop: plan -> code -> verify -> route until the budget ends — ``stitchcuda optimize``.

``optimize(model_or_file, example_inputs=None, precision=..., budget="3m", llm=None, out=None)``
captures the reference once, evaluates the program ``build`` would make, and then routes
(:mod:`.route`): *repair* while nothing verifies, *replan* / *optimize* / *next* over the hottest
tasks once something does, *done* when the proposers (:mod:`.proposers`, :mod:`.llm`) have
nothing new or the budget (wall time, candidates, GPU time) is spent. It returns a
:class:`RunResult`: the best verified program folder, its Verifier report, and the history.

The reference is captured once (:func:`stitchcuda.pipeline.capture_problem`) and every candidate
is coded, written and compiled by the same tail as ``build``'s
(:meth:`stitchcuda.pipeline.CapturedProblem.write`). Modules, in the order a run meets them:
:mod:`.state` (the typed, JSON-serialisable State), :mod:`.judge` (the Verifier behind an
interface: tests script it), :mod:`.proposers` and :mod:`.llm`, :mod:`.route`, :mod:`.loop`,
:mod:`.runs` (the run folder, resume, list / show / diff), :mod:`.report`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..fsutil import atomic_write_text
from ..llm import LLM
from ..llm.server import check_llm_arg, check_llm_ready
from ..pipeline import capture_problem, need_torch
from ..precision import get as get_policy
from ..verifier.report.document import load_report
from .judge import CandidateJudge, CannotJudge, JudgeOptions, VerifierJudge
from .llm import LLMProposer
from .loop import Loop
from .proposers import PrecisionRepair, Proposal, Rewrites, Variants
from .report import render
from .runs import DEFAULT_ROOT, RunDir, RunError, new_run_id, resolve
from .state import Budget, Candidate, Judgement, Route, State, TaskVerdict, parse_seconds


@dataclass(frozen=True)
class RunResult:
    """What ``optimize`` hands back: ``best`` the best verified program folder (None when nothing
    verified), ``report`` its Verifier report (a VerificationReport, when the real Verifier judged
    it), ``history`` every candidate, ``state`` the whole run, ``run_dir`` its folder."""

    best: Path | None
    report: Any
    history: tuple[Candidate, ...]
    state: State
    run_dir: Path
    markdown: Path

    @property
    def ok(self) -> bool:
        return self.best is not None


def optimize(model_or_file: Any = None, example_inputs: Sequence[Any] | None = None, *, precision: str = "fp32",
             budget: str | float | Budget | None = None, iterations: int | None = None, gpu_budget: Any = None,
             llm: Any = None, out: str | os.PathLike | None = None, resume: bool = False, judge: CandidateJudge | None = None,
             proposers: Sequence[Any] | None = None, progress: Callable[[str], None] | None = None,
             compile: bool = True, final_verify: bool = True, name: str | None = None, seed: int = 0,
             arch: str | None = None, min_gain: float = 0.02) -> RunResult:
    """Run the loop on a reference (see the module docstring).

    ``model_or_file``: a KernelBench-format file, ``kernelbench:L:ID``, or an ``nn.Module`` with
    ``example_inputs``. ``budget``: ``"3m"``, seconds, or a :class:`Budget` (default 3 minutes);
    ``iterations`` / ``gpu_budget`` add limits on candidates and on judging time. ``llm``: a GGUF
    path, an ``stitchcuda.llm.LLM``, or None (``$STITCHCUDA_LLM`` is read by the CLI, not here).
    ``out``: the run folder (default ``runs/<name>-<precision>-<time>``); ``resume=True`` goes on
    with the run in ``out`` (its reference and precision; ``model_or_file`` may be None).
    ``judge``: the Verifier (default :class:`VerifierJudge`, needs a GPU); ``proposers``: default
    :func:`default_proposers`. ``compile=False`` writes candidate folders without compiling
    (tests with a scripted judge).
    """
    # The arguments first (ArgumentError), before the reference is captured or a folder written.
    asked_budget = _budget(budget, iterations, gpu_budget) if not resume or budget is not None else None
    if llm is not None and isinstance(llm, (str, os.PathLike)):
        llm = check_llm_ready(check_llm_arg(os.fspath(llm)))
    need_torch("optimize")
    if resume:
        if out is None:
            raise RunError("resume needs the run folder (out=)")
        run = resolve(out)
        asked = run.asked()
        state = run.load() if run.exists() else None
        reference = model_or_file if model_or_file is not None else asked["reference"]
        precision = asked["precision"]
        problem = capture_problem(reference, precision=precision, example_inputs=example_inputs,
                                  name=asked.get("name"), seed=asked.get("seed", 0), arch=arch)
        if state is None:
            state = State(asked["run_id"], asked["reference"], precision, Budget(**asked["budget"]),
                          min_gain=asked.get("min_gain", min_gain))
        elif state.finished:
            # A finished run given more budget goes on; one that ended for lack of it stays done.
            b = asked_budget if budget is not None else (_budget(None, iterations, gpu_budget) if iterations or gpu_budget
                                                         else state.budget)
            state = dataclasses.replace(state, budget=b, finished="")
    else:
        precision = get_policy(precision).name
        problem = capture_problem(model_or_file, precision=precision, example_inputs=example_inputs, name=name,
                                  seed=seed, arch=arch)
        b = asked_budget
        run_id = new_run_id(problem.name, precision)
        run = RunDir(Path(out) if out is not None else Path(DEFAULT_ROOT) / run_id)
        if run.exists() or (run.root / "run.json").is_file():
            raise RunError(f"{run.root} already holds a run: resume it (--resume) or choose another --out")
        ref_text = model_or_file if isinstance(model_or_file, (str, os.PathLike)) else f"{problem.name} (a module)"
        run.create({"run_id": run_id, "reference": str(ref_text), "name": name, "precision": precision, "seed": seed,
                    "budget": {"wall_s": b.wall_s, "iterations": b.iterations, "gpu_s": b.gpu_s},
                    "llm": str(llm) if llm is not None else None, "min_gain": min_gain,
                    "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")})
        if problem.source is not None:
            (run.root / "reference.py").write_text(problem.source, encoding="utf-8")
        state = State(run_id, str(ref_text), precision, b, min_gain=min_gain)
    client = _llm_client(llm, run)
    judge = judge if judge is not None else VerifierJudge(precision)
    props = list(proposers) if proposers is not None else default_proposers(client)
    loop = Loop(problem, judge, props, run, state, progress=progress, compile=compile, final_verify=final_verify)
    state = loop.run()
    md = run.root / "report.md"
    usage = client.usage() if client is not None else None
    atomic_write_text(md, render(state, usage))
    best = run.best_dir if state.best is not None and run.best_dir.is_dir() else None
    return RunResult(best, _best_report(state, best), state.candidates, state, run.root, md)


def default_proposers(llm: Any = None) -> list[Any]:
    """The deterministic proposers, and the LLM's when a model (or a replay cache) is given."""
    ps: list[Any] = [Rewrites(), PrecisionRepair(), Variants()]
    if llm is not None:
        ps.append(LLMProposer(llm))
    return ps


def _budget(budget: Any, iterations: int | None, gpu: Any) -> Budget:
    if isinstance(budget, Budget):
        return budget
    return Budget.parse(budget, iterations=iterations, gpu=gpu)


def _llm_client(llm: Any, run: RunDir) -> Any:
    if llm is None:
        return None
    if isinstance(llm, LLM):
        return llm
    return LLM(llm, cache=run.llm_dir, n_ctx=8192)


def _best_report(state: State, best: Path | None) -> Any:
    """The Verifier's report of the best: the final verification's, else the search's."""
    if best is None:
        return None
    paths = [state.final.report] if state.final is not None and state.final.report else []
    c = state.best_candidate
    if c is not None and c.judgement is not None and c.judgement.report:
        paths.append(c.judgement.report)
    for p in paths:
        if Path(p).is_file():
            try:
                return load_report(p)
            except Exception:  # noqa: BLE001 - an unreadable report is no report
                continue
    return None


__all__ = ["optimize", "RunResult", "Budget", "State", "Candidate", "Judgement", "Route", "TaskVerdict",
           "CandidateJudge", "JudgeOptions", "VerifierJudge", "CannotJudge", "Proposal", "PrecisionRepair", "Rewrites", "Variants",
           "default_proposers", "RunDir", "RunError", "resolve", "parse_seconds"]
