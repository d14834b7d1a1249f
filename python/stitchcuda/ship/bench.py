"""``stitchcuda bench SUITE``: every problem of a suite built (or optimised) and verified, one
worker process per GPU, with a report.

* The suite and how one problem is solved (``--build``: ``build_program`` then the Verifier;
  ``--optimize``: ``stitchcuda.optimize``) are :mod:`.suite`; where the problems run (a worker
  process per GPU, longest first, or Ray tasks) is :mod:`.workers`; the report is :mod:`.report`.
* The results folder holds ``suite.json`` (what was asked), ``results.jsonl`` (one JSON line per
  finished problem, appended by the parent alone as each finishes), ``problems/<id>/`` (the
  reference, the program folder and its verification report), ``logs/worker-<i>.log`` and the
  reports. A rerun skips the problems already in ``results.jsonl``: an interrupted suite resumes
  where it stopped, and under ``--optimize`` a problem it stopped inside goes on with its loop's run
  (``problems/<id>/run``: the candidates judged and the budget spent are kept).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..fsutil import atomic_write_text
from .report import metrics, write_reports
from .suite import BenchOptions, SuiteError, SuiteProblem, load_suite, utc_now
from ..workflow.state import parse_seconds
from .workers import remember_seconds, run_local, run_ray, visible_gpus


@dataclass(frozen=True)
class Summary:
    suite: str
    precision: str
    total: int
    ran: int
    skipped: int
    correct: int
    markdown: Path
    html: Path
    results: Path
    seconds: float
    geomeans: dict[str, float | None] = field(default_factory=dict)
    fast_1: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    over_floor: float | None = None  # geometric mean of the correct programs' time over their roofline floor

    def rows(self) -> list[list[str]]:
        rows = [["problems (run now / already done)", f"{self.total} ({self.ran} / {self.skipped})"],
                ["correct", f"{self.correct} ({self.correct / self.total:.0%})" if self.total else "0"]]
        for k, g in self.geomeans.items():
            rows.append([f"geomean vs {k}", f"{g:.2f}x" if g else "-"])
            rows.append([f"fast_1 vs {k}", f"{self.fast_1.get(k, 0):.0%}"])
        if self.over_floor:
            rows.append(["time over the roofline floor (geomean)", f"{self.over_floor:.2f}x"])
        rows.append(["wall time", f"{self.seconds:.0f} s"])
        return rows

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: str(v) if isinstance(v, Path) else v for k, v in d.items()}


def read_results(path: Path) -> list[dict]:
    out = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a kill: that problem runs again
    return out


def _failed_in(problems: list[SuiteProblem], folder: Path, precision: str) -> list[SuiteProblem]:
    """Those of ``problems`` whose last result in ``folder`` (an earlier run's results folder, at the
    same precision) is not a pass; one it has no result for is not taken (it was not tried there)."""
    results = folder / "results.jsonl"
    if not results.is_file():
        raise SuiteError(f"--failed-in {folder}: no results.jsonl there (the folder an earlier bench --out wrote)")
    meta = folder / "suite.json"
    before = json.loads(meta.read_text()).get("precision") if meta.is_file() else None
    if before not in (None, precision):
        raise SuiteError(f"--failed-in {folder}: its results are at {before}, this run is at {precision}")
    last = {r.get("id"): r.get("status") for r in read_results(results)}
    return [p for p in problems if p.id in last and last[p.id] != "passed"]


def run_suite(suite: str | os.PathLike, out: str | os.PathLike | None, opts: BenchOptions,
              log: Callable[[str], None] = print,
              stage: Callable[[str, str], None] = lambda pid, text: None) -> Summary:
    """Run (or resume) a suite into ``out`` and write its reports; see the module docstring.
    ``log`` gets a line per problem done; ``stage(problem id, text)`` each stage a problem enters
    (build: capture, verify: correctness ..., optimize: candidate ...), from the local workers."""
    t0 = time.monotonic()
    if opts.gpus is not None and opts.gpus < 1:       # before anything is written
        raise SuiteError("--gpus must be at least 1")
    if opts.per_gpu < 1:
        raise SuiteError("--per-gpu must be at least 1")
    if opts.ray and opts.per_gpu != 1:
        raise SuiteError("--per-gpu puts several of this host's workers on each GPU; with --ray, Ray places "
                         "the tasks (one GPU each)")
    seen = visible_gpus()
    if opts.gpus is not None and not opts.ray and seen and opts.gpus > len(seen):
        raise SuiteError(f"--gpus {opts.gpus}: only {len(seen)} GPU(s) visible ({','.join(seen)})")
    if opts.budget is not None:
        opts = replace(opts, budget=parse_seconds(opts.budget))
    name, problems = load_suite(suite)
    if opts.only:
        problems = [p for p in problems if any(o in p.id for o in opts.only)]
    if opts.failed_in is not None:
        problems = _failed_in(problems, Path(opts.failed_in), opts.precision)
    if opts.limit is not None:
        problems = problems[:opts.limit]
    if not problems:
        raise SuiteError(f"{suite}: no problem matches --only/--failed-in/--limit")
    folder = Path(out) if out is not None else Path("bench") / f"{name}-{opts.precision}-{opts.mode}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SuiteError(f"--out {folder}: cannot create it ({e.strerror or e})") from None
    asked = {"suite": str(Path(suite).resolve()), "precision": opts.precision, "mode": opts.mode,
             "budget": opts.budget, "trials": opts.trials, "compile": opts.compile, "sanitizer": opts.sanitizer,
             "autotune": opts.autotune}
    meta_file = folder / "suite.json"
    if meta_file.is_file():
        before = json.loads(meta_file.read_text())
        differs = [k for k in ("precision", "mode", "budget", "trials", "compile") if before.get(k) != asked[k]]
        differs += ["autotune"] if bool(before.get("autotune")) != asked["autotune"] else []
        if differs:
            raise SuiteError(f"{folder} holds results made with other settings ({', '.join(f'{k}={before.get(k)}' for k in differs)}); "
                             "use another --out")
    else:
        atomic_write_text(meta_file, json.dumps(asked, indent=1) + "\n")
    results_file = folder / "results.jsonl"
    done = {r["id"] for r in read_results(results_file) if "id" in r}
    pending = [p for p in problems if p.id not in done]
    if done:
        log(f"resuming: {len(problems) - len(pending)} problem(s) already in {results_file}")
    count = [len(problems) - len(pending)]

    def record(rec: dict) -> None:
        with open(results_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())
        count[0] += 1
        sp = ""
        if rec.get("status") == "passed" and (rec.get("ms") or {}).get("eager_fp32"):
            sp = f" {rec['ms']['eager_fp32'] / rec['ms']['program']:.2f}x eager fp32"
        log(f"[{count[0]}/{len(problems)}] {rec['id']}: {rec.get('status')}{sp} "
            f"({rec.get('seconds', 0):.0f} s{', gpu ' + rec['gpu'] if rec.get('gpu') else ''})")

    if pending:
        if opts.ray:
            run_ray(pending, opts, folder, record, log)
        else:
            run_local(pending, opts, folder, record, log, stage)
    ids = {p.id for p in problems}
    results = [r for r in read_results(results_file) if r.get("id") in ids]
    remember_seconds(results, {p.id: p for p in problems}, opts)
    meta = {"suite": name, "precision": opts.precision, "mode": opts.mode, "date": utc_now()[:10],
            "device": next((r["device"] for r in results if r.get("device")), None),
            "command": "stitchcuda " + " ".join(sys.argv[1:]) if sys.argv[1:] else None}
    files = write_reports(results, folder, meta, opts.precision)
    m = metrics(results, opts.precision)
    return Summary(name, opts.precision, len(problems), len(pending), len(problems) - len(pending), m.correct,
                   files.markdown, files.html, results_file, time.monotonic() - t0,
                   {b.label: b.geomean for b in m.baselines}, {b.label: b.fast[1.0] for b in m.baselines},
                   files.notes, m.over_floor)


__all__ = ["BenchOptions", "run_suite", "read_results", "Summary"]
