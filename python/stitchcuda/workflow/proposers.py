"""Proposers: small plugins that turn the state and a route into candidate proposals.

Each proposer has a ``name``, the ``routes`` it answers, and ``propose(ctx, route)`` returning
:class:`Proposal` values (constraints for ``plan()`` and task bodies for the Coder, both whole:
the base's plus the change). The loop drops proposals it has already tried, so a proposer may
simply say everything it knows each time; one with nothing new returns ``[]``.

* :class:`PrecisionRepair` — a wrong answer under tf32/bf16/fp16: first every task that rounds
  (under tf32 GEMMs, convolutions, attention and recurrences; under 16-bit storage every task that
  computes) raised to fp32 (*repair*; a raised GEMM of a TF32 program runs as three bf16 products,
  then, where that is still wrong, as three TF32 products); once that verifies, a bisection over
  those tasks (*replan*) lowers them back half at a time, keeping only the tasks that are
  responsible at fp32. Its notes say which tasks and why.
* :class:`Rewrites` — the exact algebraic rewrites that apply (``plan.rewrite``): reductions
  after a linear map pushed into the weights, identities dropped.
* :class:`Variants` — strategy options of the target task's nodes (*optimize*: e.g. a row
  reduction single or split) and fusion boundaries inside it (*replan*); the Verifier's timing
  chooses.
* :class:`stitchcuda.workflow.llm.LLMProposer` (its own module) — task bodies and planner
  decisions from a local model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from ..kinds.attention import split_tf32_changes
from ..plan import STRATEGIES, Constraints
from ..precision import POLICIES
from ..precision import get as get_policy
from .state import Candidate, Route, State

#: Task strategies whose arithmetic a policy rounds (the policy's own fact: precision.Policy.rounds).
ROUNDING = {p.name: p.rounds for p in POLICIES.values() if p.rounds}


@dataclass(frozen=True)
class Proposal:
    proposer: str
    description: str
    constraints: dict
    overrides: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    #: set when the proposal is already known not to be a program (an LLM reply without code)
    refused: str = ""


@dataclass
class Context:
    """What a proposer may read: the state, the base candidate and its plan, the problem."""

    state: State
    base: Candidate
    plan: Any
    problem: Any
    judge: Any = None


class Proposer(Protocol):
    name: str
    routes: tuple[str, ...]

    def propose(self, ctx: Context, route: Route) -> list[Proposal]: ...


def _constraints(base: Candidate):
    return Constraints.from_dict(base.constraints or {})


# ---------------------------------------------------------------------- precision repair


#: The share of a run's wall-time budget the interpreter's TF32 model may take (ResNet-101's
#: candidates take 110-150 s of a 180 s run: the model must leave room for the one it guides).
GUIDE_SHARE = 0.25


class PrecisionRepair:
    name = "precision"
    routes = ("repair", "replan")

    def __init__(self) -> None:
        self._guides: dict[str, tuple[Proposal | None, str]] = {}  # base candidate -> the interpreter's choice

    def suspects(self, plan: Any) -> list[tuple[str, tuple[str, ...]]]:
        """(task, nodes) of the run tasks whose arithmetic the policy rounds, in plan order: not those
        that compute at a policy of their own already (raised, or planned at fp32: a short-sum convolution)."""
        rounding = ROUNDING.get(plan.policy, ())
        return [(t.name, t.covers) for t in plan.tasks if t.phase == "run" and t.covers and t.strategy in rounding
                and (getattr(t.params, "policy", None) or plan.policy) == plan.policy]

    def propose(self, ctx: Context, route: Route) -> list[Proposal]:
        if get_policy(ctx.state.precision).exact:
            return []
        if route.kind == "repair":
            j = ctx.base.judgement
            if j is None or j.kind != "wrong_answer":
                return []
            escalate = self._escalate(ctx)
            sus = self.suspects(ctx.plan)
            if not sus:
                return escalate
            if ctx.base.id not in self._guides:  # the model runs once per failing base, not once per call
                self._guides[ctx.base.id] = self._guided(ctx, sus)
            guided, said = self._guides[ctx.base.id]
            every = self._raise(ctx.base, sus, sus, "every task that rounds raised to fp32: is precision the cause? "
                                                     f"({j.summary})" + (f"; {said}" if said and guided is None else ""))
            return escalate + ([guided, every] if guided is not None else [every])
        return self._bisect(ctx)

    def _escalate(self, ctx: Context) -> list[Proposal]:
        """Of each wrong candidate that raised GEMMs (each runs as three bf16 products, the default),
        the same with those GEMMs as three TF32 products: the next step of precision where bf16 parts
        were not enough. (The loop drops what it has tried.)"""
        if not get_policy(ctx.plan.policy).tf32:
            return []
        gemm = {n for n, o in ctx.problem.choices().strategies if o == STRATEGIES["gemm"]}
        out = []
        for c in ctx.state.candidates:
            j = c.judgement
            if c.ok or j is None or j.kind != "wrong_answer" or "precision_raised" not in c.meta \
                    or c.meta.get("precision_bisect"):  # a bisection's subset fails for want of a task, not of parts
                continue
            k = _constraints(c)
            bf16 = [n for n, p in k.precision if p == "fp32" and n in gemm and k.option(n, "auto") != "tf32x3"]
            if not bf16:
                continue
            new = Constraints.of(dict(k.precision), k.unfuse, {**dict(k.strategy), **{n: "tf32x3" for n in bf16}},
                                 k.rewrites)
            meta = {m: c.meta[m] for m in ("precision_raised", "precision_suspects") if m in c.meta}
            out.append(Proposal(self.name, f"{c.id}'s raised GEMMs as three TF32 products, not bf16 ones "
                                f"({', '.join(bf16)}): {j.summary}", new.to_dict(), dict(c.overrides), meta))
        return out

    def _guided(self, ctx: Context, sus: Sequence[tuple[str, tuple[str, ...]]]) -> tuple[Proposal | None, str]:
        """Under tf32, the fewest tasks the plan interpreter finds responsible (:mod:`stitchcuda.check.sensitivity`),
        raised first: one GPU candidate where a bisection from every task takes many. (None, why)
        when the model cannot say."""
        if ctx.plan.policy != "tf32" or len(sus) < 2 or not hasattr(ctx.problem, "graph"):
            return None, ""
        from ..check.sensitivity import TIME_LIMIT_S, tf32_sensitivity
        from ..device import has_gpu
        from ..hostlock import gpu_alone

        device = "cuda" if has_gpu() else "cpu"
        # at most a quarter of the run's wall time: the guided candidate still has to be built and judged
        wall = ctx.state.budget.wall_s
        limit = TIME_LIMIT_S if wall is None else min(TIME_LIMIT_S, GUIDE_SHARE * wall)

        def model():  # its tensors die with it, before the cache is emptied; says which parameters it ran on
            weights, inputs, drawn = self._values(ctx, device)
            return tf32_sensitivity(ctx.plan, weights, inputs, [t for t, _ in sus], tol=get_policy("tf32").tolerance,
                                    device=device, observed=ctx.base.judgement.error_ratio, time_limit_s=limit), drawn

        try:
            with gpu_alone("the interpreter's TF32 model"):  # workers sharing a GPU take turns (hostlock.py)
                s, drawn = model()
        except Exception as e:  # noqa: BLE001 - the model is a guide; without it the repair raises every task
            return None, f"the interpreter's TF32 model failed ({type(e).__name__}: {e})"
        finally:
            if device == "cuda":  # the Verifier's children need the memory this process's cache holds
                import torch

                torch.cuda.empty_cache()
        said = f"{s.describe()}; on {drawn}"
        if not s.raise_ or len(s.raise_) == len(sus):
            return None, said
        keep = set(s.raise_)
        prop = self._raise(ctx.base, [(t, ns) for t, ns in sus if t in keep], sus,
                           f"the {len(keep)} of {len(sus)} rounding tasks the interpreter finds most sensitive "
                           f"raised to fp32: {said}")
        prop.meta["sensitivity"] = {"alone": [list(p) for p in s.alone], "every": s.every, "rest": s.rest,
                                    "scale": s.scale, "runs": s.runs, "seconds": round(s.seconds, 2)}
        return prop, said

    @staticmethod
    def _values(ctx: Context, device: str) -> tuple[dict, list, str]:
        """The weights and inputs the model runs on, and which they are: the Verifier's own draw
        where the reference can be built here (the judged parameters: the captured ones may not
        amplify as they do), else the captured weights and random inputs, with the reason."""
        from ..check.task import random_values
        from .judge import verifier_values

        try:
            return (*verifier_values(ctx.problem, ctx.plan, device), "the Verifier's draw of the parameters")
        except Exception as e:  # noqa: BLE001 - no source (an nn.Module), a reference that needs a GPU: the captured ones
            g = ctx.problem.graph
            weights = ctx.problem.weights if ctx.problem.weights is not None else \
                random_values(g.weights, 0, scale_by_fan_in=True)
            why = f"{type(e).__name__}: {e}"
            return (weights, list(random_values(g.inputs, 1).values()),
                    f"the captured weights, not the Verifier's draw ({why[:160]})")

    def _raise(self, base: Candidate, raised: Sequence[tuple[str, tuple[str, ...]]],
               suspects: Sequence[tuple[str, tuple[str, ...]]], why: str) -> Proposal:
        c = _constraints(base)
        every = {n for _, ns in suspects for n in ns}
        prec = {n: p for n, p in c.precision if n not in every}
        prec.update({n: "fp32" for _, ns in raised for n in ns})
        new = Constraints.of(prec, c.unfuse, dict(c.strategy), c.rewrites)
        names = [t for t, _ in raised]
        return Proposal(self.name, f"raise {', '.join(names) or 'nothing'} to fp32: {why}", new.to_dict(),
                        dict(base.overrides), {"precision_raised": [[t, list(ns)] for t, ns in raised],
                                               "precision_suspects": [[t, list(ns)] for t, ns in suspects]})

    def _bisect(self, ctx: Context) -> list[Proposal]:
        """The next subset to try, of the smallest set known to pass: where the interpreter's TF32
        model ranked the tasks (a guided candidate's ``sensitivity``), first that set without its
        least sensitive task; then its halves (the most sensitive first, by the model where there is
        one, else in graph order), then single removals."""
        tried: dict[frozenset, bool] = {}
        suspects = None
        rank: dict[str, float] = {}
        for c in ctx.state.candidates:
            raised = c.meta.get("precision_raised")
            if raised is None or c.judgement is None:
                continue
            suspects = suspects or [(t, tuple(ns)) for t, ns in c.meta["precision_suspects"]]
            rank = rank or {t: float(r) for t, r in c.meta.get("sensitivity", {}).get("alone", ())}
            key = frozenset(t for t, _ in raised)
            tried[key] = tried.get(key, False) or c.ok
        if not suspects:
            return []
        passing = [k for k, ok in tried.items() if ok]
        if not passing:
            return []
        best = min(passing, key=len)
        order = [t for t, _ in suspects if t in best]
        if rank:  # most sensitive first (a stable sort: graph order among equals)
            order.sort(key=lambda t: -rank.get(t, 0.0))
        nodes = dict(suspects)
        base = ctx.state.best_candidate or ctx.base

        def subset(ts) -> list[tuple[str, tuple[str, ...]]]:
            return [(t, nodes[t]) for t in order if t in ts]

        half = len(order) // 2
        steps = []
        if rank and len(order) > 1:
            steps.append((order[:-1], f"without {order[-1]}, the least sensitive in the interpreter's model"))
        if len(order) > 1:
            steps += [(order[:half], "first half"), (order[half:], "second half")]
        steps += [([x for x in order if x != t], f"without {t}") for t in order]
        for ts, what in steps:
            key = frozenset(ts)
            if key not in tried:
                prop = self._raise(base, subset(ts), suspects,
                                   f"bisecting: {what} of {', '.join(order)} (the smallest set known to pass)")
                prop.meta["precision_bisect"] = True
                return [prop]
        return []


def responsible(state: State) -> tuple[list[str], str]:
    """The tasks a finished precision bisection kept at fp32, and why (for the report)."""
    best = state.best_candidate
    if best is None or "precision_raised" not in best.meta:
        return [], ""
    kept = [t for t, _ in best.meta["precision_raised"]]
    fails = [c for c in state.candidates if "precision_raised" in c.meta and not c.ok and c.judgement is not None]
    why = "; ".join(f"without {', '.join(sorted({t for t, _ in c.meta['precision_suspects']} - {t for t, _ in c.meta['precision_raised']})) or 'any'} "
                    f"at fp32: {c.judgement.summary}" for c in fails[:3])
    return kept, why


# ---------------------------------------------------------------------- algebraic rewrites


class Rewrites:
    name = "rewrite"
    routes = ("repair", "replan")

    def propose(self, ctx: Context, route: Route) -> list[Proposal]:
        if route.target is not None:
            return []
        c = _constraints(ctx.base)
        todo = [r for r in ctx.problem.choices().rewrites if r not in c.rewrites]
        out = []
        for r in todo:
            new = Constraints.of(dict(c.precision), c.unfuse, dict(c.strategy), c.rewrites + (r,))
            out.append(Proposal(self.name, f"exact rewrite {r}", new.to_dict(), {}, {"rewrite": r}))
        if len(todo) > 1:
            new = Constraints.of(dict(c.precision), c.unfuse, dict(c.strategy), c.rewrites + tuple(todo))
            out.append(Proposal(self.name, f"exact rewrites {', '.join(todo)}", new.to_dict(), {}, {"rewrite": todo}))
        return out


# ---------------------------------------------------------------------- variants


class Variants:
    name = "variant"
    routes = ("optimize", "replan")

    def propose(self, ctx: Context, route: Route) -> list[Proposal]:
        if route.target is None:
            return []
        try:
            task = ctx.plan.task(route.target)
        except KeyError:
            return []
        c = _constraints(ctx.base)
        out = []
        if route.kind == "optimize":
            opts = dict(ctx.problem.choices().strategies)
            for n in task.covers:
                if opts.get(n) == STRATEGIES["gemm"]:
                    continue  # how a raised GEMM splits is a step of precision (the repair's), never faster
                for o in opts.get(n, ()):
                    if o == "auto" or c.option(n, "auto") == o:
                        continue
                    if o == "split_tf32" and not split_tf32_changes(task.params, ctx.plan.policy):
                        continue
                    new = Constraints.of(dict(c.precision), c.unfuse, {**dict(c.strategy), n: o}, c.rewrites)
                    out.append(Proposal(self.name, f"{n}: strategy {o}", new.to_dict(), dict(ctx.base.overrides),
                                        {"strategy": [n, o]}))
        else:
            for n in task.covers[1:4]:
                if n in c.unfuse:
                    continue
                new = Constraints.of(dict(c.precision), c.unfuse + (n,), dict(c.strategy), c.rewrites)
                out.append(Proposal(self.name, f"split {task.name} before {n} (a fusion boundary)", new.to_dict(), {},
                                    {"unfuse": n}))
        return out


__all__ = ["Proposal", "Context", "Proposer", "PrecisionRepair", "Rewrites", "Variants",
           "responsible", "ROUNDING"]
