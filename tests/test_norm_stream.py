"""The streamed group norm (kinds/norm_stream.py, templates/stitch/norm_stream.cuh): which group norms
take it under each strategy, its epilogue, checked by the plan interpreter against PyTorch in float64,
and its program compiled by nvcc (CPU only; tests/gpu/test_norm_stream_gpu.py runs it)."""

from __future__ import annotations

import copy

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
from stitchcuda.pipeline import model_weights
from stitchcuda.plan.constraints import Constraints
from tests.plan_sim import simulate


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
    out = simulate(plan, model_weights(model, cap.graph) or cap.weights, [x])[0].double()
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double())
    err = ((out - want).abs() / (1 + want.abs())).max().item()
    assert not torch.isnan(out).any() and err < tol, (policy, err)
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


def test_two_pass_and_by_default_on_a_small_tensor_the_statistics_task_computes_it():
    torch.manual_seed(1)
    model, x = GnAct(12, 4), torch.randn(3, 12, 9, 10)
    for option in ("two_pass", "auto"):
        plan = _check(model, x, "tf32", option)
        assert not _streamed(plan) and any(isinstance(t.params, GroupStatsSpec) for t in plan.tasks)
    cap = frontend.capture(model, [x], "gn", supported_ops=ops.supported())
    gn = next(n for n in cap.graph.nodes if ops.kind(n.op) == "group_norm")
    assert dict(P.choices(cap.graph).strategies)[gn.name] == ("auto", "two_pass", "stream")


def test_auto_streams_a_tensor_larger_than_l2_with_rows_that_fit():
    """The default's bounds, on the graph alone (no tensor of that size is made)."""
    big = frontend.capture(GnAct(64, 8), [torch.randn(2, 64, 8, 8)], "gn", supported_ops=ops.supported()).graph
    gn = next(n for n in big.nodes if ops.kind(n.op) == "group_norm")

    class Shaped:  # the graph with x as KernelBench 1:35's [112, 64, 512, 512]
        def __init__(self, shape):
            self.shape = shape

        def spec(self, t):
            s = big.spec(t)
            return type(s)(**{**s.__dict__, "shape": self.shape}) if t in (gn.inputs[0], gn.outputs[0].name) else s

    assert norm_stream.streams(Shaped((112, 64, 512, 512)), gn, "auto")        # 7.5 GB, rows of 8 MB
    assert not norm_stream.streams(Shaped((4, 64, 128, 128)), gn, "auto")      # 16 MB: L2 holds it
    assert not norm_stream.streams(Shaped((8, 8, 2048, 2048)), gn, "auto")     # rows of 16 MB
    assert not norm_stream.streams(Shaped((112, 64, 512, 512)), gn, "two_pass")


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
