"""The depthwise kind (kinds/depthwise.py, templates/stitch/depthwise.cuh): claimed, planned in either
layout, checked by the plan interpreter against PyTorch in float64, and its program compiled by nvcc
(CPU only; the GPU runs it in tests/gpu/test_programs_gpu.py's depthwise_separable model)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from stitchcuda import build as B
from stitchcuda import code as C
from stitchcuda import frontend
from stitchcuda import layout as L
from stitchcuda import ops
from stitchcuda import plan as P
from stitchcuda.kinds.depthwise import DepthwiseSpec
from stitchcuda.pipeline import model_weights
from tests.plan_sim import simulate


class Depthwise(nn.Module):
    def __init__(self, c=6, k=3, stride=1, padding=1, dilation=1, bias=True, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c, c, k, stride=stride, padding=padding, dilation=dilation, groups=c, bias=bias)
        self.act = act

    def forward(self, x):
        y = self.conv(x)
        return F.relu6(y) * 0.5 if self.act else y


class Block(nn.Module):
    """A MobileNet-style block: pointwise conv, depthwise conv, pointwise conv."""

    def __init__(self, c=8):
        super().__init__()
        self.expand = nn.Conv2d(c, 2 * c, 1)
        self.dw = nn.Conv2d(2 * c, 2 * c, 3, padding=1, groups=2 * c)
        self.project = nn.Conv2d(2 * c, c, 1)

    def forward(self, x):
        return self.project(F.relu(self.dw(F.relu(self.expand(x))))) + x


def _check(model, x, policy, tol):
    cap = frontend.capture(model, [x], "dw", supported_ops=ops.supported())
    plan = P.plan(cap.graph, policy)
    out = simulate(plan, model_weights(model, cap.graph) or cap.weights, [x])[0].double()
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double())
    err = ((out - want).abs() / (1 + want.abs())).max().item()
    assert not torch.isnan(out).any() and err < tol, (policy, err)
    return plan, cap


@pytest.mark.parametrize("args", [dict(), dict(stride=2), dict(k=5, padding=2, dilation=2), dict(bias=False, act=False),
                                  dict(k=3, padding=0, stride=3)],
                         ids=["3x3", "stride2", "5x5-dilated", "plain", "no-pad"])
@pytest.mark.parametrize("policy", ["fp32", "tf32"])
def test_a_depthwise_convolution_alone(args, policy):
    torch.manual_seed(0)
    model, x = Depthwise(**args), torch.randn(2, 6, 11, 9)
    plan, _ = _check(model, x, policy, 1e-4 if policy == "fp32" else 1e-2)
    (dw,) = [t for t in plan.tasks if isinstance(t.params, DepthwiseSpec)]
    assert not any(isinstance(t.params, P.ConvSpec) for t in plan.tasks), "cuDNN is not asked"
    assert L.is_dense_in(dw.params.x, None), "a channels-first input is read as it lies"
    if args.get("act", True):
        assert dw.params.epilogue, "the activation after it is its epilogue hook"
        assert len([t for t in plan.tasks if t.phase == "run"]) == 1


def test_in_a_channels_last_region_it_keeps_the_layout():
    torch.manual_seed(1)
    model, x = Block(), torch.randn(2, 8, 10, 10)
    plan, _ = _check(model, x, "tf32", 1e-2)
    (dw,) = [t.params for t in plan.tasks if isinstance(t.params, DepthwiseSpec)]
    order = L.channels_last_order(4)
    assert L.is_dense_in(dw.x, order) and L.is_dense_in(dw.out, order)
    assert all(t.params.channels_last for t in plan.tasks if isinstance(t.params, P.ConvSpec))


def test_a_channel_multiplier_or_a_grouped_convolution_stays_cudnns():
    torch.manual_seed(2)
    for conv in (nn.Conv2d(4, 8, 3, padding=1, groups=4), nn.Conv2d(8, 8, 3, padding=1, groups=2)):
        x = torch.randn(1, conv.in_channels, 6, 6)
        plan, _ = _check(conv, x, "fp32", 1e-4)
        assert not any(isinstance(t.params, DepthwiseSpec) for t in plan.tasks)


def test_the_program_compiles(nvcc, tmp_path):
    torch.manual_seed(3)
    for model, x, policy in ((Depthwise(), torch.randn(2, 6, 11, 9), "fp32"),
                             (Block(), torch.randn(2, 8, 10, 10), "bf16")):
        cap = frontend.capture(model, [x], "dw", supported_ops=ops.supported())
        plan = P.plan(cap.graph, policy)
        src = C.code(plan, cap.graph, None, arch="sm_90")
        assert "stitch::launch_depthwise" in src.program_cu
        r = B.build(src.program_cu, arch="sm_90", cache=tmp_path, name="dw", policy=policy)
        assert r.ok, r.compile.output if r.compile else r.message
