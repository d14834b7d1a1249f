"""A GEMM or convolution the precision repair raises to fp32 inside a TF32 program runs as a split
product on tensor cores (CPU: plan, Coder, plan interpreter, nvcc).

The loop's precision repair raises the nodes of rounding tasks to fp32 through constraints. In a
TF32 program such a GEMM becomes three bf16 products of split operands in one GEMM
(``st_gemm_split_bf16``, about 2^-16 relative error at 1.5x a TF32 GEMM's time) or, where the GEMM
node's strategy option asks for ``tf32x3`` (the repair's next step), three TF32 products
(``st_gemm_split_tf32``, fp32-grade); a chained epilogue runs after it in the epilogue kernel. An
fp32 program keeps exact fp32 GEMMs. A raised convolution becomes one TF32 convolution over split
operands (``st_conv_split_tf32``), channels-last like the TF32 ones.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from stitchcuda import code as C
from stitchcuda import frontend, ops
from stitchcuda import plan as P
from stitchcuda.pipeline import model_weights
from tests.plan_sim import simulate


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(24, 32)
        self.b = nn.Linear(32, 16)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class Chained(nn.Module):
    """A GEMM whose epilogue is a chain of the runtime's ops (a scale and a tanh after the bias)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(24, 32)

    def forward(self, x):
        return torch.tanh(self.a(x) * 0.5)


class ConvNet(nn.Module):
    """Two convolutions (the second grouped, with a ReLU for cuDNN's fused epilogue) and a
    transposed one. Sums of 36: under tf32 each rounds unless raised (a shorter sum computes at
    fp32 as planned, kinds/conv.py)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(4, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, stride=2, groups=2)
        self.c = nn.ConvTranspose2d(8, 4, 2, stride=2)

    def forward(self, x):
        return self.c(torch.relu(self.b(self.a(x))))


_RAISED = (ops.A + "linear.default", ops.A + "addmm.default", ops.A + "mm.default", ops.A + "convolution.default")


def _plan(model, x, policy, raise_all: bool, parts: str | None = None):
    cap = frontend.capture(model, [x], "m", supported_ops=ops.supported())
    gemm_nodes = [n.name for n in cap.graph.nodes if n.op in _RAISED]
    assert gemm_nodes, [n.op for n in cap.graph.nodes]
    strategy = {n: parts for n in gemm_nodes if "conv" not in n} if parts else None
    constraints = P.Constraints.of(precision={n: "fp32" for n in gemm_nodes}, strategy=strategy) \
        if raise_all else None
    return P.plan(cap.graph, policy, constraints=constraints), cap


def _gemms(plan):
    return [t for t in plan.run_tasks if isinstance(t.params, P.GemmSpec)]


@pytest.mark.parametrize("parts,split", [(None, "bf16"), ("bf16x3", "bf16"), ("tf32x3", "tf32")])
def test_a_raised_gemm_in_a_tf32_program_is_a_split_product(parts, split):
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(5, 24)
    plan, cap = _plan(model, x, "tf32", raise_all=True, parts=parts)
    gemms = _gemms(plan)
    assert gemms and all(t.params.policy == "fp32" and t.params.split == split for t in gemms), \
        [(t.name, t.params.policy, t.params.split) for t in gemms]
    assert all(f"three {split.upper()} products" in t.note for t in gemms)
    src = C.code(plan, cap.graph, None, arch="sm_90").program_cu
    assert src.count(f"st_gemm_split_{split}(&g, stream)") == len(gemms)
    assert P.Plan.from_json(plan.to_json()).to_json() == plan.to_json()
    out = simulate(plan, model_weights(model, cap.graph) or cap.weights, [x])[0].double()
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double())
    assert torch.allclose(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("policy,raise_all", [("tf32", False), ("fp32", False), ("fp32", True)])
def test_no_split_product_where_nothing_was_raised_or_the_program_is_fp32(policy, raise_all):
    torch.manual_seed(0)
    plan, cap = _plan(Mlp(), torch.randn(5, 24), policy, raise_all)
    gemms = _gemms(plan)
    assert gemms and not any(t.params.split for t in gemms)
    assert "st_gemm_split_" not in C.code(plan, cap.graph, None, arch="sm_90").program_cu


def test_a_raised_gemm_with_a_chained_epilogue_is_split_then_its_chain_applied():
    torch.manual_seed(0)
    model, x = Chained(), torch.randn(5, 24)
    plan, cap = _plan(model, x, "tf32", raise_all=True)
    gemms = _gemms(plan)
    assert gemms and all(t.params.chain and t.params.split == "bf16" for t in gemms), \
        [(t.params.chain, t.params.split) for t in gemms]
    src = C.code(plan, cap.graph, None, arch="sm_90").program_cu
    assert src.count("st_gemm_split_bf16(&g, stream)") == len(gemms) and "st_epilogue_apply(&e, stream)" in src
    assert "st_gemm_epilogue" not in src
    out = simulate(plan, model_weights(model, cap.graph) or cap.weights, [x])[0].double()
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double())
    assert torch.allclose(out, want, rtol=1e-6, atol=1e-6)


def test_the_split_gemms_cost_three_products_of_their_parts():
    """The cost model charges a split GEMM three products at its parts' rate (bf16's twice TF32's)
    and the split operands it writes: more time than the TF32 GEMM, the bf16 form less than the TF32 form."""
    from stitchcuda.device import H100 as ceil
    from stitchcuda.kinds import gemm as K

    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(512, 512)), torch.randn(256, 512)
    tf32 = _gemms(_plan(model, x, "tf32", raise_all=False)[0])[0].params
    bf16 = _gemms(_plan(model, x, "tf32", raise_all=True)[0])[0].params
    tf32x3 = _gemms(_plan(model, x, "tf32", raise_all=True, parts="tf32x3")[0])[0].params

    def seconds(spec):
        f, b, peak = K.cost(spec, ceil)
        return max(f / peak, b / ceil.bandwidth)

    assert seconds(tf32) < seconds(bf16) < seconds(tf32x3)


@pytest.mark.parametrize("model,parts", [(Mlp, "tf32x3"), (Chained, None)])
def test_the_split_program_compiles(nvcc, tmp_path, model, parts):
    from stitchcuda import build as B

    plan, cap = _plan(model(), torch.randn(5, 24), "tf32", raise_all=True, parts=parts)
    r = B.build(C.code(plan, cap.graph, None, arch="sm_90").program_cu, arch="sm_90", cache=tmp_path)
    assert r.ok, r.compile.output[:2000] if r.compile else r.message


def _convs(plan):
    return [t for t in plan.run_tasks if isinstance(t.params, P.ConvSpec)]


def test_a_raised_convolution_in_a_tf32_program_is_the_split_convolution():
    torch.manual_seed(0)
    model, x = ConvNet(), torch.randn(2, 4, 10, 10)
    plan, cap = _plan(model, x, "tf32", raise_all=True)
    convs = _convs(plan)
    assert len(convs) == 3 and all(t.params.policy == "fp32" and t.params.split_tf32 for t in convs), \
        [(t.name, t.params.policy, t.params.split_tf32) for t in convs]
    # channels-last, as the TF32 convolutions around a raised one are: no layout change for it
    assert all(t.params.channels_last for t in convs)
    assert all("split operands" in t.note for t in convs)
    src = C.code(plan, cap.graph, None, arch="sm_90").program_cu
    assert src.count("st_conv_split_tf32(&a, stream)") == 3 and "st_conv(&a" not in src
    assert P.Plan.from_json(plan.to_json()).to_json() == plan.to_json()
    out = simulate(plan, model_weights(model, cap.graph) or cap.weights, [x])[0].double()
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double())
    assert torch.allclose(out, want, rtol=1e-6, atol=1e-6)


def test_the_split_convolution_costs_three_tf32_products():
    """The cost model charges the split convolution three TF32 products and its wide operands: more
    than the TF32 convolution, less than fp32 on the SIMT units where the convolution is large."""
    from stitchcuda.device import H100 as ceil
    from stitchcuda.kinds import conv as K

    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1)), torch.randn(8, 64, 56, 56)
    split = _convs(_plan(model, x, "tf32", raise_all=True)[0])[0].params
    tf32 = _convs(_plan(model, x, "tf32", raise_all=False)[0])[0].params
    f_s, b_s, peak_s = K.cost(split, ceil)
    f_t, b_t, peak_t = K.cost(tf32, ceil)
    assert f_s == f_t and peak_s == pytest.approx(peak_t / 3)
    assert b_s > b_t
    assert ceil.gemm_peak("fp32") < peak_s < peak_t


@pytest.mark.parametrize("policy,raise_all", [("tf32", False), ("fp32", False), ("fp32", True)])
def test_no_split_convolution_where_nothing_was_raised_or_the_program_is_fp32(policy, raise_all):
    torch.manual_seed(0)
    plan, cap = _plan(ConvNet(), torch.randn(2, 4, 10, 10), policy, raise_all)
    convs = _convs(plan)
    assert convs and not any(t.params.split_tf32 for t in convs)
    assert "st_conv_split_tf32" not in C.code(plan, cap.graph, None, arch="sm_90").program_cu


def test_the_split_convolution_program_compiles(nvcc, tmp_path):
    from stitchcuda import build as B

    plan, cap = _plan(ConvNet(), torch.randn(2, 4, 10, 10), "tf32", raise_all=True)
    r = B.build(C.code(plan, cap.graph, None, arch="sm_90").program_cu, arch="sm_90", cache=tmp_path)
    assert r.ok, r.compile.output[:2000] if r.compile else r.message


class Rotary(nn.Module):
    """Rotary angles as a product over K = 1 (positions x frequencies, as some transformers
    versions write it), then a linear over K = 64."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64)))
        self.proj = nn.Linear(64, 32)

    def forward(self, pos):
        freqs = (self.inv_freq[None, :, None] @ pos[:, None, :]).transpose(1, 2)  # [b, seq, 32]
        return self.proj(torch.cat([freqs.cos(), freqs.sin()], -1))


@pytest.mark.parametrize("policy", ["tf32", "fp32"])
def test_a_short_sum_gemm_computes_at_fp32_under_tf32(policy):
    """A product over fewer than SHORT_K terms is planned at fp32 under tf32 (not raised: no split,
    not a precision-repair suspect); the linear over 64 terms keeps the program's policy."""
    from stitchcuda.kinds.gemm import SHORT_K
    from stitchcuda.workflow import PrecisionRepair

    torch.manual_seed(0)
    model, pos = Rotary().eval(), torch.arange(1000.0).repeat(2, 1)
    cap = frontend.capture(model, [pos], "rotary", supported_ops=ops.supported())
    plan = P.plan(cap.graph, policy)
    gemms = {t.params.k: t for t in _gemms(plan)}
    assert sorted(gemms) == [1, 64] and 1 < SHORT_K <= 64, sorted(gemms)
    short, wide = gemms[1], gemms[64]
    assert short.params.policy == "fp32" and not short.params.split
    assert wide.params.policy == policy
    if policy == "tf32":
        assert "a sum of 1 terms" in short.note
        suspects = [t for t, _ in PrecisionRepair().suspects(plan)]
        assert wide.name in suspects and short.name not in suspects, suspects
    out = simulate(plan, model_weights(model, cap.graph) or cap.weights, [pos])[0].double()
    with torch.no_grad():
        want = copy.deepcopy(model).double()(pos.double())
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-5)
