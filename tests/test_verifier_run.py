"""The GPU Verifier's machinery, on the CPU: child isolation (crash, hang, CUDA error 700, OOM ->
typed verdicts within the limit, and the next child still runs; an empty folder and a report pipe),
the clean environment, the CLI's bad-input errors, report writing with phase timings, the
correctness procedure with a fake program for every dynamic cheat, the timing loop and its checked
calls, and the CUPTI record analysis. Seeds are fixed (SEED) and printed on failure."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import textwrap
import time
import weakref
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stitchcuda import manifest as mf  # noqa: E402
from stitchcuda import weights_file as wf  # noqa: E402
from stitchcuda.manifest import TaskRecord as Task  # noqa: E402
from stitchcuda.verifier import (DynamicCheck, KernelRecord, OutputCheck, Timing, TimingTable, TrialResult,  # noqa: E402
                                 VerificationReport, build_result, load_report, write_report)
from stitchcuda.verifier import verification as vrun  # noqa: E402
from stitchcuda.verifier.measure import cupti as cp  # noqa: E402
from stitchcuda.verifier.measure.timing import LoopSettings, matched_baseline, measure, recheck_speedup  # noqa: E402
from stitchcuda.verifier.report.records import (GpuDetails, PhaseTiming, ProfileDetails, RefOpTime,  # noqa: E402
                                                SpeedupRecheck, TimingDetails)
from stitchcuda.verifier.run import child as isolate  # noqa: E402
from stitchcuda.verifier.run import harness, reference  # noqa: E402
from stitchcuda.verifier.run.build import CandidateBuild  # noqa: E402
from stitchcuda.verifier.run.child import CHANNEL, Limits, clean_env, run_child  # noqa: E402
from stitchcuda.verifier.run.correctness import CorrectnessResult, check_correctness  # noqa: E402

ADV = Path(__file__).resolve().parent / "adversarial"
SEED = 20261122  # every verification below draws from it: a failure names it, and reruns the same

# ------------------------------------------------------------------ isolation

FAST = Limits({"setup": 5.0, "correctness": 1.5}, default=5.0, total=8.0)


def _child(tmp_path: Path, body: str, limits: Limits = FAST, name: str = "c") -> isolate.ChildOutcome:
    code = textwrap.dedent("""
        import json, os, signal, sys, time
        FD = int(sys.argv[1])
        def send(**m): os.write(FD, (json.dumps(m) + "\\n").encode())
        def progress(p): send(phase=p)
        def result(**d): send(result=d)
    """) + textwrap.dedent(body)
    return run_child([sys.executable, "-c", code, CHANNEL], tmp_path / name, limits=limits, env=clean_env(), poll=0.02)


def test_crash_by_signal_is_a_segfault_verdict(tmp_path):
    t = time.monotonic()
    out = _child(tmp_path, """
        progress("correctness"); result(status="running", correctness={"partial": True})
        os.kill(os.getpid(), signal.SIGSEGV)
    """)
    assert time.monotonic() - t < 5
    assert out.status == "crash" and out.crash.kind == "segfault" and out.returncode == -11
    assert "SIGSEGV" in out.crash.message
    assert out.result == {"status": "running", "correctness": {"partial": True}}  # what was done survives
    assert out.phase == "correctness"


def test_hang_is_a_timeout_of_its_phase_and_kills_the_group(tmp_path):
    t = time.monotonic()
    out = _child(tmp_path, """
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open("grandchild.pid", "w").write(str(child.pid))
        progress("correctness")
        time.sleep(60)
    """)
    took = time.monotonic() - t
    assert out.status == "timeout" and out.timeout.stage == "correctness" and out.timeout.seconds == 1.5
    assert took < 5
    pid = int((tmp_path / "c" / "grandchild.pid").read_text())
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):  # the whole process group is gone
        os.kill(pid, 0)
        # a zombie still answers kill(0); reap check via /proc
        if Path(f"/proc/{pid}/status").read_text().find("State:\tZ") >= 0:
            raise ProcessLookupError


def test_total_limit(tmp_path):
    out = _child(tmp_path, "time.sleep(60)\n", limits=Limits({}, default=60.0, total=1.0))
    assert out.status == "timeout" and out.timeout.stage == "setup" and out.timeout.seconds == 1.0


def test_cuda_error_700_is_an_illegal_address(tmp_path):
    out = _child(tmp_path, """
        progress("correctness")
        sys.stderr.write("Traceback (most recent call last):\\n  File \\"worker.py\\", line 1\\n"
                         "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\\n"
                         "CUDA kernel errors might be asynchronously reported at some other API call\\n")
        sys.exit(1)
    """)
    assert out.status == "crash" and out.crash.kind == "illegal_address"
    assert "illegal memory access" in out.crash.message


def test_out_of_memory_is_an_oom_verdict(tmp_path):
    out = _child(tmp_path, "progress('correctness')\nraise MemoryError('cannot allocate 80 GiB')\n")
    assert out.status == "crash" and out.crash.kind == "oom"


def test_a_reported_crash_keeps_its_message(tmp_path):
    out = _child(tmp_path, """
        result(status="crash", crash={"message": "program create failed: CudaError: out of memory"})
        sys.exit(1)
    """)
    assert out.crash.kind == "oom" and "program create failed" in out.crash.message


def test_healthy_child_after_failures(tmp_path):
    for i, body in enumerate(["os.kill(os.getpid(), signal.SIGABRT)\n", "time.sleep(60)\n"]):
        assert not _child(tmp_path, body, limits=Limits({}, default=1.0, total=2.0), name=f"bad{i}").ok
    out = _child(tmp_path, """
        progress("correctness"); progress("timing")
        result(status="done", value=42)
    """, name="good")
    assert out.ok and out.result["value"] == 42
    assert [p for p, _ in out.phase_seconds][-1] == "timing"


def test_clean_env_keeps_only_what_a_run_needs():
    base = {"PATH": "/bin", "HOME": "/home/u", "LD_LIBRARY_PATH": "/lib", "CUDA_VISIBLE_DEVICES": "0",
            "PYTHONPATH": "/x", "STITCHCUDA_ARCH": "sm_90", "NCCL_NVLS_ENABLE": "0", "TORCH_HOME": "/t",
            "TORCHINDUCTOR_CACHE_DIR": "/c", "AWS_SECRET_ACCESS_KEY": "s", "OPENAI_API_KEY": "k",
            "GITHUB_TOKEN": "g", "SSH_AUTH_SOCK": "/s", "LD_PRELOAD": "/evil.so", "PYTHONSTARTUP": "/evil.py"}
    env = clean_env(base=base)
    for k in ("AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "GITHUB_TOKEN", "SSH_AUTH_SOCK", "LD_PRELOAD",
              "PYTHONSTARTUP"):
        assert k not in env
    for k in ("PATH", "HOME", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "STITCHCUDA_ARCH", "NCCL_NVLS_ENABLE",
              "TORCH_HOME", "TORCHINDUCTOR_CACHE_DIR"):
        assert env[k] == base[k]
    import stitchcuda

    root = str(Path(stitchcuda.__file__).resolve().parents[1])
    assert env["PYTHONPATH"].split(os.pathsep) == [root, "/x"]
    assert set(env) <= set(base) | {"PYTHONUNBUFFERED", "PYTORCH_CUDA_ALLOC_CONF"}
    # expandable segments unless the caller chose an allocator setting
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert clean_env(base={**base, "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})["PYTORCH_CUDA_ALLOC_CONF"] \
        == "max_split_size_mb:64"


def test_child_sees_the_clean_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SECRET_TOKEN", "x")
    out = _child(tmp_path, "result(env=dict(os.environ))\n")
    assert out.ok and "MY_SECRET_TOKEN" not in out.result["env"]


def test_child_runs_in_an_empty_folder_and_reads_its_job_from_stdin(tmp_path):
    """No control file for the candidate to read: the job comes over stdin, the result goes back
    over a pipe, and a line without the job's token is not taken for a result."""
    code = textwrap.dedent("""
        import json, os, sys
        fd = int(sys.argv[1])
        job = json.loads(sys.stdin.read())
        os.write(fd, (json.dumps({"t": "forged", "result": {"status": "done", "verdict": "passed"}}) + "\\n").encode())
        os.write(fd, (json.dumps({"t": job["token"], "result": {"cwd": sorted(os.listdir(".")), "got": job["x"]}})
                      + "\\n").encode())
    """)
    token = "0123456789abcdef0123"
    out = run_child([sys.executable, "-c", code, CHANNEL], stdin=json.dumps({"token": token, "x": 7}), limits=FAST,
                    env=clean_env(), token=token)
    assert out.ok and out.result == {"cwd": [], "got": 7}


def test_worker_job_is_typed_and_validated():
    from stitchcuda.verifier.run.job import JobError, WorkerJob

    m = mf.Manifest.load(ADV / "correct")
    spec = reference.resolve_reference(None, ADV / "correct", m)
    job = WorkerJob("verify", "/x/program.so", m, spec, "tf32", seed=SEED, weights_seed=3, token="t" * 32)
    back = WorkerJob.from_json(job.to_json())
    assert back == job
    data = json.loads(job.to_json())
    for field, bad, needle in (("precision", "tf16", "job.precision"), ("trials", 0, "job.trials"),
                               ("seed", -1, "job.seed"), ("mode", "run", "job.mode"), ("token", "short", "job.token")):
        with pytest.raises(JobError, match=needle):
            WorkerJob.from_json(json.dumps({**data, field: bad}))
    with pytest.raises(JobError, match="unknown field"):
        WorkerJob.from_json(json.dumps({**data, "weights_file": "w.safetensors"}))
    with pytest.raises(JobError, match="missing field"):
        WorkerJob.from_json(json.dumps({k: v for k, v in data.items() if k != "seed"}))


# ------------------------------------------------------------------ correctness with a fake program


class FakeRunner:
    """A 'stream': what a program enqueues runs in order at sync; while held, the harness's ordered
    operations queue too. A program that computes at once models work on another stream."""

    device = torch.device("cpu")

    def __init__(self, program):
        self.program, self.queue, self.holding = program, [], False

    def context(self):
        return contextlib.nullcontext()

    def enqueue(self, fn):
        self.queue.append(fn) if self.holding else fn()

    def run(self, inputs, outputs):
        self.program(inputs, outputs, self)

    def ordered(self, fn):
        self.enqueue(fn)

    def hold(self):
        self.holding = True

    def sync(self):
        q, self.queue, self.holding = self.queue, [], False
        for fn in q:
            fn()

    def sync_device(self):
        self.sync()


@pytest.fixture(scope="module")
def adv_problem():
    m = mf.Manifest.load(ADV / "correct")
    spec = reference.resolve_reference(None, ADV / "correct", m)
    return harness.ReferenceHarness(spec, m, "cpu", weights_seed=SEED)


def _programs(P):
    w, b = P.weights

    def f(x):
        return torch.relu(x @ w.T + b)

    cache, memo, last = {}, {}, {}

    def honest(i, o, r):
        r.enqueue(lambda: o[0].copy_(f(i[0])))

    def side_stream(i, o, r):
        o[0].copy_(f(i[0]))  # not queued on the runner's stream

    def pointer_cache(i, o, r):
        def go():
            key = i[0].data_ptr()
            if key not in cache:
                cache[key] = f(i[0])
            o[0].copy_(cache[key])
        r.enqueue(go)

    def partial_output(i, o, r):
        r.enqueue(lambda: o[0][:32].copy_(f(i[0][:32])))

    def zero_inputs(i, o, r):
        r.enqueue(lambda: (o[0].copy_(f(i[0])), i[0].zero_()))

    def constant(i, o, r):
        r.enqueue(lambda: o[0].fill_(0.25))

    def nondeterministic(i, o, r):
        r.enqueue(lambda: o[0].copy_(f(i[0]) + torch.randn_like(o[0]) * 1e-2))

    def rounding_jitter(i, o, r):
        r.enqueue(lambda: o[0].copy_(f(i[0]) * (1 + torch.randn_like(o[0]) * 1e-7)))

    def value_range(i, o, r):
        r.enqueue(lambda: o[0].copy_(f(i[0]).clamp(max=3.0)))

    bound = {}  # id(output tensor) -> (a weak reference to it, the input it was first given with)

    def input_bound_to_output(i, o, r):  # reads the input buffer it first saw with this output buffer
        def go():
            ref, x = bound.get(id(o[0]), (None, None))
            if ref is None or ref() is not o[0]:
                ref, x = bound[id(o[0])] = (weakref.ref(o[0]), i[0])
            o[0].copy_(f(x))
        r.enqueue(go)

    def fingerprint_memo(i, o, r):  # replays its output when the first 8 input elements match
        def go():
            key = tuple(i[0].reshape(-1)[:8].tolist())
            if key not in memo:
                memo.clear()
                memo[key] = f(i[0]).clone()
            o[0].copy_(memo[key])
        r.enqueue(go)

    def same_buffers_skip(i, o, r):  # nothing to do when the buffers are the last call's
        def go():
            k = (i[0].data_ptr(), o[0].data_ptr())
            if last.get("k") != k:
                last["k"] = k
                o[0].copy_(f(i[0]))
        r.enqueue(go)

    replayed = {}

    def replay_drift(i, o, r):  # called again on its last buffers, replays work with a stale bias
        def go():
            k = (i[0].data_ptr(), o[0].data_ptr())
            o[0].copy_(f(i[0]) + (0.5 if replayed.get("k") == k else 0.0))
            replayed["k"] = k
        r.enqueue(go)

    return locals()


def test_the_correctness_phase_says_where_its_time_went(adv_problem):
    """check_correctness's costs: the program's calls, the reference computations by kind, drawing
    inputs, and the rest (the checks themselves), adding up to the phase's seconds."""
    from stitchcuda.verifier.run import cost

    res = check_correctness(FakeRunner(_programs(adv_problem)["honest"]), adv_problem, precision="fp32", seed=SEED)
    parts = dict(res.costs)
    assert {cost.PROGRAM, cost.INPUTS, "reference (fp32)", cost.REST} <= set(parts), parts
    assert {cost.JUDGING, cost.CLAIM, cost.WEIGHTS, cost.VARIED, cost.DYNAMIC} <= set(parts), parts
    assert all(t >= 0 for t in parts.values()) and parts[cost.PROGRAM] > 0 and parts["reference (fp32)"] > 0
    assert abs(sum(parts.values()) - res.seconds) <= 0.05 * res.seconds + 0.01, (parts, res.seconds)


def test_a_part_timed_inside_another_is_its_own():
    """A stage's part keeps only its own time: the program calls and references it makes are theirs."""
    import time as _time

    from stitchcuda.verifier.run.cost import Clock

    clock = Clock()
    clock.timed("stage", lambda: (_time.sleep(0.05), clock.timed("program calls", _time.sleep, 0.1)))
    got = dict(clock.seconds)
    assert 0.04 <= got["stage"] < 0.09 and 0.09 <= got["program calls"] < 0.15, got


@pytest.mark.parametrize("name, failed_check, wrong", [
    ("honest", None, False),
    ("pointer_cache", "no_output_reuse", None),
    ("same_buffers_skip", "no_output_reuse", None),
    ("fingerprint_memo", "sensitivity", None),
    ("input_bound_to_output", "outputs_follow_inputs", False),
    ("value_range", "varied_inputs", None),
    ("partial_output", "outputs_written", True),
    ("zero_inputs", "inputs_unchanged", False),
    ("nondeterministic", "deterministic", True),
    ("side_stream", "stream_ordered", False),
])
def test_dynamic_cheats_get_their_reason(adv_problem, name, failed_check, wrong):
    prog = _programs(adv_problem)[name]
    res = check_correctness(FakeRunner(prog), adv_problem, precision="fp32", seed=SEED)
    v = build_result(trials=res.trials, checks=res.checks, tolerance=res.tolerance)
    if failed_check is None:
        assert res.passed and v.ok, (SEED, [c for c in res.checks if c.status == "fail"])
        assert {c.name for c in res.checks} == {"outputs_written", "inputs_unchanged", "outputs_follow_inputs",
                                                "no_output_reuse", "repeat_calls", "sensitivity", "varied_inputs",
                                                "deterministic", "precision_claim", "stream_ordered", "memory_bounds",
                                                "weights_unchanged"}
        assert [t.label for t in res.trials[:5]] == [""] * 5
        edges = [t for t in res.trials if t.label.startswith("sensitivity at")]
        assert res.trials[5].label.startswith("scaled_up x") and len(res.trials) == 5 + 4 + 6 + 3 + len(edges)
        assert len(edges) >= 2  # the start of an axis and the far end of one
        return
    assert v.kind == "rejected" and v.verdict.checks[0].name == failed_check, (SEED, v.verdict.reasons)
    assert v.verdict.reasons[0].startswith(f"dynamic check {failed_check} failed")
    if wrong is not None:
        assert any(not t.passed for t in res.trials[:5]) == wrong, SEED


def test_a_program_wrong_only_when_called_again_on_its_buffers_fails_repeat_calls(adv_problem):
    """Right on fresh buffers, wrong (not stale) when called again on the same ones, as a replayed
    CUDA graph with a stale value would be: repeat_calls names it (sensitivity's in-place change
    sees it too)."""
    res = check_correctness(FakeRunner(_programs(adv_problem)["replay_drift"]), adv_problem, precision="fp32",
                            seed=SEED)
    v = build_result(trials=res.trials, checks=res.checks, tolerance=res.tolerance)
    failed = {c.name: c for c in res.checks if c.status == "fail"}
    assert v.kind == "rejected" and all(t.passed for t in res.trials[:5]), (SEED, v.verdict)
    assert "repeat_calls" in failed and "on a repeated call with the same buffers" in failed["repeat_calls"].detail, \
        (SEED, list(failed))
    assert "no_output_reuse" not in failed           # its outputs never repeat the previous call's


def _content_off(P, seen: list):
    """Off by 0.5 on one element for the first inputs it is given, wherever they lie: a wrong answer on
    one draw (an error at the tolerance's edge misses on some draws), not a buffer's."""
    w, b = P.weights

    def program(i, o, r):
        def go():
            key = tuple(i[0].reshape(-1)[:8].tolist())
            seen.append(key)
            o[0].copy_(torch.relu(i[0] @ w.T + b))
            if key == seen[0]:
                o[0].view(-1)[0] += 0.5
        r.enqueue(go)
    return program


def test_a_repeated_call_wrong_in_fresh_buffers_too_is_a_wrong_answer(adv_problem):
    """The repeated calls' draws are draws too. A repeated call that is wrong (not stale) is run
    again with the same inputs in fresh buffers: wrong there too, the draw is at fault, not the
    buffers. No cheat is named (a wrong answer, which the loop's precision repair answers); a
    program wrong only on its reused buffers still is (replay_drift, the test above)."""
    from stitchcuda.verifier.run import dynamic as dyn
    from stitchcuda.verifier.run.inputs import Secret
    from stitchcuda.verifier.run.session import Session

    seen: list = []
    s = Session(FakeRunner(_content_off(adv_problem, seen)), adv_problem, "fp32", Secret(SEED))
    dyn.repeated_calls(s)
    assert seen[1] == seen[0], seen[:3]  # the first call's inputs again, in buffers of their own
    assert "repeat_calls" not in s.failures and not s.plain_ok, s.failures
    assert not s.trials[0].passed and all(t.passed for t in s.trials[1:]), [t.passed for t in s.trials]
    assert any("wrong again with the same inputs in fresh buffers" in n for n in s.notes), s.notes

    drift = Session(FakeRunner(_programs(adv_problem)["replay_drift"]), adv_problem, "fp32", Secret(SEED))
    dyn.repeated_calls(drift)  # right again in fresh buffers: the same buffers' fault, named
    assert "repeat_calls" in drift.failures and drift.plain_ok, drift.failures


def test_a_repeated_call_that_answers_otherwise_in_fresh_buffers_is_named(adv_problem):
    """The draw is at fault only where the call again in fresh buffers writes every output and gives
    the same answer (the timed calls' rule too). Wrong there by another amount, or with an output left
    as poisoned, the repeated call did something else: repeat_calls names it."""
    from stitchcuda.verifier.run import dynamic as dyn
    from stitchcuda.verifier.run.inputs import Secret
    from stitchcuda.verifier.run.session import Session

    w, b = adv_problem.weights

    def wrong_otherwise(skip_write: bool):
        seen: list = []

        def program(i, o, r):
            def go():
                key = tuple(i[0].reshape(-1)[:8].tolist())
                seen.append(key)
                if key == seen[0] and len(seen) > 1 and skip_write:
                    return  # the call again: outputs left as the caller poisoned them
                o[0].copy_(torch.relu(i[0] @ w.T + b))
                if key == seen[0]:
                    o[0].view(-1)[0] += 0.5 if len(seen) == 1 else -0.5  # the call again: another answer
            r.enqueue(go)
        return program, seen

    for skip_write in (False, True):
        program, seen = wrong_otherwise(skip_write)
        s = Session(FakeRunner(program), adv_problem, "fp32", Secret(SEED))
        dyn.repeated_calls(s)
        assert seen[1] == seen[0], seen[:3]
        assert "repeat_calls" in s.failures and s.plain_ok, (skip_write, s.failures, s.notes)
        assert not any("wrong again with the same inputs in fresh buffers" in n for n in s.notes), s.notes


def test_a_constant_output_is_a_wrong_answer(adv_problem):
    """Wrong on the plain trials already: a wrong answer, not a named cheat."""
    res = check_correctness(FakeRunner(_programs(adv_problem)["constant"]), adv_problem, seed=SEED)
    v = build_result(trials=res.trials, checks=res.checks, tolerance=res.tolerance)
    assert v.kind == "wrong_answer" and v.verdict.trial == 0, v.verdict


def test_partial_output_names_the_unwritten_rows(adv_problem):
    res = check_correctness(FakeRunner(_programs(adv_problem)["partial_output"]), adv_problem, seed=SEED)
    (c,) = [c for c in res.checks if c.name == "outputs_written"]
    assert "4096 of 8192 elements never written" in c.detail and "[32, 0]" in c.detail
    bad = [o for t in res.trials for o in t.outputs if not o.passed]
    assert bad and bad[0].nan_count == 4096 and bad[0].where == (32, 0)


def test_rounding_noise_passes_with_a_warning(adv_problem):
    res = check_correctness(FakeRunner(_programs(adv_problem)["rounding_jitter"]), adv_problem, seed=SEED)
    assert res.passed, SEED
    assert res.warnings and "within rounding" in res.warnings[0]


def test_value_range_trick_fails_a_varied_trial(adv_problem):
    res = check_correctness(FakeRunner(_programs(adv_problem)["value_range"]), adv_problem, seed=SEED)
    assert all(t.passed for t in res.trials[:5])
    assert [t.label for t in res.trials if not t.passed][0].startswith("scaled_up x")
    (c,) = [c for c in res.checks if c.name == "varied_inputs"]
    assert c.status == "fail" and "assumes properties of its inputs" in c.detail


def test_nan_where_the_reference_is_finite_fails(adv_problem):
    w, b = adv_problem.weights

    def nan_corner(i, o, r):
        r.enqueue(lambda: (o[0].copy_(torch.relu(i[0] @ w.T + b)), o[0].__setitem__((3, 5), float("nan"))))

    res = check_correctness(FakeRunner(nan_corner), adv_problem, trials=1, varied=0, dynamic=False, seed=SEED)
    (o,) = res.trials[0].outputs
    assert not o.passed and o.nan_count == 1 and o.where == (3, 5)


def test_seeds_decide_every_draw(adv_problem):
    """The same seed gives the same trials; another seed other inputs (the seeds are the secret)."""
    prog = _programs(adv_problem)["honest"]
    a = check_correctness(FakeRunner(prog), adv_problem, trials=2, varied=2, dynamic=False, seed=SEED)
    b = check_correctness(FakeRunner(prog), adv_problem, trials=2, varied=2, dynamic=False, seed=SEED)
    c = check_correctness(FakeRunner(prog), adv_problem, trials=2, varied=2, dynamic=False, seed=SEED + 1)
    assert [t.seed for t in a.trials] == [t.seed for t in b.trials] != [t.seed for t in c.trials]
    assert [t.label for t in a.trials] == [t.label for t in b.trials]


# ------------------------------------------------------------------ the reference side


def test_validate_reference_catches_mismatches(tmp_path):
    m = mf.Manifest.load(ADV / "correct")
    ok = reference.resolve_reference(None, ADV / "correct", m)
    assert reference.validate_reference(ok, m) == []
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nclass Model(torch.nn.Module):\n  def forward(self, x): return x\n"
                   "def get_inputs(): return [torch.randn(3, 3)]\ndef get_init_inputs(): return []\n")
    with pytest.raises(reference.ProblemError, match=r"input x is float32\[64, 256\]"):
        reference.validate_reference(reference.resolve_reference(str(bad), tmp_path), m)
    with pytest.raises(reference.ProblemError, match="expected kernelbench:LEVEL:ID"):
        reference.resolve_reference("kernelbench:one:2", tmp_path)


def test_kernelbench_lookup(tmp_path, monkeypatch):
    src = (ADV / "reference.py").read_text()
    dev = tmp_path / "dev.jsonl"
    dev.write_text(json.dumps({"level": 2, "problem_id": 7, "name": "7_Linear_ReLU", "source": src}) + "\n")
    monkeypatch.setenv(reference.KERNELBENCH_ENV, str(dev))
    spec = reference.resolve_reference("kernelbench:2:7", tmp_path)
    assert spec.name == "7_Linear_ReLU" and spec.source == src
    m = mf.Manifest.load(ADV / "correct")
    assert reference.validate_reference(spec, m) == []


def test_problem_draws_its_own_weights(tmp_path):
    """The Verifier builds the reference model with its own seed, draws its parameters away from their
    initial values, and hands the same tensors to the reference and the program; a weights file in
    the program folder plays no part."""
    m = mf.Manifest.load(ADV / "correct")
    spec = reference.resolve_reference(None, ADV / "correct", m)
    torch.manual_seed(SEED)
    model = torch.nn.Linear(256, 128)
    P0 = harness.ReferenceHarness(spec, m, "cpu", weights_seed=SEED, vary=False)
    assert torch.equal(P0.weights[0], model.weight.detach()) and torch.equal(P0.weights[1], model.bias.detach())
    P = harness.ReferenceHarness(spec, m, "cpu", weights_seed=SEED)
    assert not torch.equal(P.weights[0], model.weight.detach()) and not torch.equal(P.weights[1], model.bias.detach())
    assert torch.equal(P.weights[0], P.model.fc.weight.detach())  # the reference computes with the same values
    assert not torch.equal(harness.ReferenceHarness(spec, m, "cpu", weights_seed=SEED + 1).weights[0], P.weights[0])
    d = P.draw(5)
    (y,) = P.forward(d)
    assert torch.allclose(y, torch.relu(d.program[0] @ P.weights[0].T + P.weights[1]), atol=1e-5)
    assert torch.equal(P.draw(5).program[0], d.program[0]) and not torch.equal(P.draw(6).program[0], d.program[0])


def test_non_persistent_buffers_are_weights():
    """A causal-mask-like buffer registered with persistent=False is not in state_dict(), yet it is a
    weight: validated against the manifest and handed to the program (the gpt_block bug)."""
    m = mf.Manifest.load(ADV / "masked_honest")
    spec = reference.resolve_reference(None, ADV / "masked_honest", m)
    assert reference.validate_reference(spec, m) == []
    P = harness.ReferenceHarness(spec, m, "cpu", weights_seed=SEED)
    (mask,) = P.weights
    assert torch.equal(mask, torch.tril(torch.ones(256, 256)))
    d = P.draw(1)
    assert torch.allclose(P.forward(d)[0], torch.cumsum(d.program[0], dim=1), atol=1e-4)


# ------------------------------------------------------------------ the CLI on bad input


def _cli(*args: str) -> tuple[int, str]:
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from stitchcuda import cli

    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        rc = cli.main(list(args))
    return rc, err.getvalue() + out.getvalue()


@pytest.fixture
def prog_dir(tmp_path):
    d = tmp_path / "correct"
    d.mkdir()
    for f in ("program.cu", "manifest.json"):
        (d / f).write_bytes((ADV / "correct" / f).read_bytes())
    data = json.loads((d / "manifest.json").read_text())
    data["reference"] = {"path": str(ADV / "reference.py")}
    (d / "manifest.json").write_text(json.dumps(data))
    return d


def _nothing_written(d: Path) -> None:
    assert sorted(p.name for p in d.iterdir()) == sorted(["program.cu", "manifest.json"] +
                                                        (["weights.safetensors"] if (d / "weights.safetensors").exists()
                                                         else []))


def test_cli_missing_folder_and_manifest(tmp_path, prog_dir):
    rc, text = _cli("verify", str(tmp_path / "nope"))
    assert rc == 2 and "nope: program folder not found" in text
    (prog_dir / "manifest.json").unlink()
    rc, text = _cli("verify", str(prog_dir))
    assert rc == 2 and "manifest.json: file not found" in text
    assert [p.name for p in prog_dir.iterdir()] == ["program.cu"]


def test_cli_corrupt_manifest(prog_dir):
    (prog_dir / "manifest.json").write_text('{"format": "stitchcuda-program", "version": 1,')
    rc, text = _cli("verify", str(prog_dir))
    assert rc == 2 and "manifest.json: not valid JSON" in text
    _nothing_written(prog_dir)


def test_cli_weights_not_matching(prog_dir):
    wf.write_safetensors(prog_dir / "weights.safetensors", {
        "fc.weight": ("float32", (128, 255), bytes(128 * 255 * 4)), "fc.bias": ("float32", (128,), bytes(512))})
    rc, text = _cli("verify", str(prog_dir))
    assert rc == 2 and "weights.safetensors: weight 'fc.weight' is float32[128, 255]" in text
    _nothing_written(prog_dir)


@pytest.mark.parametrize("body, needle", [
    ("def get_inputs(): raise RuntimeError('boom')", "get_inputs() failed: RuntimeError: boom"),
    ("def get_inputs(): return ['not a tensor']", "get_inputs()[0] is a str: expected tensors"),
    ("def get_inputs(): return 42", "get_inputs() returned int, expected a list"),
])
def test_cli_broken_reference(prog_dir, tmp_path, body, needle):
    ref = tmp_path / "ref.py"
    ref.write_text("import torch\nclass Model(torch.nn.Module):\n  def forward(self, x): return x\n"
                   f"{body}\ndef get_init_inputs(): return []\n")
    rc, text = _cli("verify", str(prog_dir), "--reference", str(ref))
    assert rc == 2 and f"{ref}: {needle}" in text, text
    _nothing_written(prog_dir)
    rc, text = _cli("profile", str(prog_dir), "--reference", str(ref))
    assert rc == 2 and needle in text


def test_cli_reference_that_does_not_load(prog_dir, tmp_path):
    ref = tmp_path / "ref.py"
    ref.write_text("this is not python\n")
    rc, text = _cli("verify", str(prog_dir), "--reference", str(ref))
    assert rc == 2 and "ref.py" in text and "failed to load" in text
    ref.write_text("import torch\n")
    rc, text = _cli("verify", str(prog_dir), "--reference", str(ref))
    assert rc == 2 and "lacks Model, get_inputs, get_init_inputs" in text
    _nothing_written(prog_dir)


def test_cli_parameter_missing_from_reference(prog_dir, tmp_path):
    ref = tmp_path / "ref.py"
    ref.write_text("import torch\nclass Model(torch.nn.Module):\n  def __init__(self):\n    super().__init__()\n"
                   "    self.lin = torch.nn.Linear(256, 128)\n  def forward(self, x): return self.lin(x)\n"
                   "def get_inputs(): return [torch.randn(64, 256)]\ndef get_init_inputs(): return []\n")
    rc, text = _cli("verify", str(prog_dir), "--reference", str(ref))
    assert rc == 2 and "weight 'fc.weight' is not a parameter or buffer of the reference model" in text


# ------------------------------------------------------------------ verify() assembly (child faked)


def _fake_build(prog, arch):
    lib = prog.root / "program.so"
    lib.write_bytes(b"\x7fELF fake")
    return CandidateBuild(True, lib, "", 0.01)


@pytest.fixture
def fake_build(monkeypatch):
    """No nvcc: a fake library, an honest baseline, a sandbox that finds nothing."""
    from stitchcuda.verifier.static import sandbox

    monkeypatch.setattr(vrun, "build_candidate", _fake_build)
    monkeypatch.setattr(vrun, "build_baseline", lambda arch: CandidateBuild(True, Path("baseline.so"), "", 0.0))
    monkeypatch.setattr(sandbox, "baseline_of", lambda lib: None)
    monkeypatch.setattr(sandbox, "check_library", lambda lib, out, base: sandbox.SandboxResult(()))


def _corr_json(ok: bool = True):
    from stitchcuda.verifier import serde
    from stitchcuda.verifier.run.correctness import CorrectnessResult

    o = OutputCheck("y", 1e-6 if ok else 0.5, 1e-7, 1e-4, (0, 0), 1.0, 1.0 if ok else 1.5, 0, ok, 1e-7, 1e-8)
    checks = tuple(DynamicCheck(n, "pass") for n in ("outputs_written", "inputs_unchanged", "outputs_follow_inputs",
                                                     "no_output_reuse", "deterministic", "stream_ordered"))
    return serde.to_jsonable(CorrectnessResult(tuple(TrialResult(i, (o,), 1000 + i) for i in range(5)), checks, 1e-4,
                                               warnings=("not bit-identical (within rounding)",),
                                               costs=(("program calls", 0.5), ("reference (fp32)", 0.2))))


def test_verify_assembles_a_report_with_phase_timings(prog_dir, monkeypatch, fake_build):
    from stitchcuda.verifier import serde

    calls = []

    def fake_worker(job, limits, **kw):
        calls.append((job.mode, job.precision, job.seed, job.weights_seed))
        if job.mode == "verify":
            table = TimingTable(Timing(0.05, 0.001, 120), Timing(0.2, 0.01, 100), Timing(0.2, 0.01, 100),
                                Timing(0.1, 0.01, 100), Timing(0.1, 0.01, 100))
            res = {"status": "done", "phases": {"setup": 2.5, "correctness": 0.8, "timing": 3.0,
                                                "reference_profile": 0.4},
                   "device": "Fake GPU", "correctness": _corr_json(),
                   "timing": serde.to_jsonable({"table": table, "details": TimingDetails(l2_flush_bytes=100 << 20)}),
                   "reference_ops": serde.to_jsonable([RefOpTime("aten::addmm", 1, 12.0, 12.0, 0.9)])}
            return isolate.ChildOutcome("ok", 0, res, "reference_profile", 7.0)
        recs = [KernelRecord("relu_f4", 0, 2000, (8, 1, 1), (256, 1, 1), 16, 0, 65536, 8192, task="relu")]
        res = {"status": "done", "phases": {"setup": 2.0, "ceilings": 0.1, "profile": 0.5},
               "profile": serde.to_jsonable({"kernels": recs, "details": ProfileDetails("cupti", 20), "ceilings": None})}
        return isolate.ChildOutcome("ok", 0, res, "profile", 3.0)

    monkeypatch.setattr(vrun, "run_worker", fake_worker)
    v = vrun.verify_program(prog_dir, options=vrun.VerifyOptions(precision="tf32", seed=SEED, weights_seed=7))
    assert calls == [("verify", "tf32", SEED, 7), ("profile", "tf32", SEED, 7)]
    assert v.report.precision == "tf32" and v.report.precision_source == "requested"
    assert v.report.claimed_precision == "fp32" and v.report.seed == SEED and v.report.weights_seed == 7
    assert "judged at tf32 (requested); the manifest claims fp32" in v.report.notes
    assert v.result.ok and "within rounding" in v.result.verdict.warnings[-1]
    names = [p.name for p in v.phases]
    for want in ("inputs", "static", "build", "correctness", "timing", "profile"):
        assert want in names, names
    rep = load_report(prog_dir)
    assert rep.phases == v.report.phases and rep.details.device == "Fake GPU"
    md = (prog_dir / "report.md").read_text()
    assert "## Verification cost" in md and "| correctness | 0.80 |" in md
    # the correctness phase's parts, by kind of work, listed under it and not summed again
    assert "| · correctness: program calls | 0.50 |" in md and "| · correctness: reference (fp32) | 0.20 |" in md
    whole = sum(p.seconds for p in v.phases if not p.part_of)
    assert f"| total | {whole:.2f} |" in md and any(p.part_of == "correctness" for p in v.phases)
    assert "aten::addmm" in md and (prog_dir / "timeline.png").is_file()


def test_verify_crash_and_timeout_are_verdicts(prog_dir, monkeypatch, fake_build):
    from stitchcuda.verifier.report.verdict import Crash, Timeout

    monkeypatch.setattr(vrun, "run_worker", lambda job, limits, **kw: isolate.ChildOutcome(
        "crash", -11, None, "correctness", 1.0, crash=Crash("illegal_address", "CUDA error 700")))
    v = vrun.verify_program(prog_dir, options=vrun.VerifyOptions(profile=False))
    assert v.result.kind == "crash" and v.result.verdict.kind == "illegal_address"
    monkeypatch.setattr(vrun, "run_worker", lambda job, limits, **kw: isolate.ChildOutcome(
        "timeout", -9, {"status": "running", "phases": {"setup": 1.0}}, "correctness", 3.0,
        timeout=Timeout(2.0, "correctness")))
    v = vrun.verify_program(prog_dir)
    assert v.result.kind == "timeout" and v.result.verdict.stage == "correctness"
    assert any("until timeout" in p.name for p in v.phases)
    assert load_report(prog_dir).result.kind == "timeout"


def test_verify_reports_a_child_input_error(prog_dir, monkeypatch, fake_build):
    monkeypatch.setattr(vrun, "run_worker", lambda job, limits, **kw: isolate.ChildOutcome(
        "crash", 3, {"status": "input_error", "input_error": {"file": "ref.py", "problem": "outputs differ"}},
        "correctness", 1.0))
    with pytest.raises(reference.ProblemError, match="ref.py: outputs differ"):
        vrun.verify_program(prog_dir)
    assert not (prog_dir / "report.json").exists()


def test_static_rejection_is_not_built(tmp_path, monkeypatch):
    d = tmp_path / "pc"
    d.mkdir()
    for f in ("program.cu", "manifest.json"):
        (d / f).write_bytes((ADV / "pointer_cache" / f).read_bytes())
    data = json.loads((d / "manifest.json").read_text())
    data["reference"] = {"path": str(ADV / "reference.py")}
    (d / "manifest.json").write_text(json.dumps(data))
    monkeypatch.setattr(vrun, "build_candidate", lambda *a: pytest.fail("built a rejected program"))
    v = vrun.verify_program(d)
    assert v.result.kind == "rejected" and "pointer-keyed-cache" in " ".join(v.result.verdict.reasons)


def test_report_round_trip_with_gpu_details(tmp_path):
    res = build_result(trials=(TrialResult(0, (OutputCheck("y", 1e-6, 1e-7, 1e-4, max_abs_err_f64=1e-7),), 1,
                                           "x8"),))
    rc = SpeedupRecheck("torch.compile at bf16", 14.0, 12.5, 0.01, 0.03, 0.4, 0.02, True, True)
    rep = VerificationReport("p", "bf16", "sm_90", res, timings=TimingTable(Timing(0.01, 0, 100)),
                             phases=(PhaseTiming("build", 12.5), PhaseTiming("correctness", 3.25)),
                             details=GpuDetails(device="H100", timing=TimingDetails(l2_flush_bytes=100 << 20,
                                                                                    recheck=rc)))
    write_report(rep, tmp_path)
    back = load_report(tmp_path)
    assert back == rep
    md = (tmp_path / "report.md").read_text()
    assert "| build | 12.50 |" in md and "| total | 15.75 |" in md and "0 (x8)" in md
    assert "14.0x by events, 12.5x by wall clock" in md


# ------------------------------------------------------------------ timing loop


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class FakeTimer:
    def __init__(self, clock, ms):
        self.clock, self.ms, self.calls = clock, ms, 0

    def time(self, fn):
        fn()
        self.calls += 1
        self.clock.t += self.ms / 1e3
        return self.ms * (1 + 0.01 * (self.calls % 3))


@pytest.mark.parametrize("ms, n_min, n_max", [(0.5, 2000, 2001), (50.0, 100, 100), (400.0, 25, 26),
                                              (6000.0, 3, 3)])
def test_measure_trial_counts(ms, n_min, n_max):
    """>= 100 trials and >= 1 s, whichever is later; capped at 10 s (but at least 3 samples)."""
    clock = FakeClock()
    flushes = []
    t, warm, samples = measure(lambda: None, FakeTimer(clock, ms), lambda: flushes.append(1),
                               LoopSettings(), clock=clock)
    assert n_min <= len(samples) <= n_max and t.n == len(samples)
    assert len(flushes) == len(samples) + warm  # L2 flushed before every call
    assert warm >= 3
    assert t.median_ms == pytest.approx(ms * 1.01, rel=0.011)


def test_recheck_flags_work_hidden_from_the_events():
    clock = FakeClock()
    state = {"sync": 0.0}

    def sync():
        clock.t += state["sync"]
        state["sync"] = 0.0

    def honest():
        clock.t += 0.0001  # 0.1 ms, the same as its event time

    def hidden():
        clock.t += 0.00001
        state["sync"] = 0.001  # 1 ms of work the device-wide synchronise waits for

    def baseline():
        clock.t += 0.002

    kw = dict(program_event_ms=0.1, baseline_event_ms=2.0, baseline_name="eager at bf16", sync_device=sync,
              flush=lambda: None, clock=clock)
    ok = recheck_speedup(honest, baseline, check_outputs=lambda: True, **kw)
    assert ok.passed and ok.wall_speedup == pytest.approx(20, rel=0.01)
    bad = recheck_speedup(hidden, baseline, check_outputs=lambda: True, **kw)
    assert not bad.passed and "invisible to the stream's events" in bad.detail
    wrong = recheck_speedup(honest, baseline, check_outputs=lambda: False, **kw)
    assert not wrong.passed and "outputs wrong" in wrong.detail


def test_matched_baseline_is_the_faster_at_policy():
    t = TimingTable(Timing(1, 0, 1), Timing(9, 0, 1), Timing(5, 0, 1), Timing(8, 0, 1), Timing(3, 0, 1))
    assert matched_baseline(t)[0] == "torch.compile at policy"


# ------------------------------------------------------------------ CUPTI record analysis

TASKS = (Task("linear", "cublaslt_gemm", ("addmm",), flops=4_000_000, bytes=200_000),
         Task("relu", "elementwise_kernel", ("relu",), flops=8192, bytes=65536),
         Task("proj", "cublaslt_gemm", ("mm",), flops=2_000_000, bytes=100_000))


def _run(t0: int, graph: int = 0) -> list[cp.RawActivity]:
    K = cp.RawActivity
    return [K("kernel", "sm90_xmma_gemm_f32f32_tn_n", t0, t0 + 10_000, correlation=t0 + 1, graph_id=graph),
            K("kernel", "_ZN12_GLOBAL__N_17relu_f4EP6float4l", t0 + 11_000, t0 + 13_000, correlation=t0 + 2,
              graph_id=graph),
            K("kernel", "nvjet_tst_128x64", t0 + 20_000, t0 + 25_000, correlation=t0 + 3, graph_id=graph),
            K("memset", "memset", t0 - 5000, t0 - 1000, bytes=100 << 20)]


def test_attribution_by_name_and_runtime_order():
    runs = [_run(0), _run(100_000)]
    names = {"_ZN12_GLOBAL__N_17relu_f4EP6float4l": "(anonymous namespace)::relu_f4(float4*, long)"}
    recs, unclaimed = cp.attribute(runs, TASKS, names)
    kernels = [r for r in recs if r.kind == "kernel"]
    assert [r.task for r in kernels[:3]] == ["linear", "relu", "proj"]
    assert kernels[1].name == "(anonymous namespace)::relu_f4" and kernels[1].bytes == 65536
    assert kernels[0].flops == 4_000_000 and unclaimed == []
    tt = {t.task: t for t in cp.task_times(recs, TASKS, 2, None, "fp32")}
    assert tt["linear"].per_run_ns == 10_000 and tt["relu"].per_run_ns == 2000
    assert tt["linear"].achieved_flops_s == pytest.approx(4e6 / 1e-5)


def test_template_kernels_are_placed_by_program_order():
    """Shared template kernels carry no task name: the tasks that claimed none, between the named
    neighbours, take them (a split-row reduction's two kernels both to its task); a create-phase
    task never does, and a GEMM's library kernel before its epilogue goes to the GEMM task."""
    tasks = (Task("w_t", "transpose_kernel", ("t",), phase="create"),
             Task("norm", "reduction_template", ("layer_norm",), bytes=4096),
             Task("gelu", "elementwise_kernel", ("gelu",)),
             Task("fc_bias", "epilogue_template", ("addmm",)),
             Task("rowsum", "reduction_template", ("sum",)))
    K = cp.RawActivity
    run = [K("kernel", "stitch::norm_partial_kernel", 0, 10), K("kernel", "stitch::norm_finish_kernel", 10, 12),
           K("kernel", "gelu_kernel", 12, 14), K("kernel", "sm90_xmma_gemm", 14, 30), K("kernel", "fc_bias_epi", 30, 32),
           K("kernel", "stitch::row_sum_kernel", 32, 40)]
    recs, unclaimed = cp.attribute([run], tasks)
    assert [r.task for r in recs] == ["norm", "norm", "gelu", "fc_bias", "fc_bias", "rowsum"] and unclaimed == []
    assert recs[0].bytes + recs[1].bytes == 4096
    # with a named kernel of its own and no library call, a task does not take its neighbour's kernels
    recs, unclaimed = cp.attribute([[K("kernel", "gelu_kernel", 0, 2), K("kernel", "mystery", 2, 4)]], tasks[2:3])
    assert [r.task for r in recs] == ["gelu", ""] and unclaimed == ["mystery"]


def test_unnamed_kernels_that_do_not_divide_go_to_tasks_of_their_family():
    """A squeeze-expand block launches no kernel named after a task: a layout copy, three
    convolutions (two GEMMs, then cuDNN's conversion, implicit GEMM, conversion) and a join of two
    copies, eight kernels for five tasks. Library kernels go to the convolutions, the template
    copies to the copy tasks, in order, every task with one at least (one each to the first five
    gave the join a convolution's kernel and left its copies to nobody)."""
    tasks = (Task("copy_x", "copy", ("x",)), Task("conv_a", "cudnn_conv", ("c1",)),
             Task("conv_b", "cudnn_conv", ("c2",)), Task("conv_c", "cudnn_conv", ("c3",)),
             Task("cat", "copy", ("cat",), bytes=800))
    K = cp.RawActivity
    names = ["stitch::detail::ew_strided_kernel<stitch::detail::Copy1, unsigned int, float, float>",
             "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x32x8", "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8",
             "cudnn::engines_precompiled::convertTensor_kernel<float, float, float>",
             "sm80_xmma_fprop_implicit_gemm_indexed_wo_smem_tf32f32_tf32f32_f32_nhwc",
             "cudnn::engines_precompiled::convertTensor_kernel<float, float, float>",
             "stitch::detail::ew_tile_kernel<stitch::detail::Copy1, float, float>",
             "stitch::detail::ew_tile_kernel<stitch::detail::Copy1, float, float>"]
    run = [K("kernel", n, 10 * i, 10 * i + 5) for i, n in enumerate(names)]
    recs, unclaimed = cp.attribute([run], tasks)
    owners = [r.task for r in recs]
    assert owners[0] == "copy_x" and owners[6:] == ["cat", "cat"], owners
    # the five library kernels to the three convolutions, in order, each one at least (which
    # convolution a conversion kernel between two of them belongs to, nothing in a run tells)
    assert owners[1:6] == sorted(owners[1:6]) and set(owners[1:6]) == {"conv_a", "conv_b", "conv_c"}, owners
    assert unclaimed == [] and recs[6].bytes + recs[7].bytes == 800
    # an even split that matches the families is kept (two kernels a task: split rows, split K)
    at, score = cp.align_kernels([True, True, False, False], tasks[2:5:2])
    assert at == [0, 0, 1, 1] and score == 4


def test_kernels_of_a_shared_functor_go_to_each_task_of_its_group_in_program_order():
    """Tasks with the same elementwise function launch the first one's kernels (kernels_of): each
    kernel named after it goes to the member whose turn it is, whether each launches one kernel or
    the count is uneven."""
    tasks = (Task("bn_a", "elementwise_kernel", ("a",), bytes=100), Task("conv", "cudnn_conv", ("c",)),
             Task("bn_b", "elementwise_kernel", ("b",), bytes=300, kernels_of="bn_a"),
             Task("bn_c", "elementwise_kernel", ("c2",), kernels_of="bn_a"))
    K = cp.RawActivity
    run = [K("kernel", "stitch::ew_tile_kernel<task::bn_a_fn>", 0, 10), K("kernel", "sm90_xmma_fprop", 10, 20),
           K("kernel", "stitch::ew_tile_kernel<task::bn_a_fn>", 20, 30),
           K("kernel", "stitch::ew_tile_kernel<task::bn_a_fn>", 30, 35)]
    recs, unclaimed = cp.attribute([run], tasks)
    assert [r.task for r in recs] == ["bn_a", "conv", "bn_b", "bn_c"] and unclaimed == [], recs
    assert recs[2].bytes == 300
    # two kernels a member (a contiguous pass and its tail): pairs in order
    pairs = [K("kernel", "k<task::bn_a_fn>", 10 * i, 10 * i + 5) for i in range(6)]
    recs, _ = cp.attribute([pairs], tasks)
    assert [r.task for r in recs] == ["bn_a", "bn_a", "bn_b", "bn_b", "bn_c", "bn_c"]
    # uneven (a member launched one more): each to the first member after the last placed
    odd = [K("kernel", "k<task::bn_a_fn>", 0, 5), K("kernel", "sm90_xmma_fprop", 5, 9),
           K("kernel", "k<task::bn_a_fn>", 10, 15), K("kernel", "k<task::bn_a_fn>", 20, 25),
           K("kernel", "k<task::bn_a_fn>", 30, 35)]
    recs, _ = cp.attribute([odd], tasks)
    assert [r.task for r in recs][:4] == ["bn_a", "conv", "bn_b", "bn_c"]


def test_analyse_splits_runs_drops_the_flush_and_counts_gaps():
    raw = _run(0) + _run(100_000)
    recs, d = cp.analyse(raw, None, tasks=TASKS, runs=2, windows=[(0, 50_000), (99_000, 150_000)], event_ms=[0.03],
                         ceilings=None, precision="fp32", source="torch.profiler", flush_bytes=100 << 20)
    assert all(r.kind == "kernel" for r in recs) and len(recs) == 6
    assert d.runs == 2 and d.gaps.span_ns == 25_000 and d.gaps.busy_ns == 17_000
    assert d.gaps.max_gap_ns == 7000 and d.gaps.gaps_over_5us == 1
    assert d.launches.launches is None and d.graph is None


def test_launch_accounting_counts_nested_driver_calls_once():
    raw = [r for r in _run(0) if r.kind == "kernel"]
    A = cp.RawApi
    apis = [A("runtime", "cudaLaunchKernel_v7000", 2, 10, 20, 1), A("driver", "cuLaunchKernel", 99, 12, 18, 1),
            A("driver", "cuLaunchKernelEx", 1, 30, 40, 1), A("driver", "cuLaunchKernelEx", 3, 50, 60, 1),
            A("runtime", "cudaEventRecord_v3020", 7, 70, 71, 1)]
    lc = cp.launch_accounting(raw, apis)
    assert lc.ok and lc.launches == 3 and lc.kernels == 3, lc
    lc = cp.launch_accounting(raw[:2], apis)
    assert not lc.ok and "2 kernel records for 3 launch calls" in lc.detail


def test_graph_check():
    runs = [_run(0, graph=5), _run(100_000, graph=5)]
    ok = cp.graph_check(runs, [0.0175, 0.0172])
    assert ok.ok and ok.kernel_ns_per_run == 17_000
    assert not cp.graph_check(runs, [0.03]).ok
    assert cp.graph_check([_run(0)], [0.02]) is None
    A = cp.RawApi
    raw = [r for r in _run(0, graph=5) if r.kind == "kernel"]
    lc = cp.launch_accounting(raw, [A("runtime", "cudaGraphLaunch_v10000", 9, 0, 5)])
    assert lc.ok and lc.graph_launches == 1 and lc.graph_kernels == 3 and lc.launches == 0


def test_short_names():
    assert cp.short_name("void cutlass::Kernel2<cutlass_80_gemm<float, 4>>(Params)") == \
        "cutlass::Kernel2<cutlass_80_gemm<float, 4>>"
    assert cp.short_name("(anonymous namespace)::relu_f4(float4*, long)") == "(anonymous namespace)::relu_f4"
    assert cp.match_task("linear_relu_kernel", TASKS).name == "linear"


# ------------------------------------------------------------------ the worker's GPU paths, CUDA faked


class _Rep:
    def __init__(self):
        self.saved, self.phases = {}, []

    def phase(self, name):
        self.phases.append(name)

    def save(self, **items):
        from stitchcuda.verifier import serde

        self.saved.update({k: serde.to_jsonable(v) for k, v in items.items()})

    def finish(self, status, code, **items):
        self.save(**items)
        raise SystemExit((status, code))


class _PerfTimer:
    def __init__(self, *a, **k):
        pass

    def time(self, fn):
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    def close(self):
        pass


class _NoFlush:
    nbytes = 123

    def __init__(self, *a, **k):
        pass

    def __call__(self):
        pass

    def probe(self):
        pass


@pytest.fixture
def fake_cuda(monkeypatch):
    from types import SimpleNamespace

    from stitchcuda.verifier.measure import timing

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 0)
    monkeypatch.setattr(timing, "EventTimer", _PerfTimer)
    monkeypatch.setattr(timing, "L2Flusher", _NoFlush)
    return SimpleNamespace(cuda_stream=0, device=torch.device("cpu"))


def _job(**kw):
    from stitchcuda.verifier.run.job import WorkerJob

    m = mf.Manifest.load(ADV / "correct")
    spec = reference.resolve_reference(None, ADV / "correct", m)
    return WorkerJob("verify", "/nowhere/program.so", m, spec, kw.pop("precision", "tf32"), seed=SEED, weights_seed=0,
                     token="t" * 32, **kw)


def test_worker_verify_path_with_cuda_faked(adv_problem, fake_cuda):
    from stitchcuda.verifier.run import worker

    rep = _Rep()
    job = _job(trials=2, compile=False, reference_profile=True,
               timing=LoopSettings(min_trials=5, min_seconds=0.0, max_seconds=1.0))
    worker._verify(job, rep, worker._Guarded(FakeRunner(_programs(adv_problem)["honest"])), adv_problem, fake_cuda, 0,
                   lambda: 1 << 20, 0)
    assert rep.phases == ["correctness", "timing", "reference_profile"]
    s = rep.saved
    assert s["memory"]["program_bytes"] == 1 << 20
    table = s["timing"]["table"]
    assert table["program"]["n"] >= 5 and table["eager_fp32"]["n"] >= 5 and table["eager_policy"]["n"] >= 5
    assert table["compile_fp32"] is None
    assert "torch.compile baselines not measured (disabled)" in s["timing"]["details"]["notes"]
    timed = s["timing"]["details"]["timed_calls"]
    assert timed["checked"] >= 1 and timed["failed"] == 0 and timed["calls"] >= 5
    assert timed["last_checked"] == table["program"]["n"]  # the phase's last call is always judged
    assert isinstance(s["reference_ops"], list)
    from stitchcuda.verifier import serde
    from stitchcuda.verifier.run.correctness import CorrectnessResult

    corr = serde.from_jsonable(CorrectnessResult, s["correctness"])
    edges = [t for t in corr.trials if t.label.startswith("sensitivity at")]
    assert corr.passed and len(corr.trials) == 2 + 4 + 6 + 3 + len(edges) and corr.tolerance == 1e-2


def test_worker_catches_work_skipped_when_timed(adv_problem, fake_cuda):
    """A program right on its first 40 calls and idle after: the correctness trials pass, a sampled
    timed call does not."""
    from stitchcuda.verifier import serde
    from stitchcuda.verifier.run import worker
    from stitchcuda.verifier.report.records import TimingDetails

    w, b = adv_problem.weights
    calls = {"n": 0}

    def count_calls(i, o, r):
        calls["n"] += 1
        if calls["n"] <= 40:
            r.enqueue(lambda: o[0].copy_(torch.relu(i[0] @ w.T + b)))

    rep = _Rep()
    job = _job(trials=2, compile=False, reference_profile=False,
               timing=LoopSettings(min_trials=30, min_seconds=0.0, max_seconds=2.0, warmup_max_calls=3))
    worker._verify(job, rep, worker._Guarded(FakeRunner(count_calls)), adv_problem, fake_cuda, 0, lambda: 0, 0)
    assert serde.from_jsonable(CorrectnessResult, rep.saved["correctness"]).passed
    det = serde.from_jsonable(TimingDetails, rep.saved["timing"]["details"])
    assert det.timed_calls.failed >= 1 and not det.timed_calls.passed, (SEED, det.timed_calls)
    assert "timed call" in det.timed_calls.detail


def test_worker_a_timed_call_wrong_in_fresh_buffers_too_is_a_wrong_answer(adv_problem, fake_cuda):
    """A program whose answer goes wrong after its first 40 calls whatever buffers hold its inputs (the
    same wrong answer again, every output written: what a program at the tolerance's edge gives on an
    unlucky draw): the timed call's miss is a wrong answer on that draw, a failed trial, and the timed
    calls' check names no cheat."""
    from stitchcuda.verifier import serde
    from stitchcuda.verifier.report.records import TimingDetails
    from stitchcuda.verifier.run import worker

    w, b = adv_problem.weights
    calls = {"n": 0}

    def off_after_40(i, o, r):
        calls["n"] += 1
        off = 0.5 if calls["n"] > 40 else 0.0
        r.enqueue(lambda: o[0].copy_(torch.relu(i[0] @ w.T + b) + off))

    rep = _Rep()
    job = _job(trials=2, compile=False, reference_profile=False,
               timing=LoopSettings(min_trials=30, min_seconds=0.0, max_seconds=2.0, warmup_max_calls=3))
    worker._verify(job, rep, worker._Guarded(FakeRunner(off_after_40)), adv_problem, fake_cuda, 0, lambda: 0, 0)
    det = serde.from_jsonable(TimingDetails, rep.saved["timing"]["details"])
    assert det.timed_calls.passed and det.timed_calls.failed == 0 and det.timed_calls.wrong >= 1, det.timed_calls
    corr = serde.from_jsonable(CorrectnessResult, rep.saved["correctness"])
    last = corr.trials[-1]
    assert not corr.passed and not last.passed and last.label.startswith("timed call") and "fresh buffers" in last.label
    assert last.index == len(corr.trials) - 1 and last.outputs[0].max_abs_err == pytest.approx(0.5, rel=1e-3)
    assert any("wrong again with the same inputs in fresh buffers" in n for n in rep.saved["correctness_notes"])


def test_worker_memory_cap_is_an_oom(adv_problem, fake_cuda):
    from stitchcuda.verifier.run import worker

    rep = _Rep()
    with pytest.raises(SystemExit) as e:
        worker._verify(_job(trials=1, precision="fp32"), rep, worker._Guarded(FakeRunner(
            _programs(adv_problem)["honest"])), adv_problem, fake_cuda, 0, lambda: 3 << 30, 1 << 30)
    assert e.value.code == ("crash", 1) and "over its cap" in rep.saved["crash"]["message"]


def test_speedup_recheck_runs_inside_time_all(adv_problem, fake_cuda):
    from stitchcuda.verifier.measure.timing import time_all

    calls = {"n": 0}

    def program():
        calls["n"] += 1

    settings = LoopSettings(min_trials=5, min_seconds=0.0, max_seconds=1.0)
    d = adv_problem.draw(1)
    table, det = time_all(program, adv_problem.model, adv_problem.model_args(d), precision="fp32", stream=fake_cuda,
                          compile=False, settings=settings, recheck_outputs=lambda: True)
    assert table.speedup(table.eager_fp32) > 10  # an empty "program" is very fast
    assert det.recheck is not None and det.recheck.outputs_ok and det.matched_baseline == "eager at fp32"


def test_profile_fallback_path_with_cuda_faked(adv_problem, fake_cuda, tmp_path, monkeypatch):
    from stitchcuda.verifier.measure import cupti as cupti_profile

    monkeypatch.setattr(cupti_profile, "cupti_available", lambda: False)
    w, b = adv_problem.weights
    x = adv_problem.draw(0).program[0]
    records, det = cupti_profile.profile_program(lambda: torch.relu(x @ w.T + b), stream=fake_cuda,
                                                 tasks=mf.Manifest.load(ADV / "correct").tasks, precision="fp32",
                                                 runs=3, workdir=tmp_path)
    assert det.source == "torch.profiler" and det.launches.launches is None
    assert "cupti-python is not installed" in det.notes[0]
    assert (tmp_path / "torch_trace.json").is_file()


def test_lifted_random_inputs_are_drawn_by_the_harness(tmp_path):
    """A reference that draws in forward (live dropout): the harness draws the mask as an input and
    evaluates the reference's captured graph on the same draw."""
    from stitchcuda import frontend

    src = ("import torch\nimport torch.nn.functional as F\nclass Model(torch.nn.Module):\n"
           "  def forward(self, x): return F.dropout(x, 0.5, training=True) + 1.0\n"
           "def get_inputs(): return [torch.randn(16, 32)]\ndef get_init_inputs(): return []\n")
    ref = tmp_path / "drop.py"
    ref.write_text(src)
    cap = frontend.capture_reference(frontend.load_reference(ref), supported_ops=None)
    g = cap.graph
    assert len(g.lifted_random) == 1
    lifted = g.lifted_random[0]
    data = {"format": "stitchcuda-program", "version": 1, "name": "drop", "abi_version": 1, "precision": "fp32",
            "arch": "sm_90", "source_hash": "0" * 64, "reference": {"path": str(ref)},
            "inputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in g.inputs],
            "outputs": [{"name": "y", "dtype": "float32", "shape": [16, 32]}], "weights": [],
            "lifted_random": [{"input": lifted.input}]}
    m = mf.Manifest.from_dict(data)
    P = harness.ReferenceHarness(reference.resolve_reference(str(ref), tmp_path), m, "cpu")
    d = P.draw(3)
    x, mask = d.program
    assert mask.dtype == torch.bool and 0.3 < mask.float().mean().item() < 0.7
    assert torch.equal(P.draw(3).program[1], mask) and not torch.equal(P.draw(4).program[1], mask)
    (y,) = P.forward(d)
    assert torch.allclose(y, x * mask * 2.0 + 1.0)

    def honest(i, o, r):
        r.enqueue(lambda: o[0].copy_(i[0] * i[1] * 2.0 + 1.0))

    def own_draws(i, o, r):  # ignores the harness's mask and draws its own
        r.enqueue(lambda: o[0].copy_(torch.nn.functional.dropout(i[0], 0.5, training=True) + 1.0))

    assert check_correctness(FakeRunner(honest), P, trials=2).passed
    res = check_correctness(FakeRunner(own_draws), P, trials=2)
    assert not res.passed and any(not t.passed for t in res.trials)


class _FixedRef:
    """A reference of one 4096-element output whose answers are given: fp32, float64, PyTorch at the
    policy (``at``; None: the policy means nothing here) and the policy's emulated arithmetic
    (``emulated``; None: not available)."""

    input_specs = (mf.TensorSpec("x", (4096,), "float32"),)
    output_specs = (mf.TensorSpec("y", (4096,), "float32"),)
    lifted_indices = ()

    def __init__(self, ref32, ref64, at=None, emulated=None):
        self.ref32, self.ref64, self.at, self.emulated = ref32, ref64, at, emulated

    def forward(self, draw, inputs=None):
        return [self.ref32]

    def forward64(self, draw, inputs=None):
        return [self.ref64]

    def forward_at(self, policy, draw, inputs=None, emulated=""):
        got = self.emulated if emulated else self.at
        return None if got is None else [got]


class _ClaimRef(_FixedRef):
    """A reference whose error statistics are given: PyTorch at tf32 (``at``), at bf16 (``low``), the
    reference with TF32-truncated product operands (``trunc``)."""

    def __init__(self, ref64, at, low, trunc):
        super().__init__(ref64.float(), ref64)
        self.at_, self.low, self.trunc = at, low, trunc

    def forward_at(self, policy, draw, inputs=None, emulated=""):
        if emulated:
            return [self.trunc] if emulated == "truncate" else None
        return [self.at_ if policy == "tf32" else self.low]


def _claim(ref, program) -> "DynamicCheck":
    from stitchcuda.verifier.run.inputs import Secret
    from stitchcuda.verifier.run.precision_claim import PrecisionEvidence
    from stitchcuda.verifier.run.session import Draw, Session

    s = Session(FakeRunner(lambda i, o, r: None), ref, "tf32", Secret(SEED))
    evidence = PrecisionEvidence(s)
    for _ in range(3):
        evidence.add(Draw([], [], 0), [], [program], [ref.ref32], True)
    return evidence.result()


def test_the_precision_claim_allows_tf32_truncation_and_still_tells_bf16():
    """An output whose TF32 error is a bias that survives averaging (2:23: a group norm's mean):
    PyTorch's "tf32" engine used no TF32 (1.5e-8), bf16 misses by 1e-5, an honest engine that
    truncates its TF32 operands by 9e-6 — passed now, rejected as bf16 before. On a GEMM-like output,
    where truncated TF32 is a quarter of bf16's error, a bf16 program is still rejected."""
    g = torch.Generator().manual_seed(SEED)
    ref64 = torch.randn(4096, generator=g, dtype=torch.float64)

    def off(bias: float, noise: float = 0.0) -> torch.Tensor:
        return (ref64 + bias + noise * torch.randn(4096, generator=g, dtype=torch.float64)).float()

    mean_like = _ClaimRef(ref64, at=off(1.5e-8), low=off(0.0, 1.25e-5), trunc=off(9e-6))
    c = _claim(mean_like, off(9.5e-6))
    assert c.status == "pass" and "with truncated operands 9" in c.detail, c
    gemm_like = _ClaimRef(ref64, at=off(0.0, 1e-6), low=off(0.0, 1.25e-5), trunc=off(0.0, 2.5e-6))
    c = _claim(gemm_like, off(0.0, 1.25e-5))
    assert c.status == "fail" and "matches bf16 arithmetic" in c.detail, c
    assert _claim(gemm_like, off(0.0, 2.5e-6)).status == "pass"


def test_varied_trials_fall_back_to_norm_relative_only_when_ill_conditioned():
    """A varied trial is judged on ||out - ref|| / ||ref|| only where the fp32 reference itself misses
    the float64 one at those inputs (ill-conditioned there); elsewhere elementwise, like any trial."""
    from stitchcuda.verifier.run.session import Draw, Session
    from stitchcuda.verifier.run.inputs import Secret

    def Ref(ref32, ref64):
        return _FixedRef(ref32, ref64)

    g = torch.Generator().manual_seed(SEED)
    ref64 = torch.randn(4096, generator=g, dtype=torch.float64) * 8
    out = ref64.float().clone()
    out[:3] += 3e-3  # pointwise over atol + rtol |ref| for small |ref|, tiny in norm
    d = Draw([], [], 0)
    runner = FakeRunner(lambda i, o, r: None)
    conditioned = Session(runner, Ref(ref64.float(), ref64), "fp32", Secret(SEED))
    assert not conditioned.judge("v", [out], d, [], varied=True).trial.passed
    noisy32 = ref64.float() + torch.randn(4096, generator=g) * 1e-2  # the fp32 reference misses float64 here
    ill = Session(runner, Ref(noisy32, ref64), "fp32", Secret(SEED))
    j = ill.judge("v", [out], d, [], varied=True)
    assert j.trial.passed and j.trial.outputs[0].judged == "norm-relative"
    assert not ill.judge("v", [out.clamp(-4, 4)], d, [], varied=True).trial.passed
    # a plain trial: elementwise where fp32 meets the truth; norm-relative only where the fp32
    # reference itself misses it (ill-conditioned beyond fp32: no fp32 program could pass)
    assert not conditioned.judge("plain", [out], d, [], varied=False).trial.passed
    j = ill.judge("plain", [out], d, [], varied=False)
    assert j.trial.passed and j.trial.outputs[0].judged == "norm-relative"
    assert not ill.judge("plain", [out.clamp(-4, 4)], d, [], varied=False).trial.passed


def test_near_the_bound_at_fp32_a_program_is_held_to_fp32s_own_accuracy():
    """Where the fp32 reference itself comes near the bound from float64 (a deep net at fp32), an output
    that crosses the bound passes within twice the reference's own distance, elementwise, and says
    so; twice that distance fails; and where fp32 is far inside the bound, the bound stands."""
    from stitchcuda.verifier.report.verdict import build_result
    from stitchcuda.verifier.run.inputs import Secret
    from stitchcuda.verifier.run.session import Draw, Session

    g = torch.Generator().manual_seed(SEED)
    ref64 = torch.randn(4096, generator=g, dtype=torch.float64) * 8     # RMS above 1: atol = tol = 1e-4
    lim = 1e-4 + 1e-4 * ref64.abs()

    def off(at: int, ratio: float) -> torch.Tensor:                      # one element `ratio` bounds off
        t = ref64.clone()
        t[at] += ratio * lim[at]
        return t.float()

    d, runner = Draw([], [], 0), FakeRunner(lambda i, o, r: None)
    near = Session(runner, _FixedRef(off(7, 0.8), ref64), "fp32", Secret(SEED))    # fp32 0.8 of the bound off
    j = near.judge("plain", [off(100, 1.3)], d, [])
    assert j.trial.passed and j.trial.outputs[0].judged == "fp32-own", j.trial
    assert any("judged at fp32's own accuracy" in n for n in near.notes)
    assert not near.judge("plain", [off(100, 1.7)], d, []).trial.passed           # over 2 x 0.8
    far = Session(runner, _FixedRef(off(7, 0.3), ref64), "fp32", Secret(SEED))      # fp32 well inside
    assert not far.judge("plain", [off(100, 1.3)], d, []).trial.passed
    assert not near.judge("plain", [off(100, 1.3).clone().fill_(float("nan"))], d, []).trial.passed
    text = build_result(trials=[j.trial]).verdict.summary()
    assert "0 with every element" in text and "1 within 2x the fp32 reference's own distance" in text, text


def test_a_checked_timed_call_is_judged_by_the_trials_chain():
    """The timed calls' judge (timed_calls.judge_outputs) starts from the same chain as the trials'
    (compare.judge_output): right against float64 though not against fp32 passes as "float64"; near
    the bound at fp32, within twice fp32's own distance passes as "fp32-own" and past it fails; where
    the fp32 reference itself misses float64, the norm-relative error within the tolerance passes as
    "norm-relative"; float64 is computed once for all outputs, and not at all when every output is right."""
    from stitchcuda.manifest import TensorSpec
    from stitchcuda.verifier.run.timed_calls import judge_outputs, output_judge

    g = torch.Generator().manual_seed(SEED)
    ref64 = torch.randn(4096, generator=g, dtype=torch.float64) * 8
    lim = 1e-4 + 1e-4 * ref64.abs()

    def off(base: torch.Tensor, at: int, ratio: float) -> torch.Tensor:
        t = base.clone()
        t[at] += ratio * lim[at]
        return t

    specs = [TensorSpec("y", (4096,), "float32"), TensorSpec("z", (4096,), "float32")]
    asked = []

    def truth(*outs):
        def f():
            asked.append(1)
            return list(outs)
        return f

    ref32 = off(ref64, 7, 0.8).float()                            # the fp32 reference 0.8 of the bound off
    other_side = off(ref64, 7, -0.8).float()                      # 1.6 bounds from fp32's, 0.8 from the truth
    js = judge_outputs(1e-4, [other_side, ref32], [ref32, ref32], truth(ref64, ref64))
    assert [j.how for j in js] == ["float64", "elementwise"] and all(j.passed for j in js) and len(asked) == 1
    js = judge_outputs(1e-4, [off(ref64, 100, 1.3).float(), off(ref64, 100, 1.7).float()], [ref32, ref32],
                       truth(ref64, ref64))
    assert [(j.passed, j.how) for j in js] == [(True, "fp32-own"), (False, "elementwise")], js
    ok, detail = output_judge(specs, 1e-4, truth(ref64, ref64))([ref32, off(ref64, 100, 1.7).float()], [ref32, ref32])
    assert not ok and detail.startswith("output z: 1 of 4096 elements wrong"), detail
    asked.clear()
    assert output_judge(specs, 1e-4, truth(ref64, ref64))([ref32, ref32], [ref32, ref32]) == (True, "")
    assert not asked                                              # all right against fp32: no float64 run
    far = (ref64 + 0.01).float()                                  # fp32 itself misses float64 everywhere
    near_norm = ref64.clone()
    near_norm[0] += 1e-2                                          # 100 bounds off at one element, 2e-5 in norm
    near_norm = near_norm.float()
    js = judge_outputs(1e-4, [near_norm], [far], truth(ref64))
    assert js[0].passed and js[0].how == "norm-relative", js
    assert not judge_outputs(1e-4, [(ref64 * 1.01).float()], [far], truth(ref64))[0].passed


def test_a_pass_says_how_many_trials_were_judged_in_norm():
    """A pass whose trials were judged on the norm-relative error does not claim every element within
    the tolerance: its summary counts those trials."""
    from stitchcuda.verifier.report.verdict import OutputCheck, TrialResult, build_result

    def trial(i, how):
        return TrialResult(i, (OutputCheck("y", 5e17, 1e12, 1e-2, judged=how),))

    plain = build_result(trials=[trial(0, "elementwise"), trial(1, "float64")])
    assert "every element within tol" in plain.verdict.summary() and plain.verdict.norm_relative == 0
    ill = build_result(trials=[trial(0, "norm-relative"), trial(1, "elementwise"), trial(2, "norm-relative")])
    text = ill.verdict.summary()
    assert ill.verdict.norm_relative == 2 and "every element" in text and "2 ill-conditioned" in text, text
    assert "1 with every element" in text


def test_a_plain_trial_beyond_fp32_is_judged_against_the_policy_in_pytorch():
    """Under tf32, a plain trial whose fp32 reference misses float64 is judged on its norm-relative
    error within max(tol, 4x PyTorch-at-tf32's); where only the policy misses (fp32 meets the truth),
    it stays elementwise: precision is the answer there."""
    from stitchcuda.verifier.run.session import Draw, Session
    from stitchcuda.verifier.run.inputs import Secret

    def Ref(ref32, ref64, at):
        return _FixedRef(ref32, ref64, at=at)

    g = torch.Generator().manual_seed(SEED)
    ref64 = torch.randn(4096, generator=g, dtype=torch.float64) * 1e6   # outputs far above 1: atol = tol
    ref64[:4] = 0.5                                                     # four cancel to near nothing
    noise = torch.randn(4096, generator=g, dtype=torch.float64)
    at = (ref64 + noise * 1e3).float()                                  # PyTorch's TF32: 1e-3 in norm
    out = (ref64 + noise.flip(0) * 1e3).float()                         # ours: the same size of error
    d, runner = Draw([], [], 0), FakeRunner(lambda i, o, r: None)
    beyond = Session(runner, Ref((ref64 + 0.1).float(), ref64, at), "tf32", Secret(SEED))   # fp32 misses at [:4]
    j = beyond.judge("plain", [out], d, [], varied=False)
    assert j.trial.passed and j.trial.outputs[0].judged == "norm-relative", j.trial
    assert not beyond.judge("plain", [(ref64 * 1.05).float()], d, [], varied=False).trial.passed  # 5 % off
    met = Session(runner, Ref(ref64.float(), ref64, at), "tf32", Secret(SEED))              # fp32 meets it
    assert not met.judge("plain", [out], d, [], varied=False).trial.passed


def test_ill_conditioned_inputs_are_judged_by_the_policys_arithmetic_not_pytorchs_engine():
    """PyTorch "at tf32" may run without TF32 (cuDNN picks an fp32 engine: its result is the fp32
    reference), so on inputs where TF32 itself cannot meet the tolerance elementwise it shows none of
    that error. The reference with TF32-rounded operands (``emulated``) shows it: a program with
    TF32's error passes in norm there, one 25 % off (past the varied slack too) still fails, and
    without the emulation the honest program is rejected (2:73 on a ramp)."""
    from stitchcuda.verifier.run.session import Draw, Session
    from stitchcuda.verifier.run.inputs import Secret

    def Ref(ref64, emulated):  # PyTorch at tf32 on an engine without TF32: the fp32 result
        return _FixedRef(ref64.float(), ref64, at=ref64.float(), emulated=emulated)

    g = torch.Generator().manual_seed(SEED)
    ref64 = torch.randn(4096, generator=g, dtype=torch.float64)
    noise = torch.randn(4096, generator=g, dtype=torch.float64)
    ref64[:4], noise[:4] = 0.5, 500.0                                   # four far off (a tiny spread amplified): 0.25
    tf32 = (ref64 + noise * 5e-4).float()                               # TF32 arithmetic: 8e-3 in norm
    out = (ref64 + noise.flip(0) * 5e-4).float()                        # ours: the same size of error
    out[:4] = tf32[:4]
    d, runner = Draw([], [], 0), FakeRunner(lambda i, o, r: None)
    blind = Session(runner, Ref(ref64, None), "tf32", Secret(SEED))      # no emulation: PyTorch's fp32 engine only
    assert not blind.judge("ramp", [out], d, [], varied=True, distribution=True).trial.passed
    seen = Session(runner, Ref(ref64, tf32), "tf32", Secret(SEED))
    j = seen.judge("ramp", [out], d, [], varied=True, distribution=True)
    assert j.trial.passed and j.trial.outputs[0].judged == "norm-relative", j.trial
    assert any("tf32 arithmetic" in n for n in seen.notes), seen.notes
    assert not seen.judge("ramp", [(ref64 * 1.25).float()], d, [], varied=True, distribution=True).trial.passed  # 25 % off
    assert not seen.judge("plain", [out], d, [], varied=False).trial.passed  # plain trials: elementwise as before


def test_child_dies_with_its_parent(tmp_path):
    """A parent killed outright (SIGKILL, no cleanup) takes its verifier child with it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pidfile = tmp_path / "child.pid"
    child_code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys\n"
        "from stitchcuda.verifier.run.child import Limits, run_child\n"
        f"run_child([sys.executable, '-c', {child_code!r}], {str(tmp_path / 'work')!r}, limits=Limits())\n"
    )
    p = subprocess.Popen([sys.executable, str(script)])
    for _ in range(200):
        if pidfile.exists() and pidfile.read_text():
            break
        time.sleep(0.05)
    child = int(pidfile.read_text())
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the child outlived its killed parent")


def test_the_max_autotune_baseline_is_torch_compile_asked_to_autotune(adv_problem, fake_cuda, monkeypatch):
    """VerifyOptions.autotune (``--baselines max-autotune``): a fifth baseline, torch.compile with
    mode="max-autotune" at the policy, in the same table; absent unless asked for."""
    from stitchcuda.verifier.measure.timing import time_all

    modes = []

    def fake_compile(model, mode=None, **kw):
        modes.append(mode)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: None)
    settings = LoopSettings(min_trials=3, min_seconds=0.0, max_seconds=1.0)
    d = adv_problem.draw(1)
    args = adv_problem.model_args(d)
    table, _ = time_all(lambda: None, adv_problem.model, args, precision="fp32", stream=fake_cuda, compile=True,
                        settings=settings)
    assert table.compile_autotune is None and "max-autotune" not in modes
    assert "torch.compile max-autotune at policy" not in dict(table.baselines())
    table, _ = time_all(lambda: None, adv_problem.model, args, precision="fp32", stream=fake_cuda, compile=True,
                        autotune=True, settings=settings)
    assert modes[-1] == "max-autotune" and table.compile_autotune is not None
    assert dict(table.baselines())["torch.compile max-autotune at policy"] is table.compile_autotune
