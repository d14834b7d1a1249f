"""A suite and one problem of it: what ``stitchcuda bench`` runs, and how one problem becomes one
result line.

* A suite is a ``.jsonl`` of KernelBench problems (``{"level", "problem_id", "name", "source"}``
  per line) or a folder of KernelBench-format ``.py`` references (:func:`load_suite`), each a
  :class:`SuiteProblem`.
* A solver turns one problem into one result line. :class:`BuildSolver` (``--build``, the default)
  runs :func:`stitchcuda.pipeline.build_program` then the Verifier
  (:func:`stitchcuda.verifier.verification.verify_program`); :class:`OptimizeSolver` (``--optimize``)
  calls ``stitchcuda.optimize(reference, precision=, budget=, out=)`` and reads ``.best`` (a
  program folder or None) and ``.report`` (the Verifier's report of the best). Both take their
  functions as arguments, so tests inject fakes (``solver="module:attribute"``). :func:`solve`
  wraps a solver so that one problem's failure is a result, never the end of the suite.

Where the problems run is :mod:`.workers`; the suite as a whole, :mod:`.bench`.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import manifest as mf
from ..errors import ArgumentError, MachineError
from ..fsutil import atomic_write_text
from ..pipeline import build_program
from .errors import explain


class SuiteError(ArgumentError):
    """A suite or results folder that cannot be used; one line."""


class MissingExtra(MachineError):
    """An optional package a chosen feature needs (Ray, stitchcuda.optimize); one line with the fix."""


@dataclass(frozen=True)
class SuiteProblem:
    """One problem of a suite: ``id`` (unique in the suite, a folder name), its reference's name
    and source, and its KernelBench level and id when it came from a ``.jsonl``."""

    id: str
    name: str
    source: str
    level: int | None = None
    problem_id: int | None = None

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "reference.py"
        if not path.is_file() or path.read_text() != self.source:
            atomic_write_text(path, self.source)
        return path


@dataclass(frozen=True)
class BenchOptions:
    precision: str = "fp32"
    mode: str = "build"            # build | optimize
    budget: float | None = None    # optimize: per problem
    gpus: int | None = None        # None: every visible GPU (at least one worker)
    per_gpu: int = 1               # workers on each GPU, taking turns on it (hostlock.gpu_alone)
    limit: int | None = None
    ray: str | None = None
    only: tuple[str, ...] = ()
    failed_in: str | None = None   # only the problems that did not pass in this results folder
    solver: str | None = None      # module:attribute of a solver (tests); default by mode
    trials: int = 5
    profile: bool = True           # the Verifier's CUPTI profile
    compile: bool = True           # the torch.compile baselines
    autotune: bool = False         # also torch.compile(mode="max-autotune") at the policy (--baselines max-autotune)
    sanitizer: bool = True         # the Verifier's compute-sanitizer trial
    timeout_s: float = 3600.0      # per problem


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "problem"


def load_suite(path: str | os.PathLike) -> tuple[str, list[SuiteProblem]]:
    """(suite name, problems) of a .jsonl file or a folder of references."""
    p = Path(path)
    if not p.exists():
        raise SuiteError(f"{p}: no such suite (a .jsonl of problems or a folder of reference .py files)")
    problems: list[SuiteProblem] = []
    if p.is_dir():
        for f in sorted(p.glob("*.py")):
            problems.append(SuiteProblem(slug(f.stem), f.stem, f.read_text(encoding="utf-8")))
    else:
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                level, pid, name, source = int(row["level"]), int(row["problem_id"]), str(row["name"]), row["source"]
            except (ValueError, KeyError, TypeError) as e:
                raise SuiteError(f"{p}:{n}: not a problem line ({type(e).__name__}: {e}); each line is "
                                 '{"level", "problem_id", "name", "source"}') from None
            problems.append(SuiteProblem(slug(f"L{level}_{name}"), name, source, level, pid))
    if not problems:
        raise SuiteError(f"{p}: no problems in it")
    ids = [q.id for q in problems]
    if len(set(ids)) != len(ids):
        raise SuiteError(f"{p}: two problems share an id ({next(i for i in ids if ids.count(i) > 1)})")
    return p.stem, problems


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def record_from_report(problem: SuiteProblem, report: Any, manifest: Any = None, program: str | None = None) -> dict:
    """A result line from a VerificationReport (and the program's manifest, for FLOPs and bytes)."""
    v = report.result.verdict
    rec: dict[str, Any] = {"status": "passed" if report.result.ok else v.VERDICT, "verdict": v.VERDICT,
                           "summary": v.summary(), "device": report.device, "program": program}
    if getattr(v, "degenerate", ""):  # a pass that proves nothing: the reference's outputs ignore its inputs
        rec["degenerate"] = v.degenerate
    said = getattr(report.details, "correctness_notes", ()) if report.details is not None else ()
    if said and not report.result.ok:  # why it failed, beyond the first wrong element (PyTorch's own error at
        rec["notes"] = list(dict.fromkeys(said))[:NOTES_KEPT]  # the policy, inputs the harness redrew)
    t = report.timings
    if t is not None:
        from .report import BASELINES  # one list of the baselines a result records and a report shows

        rec["ms"] = {"program": t.program.median_ms, **{k: getattr(t, k).median_ms for k, _ in BASELINES
                                                        if getattr(t, k, None) is not None}}
    if manifest is not None:
        ops = manifest.reference_ops or manifest.tasks
        rec["flops"] = int(sum(o.flops for o in ops))
        rec["bytes"] = int(sum(o.bytes for o in ops))
        rec["io_bytes"] = manifest.io_bytes()  # the floor's bytes (report.floor_ms)
    c = report.ceilings or (_this_machine() if t is not None else None)
    if c is not None:
        rec["ceilings"] = {"name": c.name, "bandwidth": c.bandwidth, "peak": c.peak(report.precision)}
    return rec


_machine: list[Any] = []


def _this_machine() -> Any:
    """This GPU's measured ceilings (measured once and cached, see :mod:`stitchcuda.device`), so
    that a timed result carries the floor's bandwidth and rate when it was not profiled; None
    without a GPU or when they cannot be measured."""
    if not _machine:
        try:
            import torch

            from ..device import device_ceilings

            _machine.append(device_ceilings(torch.cuda.current_device()) if torch.cuda.is_available() else None)
        except Exception:  # noqa: BLE001 - a result without ceilings is still a result
            _machine.append(None)
    return _machine[0]


#: Where a worker tells the runner what stage its problem is in (set by the worker's main).
_stage_out: Callable[[str], None] = lambda text: None


def report_stage(text: str) -> None:
    """Tell the runner the stage of the current problem (a progress line on its terminal)."""
    _stage_out(text)


class BuildSolver:
    """``build_program`` then ``verify_program`` (both replaceable, for tests)."""

    def __init__(self, build: Callable | None = None, verify: Callable | None = None):
        self.build, self.verify = build, verify

    def __call__(self, problem: SuiteProblem, folder: Path, opts: BenchOptions) -> dict:
        from ..verifier.verification import VerifyEnvironmentError, VerifyOptions, verify_program  # PyTorch

        build = self.build or build_program
        verify = self.verify or verify_program
        ref = problem.write(folder)
        try:
            kw = {"progress": lambda s: report_stage(f"build: {s}")} if self.build is None else {}
            o = build(ref, precision=opts.precision, out=folder / "program", quiet=True, **kw)
        except Exception as e:  # noqa: BLE001 - a problem stitchcuda cannot build is a result, not the end
            unsupported = any(c.__name__ in ("UnsupportedOpError", "PlanError") for c in type(e).__mro__)
            return {"status": "unsupported" if unsupported else "error", "summary": one_line(e)}
        if not o.ok:
            return {"status": "compile_error", "verdict": "compile_error", "summary": o.build.message}
        try:
            v = verify(o.directory, None, VerifyOptions(trials=opts.trials, profile=opts.profile,
                                                        compile=opts.compile, autotune=opts.autotune,
                                                        sanitizer=opts.sanitizer,
                                                        command="stitchcuda bench",
                                                        progress=lambda s: report_stage(f"verify: {s}")))
        except VerifyEnvironmentError as e:
            return {"status": "not_verified", "summary": f"built; not verified: {one_line(e)}",
                    "program": str(o.directory)}
        return record_from_report(problem, v.report, o.manifest, str(o.directory))


class OptimizeSolver:
    """``stitchcuda.optimize(reference, precision=, budget=, out=)`` -> ``.best``, ``.report``."""

    def __init__(self, optimize: Callable | None = None):
        self.optimize = optimize

    def __call__(self, problem: SuiteProblem, folder: Path, opts: BenchOptions) -> dict:
        fn = self.optimize
        if fn is None:
            from ..workflow import optimize as fn  # the loop: only a suite run with --optimize loads it
        ref = problem.write(folder)
        kw: dict[str, Any] = {}
        if self.optimize is None:  # the real loop: its Verifier takes the suite's --no-sanitizer
            from ..workflow import JudgeOptions, VerifierJudge

            kw = {"progress": lambda s: report_stage(f"optimize: {s}"),
                  "judge": VerifierJudge(opts.precision, JudgeOptions(sanitizer=opts.sanitizer))}
        run = folder / "run"
        if (run / "run.json").is_file():  # a suite stopped inside this problem's loop: the loop goes on from
            kw["resume"] = True           # its state (candidates judged, budget spent), as `optimize --resume`
            report_stage("optimize: resuming the run an interrupted suite left")
        elif run.exists():  # a run folder without the record of what was asked (copied back in part):
            aside = _set_aside(run)  # nothing to resume from, nothing deleted either
            report_stage(f"optimize: {run} held a run without its run.json; moved to {aside.name}, starting again")
        res = fn(str(ref), precision=opts.precision, budget=opts.budget, out=str(run), **kw)
        if res.best is None or res.report is None:
            return {"status": "failed", "summary": _no_candidate(res.state)}
        manifest = mf.Manifest.load(res.best) if Path(res.best, mf.MANIFEST_FILE).is_file() else None
        rec = record_from_report(problem, res.report, manifest, str(res.best))
        repaired = _repaired(getattr(res, "state", None))
        if repaired:
            rec["repaired"] = repaired
        return rec


def _set_aside(run: Path) -> Path:
    """Rename ``run`` to the first free ``run.incomplete-N`` beside it."""
    n = 1
    while (aside := run.with_name(f"{run.name}.incomplete-{n}")).exists():
        n += 1
    run.rename(aside)
    return aside


def _repaired(state: Any) -> dict | None:
    """What the loop repaired, where ``build``'s program was a wrong answer and a later candidate
    verified: the first verdict, the candidate and who proposed it, the tasks it raised to fp32 (of
    how many suspects) where it raised precision, and the Verifier's note on PyTorch's own
    arithmetic at the policy on the same inputs — whether the policy itself could meet the
    tolerance, so whether a baseline allowed it is a fair bar."""
    if state is None:
        return None
    root, best = state.root_candidate, state.best_candidate
    if root is None or best is None or root is best or root.judgement is None or root.judgement.kind != "wrong_answer":
        return None
    raised = [t for t, _ in best.meta.get("precision_raised", ())]
    out = {"from": root.judgement.summary, "by": best.proposer, "candidate": best.id}
    if raised:
        out["raised"] = raised
        out["suspects"] = len(best.meta.get("precision_suspects", ()))
    if root.judgement.policy_note:
        out["policy_note"] = root.judgement.policy_note
    return out


#: Correctness notes a failed result keeps (the report's own file has every one).
NOTES_KEPT = 6


def _no_candidate(state: Any) -> str:
    """Why an optimisation run ended with nothing verified: the loop's last word and what its
    candidates were judged."""
    said = [f"{c.proposer}: {c.judgement.summary}" for c in state.candidates if c.judgement is not None]
    tried = f"{len(state.candidates)} candidate(s)" + (f" ({'; '.join(said[:3])})" if said else "")
    aside = getattr(state, "set_aside", ())
    if aside:
        finals = "; ".join(f"{cid}: {why}" for cid, why in aside)
        return f"no candidate passed its final verification ({finals}); {tried}"
    return f"no candidate verified: {state.finished or 'the budget ran out'}; {tried}"


def one_line(e: BaseException) -> str:
    missing = list(dict.fromkeys(u.op for u in getattr(e, "ops", None) or ()))  # UnsupportedOpError's operators
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return f"{type(e).__name__}: not supported yet: {', '.join(missing[:3])}{more}"
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def resolve_solver(opts: BenchOptions) -> Callable:
    if opts.solver:
        mod, _, attr = opts.solver.partition(":")
        obj = getattr(importlib.import_module(mod), attr)
        return obj() if isinstance(obj, type) else obj
    return OptimizeSolver() if opts.mode == "optimize" else BuildSolver()


def stage_name(text: str) -> str:
    """A stage as the report groups it: its progress line without counts in brackets
    (``verify: correctness trials and dynamic checks (3 trial(s))`` -> ``verify: correctness trials
    and dynamic checks``), at most 60 characters."""
    return re.sub(r"\s*\(.*$", "", text).strip()[:60] or text[:60]


def solve(problem: SuiteProblem, folder: Path, opts: BenchOptions, solver: Callable | None = None) -> dict:
    """One result line: the solver's, with the problem's identity and timing; never raises.
    ``stages``: the seconds spent in each stage the solver reported (:func:`report_stage`; time
    before the first is ``setup``), so that a suite's report can say where its time went."""
    global _stage_out
    t0 = time.monotonic()
    marks = [("setup", t0)]
    outer = _stage_out

    def mark(text: str) -> None:
        marks.append((stage_name(text), time.monotonic()))
        outer(text)

    _stage_out = mark
    try:
        rec = (solver or resolve_solver(opts))(problem, folder, opts)
    except Exception as e:  # noqa: BLE001 - one problem's failure is a result
        rec = {"status": "error", "summary": explain(e).message}
    finally:
        _stage_out = outer
    end = time.monotonic()
    stages: dict[str, float] = {}
    for (name, t), (_, t_next) in zip(marks, marks[1:] + [("", end)]):
        stages[name] = stages.get(name, 0.0) + t_next - t
    return {"id": problem.id, "name": problem.name, "level": problem.level, "problem_id": problem.problem_id,
            "precision": opts.precision, "mode": opts.mode, **rec, "seconds": round(end - t0, 2),
            "stages": {k: round(v, 1) for k, v in stages.items() if v >= 0.05},
            "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", ""), "host": os.uname().nodename, "finished": utc_now()}




__all__ = ["SuiteProblem", "BenchOptions", "SuiteError", "MissingExtra", "load_suite", "BuildSolver", "OptimizeSolver",
           "record_from_report", "resolve_solver", "solve", "stage_name", "one_line", "slug", "utc_now"]
