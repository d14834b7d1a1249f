"""Stateful references on the GPU: built, verified by the real Verifier, and carried call to call.

* models/stateful_rnn_cell.py and KernelBench 3:33 (VanillaRNN, real sizes: 2.5 GiB of weights)
  are built at fp32 and tf32 (``stitchcuda build``: the hidden state kept in ``self.hidden`` is the
  input ``state_hidden`` and an extra output) and verified end to end (static rules, build,
  sandbox, trials with the state supplied per trial, the dynamic checks, a short timing loop);
  every verdict must be Passed, and the trials must judge the state output;
* the built RNN cell, loaded with ``Program.load`` and called three times with each call's state
  output fed back as the next call's state input, follows the reference model called three times
  (its attribute carrying the state).

The adversarial pair state_honest / state_ignored (a program that ignores its state input) runs in
tests/gpu/test_verifier_gpu.py with the rest of the catalogue. Seeds are fixed (SEED).
Run with ``pytest -m gpu tests/gpu/test_stateful_gpu.py``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stitchcuda import frontend  # noqa: E402
from stitchcuda.pipeline import build_program  # noqa: E402
from stitchcuda.program import Program  # noqa: E402
from stitchcuda.verifier.verification import VerifyOptions, verify_program  # noqa: E402
from stitchcuda.verifier.measure.timing import LoopSettings  # noqa: E402
from tests.dev_problems import STATEFUL, STATEFUL_MODELS, dev_id, dev_reference  # noqa: E402

pytestmark = pytest.mark.gpu

SEED = 20261122
QUICK_TIMING = LoopSettings(min_trials=20, min_seconds=0.2, max_seconds=2.0)
CASES = [("model", p) for p in STATEFUL_MODELS] + [("dev", k) for k in STATEFUL]
IDS = [p.stem for p in STATEFUL_MODELS] + [dev_id(k) for k in STATEFUL]


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_stateful_reference_builds_and_verifies(tmp_path, case, policy):
    kind, what = case
    # A frontend.Reference: the folder gets reference.py, so the Verifier needs no dataset.
    ref = frontend.load_reference(what) if kind == "model" else dev_reference(what)
    out = build_program(ref, precision=policy, out=tmp_path / f"{ref.name}-{policy}", arch=_arch(), quiet=True)
    assert out.ok, out.build.message if out.build else "not built"
    (st,) = out.manifest.state
    assert st.attribute == "hidden" and st.input == "state_hidden"
    # torch.compile baselines for the small model (a forward that reassigns an attribute), not for 3:33's 2.5 GiB
    v = verify_program(out.directory, options=VerifyOptions(compile=kind == "model", reference_profile=False,
                                                            profile=False, timing=QUICK_TIMING, seed=SEED,
                                                            weights_seed=SEED))
    assert v.result.ok, f"seed {SEED}: {v.result.verdict.summary()}"
    judged = {o.name for t in v.result.trials for o in t.outputs}
    assert st.output in judged, "the state output is judged like any other"
    assert len(v.result.trials) >= 5 and all(t.passed for t in v.result.trials)


def test_program_carries_the_state_across_calls(tmp_path):
    """Program.load: the state is an input and an output; fed back, three calls follow the model."""
    path = STATEFUL_MODELS[0]
    out = build_program(str(path), precision="fp32", out=tmp_path / "rnn", arch=_arch(), quiet=True)
    assert out.ok, out.build.message if out.build else "not built"
    ref = frontend.load_reference(path)
    torch.manual_seed(0)  # the weights build_program wrote: Model(*get_init_inputs()) on the CPU after seed 0
    model = ref.Model(*ref.get_init_inputs()).cuda()
    model.hidden = model.hidden.cuda()  # a plain attribute: .cuda() leaves it where it was
    prog = Program.load(out.directory)
    names = [t.name for t in prog.manifest.inputs]
    state = model.hidden.clone()  # the state the model starts with, as the caller holds it
    torch.manual_seed(SEED)
    for step in range(3):
        x = torch.rand(64, 256, device="cuda")
        with torch.no_grad():
            want = model(x)
        feed = {"x": x, "state_hidden": state}
        y, state = prog(*[feed[n] for n in names])
        torch.cuda.synchronize()
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4, msg=lambda m: f"step {step}: {m}")
        torch.testing.assert_close(state, model.hidden, rtol=1e-4, atol=1e-4, msg=lambda m: f"step {step}: {m}")
    assert state.abs().max() > 0.1, "the state moved away from its zero start"
