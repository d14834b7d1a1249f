"""Recurrent layers (nn.RNN tanh / relu, nn.GRU, nn.LSTM) where there is no GPU:

* capture keeps each recurrent module as ONE node (not a node set per step), quickly, and the
  graph alone computes what the module computes;
* the plan is, per layer, one input-projection GEMM per direction and one recurrent task; the
  plan interpreter running it matches the module (output, h_n, c_n) in float64 for every mode,
  multi-layer, bidirectional, batch_first, without biases, with and without an initial state,
  at fp32 (1e-5) and with 16-bit storage (3e-2);
* what the lowering does not compute (projections, dropout between layers while training) is
  refused before export, naming the module;
* a hand-written recurrence (a Python loop over time) still captures and plans;
* a program with every cell compiles with nvcc, in fp32 and with bf16 storage.
"""

from __future__ import annotations

import copy
import time

import pytest
import torch
from torch import nn

from stitchcuda import build as B
from stitchcuda import code as C
from stitchcuda import frontend
from stitchcuda.evaluate import evaluate_graph
from stitchcuda import plan as P
from stitchcuda.recurrent import RECURRENT_OPS
from tests.dev_problems import MODELS
from tests.test_coverage_kinds import run_case


class Layer(nn.Module):
    """One recurrent module returning every result it has."""

    def __init__(self, kind: str, input_size: int = 6, hidden: int = 10, **kw):
        super().__init__()
        self.rnn = getattr(nn, kind)(input_size, hidden, **kw)
        self.lstm = kind == "LSTM"

    def forward(self, x, h0=None, c0=None):
        if self.lstm:
            out, (hn, cn) = self.rnn(x, None if h0 is None else (h0, c0))
            return out, hn, cn
        out, hn = self.rnn(x, h0)
        return out, hn


CONFIGS = {
    "lstm_bidir_stack_batch_first": ("LSTM", dict(num_layers=2, bidirectional=True, batch_first=True)),
    "lstm_plain": ("LSTM", dict()),
    "gru_bidir_stack": ("GRU", dict(num_layers=2, bidirectional=True)),
    "gru_batch_first_no_bias": ("GRU", dict(batch_first=True, bias=False)),
    "rnn_tanh_stack": ("RNN", dict(num_layers=3)),
    "rnn_relu_bidir_batch_first": ("RNN", dict(nonlinearity="relu", bidirectional=True, batch_first=True)),
}


def _inputs(kind: str, kw: dict, state: bool, steps: int = 7, batch: int = 3) -> list[torch.Tensor]:
    x = torch.randn(batch, steps, 6) if kw.get("batch_first") else torch.randn(steps, batch, 6)
    if not state:
        return [x]
    n = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    h0 = torch.randn(n, batch, 10)
    return [x, h0, torch.randn(n, batch, 10)] if kind == "LSTM" else [x, h0]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_capture_keeps_one_recurrent_node(name):
    kind, kw = CONFIGS[name]
    torch.manual_seed(0)
    model = Layer(kind, **kw)
    # (Export computes the node's shapes by running the operator's step-by-step decomposition on
    # fake tensors: capture time grows with the steps even though the graph does not.)
    inputs = _inputs(kind, kw, state=True, steps=40)
    cap = frontend.capture(model, inputs, name)
    rec = [n for n in cap.graph.nodes if n.op in RECURRENT_OPS]
    assert len(rec) == 1 and len(cap.graph.nodes) <= 3, [n.op for n in cap.graph.nodes]
    node = rec[0]
    assert node.attr("num_layers") == kw.get("num_layers", 1)
    assert node.attr("bidirectional") == kw.get("bidirectional", False)
    assert node.attr("batch_first") == kw.get("batch_first", False)
    assert node.attr("has_biases") == kw.get("bias", True)
    # Every weight of the module is a program weight, by its state_dict name.
    assert {w.name for w in cap.graph.weights} == {f"rnn.{k}" for k in model.rnn.state_dict()}
    names = {s.name: t for s, t in zip(cap.graph.inputs, inputs)}
    got = evaluate_graph(cap.graph, names, cap.weights)
    with torch.no_grad():
        want = model(*inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("policy", ["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_plan_interpreter_matches_the_module(name, policy):
    kind, kw = CONFIGS[name]
    torch.manual_seed(1)
    model = Layer(kind, **kw)
    plan = run_case(copy.deepcopy(model), _inputs(kind, kw, state=True), policy, name)
    layers, dirs = kw.get("num_layers", 1), 2 if kw.get("bidirectional") else 1
    rec = [t for t in plan.tasks if isinstance(t.params, P.RecurrentSpec)]
    gemms = [t for t in plan.tasks if isinstance(t.params, P.GemmSpec)]
    assert len(rec) == layers and all(t.strategy == "recurrent_template" for t in rec)
    assert len(gemms) == layers * dirs and all(g.params.m == 7 * 3 for g in gemms)  # all steps in one GEMM
    assert all(t.params.directions == dirs for t in rec)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_zero_initial_state(kind):
    """No h0 (and c0): the operator's zeros are a graph tensor the plan computes."""
    kw = dict(num_layers=2, bidirectional=True, batch_first=True)
    torch.manual_seed(2)
    run_case(Layer(kind, **kw), _inputs(kind, kw, state=False), "fp32", f"{kind.lower()}_zero_state")


def test_unused_results_are_not_required():
    """Only h_n read (the output sequence and c_n unused): the sequence goes to a scratch buffer."""

    class HnOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(6, 10, num_layers=2)

        def forward(self, x, h0, c0):
            return self.lstm(x, (h0, c0))[1][0]

    torch.manual_seed(3)
    plan = run_case(HnOnly(), [torch.randn(5, 2, 6), torch.randn(2, 2, 10), torch.randn(2, 2, 10)], "fp32", "hn")
    last = [t for t in plan.tasks if isinstance(t.params, P.RecurrentSpec)][-1]
    assert last.params.cn is None and last.params.hn is not None


@pytest.mark.parametrize("module,why", [
    (lambda: nn.LSTM(4, 8, proj_size=4), "proj_size=4"),
    (lambda: nn.GRU(4, 8, num_layers=2, dropout=0.5), "dropout=0.5 between layers in training mode"),
])
def test_refused_before_export(module, why):
    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = module()

        def forward(self, x):
            return self.rnn(x)[0]

    start = time.perf_counter()
    with pytest.raises(frontend.UnsupportedOpError) as info:
        frontend.capture(Holder(), [torch.randn(5, 2, 4)], "refused")
    assert time.perf_counter() - start < 1.0
    assert "model.rnn" in str(info.value) and why in str(info.value)


def test_dropout_outside_training_is_captured():
    model = nn.GRU(4, 8, num_layers=2, dropout=0.5).eval()
    cap = frontend.capture(model, [torch.randn(5, 2, 4)], "gru_eval")
    assert [n.op for n in cap.graph.nodes if n.op in RECURRENT_OPS] == ["aten.gru.input"]
    assert not cap.graph.lifted_random


def test_hand_written_recurrence_captures_and_plans():
    ref = frontend.load_reference(next(p for p in MODELS if p.stem == "rnn_cell_loop"))
    model, inputs = ref.instantiate(device="cpu", seed=0)
    plan = run_case(model, inputs, "fp32", "rnn_cell_loop")
    assert not any(isinstance(t.params, P.RecurrentSpec) for t in plan.tasks)


class _Every(nn.Module):
    """Every cell in one program: LSTM (batch first, bidirectional), GRU, RNN tanh, RNN relu."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 32, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(64, 32)
        self.tanh = nn.RNN(32, 16, bidirectional=True)
        self.relu = nn.RNN(32, 16, nonlinearity="relu", bias=False)

    def forward(self, x):
        y, (hn, cn) = self.lstm(x)
        z, _ = self.gru(y.transpose(0, 1))
        a, _ = self.tanh(z)
        b, _ = self.relu(z)
        return a.sum(-1) + b.sum(-1), hn, cn


@pytest.mark.parametrize("policy", ["fp32", "bf16"])
def test_program_with_every_cell_compiles(policy, nvcc, tmp_path):
    torch.manual_seed(4)
    model, inputs = _Every(), [torch.randn(4, 9, 8)]
    cap = frontend.capture(model, inputs, "every_cell")
    plan = P.plan(cap.graph, policy)
    modes = sorted({t.params.mode for t in plan.tasks if isinstance(t.params, P.RecurrentSpec)})
    assert modes == ["gru", "lstm", "rnn_relu", "rnn_tanh"]
    src = C.code(plan, cap.graph, None, arch="sm_90")
    assert "stitch::launch_recurrent<stitch::RnnMode::Lstm" in src.program_cu
    res = B.build(src.program_cu, arch="sm_90", cache=tmp_path / "cache", name="every_cell", policy=policy)
    assert res.ok, f"{res.message}\n{res.compile.output[-4000:] if res.compile else ''}"
