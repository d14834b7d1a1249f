"""The loop: plan -> code -> verify -> route, until the budget ends.

:class:`Loop` evaluates the first candidate (the plan ``build`` makes), then asks
:func:`.route.decide` where to go, asks the proposers that answer that route for proposals,
and evaluates each new one in turn. Evaluating a candidate: plan under its constraints; check
every *new* task body alone first (``CandidateJudge.check_task``); code, write and compile the
program folder as ``build`` does (:meth:`stitchcuda.pipeline.CapturedProblem.write`); verify the
whole program (``CandidateJudge.verify``). Only a candidate that passes the whole-program
verification, and is faster than the best by more than ``min_gain``, becomes the best: the loop
always revises from the best verified candidate, never from the last. The state is saved after
every candidate, so a killed run resumes losing at most the candidate in flight.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Sequence

from ..code import CodeError, Override, contract
from ..hostlock import own_clock
from ..manifest import PROGRAM_SOURCE, hash_source
from ..pipeline import CapturedProblem
from ..plan import Constraints
from .judge import CandidateJudge, CannotJudge, estimated_tasks
from .proposers import Context, Proposal
from .route import decide, hot_tasks, precision_first
from .runs import RunDir
from .state import BEFORE_VERIFIER, Candidate, Judgement, Route, State, TaskVerdict, proposal_key

#: Candidates the final verification tries, fastest first, before the run hands back nothing.
FINAL_TRIES = 3

#: The first candidate: the plan as ``build`` makes it.
ROOT = Proposal("template", "the plan and templates as `build` makes them", {}, {})


class Loop:
    def __init__(self, problem: CapturedProblem, judge: CandidateJudge, proposers: Sequence[Any], run: RunDir,
                 state: State, *, progress: Callable[[str], None] | None = None, compile: bool = True,
                 final_verify: bool = True, clock: Callable[[], float] = own_clock):
        self.problem, self.judge, self.proposers, self.run_dir = problem, judge, list(proposers), run
        self.state = state
        self.say = progress or (lambda text: None)
        self.compile, self.final_verify = compile, final_verify
        self.clock = clock
        self._t0 = clock()
        self._spent0 = state.spent
        self._plans: dict[str, Any] = {}
        self._sources: dict[str, str] | None = None  # see _programs

    # ------------------------------------------------------------------ bookkeeping

    def _tick(self, iterations: int = 0, gpu_s: float = 0.0) -> None:
        spent = self.state.spent
        wall = self._spent0.wall_s + (self.clock() - self._t0)
        self.state = dataclasses.replace(self.state, spent=dataclasses.replace(
            spent, wall_s=wall, iterations=spent.iterations + iterations, gpu_s=spent.gpu_s + gpu_s))

    def _save(self) -> None:
        self.run_dir.save(self.state)

    def plan_of(self, c: Candidate) -> Any:
        key = c.key()
        if key not in self._plans:
            self._plans[key] = self.problem.plan(c.constraints)
        return self._plans[key]

    def _programs(self) -> dict[str, str]:
        """Each program source judged so far (its sha256) -> the candidate that had it, read from the
        run folder on first use (so a resumed run knows them too). Different constraints can give the
        same program (a strategy the kind declines under this policy, a variant equal to its base):
        it is judged once."""
        if self._sources is None:
            self._sources = {}
            for c in self.state.candidates:
                f = self.run_dir.root / c.program / PROGRAM_SOURCE if c.program else None
                if f is not None and f.is_file():
                    self._sources.setdefault(hash_source(f.read_text()), c.id)
        return self._sources

    # ------------------------------------------------------------------ the loop

    def run(self) -> State:
        self.run_dir.event("start", resumed=bool(self.state.candidates), spent=dataclasses.asdict(self.state.spent))
        try:
            if self.state.root is None:
                self.evaluate(ROOT, Route("repair", None, "first candidate"), route_name="plan")
            while not self.state.finished:
                self._tick()
                why = self.state.budget.left(self.state.spent)
                if why:
                    self._finish(why)
                    break
                self.step()
        except CannotJudge as e:
            self._finish(f"cannot verify on this machine: {e}")
        if self.final_verify and self.state.best is not None and self.compile:
            self._final()
        self._tick()
        self._save()
        self.run_dir.event("end", finished=self.state.finished, best=self.state.best,
                           spent=dataclasses.asdict(self.state.spent))
        return self.state

    def step(self) -> None:
        """One route: decide, then evaluate what its proposers propose (or mark it exhausted)."""
        st = self.state
        base = st.base()
        plan = self.plan_of(base)
        hot = hot_tasks(st, estimated_tasks(plan))
        route = decide(st, hot)
        self.state = dataclasses.replace(st, routes=st.routes + (route,))
        self.run_dir.event("route", kind=route.kind, target=route.target, reason=route.reason)
        self.say(f"route {route.kind}" + (f" {route.target}" if route.target else "") + f": {route.reason}")
        if route.kind == "done":
            self._finish(route.reason)
            return
        if route.kind == "next":
            self.state = dataclasses.replace(self.state, target=route.target)
            self._save()
            return
        ctx = Context(self.state, base, plan, self.problem, self.judge)
        seen = self.state.tried()
        fresh: list[Proposal] = []
        first = "precision" if precision_first(route, base) else None
        for p in sorted(self.proposers, key=lambda p: p.name != first):  # stable: otherwise as given
            if route.kind not in p.routes:
                continue
            for prop in p.propose(ctx, route):
                k = proposal_key(prop.constraints, prop.overrides) if not prop.refused else f"refused:{len(seen)}"
                if k not in seen:
                    seen.add(k)
                    fresh.append(prop)
        if not fresh:
            self.state = self.state.exhaust(route.kind, route.target)
            self._save()
            return
        best = self.state.best
        for prop in fresh:
            self._tick()
            if self.state.budget.left(self.state.spent):
                return
            # With a verified best in hand, a candidate that cannot finish in time is not begun: a
            # run asked for three minutes does not take five (the best so far is what it hands back).
            why = self.state.budget.cannot_fit(self.state.spent, self._quickest_build()) if best is not None else None
            if why:
                self._finish(why)
                return
            self.evaluate(prop, route)
            if self.state.best != best:
                return  # revise from the new best

    def _quickest_build(self) -> float | None:
        """Seconds of the quickest candidate that reached the Verifier (those stopped before it take
        next to none), or None before any did."""
        built = [c.seconds for c in self.state.candidates
                 if c.judgement is not None and c.judgement.kind not in BEFORE_VERIFIER]
        return min(built) if built else None

    # ------------------------------------------------------------------ one candidate

    def evaluate(self, prop: Proposal, route: Route, route_name: str | None = None) -> Candidate:
        st = self.state
        cid = st.next_id()
        base = st.base()
        self.run_dir.event("candidate", id=cid, proposer=prop.proposer, description=prop.description,
                           route=route.kind, target=route.target)
        self.say(f"{cid} [{prop.proposer}] {prop.description}")
        t0 = self.clock()
        checks: list[TaskVerdict] = []
        gpu = 0.0
        program = ""
        origins: dict[str, str] = {}
        overrides = dict(prop.overrides)
        if prop.refused:
            j = Judgement("no_code", prop.refused)
        else:
            j, checks, gpu, program, origins, overrides = self._judge(cid, prop, base)
        cand = Candidate(cid, base.id if base is not None else None, prop.proposer, route_name or route.kind, route.target,
                         prop.description, prop.constraints, overrides, origins, prop.meta, j, tuple(checks),
                         self.clock() - t0, program)
        before = self.state.best
        self.state = self.state.with_candidate(cand)
        self._tick(iterations=1, gpu_s=gpu + (j.gpu_s if j is not None else 0.0))
        self.run_dir.write_candidate(cand)
        new_best = self.state.best != before
        if new_best:
            self.run_dir.publish_best(self.run_dir.root / program)
            self.state = dataclasses.replace(self.state, exhausted=())
        self._save()
        self.run_dir.event("result", id=cid, kind=j.kind, ms=j.ms, summary=j.summary, best=self.state.best)
        self.say(f"{cid} {j.summary}" + (f"; {j.ms:.4g} ms" if j.ms is not None else "") +
                 (" -- new best" if new_best else f"; best {self._best_text()}"))
        return cand

    def _best_text(self) -> str:
        b = self.state.best_candidate
        return "none yet" if b is None else f"{b.id} {b.ms:.4g} ms"

    def _judge(self, cid: str, prop: Proposal, base: Candidate | None):
        """(judgement, task checks, their GPU seconds, program folder, origins, overrides kept)."""
        try:
            plan = self.problem.plan(prop.constraints)
        except Exception as e:  # noqa: BLE001 - constraints that do not fit are a verdict on the proposal
            return Judgement("invalid", f"the planner refuses it: {e}"), [], 0.0, "", {}, {}
        # A body written for a task of another plan goes only where the same task still is.
        overrides = {}
        for t, ov in prop.overrides.items():
            try:
                c = contract(plan, t)
            except KeyError:
                continue
            if ov.get("signature") in (None, c.signature):
                overrides[t] = ov
        checks: list[TaskVerdict] = []
        gpu = 0.0
        old = base.overrides if base is not None else {}
        for t, ov in overrides.items():
            if old.get(t, {}).get("source") == ov["source"]:
                continue  # checked when it was first proposed
            v = self.judge.check_task(self.problem, plan, t, ov)
            checks.append(v)
            gpu += v.seconds if v.ran else 0.0
            if not v.ok:
                return (Judgement("task_failed", f"task {t} checked alone: {v.stage}: {v.reason}"), checks, gpu, "",
                        {}, overrides)
        rel = Path("candidates") / cid / "program"
        bodies = {t: Override(o["source"], o.get("origin", "hand")) for t, o in overrides.items()}
        try:
            src = self.problem.code(plan, bodies)
        except CodeError as e:
            return (Judgement("invalid", f"the Coder refuses it: {e}"), checks, gpu, "", task_origins(plan, prop, {}),
                    overrides)
        digest = src.manifest.source_hash  # (manifest.hash_source of the program, as the Coder made it)
        same = self._programs().get(digest)
        if same is not None:
            return (Judgement("same_program", f"the same program as {same}: not built or measured again"), checks,
                    gpu, "", task_origins(plan, prop, {}), overrides)
        self._programs()[digest] = cid
        built = self.problem.write(plan, self.run_dir.root / rel, source=src, compile=self.compile,
                                   weights_file=self.problem.weights_file(self.run_dir.weights_file))
        origins = task_origins(plan, prop, {t.name: t.origin for t in built.manifest.tasks})
        if not built.ok:
            return Judgement("compile_error", built.build.message), checks, gpu, "", origins, overrides
        j = self.judge.verify(self.problem, built.directory)
        return j, checks, gpu, str(rel), origins, overrides

    def _final(self) -> None:
        """The best verified once more with every trial and baseline (torch.compile included).

        A best that fails it passed the search's few trials near the tolerance's edge: it is set
        aside and the next fastest verified candidate takes its place and is verified the same way,
        up to FINAL_TRIES candidates. When none passes, the run has no best: nothing that failed a
        verification is handed back as the program to ship."""
        for left in range(FINAL_TRIES - 1, -1, -1):
            best = self.state.best_candidate
            if best is None or (self.state.final_of == best.id):
                return
            self.say(f"final verification of {best.id} (all trials, torch.compile baselines)")
            try:
                j = self.judge.verify(self.problem, self.run_dir.best_dir, final=True)
            except CannotJudge as e:
                j = Judgement("inconclusive", str(e))
            self._tick(gpu_s=j.gpu_s)
            self.state = dataclasses.replace(self.state, final=j, final_of=best.id)
            self.run_dir.event("final", id=best.id, kind=j.kind, ms=j.ms, summary=j.summary)
            if j.ok or j.kind == "inconclusive":
                return
            nxt = self.state.next_best() if left else None
            self.state = dataclasses.replace(self.state, set_aside=self.state.set_aside + ((best.id, j.summary),),
                                             best=nxt.id if nxt is not None else None)
            self._save()
            if nxt is None:
                self.run_dir.withdraw_best()
                self.say(f"{best.id} failed its final verification ({j.summary}); no program is handed back")
                return
            self.say(f"{best.id} failed its final verification ({j.summary}); {nxt.id}, the next fastest "
                     "verified candidate, takes its place")
            self.run_dir.publish_best(self.run_dir.root / nxt.program)

    def _finish(self, why: str) -> None:
        self.state = dataclasses.replace(self.state, finished=why)
        self._save()
        self.say(f"done: {why}")


def task_origins(plan: Any, prop: Proposal, coder_origins: dict) -> dict[str, str]:
    """Where each task's code came from: template, rewrite, repair (fp32), variant, or the body's
    author (llm, hand)."""
    c = Constraints.from_dict(prop.constraints or {})
    raised = {n for n, p in c.precision if p == "fp32"}
    strat = dict(c.strategy)
    out = {}
    for t in plan.tasks:
        o = coder_origins.get(t.name, "template")
        if o.startswith("override: "):
            out[t.name] = o[len("override: "):]
        elif any("__rw" in n for n in t.covers):
            out[t.name] = "rewrite"
        elif raised & set(t.covers) and plan.policy != "fp32":
            out[t.name] = "repair (fp32)"
        elif set(strat) & set(t.covers) or set(c.unfuse) & set(t.covers):
            out[t.name] = "variant"
        else:
            out[t.name] = "template"
    return out


__all__ = ["Loop", "ROOT", "FINAL_TRIES", "task_origins"]
