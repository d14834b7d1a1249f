"""References that keep state between calls in a plain tensor attribute, end to end on the CPU.

* ``stitchcuda build`` lifts the state (capture with ``state="lift"``): models/stateful_rnn_cell.py
  and KernelBench 3:33 (VanillaRNN, when the development set is there) go through capture, plan,
  code and nvcc; the manifest's ``state`` names the attribute, the input holding its value before
  the call and the output holding it after, and round-trips;
* a malformed ``state`` is a format error naming the field;
* the Verifier supplies the state (fake runner, a reference written for the test, and the built
  manifest of models/stateful_rnn_cell.py): the first draw gives the model's own initial state,
  the others fresh non-zero values; the reference's attribute is set before forward and read after
  it, and put back; an honest program passes, one that ignores its state input is a wrong answer;
* a reference that changes an attribute its manifest does not list as state is refused before
  anything runs, and so is a manifest naming an attribute the model does not have.

Seeds are fixed (SEED).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stitchcuda import manifest as mf  # noqa: E402
from stitchcuda.pipeline import build_program  # noqa: E402
from stitchcuda.verifier import build_result  # noqa: E402
from stitchcuda.verifier.run import harness, reference  # noqa: E402
from stitchcuda.verifier.run.correctness import check_correctness  # noqa: E402
from tests.dev_problems import DEV_SET, STATEFUL, STATEFUL_MODELS, dev_id, dev_reference  # noqa: E402
from tests.fake_program import FunctionRunner  # noqa: E402

SEED = 20261122
RNN_CELL = STATEFUL_MODELS[0]


# ---------------------------------------------------------------------- build


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("stitchcuda-cache")


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
def test_stateful_model_builds_with_its_state_explicit(nvcc, cache, tmp_path, policy):
    out = build_program(str(RNN_CELL), precision=policy, out=tmp_path / "rnn", quiet=True, cache=cache)
    assert out.ok, out.build.message
    m = out.manifest
    assert [t.name for t in m.inputs] == ["x", "state_hidden"]
    assert m.state == (mf.CarriedState("hidden", "state_hidden", m.outputs[-1].name),)
    assert len(m.outputs) == 2 and m.outputs[-1].shape == m.inputs[-1].shape == (64, 512)
    loaded = mf.load_program_dir(out.directory, require_weights=True)
    assert loaded.manifest == m and loaded.library is not None
    assert json.loads((out.directory / mf.MANIFEST_FILE).read_text())["state"] == [
        {"attribute": "hidden", "input": "state_hidden", "output": m.outputs[-1].name}]


@pytest.mark.parametrize("key", STATEFUL, ids=[dev_id(k) for k in STATEFUL])
def test_stateful_dev_problem_builds(nvcc, cache, tmp_path, key):
    """3:33 keeps its hidden state in ``self.hidden`` (``copy_`` then reassigned): it used to be
    refused ("state kept between calls, which is not supported yet")."""
    out = build_program(dev_reference(key), precision="tf32", out=tmp_path / "p", weights=False, quiet=True,
                        cache=cache)
    assert out.ok, out.build.message
    m = out.manifest
    assert [t.name for t in m.inputs] == ["x", "initial_hidden", "state_hidden"]
    (st,) = m.state
    assert (st.attribute, st.input) == ("hidden", "state_hidden") and st.output == m.outputs[-1].name
    assert mf.load_program_dir(out.directory).manifest == m


def test_optimize_loop_captures_state_too(tmp_path):
    """``stitchcuda optimize``'s problem: captured once with the state lifted; every candidate's
    manifest records it."""
    from stitchcuda.pipeline import capture_problem

    p = capture_problem(str(RNN_CELL), precision="fp32", arch="sm_90")
    assert [(s.attribute, s.input) for s in p.state] == [("hidden", "state_hidden")]
    assert [t.name for t in p.graph.inputs] == ["x", "state_hidden"]
    built = p.write(p.plan({}), tmp_path / "cand", compile=False)
    assert built.ok and built.program.root == tmp_path / "cand"
    m = mf.Manifest.load(built.directory)
    assert [(s.attribute, s.input, s.output) for s in m.state] == [("hidden", "state_hidden", m.outputs[-1].name)]


# ---------------------------------------------------------------------- the manifest


def _manifest(**extra) -> dict:
    return {"format": "stitchcuda-program", "version": 1, "name": "t", "abi_version": 1, "precision": "fp32",
            "arch": "sm_90", "source_hash": "0" * 64, "reference": {"path": "ref.py"},
            "inputs": [{"name": "x", "dtype": "float32", "shape": [4, 8]},
                       {"name": "state_h", "dtype": "float32", "shape": [4, 8]}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": [4, 8]},
                        {"name": "h_next", "dtype": "float32", "shape": [4, 8]}], **extra}


def test_manifest_state_round_trips():
    m = mf.Manifest.from_dict(_manifest(state=[{"attribute": "h", "input": "state_h", "output": "h_next"}]))
    assert m.state == (mf.CarriedState("h", "state_h", "h_next"),)
    assert mf.Manifest.from_json(m.to_json()) == m
    assert "state" not in mf.Manifest.from_dict(_manifest()).to_dict(), "stateless manifests are unchanged"


@pytest.mark.parametrize("state, where, says", [
    ({"h": 1}, "state", "expected a list"),
    ([{"input": "state_h", "output": "h_next"}], "state[0]", 'missing required field "attribute"'),
    ([{"attribute": "h", "input": "nope", "output": "h_next"}], "state[0].input", "is not one of the inputs"),
    ([{"attribute": "h", "input": "state_h", "output": "nope"}], "state[0].output", "is not one of the outputs"),
    ([{"attribute": "h", "input": "state_h", "output": "h_next"},
      {"attribute": "g", "input": "x", "output": "h_next"}], "state[1].output", "named by an earlier state entry"),
    ([{"attribute": "", "input": "state_h", "output": "h_next"}], "state[0].attribute", "must not be empty"),
])
def test_manifest_state_format_errors_name_the_field(state, where, says):
    with pytest.raises(mf.ManifestError) as err:
        mf.Manifest.from_dict(_manifest(state=state), "m.json")
    assert f"m.json: {where}: " in str(err.value) and says in str(err.value), str(err.value)


def test_manifest_state_input_and_output_must_agree():
    d = _manifest(state=[{"attribute": "h", "input": "state_h", "output": "h_next"}])
    d["outputs"][1]["shape"] = [4, 9]
    with pytest.raises(mf.ManifestError, match=r"state\[0\]: input state_h \(float32\[4, 8\]\) and output h_next"):
        mf.Manifest.from_dict(d)
    d = _manifest(state=[{"attribute": "h", "input": "noise", "output": "h_next"}],
                  lifted_random=[{"input": "noise"}])
    d["inputs"].append({"name": "noise", "dtype": "float32", "shape": [4, 8]})
    with pytest.raises(mf.ManifestError, match=r"state\[0\]\.input: 'noise' is a lifted random draw"):
        mf.Manifest.from_dict(d)


# ---------------------------------------------------------------------- the Verifier, with a fake program


#: y = 2 tanh(x + h / 2), and h becomes tanh(x + h / 2); h starts at zero. Every output depends on h.
DECAY_SOURCE = """import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.h = torch.zeros(16, 32)
    def forward(self, x):
        self.h = torch.tanh(x + 0.5 * self.h)
        return 2 * self.h
def get_inputs(): return [torch.randn(16, 32)]
def get_init_inputs(): return []
"""


def _decay_problem(tmp_path: Path, source: str = DECAY_SOURCE, state=True) -> harness.ReferenceHarness:
    path = tmp_path / "ref.py"
    path.write_text(source)
    d = {"format": "stitchcuda-program", "version": 1, "name": "decay", "abi_version": 1, "precision": "fp32",
         "arch": "sm_90", "source_hash": "0" * 64, "reference": {"path": str(path)},
         "inputs": [{"name": "x", "dtype": "float32", "shape": [16, 32]}],
         "outputs": [{"name": "y", "dtype": "float32", "shape": [16, 32]}]}
    if state:
        d["inputs"].append({"name": "state_h", "dtype": "float32", "shape": [16, 32]})
        d["outputs"].append({"name": "h_next", "dtype": "float32", "shape": [16, 32]})
        d["state"] = [{"attribute": "h", "input": "state_h", "output": "h_next"}]
    m = mf.Manifest.from_dict(d)
    spec = reference.resolve_reference(str(path), tmp_path)
    reference.validate_reference(spec, m)
    return harness.ReferenceHarness(spec, m, "cpu", weights_seed=SEED)


def _verdict(P, fn, policy="fp32"):
    res = check_correctness(FunctionRunner(fn, every=True), P, precision=policy, seed=SEED)
    return build_result(trials=res.trials, checks=res.checks, tolerance=res.tolerance), res


def _honest(x, h):
    h2 = torch.tanh(x + 0.5 * h)
    return 2 * h2, h2


def _ignores_state(x, h):
    return _honest(x, torch.zeros_like(h))


def test_draws_supply_the_state_and_the_reference_reads_it(tmp_path):
    P = _decay_problem(tmp_path)
    assert P.state_indices == (1,)
    first, second = P.draw(11), P.draw(12)
    assert torch.equal(first.program[1], torch.zeros(16, 32)), "the first draw: the model's own initial state"
    assert second.program[1].abs().min() > 0 and second.program[1].std() > 0.5, "later draws: non-zero, varied"
    assert torch.equal(P.draw(12).program[1], second.program[1]), "a seed draws the same state again"
    assert torch.equal(P.draw(11).program[1], first.program[1])
    before = P.model.h
    y, h_next = P.forward(second)
    torch.testing.assert_close(h_next, torch.tanh(second.program[0] + 0.5 * second.program[1]), rtol=0, atol=0)
    torch.testing.assert_close(y, 2 * h_next, rtol=0, atol=0)
    assert P.model.h is before and not before.any(), "the model's attribute is put back"
    y64, h64 = P.forward64(second)
    assert y64.dtype == torch.float64 and (h64 - h_next.double()).abs().max() < 1e-6


def test_honest_stateful_program_passes(tmp_path):
    v, res = _verdict(_decay_problem(tmp_path), _honest)
    assert v.ok, [c for c in res.checks if c.status == "fail"] or v.verdict
    assert [o.name for o in res.trials[0].outputs] == ["y", "h_next"]


@pytest.mark.parametrize("fake", [
    _ignores_state,  # computes as if the state were zeros (the model's initial state)
    lambda x, h: (_honest(x, h)[0], torch.tanh(x)),  # right output, the state handed back ignores h
    lambda x, h: (2 * torch.tanh(x), _honest(x, h)[1]),  # right state, the output ignores h
])
def test_program_ignoring_its_state_input_is_refused(tmp_path, fake):
    P = _decay_problem(tmp_path)
    v, res = _verdict(P, fake)
    assert v.kind == "wrong_answer", v.verdict
    failed = [t for t in res.trials if not t.passed]
    assert failed and res.trials[0].passed, "trial 0 holds the initial (zero) state: only the later trials catch it"


def test_built_rnn_cell_verified_with_a_fake_program(tmp_path):
    """The manifest ``stitchcuda build`` writes for models/stateful_rnn_cell.py, verified on the CPU:
    a fake program computing the cell from the Verifier's weights (what create() gets) passes; the
    same program with the state input replaced by zeros fails."""
    out = build_program(str(RNN_CELL), precision="fp32", out=tmp_path / "rnn", weights=False, compile=False,
                        quiet=True)
    m = out.manifest
    spec = reference.resolve_reference(str(RNN_CELL), tmp_path)
    reference.validate_reference(spec, m)
    P = harness.ReferenceHarness(spec, m, "cpu", weights_seed=SEED)
    w = dict(zip((t.name for t in m.weights), P.weights))

    def cell(x, h):
        h2 = torch.tanh(x @ w["x2h.weight"].T + w["x2h.bias"] + h @ w["h2h.weight"].T)
        return h2 @ w["h2o.weight"].T + w["h2o.bias"], h2

    v, res = _verdict(P, cell)
    assert v.ok, [c for c in res.checks if c.status == "fail"] or v.verdict
    v, res = _verdict(P, lambda x, h: cell(x, torch.zeros_like(h)))
    assert v.kind == "wrong_answer", v.verdict


# ---------------------------------------------------------------------- refused before anything runs


def test_state_the_manifest_does_not_list_is_refused(tmp_path):
    with pytest.raises(reference.ProblemError, match="forward changes the tensor attribute 'h', state kept between "
                                                   "calls that the manifest's state does not list"):
        _decay_problem(tmp_path, state=False)


def test_state_attribute_the_model_lacks_is_refused(tmp_path):
    with pytest.raises(reference.ProblemError, match=r"state\[0\]\.attribute: the reference model has no plain tensor "
                                                   r"attribute 'h'"):
        _decay_problem(tmp_path, DECAY_SOURCE.replace("self.h", "self.g"))


def test_kernelbench_3_33_state_is_overwritten_by_its_input(tmp_path):
    """3:33 copies ``initial_hidden`` into its state before using it: the state input's value does not
    matter there, and the Verifier judges the state output against the attribute after the call."""
    if not DEV_SET.is_file():
        pytest.skip(f"KernelBench development set not found at {DEV_SET}")
    from tests.dev_problems import shrink

    row_source = dev_reference(STATEFUL[0]).source
    small = shrink(row_source, dict(batch_size="8", input_size="16", hidden_size="32", output_size="12"))
    ref_path = tmp_path / "vrnn.py"
    ref_path.write_text(small)
    out = build_program(str(ref_path), precision="fp32", out=tmp_path / "p", weights=False, compile=False, quiet=True)
    spec = reference.resolve_reference(str(ref_path), tmp_path)
    reference.validate_reference(spec, out.manifest)
    P = harness.ReferenceHarness(spec, out.manifest, "cpu", weights_seed=SEED)
    w = dict(zip((t.name for t in out.manifest.weights), P.weights))

    def vanilla(x, h0, state):
        h = torch.tanh(torch.cat([x, h0], 1) @ w["i2h.weight"].T + w["i2h.bias"])
        return h @ w["h2o.weight"].T + w["h2o.bias"], h

    v, res = _verdict(P, vanilla)
    assert v.ok, [c for c in res.checks if c.status == "fail"] or v.verdict
    assert math.isfinite(res.trials[1].outputs[1].max_abs_err)


# ---------------------------------------------------------------------- the adversarial pair

ADV = Path(__file__).resolve().parent / "adversarial"


@pytest.mark.parametrize("name, fake, ok", [("state_honest", _honest, True), ("state_ignored", _ignores_state, False)])
def test_adversarial_state_pair_on_a_fake_runner(tmp_path, name, fake, ok):
    """The two folders' manifests and reference, each program's kernel mirrored in Python: the
    honest one passes, the one that ignores its state input is a wrong answer (on the GPU:
    tests/gpu/test_verifier_gpu.py, the compiled programs themselves)."""
    m = mf.Manifest.load(ADV / name)
    spec = reference.resolve_reference(None, ADV / name, m)
    reference.validate_reference(spec, m)
    P = harness.ReferenceHarness(spec, m, "cpu", weights_seed=SEED)
    v, res = _verdict(P, fake)
    assert v.ok == ok and (ok or v.kind == "wrong_answer"), v.verdict


@pytest.mark.parametrize("name", ["state_honest", "state_ignored"])
def test_adversarial_state_pair_builds_and_passes_the_sandbox(tmp_path, nvcc, monkeypatch, name):
    """Without a GPU the Verifier gets as far as static rules, build and sandbox: both programs clear
    them (what refuses the cheat is the trials), and the run is inconclusive, never a pass."""
    import shutil

    from stitchcuda.verifier.verification import VerifyEnvironmentError, VerifyOptions, verify_program

    monkeypatch.setenv("STITCHCUDA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    d = tmp_path / name
    d.mkdir()
    for f in ("program.cu", "manifest.json"):
        shutil.copy(ADV / name / f, d / f)
    data = json.loads((d / "manifest.json").read_text())
    data["reference"]["path"] = str((ADV / name / data["reference"]["path"]).resolve())
    (d / "manifest.json").write_text(json.dumps(data, indent=2))
    with pytest.raises(VerifyEnvironmentError) as e:
        verify_program(d, options=VerifyOptions(seed=SEED, weights_seed=SEED))
    v = e.value.verification
    assert v.result.kind == "inconclusive" and v.result.verdict.ran == ("static rules", "build", "sandbox"), \
        v.result.verdict.summary()
