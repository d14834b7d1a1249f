"""The narrow convolution kind (kinds/narrow_conv.py, templates/stitch/narrow_conv.cuh), under the conv
strategy ``narrow`` and by default where its result leaves the program: which convolutions are
offered it, its precision per policy, its layouts, checked by the plan interpreter against PyTorch
in float64, and its program compiled by nvcc (CPU only; tests/gpu/test_narrow_conv_gpu.py runs it)."""

from __future__ import annotations

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
from stitchcuda.kinds.narrow_conv import NarrowConvSpec
from stitchcuda.plan.constraints import Constraints
from tests.plan_sim import check_float64, where_narrow


class ConvAct(nn.Module):
    def __init__(self, conv: nn.Conv2d, act=True):
        super().__init__()
        self.conv, self.act = conv, act

    def forward(self, x):
        y = self.conv(x)
        return F.hardswish(torch.relu(y)) if self.act else y


class Region(nn.Module):
    """A wide 1x1 convolution (cuDNN's, channels-last under tensor cores), then a narrow one."""

    def __init__(self):
        super().__init__()
        self.wide = nn.Conv2d(24, 16, 1)
        self.narrow = nn.Conv2d(16, 32, 3, padding=1)

    def forward(self, x):
        return torch.sigmoid(self.narrow(torch.relu(self.wide(x))))


def narrow_everywhere(graph, precision=None) -> Constraints:
    """The conv strategy ``narrow`` on every convolution that offers it (and ``precision`` per node)."""
    return where_narrow(graph, "narrow", precision)


def _plan(model, x, policy, constraints=None):
    """The plan with the narrow kernel asked for wherever it is offered, unless ``constraints`` say otherwise."""
    cap = frontend.capture(model, [x], "nc", supported_ops=ops.supported())
    return P.plan(cap.graph, policy, constraints=narrow_everywhere(cap.graph) if constraints is None else constraints), cap


def _check(model, x, policy, tol, constraints=None):
    plan, cap = _plan(model, x, policy, constraints)
    check_float64(plan, model, cap, x, tol, policy)
    return plan


def _narrow(plan) -> list[NarrowConvSpec]:
    return [t.params for t in plan.tasks if isinstance(t.params, NarrowConvSpec)]


CONVS = {
    "8ch-3x3": lambda: nn.Conv2d(8, 24, 3, padding=1),
    "rgb-7x7-stride2": lambda: nn.Conv2d(3, 20, 7, stride=2, padding=3, bias=False),
    "5ch-dilated-70out": lambda: nn.Conv2d(5, 70, (3, 5), padding=(2, 1), dilation=(2, 1)),
    "16ch-3x3-no-pad": lambda: nn.Conv2d(16, 9, 3),
}


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("name", sorted(CONVS))
def test_a_narrow_convolution_alone(name, policy):
    torch.manual_seed(0)
    conv = CONVS[name]()
    model, x = ConvAct(conv), torch.randn(2, conv.in_channels, 19, 23)
    plan = _check(model, x, policy, 1e-4 if policy == "fp32" else 1e-2)
    (nc,) = _narrow(plan)
    assert not any(isinstance(t.params, P.ConvSpec) for t in plan.tasks), "cuDNN is not asked"
    assert L.is_dense_in(nc.x, None), "a channels-first input is read as it lies, no copy"
    assert nc.epilogue, "the activations after it are its epilogue hook"
    assert [t.strategy for t in plan.tasks if t.phase == "run"] == ["conv_template"], "one task"
    k = conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1]
    # split TF32 (about fp32's accuracy) at fp32, and under tf32 where the sum is short
    assert nc.split == (policy == "fp32" or k < 32)


def test_in_a_channels_last_region_it_reads_and_writes_channels_last():
    torch.manual_seed(1)
    plan = _check(Region(), torch.randn(2, 24, 10, 11), "tf32", 1e-2)
    (nc,) = _narrow(plan)
    order = L.channels_last_order(4)
    assert L.is_dense_in(nc.x, order), "the wide convolution's channels-last result, read in place"
    assert not nc.split, "K = 144: TF32 products"
    # at fp32 cuDNN runs channels-first, and the narrow one reads that
    (nc,) = _narrow(_check(Region(), torch.randn(2, 24, 10, 11), "fp32", 1e-4))
    assert L.is_dense_in(nc.x, None) and nc.split


@pytest.mark.parametrize("conv", [nn.Conv2d(17, 8, 3), nn.Conv2d(8, 16, 1), nn.Conv2d(8, 8, 3, groups=2),
                                  nn.ConvTranspose2d(8, 8, 3), nn.Conv2d(16, 8, 11)],
                         ids=["17-channels", "1x1", "grouped", "transposed", "sum-of-1936"])
def test_wide_pointwise_grouped_transposed_or_long_sums_are_not_offered_it(conv):
    torch.manual_seed(2)
    graph = frontend.capture(conv, [torch.randn(1, conv.in_channels, 13, 12)], "nc", supported_ops=ops.supported()).graph
    assert not any("narrow" in opts for _, opts in P.choices(graph).strategies)
    plan = _check(conv, torch.randn(1, conv.in_channels, 13, 12), "fp32", 1e-4)
    assert not _narrow(plan)


class ConvPool(nn.Module):
    """A narrow convolution whose result a max pool reads (not elementwise work)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 24, 3, padding=1)

    def forward(self, x):
        return F.max_pool2d(torch.relu(self.conv(x)), 2)


class ConvTwice(nn.Module):
    """A narrow convolution whose activated result is returned and also read by a second node."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 24, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return y, y.sum((2, 3))


def test_by_default_only_where_the_result_leaves_the_program():
    """By default (under tf32) the kernel takes a convolution whose result (after its elementwise
    epilogue) is returned and read by nothing else and whose sum is short; cuDNN's where a pool or a
    reduction reads it, under fp32, over longer sums, and wherever a cuDNN layout is asked for."""
    torch.manual_seed(3)
    model, x = ConvAct(nn.Conv2d(8, 24, 3, padding=1)), torch.randn(2, 8, 12, 12)
    cap = frontend.capture(model, [x], "nc", supported_ops=ops.supported())
    conv = next(n.name for n in cap.graph.nodes if ops.kind(n.op) == "conv")
    assert dict(P.choices(cap.graph).strategies)[conv] == ("auto", "channels_first", "channels_last", "narrow")
    for option in ("auto", "narrow"):
        (nc,) = _narrow(_check(model, x, "tf32", 1e-2, Constraints.of({}, (), {conv: option}, ())))
        assert len(nc.epilogue) > 1, "ReLU and hardswish in its epilogue"
    (nc,) = _narrow(_check(ConvAct(nn.Conv2d(8, 24, 3, padding=1), act=False), x, "tf32", 1e-2,
                           Constraints.of({}, (), {}, ())))
    assert not nc.epilogue, "a bare convolution that is the output"
    # under fp32 cuDNN's plan is channels-first, with no copies to save: cuDNN's by default
    plan = _check(model, x, "fp32", 1e-4, Constraints.of({}, (), {}, ()))
    assert not _narrow(plan) and any(isinstance(t.params, P.ConvSpec) for t in plan.tasks)
    # a sum over 96 terms (16 channels x 3 x 3): cuDNN's by default, the kernel under `narrow`
    wide, x16 = ConvAct(nn.Conv2d(16, 24, 3, padding=1)), torch.randn(2, 16, 12, 12)
    assert not _narrow(_check(wide, x16, "tf32", 1e-2, Constraints.of({}, (), {}, ())))
    assert _narrow(_check(wide, x16, "tf32", 1e-2))
    for option in ("channels_first", "channels_last"):
        plan = _check(model, x, "tf32", 1e-2, Constraints.of({}, (), {conv: option}, ()))
        assert not _narrow(plan) and any(isinstance(t.params, P.ConvSpec) for t in plan.tasks)
    for other in (ConvPool(), ConvTwice()):  # (two outputs: the float64 check takes one, so plans only)
        plan, _ = _plan(other, x, "tf32", Constraints.of({}, (), {}, ()))
        assert not _narrow(plan) and any(isinstance(t.params, P.ConvSpec) for t in plan.tasks)
        assert _narrow(_plan(other, x, "tf32")[0]), "offered under the strategy narrow"
    _check(ConvPool(), x, "tf32", 1e-2, Constraints.of({}, (), {}, ()))


def test_a_raised_convolution_computes_split():
    """The precision repair's raise (fp32 on the node inside a tf32 program) gives split-TF32 products."""
    torch.manual_seed(4)
    model, x = ConvAct(nn.Conv2d(8, 24, 3, padding=1)), torch.randn(2, 8, 12, 12)
    plan, cap = _plan(model, x, "tf32")
    (nc,) = _narrow(plan)
    assert not nc.split
    conv = next(n.name for n in cap.graph.nodes if ops.kind(n.op) == "conv")
    (nc,) = _narrow(_check(model, x, "tf32", 1e-4, narrow_everywhere(cap.graph, {conv: "fp32"})))
    assert nc.split


def test_the_program_compiles(nvcc, tmp_path):
    torch.manual_seed(5)
    for model, x, policy in ((ConvAct(CONVS["5ch-dilated-70out"]()), torch.randn(2, 5, 19, 23), "fp32"),
                             (Region(), torch.randn(2, 24, 10, 11), "tf32")):
        cap = frontend.capture(model, [x], "nc", supported_ops=ops.supported())
        plan = P.plan(cap.graph, policy, constraints=narrow_everywhere(cap.graph))
        src = C.code(plan, cap.graph, None, arch="sm_90")
        assert "stitch::launch_narrow_conv<" in src.program_cu
        r = B.build(src.program_cu, arch="sm_90", cache=tmp_path, name="nc", policy=policy)
        assert r.ok, r.compile.output if r.compile else r.message
