"""The streamed group norm (kinds/norm_stream.py, templates/stitch/norm_stream.cuh): which group norms
take it under each strategy, its epilogue, checked by the plan interpreter against PyTorch in float64,
and its program compiled by nvcc (CPU only; tests/gpu/test_norm_stream_gpu.py runs it)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from stitchcuda import build as B
from stitchcuda import code as C
from stitchcuda import frontend
from stitchcuda import ops
from stitchcuda import plan as P
from stitchcuda.kinds import norm_stream
from stitchcuda.kinds.norm import GroupStatsSpec
from stitchcuda.kinds.norm_stream import NormStreamSpec
from stitchcuda.plan.constraints import Constraints
from tests.plan_sim import check_float64


class GnAct(nn.Module):
    def __init__(self, channels: int, groups: int, affine=True, act=True):
        super().__init__()
        self.gn, self.act = nn.GroupNorm(groups, channels, affine=affine), act
        if affine:
            with torch.no_grad():
                self.gn.weight.uniform_(0.5, 1.5)
                self.gn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        y = self.gn(x)
        return torch.sigmoid(F.gelu(y)) * 2.0 if self.act else y


def _constraints(graph, option: str) -> Constraints:
    return Constraints.of({}, (), {n: option for n, opts in P.choices(graph).strategies if "stream" in opts}, ())


def _plan(model, x, policy, option="stream"):
    cap = frontend.capture(model, [x], "gn", supported_ops=ops.supported())
    return P.plan(cap.graph, policy, constraints=_constraints(cap.graph, option)), cap


def _check(model, x, policy, option="stream", tol=1e-6):
    plan, cap = _plan(model, x, policy, option)
    check_float64(plan, model, cap, x, tol, policy)
    return plan


def _streamed(plan) -> list[NormStreamSpec]:
    return [t.params for t in plan.tasks if isinstance(t.params, NormStreamSpec)]


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("shape,groups,affine", [((3, 12, 9, 10), 4, True), ((2, 8, 33), 8, False),
                                                 ((1, 6, 4, 5, 6), 2, True)],
                         ids=["4-groups", "instance-like-1d", "3-d"])
def test_a_streamed_group_norm_with_its_epilogue(shape, groups, affine, policy):
    torch.manual_seed(0)
    model, x = GnAct(shape[1], groups, affine), torch.randn(*shape) * 3 + 1
    plan = _check(model, x, policy)
    (ns,) = _streamed(plan)
    assert len(ns.epilogue) >= 3, "gelu, sigmoid and the scale after it are its epilogue hook"
    assert not any(isinstance(t.params, GroupStatsSpec) for t in plan.tasks), "no statistics task"
    assert [t.strategy for t in plan.tasks if t.phase == "run"] == ["reduction_template"], "one task"
    assert (ns.rows, ns.cols) == (shape[0] * groups, x[0].numel() // groups)
    assert (ns.weight is not None) == affine


def test_by_default_the_statistics_task_computes_it_even_larger_than_l2():
    """Measured slower (kinds/norm_stream.py): only the strategy ``stream`` asks for the kernel."""
    torch.manual_seed(1)
    model, x = GnAct(12, 4), torch.randn(3, 12, 9, 10)
    plan = _check(model, x, "tf32", "auto")
    assert not _streamed(plan) and any(isinstance(t.params, GroupStatsSpec) for t in plan.tasks)
    cap = frontend.capture(model, [x], "gn", supported_ops=ops.supported())
    gn = next(n for n in cap.graph.nodes if ops.kind(n.op) == "group_norm")
    assert dict(P.choices(cap.graph).strategies)[gn.name] == ("auto", "stream")

    class Shaped:  # the graph with x as KernelBench 1:35's [112, 64, 512, 512] (no tensor made)
        def spec(self, t):
            s = cap.graph.spec(t)
            big = (112, 64, 512, 512)
            return type(s)(**{**s.__dict__, "shape": big}) if t in (gn.inputs[0], gn.outputs[0].name) else s

    assert norm_stream.rows_of(Shaped(), gn) == (112, 4, 16, 16 * 512 * 512)  # (its 4 groups)
    assert not norm_stream.streams(Shaped(), gn, "auto") and norm_stream.streams(Shaped(), gn, "stream")


def test_bf16_storage_and_a_used_mean_keep_the_two_pass_form():
    torch.manual_seed(2)
    model, x = GnAct(12, 4), torch.randn(3, 12, 9, 10)
    plan, _ = _plan(model, x, "bf16")
    assert not _streamed(plan)

    class Stats(nn.Module):
        def forward(self, x):
            y, mean, _ = torch.ops.aten.native_group_norm(x, None, None, 3, 12, 90, 4, 1e-5)
            return y + mean.sum()

    with pytest.raises(P.PlanError, match="mean / rstd outputs are used"):  # the two-pass claim says why
        _plan(Stats(), x, "fp32")


def test_the_program_compiles(nvcc, tmp_path):
    torch.manual_seed(3)
    for model, x in ((GnAct(12, 4), torch.randn(3, 12, 9, 10)), (GnAct(8, 8, affine=False), torch.randn(2, 8, 33))):
        plan, cap = _plan(model, x, "fp32")
        src = C.code(plan, cap.graph, None, arch="sm_90")
        assert "stitch::launch_norm_stream<" in src.program_cu
        r = B.build(src.program_cu, arch="sm_90", cache=tmp_path, name="ns", policy="fp32")
        assert r.ok, r.compile.output if r.compile else r.message
