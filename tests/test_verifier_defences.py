"""The second round of the Verifier's defences, each judged on the CPU with a fake program (a Python
callable on a fake stream) — one class of dishonest or unsafe program per test, the honest program
beside it where the class could refuse an honest one:

 1 memory outside the outputs (guard zones, weights)   7 leaks (memory that grows with the calls)
 2 races right almost always (runs under pressure)     9 ties (index outputs on tied inputs)
 3 parameters never varied (drawn away from init)     10 shortcuts through long dependencies (edges)
 4 precision claimed, not computed (several trials)   11 stream capture (a captured call replayed)
 5 work on another stream (the runtime's call log)    12 degenerate references (said in the verdict)
 6 behaviour that changes late (the timed calls' schedule)

Class 8 (the host process reached without importing it) is the native runner's: its CPU tests are in
test_verifier_native.py and the link-map rules in test_verifier_static.py.
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stitchcuda import manifest as mf  # noqa: E402
from stitchcuda.verifier import DynamicCheck, build_result  # noqa: E402
from stitchcuda.verifier.measure.memory import MemoryReading, leak_check  # noqa: E402
from stitchcuda.verifier.measure.timing import LoopSettings, measure  # noqa: E402
from stitchcuda.verifier.run.correctness import check_correctness  # noqa: E402
from stitchcuda.verifier.run.guards import GuardedBuffers  # noqa: E402
from stitchcuda.verifier.run.harness import ReferenceHarness  # noqa: E402
from stitchcuda.verifier.run.parameters import structural, vary_parameters  # noqa: E402
from stitchcuda.verifier.run.reference import resolve_reference  # noqa: E402
from stitchcuda.verifier.run.timed_calls import TimedCalls  # noqa: E402

ADV = Path(__file__).resolve().parent / "adversarial"
REFS = ADV / "references"
SEED = 20261122


class FakeRunner:
    """A 'stream': what a program enqueues runs in order at sync; ``pressure`` is passed to the
    program. :func:`fake` adds what a real runner offers besides, one feature at a time."""

    device = torch.device("cpu")
    pressure_ok = True

    def __init__(self, program):
        self.program, self.queue = program, []
        self.capturing = False
        self.held = 0  # bytes the program says it holds
        self.pressure = False
        self.log = {"calls": [], "foreign_stream": 0, "foreign_first": ""}

    def context(self):
        return contextlib.nullcontext()

    def enqueue(self, fn):
        self.queue.append(fn)

    def run(self, inputs, outputs, pressure=False):
        self.pressure = pressure
        self.program(inputs, outputs, self)

    def sync(self):
        q, self.queue = self.queue, []
        for fn in q:
            fn()

    sync_device = sync

    def hold(self):
        pass

    def ordered(self, fn):
        self.enqueue(fn)


class _Capture:
    """``capture`` records a call; ``replay`` makes it again with ``capturing`` set, as a graph replays."""

    def capture(self, inputs, outputs):
        self.captured = (inputs, outputs)

    def replay(self):
        self.capturing = True
        self.program(*self.captured, self)
        self.sync()
        self.capturing = False

    def drop_capture(self):
        self.captured = None


class _Memory:
    def memory(self):
        return MemoryReading(device=self.held)


class _Log:
    def library_calls(self):
        log, self.log = self.log, {"calls": [], "foreign_stream": 0, "foreign_first": ""}
        return log


FEATURES = {"capture": _Capture, "memory": _Memory, "log": _Log}


def fake(program, *features: str) -> FakeRunner:
    return type("Fake", (FakeRunner, *[FEATURES[f] for f in features]), {})(program)


def harness(ref: str, shape_in, shape_out, weights=(), out_dtype="float32", **kw) -> ReferenceHarness:
    m = mf.Manifest.from_dict({
        "format": "stitchcuda-program", "version": 1, "name": "t", "abi_version": 1, "precision": "fp32",
        "arch": "sm_90", "source_hash": "0" * 64, "reference": {"path": str(REFS / ref) if "/" not in ref else ref},
        "inputs": [{"name": "x", "dtype": "float32", "shape": list(shape_in)}],
        "outputs": [{"name": "y", "dtype": out_dtype, "shape": list(shape_out)}],
        "weights": [{"name": n, "dtype": "float32", "shape": list(s)} for n, s in weights],
        "reference_ops": kw.pop("ops", []), "tasks": []}, "manifest.json")
    path = REFS / ref if "/" not in ref else Path(ref)
    return ReferenceHarness(resolve_reference(str(path), REFS, m), m, "cpu", weights_seed=SEED, **kw)


def linear() -> ReferenceHarness:
    m = mf.Manifest.load(ADV / "correct")
    return ReferenceHarness(resolve_reference(None, ADV / "correct", m), m, "cpu", weights_seed=SEED)


def verdict(runner, P, precision="fp32", **kw):
    res = check_correctness(runner, P, precision=precision, seed=SEED, **kw)
    return build_result(trials=res.trials, checks=res.checks, tolerance=res.tolerance,
                        degenerate=res.degenerate), res


def reason(v) -> str:
    if v.kind != "rejected":
        return v.kind
    return v.verdict.checks[0].name if v.verdict.checks else v.verdict.findings[0].rule


def honest_linear(P):
    w, b = P.weights

    def prog(i, o, r):
        r.enqueue(lambda: o[0].copy_(torch.relu(i[0] @ w.T + b)))
    return prog


def block_of(t: torch.Tensor) -> torch.Tensor:
    """The whole allocation a buffer handed out lives in, as bytes (what an overrun reaches)."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


# ------------------------------------------------------------------ 1: memory outside the outputs


def test_guards_catch_a_write_past_the_end_of_an_output():
    P = linear()
    w, b = P.weights

    def overrun(i, o, r):  # right outputs, and 16 bytes of scratch past the end of y
        def go():
            o[0].copy_(torch.relu(i[0] @ w.T + b))
            end = o[0].storage_offset() * 4 + o[0].numel() * 4
            block_of(o[0])[end:end + 16] = 7
        r.enqueue(go)

    v, _ = verdict(FakeRunner(overrun), P)
    assert reason(v) == "memory_bounds" and "after its end changed" in v.verdict.reasons[0], v.verdict.reasons


def test_a_program_writing_its_weights_is_named():
    P = linear()
    buffers = GuardedBuffers("cpu", 1)
    w, b = [buffers.copy(t, k, f"weight {k}") for k, t in enumerate(P.weights)]
    P.weights = [w, b]

    def scratch_in_bias(i, o, r):  # uses its bias as scratch and puts it back... almost
        def go():
            o[0].copy_(torch.relu(i[0] @ w.T + b))
            b[0] += 1e-3
        r.enqueue(go)

    v, _ = verdict(FakeRunner(scratch_in_bias), P, buffers=buffers, weights=[w, b])
    assert "weights_unchanged" in [c.name for c in v.verdict.checks], v.verdict.reasons


def test_guarded_buffers_vary_their_addresses_and_keep_their_guards():
    g = GuardedBuffers("cpu", 3)
    a, b = g.empty((8,), torch.float32, k=0), g.empty((8,), torch.float32, k=1)
    ga, gb = g.block_of(a)[0].front, g.block_of(b)[0].front
    assert ga != gb and g.check() == []
    block_of(a)[ga - 1] ^= 0xFF  # one byte before the start
    assert g.check([("input x", a)]) == ["input x: 1 byte(s) before its start changed"]
    assert g.check() == []  # written again: reported once


# ------------------------------------------------------------------ 2: races right almost always


def test_a_race_that_shows_only_under_launch_pressure_is_named():
    P = linear()
    w, b = P.weights

    def racy(i, o, r):
        bad = r.pressure

        def go():
            o[0].copy_(torch.relu(i[0] @ w.T + b))
            if bad:
                o[0][3, 5] += 0.5  # the losing order of two blocks, once in a while
        r.enqueue(go)

    v, res = verdict(FakeRunner(racy), P)
    assert reason(v) == "deterministic", v.verdict.reasons
    assert "under launch pressure" in next(c.detail for c in res.checks if c.name == "deterministic")


# ------------------------------------------------------------------ 3: parameters never varied


def test_a_program_that_skips_a_parameter_whose_init_is_trivial_is_wrong():
    """A LayerNorm starts with weight 1 and bias 0: a program that assumes them is right at the
    initial values only; the Verifier never judges there."""
    P = harness("norm.py", (256, 1024), (256, 1024), weights=[("norm.weight", (1024,)), ("norm.bias", (1024,))])
    assert not torch.allclose(P.weights[0], torch.ones(1024)) and not torch.allclose(P.weights[1], torch.zeros(1024))

    def plain_norm(i, o, r):
        r.enqueue(lambda: o[0].copy_(torch.nn.functional.layer_norm(i[0], (1024,))))

    v, _ = verdict(FakeRunner(plain_norm), P)
    assert v.kind == "wrong_answer", v.verdict.summary()

    def honest(i, o, r):
        wn, bn = P.weights
        r.enqueue(lambda: o[0].copy_(torch.nn.functional.layer_norm(i[0], (1024,), wn, bn)))

    v, _ = verdict(FakeRunner(honest), P)
    assert v.ok, v.verdict.summary()


def test_what_has_a_meaning_keeps_it():
    """Integer-valued buffers (a causal mask, an index table) are left as they are; a tensor of one
    sign keeps its sign; everything else moves away from its value."""
    m = torch.nn.Module()
    m.register_buffer("mask", torch.tril(torch.ones(4, 4)))
    m.register_buffer("var", torch.rand(8) + 0.5)
    m.w = torch.nn.Parameter(torch.randn(8, 8))
    m.z = torch.nn.Parameter(torch.zeros(8))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    kept = vary_parameters(m, 5)
    assert kept == ["mask"] and torch.equal(m.mask, before["mask"]) and structural(m.mask)
    assert (m.var > 0).all() and not torch.equal(m.var, before["var"])
    assert not torch.equal(m.w, before["w"]) and m.z.abs().sum() > 0


# ------------------------------------------------------------------ 4: precision claimed, not computed


def test_the_precision_claim_is_measured_on_several_trials():
    """A program at its claimed precision on its first call and bf16 after: measured on the first
    trial only it passed; summed over three it does not."""
    from .test_verifier_tolerance import EmulatedGemm, _round_bf16, _round_tf32

    m = mf.Manifest.load(ADV / "gemm_tf32_honest")
    P = EmulatedGemm(resolve_reference(None, ADV / "gemm_tf32_honest", m), m, "cpu", weights_seed=SEED, vary=False)
    (w,) = P.weights
    calls = {"n": 0}

    def first_honest(i, o, r):
        calls["n"] += 1
        f = _round_tf32 if calls["n"] == 1 else _round_bf16
        r.enqueue(lambda: o[0].copy_(f(i[0]) @ f(w).T))

    v, res = verdict(FakeRunner(first_honest), P, precision="tf32", varied=0)
    (c,) = [c for c in res.checks if c.name == "precision_claim"]
    assert c.status == "fail" and "over 3 trial(s)" in c.detail, c


def test_library_calls_below_the_claim_fail_it():
    P = linear()
    runner = fake(honest_linear(P), "log")
    runner.log["calls"] = [{"fn": "st_gemm", "policy": 2, "dtypes": "2,2,2", "count": 12}]
    v, _ = verdict(runner, P, precision="tf32")
    assert reason(v) == "precision_claim" and "bf16 policy under a tf32 claim" in v.verdict.reasons[0]


def _tf32_manifest():
    """A one-input, one-output program's manifest claiming tf32 (what the kernel-name check reads)."""
    return mf.Manifest.from_dict({
        "format": "stitchcuda-program", "version": 1, "name": "k", "abi_version": 1, "precision": "tf32",
        "arch": "sm_90", "source_hash": "0" * 64, "reference": {"path": "reference.py"},
        "inputs": [{"name": "x", "dtype": "float32", "shape": [4, 4]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [4, 4]}]})


def test_library_kernels_below_the_claim_fail_it():
    from stitchcuda.verifier.report.profile import KernelRecord
    from stitchcuda.verifier.run.precision_claim import kernel_math
    from stitchcuda.verifier.verification import _kernel_precision

    # what cuBLAS, cuBLASLt and cuDNN name their kernels by; the program's own kernels say nothing
    assert kernel_math("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64") == "fp16"
    assert kernel_math("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN") == "fp16"
    assert kernel_math("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8") == "bf16"
    assert kernel_math("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc") == "tf32"
    assert kernel_math("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8") == ""
    assert kernel_math("_Z11my_gemm_f16PKfPf") == kernel_math("stitch_gemm_tile_128x128x16") == ""
    m = _tf32_manifest()
    ok = [DynamicCheck("precision_claim", "pass", "errors at tf32")]
    ks = [KernelRecord("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", 0, 1), KernelRecord("stitch_task_0", 1, 2)]
    notes: list[str] = []
    got = _kernel_precision(ok, ks, m, "tf32", notes)
    assert [c.status for c in got] == ["fail"] and "compute in fp16" in got[0].detail
    assert _kernel_precision(ok, ks[1:], m, "tf32", notes) == ok  # nothing a library ran
    tf32 = [KernelRecord("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", 0, 1)]
    assert _kernel_precision(ok, tf32, m, "tf32", notes) == ok
    assert _kernel_precision(ok, tf32, m, "fp32", notes)[0].status == "fail"


def test_split_bf16_calls_excuse_only_their_own_bf16_launches():
    """Under a tf32 claim, the bf16 launches the runtime's split-bf16 GEMM accounts for are
    no evidence; one more bf16 launch is, and so is any fp16 launch, and nothing is excused under fp32."""
    from stitchcuda.verifier.run.precision_claim import kernel_evidence

    bf16 = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
    fp16 = "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN"
    assert kernel_evidence([bf16] * 4, "tf32", excused_bf16=4) == ""
    assert "4 library kernel" not in kernel_evidence([bf16] * 5, "tf32", excused_bf16=4)
    assert "1 library kernel launch(es) under a tf32 claim compute in bf16" in \
        kernel_evidence([bf16] * 5, "tf32", excused_bf16=4)
    assert "compute in fp16" in kernel_evidence([bf16, fp16], "tf32", excused_bf16=4)
    assert "compute in bf16" in kernel_evidence([bf16], "fp32", excused_bf16=4)
    assert "compute in bf16" in kernel_evidence([bf16], "tf32")


def test_a_split_bf16_call_excuses_its_three_products_launches():
    """The profile's check counts SPLIT_BF16_LAUNCHES a call: a call's three products (each a GEMM
    kernel and, where cuBLASLt splits K, its reduction) pass; one launch more does not."""
    from stitchcuda.verifier.report.profile import KernelRecord
    from stitchcuda.verifier.run.precision_claim import SPLIT_BF16_LAUNCHES
    from stitchcuda.verifier.verification import _kernel_precision

    assert SPLIT_BF16_LAUNCHES >= 3
    m = _tf32_manifest()
    ok = [DynamicCheck("precision_claim", "pass", "errors at tf32")]
    bf16 = KernelRecord("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 0, 1)
    three = [bf16] * 3
    assert _kernel_precision(ok, three, m, "tf32", [], split_bf16_calls=1) == ok
    assert _kernel_precision(ok, three, m, "tf32", [])[0].status == "fail"
    more = [bf16] * (SPLIT_BF16_LAUNCHES + 1)
    assert _kernel_precision(ok, more, m, "tf32", [], split_bf16_calls=1)[0].status == "fail"

# ------------------------------------------------------------------ 5: work on another stream


def test_a_runtime_call_on_another_stream_is_named():
    P = linear()
    runner = fake(honest_linear(P), "log")
    runner.log.update(foreign_stream=3, foreign_first="st_conv on stream 0x0 during a run on stream 0x5")
    v, _ = verdict(runner, P)
    assert reason(v) == "runtime_stream" and "st_conv on stream 0x0" in v.verdict.reasons[0]


# ------------------------------------------------------------------ 6: behaviour that changes late


class _Clock:
    t = 0.0

    def __call__(self):
        return self.t


class _Timer:
    def __init__(self, clock, ms):
        self.clock, self.ms = clock, ms

    def time(self, fn):
        fn()
        self.clock.t += self.ms / 1e3
        return self.ms


@pytest.mark.parametrize("honest_for", [300, 3000])
def test_a_program_idle_after_hundreds_of_calls_is_caught(honest_for):
    """Checked calls spread over the whole timed phase, the last included: a program honest for its
    first hundreds (or thousands) of calls and idle after is judged when idle."""
    x = [torch.randn(4, 4)]
    y = [torch.empty(4, 4)]
    calls = {"n": 0}

    def program():
        calls["n"] += 1
        if calls["n"] <= honest_for:
            y[0].copy_(x[0] * 2)

    def judge(outputs, ref):
        ok = torch.equal(outputs[0], ref[0])
        return ok, "" if ok else "wrong"

    tc = TimedCalls(x, y, lambda xs: [xs[0] * 2], judge, random.Random(SEED), LoopSettings())
    clock = _Clock()
    _, warm, samples = measure(program, _Timer(clock, 0.2), lambda: None, LoopSettings(), clock=clock, calls=tc)
    r = tc.result()
    assert len(samples) > honest_for and r.failed >= 1 and not r.passed, r
    assert r.last_checked == len(samples) and r.calls == warm + len(samples)  # the phase's last call, always


@pytest.mark.parametrize("draws_fault", [True, False])
def test_a_checked_call_wrong_in_fresh_buffers_too_is_the_draws(draws_fault):
    """A checked call that is wrong is asked again (same inputs, fresh buffers): where the answer is
    the same wrong one there, it is counted a wrong answer on the draw and the check passes; where
    not, the timed calls failed."""
    x, y = [torch.randn(4, 4)], [torch.empty(4, 4)]
    asked = []

    def again(call, inputs, outputs):
        asked.append((call, inputs[0] is x[0], outputs[0] is y[0]))
        return draws_fault

    tc = TimedCalls(x, y, lambda xs: [xs[0] * 2], lambda o, r: (False, "off"), random.Random(SEED), LoopSettings(),
                    again=again)
    clock = _Clock()
    measure(lambda: None, _Timer(clock, 0.2), lambda: None, LoopSettings(), clock=clock, calls=tc)
    r = tc.result()
    assert asked and all(a[1] and a[2] for a in asked) and len(asked) == r.checked
    if draws_fault:
        assert r.passed and r.wrong == r.checked and r.failed == 0 and "timed call" in r.wrong_detail
        assert "a wrong answer on that draw" in r.summary()
    else:
        assert not r.passed and r.failed == r.checked and r.wrong == 0 and "wrong (of" in r.summary()


def test_the_checked_calls_cover_every_stretch_of_the_phase():
    tc = TimedCalls([torch.zeros(2)], [torch.zeros(2)], lambda xs: xs, lambda o, r: (True, ""),
                    random.Random(1), LoopSettings())
    due = [k for k in range(1 << 14) if tc.due(k)]
    stretches = {TimedCalls.stretch(k)[0] for k in due}
    assert stretches == set(range(12)) and len(due) == 3 + 2 * 11


# ------------------------------------------------------------------ 7: leaks


def test_memory_that_grows_with_the_calls_is_a_verdict():
    P = linear()
    w, b = P.weights
    runner = fake(None, "memory")

    def leaky(i, o, r):
        r.held += 64 << 10  # 64 KiB a call, never given back
        r.enqueue(lambda: o[0].copy_(torch.relu(i[0] @ w.T + b)))

    runner.program = leaky
    v, _ = verdict(runner, P)
    assert reason(v) == "memory_leak" and "grows with the number of calls" in v.verdict.reasons[0]
    honest = fake(honest_linear(P), "memory")
    v, res = verdict(honest, P)
    assert v.ok and next(c for c in res.checks if c.name == "memory_leak").status == "pass"


def test_a_one_time_allocation_is_not_a_leak():
    held = {"b": 0, "calls": 0}

    def calls(k):
        held["calls"] += k
        if held["calls"] > 30 and held["b"] == 0:
            held["b"] = 64 << 20  # a plan sized on a later call, once
    c = leak_check(calls, lambda: MemoryReading(device=held["b"]), n=100, warmup=20)
    assert c.status == "pass", c


def test_the_leak_check_names_the_scope_of_its_device_reading():
    """A leak read over the whole device says that another process moves that figure too; one read as
    the runner process's own (NVML) does not; a pass names the scope; and two readings of different
    scopes (NVML answering on one and not the next) are not subtracted: no device verdict from them."""
    held = {"b": 0}

    def calls(k):
        held["b"] += k << 16  # 64 KiB a call

    whole = leak_check(calls, lambda: MemoryReading(device=held["b"]), n=100, warmup=20)
    assert whole.status == "fail" and "the whole device" in whole.detail, whole
    own = leak_check(calls, lambda: MemoryReading(device=held["b"], device_scope="process"), n=100, warmup=20)
    assert own.status == "fail" and "whole device" not in own.detail, own
    flat = leak_check(lambda k: None, lambda: MemoryReading(device=5, device_scope="process"), n=100, warmup=20)
    assert flat.status == "pass" and "the runner process's own" in flat.detail, flat
    scopes = iter(["process", "device"] * 4)
    mixed = leak_check(calls, lambda: MemoryReading(device=held["b"], device_scope=next(scopes)), n=100, warmup=20)
    assert mixed.status == "pass" and "device" not in mixed.detail.split(":")[-1], mixed


def test_a_process_device_memory_is_read_only_where_nvml_names_it():
    """gpu_processes: the runner's own bytes where NVML lists its PID; None where NVML is silent, lists
    nothing, or lists other PIDs only (a container whose processes NVML names by the host's PIDs);
    visible() looks for the calling process itself."""
    import os

    from stitchcuda.verifier.measure import gpu_processes as gp

    listed = {"GPU-a": [(11, 3 << 30), (os.getpid(), 1 << 29)], "GPU-b": [(99, 1 << 30)]}
    q = listed.get
    assert gp.process_bytes(11, "GPU-a", q) == 3 << 30
    assert gp.process_bytes(12, "GPU-a", q) is None and gp.process_bytes(11, "GPU-c", q) is None
    assert gp.process_bytes(11, "GPU-a", lambda u: None) is None
    assert gp.visible("GPU-a", q) and not gp.visible("GPU-b", q)
    assert gp.nvml_processes("GPU-none") is None or gp.nvml_processes("GPU-none") == []   # no such device
    # the struct NVML's ..._v3 fills, by the driver's entry points (24 bytes; 32 on the few in between)
    old, between = type("L", (), {}), type("L", (), {"nvmlDeviceGetConfComputeMemSizeInfo": 1})
    new = type("L", (), {"nvmlDeviceGetConfComputeMemSizeInfo": 1, "nvmlDeviceGetRunningProcessDetailList": 1})
    import ctypes
    assert [ctypes.sizeof(gp._info_type(x)) for x in (old, between, new)] == [24, 32, 24]


# ------------------------------------------------------------------ 9: ties


def test_an_argmax_that_breaks_ties_another_way_is_named():
    P = harness("argmax.py", (128, 512), (128,), out_dtype="int64",
                ops=[{"node": "argmax", "op": "aten.argmax.default", "flops": 0, "bytes": 0}])

    def last_max(i, o, r):  # the last maximal element: right whenever no two elements tie
        r.enqueue(lambda: o[0].copy_(511 - torch.argmax(i[0].flip(1), dim=1)))

    v, _ = verdict(FakeRunner(last_max), P)
    assert reason(v) == "ties" and "breaks ties by another rule" in v.verdict.reasons[0], v.verdict.summary()

    def first_max(i, o, r):
        r.enqueue(lambda: o[0].copy_(torch.argmax(i[0], dim=1)))

    v, _ = verdict(FakeRunner(first_max), P)
    assert v.ok, v.verdict.summary()


# ------------------------------------------------------------------ 10: shortcuts through long dependencies


def test_a_scan_that_skips_its_first_steps_is_caught_at_the_edge():
    P = harness("decay_scan.py", (32, 2048, 64), (32, 64))
    wts = 0.995 ** torch.arange(2047, -1, -1, dtype=torch.float32)

    def last_steps(i, o, r):  # the last 1920 of 2048 steps: off by ~1e-4 of y's scale
        r.enqueue(lambda: o[0].copy_(torch.einsum("btf,t->bf", i[0][:, 128:], wts[128:])))

    v, res = verdict(FakeRunner(last_steps), P, precision="tf32")
    assert all(t.passed for t in res.trials if not t.label.startswith("sensitivity")), v.verdict.summary()
    assert reason(v) == "sensitivity" and "the start of axis 1" in v.verdict.reasons[0], v.verdict.reasons

    def honest(i, o, r):
        r.enqueue(lambda: o[0].copy_(torch.einsum("btf,t->bf", i[0], wts)))

    v, _ = verdict(FakeRunner(honest), P, precision="tf32")
    assert v.ok, v.verdict.summary()


# ------------------------------------------------------------------ 11: stream capture


def test_a_program_idle_when_its_stream_is_captured_is_named():
    P = linear()
    w, b = P.weights

    def idle_when_captured(i, o, r):
        if not r.capturing:
            r.enqueue(lambda: o[0].copy_(torch.relu(i[0] @ w.T + b)))

    v, _ = verdict(fake(idle_when_captured, "capture"), P)
    assert reason(v) == "stream_capture" and "replayed" in v.verdict.reasons[0], v.verdict.reasons
    v, res = verdict(fake(honest_linear(P), "capture"), P)
    assert v.ok and next(c for c in res.checks if c.name == "stream_capture").status == "pass"


# ------------------------------------------------------------------ 12: degenerate references


def test_a_head_initialised_to_zeros_is_drawn_again():
    """At its initialisation the reference is 0 whatever the input: a program returning zeros would
    pass. Its parameters are drawn again so that the outputs depend on the inputs, and it does not."""
    P = harness("zero_head.py", (64, 256), (64, 16), weights=[("fc.weight", (128, 256)), ("fc.bias", (128,)),
                                                              ("head.weight", (16, 128)), ("head.bias", (16,))])
    assert P.weights[2].abs().sum() > 0 and P.degenerate == ""

    def zeros(i, o, r):
        r.enqueue(lambda: o[0].zero_())

    v, _ = verdict(FakeRunner(zeros), P)
    assert v.kind == "wrong_answer", v.verdict.summary()


def test_a_reference_whose_outputs_no_input_moves_passes_as_degenerate():
    P = harness("constant.py", (64, 256), (64, 256))
    assert "a constant answer passes" in P.degenerate

    def ones(i, o, r):
        r.enqueue(lambda: o[0].fill_(1.0))

    v, res = verdict(FakeRunner(ones), P)
    assert v.ok and v.verdict.degenerate and res.degenerate
    assert v.verdict.summary().startswith("passed (degenerate: outputs independent of inputs)")


def _bn_weights(depth=24, width=64, scale_drawn=False):
    out = []
    for k in range(depth):
        out += [(f"body.{3 * k}.weight", (width, width)), (f"body.{3 * k}.bias", (width,)),
                (f"body.{3 * k + 1}.weight", (width,)), (f"body.{3 * k + 1}.bias", (width,)),
                (f"body.{3 * k + 1}.running_mean", (width,)), (f"body.{3 * k + 1}.running_var", (width,))]
    return out


def test_vanished_activations_get_their_batch_norms_calibrated_and_no_constant_passes():
    """Linear layers drawn at 0.02 under eval-mode batch norms at their initial statistics: after 24
    blocks the output is the biases' alone, whatever the input. The norms' statistics are measured on
    drawn inputs (the parameters stay as drawn), the outputs then depend on the inputs, the program
    gets those statistics as its weights, and the constant the degenerate reference gave is wrong."""
    P = harness("vanishing_bn.py", (64, 64), (64, 64), weights=_bn_weights())
    assert P.degenerate == "", P.notes
    assert any("running statistics were measured" in n for n in P.notes), P.notes
    # the program's weights are the calibrated statistics: no longer the initial 0 and 1
    mean, var = P.weights[4], P.weights[5]
    assert mean.abs().max() > 0 and (var - 1).abs().max() > 0.5
    d = P.draw(SEED)
    constant = P.forward(d)[0].clone()
    d2 = P.draw(SEED + 1)
    assert not torch.allclose(P.forward(d2)[0], constant, atol=1e-2, rtol=1e-2)

    def first_answer(i, o, r):
        r.enqueue(lambda: o[0].copy_(constant))

    v, _ = verdict(FakeRunner(first_answer), P, precision="tf32")
    assert v.kind == "wrong_answer", v.verdict.summary()


def test_norm_scales_drawn_near_zero_are_drawn_again_around_one():
    """The same stack with every norm's scale drawn at 0.02: measured statistics do not help (each
    block still multiplies by 0.02), the parameters are drawn again with each norm's scale around
    one, and the outputs depend on the inputs."""
    P = harness("vanishing_norm_scale.py", (64, 64), (64, 64), weights=_bn_weights())
    assert P.degenerate == "", P.notes
    assert any("drawn again at the layers' scale" in n for n in P.notes), P.notes
    scale = P.weights[2]
    assert scale.min() > 0 and 0.3 < scale.mean() < 3


def test_norm_calibration_leaves_training_mode_norms_and_their_momentum_alone():
    from stitchcuda.verifier.run.parameters import calibrate_norms

    train_bn, eval_bn = torch.nn.BatchNorm1d(8), torch.nn.BatchNorm1d(8, momentum=0.3).eval()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), eval_bn, train_bn)
    x = torch.randn(32, 8) * 5 + 3
    assert calibrate_norms(model, lambda: model(x)) == 1
    assert not eval_bn.training and eval_bn.momentum == 0.3 and train_bn.training
    with torch.no_grad():
        h = model[0](x)
    assert torch.allclose(eval_bn.running_mean, h.mean(0), atol=1e-5)
    assert torch.allclose(eval_bn.running_var, h.var(0), rtol=1e-4)
    assert calibrate_norms(torch.nn.Sequential(torch.nn.Linear(8, 8)), lambda: None) == 0


def test_outputs_small_beside_the_tolerance_are_not_degenerate_when_they_move_with_the_inputs():
    """A row mean of uniform [0, 1) inputs is 0.5 +- 0.002 for every draw of get_inputs(), within
    tolerance of itself, yet moves with its inputs: the inputs scaled up (reference side) and the
    varied trials (program side) show it, and an honest pass is a pass, not 'degenerate'."""
    P = harness("rowmean.py", (256, 16384), (256,))
    assert P.degenerate == ""

    def mean(i, o, r):
        r.enqueue(lambda: o[0].copy_(i[0].mean(dim=1)))

    v, res = verdict(FakeRunner(mean), P)
    assert v.ok and not v.verdict.degenerate and not res.degenerate, v.verdict.summary()


class _WaitingClock:
    """A ProgramClock whose wall time is the events', plus ``hidden`` ms the events never see, plus
    ``wait`` ms that any launch costs to wait for (another process's kernels, a blocked host thread)."""

    where = "fake"

    def __init__(self, event_ms: float, hidden: float, wait: float):
        self.event_ms, self.hidden, self.wait = event_ms, hidden, wait
        self.k = 0

    def time(self) -> float:
        return self.event_ms

    def wall(self) -> float:
        self.k += 1
        return self.event_ms + self.hidden + self.wait + 0.001 * (self.k % 3)

    def overhead(self) -> float:
        return self.wait + 0.001 * (self.k % 2)


def test_hidden_work_is_judged_beside_what_waiting_for_any_launch_costs():
    """A 14 us program on a device another process keeps busy reads 2.2 ms by the host clock: so does
    an empty kernel, and nothing is hidden. 2 ms of work on another stream is hidden however long
    the wait."""
    from stitchcuda.verifier.measure.timing import wall_check

    assert wall_check(_WaitingClock(0.014, 0.0, 2.2), 0.014).passed
    assert wall_check(_WaitingClock(0.65, 0.0, 2.2), 0.65).passed
    for wait in (0.001, 2.2):
        w = wall_check(_WaitingClock(0.014, 2.0, wait), 0.014)
        assert not w.passed and "invisible to CUDA events" in w.detail, (wait, w)


def test_the_in_process_clock_measures_its_overhead_around_a_launch():
    """LocalClock's overhead is one piece of device work on the program's stream (the L2 flusher's
    one-byte set in time_all), waited for like the program: not an empty synchronise."""
    from stitchcuda.verifier.measure.timing import LocalClock

    now = {"t": 0.0}
    probe_calls = []

    def probe():
        probe_calls.append(1)
        now["t"] += 0.002  # what waiting for any launch costs on a busy device

    clock = LocalClock(lambda: None, timer=None, flush=lambda: None, sync_device=lambda: None,
                       clock=lambda: now["t"], probe=probe)
    assert abs(clock.overhead() - 2.0) < 1e-9 and probe_calls == [1]


def test_checked_timed_calls_are_judged_as_the_trials_are():
    """A checked call failing against the fp32 reference passes within tolerance of float64, or, where
    the fp32 reference itself misses float64 (ill-conditioned beyond fp32), within it in norm; a
    wrong output fails either way."""
    from stitchcuda.verifier.run.timed_calls import output_judge

    spec = mf.TensorSpec("y", (4096,), "float32")
    g = torch.Generator().manual_seed(SEED)
    ref64 = torch.randn(4096, generator=g, dtype=torch.float64) * 1e6
    ref64[:4] = 0.5                                             # four cancel to near nothing
    out = (ref64 + torch.randn(4096, generator=g, dtype=torch.float64) * 1e3).float()   # 1e-3 in norm
    asked = []

    def truth(t):
        return lambda: asked.append(1) or [t]

    judge = output_judge([spec], 1e-2, truth(ref64))
    assert judge([ref64.float()], [ref64.float()]) == (True, "") and not asked      # float64 only on a failure
    ok, detail = judge([out], [ref64.float()])                  # fp32 meets the truth: elementwise
    assert not ok and "elements wrong" in detail and asked
    assert judge([out], [(ref64 + 0.1).float()])[0]             # the fp32 reference misses at [:4]
    assert not judge([(ref64 * 1.05).float()], [(ref64 + 0.1).float()])[0]   # 5 % off in norm
    assert judge([ref64.float()], [(ref64 * 1.5).float()])[0]   # the float64 one judges where fp32 is off
    # near the bound at fp32: within twice the fp32 reference's own distance from float64 (compare.within_fp32_own)
    lim = 1e-2 + 1e-2 * ref64.abs()
    near32, ours = ref64.clone(), ref64.clone()
    near32[9] += 0.8 * lim[9]
    ours[11] += 1.3 * lim[11]
    assert judge([ours.float()], [near32.float()])[0]
    ours[11] += 0.5 * lim[11]                                   # 1.8 bounds: over twice fp32's 0.8
    assert not judge([ours.float()], [near32.float()])[0]


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
def test_forward_at_refuses_an_emulation_it_does_not_know(policy):
    """The reference protocol's emulation modes are precision.EMULATIONS under every policy (at fp32,
    where no emulation runs, too): a misspelt mode is an error, not a quiet None or PyTorch's own."""
    P = linear()
    with pytest.raises(ValueError, match="round, truncate"):
        P.forward_at(policy, P.draw(SEED), emulated="nearest")
    assert P.forward_at("fp32", P.draw(SEED), emulated="round") is None  # (nothing to emulate at fp32)
