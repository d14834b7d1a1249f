"""The GPU Verifier end to end: every adversarial program gets its verdict and its first reason (the
second round's run in the native runner, a process with no Python and no PyTorch), every honest
control passes — hand-written ones (a cuDNN convolution among them) and programs `stitchcuda build`
makes (a convolution net, a stateful cell, recurrent layers), a long-running timed phase with its
last calls judged —, a crash and a hang are verdicts within their limits (and the next candidate
still verifies), timing is stable run to run, CUPTI sees every kernel, a graph-replaying program's
kernel time matches its event time, a generated program with a non-persistent buffer verifies, bf16
and fp16 programs run and verify, and a 2 GiB problem verifies within the memory and the 30 s its
correctness phase may take.

Each test asserts one verdict and one reason, as the CPU tests do. Seeds are fixed (SEED) and in
every failure message. Programs are copied to a temporary folder first (reports land there, builds
in a private cache); the Verifier draws every weight from the reference itself. Run with
``pytest -m gpu tests/gpu/test_verifier_gpu.py``; cupti-python must be installed for the CUPTI tests
(they are skipped without it; the torch.profiler fallback is tested either way).
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stitchcuda.verifier.run.child import Limits  # noqa: E402
from stitchcuda.verifier.verification import VerifyOptions, profile_program_dir, verify_program  # noqa: E402
from stitchcuda.verifier.measure.timing import LoopSettings  # noqa: E402

from ..adversarial.catalogue import BY_NAME, CATALOGUE, first_reason, run_reason  # noqa: E402

pytestmark = pytest.mark.gpu

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
ADV = TESTS / "adversarial"
PROGS = Path(__file__).resolve().parent / "programs"
SEED = 20261122

QUICK_TIMING = LoopSettings(min_trials=20, min_seconds=0.2, max_seconds=2.0)


def quick(**kw) -> VerifyOptions:
    base = dict(compile=False, reference_profile=False, timing=QUICK_TIMING, profile_runs=5, seed=SEED,
                weights_seed=SEED, profile=False)
    base.update(kw)
    return VerifyOptions(**base)


@pytest.fixture(scope="module", autouse=True)
def _cache_dir(tmp_path_factory):
    """Builds and device ceilings go to $STITCHCUDA_CACHE when it is set (entries are keyed by content,
    so separate runs share them), else to a private cache (the children inherit STITCHCUDA_*). Every
    adversarial program is built first, in parallel; the tests then find them built."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from stitchcuda import build
    from stitchcuda.verifier.static import sandbox
    from stitchcuda.verifier.run.build import build_baseline

    mp = pytest.MonkeyPatch()
    if not os.environ.get("STITCHCUDA_CACHE"):
        mp.setenv("STITCHCUDA_CACHE", str(tmp_path_factory.mktemp("cache")))

    def one(e):
        arch = json.loads((e.folder / "manifest.json").read_text())["arch"]
        build.build((e.folder / "program.cu").read_text(), arch=arch, flags=sandbox.LINK_FLAGS, name=e.name)

    build_baseline("sm_90")
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, [e for e in CATALOGUE if e.name != "calls_torch"]))
    yield
    mp.undo()


RESULTS: list[dict] = []


@pytest.fixture(scope="module", autouse=True)
def _results():
    """With $STITCHCUDA_ADVERSARIAL_JSON set, every verdict of the adversarial set is written there, for
    ``python tests/adversarial/table.py --from FILE`` (the table for BENCHMARKS.md)."""
    import os

    yield
    path = os.environ.get("STITCHCUDA_ADVERSARIAL_JSON")
    if path and RESULTS:
        Path(path).write_text(json.dumps(RESULTS, indent=1) + "\n")


def record(e, v) -> None:
    RESULTS.append({"name": e.name, "class": e.cls, "expected": [e.verdict, e.reason], "verdict": v.result.kind,
                    "reason": first_reason(v.result), "summary": v.result.verdict.summary(), "device": v.report.device,
                    "commit": v.report.commit})


def copy_program(src: Path, tmp: Path) -> Path:
    """program.cu + manifest.json (+ a shipped weights file) into ``tmp/<name>``, the reference path
    made absolute."""
    dst = tmp / src.name
    dst.mkdir(parents=True, exist_ok=True)
    for f in ("program.cu", "manifest.json", "weights.safetensors"):
        if (src / f).is_file():
            shutil.copy(src / f, dst / f)
    data = json.loads((dst / "manifest.json").read_text())
    ref = data["reference"].get("path")
    if ref and not Path(ref).is_absolute():
        data["reference"]["path"] = str((src / ref).resolve())
    (dst / "manifest.json").write_text(json.dumps(data, indent=2))
    return dst


def said(v) -> str:
    return f"seed {SEED}: {v.result.verdict.summary()}"


# ------------------------------------------------------------------ the adversarial set

GPU_ENTRIES = sorted(e.name for e in CATALOGUE if not e.cpu and e.name != "large_honest")


NATIVE = "in the native runner"


@pytest.mark.parametrize("name", GPU_ENTRIES)
def test_adversarial_verdict(tmp_path, name):
    """The verdict and the first reason of every program judged by running it (catalogue.py), the
    candidate in the native runner (its verdicts assume it: the runtime-call log, no host to reach)."""
    e = BY_NAME[name]
    q = QUICK_TIMING
    v = verify_program(copy_program(ADV / name, tmp_path), options=quick(
        precision=e.precision, time=e.timed or e.verdict == "passed",
        timing=e.timing(min_trials=q.min_trials, min_seconds=q.min_seconds, max_seconds=q.max_seconds)))
    record(e, v)
    assert v.report.details is not None and v.report.details.isolation.startswith(NATIVE), \
        (v.report.details.isolation if v.report.details else "no details", said(v))
    assert e.accepts(v.result.kind, first_reason(v.result)), said(v)
    if e.verdict == "passed":
        assert bool(v.result.verdict.degenerate) == e.degenerate, said(v)


@pytest.mark.parametrize("name", sorted(e.name for e in CATALOGUE if e.cpu and e.verdict == "rejected"))
def test_refused_before_running(tmp_path, name):
    e = BY_NAME[name]
    v = verify_program(copy_program(ADV / name, tmp_path), options=quick(precision=e.precision))
    record(e, v)
    assert (v.result.kind, first_reason(v.result)) == (e.verdict, e.reason), said(v)


@pytest.mark.parametrize("name", sorted(e.name for e in CATALOGUE if e.dynamic))
def test_the_run_alone_refuses_what_the_static_rules_do(tmp_path, name):
    """With the static gate off the program is built and run: the run names the cheat too."""
    e = BY_NAME[name]
    v = verify_program(copy_program(ADV / name, tmp_path), options=quick(static_gate=False, time=False))
    assert run_reason(v.result) == e.dynamic, said(v)


def test_honest_program_passes_everything(tmp_path):
    d = copy_program(ADV / "correct", tmp_path)
    v = verify_program(d, options=VerifyOptions(timing=QUICK_TIMING, profile_runs=10, seed=SEED, weights_seed=SEED))
    assert v.result.ok, said(v)
    names = {c.name: c.status for c in v.result.checks}
    assert set(names) == {"outputs_written", "inputs_unchanged", "outputs_follow_inputs", "no_output_reuse",
                          "repeat_calls", "sensitivity", "varied_inputs", "deterministic", "precision_claim",
                          "stream_ordered", "timed_calls", "memory_bounds", "weights_unchanged", "sanitizer",
                          "runtime_stream", "hidden_work", "memory_leak", "stream_capture"} and \
        set(names.values()) == {"pass"}, v.result.checks
    checks = {c.name: c.detail for c in v.result.checks}
    assert checks["sanitizer"].startswith("no error from memcheck, racecheck, synccheck"), checks["sanitizer"]
    assert "replayed" in checks["stream_capture"] and "flat" in checks["memory_leak"], checks
    assert v.report.details.isolation.startswith(NATIVE), v.report.details.isolation
    assert "st_gemm: fp32" in " ".join(v.report.notes), v.report.notes  # the runtime's arithmetic, as logged
    r = v.report
    assert r.seed == SEED and r.precision == "fp32" and r.precision_source == "manifest"
    t = r.timings
    assert t is not None and t.program.n >= 20 and t.eager_fp32 is not None and t.compile_fp32 is not None
    assert t.eager_policy == t.eager_fp32  # fp32 policy: one and the same baseline
    assert r.details.timing.l2_flush_bytes >= 2 * 40 * 2**20  # >= 2x the L2 of an H100 / H200 (50 / 60 MB)
    tc = r.details.timing.timed_calls
    assert tc.checked >= 3 and tc.failed == 0 and tc.last_checked == t.program.n  # the phase's last call judged
    assert r.details.timing.wall is not None and r.details.timing.wall.passed
    assert r.kernels and r.details.profile.runs == 10
    assert {k.task for k in r.kernels if k.kind == "kernel"} <= {"linear", "relu"}
    assert any(k.task == "relu" for k in r.kernels)
    if r.details.profile.source == "cupti":
        assert r.details.profile.launches.ok, r.details.profile.launches
    assert r.details.reference_ops and r.details.reference_ops[0].name.startswith("aten::")
    assert r.ceilings is not None and 1e12 < r.ceilings.bandwidth < 2e13
    phases = {p.name.split(" (")[0] for p in v.phases}
    assert {"build", "sandbox", "correctness", "timing", "profile"} <= phases
    assert (d / "report.json").is_file() and (d / "report.md").is_file() and (d / "timeline.png").is_file()


def test_a_long_timed_phase_is_judged_to_its_last_call(tmp_path):
    """An honest program timed for many seconds (thousands of calls): the judged calls spread over the
    whole phase, the last one included, and all right."""
    long_phase = LoopSettings(min_trials=3000, min_seconds=6.0, max_seconds=20.0)
    v = verify_program(copy_program(ADV / "correct", tmp_path), options=quick(timing=long_phase))
    assert v.result.ok, said(v)
    tc = v.report.details.timing.timed_calls
    n = v.report.timings.program.n
    assert n >= 3000 and tc.failed == 0 and tc.last_checked == n and tc.checked >= 2 * 10, tc


@pytest.mark.parametrize("model,policy", [("resnet_block", "tf32"), ("depthwise_separable", "fp32"),
                                          ("stateful_rnn_cell", "fp32"), ("lstm_stack", "tf32"),
                                          ("gru_bidir", "fp32")])
def test_built_honest_controls_pass(tmp_path, model, policy):
    """Programs `stitchcuda build` makes — convolutions (cuDNN), a stateful cell, recurrent layers —
    pass the second round's checks too, timed, in the native runner."""
    from stitchcuda.pipeline import build_program

    out = build_program(str(REPO / "models" / f"{model}.py"), precision=policy, out=tmp_path / model, quiet=True)
    assert out.ok, out
    v = verify_program(out.directory, options=quick())
    assert v.result.ok, said(v)
    assert v.report.details.isolation.startswith(NATIVE), v.report.details.isolation
    assert {c.name for c in v.result.checks} >= {"memory_bounds", "runtime_stream", "stream_capture", "memory_leak",
                                                 "hidden_work", "timed_calls"}, v.result.checks


def test_large_problem_fits_and_its_correctness_takes_under_30s(tmp_path):
    """2 GiB in, 2 GiB out: compared on the device in chunks, the reference computed once per trial."""
    v = verify_program(copy_program(ADV / "large_honest", tmp_path), options=quick(time=False))
    record(BY_NAME["large_honest"], v)
    assert v.result.ok, said(v)
    correctness = sum(p.seconds for p in v.phases if p.name == "correctness")
    assert 0 < correctness <= 30.0, v.phases


# ------------------------------------------------------------------ a generated program with a causal mask


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
def test_built_gpt_block_verifies(tmp_path, policy):
    """`stitchcuda build models/gpt_block.py` then `verify`: the non-persistent causal mask is a
    weight like any other (it used to be refused as 'not a parameter or buffer')."""
    from stitchcuda.pipeline import build_program

    out = build_program(str(REPO / "models" / "gpt_block.py"), precision=policy, out=tmp_path / "gpt", quiet=True)
    assert out.ok, out
    v = verify_program(out.directory, options=quick(time=False))
    assert v.result.ok, said(v)


_BF16_MLP = pytest.mark.xfail(strict=True, reason=(
    "measured on an H100: bf16 storage of the MLP's input, weights and activations puts its outputs "
    "near zero ~2 % of the output scale off (max |err| 1.05e-3 against atol 5.5e-4 at 1e-2, 11/18 trials): "
    "the precision, not the program; the loop's precision repair raises the tasks that need it"))
_BF16_GPT = pytest.mark.xfail(strict=True, reason=(
    "measured on an H200 at 920b991: with its LayerNorms' weights and biases drawn away from ones and zeros "
    "(the Verifier's second round), bf16 storage of every activation between the block's tasks puts its "
    "outputs up to 2 % of their scale off (max |err| 0.0142 against atol 6.6e-3, 11/22 trials): the "
    "precision, not the program, as for the MLP"))
_XFAIL = {("mlp", "bf16"): [_BF16_MLP], ("gpt_block", "bf16"): [_BF16_GPT]}


@pytest.mark.parametrize("model,policy", [
    pytest.param(m, p, id=f"{m}-{p}", marks=_XFAIL.get((m, p), []))
    for m in ("mlp", "norm_softmax", "gpt_block") for p in ("bf16", "fp16")])
def test_built_16bit_program_runs_and_verifies(tmp_path, model, policy):
    """bf16 and fp16 programs executed, not only built: ``stitchcuda build --precision bf16`` then
    the Verifier at that policy (16-bit storage inside, 1e-2): every trial within tolerance, and the
    precision claim checked and held."""
    from stitchcuda.pipeline import build_program

    out = build_program(str(REPO / "models" / f"{model}.py"), precision=policy, out=tmp_path / model, quiet=True)
    assert out.ok, out
    assert out.manifest.precision == policy
    v = verify_program(out.directory, options=quick(time=False, precision=policy))
    assert v.result.ok, said(v)
    assert v.report.precision == policy and v.result.trials and all(t.passed for t in v.result.trials), said(v)
    claim = {c.name: c for c in v.result.checks}["precision_claim"]
    assert claim.status == "pass", claim


# ------------------------------------------------------------------ crash and hang


def test_crash_is_a_verdict_and_the_next_candidate_verifies(tmp_path):
    d = copy_program(PROGS / "crash", tmp_path)
    t = time.monotonic()
    v = verify_program(d, options=quick())
    assert time.monotonic() - t < 120
    assert (v.result.kind, v.result.verdict.kind) == ("crash", "illegal_address"), said(v)
    ok = verify_program(copy_program(ADV / "correct", tmp_path / "after"), options=quick())
    assert ok.result.ok, said(ok)


def test_hang_is_a_timeout_and_the_next_candidate_verifies(tmp_path):
    d = copy_program(PROGS / "hang", tmp_path)
    limits = Limits({"setup": 120.0, "correctness": 15.0}, default=120.0, total=300.0)
    t = time.monotonic()
    v = verify_program(d, options=quick(limits=limits, time=False))
    took = time.monotonic() - t
    assert (v.result.kind, v.result.verdict.stage) == ("timeout", "correctness"), said(v)
    assert took < 15 + 120, took
    ok = verify_program(copy_program(ADV / "correct", tmp_path / "after"), options=quick())
    assert ok.result.ok, said(ok)


# ------------------------------------------------------------------ timing and profiling


def test_timing_is_stable_run_to_run(tmp_path):
    """The same >= 1 ms program timed in three separate runs: medians within 3 % of each other."""
    medians = []
    for i in range(3):
        d = copy_program(PROGS / "mlp_big", tmp_path / f"run{i}")
        v = verify_program(d, options=VerifyOptions(trials=2, compile=False, reference_profile=False, profile=False,
                                                    seed=SEED, weights_seed=SEED))
        assert v.result.ok, said(v)
        medians.append(v.report.timings.program.median_ms)
    assert min(medians) >= 1.0, medians
    spread = (max(medians) - min(medians)) / statistics.median(medians)
    assert spread < 0.03, medians


def test_cupti_sees_every_kernel(tmp_path):
    pytest.importorskip("cupti")
    d = copy_program(PROGS / "ew_plain", tmp_path)
    res = profile_program_dir(d, options=VerifyOptions(profile_runs=10, seed=SEED, weights_seed=SEED))
    assert res.verdict is None, res.outcome.log_tail
    det = res.details
    assert det.source == "cupti"
    kernels = [k for k in res.kernels if k.kind == "kernel"]
    assert len(kernels) == 4 * 10
    assert det.launches.ok and det.launches.launches == 40 and det.launches.kernels == 40, det.launches
    by_task = {t.task: t for t in det.tasks}
    assert all(by_task[n].calls == 10 for n in ("relu", "affine", "tanh", "residual")), det.tasks
    assert not det.unattributed
    assert by_task["residual"].bound == "memory"
    assert det.gaps is not None and det.gaps.runs == 10
    assert det.graph is None


def test_torch_profiler_fallback_sees_every_kernel(tmp_path):
    d = copy_program(PROGS / "ew_plain", tmp_path)
    res = profile_program_dir(d, options=VerifyOptions(profile_runs=5, cupti=False, seed=SEED, weights_seed=SEED))
    assert res.verdict is None, res.outcome.log_tail
    assert res.details.source == "torch.profiler"
    assert len([k for k in res.kernels if k.kind == "kernel"]) == 4 * 5
    assert {t.task: t.calls for t in res.details.tasks} == {"relu": 5, "affine": 5, "tanh": 5, "residual": 5}


def test_graph_replay_kernel_time_matches_event_time(tmp_path):
    d = copy_program(PROGS / "ew_graph", tmp_path)
    v = verify_program(d, options=VerifyOptions(trials=2, compile=False, reference_profile=False, profile_runs=10,
                                                seed=SEED, weights_seed=SEED))
    assert v.result.ok, said(v)
    det = v.report.details.profile
    assert det.graph is not None and det.graph.ok, det.graph
    assert abs(1 - det.graph.ratio) <= 0.05
    if det.source == "cupti":
        assert det.launches.ok and det.launches.graph_launches == 10 and det.launches.graph_kernels == 40, \
            det.launches
    assert "cuda_graph" in {t.id for t in v.report.rubric.cuda_engineering.techniques if t.detected}


def test_tf32_emulated_on_the_device_is_tf32_whichever_engine_runs():
    """Policy.emulated() on a CUDA device: a convolution and a matrix product equal the same ops on
    TF32-rounded operands with TF32 off (the yardstick of ill-conditioned inputs), where PyTorch's own
    "tf32" may be bit-identical to fp32 (cuDNN free to run an engine without TF32)."""
    import torch.nn.functional as F

    from stitchcuda.precision import get, round_tf32

    g = torch.Generator(device="cuda").manual_seed(SEED)
    x = torch.rand(8, 8, 64, 64, generator=g, device="cuda")
    w = torch.randn(16, 8, 3, 3, generator=g, device="cuda")
    a, b = torch.randn(256, 512, generator=g, device="cuda"), torch.randn(512, 128, generator=g, device="cuda")
    with torch.no_grad(), get("tf32").emulated():
        conv, mm = F.conv2d(x, w), a @ b
    with torch.no_grad(), get("fp32").baseline():
        want_conv, want_mm = F.conv2d(round_tf32(x), round_tf32(w)), round_tf32(a) @ round_tf32(b)
        fp32_mm = a @ b
    # (the same ops on the same operands: equal up to an engine's order of summation, 1e-6 of the size)
    torch.testing.assert_close(conv, want_conv, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(mm, want_mm, rtol=1e-6, atol=1e-5)
    assert (mm - fp32_mm).abs().max().item() > 1e-3  # TF32's rounding, a thousand times that


def test_nvml_reads_one_process_device_memory_or_says_it_cannot():
    """Where NVML names this machine's processes by their own PIDs, the memory checks read the runner
    process's own device memory (verifier.measure.gpu_processes): a GiB this process allocates shows in
    its own figure. Where it does not (a container named by the host's PIDs), the test says what NVML
    listed and skips: the checks read the whole device there, as their reports say."""
    import os

    from stitchcuda.verifier.measure import gpu_processes as gp

    torch.ones(1, device="cuda")
    uuid = gp.device_uuid(torch.cuda.current_device())
    if not gp.visible(uuid):
        pytest.skip(f"NVML does not name this process (pid {os.getpid()}); it lists {gp.nvml_processes(uuid)}")
    before = gp.process_bytes(os.getpid(), uuid)
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    after = gp.process_bytes(os.getpid(), uuid)
    assert after - before >= (1 << 30) - (64 << 20), (before, after)
    del x
