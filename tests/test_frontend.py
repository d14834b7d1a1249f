"""Capture: references in, Graphs out (CPU only).

* every program in models/ captures, uses only SUPPORTED_OPS, and its Graph — run op by
  op with ATen, also after a JSON round trip — reproduces the eager model exactly;
* the KernelBench development problems, read at run time from ../shared/kernelbench
  (skipped when absent), capture on the meta device (their real tensors run to gigabytes)
  with output shapes equal to the eager model's; the ones with mutated state, and recurrent
  layers with projections, are refused quickly, naming the operator and the line;
* random draws in forward become program inputs; unsupported operators name their line.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

from stitchcuda import frontend
from stitchcuda.frontend import (
    SUPPORTED_OPS,
    CaptureError,
    UnsupportedOpError,
    capture,
    capture_reference,
    check_supported,
    load_reference,
    save_weights,
)
from stitchcuda.evaluate import evaluate_graph, sample_random_inputs
from stitchcuda.ir import Graph
from tests.dev_problems import STATEFUL_MODELS

REPO = Path(__file__).resolve().parents[1]
MODELS = [p for p in sorted((REPO / "models").glob("*.py")) if p not in STATEFUL_MODELS]  # those: test_stateful.py
DEV_SET = Path(os.environ.get("STITCHCUDA_SHARED") or Path(__file__).resolve().parents[2] / "shared") / \
    "kernelbench" / "dev.jsonl"

SUPPORTED_DEV = [(1, 1), (1, 23), (1, 26), (1, 40), (1, 97), (2, 12), (2, 41), (2, 76), (2, 86), (2, 99), (3, 1), (3, 3), (3, 4), (3, 43), (3, 44)]
# problem -> (what the error must name, module path, a snippet of the line it must point at)
UNSUPPORTED_DEV = {
    (3, 33): ("tensor attribute state", "model.hidden", "self.hidden.copy_(initial_hidden)"),
}


@functools.lru_cache(maxsize=None)
def _dev_problems() -> dict[tuple[int, int], dict]:
    return {(row["level"], row["problem_id"]): row for row in map(json.loads, DEV_SET.read_text().splitlines())}


def _dev(key: tuple[int, int]) -> frontend.Reference:
    if not DEV_SET.is_file():
        pytest.skip(f"KernelBench development set not found at {DEV_SET}")
    row = _dev_problems()[key]
    return load_reference(row["source"], name=row["name"])


def _line_of(source: str, snippet: str, start: int = 1) -> int:
    for i, line in enumerate(source.splitlines()):
        if snippet in line:
            return start + i
    raise AssertionError(f"{snippet!r} not in source")


def _as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _user_inputs(graph: Graph, inputs) -> dict[str, torch.Tensor]:
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    return {spec.name: t for spec, t in zip(graph.user_inputs, tensors)}


# --------------------------------------------------------------------------------------
# models/
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_models_capture_and_reproduce_the_reference(path, tmp_path):
    ref = load_reference(path)
    model, inputs = ref.instantiate(seed=0)
    captured = capture(model, inputs, ref.name)
    graph = captured.graph
    assert graph.ops() <= set(SUPPORTED_OPS)
    assert all(n.source.startswith("model") and f"{path.name} line " in n.source for n in graph.nodes)

    expected = _as_tuple(model(*inputs))
    assert [s.shape for s in graph.output_specs] == [tuple(t.shape) for t in expected]
    # The Graph alone (ops, operands, attrs) must say everything, JSON included.
    for g in (graph, Graph.from_json(graph.to_json())):
        got = evaluate_graph(g, _user_inputs(g, inputs), captured.weights)
        for want, have in zip(expected, got):
            torch.testing.assert_close(have, want, rtol=0, atol=0)

    weights_file = tmp_path / "weights.safetensors"
    save_weights(captured, weights_file)
    saved = load_file(weights_file)
    assert set(saved) == {w.name for w in graph.weights}
    for spec in graph.weights:
        assert tuple(saved[spec.name].shape) == spec.shape
        torch.testing.assert_close(saved[spec.name], captured.weights[spec.name], rtol=0, atol=0)


def test_gpt_block_graph_shape():
    """The written-out attention stays recognisable: GEMMs whole, mask and softmax visible."""
    ref = load_reference(REPO / "models" / "gpt_block.py")
    graph = capture_reference(ref, device="meta").graph
    ops = [n.op for n in graph.nodes]
    assert ops.count("aten.linear.default") == 4
    assert ops.count("aten.matmul.default") == 2
    assert ops.count("aten.native_layer_norm.default") == 2
    assert "aten._softmax.default" in ops and "aten.where.self" in ops
    # The non-persistent causal mask buffer is a weight the program reads.
    assert "attn.causal_mask" in {w.name for w in graph.weights}
    assert graph.spec("attn.causal_mask").dtype == "bool"


# --------------------------------------------------------------------------------------
# KernelBench development problems
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", SUPPORTED_DEV, ids=lambda k: f"L{k[0]}-{k[1]}")
def test_dev_problem_captures(key):
    ref = _dev(key)
    # Meta tensors: the problems' real inputs and weights run to several GB.
    model, inputs = ref.instantiate(device="meta", seed=0)
    captured = capture(model, inputs, ref.name)
    graph = captured.graph
    unsupported = check_supported(graph)
    assert not unsupported, unsupported
    assert graph.ops() <= set(SUPPORTED_OPS)

    eager = _as_tuple(model(*inputs))
    assert [s.shape for s in graph.output_specs] == [tuple(t.shape) for t in eager]
    assert [s.dtype for s in graph.output_specs] == [str(t.dtype).removeprefix("torch.") for t in eager]
    # Running the Graph on meta tensors checks every node's operands and attrs agree.
    ran = evaluate_graph(graph, _user_inputs(graph, inputs), captured.weights)
    assert [tuple(t.shape) for t in ran] == [s.shape for s in graph.output_specs]
    assert not graph.lifted_random  # these problems draw nothing in forward (dropout p = 0)


@pytest.mark.parametrize("key", sorted(UNSUPPORTED_DEV), ids=lambda k: f"L{k[0]}-{k[1]}")
def test_dev_problem_refused_with_location(key):
    ref = _dev(key)
    what, module, snippet = UNSUPPORTED_DEV[key]
    model, inputs = ref.instantiate(device="meta", seed=0)
    plain = {k: v for k, v in vars(model).items() if isinstance(v, torch.Tensor)}
    start = time.perf_counter()
    with pytest.raises(UnsupportedOpError) as info:
        capture(model, inputs, ref.name)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, f"refusal took {elapsed:.1f} s"
    message = str(info.value)
    line = _line_of(ref.source, snippet)
    assert what in message and module in message
    assert f"<{ref.name}> line {line}: {snippet}" in message, message
    assert any(u.op == what for u in info.value.ops)
    # Whatever forward assigned while export traced it, the model is as it was.
    assert all(vars(model)[k] is v for k, v in plain.items())


class _Sampler(nn.Module):
    def forward(self, x, grid):
        return F.grid_sample(x, grid, align_corners=False)


class _TwoUnsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool2d(2)
        self.sample = _Sampler()

    def forward(self, x, grid):
        y = self.sample(self.pool(x), grid)
        return torch.bucketize(y, torch.linspace(-1, 1, 5))


def test_every_unsupported_op_is_listed():
    with pytest.raises(UnsupportedOpError) as info:
        capture(_TwoUnsupported(), [torch.randn(1, 2, 8, 8), torch.rand(1, 3, 3, 2) * 2 - 1], "two")
    # (its max pooling is supported)
    assert {u.op for u in info.value.ops} == {"aten.grid_sampler_2d.default", "aten.bucketize.Tensor"}
    assert info.value.graph is not None  # the graph is still there for a later stage to inspect
    assert "model.sample (_Sampler)" in str(info.value)


# --------------------------------------------------------------------------------------
# Random draws in forward
# --------------------------------------------------------------------------------------


class _Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x) + torch.randn(x.shape[0], 8)
        return h * torch.rand_like(h)


def test_random_draws_become_inputs_and_replay_the_reference():
    model, x = _Noisy(), torch.randn(4, 8)
    graph = capture(model, [x], "noisy").graph
    assert [s.name for s in graph.inputs] == ["x", "randn", "rand_like"]
    assert [s.name for s in graph.user_inputs] == ["x"]
    randn, rand_like = graph.lifted_random
    assert (randn.op, randn.distribution, randn.shape, randn.dtype) == ("aten.randn.default", "normal", (4, 8), "float32")
    assert randn.params == (("mean", 0.0), ("std", 1.0))
    assert (rand_like.distribution, rand_like.params) == ("uniform", (("low", 0.0), ("high", 1.0)))
    line = _line_of(inspect.getsource(_Noisy), "torch.randn(", inspect.getsourcelines(_Noisy)[1])
    assert f"test_frontend.py line {line}" in randn.source
    assert not any("rand" in n.op for n in graph.nodes)
    assert "random %randn: float32[4,8] ~ normal(mean=0.0, std=1.0)" in str(graph)
    assert Graph.from_json(graph.to_json()) == graph

    # Same seed, same draws: the graph with lifted inputs equals the reference itself.
    torch.manual_seed(7)
    expected = model(x)
    random = sample_random_inputs(graph, seed=7)
    got = evaluate_graph(graph, {"x": x, **random}, dict(model.named_parameters()))[0]
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


class _Dropouts(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return self.drop(x) + 1.0


def test_live_dropout_lifts_its_mask():
    x = torch.randn(3, 5)
    graph = capture(_Dropouts(0.25), [x], "drop").graph
    (mask,) = graph.lifted_random
    assert (mask.op, mask.distribution, mask.dtype, mask.shape) == ("aten.native_dropout.default", "bernoulli", "bool", (3, 5))
    assert mask.param("p") == pytest.approx(0.75)  # probability of keeping an element
    assert "model.drop (Dropout)" in mask.source
    keep = torch.rand(3, 5) < 0.75
    got = evaluate_graph(graph, {"x": x, mask.input: keep}, {})[0]
    torch.testing.assert_close(got, torch.where(keep, x / 0.75, 0.0) + 1.0)


@pytest.mark.parametrize("p, train", [(0.0, True), (0.5, False)])
def test_inactive_dropout_is_identity(p, train):
    x = torch.randn(3, 5)
    model = _Dropouts(p).train(train)
    graph = capture(model, [x], "drop").graph
    assert not graph.lifted_random and len(graph.inputs) == 1
    torch.testing.assert_close(evaluate_graph(graph, {"x": x}, {})[0], x + 1.0)


class _Coins(nn.Module):
    def forward(self, p, x):
        return torch.bernoulli(p) * x


def test_bernoulli_with_tensor_probabilities():
    p, x = torch.full((6,), 0.5), torch.randn(6)
    graph = capture(_Coins(), [p, x], "coins").graph
    (u,) = graph.lifted_random
    assert u.distribution == "uniform" and u.shape == (6,)
    assert "aten.lt.Tensor" in graph.ops()
    u_values = torch.tensor([0.0, 0.9, 0.2, 0.7, 0.49, 0.51])
    got = evaluate_graph(graph, {"p": p, "x": x, u.input: u_values}, {})[0]  # one where u < p
    torch.testing.assert_close(got, x * (u_values < 0.5))


# --------------------------------------------------------------------------------------
# Refusals with locations
# --------------------------------------------------------------------------------------


class _Sort(nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        return torch.sort(y, dim=1).values


def test_unsupported_op_names_its_source_line():
    line = _line_of(inspect.getsource(_Sort), "torch.sort", inspect.getsourcelines(_Sort)[1])
    with pytest.raises(UnsupportedOpError) as info:
        capture(_Sort(), [torch.randn(2, 3)], "sort")
    message = str(info.value)
    assert "aten.sort.default at model (_Sort)" in message
    assert f"test_frontend.py line {line}: return torch.sort(y, dim=1).values" in message
    assert [u.op for u in info.value.ops] == ["aten.sort.default"]
    assert "aten.relu" not in message
    # Without the check the graph is captured, and check_supported finds the same op.
    graph = capture(_Sort(), [torch.randn(2, 3)], "sort", supported_ops=None).graph
    assert [u.op for u in check_supported(graph)] == ["aten.sort.default"]
    assert check_supported(graph, set(SUPPORTED_OPS) | {"aten.sort.default"}) == []


class _Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 8, num_layers=2, batch_first=True, proj_size=4)

    def forward(self, x):
        out, _ = self.lstm(x)
        return out[:, -1]


def test_unsupported_recurrent_layer_refused_before_export():
    """An LSTM with a projection (the recurrent lowering has none) is refused before export."""
    line = _line_of(inspect.getsource(_Recurrent), "self.lstm(x)", inspect.getsourcelines(_Recurrent)[1])
    start = time.perf_counter()
    with pytest.raises(UnsupportedOpError) as info:
        capture(_Recurrent(), [torch.randn(2, 1000, 4)], "lstm")
    assert time.perf_counter() - start < 1.0
    assert f"nn.LSTM at model.lstm (LSTM), test_frontend.py line {line}: out, _ = self.lstm(x)" in str(info.value)
    assert "proj_size=4" in str(info.value)


class _Accumulates(nn.Module):
    def __init__(self):
        super().__init__()
        self.total = torch.zeros(4)

    def forward(self, x):
        self.total.add_(x.sum(0))
        return x + self.total


class _Reassigns(nn.Module):
    def __init__(self):
        super().__init__()
        self.state = torch.zeros(4)

    def forward(self, x):
        self.state = self.state + x.sum(0)
        return x * self.state


@pytest.mark.parametrize("cls, attr, snippet", [(_Accumulates, "total", "self.total.add_("), (_Reassigns, "state", "self.state = self.state")])
def test_state_in_plain_tensor_attribute_refused(cls, attr, snippet):
    model = cls()
    before = getattr(model, attr)
    line = _line_of(inspect.getsource(cls), snippet, inspect.getsourcelines(cls)[1])
    with pytest.raises(UnsupportedOpError) as info:
        capture(model, [torch.randn(3, 4)], "stateful")
    assert f"'{attr}'" in str(info.value)
    assert f"test_frontend.py line {line}" in str(info.value)
    assert getattr(model, attr) is before


@pytest.mark.parametrize("cls, attr", [(_Accumulates, "total"), (_Reassigns, "state")])
def test_state_lifted_to_explicit_input_and_output(cls, attr):
    """state="lift": the attribute's value before the call is an input, after it an output; the
    graph computes one call of the reference given the state, and hands the next state back."""
    model = cls()
    before = getattr(model, attr)
    captured = capture(model, [torch.randn(3, 4)], "stateful", state="lift")
    assert getattr(model, attr) is before, "the model is as it was"
    graph = captured.graph
    (st,) = captured.state
    assert st.attribute == attr and st.input == f"state_{attr}" and st.output == graph.outputs[1]
    assert [s.name for s in graph.inputs] == ["x", f"state_{attr}"] and len(graph.outputs) == 2
    assert "test_frontend.py line" in st.where and captured.notes
    torch.manual_seed(0)
    ref = cls()
    for _ in range(3):  # three calls: the state carries over
        x, state = torch.randn(3, 4), getattr(ref, attr).clone()
        want = ref(x)
        out, new_state = evaluate_graph(graph, {"x": x, f"state_{attr}": state}, captured.weights)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        torch.testing.assert_close(new_state, getattr(ref, attr), rtol=0, atol=0)


class _NeedsData(nn.Module):
    """A constructor that reads a value (a stochastic-depth schedule): fails on the meta device."""

    def __init__(self):
        super().__init__()
        rates = [r.item() for r in torch.linspace(0, 0.5, 3)]
        self.fc = nn.Linear(4, 4)
        self.scale = 1.0 - rates[-1]

    def forward(self, x):
        return self.fc(x) * self.scale


def test_meta_failure_falls_back_to_the_cpu():
    source = inspect.getsource(_NeedsData).replace("_NeedsData", "Model")
    ref = load_reference("import torch\nimport torch.nn as nn\n" + source +
                         "\ndef get_inputs():\n    return [torch.randn(2, 4)]\n\ndef get_init_inputs():\n    return []\n",
                         name="needs_data")
    with pytest.warns(UserWarning, match="captured on the CPU with the reference's own shapes in"):
        captured = capture_reference(ref, device="meta")
    assert any("Tensor.item() cannot be called on meta tensors" in n for n in captured.notes)
    assert all(not w.is_meta for w in captured.weights.values()), "a CPU capture has real weights"
    assert captured.graph.ops() == {"aten.linear.default", "aten.mul.Tensor"}
    with pytest.raises(UnsupportedOpError):  # unsupported ops are not a meta problem: no second try
        capture_reference(load_reference(ref.source.replace("return self.fc(x) * self.scale",
                                                            "return torch.sort(self.fc(x), 1).values"),
                                         name="needs_data_sort"), device="meta")


class _Mixed(nn.Module):
    """Integer and boolean inputs, a non-persistent buffer, several outputs (one an input)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.register_buffer("offset", torch.arange(6.0), persistent=False)

    def forward(self, tokens, mask, x):
        e = self.emb(tokens) + self.offset
        picked = torch.where(mask.unsqueeze(-1), e, x)
        return picked, picked.argmax(-1), tokens, e.sum(1) > 0


def test_integer_and_boolean_inputs_buffers_and_several_outputs():
    from stitchcuda import plan as P
    from stitchcuda.check.interp import simulate

    torch.manual_seed(1)
    model = _Mixed()
    inputs = [torch.randint(0, 10, (3, 5)), torch.rand(3, 5) > 0.5, torch.randn(3, 5, 6)]
    captured = capture(model, inputs, "mixed")
    graph = captured.graph
    assert [s.dtype for s in graph.inputs] == ["int64", "bool", "float32"]
    assert {w.name for w in graph.weights} == {"emb.weight", "offset"}
    assert [s.dtype for s in graph.output_specs] == ["float32", "int64", "int64", "bool"]
    plan = P.plan(graph, "fp32")
    got = simulate(plan, dict(model.named_parameters()) | dict(model.named_buffers()), inputs)
    for have, want in zip(got, model(*inputs)):
        torch.testing.assert_close(have.to(want.dtype), want)


def test_as_strided_that_only_sets_a_layout_is_an_alias():
    class Pool1d(nn.Module):
        def forward(self, x):
            return nn.functional.adaptive_avg_pool1d(x.transpose(1, 2), 1).flatten(1)

    graph = capture(Pool1d(), [torch.randn(2, 7, 5)], "pool1d").graph
    assert "aten.as_strided.default" not in graph.ops()


def test_export_failure_is_a_capture_error():
    class DataDependent(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x
            return -x

    with pytest.raises(CaptureError, match="torch.export could not capture 'branchy'"):
        capture(DataDependent(), [torch.randn(3)], "branchy")


# --------------------------------------------------------------------------------------
# Loading, scalars, weights
# --------------------------------------------------------------------------------------


def test_load_reference_from_path_and_source():
    path = REPO / "models" / "mlp.py"
    for given in (path, str(path)):
        ref = load_reference(given)
        assert ref.name == "mlp" and ref.filename.endswith("mlp.py")
    from_source = load_reference(path.read_text(), name="mlp_text")
    assert from_source.filename == "<mlp_text>"
    assert from_source.get_init_inputs() == ref.get_init_inputs()
    assert inspect.getsource(from_source.Model).startswith("class Model")
    with pytest.raises(CaptureError, match="lacks get_inputs, get_init_inputs"):
        load_reference("import torch\nclass Model(torch.nn.Module):\n    pass\n", name="broken")


class _Scaled(nn.Module):
    def forward(self, x, k: int):
        return x * k


def test_scalar_inputs_are_baked_in():
    graph = capture(_Scaled(), [torch.randn(2), 3], "scaled").graph
    assert [s.name for s in graph.inputs] == ["x"]
    (node,) = graph.nodes
    assert node.op == "aten.mul.Tensor" and node.attr("other") == 3


def test_save_weights_refuses_meta_capture(tmp_path):
    captured = capture_reference(load_reference(REPO / "models" / "mlp.py"), device="meta")
    with pytest.raises(CaptureError, match="meta"):
        save_weights(captured, tmp_path / "w.safetensors")


class _Constants(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        x = torch.min(x * self.w, torch.tensor(0.5))      # one value: a full node
        return x + torch.tensor([1.0, 2.0, 3.0])           # several: stays a weight (no other way to hold it)


def test_a_uniform_constant_the_forward_creates_is_a_full_node_not_a_weight():
    cap = frontend.capture(_Constants(), [torch.randn(2, 3)], "constants")
    fulls = [n for n in cap.graph.nodes if n.op == "aten.full.default"]
    assert len(fulls) == 1 and fulls[0].attr("fill_value") == 0.5 and fulls[0].outputs[0].shape == ()
    others = [w.name for w in cap.graph.weights if w.name != "w"]
    assert len(others) == 1 and cap.weights[others[0]].tolist() == [1.0, 2.0, 3.0], cap.graph.weights


class _BufferAccumulates(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(4))

    def forward(self, x):
        self.acc.add_(x.mean(0))
        return x - self.acc


def test_state_in_a_registered_buffer_is_refused_by_line():
    """A registered buffer that forward changes is state kept between calls; capture dropped the change,
    so a program answered every call as the first. It is refused by name and line; a norm's running
    statistics (training mode), which the call never reads back, are still left out."""
    line = _line_of(inspect.getsource(_BufferAccumulates), "self.acc.add_(", inspect.getsourcelines(_BufferAccumulates)[1])
    with pytest.raises(UnsupportedOpError) as info:
        capture(_BufferAccumulates(), [torch.randn(3, 4)], "buffered")
    assert "buffer state" in str(info.value) and "'acc'" in str(info.value)
    assert f"test_frontend.py line {line}" in str(info.value)
    bn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    assert capture(bn, [torch.randn(2, 3, 8, 8)], "bn").graph.outputs


def test_an_input_changed_in_place_is_said():
    """forward's in-place change of its own input is no result of a program (programs leave their inputs
    as they were): capture says so in a warning naming the input and the line."""
    class M(nn.Module):
        def forward(self, x):
            x.relu_()
            return x * 2

    with pytest.warns(UserWarning, match=r"changes its input 'x' in place \(.*test_frontend\.py line \d+: x\.relu_\(\)"):
        capture(M(), [torch.randn(3, 4)], "inplace")


def test_two_lines_alike_are_two_lines_of_the_refusal():
    """Refusals are grouped by source line whatever module reaches it; the module part was cut at the
    last '), ' of the location, which may lie in the code, so two lines ending alike became one."""
    class M(nn.Module):
        def forward(self, x, y):
            a = torch.topk(x.view(8, 4), k=3).values
            b = torch.topk(y.view(8, 4), k=3).values
            return a + b

    with pytest.raises(UnsupportedOpError) as info:
        capture(M(), [torch.randn(32), torch.randn(32)], "alike")
    lines = str(info.value).splitlines()[1:]
    assert len(lines) == 2 and "a = torch.topk(x" in lines[0] and "b = torch.topk(y" in lines[1], lines
    assert "more place" not in str(info.value)
