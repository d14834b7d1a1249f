"""``stitchcuda bench SUITE``: every problem of a suite built (or optimised) and verified, one
worker process per GPU, with a report.

* A suite is a ``.jsonl`` of KernelBench problems (``{"level", "problem_id", "name", "source"}``
  per line) or a folder of KernelBench-format ``.py`` references.
* The results folder holds ``suite.json`` (what was asked), ``results.jsonl`` (one JSON line per
  finished problem, appended by the parent alone as each finishes), ``problems/<id>/`` (the
  reference, the program folder and its verification report), ``logs/worker-<i>.log`` and the
  reports (:mod:`.report`). A rerun skips the problems already in ``results.jsonl``: an
  interrupted suite resumes where it stopped.
* Workers: ``--gpus N`` starts N processes (``python -m stitchcuda.ship.bench worker``), the i-th
  with ``CUDA_VISIBLE_DEVICES`` set to the i-th visible GPU; each takes the next problem when it
  finishes one, so a slow problem holds one GPU only. With more than one worker the problems go
  out longest first (:func:`schedule`): by the seconds each took before on this machine (a
  history in the cache folder, ``bench/seconds.json``), else by a guess from its inputs' size, so
  that no long problem starts last while the other GPUs sit idle. A worker that dies or passes
  the per-problem time limit is replaced and its problem recorded as an error. ``--ray ADDRESS`` runs the same
  solver as Ray tasks of one GPU each instead (``pip install ray``).
* A solver turns one problem into one result line. :class:`BuildSolver` (``--build``, the default)
  runs :func:`stitchcuda.pipeline.build_program` then the Verifier
  (:func:`stitchcuda.verifier.verification.verify_program`); :class:`OptimizeSolver` (``--optimize``)
  calls ``stitchcuda.optimize(reference, precision=, budget=, out=)`` and reads ``.best`` (a
  program folder or None) and ``.report`` (the Verifier's report of the best). Both take their
  functions as arguments, so tests inject fakes (``solver="module:attribute"``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import os
import re
import selectors
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..fsutil import atomic_write_text


class SuiteError(ValueError):
    """A suite or results folder that cannot be used; one line."""


class MissingExtra(RuntimeError):
    """An optional package a chosen feature needs (Ray, stitchcuda.optimize); one line with the fix."""


@dataclass(frozen=True)
class Problem:
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
    limit: int | None = None
    ray: str | None = None
    only: tuple[str, ...] = ()
    solver: str | None = None      # module:attribute of a solver (tests); default by mode
    trials: int = 5
    profile: bool = True           # the Verifier's CUPTI profile
    compile: bool = True           # the torch.compile baselines
    timeout_s: float = 3600.0      # per problem


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "problem"


def load_suite(path: str | os.PathLike) -> tuple[str, list[Problem]]:
    """(suite name, problems) of a .jsonl file or a folder of references."""
    p = Path(path)
    if not p.exists():
        raise SuiteError(f"{p}: no such suite (a .jsonl of problems or a folder of reference .py files)")
    problems: list[Problem] = []
    if p.is_dir():
        for f in sorted(p.glob("*.py")):
            problems.append(Problem(_slug(f.stem), f.stem, f.read_text(encoding="utf-8")))
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
            problems.append(Problem(_slug(f"L{level}_{name}"), name, source, level, pid))
    if not problems:
        raise SuiteError(f"{p}: no problems in it")
    ids = [q.id for q in problems]
    if len(set(ids)) != len(ids):
        raise SuiteError(f"{p}: two problems share an id ({next(i for i in ids if ids.count(i) > 1)})")
    return p.stem, problems


# ---------------------------------------------------------------------- solvers


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def record_from_report(problem: Problem, report: Any, manifest: Any = None, program: str | None = None) -> dict:
    """A result line from a VerificationReport (and the program's manifest, for FLOPs and bytes)."""
    v = report.result.verdict
    rec: dict[str, Any] = {"status": "passed" if report.result.ok else v.VERDICT, "verdict": v.VERDICT,
                           "summary": v.summary(), "device": report.device, "program": program}
    if getattr(v, "degenerate", ""):  # a pass that proves nothing: the reference's outputs ignore its inputs
        rec["degenerate"] = v.degenerate
    t = report.timings
    if t is not None:
        rec["ms"] = {"program": t.program.median_ms, **{k: getattr(t, k).median_ms for k in
                     ("eager_fp32", "eager_policy", "compile_fp32", "compile_policy") if getattr(t, k) is not None}}
    if manifest is not None:
        ops = manifest.reference_ops or manifest.tasks
        rec["flops"] = int(sum(o.flops for o in ops))
        rec["bytes"] = int(sum(o.bytes for o in ops))
    c = report.ceilings
    if c is not None:
        rec["ceilings"] = {"name": c.name, "bandwidth": c.bandwidth, "peak": c.peak(report.precision)}
    return rec


class BuildSolver:
    """``build_program`` then ``verify_program`` (both replaceable, for tests)."""

    def __init__(self, build: Callable | None = None, verify: Callable | None = None):
        self.build, self.verify = build, verify

    def __call__(self, problem: Problem, folder: Path, opts: BenchOptions) -> dict:
        from ..pipeline import build_program
        from ..verifier.verification import VerifyEnvironmentError, VerifyOptions, verify_program

        build = self.build or build_program
        verify = self.verify or verify_program
        ref = problem.write(folder)
        try:
            o = build(ref, precision=opts.precision, out=folder / "program", quiet=True)
        except Exception as e:  # noqa: BLE001 - a problem stitchcuda cannot build is a result, not the end
            unsupported = any(c.__name__ in ("UnsupportedOpError", "PlanError") for c in type(e).__mro__)
            return {"status": "unsupported" if unsupported else "error", "summary": _one_line(e)}
        if not o.ok:
            return {"status": "compile_error", "verdict": "compile_error", "summary": o.build.message}
        try:
            v = verify(o.directory, None, VerifyOptions(trials=opts.trials, profile=opts.profile,
                                                        compile=opts.compile, command="stitchcuda bench"))
        except VerifyEnvironmentError as e:
            return {"status": "not_verified", "summary": f"built; not verified: {_one_line(e)}",
                    "program": str(o.directory)}
        return record_from_report(problem, v.report, o.manifest, str(o.directory))


class OptimizeSolver:
    """``stitchcuda.optimize(reference, precision=, budget=, out=)`` -> ``.best``, ``.report``."""

    def __init__(self, optimize: Callable | None = None):
        self.optimize = optimize

    def __call__(self, problem: Problem, folder: Path, opts: BenchOptions) -> dict:
        fn = self.optimize
        if fn is None:
            import stitchcuda

            fn = getattr(stitchcuda, "optimize", None)
            if fn is None:
                raise MissingExtra("--optimize needs stitchcuda.optimize, which this install does not have; "
                                   "use --build")
        ref = problem.write(folder)
        res = fn(str(ref), precision=opts.precision, budget=opts.budget, out=str(folder / "run"))
        if res.best is None or res.report is None:
            return {"status": "failed", "summary": "no candidate verified within the budget"}
        from .. import manifest as mf

        manifest = mf.Manifest.load(res.best) if Path(res.best, mf.MANIFEST_FILE).is_file() else None
        return record_from_report(problem, res.report, manifest, str(res.best))


def _one_line(e: BaseException) -> str:
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


def solve(problem: Problem, folder: Path, opts: BenchOptions, solver: Callable | None = None) -> dict:
    """One result line: the solver's, with the problem's identity and timing; never raises."""
    t0 = time.monotonic()
    try:
        rec = (solver or resolve_solver(opts))(problem, folder, opts)
    except Exception as e:  # noqa: BLE001 - one problem's failure is a result
        from .errors import explain

        rec = {"status": "error", "summary": explain(e).message}
    return {"id": problem.id, "name": problem.name, "level": problem.level, "problem_id": problem.problem_id,
            "precision": opts.precision, "mode": opts.mode, **rec, "seconds": round(time.monotonic() - t0, 2),
            "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", ""), "host": os.uname().nodename, "finished": _now()}


# ---------------------------------------------------------------------- the worker process


def worker_main(argv: list[str]) -> int:
    """``python -m stitchcuda.ship.bench worker OPTIONS_JSON RESULTS_FOLDER``: read problems as
    JSON lines on stdin, write one result line per problem on the original stdout. Anything the
    solver prints goes to stderr (the worker's log)."""
    opts = BenchOptions(**{k: tuple(v) if k == "only" else v for k, v in json.loads(argv[0]).items()})
    folder = Path(argv[1])
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    solver = resolve_solver(opts)
    for line in sys.stdin:
        if not line.strip():
            continue
        p = Problem(**json.loads(line))
        print(f"[{_now()}] {p.id}", file=sys.stderr, flush=True)
        rec = solve(p, folder / "problems" / p.id, opts, solver)
        results.write(json.dumps(rec) + "\n")
    return 0


class _Worker:
    def __init__(self, index: int, gpu: str | None, opts: BenchOptions, folder: Path):
        self.index, self.gpu = index, gpu
        env = dict(os.environ)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        env["PYTHONUNBUFFERED"] = "1"
        (folder / "logs").mkdir(parents=True, exist_ok=True)
        self.log = open(folder / "logs" / f"worker-{index}.log", "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "stitchcuda.ship.bench", "worker",
                                      json.dumps(asdict(opts)), str(folder)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, bufsize=1)
        self.current: Problem | None = None
        self.started = 0.0

    def give(self, p: Problem) -> None:
        self.current, self.started = p, time.monotonic()
        self.proc.stdin.write(json.dumps(asdict(p)) + "\n")
        self.proc.stdin.flush()

    def stop(self, kill: bool = False) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        if kill:
            self.proc.kill()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and not g.strip().startswith("-")]
    try:
        from .. import has_gpu, rt

        return [str(i) for i in range(rt.device_count())] if has_gpu() else []
    except Exception:  # noqa: BLE001 - no runtime here: no GPUs
        return []


# ---------------------------------------------------------------------- the order problems go out in


def _history_file() -> Path:
    from ..paths import cache_dir

    return cache_dir() / "bench" / "seconds.json"


def _history_key(p: Problem, opts: BenchOptions) -> str:
    import hashlib

    return f"{opts.mode}:{opts.precision}:{hashlib.sha256(p.source.encode()).hexdigest()[:16]}"


def read_history() -> dict[str, float]:
    """Seconds each problem took the last time a suite ran it here (by mode, precision and the
    reference's source); empty when there is none or it cannot be read."""
    try:
        d = json.loads(_history_file().read_text())
        return {str(k): float(v) for k, v in d.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def remember_seconds(recs: list[dict], problems: dict[str, Problem], opts: BenchOptions) -> None:
    """Add finished problems' seconds to the history (never fatal: it only orders later runs)."""
    h = read_history()
    for r in recs:
        p = problems.get(r.get("id"))
        if p is not None and isinstance(r.get("seconds"), (int, float)) and r.get("status") not in ("timeout", "error"):
            h[_history_key(p, opts)] = float(r["seconds"])
    try:
        f = _history_file()
        f.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(f, json.dumps(h, indent=0, sort_keys=True) + "\n")
    except OSError:
        pass


def input_bytes(p: Problem) -> int | None:
    """The bytes of ``get_inputs()``'s tensors, drawn on PyTorch's meta device (shapes only,
    nothing allocated); None when the reference does not run that way."""
    try:
        import torch

        from ..reference import load_reference

        ref = load_reference(p.source, name=_slug(p.id))
        with torch.device("meta"):
            inputs = ref.get_inputs()
        return int(sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor)))
    except Exception:  # noqa: BLE001 - only a guess is lost
        return None


def schedule(pending: list[Problem], opts: BenchOptions, workers: int, history: dict[str, float] | None = None) -> list[Problem]:
    """The order problems go out in: the suite's order for one worker (the total does not depend
    on it); longest first for several (the classic longest-processing-time rule: the last problems
    to start are short, so the workers finish together). A problem's length is what it took the
    last time here, else a guess: larger inputs first (:func:`input_bytes`: each verification
    trial draws, copies and compares them), and where those are unknown a higher level, then a
    longer reference. When only some problems have a time, each of the others is given the mean
    time of the known problems of its level (of all known ones without), its longer source first."""
    if workers <= 1:
        return list(pending)
    history = read_history() if history is None else history

    sizes = {p.id: input_bytes(p) for p in pending if _history_key(p, opts) not in history}

    def length(p: Problem) -> tuple[int, float]:
        known = history.get(_history_key(p, opts))
        if known is not None:
            return (1, known)
        # a problem's time grows with its inputs (each trial draws, copies and compares them);
        # without them, a higher level, then a longer reference
        size = sizes.get(p.id)
        return (0, 1e15 + size if size is not None else (p.level or 0) * 1e6 + len(p.source))

    known = [p for p in pending if length(p)[0]]
    if known and len(known) < len(pending):
        # guesses go among the known by the known problems' mean per level (else the overall mean)
        by_level: dict[int | None, list[float]] = {}
        for p in known:
            by_level.setdefault(p.level, []).append(length(p)[1])
        mean = sum(length(p)[1] for p in known) / len(known)
        guess = {lv: sum(v) / len(v) for lv, v in by_level.items()}

        def seconds(p: Problem) -> float:
            k, v = length(p)
            return v if k else guess.get(p.level, mean) + len(p.source) * 1e-6
        return sorted(pending, key=seconds, reverse=True)
    return sorted(pending, key=lambda p: length(p)[1], reverse=True)


def _run_local(pending: list[Problem], opts: BenchOptions, folder: Path, record: Callable[[dict], None],
               log: Callable[[str], None]) -> None:
    gpus = visible_gpus()
    n = opts.gpus if opts.gpus is not None else max(1, len(gpus))
    if n < 1:
        raise SuiteError("--gpus must be at least 1")
    if gpus and n > len(gpus):
        raise SuiteError(f"--gpus {n}: only {len(gpus)} GPU(s) visible ({','.join(gpus)})")
    slots = [gpus[i] if gpus else (str(i) if opts.gpus else None) for i in range(min(n, len(pending)))]
    queue: list[Problem] = []
    sel = selectors.DefaultSelector()
    workers: dict[int, _Worker] = {}

    def spawn(i: int) -> _Worker:
        w = _Worker(i, slots[i], opts, folder)
        workers[i] = w
        sel.register(w.proc.stdout, selectors.EVENT_READ, i)
        return w

    def feed(w: _Worker) -> None:
        if queue:
            w.give(queue.pop(0))
        else:
            w.stop()

    def start(i: int) -> None:
        feed(spawn(i))

    def retire(i: int, failure: str | None = None) -> None:
        w = workers.pop(i)
        sel.unregister(w.proc.stdout)
        if failure and w.current is not None:
            record(_failure(w.current, opts, failure, w.gpu))
            w.stop(kill=True)
            if queue:
                start(i)
        else:
            w.stop()

    log(f"{len(pending)} problem(s) on {len(slots)} worker(s)" + (f" (GPUs {','.join(s for s in slots if s)})"
                                                                   if any(slots) else ""))
    try:
        fresh = [spawn(i) for i in range(len(slots))]     # their PyTorch starts while the order is worked out
        queue.extend(schedule(pending, opts, len(slots)))
        for w in fresh:
            feed(w)
        while workers:
            for key, _ in sel.select(timeout=5.0):
                i = key.data
                w = workers[i]
                line = w.proc.stdout.readline()
                if not line:
                    code = w.proc.poll()
                    retire(i, f"the worker process died (exit status {code}); see logs/worker-{i}.log")
                    continue
                record(json.loads(line))
                w.current = None
                if queue:
                    w.give(queue.pop(0))
                else:
                    retire(i)
            now = time.monotonic()
            for i, w in list(workers.items()):
                if w.current is not None and now - w.started > opts.timeout_s:
                    retire(i, f"timeout: more than {opts.timeout_s:.0f} s")
    finally:
        for i in list(workers):
            workers.pop(i).stop(kill=True)


def _failure(p: Problem, opts: BenchOptions, why: str, gpu: str | None) -> dict:
    return {"id": p.id, "name": p.name, "level": p.level, "problem_id": p.problem_id, "precision": opts.precision,
            "mode": opts.mode, "status": "error" if "timeout" not in why else "timeout", "summary": why,
            "gpu": gpu or "", "finished": _now()}


def _run_ray(pending: list[Problem], opts: BenchOptions, folder: Path, record: Callable[[dict], None],
             log: Callable[[str], None]) -> None:
    try:
        import ray
    except ImportError:
        raise MissingExtra("--ray needs Ray: pip install ray") from None
    ray.init(address=opts.ray, ignore_reinit_error=True, log_to_driver=False)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    remote = ray.remote(num_gpus=1 if gpus else 0)(_ray_task)
    log(f"{len(pending)} problem(s) on Ray at {opts.ray} ({gpus} GPU(s) in the cluster)")
    futures = {remote.remote(asdict(p), asdict(opts), str(folder)): p for p in schedule(pending, opts, max(gpus, 1))}
    try:
        while futures:
            done, _ = ray.wait(list(futures), num_returns=1)
            for f in done:
                p = futures.pop(f)
                try:
                    record(ray.get(f))
                except Exception as e:  # noqa: BLE001 - a lost task is that problem's result
                    record(_failure(p, opts, f"the Ray task failed: {_one_line(e)}", None))
    finally:
        if opts.ray == "local":  # the instance this call started
            ray.shutdown()


def _ray_task(problem: dict, opts: dict, folder: str) -> dict:
    o = BenchOptions(**{k: tuple(v) if k == "only" else v for k, v in opts.items()})
    p = Problem(**problem)
    return solve(p, Path(folder) / "problems" / p.id, o)


# ---------------------------------------------------------------------- the suite


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

    def rows(self) -> list[list[str]]:
        rows = [["problems (run now / already done)", f"{self.total} ({self.ran} / {self.skipped})"],
                ["correct", f"{self.correct} ({self.correct / self.total:.0%})" if self.total else "0"]]
        for k, g in self.geomeans.items():
            rows.append([f"geomean vs {k}", f"{g:.2f}x" if g else "-"])
            rows.append([f"fast_1 vs {k}", f"{self.fast_1.get(k, 0):.0%}"])
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


def run_suite(suite: str | os.PathLike, out: str | os.PathLike | None, opts: BenchOptions,
              log: Callable[[str], None] = print) -> Summary:
    """Run (or resume) a suite into ``out`` and write its reports; see the module docstring."""
    from .report import metrics, write_reports

    t0 = time.monotonic()
    name, problems = load_suite(suite)
    if opts.mode == "optimize" and not opts.solver:
        import stitchcuda

        if getattr(stitchcuda, "optimize", None) is None:
            raise MissingExtra("--optimize needs stitchcuda.optimize, which this install does not have; use --build")
    if opts.only:
        problems = [p for p in problems if any(o in p.id for o in opts.only)]
    if opts.limit is not None:
        problems = problems[:opts.limit]
    if not problems:
        raise SuiteError(f"{suite}: no problem matches --only/--limit")
    folder = Path(out) if out is not None else Path("bench") / f"{name}-{opts.precision}-{opts.mode}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SuiteError(f"--out {folder}: cannot create it ({e.strerror or e})") from None
    asked = {"suite": str(Path(suite).resolve()), "precision": opts.precision, "mode": opts.mode,
             "budget": opts.budget, "trials": opts.trials, "compile": opts.compile}
    meta_file = folder / "suite.json"
    if meta_file.is_file():
        before = json.loads(meta_file.read_text())
        differs = [k for k in ("precision", "mode", "budget", "trials", "compile") if before.get(k) != asked[k]]
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
        (_run_ray if opts.ray else _run_local)(pending, opts, folder, record, log)
    ids = {p.id for p in problems}
    results = [r for r in read_results(results_file) if r.get("id") in ids]
    remember_seconds(results, {p.id: p for p in problems}, opts)
    meta = {"suite": name, "precision": opts.precision, "mode": opts.mode, "date": _now()[:10],
            "device": next((r["device"] for r in results if r.get("device")), None),
            "command": "stitchcuda " + " ".join(sys.argv[1:]) if sys.argv[1:] else None}
    files = write_reports(results, folder, meta, opts.precision)
    m = metrics(results, opts.precision)
    return Summary(name, opts.precision, len(problems), len(pending), len(problems) - len(pending), m.correct,
                   files.markdown, files.html, results_file, time.monotonic() - t0,
                   {b.label: b.geomean for b in m.baselines}, {b.label: b.fast[1.0] for b in m.baselines},
                   files.notes)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "worker":
        return worker_main(argv[1:])
    argparse.ArgumentParser(prog="python -m stitchcuda.ship.bench",
                            description="the worker of `stitchcuda bench`; run `stitchcuda bench --help`").parse_args(argv)
    return 2


__all__ = ["Problem", "BenchOptions", "SuiteError", "MissingExtra", "load_suite", "BuildSolver", "OptimizeSolver",
           "record_from_report", "solve", "run_suite", "read_results", "Summary", "visible_gpus"]

if __name__ == "__main__":
    sys.exit(main())
