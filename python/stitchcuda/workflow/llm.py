"""The LLM proposer: task bodies (*optimize*, *repair*) and planner decisions (*replan*) from a
local model through :mod:`stitchcuda.llm`.

A body request carries the task's contract (``TaskContract.describe()``), the reference nodes it
covers, the runtime's API (retrieved from its headers by the prompt builder) and the Verifier's
feedback on this task's earlier LLM attempts; the reply's one fenced block becomes an override
(origin ``llm``). A decision request carries the graph, the current plan and the verdicts so far;
the grammar keeps the reply a valid decision, which becomes constraints for ``plan()``. A reply
with no usable code or decision is a refused proposal: recorded, never built. Every response is
cached by prompt hash in the run folder (``llm/``), so a run replays exactly.
"""

from __future__ import annotations

from typing import Any

from ..code import contract
from ..llm import (Attempt, CodeBlock, DecisionFailure, DecisionSpec, code_prompt, decision_prompt, extract_code,
                   parse_constraints)
from ..plan import Constraints
from .proposers import Context, Proposal
from .state import Route

#: LLM attempts per task (bodies) and per run (decisions).
MAX_BODIES_PER_TASK = 2
MAX_DECISIONS = 2


def subgraph_text(graph: Any, nodes) -> str:
    by = {n.name: n for n in graph.nodes}
    out = []
    for name in nodes:
        n = by.get(name)
        if n is None:
            continue
        outs = ", ".join(f"%{o.name}: {o.dtype}[{', '.join(map(str, o.shape))}]" for o in n.outputs)
        attrs = ", ".join(f"{k}={v}" for k, v in n.attrs)
        out.append(f"{outs} = {n.op}({', '.join('%' + i for i in n.inputs)}{', ' + attrs if attrs else ''})")
    return "\n".join(out)


def graph_text(graph: Any) -> str:
    ins = ", ".join(f"%{s.name}: {s.dtype}[{', '.join(map(str, s.shape))}]" for s in graph.inputs + graph.weights)
    return f"inputs and weights: {ins}\n" + subgraph_text(graph, [n.name for n in graph.nodes]) + \
        f"\noutputs: {', '.join(graph.outputs)}"


class LLMProposer:
    name = "llm"
    routes = ("optimize", "repair", "replan")

    def __init__(self, client: Any, max_tokens: int = 1024, budget_tokens: int = 6000,
                 max_bodies: int = MAX_BODIES_PER_TASK, max_decisions: int = MAX_DECISIONS):
        self.client = client
        self.max_tokens = max_tokens
        self.budget_tokens = budget_tokens
        self.max_bodies, self.max_decisions = max_bodies, max_decisions
        #: every planner decision asked for: (reply, the parsed decision or the DecisionFailure)
        self.decisions: list[tuple[str, Any]] = []

    def propose(self, ctx: Context, route: Route) -> list[Proposal]:
        if route.kind == "replan" and route.target is None:
            return self._decision(ctx)
        if route.kind in ("optimize", "repair") and route.target is not None:
            return self._body(ctx, route.target)
        return []

    def _body(self, ctx: Context, task: str) -> list[Proposal]:
        try:
            c = contract(ctx.plan, task)
        except KeyError:
            return []
        earlier = [x for x in ctx.state.candidates if x.proposer == self.name and x.meta.get("task") == task]
        if len(earlier) >= self.max_bodies:
            return []
        attempts = [Attempt(x.overrides.get(task, {}).get("source", x.meta.get("reply", "")),
                            x.judgement.summary if x.judgement else "") for x in earlier]
        prompt = code_prompt(c.function, c.describe(), subgraph_text(ctx.problem.graph, c.covers), attempts=attempts,
                             budget_tokens=self.budget_tokens, api_budget_tokens=min(2000, self.budget_tokens // 3),
                             count_tokens=self.client.count_tokens)
        try:
            done = self.client.complete(prompt, max_tokens=self.max_tokens)
        except Exception as e:  # noqa: BLE001 - a model that fails is a refused proposal, not the end of the run
            return [Proposal(self.name, f"body for {task}", dict(ctx.base.constraints), dict(ctx.base.overrides),
                             {"task": task}, refused=f"the LLM call failed: {type(e).__name__}: {e}")]
        meta = {"task": task, "prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
                "llm_s": done.generated_wall_s, "cached": done.cached, "key": done.key}
        got = extract_code(done.text, c.function)
        if not isinstance(got, CodeBlock):
            return [Proposal(self.name, f"body for {task}", dict(ctx.base.constraints), dict(ctx.base.overrides),
                             {**meta, "reply": done.text[:2000]}, refused=f"LLM reply for {task}: {got}")]
        ovs = dict(ctx.base.overrides)
        ovs[task] = {"source": got.code, "origin": "llm", "signature": c.signature}
        return [Proposal(self.name, f"LLM body for {task}", dict(ctx.base.constraints), ovs, meta)]

    def _decision(self, ctx: Context) -> list[Proposal]:
        if len(self.decisions) >= self.max_decisions:
            return []
        ch = ctx.problem.choices()
        spec = DecisionSpec.make(ch.nodes, None, dict(ch.strategies), ch.rewrites)
        feedback = [f"{x.id} ({x.description}): {x.judgement.summary}" for x in ctx.state.candidates[-6:]
                    if x.judgement is not None]
        prompt = decision_prompt(graph_text(ctx.problem.graph), spec, plan=str(ctx.plan), feedback=feedback,
                                 budget_tokens=self.budget_tokens, count_tokens=self.client.count_tokens)
        g = spec.grammar()
        try:
            done = self.client.complete(prompt, grammar=g, max_tokens=max(self.max_tokens, g.max_chars))
        except Exception as e:  # noqa: BLE001
            return [Proposal(self.name, "planner decision", dict(ctx.base.constraints), dict(ctx.base.overrides),
                             {"decision": True}, refused=f"the LLM call failed: {type(e).__name__}: {e}")]
        meta = {"decision": True, "prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
                "llm_s": done.generated_wall_s, "cached": done.cached, "reply": done.text[:2000]}
        d = parse_constraints(done.text, spec)
        self.decisions.append((done.text, d))
        if isinstance(d, DecisionFailure):
            return [Proposal(self.name, "planner decision", dict(ctx.base.constraints), dict(ctx.base.overrides), meta,
                             refused=f"LLM decision: {d}")]
        new = Constraints.from_dict(ctx.base.constraints or {}).merge(Constraints.from_dict(d))
        return [Proposal(self.name, f"LLM planner decision {d}", new.to_dict(), dict(ctx.base.overrides), meta)]


__all__ = ["LLMProposer", "subgraph_text", "graph_text", "MAX_BODIES_PER_TASK", "MAX_DECISIONS"]
