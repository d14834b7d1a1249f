"""Dynamic programs on the GPU: one program run at every batch size of its range, against the reference.

Each reference of tests/test_dynamic.py (a conv net with batch statistics; an MLP with a mean over the
batch) and models/gpt_block.py is built once over a batch range (``build_dynamic``; gpt_block also over
batch and sequence length together), loaded with ``Program.load`` and called at several sizes in one
process — each a shape of its own, so each captures its own CUDA graph — and compared with the
reference model at that size
(fp32 programs to 1e-4 of float64, tf32 to 1e-2). A size out of range and inputs that disagree on the
batch are refused by the Python check and, called past it, by the program's own check, each with
one line naming the input, the dimension and the symbol.
Run with ``pytest -m gpu tests/gpu/test_dynamic_gpu.py``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stitchcuda import dynamic as D  # noqa: E402
from stitchcuda import frontend  # noqa: E402
from stitchcuda.program import Program, ProgramError  # noqa: E402
from tests.test_dynamic import CONV, MLP  # noqa: E402

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _build(tmp_path, name, text_or_path, dims, precision, **more):
    path = text_or_path if isinstance(text_or_path, Path) else tmp_path / f"{name}.py"
    if not isinstance(text_or_path, Path):
        path.write_text(text_or_path)
    o = D.build_dynamic(path, dims, precision=precision, out=tmp_path / f"{name}-prog", arch=_arch(), **more)
    assert o.ok, o.build.message if o.build else ""
    return frontend.load_reference(path), Program.load(o.directory)


def _error(ref, prog, batch, variable="batch_size", **more):
    with D.Sizes(ref.module, {variable: batch, **more}):
        model, inputs = ref.instantiate(seed=0)
    # the program's weights were drawn from the same seed: the same model
    got = prog(*[x.cuda() for x in inputs])
    with torch.no_grad():
        want = copy.deepcopy(model).double()(*[x.double() for x in inputs])
    assert tuple(got.shape) == tuple(want.shape)
    return ((got.double().cpu() - want).abs() / (1 + want.abs())).max().item()


@pytest.mark.parametrize("name, text, dims, tol", [("conv", CONV, ["batch=1:16"], 1e-4),
                                                    ("mlp", MLP, ["batch=1:24"], 1e-4)])
def test_one_program_every_batch(tmp_path, name, text, dims, tol):
    ref, prog = _build(tmp_path, name, text, dims, "fp32")
    hi = int(dims[0].split(":")[1])
    for batch in (1, 3, hi, 2, 7, hi - 1, 1):   # back and forth: each shape replays its own graph
        assert _error(ref, prog, batch) < tol, batch
    with pytest.raises(ProgramError, match=rf"dimension 0 \(batch\) is {hi + 1}: this program serves batch 1\.\.{hi}"):
        prog(torch.randn(hi + 1, *prog.inputs[0].shape[1:], device="cuda"))


def test_sizes_served_in_turn_replay_their_graphs(tmp_path):
    """Eight batch sizes in rotation, into the same buffers per size on a stream of their own: after
    two rounds (eager, then captured) the third replays a graph for every size — no capture and no
    eager launch — and stays right (a program keeping four graphs captured anew every other call)."""
    from torch.profiler import ProfilerActivity, profile

    ref, prog = _build(tmp_path, "mlp", MLP, ["batch=1:24"], "fp32")
    sizes = (1, 2, 3, 5, 8, 13, 21, 24)
    bufs = {b: (torch.randn(b, *prog.inputs[0].shape[1:], device="cuda"),
                torch.empty(b, *prog.outputs[0].shape[1:], device="cuda")) for b in sizes}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    inst = prog.instance(0)
    with torch.cuda.stream(side):
        for _ in range(2):
            for b in sizes:
                inst.run([bufs[b][0]], [bufs[b][1]], stream=side.cuda_stream)
        side.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for b in sizes:
                inst.run([bufs[b][0]], [bufs[b][1]], stream=side.cuda_stream)
            side.synchronize()
    calls = {e.key: e.count for e in prof.key_averages() if e.key.startswith(("cuda", "cu"))}
    launches = sum(n for k, n in calls.items() if k.startswith(("cudaLaunchKernel", "cuLaunchKernel")))
    assert calls.get("cudaGraphLaunch", 0) == len(sizes), calls
    assert calls.get("cudaStreamBeginCapture", 0) == 0 and launches == 0, calls
    for b in sizes:  # the replays computed: each size's output against the model on its input
        with D.Sizes(ref.module, {"batch_size": b}):
            model, _ = ref.instantiate(seed=0)
        with torch.no_grad():
            want = copy.deepcopy(model).double()(bufs[b][0].double().cpu())
        err = ((bufs[b][1].double().cpu() - want).abs() / (1 + want.abs())).max().item()
        assert err < 1e-4, (b, err)


def test_the_programs_own_check_names_the_dimension(tmp_path):
    ref, prog = _build(tmp_path, "conv", CONV, ["batch=1:16"], "fp32")
    x = torch.randn(17, 3, 8, 8, device="cuda")
    out = torch.empty(17, 10, device="cuda")
    inst = prog.instance(0)
    with pytest.raises(Exception, match=r"input 0 'x' dimension 0 \(batch\) is 17: this program serves batch 1\.\.16"):
        inst.run([x], [out], stream=torch.cuda.current_stream().cuda_stream)


def test_a_transformer_block_over_its_batch(tmp_path):
    ref, prog = _build(tmp_path, "gpt_block", ROOT / "models" / "gpt_block.py", ["batch=1:8"], "tf32")
    for batch in (1, 2, 5, 8):
        assert _error(ref, prog, batch) < 1e-2, batch


def test_a_transformer_block_over_batch_and_sequence(tmp_path):
    # one program for batch 1..8 and sequence 16..255 (the causal mask's slice and block map made
    # once at the largest shape): five shapes, no two alike, each against the reference
    ref, prog = _build(tmp_path, "gpt_block", ROOT / "models" / "gpt_block.py", ["batch=1:8", "seq=16:255"], "tf32")
    for batch, seq in ((1, 16), (3, 100), (8, 255), (2, 64), (5, 33)):
        assert _error(ref, prog, batch, seq_len=seq) < 1e-2, (batch, seq)


def test_the_wheel_of_a_dynamic_transformer_takes_every_shape_without_pytorch(tmp_path):
    # gpt_block over batch 1..8 and sequence 16..255, verified across its range (smallest, one drawn
    # between, largest), packed, installed in a virtual environment without PyTorch and called there
    # on NumPy inputs of three batch sizes by two sequence lengths; a sequence past the range refused
    import json
    import subprocess
    import sys

    import numpy as np

    from stitchcuda.ship import wheel
    from stitchcuda.verifier.verification import VerifyOptions, verify_program
    from tests.test_wheel import torchless_venv

    ref, prog = _build(tmp_path, "gpt_block", ROOT / "models" / "gpt_block.py", ["batch=1:8", "seq=16:255"], "tf32")
    v = verify_program(prog.root, None, VerifyOptions(time=False, profile=False, compile=False, between=1))
    assert v.result.ok, v.result.verdict.summary()
    assert v.report.shapes[0] == "batch=1, seq=16" and v.report.shapes[-1] == "batch=8, seq=255"
    w = wheel.make_wheels(prog.root, archs=[_arch()], out=tmp_path / "dist")
    shapes = [(b, t) for b in (1, 3, 8) for t in (16, 200)]
    wants = {}
    for batch, seq in shapes:
        with D.Sizes(ref.module, {"batch_size": batch, "seq_len": seq}):
            model, inputs = ref.instantiate(seed=0)
        np.save(tmp_path / f"x{batch}_{seq}.npy", inputs[0].numpy())
        with torch.no_grad():
            wants[batch, seq] = copy.deepcopy(model).double()(inputs[0].double()).numpy()
    py = torchless_venv(tmp_path, [w.program, w.runtime], sys.executable, with_numpy=True)
    code = ("import json, numpy as np, gpt_block\nm = gpt_block.load()\nout = {}\n"
            f"for b, t in {shapes!r}:\n"
            f"    np.save({str(tmp_path)!r} + f'/y{{b}}_{{t}}.npy', m(np.load({str(tmp_path)!r} + f'/x{{b}}_{{t}}.npy')))\n"
            "try:\n    m(np.zeros((2, 256, 256), np.float32))\nexcept ValueError as e:\n    out['refused'] = str(e)\n"
            "try:\n    import torch\n    out['torch'] = True\nexcept ImportError:\n    out['torch'] = False\n"
            "print(json.dumps(out))\n")
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["torch"] is False
    assert "dimension 1 (seq) is 256: this program serves seq 16..255" in out["refused"], out["refused"]
    for (batch, seq), want in wants.items():
        got = np.load(tmp_path / f"y{batch}_{seq}.npy")
        assert got.shape == want.shape, (batch, seq)
        assert np.abs(got - want).max() <= 1e-2 * (1 + np.abs(want).max()), (batch, seq)


def test_the_verifier_judges_a_dynamic_program_across_its_range(tmp_path):
    # the whole Verifier (static rules, build, trials with varied inputs, the dynamic checks) at the
    # smallest size, the size named to tune at (timed, its library choices kept in the tuning file),
    # two drawn between and the largest (timed), one verdict; and at one size named
    import json

    from stitchcuda.verifier.run.shapes import range_shapes
    from stitchcuda.verifier.verification import VerifyOptions, verify_program

    ref, prog = _build(tmp_path, "conv", CONV, ["batch=1:16"], "fp32", tune_shapes=["batch=4"])
    o = VerifyOptions(time=True, profile=False, compile=False, between=2, seed=11)
    shapes = range_shapes(prog.manifest, o.seed, o.between)
    assert shapes[0] == (("batch", 1),) and shapes[-1] == (("batch", 16),) and len(shapes) == 5
    assert (("batch", 4),) in shapes
    v = verify_program(prog.root, None, o)
    assert v.result.ok, v.result.verdict.summary()
    said = json.loads((prog.root / "report.json").read_text())["notes"][0]
    assert said.startswith("judged at batch=16 of its range (batch 1..16); passed before at batch=1; "), said
    assert "batch=4 (" in said and " ms, " in said and "x eager fp32" in said, said
    assert v.report.shapes[-1] == "batch=16" and "batch=4" in v.report.shapes and v.report.timings is not None
    v = verify_program(prog.root, None, VerifyOptions(time=False, profile=False, compile=False, at=(("batch", 7),)))
    assert v.result.ok, v.result.verdict.summary()


def test_a_program_right_at_its_largest_shape_only_is_refused(tmp_path):
    # the program's run returns before its tasks at any size but its largest (its output unwritten):
    # judged at the largest alone it passes; over its range the Verifier refuses it at the smallest
    from stitchcuda.verifier.verification import VerifyOptions, verify_program

    ref, prog = _build(tmp_path, "conv", CONV, ["batch=1:16"], "fp32")
    cu = prog.root / "program.cu"
    text = cu.read_text()
    anchor = "for (int k = 0; k < kDynSyms; ++k) io.dyn[k] = st_dyn[k];\n"
    assert anchor in text
    cu.write_text(text.replace(anchor, anchor + "  if (st_dyn[0] != kDynLargest[0]) return ST_OK;\n", 1))
    quick = dict(time=False, profile=False, compile=False, between=1)
    assert verify_program(prog.root, None, VerifyOptions(at=(("batch", 16),), **quick)).result.ok
    v = verify_program(prog.root, None, VerifyOptions(**quick))
    # wrong where it writes something, refused where the Verifier sees its output left unwritten
    assert v.result.kind in ("wrong_answer", "rejected"), v.result.verdict.summary()
    assert v.report.notes[0].startswith("judged at batch=1 of its range"), v.report.notes[0]
    assert not v.result.ok and (prog.root / "report.json").exists()
