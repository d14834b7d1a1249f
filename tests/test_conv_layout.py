"""Layout as a plan decision: channels-last convolution regions (CPU, the plan interpreter).

Under a policy with tensor cores a 2-d / 3-d convolution runs channels-last; its input's producer
writes channels-last (*place*), elementwise groups and pooling keep the layout, weights are laid
out once at create, and the region converts only where it starts (the program's input) and ends.
Every plan here runs in the plan interpreter against PyTorch in float64, so each channels-last
path (convolution, pooling, elementwise, batch-norm statistics, joins) is checked by its twin.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from stitchcuda import frontend
from stitchcuda import layout as L
from stitchcuda import ops
from stitchcuda import plan as P
from stitchcuda.pipeline import model_weights
from tests.plan_sim import simulate, where_narrow


class Net(nn.Module):
    """conv -> batch norm -> relu -> max pool -> conv + bias -> relu -> join with a 1x1 branch ->
    average pool: what a small CNN's body does."""

    def __init__(self, c: int = 8, spatial: int = 2):
        super().__init__()
        conv, bn, pool = ((nn.Conv2d, nn.BatchNorm2d, nn.MaxPool2d) if spatial == 2 else
                          (nn.Conv3d, nn.BatchNorm3d, nn.MaxPool3d))
        self.c1 = conv(3, c, 3, padding=1, bias=False)
        self.bn = bn(c)
        self.pool = pool(2)
        self.c2 = conv(c, c, 3, padding=1)
        self.c3 = conv(c, c, 3, padding=1)
        self.spatial = spatial

    def forward(self, x):
        y = self.pool(torch.relu(self.bn(self.c1(x))))
        z = torch.cat([torch.relu(self.c2(y)), torch.sigmoid(self.c3(y))], dim=1)
        mean = F.adaptive_avg_pool2d if self.spatial == 2 else F.adaptive_avg_pool3d
        return mean(z * 2.0, 2)


def _plan(model: nn.Module, x: torch.Tensor, policy: str, constraints: P.Constraints | None = None):
    cap = frontend.capture(model, [x], "net", supported_ops=ops.supported())
    return P.plan(cap.graph, policy, constraints=constraints), cap


def _simulated_error(model, x, plan, cap) -> float:
    out = simulate(plan, model_weights(model, cap.graph) or cap.weights, [x])[0].double()
    model = copy.deepcopy(model).double()
    with torch.no_grad():
        want = model(x.double())
    assert not torch.isnan(out).any(), "output not fully written"
    return ((out - want).abs() / (1 + want.abs())).max().item()


def _convs(plan):
    return [t for t in plan.tasks if isinstance(t.params, P.ConvSpec)]


@pytest.mark.parametrize("spatial", [2, 3])
@pytest.mark.parametrize("policy", ["tf32", "bf16"])
def test_tensor_core_policies_plan_the_region_channels_last(spatial, policy):
    torch.manual_seed(0)
    model = Net(spatial=spatial)
    x = torch.randn(2, 3, *([8] * spatial))
    plan, cap = _plan(model, x, policy)
    convs = _convs(plan)
    assert len(convs) == 3 and all(t.params.channels_last for t in convs)
    for t in convs:
        order = L.channels_last_order(2 + spatial)
        assert all(L.is_dense_in(v, order) for v in (t.params.x, t.params.w, t.params.out))
    pools = [t.params for t in plan.tasks if isinstance(t.params, P.PoolSpec)]
    assert pools and all(p.channels_last for p in pools), "pooling keeps the layout"
    conversions = [t for t in plan.run_tasks if isinstance(t.params, P.CopySpec) and t.name.startswith(("copy_", "cast_"))]
    assert [t.inputs for t in conversions] == [("in0",)], "one conversion where the region starts (the input)"
    assert all(t.phase == "create" for t in plan.tasks if t.name.startswith(("copy_", "cast_")) and "weight" in t.name), \
        "weights are laid out once, at create"
    tol = 2e-2 if policy == "bf16" else 1e-2
    assert _simulated_error(model, x, plan, cap) < tol


def test_fp32_keeps_channels_first():
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(2, 3, 8, 8)
    plan, cap = _plan(model, x, "fp32")
    assert not any(t.params.channels_last for t in _convs(plan))
    assert not any(t.params.channels_last for t in plan.tasks if isinstance(t.params, P.PoolSpec))
    assert _simulated_error(model, x, plan, cap) < 1e-4


def test_a_strategy_constraint_chooses_the_layout():
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(2, 3, 8, 8)
    plan, cap = _plan(model, x, "tf32")
    first = next(t for t in _convs(plan)).covers[0]
    choices = P.choices(cap.graph)
    assert ("channels_first" in dict(choices.strategies)[first])
    forced, _ = _plan(model, x, "tf32", P.Constraints.of(strategy={first: "channels_first"}))
    by = {t.covers[0]: t.params.channels_last for t in _convs(forced)}
    assert by[first] is False and any(by.values()), "only the constrained convolution changes"
    assert _simulated_error(model, x, forced, cap) < 1e-2
    on, _ = _plan(model, x, "fp32", P.Constraints.of(strategy={first: "channels_last"}))
    assert {t.covers[0]: t.params.channels_last for t in _convs(on)}[first] is True
    assert _simulated_error(model, x, on, cap) < 1e-4


class Lone(nn.Module):
    def __init__(self, cin: int, cout: int, then=None):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3)
        self.then = then

    def forward(self, x):
        y = self.conv(x)
        return self.then(y) if self.then else y


@pytest.mark.parametrize("cout, then, first", [
    (128, None, True),                   # 5.6x the input's bytes, returned as computed: channels-first
    (32, None, False),                   # 1.4x: the copies cost less than cuDNN's channels-first engines
    (128, lambda y: y + torch.sigmoid(y), False),  # read by other nodes: the layout change fuses into them
])
def test_a_widening_convolution_alone_stays_channels_first(cout, then, first):
    torch.manual_seed(0)
    model = Lone(16, cout, then)
    x = torch.randn(1, 16, 12, 12)  # 16 x 9 taps: past the narrow kernel's sums (cuDNN's)
    plan, cap = _plan(model, x, "tf32")
    (conv,) = _convs(plan)
    assert conv.params.channels_last is not first
    copies = [t for t in plan.run_tasks if isinstance(t.params, P.CopySpec)]
    if first:
        assert not copies, "the caller's input and output, as they are"
        assert conv.params.x.buffer == "in0" and conv.params.out.buffer == "out0"
    assert _simulated_error(model, x, plan, cap) < 1e-2
    if first:  # under bf16 the result is cast back by a pass anyway, which changes its layout too
        (conv,) = _convs(_plan(model, x, "bf16")[0])
        assert conv.params.channels_last


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_channels_last_pooling_matches_pytorch(mode):
    """The channels-last pooling path alone: strided, padded, dilated windows over a channels-last
    convolution's result, with the divisor rules of average pooling."""

    class Pool(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 6, 3)

        def forward(self, x):
            y = self.conv(x)
            if mode == "max":
                return F.max_pool2d(y, 3, stride=2, padding=1, dilation=1, ceil_mode=True)
            return F.avg_pool2d(y, 3, stride=2, padding=1, count_include_pad=False, ceil_mode=True)

    torch.manual_seed(1)
    model = Pool()
    x = torch.randn(2, 4, 11, 9)
    plan, cap = _plan(model, x, "tf32")
    (pool,) = [t.params for t in plan.tasks if isinstance(t.params, P.PoolSpec)]
    assert pool.channels_last and pool.x.ndim == 5
    assert _simulated_error(model, x, plan, cap) < 1e-2


class ConvTail(nn.Module):
    """conv -> hardswish -> (max pool -> mish): a region that ends in an elementwise group, or in
    a pool whose hooks are functions of one tensor made of several-operand nodes."""

    def __init__(self, pool: bool):
        super().__init__()
        self.conv = nn.Conv2d(5, 12, 3)
        self.pool = pool

    def forward(self, x):
        y = self.conv(x) - 0.25
        y = y * torch.clamp(y + 3, 0, 6) / 6  # hardswish written out: x * clamp(...) has two operands
        if self.pool:
            y = F.max_pool2d(y, 2)
        return y * torch.tanh(F.softplus(y))  # mish: exp, log1p, gt, where, tanh, mul


def test_a_group_ending_the_region_writes_the_output_layout_itself():
    """The group reads the convolution's channels-last result and writes the channels-first graph
    output in one pass (the template's tiled path), with no converting copy after it. (cuDNN's
    convolution asked for: by default the narrow kernel takes this one, kinds/narrow_conv.py.)"""
    torch.manual_seed(2)
    model = ConvTail(pool=False)
    x = torch.randn(2, 5, 13, 11)
    graph = frontend.capture(model, [x], "net", supported_ops=ops.supported()).graph
    cudnn = where_narrow(graph, "channels_last")
    assert cudnn.strategy, "a convolution the narrow kernel could take"
    plan, cap = _plan(model, x, "tf32", cudnn)
    (conv,) = _convs(plan)
    assert conv.params.channels_last
    last = plan.run_tasks[-1]
    assert isinstance(last.params, P.EwSpec), [t.name for t in plan.run_tasks]
    assert not L.is_channels_last(last.params.out) and any(L.is_channels_last(v) for v in last.params.inputs)
    assert not any(isinstance(t.params, P.CopySpec) and t.name.startswith("output_") for t in plan.run_tasks)
    assert _simulated_error(model, x, plan, cap) < 1e-2


def test_several_operand_hooks_fuse_into_the_pool():
    """hardswish before the pool and mish after it become its prologue and epilogue hooks: the
    convolution's result is read once, by the pool."""
    torch.manual_seed(3)
    model = ConvTail(pool=True)
    x = torch.randn(2, 5, 13, 11)
    for policy, tol in (("tf32", 1e-2), ("fp32", 1e-4)):
        plan, cap = _plan(model, x, policy)
        (pool,) = [t for t in plan.tasks if isinstance(t.params, P.PoolSpec)]
        ew = [t for t in plan.run_tasks if isinstance(t.params, P.EwSpec)]
        assert not ew, f"{policy}: {[t.covers for t in ew]} left out of the pool's hooks"
        # (the "- 0.25" is the convolution's bias now: rewrite fold_channel_affine; mish's six
        # ops are one now: rewrite mish_from_parts)
        assert len(pool.params.prologue) >= 4 and [i.op for i in pool.params.epilogue] == ["mish"]
        assert _simulated_error(model, x, plan, cap) < tol, policy


def test_a_hook_takes_no_second_source():
    """x * w after a pool, w another input of the same shape, is not a function of the pool's
    result alone: it stays out of the hook (and the plan stays right)."""

    class TwoSources(nn.Module):
        def forward(self, x, w):
            y = F.max_pool2d(x, 2)
            return y * torch.sigmoid(y) * w

    torch.manual_seed(4)
    x, w = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 4, 4)
    cap = frontend.capture(TwoSources(), [x, w], "two", supported_ops=ops.supported())
    plan = P.plan(cap.graph, "fp32")
    (pool,) = [t for t in plan.tasks if isinstance(t.params, P.PoolSpec)]
    covered = set(pool.covers)
    muls = [n.name for n in cap.graph.nodes if n.op.endswith("mul.Tensor")]
    assert muls and muls[-1] not in covered, "the product with w has a second source"
    out = simulate(plan, cap.weights, [x, w])[0].double()
    y = F.max_pool2d(x.double(), 2)
    assert torch.allclose(out, y * torch.sigmoid(y) * w.double(), atol=1e-5)


def test_a_lone_pointwise_convolution_is_a_gemm_under_tensor_cores():
    """A 1x1 convolution with no convolution beside it is a batched GEMM on its own channels-first
    layout under tf32 (no conversion in or out); one inside a convolution region stays cuDNN's,
    channels-last."""

    class Lone(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(6, 10, 1, bias=False)

        def forward(self, x):
            return self.c(torch.tanh(x)) * 2.0

    class Region(nn.Module):  # MobileNet's inverted residual: a 1x1 convolution after conv, BN, ReLU6
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(6, 6, 3, padding=1)
            self.bn = nn.BatchNorm2d(6)
            self.c = nn.Conv2d(6, 10, 1, bias=False)

        def forward(self, x):
            return self.c(F.relu6(self.bn(self.a(x))))

    torch.manual_seed(5)
    x = torch.randn(2, 6, 7, 9)
    lone = Lone()
    plan, cap = _plan(lone, x, "tf32")
    assert not _convs(plan), [t.name for t in plan.run_tasks]
    assert any(isinstance(t.params, P.GemmSpec) for t in plan.run_tasks)
    assert not any(isinstance(t.params, P.CopySpec) for t in plan.run_tasks), "no layout conversion"
    assert _simulated_error(lone, x, plan, cap) < 1e-2
    model = Region()
    plan, cap = _plan(model, x, "tf32")
    convs = _convs(plan)
    assert len(convs) == 2 and all(t.params.channels_last for t in convs)
    assert _simulated_error(model, x, plan, cap) < 1e-2


class ChannelOps(nn.Module):
    """A 3-d convolution, then a reduction over depth (kept or squeezed) or a softmax over the
    channels, then a pool: ops over one axis of the channels-last region."""

    def __init__(self, what: str):
        super().__init__()
        self.c = nn.Conv3d(3, 6, 3, padding=1)
        self.what = what

    def forward(self, x):
        y = self.c(x)
        if self.what == "softmax":
            return F.max_pool3d(torch.softmax(y, dim=1), 2)
        if self.what == "mean_keepdim":
            return torch.softmax(y.mean(dim=2, keepdim=True) + 0.5, dim=1)
        return torch.amin(y, dim=2) * 2.0  # (squeezed)


@pytest.mark.parametrize("what", ["softmax", "mean_keepdim", "min_squeezed"])
def test_ops_over_one_axis_keep_the_channels_last_layout(what):
    """A softmax over the channels of channels-last data reads and writes its rows in place of
    the layout (no copy back to channels-first before the pool); a reduction over depth groups the
    kept dims by their strides (N | H, W, C) and writes its result channels-last (no copy of the
    convolution's output to make the groups collapse). Only the region's ends convert."""
    torch.manual_seed(3)
    model = ChannelOps(what)
    x = torch.randn(2, 3, 4, 5, 6)
    plan, cap = _plan(model, x, "tf32")
    (conv,) = _convs(plan)
    assert conv.params.channels_last
    names = [t.name for t in plan.run_tasks]
    copies = [t for t in plan.run_tasks if isinstance(t.params, P.CopySpec)]
    inner = [t.name for t in copies if t.inputs != ("in0",) and not t.name.startswith("output_")
             and plan.run_tasks.index(t) < len(plan.run_tasks) - 1]
    assert not inner, f"copies inside the region: {inner} of {names}"
    if what != "softmax":
        (red,) = [t.params for t in plan.run_tasks if isinstance(t.params, P.AxisSpec)]
        assert red.inner == 5 * 6 * 6, "the kept H, W, C collapse into one inner run"
    assert _simulated_error(model, x, plan, cap) < 1e-2


class _SoftmaxOverChannels(nn.Module):
    """A convolution, a softmax (or log-softmax, scaled first) over the channels, then a pool."""

    def __init__(self, op: str, spatial: int):
        super().__init__()
        self.c = (nn.Conv2d if spatial == 2 else nn.Conv3d)(3, 6, 3, padding=1)
        self.op, self.spatial = op, spatial

    def forward(self, x):
        y = self.c(x)
        y = torch.softmax(y, dim=1) if self.op == "softmax" else torch.log_softmax(y * 0.5, dim=1) * 2.0
        return (F.max_pool2d if self.spatial == 2 else F.max_pool3d)(y, 2)


@pytest.mark.parametrize("spatial", [2, 3])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_over_channels_first_channels_is_read_in_place(op, spatial):
    """fp32 keeps a convolution channels-first; the softmax over its channels then reads and
    writes [N, C, spatial] where it lies (the axis softmax), with no copy each way; the scale
    after it is its hook (the one before goes to the convolution's epilogue)."""
    torch.manual_seed(5)
    model = _SoftmaxOverChannels(op, spatial)
    x = torch.randn(2, 3, *([8] * spatial))
    plan, cap = _plan(model, x, "fp32")
    (conv,) = _convs(plan)
    assert not conv.params.channels_last
    (sm,) = [t.params for t in plan.run_tasks if isinstance(t.params, P.AxisRowSpec)]
    assert (sm.op, sm.outer, sm.red, sm.inner) == (op, 2, 6, 8 ** spatial)
    assert (sm.in_so, sm.in_sr, sm.in_si) == (6 * 8 ** spatial, 8 ** spatial, 1)
    if op == "log_softmax":
        assert sm.epilogue, "the scale after it is its hook"
    copies = [t.name for t in plan.run_tasks if isinstance(t.params, P.CopySpec)]
    assert not copies, f"copies around the softmax: {copies}"
    assert _simulated_error(model, x, plan, cap) < 1e-5


def test_softmax_over_few_inner_elements_goes_through_rows():
    """Fewer inner elements than a warp (a [2, 6, 4] softmax over dim 1): rows after a copy."""
    model = _SoftmaxOverChannels("softmax", 2)
    x = torch.randn(2, 3, 2, 2)
    plan, cap = _plan(model, x, "fp32")
    assert not [t for t in plan.run_tasks if isinstance(t.params, P.AxisRowSpec)]
    assert [t for t in plan.run_tasks if isinstance(t.params, P.RowSpec)]
    assert _simulated_error(model, x, plan, cap) < 1e-5


class _Inception(nn.Module):
    """Three convolutions and a max pool over one channels-first input, joined along channels."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(8, 4, 1)
        self.b = nn.Sequential(nn.Conv2d(8, 3, 1), nn.Conv2d(3, 5, 3, padding=1))
        self.pool = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), nn.Conv2d(8, 2, 1))

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x), self.pool(x)], 1)


def test_one_input_converted_once_for_every_reader():
    """The input is laid out channels-last once for the convolutions that read it, and the pool
    beside them pools that copy (writing channels-last for the convolution after it): one copy in,
    the join out."""
    torch.manual_seed(6)
    model = _Inception()
    x = torch.randn(2, 8, 6, 6)
    plan, cap = _plan(model, x, "tf32")
    copies = [t for t in plan.run_tasks if isinstance(t.params, P.CopySpec)]
    assert [t.name for t in copies] == ["copy_x", "cat"], [t.name for t in plan.run_tasks]
    (pool,) = [t.params for t in plan.run_tasks if isinstance(t.params, P.PoolSpec)]
    assert pool.channels_last
    assert _simulated_error(model, x, plan, cap) < 1e-2


class _ConvAndPoolOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.c, self.p = nn.Conv2d(32, 16, 3, padding=1), nn.MaxPool2d(3, 1, 1)

    def forward(self, x):
        return self.c(x), self.p(x)


def test_a_pool_returned_channels_first_pools_the_input_as_it_lies():
    """Beside a convolution's channels-last copy of x, a pool whose result is the program's
    (channels-first) output pools x as it lies: pooling the copy would need a copy back."""
    torch.manual_seed(7)
    model = _ConvAndPoolOut()
    x = torch.randn(2, 32, 6, 6)
    plan, cap = _plan(model, x, "tf32")
    (pool,) = [t.params for t in plan.run_tasks if isinstance(t.params, P.PoolSpec)]
    assert not pool.channels_last
    copies = [t.name for t in plan.run_tasks if isinstance(t.params, P.CopySpec)]
    assert copies == ["copy_x", "output_convolution"], copies
    out = simulate(plan, model_weights(model, cap.graph) or cap.weights, [x])
    with torch.no_grad():
        want = [w.double() for w in copy.deepcopy(model).double()(x.double())]
    assert max(((o.double() - w).abs() / (1 + w.abs())).max().item() for o, w in zip(out, want)) < 1e-2


class _StemAndSqueeze(nn.Module):
    """A stem over RGB (sums of 27), a 1x1 convolution of 16 channels over the whole map (sums of 16,
    a large output), a 3x3 one of 8 channels (sums of 72), and a squeeze-excitation pair on the
    pooled map (96 -> 8 -> 96: sums of 96, then 8 on a tiny output)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.pw = nn.Conv2d(16, 96, 1)
        self.body = nn.Conv2d(96, 96, 3, padding=1, groups=12)
        self.squeeze, self.expand = nn.Conv2d(96, 8, 1), nn.Conv2d(8, 96, 1)

    def forward(self, x):
        y = self.body(torch.relu(self.pw(torch.relu(self.stem(x)))))
        s = torch.sigmoid(self.expand(torch.relu(self.squeeze(F.adaptive_avg_pool2d(y, 1)))))
        return y * s


def test_short_sums_compute_at_fp32_under_tf32():
    """Under tf32 a convolution whose sums are shorter than a tensor-core K tile computes at fp32
    (channels-last, as a raised one), where its filter has taps (the stem) or its output is small
    (the expansion); the 1x1 convolution over the map, the grouped 3x3 and the squeeze stay TF32.
    Under fp32 nothing changes; the plan still computes the reference."""
    from stitchcuda.kinds.conv import SHORT_SUM

    torch.manual_seed(4)
    model, x = _StemAndSqueeze(), torch.randn(2, 3, 64, 64)  # the 1x1 output: 196,608 elements
    plan, cap = _plan(model, x, "tf32")
    convs = {t.params.w.shape[1] * t.params.w.shape[2] * t.params.w.shape[3]: t.params
             for t in plan.tasks if isinstance(t.params, P.ConvSpec)}
    assert sorted(convs) == [8, 16, 27, 72, 96], convs
    assert {k: c.policy for k, c in convs.items()} == {27: "fp32", 8: "fp32", 16: "tf32", 72: "tf32", 96: "tf32"}
    assert all(c.channels_last for c in convs.values())
    assert all(k >= SHORT_SUM or c.policy == "tf32" for k, c in convs.items() if k not in (27, 8))
    assert _simulated_error(model, x, plan, cap) < 1e-2
    from stitchcuda.workflow.proposers import PrecisionRepair

    suspects = {t for t, _ in PrecisionRepair().suspects(plan)}
    assert suspects == {t.name for t in plan.tasks if isinstance(t.params, P.ConvSpec) and t.params.policy == "tf32"}, \
        "the precision repair suspects only what rounds"
    plan32, _ = _plan(model, x, "fp32")
    assert {t.params.policy for t in plan32.tasks if isinstance(t.params, P.ConvSpec)} == {"fp32"}


class ConvActBn(nn.Module):
    """conv -> an activation of one tensor -> training-mode batch norm (batch statistics)."""

    def __init__(self, act: str, keep: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3)
        self.bn = nn.BatchNorm2d(6)
        self.act, self.keep = act, keep

    def forward(self, x):
        y = self.conv(x)
        y = y * torch.tanh(F.softplus(y)) if self.act == "mish" else torch.relu(y) * 0.5
        z = self.bn(y)
        return (z, y) if self.keep else z


@pytest.mark.parametrize("act", ["mish", "relu"])
@pytest.mark.parametrize("policy, tol", [("tf32", 1e-2), ("fp32", 1e-4)])
def test_batch_statistics_recompute_the_activation_instead_of_writing_it(act, policy, tol):
    """The activation between a convolution and a training-mode batch norm is the statistics'
    prologue hook, and the affine recomputes it: the convolution's result is read twice and the
    activation's result is never written (one elementwise pass: the affine)."""
    torch.manual_seed(5)
    model = ConvActBn(act).train()
    x = torch.randn(3, 4, 12, 10)
    plan, cap = _plan(model, x, policy)
    (stats,) = [t for t in plan.tasks if isinstance(t.params, P.BnStatsSpec)]
    (conv,) = _convs(plan)
    assert stats.params.prologue, "the activation is not the statistics' hook"
    assert stats.params.x.buffer == conv.params.out.buffer, "the statistics do not read the convolution's result"
    ew = [t for t in plan.run_tasks if isinstance(t.params, P.EwSpec)]
    assert len(ew) == 1, [t.covers for t in ew]
    assert _simulated_error(model, x, plan, cap) < tol


def test_an_activation_used_elsewhere_is_written_once():
    """When the activation's result is also a graph output it is materialised, and the statistics
    read it as it is (no hook, no copy of its nodes)."""
    torch.manual_seed(6)
    model = ConvActBn("mish", keep=True).train()
    x = torch.randn(3, 4, 12, 10)
    plan, cap = _plan(model, x, "fp32")
    (stats,) = [t for t in plan.tasks if isinstance(t.params, P.BnStatsSpec)]
    assert not stats.params.prologue
    tanh = [n.name for n in cap.graph.nodes if n.op.endswith("tanh.default")]
    assert tanh and sum(tanh[0] in t.covers for t in plan.tasks) == 1, "the activation is computed twice"
    out = simulate(plan, model_weights(model, cap.graph) or cap.weights, [x])
    want = copy.deepcopy(model).double()(x.double())
    for o, w in zip(out, want):
        assert torch.allclose(o.double(), w, atol=1e-4)


def test_channels_last_batch_statistics_take_sixteen_byte_lanes():
    """A channels-last view whose channels and strides are multiples of 4 floats is read 16 bytes a
    lane; the rows are cut into about 1024 blocks, none under 64 rows, at most 65535 slices (the
    grid's y). Other views keep one channel a lane."""
    from stitchcuda.kinds.norm import _bn_splits, bn_vec_width

    v = L.View(0, 0, (64, 128, 126, 126), (2032128, 1, 16128, 128), "float32")
    assert bn_vec_width(v, 128, 2032128, 1, 128) == 4
    assert bn_vec_width(L.View(0, 0, (2, 10, 5, 5), (250, 1, 50, 10), "float32"), 10, 250, 1, 10) == 0
    assert bn_vec_width(L.View(0, 2, (64, 128, 126, 126), (2032128, 1, 16128, 128), "float32"), 128, 2032128, 1,
                        128) == 0, "an offset that breaks the 16-byte packs"
    assert bn_vec_width(L.View(0, 0, (4, 64, 9, 9), (5184, 1, 576, 64), "bfloat16"), 64, 5184, 1, 64) == 8
    rows = 64 * 126 * 126
    splits = _bn_splits(rows, 128, False, 4)
    per = -(-rows // splits)
    assert 512 <= splits <= 1024 and per >= 64
    assert [_bn_splits(64 * b, 8, False, 4) for b in (1, 2, 7, 16)] == [1, 2, 7, 16], "linear in a small batch"
    assert _bn_splits(10**9, 4, False, 4) <= 65535


def test_a_raised_pointwise_convolution_is_costed_as_the_gemm_it_may_run_as():
    """A raised channels-last 1x1 convolution may run as the fp32 GEMM (st_conv_split_tf32 times it):
    its floor counts x and w read once, not the split operands written three times over; a 3x3 one
    still counts the split's bytes."""
    from stitchcuda.device import H100
    from stitchcuda.kinds.conv import ConvSpec, cost, pointwise_gemm
    from stitchcuda.layout import View

    def spec(k: int) -> ConvSpec:
        x = View("x", 0, (8, 32, 28, 28), (32 * 28 * 28, 1, 28 * 32, 32), "float32")
        w = View("w", 0, (64, 32, k, k), (32 * k * k, 1, k * 32, 32), "float32")
        y = View("y", 0, (8, 64, 28, 28), (64 * 28 * 28, 1, 28 * 64, 64), "float32")
        return ConvSpec("conv", "fp32", x, w, y, batch=8, in_channels=32, out_channels=64, groups=1, in_size=(28, 28),
                        kernel=(k, k), stride=(1, 1), padding=((k - 1) // 2,) * 2, dilation=(1, 1),
                        output_padding=(0, 0), channels_last=True, split_tf32=True)

    ceil = H100
    one, three = spec(1), spec(3)
    assert pointwise_gemm(one) and not pointwise_gemm(three)
    x_b, w1_b, y_b = 8 * 32 * 28 * 28 * 4, 64 * 32 * 4, 8 * 64 * 28 * 28 * 4
    assert cost(one, ceil)[1] == x_b + w1_b + y_b
    assert cost(three, ceil)[1] == 7 * (x_b + 9 * w1_b) + y_b
