"""A scripted Verifier and small references for the loop's CPU tests (no GPU, no nvcc).

:class:`ScriptedJudge` judges a candidate program folder from its ``plan.json`` alone, by rules a
test states: which tasks must be at fp32 (or rewritten) for the answer to be right, and a time
per task. It also counts its calls, can sleep inside one (to be killed there), and logs each
verdict, so tests see exactly what the loop asked.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.nn as nn

from stitchcuda.workflow import Judgement, TaskVerdict
from stitchcuda.workflow.state import TaskTime


class TwoLinearSum(nn.Module):
    """linear -> gelu -> linear_1 -> sum over the row: only linear_1 is precision-sensitive."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 64)

    def forward(self, x):
        return torch.sum(self.fc2(torch.nn.functional.gelu(self.fc1(x))), dim=1)


def example():
    torch.manual_seed(0)
    return TwoLinearSum(), [torch.randn(8, 16)]


class ScriptedJudge:
    """``sensitive``: graph nodes whose GEMM must run at fp32 (unless rewritten away) for a pass.
    ``ms``: strategy -> (ms at the policy, ms at fp32); ``gpu_s`` per verification.
    ``sleep_on``: the verification number (1-based) that writes ``marker`` and sleeps.
    ``exact``: of those, the nodes whose raised GEMM must not split into bf16 parts (TF32 parts pass).
    ``delay``: wall seconds every verification takes (a program that is slow to build and judge)."""

    def __init__(self, sensitive=("linear_1",), ms=None, gpu_s=1.0, sleep_on=None, marker=None, slower=(), exact=(),
                 delay=0.0):
        self.sensitive = set(sensitive)
        self.exact = set(exact)
        self.ms = ms or {"cublaslt_gemm": (1.0, 3.0), "reduction_template": (0.5, 0.5),
                         "elementwise_kernel": (0.2, 0.2)}
        self.gpu_s = gpu_s
        self.sleep_on, self.marker = sleep_on, marker
        self.slower = set(slower)
        self.delay = delay
        self.calls = []
        self.task_calls = []

    def check_task(self, problem, plan, task, override):
        self.task_calls.append(task)
        ok = "GOOD" in override["source"]
        return TaskVerdict(task, ok, "done" if ok else "compare", "scripted" if ok else "output out differs",
                           True, 0.5)

    def verify(self, problem, program, final=False):
        self.calls.append(str(program))
        if self.sleep_on is not None and len(self.calls) == self.sleep_on:
            Path(self.marker).write_text(str(os.getpid()))
            time.sleep(600)
        time.sleep(self.delay)
        p = json.loads((Path(program) / "plan.json").read_text())
        policy = p["policy"]
        total, times, wrong = 0.0, [], []
        for t in p["tasks"]:
            if t["phase"] != "run":
                continue
            pol = t["params"].get("policy", policy) if isinstance(t["params"], dict) else policy
            fast, fp32 = self.ms.get(t["strategy"], (0.1, 0.1))
            ms = fp32 if pol == "fp32" and policy != "fp32" else fast
            if any(n in self.slower for n in t["covers"]):
                ms *= 2
            if t["strategy"] == "cublaslt_gemm" and pol != "fp32" and self.sensitive & set(t["covers"]):
                wrong.append(t["name"])
            elif t["strategy"] == "cublaslt_gemm" and self.exact & set(t["covers"]) and t["params"].get("split") == "bf16":
                wrong.append(t["name"] + " (bf16 parts)")
            total += ms
            times.append(TaskTime(t["name"], ms * 1e3, 0.2))
        m = json.loads((Path(program) / "manifest.json").read_text())
        if any("BAD" in (t.get("origin") or "") for t in m["tasks"]):
            wrong.append("a body")
        if wrong:
            return Judgement("wrong_answer", f"wrong answer: {', '.join(wrong)} out of tolerance", gpu_s=self.gpu_s,
                             wrong_output="out")
        return Judgement("passed", "passed: scripted", total, (("compile_policy", 2.0),), tuple(times),
                         gpu_s=self.gpu_s)


class ScriptedBodies:
    """A proposer that offers task bodies for the target task from a list (an LLM stand-in)."""

    name = "llm"
    routes = ("optimize",)

    def __init__(self, bodies):
        self.bodies = list(bodies)

    def propose(self, ctx, route):
        from stitchcuda.code import contract
        from stitchcuda.workflow import Proposal

        c = contract(ctx.plan, route.target)
        out = []
        for i, b in enumerate(self.bodies):
            src = f"// {b} {i}\n{c.signature} {{ return ST_OK; }}\n"
            ovs = dict(ctx.base.overrides)
            ovs[route.target] = {"source": src, "origin": "llm", "signature": c.signature}
            out.append(Proposal(self.name, f"body {b} {i} for {route.target}", dict(ctx.base.constraints), ovs,
                                {"task": route.target}))
        return out


class CancellingChain(nn.Module):
    """Four linears; the first's weight is [M, -M + D] over its input twice, so its output (x D) is a
    hundredth of its terms: TF32's rounding of M (10 mantissa bits) is then a few times the tolerance,
    where the other three, alone at TF32, stay far within it. Only fc1 is sensitive."""

    def __init__(self, width: int = 64, cancel: float = 0.01):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        m = torch.randn(width, width, generator=g)
        d = cancel * torch.randn(width, width, generator=g)
        self.fc1 = nn.Linear(2 * width, width, bias=False)
        self.fc1.weight.data = torch.cat([m, -m + d], 1)
        self.fc2, self.fc3, self.fc4 = (nn.Linear(width, width, bias=False) for _ in range(3))

    def forward(self, x):
        h = self.fc1(torch.cat([x, x], -1))
        return self.fc4(torch.relu(self.fc3(torch.relu(self.fc2(h)))))
