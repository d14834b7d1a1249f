"""Recurrent layers on the GPU.

* the recurrent models of models/ (``lstm_stack``: 3 layers, bidirectional, batch first, h_n and
  c_n returned; ``gru_bidir``: 2 layers, bidirectional, zero initial state; ``rnn_cell_loop``: a
  hand-written loop over time) are built by the pipeline and judged by the real Verifier (fresh
  inputs, poisoned outputs, inputs unchanged) at fp32 (1e-4) and tf32 (1e-2): the verdict passes;
* the seven KernelBench problems with recurrent layers (3:35-3:38, 3:40-3:42), at their own
  sizes, likewise through the Verifier at fp32 and tf32;
* the recurrent template against PyTorch: one program per cell (LSTM, GRU, RNN tanh, RNN relu;
  several layers, both directions, batch first or not, with and without an initial state, and
  one with a hidden size too wide for one block's shared memory, which takes the global-memory
  kernel), three fresh draws each, compared with the module in float64.

Run: ``pytest -m gpu tests/gpu/test_recurrent_gpu.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stitchcuda import frontend  # noqa: E402
from stitchcuda.pipeline import build_program  # noqa: E402
from stitchcuda.verifier import verify  # noqa: E402
from tests.gpu.test_coverage_gpu import _arch, _run  # noqa: E402
from tests.test_coverage_cases import all_rows, problem_id  # noqa: E402
from tests.test_recurrent import Layer as _Layer  # noqa: E402  (one module per test, both files)

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
MODELS = ("lstm_stack", "gru_bidir", "rnn_cell_loop")
#: The KernelBench problems with recurrent layers (level 3), at their own sizes: 6 layers, 512 steps.
KERNELBENCH = [(3, 35), (3, 36), (3, 37), (3, 38), (3, 40), (3, 41), (3, 42)]


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("model", MODELS)
def test_recurrent_model_verifies(model, policy, tmp_path):
    out = tmp_path / model
    outcome = build_program(REPO / "models" / f"{model}.py", precision=policy, out=out, arch=_arch(), quiet=True)
    assert outcome.ok, outcome.build.message if outcome.build else "not built"
    result = verify(out, precision=policy, trials=5, time=False, profile=False)
    assert result.ok, f"{model} {policy}: {result.kind}: {result.verdict.summary()}"


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("key", KERNELBENCH, ids=[problem_id(k) for k in KERNELBENCH])
def test_kernelbench_recurrent_problem_verifies(key, policy, tmp_path):
    rows = all_rows()
    if key not in rows:
        pytest.skip("KernelBench all.jsonl not present beside the checkout")
    ref = frontend.load_reference(rows[key]["source"], name=rows[key]["name"])
    out = tmp_path / problem_id(key)
    outcome = build_program(ref, precision=policy, out=out, arch=_arch(), quiet=True)
    assert outcome.ok, outcome.build.message if outcome.build else "not built"
    result = verify(out, precision=policy, trials=5, time=False, profile=False)
    assert result.ok, f"{problem_id(key)} {policy}: {result.kind}: {result.verdict.summary()}"


TEMPLATE_CASES = {
    "lstm_stack_bidir_batch_first": ("LSTM", 64, 128, dict(num_layers=2, bidirectional=True, batch_first=True), True),
    "lstm_zero_state": ("LSTM", 32, 96, dict(), False),
    "gru_stack_bidir": ("GRU", 48, 256, dict(num_layers=3, bidirectional=True), True),
    "rnn_tanh_batch_first": ("RNN", 16, 64, dict(batch_first=True, num_layers=2), True),
    "rnn_relu_bidir_no_bias": ("RNN", 16, 33, dict(nonlinearity="relu", bidirectional=True, bias=False), True),
    # G * U * H floats of W_hh per block do not fit shared memory: the global-memory kernel.
    "lstm_wide": ("LSTM", 64, 2048, dict(), True),
}


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("name", sorted(TEMPLATE_CASES))
def test_recurrent_template_against_torch(name, policy, tmp_path):
    kind, input_size, hidden, kw, state = TEMPLATE_CASES[name]
    torch.manual_seed(0)
    model = _Layer(kind, input_size, hidden, **kw)
    steps, batch = 37, 5
    layers, dirs = kw.get("num_layers", 1), 2 if kw.get("bidirectional") else 1

    def draw(seed: int) -> list:
        g = torch.Generator().manual_seed(seed)
        shape = (batch, steps, input_size) if kw.get("batch_first") else (steps, batch, input_size)
        xs = [torch.randn(shape, generator=g)]
        if state:
            xs.append(torch.randn(layers * dirs, batch, hidden, generator=g))
            if kind == "LSTM":
                xs.append(torch.randn(layers * dirs, batch, hidden, generator=g))
        return xs

    _run(model, draw, policy, name, tmp_path)
