"""Where a suite's problems run: one worker process per GPU, or Ray tasks, in the order that
finishes soonest.

* ``--gpus N`` starts N processes (``python -m stitchcuda.ship.workers worker``), the i-th with
  ``CUDA_VISIBLE_DEVICES`` set to the i-th visible GPU; each takes the next problem when it
  finishes one, so a slow problem holds one GPU only. A worker that dies or passes the per-problem
  time limit is replaced and its problem recorded as an error.
* With more than one worker the problems go out longest first (:func:`schedule`): by the seconds
  each took before on this machine (a history in the cache folder, ``bench/seconds.json``), else
  by a guess from its inputs' size, so that no long problem starts last while the other GPUs sit
  idle.
* ``--per-gpu N`` starts N workers on each GPU. One builds (capture, planning, nvcc: the CPU's
  work) while another verifies; whatever runs on the GPU holds it alone (``hostlock.gpu_alone``: a
  verification from its start to its end, the interpreter's model, a task check), so no timing or
  first-call tuning runs beside another worker's trials.
* ``--ray ADDRESS`` runs the same solver as Ray tasks of one GPU each instead (``pip install ray``).

Each finished problem's result line goes to the ``record`` callback of :mod:`.bench`, which alone
writes ``results.jsonl``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import selectors
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from .. import _rt as rt
from .. import hostlock
from ..device import has_gpu
from ..fsutil import atomic_write_text
from ..paths import cache_dir
from . import suite
from .suite import (BenchOptions, MissingExtra, SuiteError, SuiteProblem, one_line, resolve_solver, slug, solve,
                    utc_now)


def worker_main(argv: list[str]) -> int:
    """``python -m stitchcuda.ship.workers worker OPTIONS_JSON RESULTS_FOLDER``: read problems as
    JSON lines on stdin, write one result line per problem on the original stdout. Anything the
    solver prints goes to stderr (the worker's log)."""
    opts = BenchOptions(**{k: tuple(v) if k == "only" else v for k, v in json.loads(argv[0]).items()})
    folder = Path(argv[1])
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    suite._stage_out = lambda text: results.write(json.dumps({"stage": str(text)}) + "\n")
    solver = resolve_solver(opts)
    for line in sys.stdin:
        if not line.strip():
            continue
        p = SuiteProblem(**json.loads(line))
        print(f"[{utc_now()}] {p.id}", file=sys.stderr, flush=True)
        rec = solve(p, folder / "problems" / p.id, opts, solver)
        results.write(json.dumps(rec) + "\n")
    return 0


class _Worker:
    def __init__(self, index: int, gpu: str | None, opts: BenchOptions, folder: Path):
        self.index, self.gpu = index, gpu
        env = dict(os.environ)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        # every suite on this host takes turns: no compile while a worker times (hostlock.py); one
        # file in the cache, so that two suites run side by side also do
        env.setdefault(hostlock.ENV, str(cache_dir() / "host.lock"))
        # workers that share a GPU take turns on it: one lock file per GPU, in the cache
        env.pop(hostlock.GPU_ENV, None)
        if opts.per_gpu > 1:
            env[hostlock.GPU_ENV] = str(cache_dir() / f"gpu-{slug(gpu or 'default')}.lock")
        env["PYTHONUNBUFFERED"] = "1"
        (folder / "logs").mkdir(parents=True, exist_ok=True)
        self.log = open(folder / "logs" / f"worker-{index}.log", "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "stitchcuda.ship.workers", "worker",
                                      json.dumps(asdict(opts)), str(folder)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, bufsize=1)
        self.current: SuiteProblem | None = None
        self.started = 0.0
        self.pending = b""

    def give(self, p: SuiteProblem) -> None:
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
        return [str(i) for i in range(rt.device_count())] if has_gpu() else []
    except Exception:  # noqa: BLE001 - no runtime here: no GPUs
        return []


# ---------------------------------------------------------------------- the order problems go out in


def _history_file() -> Path:
    return cache_dir() / "bench" / "seconds.json"


def _history_key(p: SuiteProblem, opts: BenchOptions) -> str:
    return f"{opts.mode}:{opts.precision}:{hashlib.sha256(p.source.encode()).hexdigest()[:16]}"


def read_history() -> dict[str, float]:
    """Seconds each problem took the last time a suite ran it here (by mode, precision and the
    reference's source); empty when there is none or it cannot be read."""
    try:
        d = json.loads(_history_file().read_text())
        return {str(k): float(v) for k, v in d.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def remember_seconds(recs: list[dict], problems: dict[str, SuiteProblem], opts: BenchOptions) -> None:
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


def input_bytes(p: SuiteProblem) -> int | None:
    """The bytes of ``get_inputs()``'s tensors, drawn on PyTorch's meta device (shapes only,
    nothing allocated); None when the reference does not run that way."""
    try:
        import torch

        from ..reference import load_reference  # PyTorch

        ref = load_reference(p.source, name=slug(p.id))
        with torch.device("meta"):
            inputs = ref.get_inputs()
        return int(sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor)))
    except Exception:  # noqa: BLE001 - only a guess is lost
        return None


def schedule(pending: list[SuiteProblem], opts: BenchOptions, workers: int, history: dict[str, float] | None = None) -> list[SuiteProblem]:
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

    def length(p: SuiteProblem) -> tuple[int, float]:
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

        def seconds(p: SuiteProblem) -> float:
            k, v = length(p)
            return v if k else guess.get(p.level, mean) + len(p.source) * 1e-6
        return sorted(pending, key=seconds, reverse=True)
    return sorted(pending, key=lambda p: length(p)[1], reverse=True)


def run_local(pending: list[SuiteProblem], opts: BenchOptions, folder: Path, record: Callable[[dict], None],
              log: Callable[[str], None], stage: Callable[[str, str], None] = lambda pid, text: None) -> None:
    gpus = visible_gpus()
    n = opts.gpus if opts.gpus is not None else max(1, len(gpus))
    if n < 1:
        raise SuiteError("--gpus must be at least 1")
    if gpus and n > len(gpus):
        raise SuiteError(f"--gpus {n}: only {len(gpus)} GPU(s) visible ({','.join(gpus)})")
    cards = [gpus[i] if gpus else (str(i) if opts.gpus else None) for i in range(n)]
    slots = [g for g in cards for _ in range(opts.per_gpu)][:len(pending)]
    queue: list[SuiteProblem] = []
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

    where = [f"GPUs {','.join(dict.fromkeys(s for s in slots if s))}"] if any(slots) else []
    where += [f"{opts.per_gpu} on each, taking turns on it"] if opts.per_gpu > 1 else []
    log(f"{len(pending)} problem(s) on {len(slots)} worker(s)" + (f" ({'; '.join(where)})" if where else ""))
    try:
        fresh = [spawn(i) for i in range(len(slots))]     # their PyTorch starts while the order is worked out
        queue.extend(schedule(pending, opts, len(slots)))
        for w in fresh:
            feed(w)
        while workers:
            for key, _ in sel.select(timeout=5.0):
                i = key.data
                w = workers[i]
                # Read what is there, not a line: a worker writes several lines (stages, then its
                # result) and a buffered readline would keep the rest from the next select.
                data = os.read(w.proc.stdout.fileno(), 1 << 16)
                if not data:
                    code = w.proc.poll()
                    retire(i, f"the worker process died (exit status {code}); see logs/worker-{i}.log")
                    continue
                w.pending += data
                *lines, w.pending = w.pending.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    msg = json.loads(line)
                    if "stage" in msg and "id" not in msg:     # where its problem is, not a result
                        if w.current is not None:
                            stage(w.current.id, msg["stage"])
                        continue
                    record(msg)
                    w.current = None
                    if queue:
                        w.give(queue.pop(0))
                    else:
                        retire(i)
                        break
            now = time.monotonic()
            for i, w in list(workers.items()):
                if w.current is not None and now - w.started > opts.timeout_s:
                    retire(i, f"timeout: more than {opts.timeout_s:.0f} s")
    finally:
        for i in list(workers):
            workers.pop(i).stop(kill=True)


def _failure(p: SuiteProblem, opts: BenchOptions, why: str, gpu: str | None) -> dict:
    return {"id": p.id, "name": p.name, "level": p.level, "problem_id": p.problem_id, "precision": opts.precision,
            "mode": opts.mode, "status": "error" if "timeout" not in why else "timeout", "summary": why,
            "gpu": gpu or "", "finished": utc_now()}


def run_ray(pending: list[SuiteProblem], opts: BenchOptions, folder: Path, record: Callable[[dict], None],
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
                    record(_failure(p, opts, f"the Ray task failed: {one_line(e)}", None))
    finally:
        if opts.ray == "local":  # the instance this call started
            ray.shutdown()


def _ray_task(problem: dict, opts: dict, folder: str) -> dict:
    o = BenchOptions(**{k: tuple(v) if k == "only" else v for k, v in opts.items()})
    p = SuiteProblem(**problem)
    return solve(p, Path(folder) / "problems" / p.id, o)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "worker":
        return worker_main(argv[1:])
    argparse.ArgumentParser(prog="python -m stitchcuda.ship.workers",
                            description="the worker of `stitchcuda bench`; run `stitchcuda bench --help`").parse_args(argv)
    return 2


__all__ = ["worker_main", "visible_gpus", "read_history", "remember_seconds", "input_bytes", "schedule", "run_local",
           "run_ray"]

if __name__ == "__main__":
    sys.exit(main())
