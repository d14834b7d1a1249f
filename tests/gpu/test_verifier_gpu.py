"""The GPU Verifier end to end: every adversarial program gets its verdict and the honest one passes,
a crash and a hang are verdicts within their limits (and the next candidate still verifies), timing
is stable run to run, CUPTI sees every kernel, and a graph-replaying program's kernel time matches
its event time.

Programs are copied to a temporary folder first (builds and reports land there, not in the repo).
Weights come from each reference's Model(*get_init_inputs()), in manifest order. Run with
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

from stitchcuda.verifier.isolate import Limits  # noqa: E402
from stitchcuda.verifier.run import VerifyOptions, profile_program_dir, verify_program  # noqa: E402
from stitchcuda.verifier.timing import LoopSettings  # noqa: E402

pytestmark = pytest.mark.gpu

TESTS = Path(__file__).resolve().parents[1]
ADV = TESTS / "adversarial"
PROGS = Path(__file__).resolve().parent / "programs"

QUICK_TIMING = LoopSettings(min_trials=20, min_seconds=0.2, max_seconds=2.0)
QUICK = VerifyOptions(compile=False, reference_profile=False, timing=QUICK_TIMING, profile_runs=5)


@pytest.fixture(scope="module", autouse=True)
def _cache_dir(tmp_path_factory):
    """Builds and device ceilings go to a private cache (the children inherit STITCHCUDA_*)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("STITCHCUDA_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


def copy_program(src: Path, tmp: Path) -> Path:
    """program.cu + manifest.json into ``tmp/<name>``, the reference path made absolute."""
    dst = tmp / src.name
    dst.mkdir(parents=True, exist_ok=True)
    for f in ("program.cu", "manifest.json"):
        shutil.copy(src / f, dst / f)
    data = json.loads((dst / "manifest.json").read_text())
    ref = data["reference"].get("path")
    if ref and not Path(ref).is_absolute():
        data["reference"]["path"] = str((src / ref).resolve())
    (dst / "manifest.json").write_text(json.dumps(data, indent=2))
    return dst


def failed_checks(v) -> list[str]:
    return [c.name for c in v.result.checks if c.status == "fail"]


# ------------------------------------------------------------------ the honest program


def test_correct_program_passes_everything(tmp_path):
    d = copy_program(ADV / "correct", tmp_path)
    v = verify_program(d, options=VerifyOptions(timing=QUICK_TIMING, profile_runs=10))  # torch.compile included
    assert v.result.ok, v.result.verdict.summary()
    assert len(v.result.trials) == 7 and all(t.passed for t in v.result.trials)
    names = {c.name: c.status for c in v.result.checks}
    for n in ("outputs_written", "inputs_unchanged", "outputs_follow_inputs", "no_output_reuse", "deterministic",
              "stream_ordered"):
        assert names[n] == "pass", (n, v.result.checks)
    assert all(o.max_abs_err_f64 is not None for t in v.result.trials for o in t.outputs)
    r = v.report
    t = r.timings
    assert t is not None and t.program.n >= 20 and t.eager_fp32 is not None and t.compile_fp32 is not None
    assert t.eager_policy == t.eager_fp32  # fp32 policy: one and the same baseline
    assert r.details.timing.l2_flush_bytes >= 2 * 40 * 2**20  # >= 2x the L2 of an H100 / H200 (50 / 60 MB)
    assert r.kernels and r.details.profile.runs == 10
    assert {k.task for k in r.kernels if k.kind == "kernel"} <= {"linear", "relu"}
    assert any(k.task == "relu" for k in r.kernels)
    if r.details.profile.source == "cupti":
        assert r.details.profile.launches.ok, r.details.profile.launches
    assert r.details.reference_ops and r.details.reference_ops[0].name.startswith("aten::")
    assert r.ceilings is not None and 1e12 < r.ceilings.bandwidth < 2e13
    phases = {p.name.split(" (")[0] for p in v.phases}
    assert {"build", "correctness", "timing", "profile"} <= phases
    assert (d / "report.json").is_file() and (d / "report.md").is_file() and (d / "timeline.png").is_file()


# ------------------------------------------------------------------ adversarial programs

STATIC = {  # folder -> rule ids the static checker must name (tests/adversarial/README.md)
    "calls_torch": {"torch-include", "torch-symbol"},
    "pointer_cache": {"pointer-keyed-cache", "host-state-static-local"},
    "side_stream": {"own-stream", "foreign-stream"},
    "constant_table": {"hardcoded-output-table", "const-copy-to-output"},
    "constant_memset": {"output-only-memset"},
    "stale_state": {"host-state-global"},
    "missing_provenance": {"provenance-coverage"},
}


@pytest.mark.parametrize("name", sorted(STATIC))
def test_static_cheats_are_rejected_unbuilt(tmp_path, name):
    d = copy_program(ADV / name, tmp_path)
    v = verify_program(d, options=QUICK)
    assert v.result.kind == "rejected"
    assert STATIC[name] <= {f.rule for f in v.result.verdict.findings}
    assert not (d / "program.so").exists()


@pytest.mark.parametrize("name, check", [("partial_output", "outputs_written"), ("zero_inputs", "inputs_unchanged")])
def test_dynamic_only_cheats_are_rejected(tmp_path, name, check):
    d = copy_program(ADV / name, tmp_path)
    v = verify_program(d, options=QUICK)
    assert v.result.kind == "rejected", v.result.verdict.summary()
    assert failed_checks(v)[0] == check, v.result.checks
    assert not v.result.verdict.findings  # statically clean: the dynamic check caught it
    assert v.report.timings is None  # not timed


def test_uninitialised_bias_is_refused(tmp_path):
    """A bias nothing wrote: wrong on every trial, and where garbage drives relu to a constant
    the outputs also stop following the inputs; either is a refusal with a dynamic reason."""
    d = copy_program(ADV / "uninit_read", tmp_path)
    v = verify_program(d, options=QUICK)
    assert not v.result.ok
    assert not v.result.findings  # statically clean: the run caught it
    failed_trials = [t for t in v.result.trials if not t.passed]
    assert v.result.kind in ("wrong_answer", "rejected"), v.result.verdict.summary()
    assert len(failed_trials) >= 5 or set(failed_checks(v)) & {"outputs_follow_inputs", "no_output_reuse"}


@pytest.mark.parametrize("name, check", [
    ("pointer_cache", "no_output_reuse"),
    ("constant_memset", "outputs_follow_inputs"),
    ("constant_table", "outputs_follow_inputs"),
    ("side_stream", "stream_ordered"),
])
def test_static_cheats_are_also_caught_dynamically(tmp_path, name, check):
    """With the static gate off, the run alone refuses the cheat: the named dynamic check fails,
    or the trials already do. stale_state is left out: its one-entry cache shows dynamically only
    when the allocator hands it the same input address again, which no run can count on (seen on
    an H200: once caught by its trials, once not at all); its static rule is what refuses it."""
    d = copy_program(ADV / name, tmp_path)
    v = verify_program(d, options=VerifyOptions(static_gate=False, time=False, profile=False))
    failed_trials = [t for t in v.result.trials if not t.passed]
    assert check in failed_checks(v) or len(failed_trials) > 0, (name, v.result.checks)


def test_missing_provenance_also_answers_wrongly(tmp_path):
    d = copy_program(ADV / "missing_provenance", tmp_path)
    v = verify_program(d, options=VerifyOptions(static_gate=False, time=False, profile=False))
    assert v.result.kind == "rejected" and any(not t.passed for t in v.result.trials)


# ------------------------------------------------------------------ crash and hang


def test_crash_is_a_verdict_and_the_next_candidate_verifies(tmp_path):
    d = copy_program(PROGS / "crash", tmp_path)
    t = time.monotonic()
    v = verify_program(d, options=QUICK)
    assert time.monotonic() - t < 120
    assert v.result.kind == "crash" and v.result.verdict.kind == "illegal_address", v.result.verdict
    ok = verify_program(copy_program(ADV / "correct", tmp_path / "after"), options=QUICK)
    assert ok.result.ok, ok.result.verdict.summary()


def test_hang_is_a_timeout_and_the_next_candidate_verifies(tmp_path):
    d = copy_program(PROGS / "hang", tmp_path)
    limits = Limits({"setup": 120.0, "correctness": 15.0}, default=120.0, total=300.0)
    t = time.monotonic()
    v = verify_program(d, options=VerifyOptions(limits=limits, time=False, profile=False))
    took = time.monotonic() - t
    assert v.result.kind == "timeout" and v.result.verdict.stage == "correctness", v.result.verdict
    assert took < 15 + 120, took
    ok = verify_program(copy_program(ADV / "correct", tmp_path / "after"), options=QUICK)
    assert ok.result.ok, ok.result.verdict.summary()


# ------------------------------------------------------------------ timing and profiling


def test_timing_is_stable_run_to_run(tmp_path):
    """The same >= 1 ms program timed in three separate runs: medians within 3 % of each other."""
    medians = []
    for i in range(3):
        d = copy_program(PROGS / "mlp_big", tmp_path / f"run{i}")
        v = verify_program(d, options=VerifyOptions(trials=2, compile=False, reference_profile=False, profile=False))
        assert v.result.ok, v.result.verdict.summary()
        medians.append(v.report.timings.program.median_ms)
    assert min(medians) >= 1.0, medians
    spread = (max(medians) - min(medians)) / statistics.median(medians)
    assert spread < 0.03, medians


def test_cupti_sees_every_kernel(tmp_path):
    pytest.importorskip("cupti")
    d = copy_program(PROGS / "ew_plain", tmp_path)
    res = profile_program_dir(d, options=VerifyOptions(profile_runs=10))
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
    res = profile_program_dir(d, options=VerifyOptions(profile_runs=5, cupti=False))
    assert res.verdict is None, res.outcome.log_tail
    assert res.details.source == "torch.profiler"
    assert len([k for k in res.kernels if k.kind == "kernel"]) == 4 * 5
    assert {t.task: t.calls for t in res.details.tasks} == {"relu": 5, "affine": 5, "tanh": 5, "residual": 5}


def test_graph_replay_kernel_time_matches_event_time(tmp_path):
    d = copy_program(PROGS / "ew_graph", tmp_path)
    v = verify_program(d, options=VerifyOptions(trials=2, compile=False, reference_profile=False, profile_runs=10))
    assert v.result.ok, v.result.verdict.summary()
    det = v.report.details.profile
    assert det.graph is not None and det.graph.ok, det.graph
    assert abs(1 - det.graph.ratio) <= 0.05
    if det.source == "cupti":
        assert det.launches.ok and det.launches.graph_launches == 10 and det.launches.graph_kernels == 40, \
            det.launches
    assert "cuda_graph" in {t.id for t in v.report.rubric.cuda_engineering.techniques if t.detected}
