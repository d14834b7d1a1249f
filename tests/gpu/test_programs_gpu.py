"""Generated programs on the GPU, end to end, against the PyTorch reference in float64.

For every model in models/ and every covered KernelBench development problem (real sizes),
under fp32 (tolerance 1e-4) and tf32 (1e-2):

* the program is built by the deterministic pipeline (capture -> plan -> code -> nvcc for this
  GPU) and created with the weights of the reference model built with seed 0;
* 5 trials with fresh inputs from ``get_inputs()`` (seeds 1000..1004), each into the same
  input and output buffers on a side stream — so trial 0 runs eagerly, trial 1 is captured as a
  CUDA graph and launched, trials 2-4 replay it — outputs poisoned with NaN before every run,
  inputs checked unchanged after it, every output compared with the reference computed in
  float64 (the fp32 reference with TF32 off where float64 does not fit in memory) and, as the
  Verifier does, with PyTorch allowed the same precision: each element within the tolerance of
  either; NaN never passes; results must follow the inputs (a replay computes, it does not
  recall). A model whose ``PRECISION_SENSITIVE`` names the policy is built to miss the tolerance
  in one attempt (the optimisation loop repairs it: ``test_optimize_gpu.py``): it is held to
  ten times the tolerance, so a wrong answer still fails;
* three more runs on the legacy default stream into fresh buffers (eager, captured, replayed by way of
  the runtime's own stream, in the legacy stream's order).

And one program run in a child process where ``import torch`` is blocked: Program.load, NumPy in,
rt.DeviceTensor out, checked against NumPy in float64.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stitchcuda import build as B  # noqa: E402
from stitchcuda import frontend  # noqa: E402
from stitchcuda import manifest as mf  # noqa: E402
from stitchcuda import precision  # noqa: E402
from stitchcuda.pipeline import build_program  # noqa: E402
from tests.dev_problems import MODELS, SUPPORTED, dev_id, dev_reference  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("exact_fp32")]

TOL = {"fp32": 1e-4, "tf32": 1e-2}
TRIALS = 5
SEED0 = 1000

CASES = [("model", p) for p in MODELS] + [("dev", k) for k in SUPPORTED]
IDS = [p.stem for p in MODELS] + [dev_id(k) for k in SUPPORTED]


def _reference(case):
    kind, what = case
    return frontend.load_reference(what) if kind == "model" else dev_reference(what)


def _model(ref, dtype=None):
    """Model(*get_init_inputs()) built on the GPU after torch.manual_seed(0): two calls give the
    same weights, so the float64 copy is the program's model exactly."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = ref.Model(*ref.get_init_inputs())
    return m.to(dtype) if dtype is not None else m


def _weights(model, manifest) -> list:
    """The program's weights, in manifest order, from the model (parameters and all buffers)."""
    named = dict(model.named_parameters(remove_duplicate=False))
    named.update(dict(model.named_buffers(remove_duplicate=False)))
    return [named[w.name].detach().contiguous() for w in manifest.weights]


def _inputs(ref, seed: int) -> list:
    """get_inputs() after torch.manual_seed(seed), drawn on the GPU."""
    torch.manual_seed(seed)
    with torch.device("cuda"):
        return list(ref.get_inputs())


def _as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _forward64(model64, model32, args):
    """The reference's outputs in float64 (fp32 with TF32 off when float64 does not fit)."""
    try:
        with torch.no_grad():
            out = model64(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args])
        return [o.double() for o in _as_list(out)], "float64"
    except torch.cuda.OutOfMemoryError:
        gc.collect()
        torch.cuda.empty_cache()
        with torch.no_grad():
            out = model32(*args)
        return [o.double() for o in _as_list(out)], "float32 (float64 does not fit)"


def _forward_same(model32, args, policy: str):
    """A function giving output ``i`` of PyTorch allowed the policy's precision (TF32 off for fp32),
    computed on first use only: most outputs pass against float64, and a large problem has no room
    for another copy of its outputs."""
    memo: list = []

    def output(i: int) -> torch.Tensor:
        if not memo:
            with torch.no_grad(), precision.get(policy).baseline():
                memo.extend(_as_list(model32(*args)))
        return memo[i]
    return output


def _check(out: torch.Tensor, ref: torch.Tensor, tol: float, what: str, same=None) -> None:
    """:func:`_check_against` the float64 reference; failing that, where ``same`` (a function giving
    PyTorch's output at the same precision) is given, each element within the tolerance of either."""
    try:
        _check_against(out, ref, tol, what)
    except AssertionError:
        if same is None:
            raise
        _check_against(out, ref, tol, what, same())


def _check_against(out: torch.Tensor, ref: torch.Tensor, tol: float, what: str, same: torch.Tensor | None = None,
                   chunk: int = 1 << 26) -> None:
    """|out - ref| <= tol + tol * |ref| everywhere (or, where ``same`` is given, that bound
    against ``same`` instead), NaN only where the reference has NaN; in chunks, so that checking
    a 6 GB output does not need another 25 GB."""
    assert out.shape == ref.shape, what
    o_flat, r_flat = out.reshape(-1), ref.reshape(-1)
    s_flat = same.reshape(-1) if same is not None else None
    worst = 0.0
    for i in range(0, o_flat.numel(), chunk):
        o = o_flat[i:i + chunk].double()
        r = r_flat[i:i + chunk]
        bad = torch.isnan(o) & ~torch.isnan(r)
        assert not bad.any(), f"{what}: NaN element(s) (unwritten or wrong) near flat index {i}"
        err = (o - r).abs()
        excess = err - (tol + tol * r.abs())
        if s_flat is not None:
            sr = s_flat[i:i + chunk].double()
            excess = torch.minimum(excess, (o - sr).abs() - (tol + tol * sr.abs()))
        excess = excess.nan_to_num(nan=0.0).max().item()
        worst = max(worst, err.nan_to_num(0.0).max().item())
        assert excess <= 0, f"{what}: error {worst:.3e} over tolerance {tol} near flat index {i}"


#: Inputs plus outputs past this many bytes make a problem large: with its float64 reference and the
#: program's buffers it can take most of an 80 GB card (KernelBench's level-1 sizes reach 75 GB).
LARGE_BYTES = 1 << 30


@contextlib.contextmanager
def _alone_if_large(manifest):
    """Hold a lock every test process shares while a large problem runs, so that under pytest-xdist
    two of them never share the card (on an H100 three at once ran it out of memory); small ones
    run beside each other (a process's cache is handed back after a large one)."""
    size = sum(t.nbytes for t in manifest.inputs + manifest.outputs)
    if size <= LARGE_BYTES:
        yield
        return
    with open(Path(tempfile.gettempdir()) / "stitchcuda-gpu-large.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            gc.collect()
            torch.cuda.empty_cache()  # this process's cache handed back before the next large one runs
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("gpu-programs")


def _poisoned(specs) -> list:
    out = []
    for s in specs:
        dt = getattr(torch, s.dtype)
        fill = float("nan") if dt.is_floating_point else 0
        out.append(torch.full(s.shape, fill, dtype=dt, device="cuda"))
    return out


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_program_matches_reference(case, policy, workdir):
    ref = _reference(case)
    tol = TOL[policy]
    if policy in getattr(ref.module, "PRECISION_SENSITIVE", ()):
        tol *= 10  # built to miss the tolerance in one attempt; the loop repairs it (test_optimize_gpu.py)
    major, minor = torch.cuda.get_device_capability()
    outcome = build_program(ref, precision=policy, out=workdir / f"{ref.name}-{policy}", arch=f"sm_{major}{minor}",
                            weights=False, quiet=True)
    assert outcome.ok, outcome.build.message if outcome.build else "not built"
    m = outcome.manifest
    if m.lifted_random:
        pytest.skip("draws inside forward: compared through the captured graph by the Verifier")
    with _alone_if_large(m):
        _trials(ref, m, outcome, policy, tol)


def _trials(ref, m, outcome, policy: str, tol: float) -> None:
    model = _model(ref)
    model64 = _model(ref, torch.float64)
    inst = B.load(outcome.build).create(_weights(model, m), device=torch.cuda.current_device())

    # Trials on a side stream into the same buffers: eager, then captured, then replayed.
    side = torch.cuda.Stream()
    staged_in = staged_out = first = None
    for trial in range(TRIALS):
        args = _inputs(ref, SEED0 + trial)
        fresh = [a.contiguous() for a in args if isinstance(a, torch.Tensor)]
        if staged_in is None:
            staged_in = [torch.empty_like(t) for t in fresh]
            staged_out = _poisoned(m.outputs)
        for dst, src in zip(staged_in, fresh):
            dst.copy_(src)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for o in staged_out:
                o.fill_(float("nan") if o.is_floating_point() else 0)
            inst.run(staged_in, staged_out, stream=side.cuda_stream)
        torch.cuda.synchronize()
        for i, (t, src) in enumerate(zip(staged_in, fresh)):
            assert torch.equal(t, src), f"trial {trial}: the program changed input {i}"
        want, how = _forward64(model64, model, args)
        same = _forward_same(model, args, policy)
        for i, (o, r) in enumerate(zip(staged_out, want)):
            _check(o, r, tol, f"{ref.name} {policy} trial {trial} output {i} (vs {how})", lambda i=i: same(i))
        head = [o.reshape(-1)[: 1 << 20].clone() for o in staged_out]  # a sample, not a copy of 6 GB
        if trial == 0:
            first = head
        elif trial == TRIALS - 1:
            assert any(not torch.equal(a, b) for a, b in zip(first, head)), "outputs did not follow the inputs"
        del want, same, fresh, args
        gc.collect()
        torch.cuda.empty_cache()

    # The legacy default stream, into fresh buffers, three times (eager, captured, replayed on the
    # runtime's own stream, in the legacy stream's order): the outputs poisoned before each run on
    # the legacy stream, and read there after it, with no synchronisation between.
    del staged_in, staged_out, first
    gc.collect()
    torch.cuda.empty_cache()
    args = _inputs(ref, SEED0 + TRIALS)
    fresh = [a.contiguous() for a in args if isinstance(a, torch.Tensor)]
    outs = _poisoned(m.outputs)
    want, how = _forward64(model64, model, args)
    same = _forward_same(model, args, policy)
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.default_stream()):
        for run in ("eager", "captured", "replayed"):
            for o in outs:
                o.fill_(float("nan") if o.dtype.is_floating_point else 0)
            inst.run(fresh, outs, stream=0)
            got = [o.clone() for o in outs]
            torch.cuda.synchronize()
            for i, (o, r) in enumerate(zip(got, want)):
                _check(o, r, tol, f"{ref.name} {policy} default stream, {run}, output {i} (vs {how})",
                       lambda i=i: same(i))
    inst.close()


def test_program_runs_without_torch(tmp_path):
    """Program.load + NumPy in a child process in which ``import torch`` fails."""
    mlp = next(p for p in MODELS if p.stem == "mlp")
    major, minor = torch.cuda.get_device_capability()
    out = tmp_path / "mlp"
    o = build_program(mlp, out=out, arch=f"sm_{major}{minor}", quiet=True)
    assert o.ok
    script = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # any import of torch now raises
        import numpy as np
        from safetensors.numpy import load_file
        import stitchcuda
        from stitchcuda.program import Program

        prog = Program.load({str(out)!r})
        w = load_file({str(out / mf.WEIGHTS_FILE)!r})
        rng = np.random.default_rng(7)
        for trial in range(3):
            x = rng.random((256, 512), dtype=np.float32)
            y = prog(x)
            host = np.full((256, 256), np.nan, np.float32)
            stitchcuda.rt.d2h(host, y)
            stitchcuda.rt.synchronize()
            h = np.maximum(x.astype(np.float64) @ w["fc1.weight"].T.astype(np.float64) + w["fc1.bias"], 0)
            h = np.maximum(h @ w["fc2.weight"].T.astype(np.float64) + w["fc2.bias"], 0)
            ref = h @ w["fc3.weight"].T.astype(np.float64) + w["fc3.bias"]
            assert not np.isnan(host).any(), "unwritten output"
            err = np.abs(host - ref).max()
            assert np.allclose(host, ref, rtol=1e-4, atol=1e-4), f"trial {{trial}}: max error {{err}}"
        assert sys.modules.get("torch") is None, "torch was imported"
        print("OK", type(y).__name__)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                       cwd=str(Path(__file__).resolve().parents[2]))
    assert r.returncode == 0 and "OK DeviceTensor" in r.stdout, r.stdout + r.stderr


def test_program_callable_with_torch(tmp_path):
    """Program(...) with PyTorch tensors returns PyTorch tensors, on PyTorch's current stream;
    with ``out=`` and one stream the second call is captured and the third replayed."""
    from stitchcuda.program import Program, ProgramError

    mlp = next(p for p in MODELS if p.stem == "mlp")
    major, minor = torch.cuda.get_device_capability()
    o = build_program(mlp, out=tmp_path / "mlp", arch=f"sm_{major}{minor}", quiet=True)
    assert o.ok
    prog = Program.load(tmp_path / "mlp")
    ref = frontend.load_reference(mlp)
    torch.manual_seed(0)
    model = ref.Model(*ref.get_init_inputs()).double().cuda()
    y = prog(torch.rand(256, 512, device="cuda"))
    assert isinstance(y, torch.Tensor) and y.device.type == "cuda" and y.shape == (256, 256)
    x = torch.empty(256, 512, device="cuda")
    out = torch.empty(256, 256, device="cuda")
    s = torch.cuda.Stream()
    for trial in range(4):
        x.copy_(torch.rand(256, 512, device="cuda"))
        out.fill_(float("nan"))
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            got = prog(x, out=[out])
        torch.cuda.synchronize()
        assert got is out
        _check(out, model(x.double()), 1e-4, f"mlp via Program, call {trial}")
    with pytest.raises(ProgramError, match="input 0 'x'"):
        prog(torch.rand(3, 512, device="cuda"))
