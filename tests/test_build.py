"""Build (CPU only; nvcc needed): reference -> program folder -> compiled library.

* every model in models/ and every covered development problem goes through capture (meta
  device), plan, code and ``nvcc -arch=sm_90``, each in at most 60 s; so do TF32 / bf16
  variants and small modules that take the rarer paths (fused attention with a boolean mask,
  permuted reductions, residual chains), so every code path of the coder meets nvcc;
* the development problems stitchcuda refuses end in the unsupported-op error naming what;
* the build cache: a second build is a hit in well under 2 s; the key follows the arch;
  ``STITCHCUDA_NEVER_COMPILE=1`` makes a miss a failed result; a compile error is a value;
  two processes' worth of threads building one source compile it once;
* ``stitchcuda build`` writes a complete, self-contained folder that ``Program.load`` opens
  without compiling, and ``Program`` refuses wrong inputs naming the input and its spec;
* planning, coding and writing a program, the loop and the suite runner import without PyTorch.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import stitchcuda
from stitchcuda import build as B
from stitchcuda import cli, frontend
from stitchcuda import manifest as mf
from stitchcuda import plan as P
from stitchcuda.pipeline import build_program
from stitchcuda.program import Program, ProgramError
from tests.dev_problems import DEV_SET, MODELS, SMALL_FUSED, SUPPORTED, dev_id, dev_reference

TIME_LIMIT_S = 60.0


def _extra_modules():
    from tests.test_planner import _Attention, _Rare

    torch.manual_seed(0)
    rare = (_Rare(), [torch.randn(2, 3, 4), torch.randn(7, 6), torch.randn(2, 3, 6)])
    q = torch.randn(2, 3, 9, 32)
    m = torch.rand(9, 11) > 0.3
    sdpa_masked = (_Attention(False, True), [q, torch.randn(2, 3, 11, 32), torch.randn(2, 3, 11, 32), m])
    q48 = torch.randn(2, 3, 9, 48)
    sdpa_big = (_Attention(False, True), [q48, torch.randn(2, 3, 11, 48), torch.randn(2, 3, 11, 48), m])
    sdpa_causal = (_Attention(True, False), [torch.randn(1, 2, 64, 128)] * 3 + [m])
    return {"rare": rare, "sdpa_masked": sdpa_masked, "sdpa_decomposed": sdpa_big, "sdpa_causal": sdpa_causal}


def _cases():
    cases = [(p.stem, "fp32", ("model", p)) for p in MODELS]
    cases += [(dev_id(k), "fp32", ("dev", k)) for k in SUPPORTED]
    cases += [("gpt_block", "tf32", ("model", next(p for p in MODELS if p.stem == "gpt_block"))),
              ("gpt_block", "bf16", ("model", next(p for p in MODELS if p.stem == "gpt_block"))),
              ("norm_softmax", "bf16", ("model", next(p for p in MODELS if p.stem == "norm_softmax"))),
              (dev_id((2, 41)), "bf16", ("dev", (2, 41))), (dev_id((3, 44)), "tf32", ("dev", (3, 44))),
              (dev_id((1, 97)) + "-fused", "bf16", ("small", (1, 97))),
              (dev_id((3, 43)) + "-fused", "fp16", ("small", (3, 43)))]
    cases += [(name, pol, ("module", name)) for name in ("rare", "sdpa_masked", "sdpa_decomposed", "sdpa_causal")
              for pol in ("fp32", "bf16")]
    return cases


CASES = _cases()
CASE_IDS = [f"{n}-{p}" for n, p, _ in CASES]


@pytest.fixture(scope="session")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("stitchcuda-cache")


@pytest.fixture(scope="module")
def built(nvcc, cache, tmp_path_factory):
    """Every case: folder written (no weights), then compiled, two at a time, while the next is written."""
    root = tmp_path_factory.mktemp("programs")
    modules = _extra_modules()
    outcomes, compiles = {}, {}

    def compile_one(o):
        return B.build((o.directory / mf.PROGRAM_SOURCE).read_text(), arch="sm_90", cache=cache)

    with ThreadPoolExecutor(2) as pool:
        for name, policy, (kind, what) in CASES:
            if kind in ("dev", "small") and not DEV_SET.is_file():
                continue
            out = root / f"{name}-{policy}"
            t0 = time.monotonic()
            if kind == "model":
                o = build_program(Path(what), precision=policy, out=out, weights=False, compile=False, quiet=True)
            elif kind == "dev":
                o = build_program(dev_reference(what), precision=policy, out=out, weights=False, compile=False,
                                  quiet=True)
            elif kind == "small":
                o = build_program(dev_reference(what, SMALL_FUSED[what], "_fused"), precision=policy, out=out,
                                  weights=False, compile=False, quiet=True)
            else:
                mod, inputs = modules[what]
                o = build_program(mod, example_inputs=inputs, name=what, precision=policy, out=out, weights=False,
                                  compile=False, quiet=True)
            outcomes[f"{name}-{policy}"] = (o, time.monotonic() - t0)
            compiles[f"{name}-{policy}"] = pool.submit(compile_one, o)
        results = {k: f.result() for k, f in compiles.items()}
    return {k: (outcomes[k][0], outcomes[k][1], results[k]) for k in outcomes}


@pytest.mark.parametrize("case", CASE_IDS)
def test_program_compiles(case, built):
    if case not in built:
        pytest.skip("KernelBench development set not present")
    outcome, front_s, res = built[case]
    assert res.ok, f"{case}: {res.message}\n{res.compile.output if res.compile else ''}"
    assert Path(res.library).is_file() and res.arch == "sm_90"
    total = front_s + res.seconds
    print(f"{case}: capture+plan+code {front_s:.1f} s, compile {res.seconds:.1f} s, total {total:.1f} s")
    # The limit is for cores the test has to itself; where other work shares them (load above the
    # core count), wall time stretches with the load, and so does the limit.
    share = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    assert total <= TIME_LIMIT_S * share, (f"{case}: reference -> compiled program took {total:.1f} s "
                                           f"(limit {TIME_LIMIT_S:.0f} s x load share {share:.2f})")
    d = outcome.directory
    for f in (mf.PROGRAM_SOURCE, mf.MANIFEST_FILE, "plan.json"):
        assert (d / f).is_file()
    assert mf.load_program_dir(d).manifest == outcome.manifest
    assert P.Plan.from_json((d / "plan.json").read_text()) == outcome.plan


# ---------------------------------------------------------------------- the cache

SOURCE = """#include "stitchrt/program.h"
extern "C" ST_API int st_program_abi_version(void) { return 1; }
"""


def test_cache_hit_miss_and_key(nvcc, tmp_path):
    first = B.build(SOURCE, arch="sm_90", cache=tmp_path)
    assert first.ok and not first.cached and first.compile is not None and first.compile.ok
    t0 = time.monotonic()
    again = B.build(SOURCE, arch="sm_90", cache=tmp_path)
    assert again.ok and again.cached and again.library == first.library and again.compile is None
    assert time.monotonic() - t0 < 2.0 and again.seconds < 2.0
    assert B.cache_key(SOURCE, "sm_80") != first.key and B.cache_key(SOURCE, "sm_90", ("-G",)) != first.key
    assert B.cache_key(SOURCE + " ", "sm_90") != first.key and B.cache_key(SOURCE, "sm_90") == first.key
    entry = tmp_path / first.entry
    assert (entry / "program.cu").read_text() == SOURCE and (entry / "build.json").is_file()
    # The entry's name is readable: program, policy, arch, then the hash.
    assert first.entry == B.entry_name(first.key, "program", "", "sm_90") and first.entry.endswith(first.key[:16])
    # The same source under another label is the same entry (the hash decides) ...
    same = B.build(SOURCE, arch="sm_90", cache=tmp_path, name="mlp block", policy="tf32")
    assert same.cached and same.entry == first.entry
    # ... and a new one is named after its label.
    named = B.build(SOURCE + "// named\n", arch="sm_90", cache=tmp_path, name="mlp block", policy="tf32")
    assert named.ok and not named.cached and named.entry.startswith("mlp_block_tf32_sm90_")


def test_key_covers_the_install(nvcc, tmp_path, monkeypatch):
    """A library links against one install's runtime: another install (another venv) gets another
    entry, never a library whose RUNPATH points into the first."""
    first = B.cache_key(SOURCE, "sm_90")
    monkeypatch.setattr(B, "_install", lambda: "/elsewhere/venv/site-packages/stitchcuda/lib:1:2")
    assert B.cache_key(SOURCE, "sm_90") != first


def test_cache_list_and_clean(nvcc, tmp_path):
    ok = B.build(SOURCE + "// list\n", arch="sm_90", cache=tmp_path, name="listed", policy="fp32")
    bad = B.build("this is not C++;\n", arch="sm_90", cache=tmp_path, name="broken", policy="bf16")
    assert ok.ok and not bad.ok
    found = {e.name: e for e in B.entries(tmp_path)}
    assert set(found) == {ok.entry, bad.entry}
    assert found[ok.entry].ok and found[ok.entry].program == "listed" and found[ok.entry].policy == "fp32"
    assert not found[bad.entry].ok and found[bad.entry].bytes > 0
    assert B.clean(tmp_path, failed_only=True) == (1, found[bad.entry].bytes)
    assert [e.name for e in B.entries(tmp_path)] == [ok.entry]
    assert B.clean(tmp_path, older_than_s=3600) == (0, 0)  # nothing that old
    removed, freed = B.clean(tmp_path)
    assert removed == 1 and freed > 0 and B.entries(tmp_path) == []


def test_never_compile_and_failures_are_values(nvcc, tmp_path, monkeypatch):
    monkeypatch.setenv("STITCHCUDA_NEVER_COMPILE", "1")
    r = B.build(SOURCE + "// new\n", arch="sm_90", cache=tmp_path)
    assert not r.ok and r.library is None and "STITCHCUDA_NEVER_COMPILE" in r.message
    monkeypatch.delenv("STITCHCUDA_NEVER_COMPILE")
    bad = B.build("this is not C++;\n", arch="sm_90", cache=tmp_path)
    assert not bad.ok and bad.library is None and bad.compile is not None and "error" in bad.compile.output
    assert not list(tmp_path.glob(f"{bad.entry}/program.so")) and (tmp_path / bad.entry / "build.json").is_file()


def test_concurrent_builds_compile_once(nvcc, tmp_path):
    src = SOURCE + "// concurrent\n"
    barrier = threading.Barrier(2)

    def go(_):
        barrier.wait()
        return B.build(src, arch="sm_90", cache=tmp_path)

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(go, range(2))
    assert a.ok and b.ok and a.library == b.library
    assert sorted([a.cached, b.cached]) == [False, True]


# ---------------------------------------------------------------------- the command and Program


@pytest.fixture(scope="module")
def mlp_dir(nvcc, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "mlp"
    cache = tmp_path_factory.mktemp("cli-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("STITCHCUDA_CACHE", str(cache))
    mp.setenv("STITCHCUDA_ARCH", "sm_90")
    try:
        assert cli.main(["build", str(next(p for p in MODELS if p.stem == "mlp")), "--out", str(out)]) == 0
    finally:
        mp.undo()
    return out, cache


def test_cli_build_writes_a_complete_folder(mlp_dir, capsys, monkeypatch):
    out, cache = mlp_dir
    for f in (mf.PROGRAM_SOURCE, mf.MANIFEST_FILE, mf.WEIGHTS_FILE, mf.LIBRARY_FILE, "plan.json", "reference.py",
              "program.build.json"):
        assert (out / f).is_file(), f
    prog = mf.load_program_dir(out, require_weights=True)
    assert prog.manifest.reference.path == "reference.py" and prog.manifest.arch == "sm_90"
    model = frontend.load_reference(out / "reference.py")
    torch.manual_seed(0)
    m = model.Model(*model.get_init_inputs())
    from safetensors.torch import load_file

    saved = load_file(str(out / mf.WEIGHTS_FILE))
    assert set(saved) == {w.name for w in prog.manifest.weights}
    for k, v in m.state_dict().items():
        assert torch.equal(saved[k], v), f"weights are the seed-0 model's ({k})"
    monkeypatch.setenv("STITCHCUDA_CACHE", str(cache))
    monkeypatch.setenv("STITCHCUDA_ARCH", "sm_90")
    capsys.readouterr()
    assert cli.main(["build", str(next(p for p in MODELS if p.stem == "mlp")), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "from the build cache" in text and "linear_relu" in text and "cublaslt_gemm" in text


def test_cli_refuses_unsupported(capsys, tmp_path):
    ref = tmp_path / "projected_lstm.py"
    ref.write_text("import torch\n"
                   "class Model(torch.nn.Module):\n"
                   "    def __init__(self):\n"
                   "        super().__init__()\n"
                   "        self.rnn = torch.nn.LSTM(8, 16, proj_size=4, batch_first=True)\n"
                   "    def forward(self, x):\n"
                   "        return self.rnn(x)[0]\n"
                   "def get_inputs(): return [torch.randn(2, 5, 8)]\n"
                   "def get_init_inputs(): return []\n")
    assert cli.main(["build", str(ref), "--out", str(tmp_path / "rnn"), "--no-compile"]) == 2
    err = capsys.readouterr().err
    assert "proj_size" in err and "Traceback" not in err, err
    assert not (tmp_path / "rnn").exists()
    assert cli.main(["build", "no/such/file.py", "--no-compile"]) == 2


def test_program_loads_prebuilt_and_checks_inputs(mlp_dir, monkeypatch, tmp_path):
    import numpy as np

    out, _ = mlp_dir
    monkeypatch.setenv("STITCHCUDA_NEVER_COMPILE", "1")
    monkeypatch.setenv("STITCHCUDA_CACHE", str(tmp_path / "empty"))
    prog = Program.load(out)  # the folder's own program.so: nothing to compile
    assert prog.library_path == str(out / mf.LIBRARY_FILE)
    assert [w.shape for w in prog._weights] == [w.shape for w in prog.manifest.weights]
    assert "mlp" in repr(prog) and prog.library.abi_version == 1
    with pytest.raises(ProgramError, match=r"input 0 'x': expected float32\[256, 512\], got float32\[3, 4\]"):
        prog(np.zeros((3, 4), np.float32))
    with pytest.raises(ProgramError, match=r"got float64\[256, 512\]"):
        prog(np.zeros((256, 512)))
    with pytest.raises(ProgramError, match="expected 1 input"):
        prog()
    if not stitchcuda.has_gpu():
        with pytest.raises(stitchcuda.NoDeviceError):
            prog(np.zeros((256, 512), np.float32))
    edited = tmp_path / "edited"
    edited.mkdir()
    for f in out.iterdir():
        (edited / f.name).write_bytes(f.read_bytes())
    (edited / mf.PROGRAM_SOURCE).write_text((out / mf.PROGRAM_SOURCE).read_text() + "// edited\n")
    with pytest.raises(mf.ManifestError, match="source_hash"):
        Program.load(edited)


def test_build_program_for_a_module_and_kernelbench_id(nvcc, tmp_path, monkeypatch):
    monkeypatch.setenv("STITCHCUDA_CACHE", str(tmp_path / "cache"))

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            return torch.tanh(self.fc(x)) * 3

    o = stitchcuda.build_program(Tiny(), example_inputs=[torch.randn(2, 8)], out=tmp_path / "tiny", arch="sm_90",
                                 quiet=True)
    assert o.ok and o.build is not None and (tmp_path / "tiny" / mf.WEIGHTS_FILE).is_file()
    # what write_program hands back names the folder in its final place, not the staging one
    assert o.program == mf.load_program_dir(tmp_path / "tiny") and o.program.library is not None
    assert [e.kind for e in o.plan.tasks[0].params.chain] == ["TANH", "SCALE"]
    if DEV_SET.is_file():
        monkeypatch.setenv("STITCHCUDA_KERNELBENCH", str(DEV_SET))
        o = build_program("kernelbench:2:12", out=tmp_path / "k", weights=False, compile=False, quiet=True)
        assert o.manifest.reference.kernelbench == mf.KernelBenchRef(2, 12, "12_Gemm_Multiply_LeakyReLU")
        assert o.build is None and not (tmp_path / "k" / mf.WEIGHTS_FILE).exists()
        assert o.program.root == tmp_path / "k" and o.program.weights is None and o.program.library is None


def test_the_way_to_a_program_imports_without_pytorch():
    """PyTorch is needed to capture a reference, not to plan, code, write or ship a program: the
    planner never imports it, nor do the modules that only hand a captured reference on."""
    import subprocess
    import sys

    mods = ["stitchcuda.plan", "stitchcuda.code", "stitchcuda.pipeline", "stitchcuda.program", "stitchcuda.workflow",
            "stitchcuda.rl.judge", "stitchcuda.rl.dataset", "stitchcuda.ship.bench", "stitchcuda.cli"]
    code = f"import sys\nfor m in {mods!r}:\n    __import__(m)\n    assert 'torch' not in sys.modules, m\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
