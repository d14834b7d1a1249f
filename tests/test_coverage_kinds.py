"""The coverage families, numerically, on the CPU (no GPU, no nvcc):

* every reference of tests/test_coverage_cases.py — convolutions (the plan interpreter runs
  PyTorch's convolution where the program calls cuDNN), pooling, group / instance / layer norm and vector
  norms, scans, arg reductions, gathers and padding, the pointwise long tail — is captured,
  planned and run task by task by the plan interpreter over byte buffers, and matches PyTorch in
  float64 (fp32: 1e-5; bf16 storage: 3e-2); the plan survives a JSON round trip and every
  reference node is covered by a task;
* so do small versions of the KernelBench problems these families opened;
* each family's task kind is the one planned (a pool is one pool task with its hooks, a group
  norm is statistics + one fused elementwise pass, a reverse cumsum is one reverse scan, ...).
"""

from __future__ import annotations

import re

import pytest
import torch

from stitchcuda import frontend, ops
from stitchcuda import plan as P
from stitchcuda.check.interp import simulate
from stitchcuda.pipeline import model_weights
from tests.plan_sim import where_narrow
from tests.test_coverage_cases import CASES, SMALL, all_rows, problem_id, problem_reference

TOL = {"fp32": 1e-5, "bf16": 3e-2}


def _kinds(plan: P.Plan) -> list[str]:
    return [type(t.params).__name__.removesuffix("Spec") for t in plan.tasks]


def run_case(model: torch.nn.Module, inputs: list, policy: str, name: str) -> P.Plan:
    """Capture, plan and interpret ``model(*inputs)``; compare with the float64 reference."""
    cap = frontend.capture(model, inputs, name, supported_ops=ops.supported())
    plan = P.plan(cap.graph, policy)
    assert P.Plan.from_json(plan.to_json()).to_json() == plan.to_json()  # (NaN constants: compare the text)
    covered = {c for t in plan.tasks for c in t.covers}
    assert covered == {n.name for n in cap.graph.nodes}, "every reference node is covered by a task"
    for t in plan.create_tasks:  # what runs once at create reads only what exists then
        assert all(plan.buffer(b).kind in ("weight", "const") for b in t.inputs), (t.name, t.inputs)
    weights = model_weights(model, cap.graph) or cap.weights
    outs = simulate(plan, weights, [x for x in inputs if isinstance(x, torch.Tensor)])
    with torch.no_grad():
        want = model.double()(*[x.double() if x.is_floating_point() else x for x in inputs])
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    assert len(outs) == len(want)
    for i, (o, r) in enumerate(zip(outs, want)):
        assert o.shape == r.shape, (name, i)
        if not r.is_floating_point():
            assert torch.equal(o.to(r.dtype), r), f"{name} ({policy}) output {i}\n{plan}"
            continue
        o = o.double()
        assert not torch.isnan(o[~torch.isnan(r)]).any(), f"{name}: output {i} not fully written"
        err = ((o - r).abs() / (1 + r.abs())).nan_to_num(0.0).max().item()
        assert err < TOL[policy], f"{name} ({policy}) output {i}: error {err:.3g}\n{plan}"
    return plan


@pytest.mark.parametrize("policy", ["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_case_matches_reference(name, policy):
    family, build = CASES[name]
    if policy == "bf16" and family in ("arg", "gather") and "cross" not in name:
        pytest.skip("bf16 rounding changes which element is the extreme / the value gathered only in storage")
    model, inputs = build()
    run_case(model, inputs, policy, name)


@pytest.mark.parametrize("key", sorted(SMALL), ids=[problem_id(k) for k in sorted(SMALL)])
def test_small_problem_matches_reference(key):
    if key not in all_rows():
        pytest.skip("KernelBench all.jsonl not present beside the checkout")
    model, inputs = problem_reference(key).instantiate(seed=0)
    run_case(model, inputs, "fp32", problem_id(key))


def _plan(name: str, cudnn: bool = False) -> P.Plan:
    """The fp32 plan of coverage case ``name``; ``cudnn``: with cuDNN's convolutions asked for where
    the narrow kernel (kinds/narrow_conv.py) would take them by default."""
    model, inputs = CASES[name][1]()
    graph = frontend.capture(model, inputs, name).graph
    return P.plan(graph, "fp32", constraints=where_narrow(graph, "channels_first") if cudnn else None)


def test_fusion_of_the_families():
    assert _kinds(_plan("pool_hooks")) == ["Pool"], "tanh before, relu and the scale after: one pool task"
    p = _plan("pool_hooks").tasks[0].params
    assert [i.op for i in p.prologue] == ["tanh"] and [i.op for i in p.epilogue] == ["relu", "mul"]
    gn = _plan("groupnorm_2d_swish")
    # (one position a channel: a layer norm over rows of C / G, then the affine and the swish in one pass)
    assert _kinds(gn) == ["Row", "Ew"], "rows normalised, then the affine and the swish in one pass"
    assert [i.op for i in gn.tasks[1].params.instrs][:2] == ["mul", "add"]
    assert _kinds(_plan("instancenorm")) == ["GroupStats", "Ew"]
    assert _kinds(_plan("cumsum_reverse")) == ["Scan"] and _plan("cumsum_reverse").tasks[0].params.reverse
    assert _kinds(_plan("max_dim_values")) == ["Axis"], "max over a dim whose indices nobody reads"
    assert sorted(_kinds(_plan("max_dim_both"))) == ["Arg", "Row"], "values and indices: two tasks"
    norm = _plan("normalize")
    assert _kinds(norm) == ["Row", "Ew"] and [i.op for i in norm.tasks[0].params.prologue] == ["square"]
    assert [i.op for i in norm.tasks[0].params.epilogue][:1] == ["sqrt"]
    whole = _plan("whole_tensor_sum")
    assert _kinds(whole)[:3] == ["Axis"] * 3, "a whole-tensor reduction splits over blocks"
    # index_selects along distinct dims, each read only by the next: one gather, an index per dim
    for name, n in (("roll_2d", 2), ("roll_3d_odd", 3)):
        gathers = [t for t in _plan(name).tasks if t.phase == "run" and type(t.params).__name__ == "GatherSpec"]
        assert len(gathers) == 1 and len(gathers[0].params.inputs) == n, f"{name}: {len(gathers)} gathers"
    for name in ("index_select_same_dim", "roll_middle_read"):
        gathers = [t for t in _plan(name).tasks if t.phase == "run" and type(t.params).__name__ == "GatherSpec"]
        assert len(gathers) == 2 and all(len(g.params.inputs) == 1 for g in gathers), name
    ar = _plan("arange")
    assert [t.phase for t in ar.tasks] == ["create", "run"], "arange is computed once, at create"
    assert _kinds(_plan("flip")) == ["Gather"] and _plan("flip").tasks[0].params.base > 0
    same = _plan("depthwise_same_pad")
    # each F.pad folded into the depthwise convolution after it: no gather writes a padded copy
    dws = [t.params for t in same.tasks if type(t.params).__name__ == "DepthwiseSpec"]
    assert "Gather" not in _kinds(same) and len(dws) == 2, _kinds(same)
    assert sorted(d.padding for d in dws) == [(0, 0), (2, 3)], [d.padding for d in dws]
    up = _plan("upsample_bilinear_into_cat")
    gathers = [t.params for t in up.tasks if type(t.params).__name__ == "GatherSpec"]
    # each interpolation one gather (not four and a blend) reading the channels-last features as they
    # are, written into its slot of the join
    assert len(gathers) == 2 and all(g.linear == (0, 0, 1, 1) for g in gathers), _kinds(up)
    assert [g.align_corners for g in gathers] == [False, True]
    assert all(g.x.strides[1] == 1 and g.out.buffer == gathers[0].out.buffer for g in gathers), \
        [(g.x, g.out) for g in gathers]
    assert sorted(g.out.offset for g in gathers) == [0, 16 * 8 * 8], "the join's two slots"


def test_convolutions_fuse_their_activation():
    """cuDNN's fused epilogue takes the activation right after a convolution (SiLU written as
    x * sigmoid(x) too); an activation whose input is also read elsewhere stays apart."""
    def conv(name: str) -> list[tuple[str, str]]:
        return [(type(t.params).__name__.removesuffix("Spec"), getattr(t.params, "activation", ""))
                for t in _plan(name, cudnn=True).tasks]

    assert conv("conv2d_relu") == [("Conv", "relu")]
    assert conv("conv2d_grouped_gelu") == [("Conv", "gelu")]
    assert sorted(conv("conv2d_relu6")) == [("Conv", "none"), ("Conv", "relu6"), ("Ew", "")], "hardtanh(0, 5) apart"
    assert conv("depthwise_separable_swish") == [("Depthwise", ""), ("Conv", "silu")], "the depthwise stage has its own kind"
    assert conv("conv1d_tanh_gelu_tanh") == [("Conv", "tanh"), ("Ew", "")], "one activation, the next one apart"
    assert conv("conv_output_and_activation")[:2] == [("Conv", "none"), ("Ew", "")]
    spec = _plan("conv_transpose1d_grouped").tasks[0].params
    assert (spec.transposed, spec.groups, spec.stride, spec.dilation, spec.out_channels) == (True, 2, (3,), (2,), 6)
    bf16 = P.plan(frontend.capture(*CASES["conv2d_relu"][1](), "c").graph, "bf16")
    c = [t.params for t in bf16.tasks if isinstance(t.params, P.ConvSpec)][0]
    assert c.x.dtype == c.w.dtype == c.out.dtype == c.bias.dtype == "bfloat16" and c.policy == "bf16"


def test_unsupported_arguments_are_named():
    class Indices(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.max_pool2d(x, 2, return_indices=True)[1]

    graph = frontend.capture(Indices(), [torch.randn(1, 2, 4, 4)], "indices").graph
    with pytest.raises(P.PlanError, match="indices of max pooling are used"):
        P.plan(graph)

    class Mask(torch.nn.Module):
        def forward(self, x):
            return x[x > 0]

    with pytest.raises(Exception):  # data-dependent shape: refused at capture or plan, never wrong
        P.plan(frontend.capture(Mask(), [torch.randn(4)], "mask").graph)


def test_programs_pass_the_static_rules():
    """The Verifier's static rules hold for programs of every new kind (the templates are
    included where the tasks instantiate them), under fp32 and bf16 storage."""
    from stitchcuda import code as C
    from stitchcuda.verifier import check_manifest, check_source

    for name in ("pool_hooks", "groupnorm", "cumsum_reverse", "argmax_middle", "max_dim_both", "index_split_dims",
                 "arange", "slice_assign", "any_all_var", "depthwise_separable_swish", "conv_transpose3d"):
        model, inputs = CASES[name][1]()
        graph = frontend.capture(model, inputs, name).graph
        for policy in ("fp32", "bf16"):
            src = C.code(P.plan(graph, policy), graph, None, arch="sm_90")
            findings = check_source(src.program_cu, manifest=src.manifest) + \
                check_manifest(src.manifest, source=src.program_cu)
            assert not findings, f"{name} {policy}: " + "; ".join(str(f) for f in findings)



def test_a_gather_walks_its_output_in_memory_order():
    """The gather kernel's last dim is its fastest: the dims are handed over as the output lies in
    memory, so an interpolation written channels-last writes (and reads channels-last features)
    along the channels."""
    from types import SimpleNamespace

    from stitchcuda.kinds import gather as G
    from stitchcuda.layout import View

    x = View("x", 0, (2, 3, 4, 5), (60, 1, 15, 3), "float32")
    out = View("o", 0, (2, 3, 8, 10), (240, 1, 30, 3), "float32")
    g = G.GatherSpec("gather", x, out, 0, x.strides, (0, 0, 0, 0), (2, 3, 4, 5), linear=(0, 0, 1, 1),
                     linear_scale=(0.0, 0.0, 0.5, 0.5))
    _, body = G.render(SimpleNamespace(name="up"), g, lambda s: s, "up")
    text = "\n".join(body)
    assert "g.shape[0] = 2; g.shape[1] = 8; g.shape[2] = 10; g.shape[3] = 3;" in text, text
    assert "g.out_stride[3] = 1;" in text and "g.coef[3] = 1;" in text, text
    assert "g.linear[0] = 0; g.linear[1] = 1; g.linear[2] = 1; g.linear[3] = 0;" in text, text


@pytest.mark.parametrize("pool, fixed", [
    (lambda x: torch.nn.functional.max_pool2d(x, 3, 2), ", 3, 3, 2, 2>"),
    (lambda x: torch.nn.functional.avg_pool2d(x, (2, 4), (1, 3), padding=1), ", 2, 4, 1, 3>"),
    (lambda x: torch.nn.functional.max_pool1d(x.flatten(2), 5, 2), ", 1, 5, 1, 2>"),
    (lambda x: torch.nn.functional.max_pool2d(x, 3, 1, dilation=2), ">"),
    (lambda x: torch.nn.functional.max_pool2d(x, 9, 1), ">"),
    (lambda x: torch.nn.functional.adaptive_avg_pool2d(x, 3), ">"),
])
def test_small_pooling_windows_are_compiled_into_the_template(pool, fixed):
    """A 1-d / 2-d window of dilation 1 with sides up to 8 and strides up to 4 is named to
    launch_pool when the program is compiled (its tap loops unroll); any other window is not."""
    from stitchcuda import code as C

    class Pool(torch.nn.Module):
        def forward(self, x):
            return pool(x)

    x = torch.randn(2, 3, 20, 21)
    cap = frontend.capture(Pool(), [x], "pool", supported_ops=ops.supported())
    src = C.code(P.plan(cap.graph, "fp32"), cap.graph, None, arch="sm_90").program_cu
    calls = re.findall(r"launch_pool<stitch::PoolMode::\w+([^>]*>)\(p, stream", src)
    assert calls == [fixed], calls
