"""Judging replies for the rubric: cheap checks here, everything that compiles or runs in a child.

For each (example, reply) :class:`RewardJudge` gives an :class:`~.reward.Outcome`:

1. **parse** (here): a body reply must hold one fenced block defining the task's function
   (:func:`stitchcuda.llm.extract_code`), a decision reply must parse under the request's names
   (:func:`stitchcuda.llm.parse_constraints`). A reply that does not stops here: no compile.
2. **cache** (here): by example and body (or decision) hash, so the same body in a group, or
   again at a later step, is judged once.
3. **contract and static rules** (here; text only, nothing of the reply runs): the Coder puts
   the body in place of the template's (or the planner plans under the decision), and the
   Verifier's static rules read the whole program. A refusal stops here.
4. **build, run, time** (in a child process): ``python -m stitchcuda.rl.judge {channel}``, started
   through the Verifier's own machinery (:func:`stitchcuda.verifier.run.child.run_child`: clean
   environment, empty working folder, job on stdin, results over a pipe, per-phase time limits,
   a crash or a hang is a value). A body goes through ``check_task`` (build; on a GPU, run against
   the plan interpreter, fresh inputs, outputs poisoned, inputs checked) and, when correct, is
   timed against the template's body for the same task (the matched-precision baseline of a
   task); with ``level="program"`` the whole program with the body in place is then verified by
   the Verifier (static and sandbox rules, dynamic checks, timing against PyTorch at the policy).
   A decision is planned; on a GPU the program it makes is built and verified (its speed: the
   Verifier's timing against PyTorch at the policy); without one, the plan is interpreted against
   the reference in float64 on the CPU (small problems only), and its speed is the cost model's
   estimate against the plan without the decision.

Replies are judged in parallel (``workers`` children at once). The machine's own failures (no
nvcc, an unusable cache) raise :class:`stitchcuda.workflow.judge.CannotJudge`, as the loop's judge
does; they are never a reward.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes  # loaded before threads fork children: their pre-exec hook imports it
import hashlib
import json
import math
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import build as _build
from ..device import has_gpu
from ..check.task import _harness, check_plan_semantics, check_task
from ..code import CodeError, Override, code, contract
from ..llm import CodeBlock, DecisionFailure, DecisionSpec, extract_code, parse_constraints
from ..pipeline import capture_problem
from ..plan import ConstraintError, Constraints, PlanError
from ..precision import get as get_policy
from ..verifier.run.child import CHANNEL, Channel, Limits, clean_env, run_child
from ..verifier.static import check_source
from ..verifier.measure.timing import LoopSettings
from ..workflow.judge import CannotJudge
from .dataset import Example, ReferenceEntry, ReferenceGraph, capture
from .reward import Outcome, outcome_of_task_check, outcome_of_verification

#: A problem whose tensors (inputs, weights, node outputs) hold more elements than this is not
#: interpreted on the CPU to judge a decision (float64 interpretation is minutes past it).
CPU_INTERPRET_MAX_ELEMENTS = 20_000_000


@dataclass(frozen=True)
class JudgeSettings:
    """``device``: auto (a GPU when there is one), cpu (stop after the build), cuda; ``level``:
    task (check_task and task timing) or program (then the whole-program Verifier); ``workers``:
    children at once; ``trials``: check_task trials; ``time``: time correct bodies."""

    device: str = "auto"
    level: str = "task"
    workers: int = 2
    trials: int = 3
    time: bool = True
    arch: str | None = None
    child_limit_s: float = 600.0


class RewardJudge:
    """Judges replies to examples whose references are in ``references`` (id -> entry)."""

    def __init__(self, references: Mapping[str, ReferenceEntry], settings: JudgeSettings = JudgeSettings(),
                 cache_file: str | os.PathLike | None = None):
        self.refs = dict(references)
        self.s = settings
        self._captured: dict[str, ReferenceGraph] = {}
        self._plans: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        self._text_lock = threading.Lock()
        self.cache: dict[str, dict] = {}
        self.cache_file = Path(cache_file) if cache_file is not None else None
        if self.cache_file is not None and self.cache_file.is_file():
            for ln in self.cache_file.read_text(encoding="utf-8").splitlines():
                try:
                    d = json.loads(ln)
                    self.cache[d["key"]] = d["outcome"]
                except (ValueError, KeyError):
                    continue
        self.stats = {"judged": 0, "cached": 0, "children": 0}

    # ------------------------------------------------------------------ the parent's part

    def judge_many(self, items: Sequence[tuple[Example, str]]) -> list[Outcome]:
        """Outcomes of (example, reply) pairs, in order; children run ``workers`` at once."""
        if self.s.workers <= 1 or len(items) <= 1:
            return [self.judge(e, r) for e, r in items]
        with cf.ThreadPoolExecutor(max_workers=self.s.workers) as pool:
            return list(pool.map(lambda er: self.judge(*er), items))

    def judge(self, ex: Example, reply: str) -> Outcome:
        t0 = time.monotonic()
        job = self._prepare(ex, reply)
        if isinstance(job, Outcome):
            return job
        key = job["key"]
        with self._lock:
            hit = self.cache.get(key)
            self.stats["judged"] += 1
        if hit is not None:
            with self._lock:
                self.stats["cached"] += 1
            return Outcome.from_dict({**hit, "cached": True})
        out = self._child(job)
        out = Outcome.from_dict({**out.to_dict(), "seconds": round(time.monotonic() - t0, 3)})
        self._remember(key, out)
        return out

    def _prepare(self, ex: Example, reply: str) -> Outcome | dict:
        """The cheap early exits, or the child's job."""
        if ex.kind == "body":
            got = extract_code(reply, ex.function)
            if not isinstance(got, CodeBlock):
                return Outcome("body", "format", detail=str(got), format_reason=got.reason)
            payload = got.code
        else:
            d = parse_constraints(reply, DecisionSpec.from_json(ex.spec))
            if isinstance(d, DecisionFailure):
                return Outcome("plan", "format", detail=str(d), format_reason=d.reason)
            payload = json.dumps(d, sort_keys=True)
        key = hashlib.sha256(json.dumps([ex.id, ex.kind, payload, self.s.level, self.s.device, self.s.time])
                             .encode()).hexdigest()[:24]
        with self._lock:
            hit = self.cache.get(key)
        if hit is not None:
            return {"key": key}
        with self._text_lock:    # torch.export and the planner are not thread-safe; this part is cheap
            early = self._text_checks(ex, payload)
        if early is not None:
            self._remember(key, early)
            return early
        entry = self.refs[ex.reference]
        return {"key": key, "kind": ex.kind, "name": entry.name, "source": entry.source, "precision": ex.precision,
                "constraints": ex.constraints, "task": ex.task, "payload": payload, "device": self.s.device,
                "level": self.s.level, "trials": self.s.trials, "time": self.s.time, "arch": self.s.arch}

    def _text_checks(self, ex: Example, payload: str) -> Outcome | None:
        """The Coder / planner and the static rules, on text alone."""
        cap = self._capture(ex.reference)
        if ex.kind == "plan":
            try:
                merged = Constraints.from_dict(ex.constraints or {}).merge(Constraints.from_dict(json.loads(payload)))
                cap.plan(ex.precision, merged.to_dict())
            except (ConstraintError, PlanError, ValueError, KeyError) as e:
                return Outcome("plan", "contract", detail=f"the planner refuses it: {e}"[:500])
            return None
        plan = self._plan(cap, ex.precision, ex.constraints)
        try:
            prog = code(plan, cap.graph, None, overrides={ex.task: Override(payload, "llm")})
        except CodeError as e:
            return Outcome("body", "contract", detail=str(e)[:500])
        findings = check_source(prog.program_cu, manifest=prog.manifest)
        bad = [f for f in findings if f.severity == "reject"]
        if bad:
            return Outcome("body", "static", detail="; ".join(f"{f.rule}: {f.message}" for f in bad[:3])[:500],
                           findings=tuple((f.rule, f.severity) for f in findings))
        return None

    def _capture(self, ref_id: str) -> ReferenceGraph:
        with self._lock:
            cap = self._captured.get(ref_id)
        if cap is None:
            cap = capture(self.refs[ref_id])
            with self._lock:
                self._captured[ref_id] = cap
        return cap

    def _plan(self, cap: ReferenceGraph, precision: str, constraints: dict) -> Any:
        k = (cap.entry.id, precision, json.dumps(constraints or {}, sort_keys=True))
        with self._lock:
            p = self._plans.get(k)
        if p is None:
            p = cap.plan(precision, constraints)
            with self._lock:
                self._plans[k] = p
        return p

    def _remember(self, key: str, out: Outcome) -> None:
        d = {**out.to_dict(), "cached": False}
        with self._lock:
            self.cache[key] = d
            if self.cache_file is not None:
                self.cache_file.parent.mkdir(parents=True, exist_ok=True)
                with self.cache_file.open("a", encoding="utf-8") as f:
                    f.write(json.dumps({"key": key, "outcome": d}) + "\n")

    def _child(self, job: dict) -> Outcome:
        token = secrets.token_hex(8)
        limit = self.s.child_limit_s
        limits = Limits({"setup": 180.0, "build": limit, "run": 180.0, "time": 180.0, "verify": limit},
                        default=limit, total=2 * limit + 300.0)
        with self._lock:
            self.stats["children"] += 1
        got = run_child([sys.executable, "-m", "stitchcuda.rl.judge", CHANNEL], stdin=json.dumps({**job, "token": token}),
                        limits=limits, env=clean_env(), token=token)
        res = got.result or {}
        if res.get("environment"):
            raise CannotJudge(res["environment"])
        if got.ok and isinstance(res.get("outcome"), dict):
            return Outcome.from_dict(res["outcome"])
        # the child died or hung: the reply's fault only once it was running the reply's code
        if got.status == "timeout":
            phase = got.timeout.stage if got.timeout else got.phase
            if phase in ("run", "time", "verify"):
                return Outcome(job["kind"], "run", detail=f"timeout in {phase}", compiled=True, ran=True, timeout=True,
                               correct=False)
            if phase == "build":
                return Outcome(job["kind"], "build", detail="the build timed out", compiled=False)
        if got.phase in ("run", "time", "verify") and got.crash is not None:
            return Outcome(job["kind"], "run", detail=got.crash.summary()[:500], compiled=True, ran=True,
                           crash=got.crash.kind, correct=False)
        raise CannotJudge(f"the judging child failed in {got.phase}: "
                          f"{got.crash.summary() if got.crash else got.status}: {got.log_tail[-400:]}")


# ---------------------------------------------------------------------------- the child's part


def _child_main(fd: int) -> int:
    job = json.loads(sys.stdin.read())
    ch = Channel(fd, job["token"])
    try:
        ch.send(phase="setup")
        entry = ReferenceEntry.of(job["name"], "job", job["source"])
        cap = capture(entry)
        out = _judge_body(cap, job, ch) if job["kind"] == "body" else _judge_plan(cap, job, ch)
        ch.send(result={"outcome": out.to_dict()})
    except CannotJudge as e:
        ch.send(result={"environment": str(e)})
    os._exit(0)


def _judge_body(cap: ReferenceGraph, job: dict, ch: Any) -> Outcome:
    plan = cap.plan(job["precision"], job["constraints"])
    body = Override(job["payload"], "llm")
    ch.send(phase="build")
    # built first without running, so that a body that hangs the device is a timeout in "run",
    # not in "build"; the second call finds the library in the build cache
    r = check_task(plan, job["task"], body, graph=cap.graph, weights=None, device="cpu", arch=job.get("arch"))
    if r.stage == "build" and r.reason.startswith("could not build"):
        raise CannotJudge(r.reason)
    if r.stage == "build" and "not run" in r.reason and job["device"] != "cpu" and \
            (job["device"] == "cuda" or has_gpu()):
        ch.send(phase="run")
        r = check_task(plan, job["task"], body, graph=cap.graph, weights=None, device="cuda",
                       trials=int(job["trials"]), arch=job.get("arch"))
    speedup, basis = None, ""
    if r.ok and r.ran and job.get("time", True):
        ch.send(phase="time")
        speedup, basis = _time_against_template(plan, cap.graph, job["task"], job["payload"], job.get("arch")), \
            "the template's body for this task"
    out = outcome_of_task_check("body", r, speedup=speedup, basis=basis)
    if job["level"] == "program" and out.correct:
        ch.send(phase="verify")
        out = _verify_program(cap, job, {job["task"]: job["payload"]}, job["constraints"]) or out
    return out


def _judge_plan(cap: ReferenceGraph, job: dict, ch: Any) -> Outcome:
    merged = Constraints.from_dict(job["constraints"] or {}).merge(Constraints.from_dict(json.loads(job["payload"])))
    base = cap.plan(job["precision"], job["constraints"])
    plan = cap.plan(job["precision"], merged.to_dict())
    est = base.est_time_s / plan.est_time_s if plan.est_time_s > 0 else None
    if job["device"] != "cpu" and has_gpu():     # a plan's only measure on a GPU is its program
        ch.send(phase="verify")
        got = _verify_program(cap, job, {}, merged.to_dict())
        if got is not None:
            return got
    ch.send(phase="run")
    if _elements(cap.graph) > CPU_INTERPRET_MAX_ELEMENTS:
        return Outcome("plan", "done", detail="planned; too large to interpret on the CPU", compiled=None,
                       speedup=est, speed_basis="the cost model's estimate against the plan without the decision")
    ok, worst = check_plan_semantics(plan, cap.graph)
    return Outcome("plan", "done" if ok else "compare",
                   detail=f"plan interpreted against the reference in float64: max |err| {worst:.3g} "
                          f"(tol {get_policy(job['precision']).tolerance:g})",
                   ran=True, correct=ok, speedup=est,
                   speed_basis="the cost model's estimate against the plan without the decision")


def _elements(graph: Any) -> int:
    total = sum(math.prod(s.shape) for s in list(graph.inputs) + list(graph.weights))
    return total + sum(math.prod(o.shape) for n in graph.nodes for o in n.outputs)


def _verify_program(cap: ReferenceGraph, job: dict, overrides: dict, constraints: dict) -> Outcome | None:
    """The whole program with ``overrides`` (task -> body) under ``constraints``, written as
    ``build`` writes it, through the Verifier."""
    from ..reference import load_reference  # PyTorch
    from ..verifier.verification import VerifyEnvironmentError, VerifyOptions, verify_program  # PyTorch

    problem = capture_problem(load_reference(job["source"], name=job["name"]), precision=job["precision"],
                              arch=job.get("arch"))
    with tempfile.TemporaryDirectory(prefix="stitchcuda-rl-") as tmp:
        try:
            built = problem.write(problem.plan(constraints), Path(tmp) / "program",
                                  overrides={t: Override(body, "llm") for t, body in overrides.items()})
        except (ConstraintError, PlanError, ValueError) as e:
            return Outcome(job["kind"], "contract", detail=f"the planner refuses these constraints: {e}"[:500])
        except CodeError as e:
            return Outcome(job["kind"], "contract", detail=f"the Coder refuses it: {e}"[:500])
        if not built.ok:
            return Outcome(job["kind"], "build", detail=built.build.message[:500], compiled=False)
        opts = VerifyOptions(trials=3, varied=2, profile=False, compile=False, reference_profile=False,
                             precision=job["precision"], command="stitchcuda train",
                             timing=LoopSettings(min_trials=20, min_seconds=0.1, max_seconds=1.0))
        try:
            v = verify_program(built.directory, None, opts)
        except VerifyEnvironmentError as e:
            raise CannotJudge(str(e)) from None
        t = v.report.timings
        speedup = None
        if v.report.result.ok and t is not None and t.eager_policy is not None and t.program.median_ms > 0:
            speedup = t.eager_policy.median_ms / t.program.median_ms
        return outcome_of_verification(job["kind"], v.report.result, speedup=speedup,
                                       basis="PyTorch eager at the policy (the Verifier's timing)")


def _time_against_template(plan: Any, graph: Any, task: str, body: str, arch: str | None, calls: int = 30) -> float | None:
    """The template body's median time over the candidate body's, both run alone on the same
    buffers (random contents) through check_task's exported entry, CUDA events, after warm-up."""
    import torch

    from ..check.interp import TORCH  # PyTorch

    c = contract(plan, task)
    libs = []
    for ov in ({task: Override(body, "llm")}, {}):
        text = code(plan, graph, None, overrides=ov).program_cu + _harness(c)
        res = _build.build(text, arch=arch, name=f"{plan.name}_{c.function}_check", policy=plan.policy)
        if not res.ok:
            return None
        fn = ctypes.CDLL(res.library).st_check_task
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        fn.restype = ctypes.c_int
        libs.append(fn)
    dev = torch.device("cuda")
    size = {p.buffer: torch.empty((), dtype=TORCH[p.dtype]).element_size() for p in c.params}
    need: dict[str, int] = {}
    for p in c.params:
        need[p.buffer] = max(need.get(p.buffer, 0), (p.offset + max(p.footprint, 1)) * size[p.buffer])
    first: dict[str, str] = {}
    for p in c.params:
        first.setdefault(p.buffer, p.dtype)
    bufs = {}
    for b, n in need.items():   # floats random; integers zero (an index read from noise would be out of range)
        dt, count = TORCH[first[b]], n // size[b] + 1
        bufs[b] = torch.randn(count, device=dev).to(dt) if dt.is_floating_point else \
            torch.zeros(count, dtype=dt, device=dev)
    ptrs = (ctypes.c_void_p * max(len(c.params), 1))(*[bufs[p.buffer].data_ptr() + p.offset * size[p.buffer]
                                                        for p in c.params])
    stream = torch.cuda.Stream(dev)
    times = []
    for fn in libs:
        for _ in range(3):
            fn(ptrs, ctypes.c_void_p(stream.cuda_stream))
        stream.synchronize()
        ms = []
        for _ in range(calls):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
            fn(ptrs, ctypes.c_void_p(stream.cuda_stream))
            b.record(stream)
            b.synchronize()
            ms.append(a.elapsed_time(b))
        times.append(statistics.median(ms))
    return times[1] / times[0] if times[0] > 0 else None


__all__ = ["RewardJudge", "JudgeSettings", "CPU_INTERPRET_MAX_ELEMENTS"]


if __name__ == "__main__":
    sys.exit(_child_main(int(sys.argv[1])))
