"""The Verifier's memory budget (CPU): where its own copies go, and that every check keeps its power
when they go to the host or nowhere (a workstation card with a multi-GiB problem)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stitchcuda import manifest as mf  # noqa: E402
from stitchcuda.verifier import build_result  # noqa: E402
from stitchcuda.verifier.run import compare, harness, reference  # noqa: E402
from stitchcuda.verifier.run import copies as vm  # noqa: E402
from stitchcuda.verifier.run.correctness import check_correctness  # noqa: E402
from stitchcuda.verifier.run.session import count_where  # noqa: E402

from .test_verifier_run import ADV, SEED, FakeRunner, _programs  # noqa: E402

GiB = 1 << 30


# ------------------------------------------------------------------ the decision


def test_a_cpu_device_keeps_every_copy_on_the_device():
    assert vm.place(100 * GiB, vm.Room(device_free=None, host_free=0)) == "device"


@pytest.mark.parametrize("nbytes, device_free, host_free, want", [
    (GiB // 2, 10 * GiB, 64 * GiB, "device"),     # small and it fits
    (GiB, 10 * GiB, 64 * GiB, "device"),          # at the limit
    (GiB + 1, 60 * GiB, 64 * GiB, "host"),        # over the limit, however much the device has free
    (GiB // 2, GiB // 2, 64 * GiB, "host"),       # small, but the device is full
    (8 * GiB, 60 * GiB, 15 * GiB, "none"),        # the host has no room either (half its available memory)
    (8 * GiB, 60 * GiB, 16 * GiB, "host"),
    (8 * GiB, 60 * GiB, None, "host"),            # the host's room unknown: tried
])
def test_placement(nbytes, device_free, host_free, want):
    assert vm.place(nbytes, vm.Room(device_free, host_free), limit=GiB) == want


def test_a_bare_cuda_device_gets_the_current_index(monkeypatch):
    """A bare "cuda" (as the repair's TF32 model asked for the Verifier's draw) is the current device:
    torch.cuda.mem_get_info refuses a CUDA device without an index, and the model fell back to the
    captured weights on every GPU run."""
    import torch

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert vm.indexed("cuda") == torch.device("cuda", 1)
    assert vm.indexed("cuda:0") == torch.device("cuda", 0) and vm.indexed("cpu") == torch.device("cpu")
    assert vm.CopyBudget("cuda", limit=0).device == torch.device("cuda", 1)


def test_the_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("STITCHCUDA_VERIFY_COPY_GIB", "16")
    assert vm.CopyBudget("cpu").limit == 16 * GiB
    monkeypatch.setenv("STITCHCUDA_VERIFY_COPY_GIB", "nonsense")
    assert vm.CopyBudget("cpu").limit == vm.EXTRA_DEVICE_BYTES


def test_the_budget_names_the_checks_that_used_the_host():
    b = vm.CopyBudget("cpu", limit=GiB, room_fn=lambda: vm.Room(40 * GiB, 100 * GiB))
    assert b.place("repeat_calls: the previous call's outputs", 8 * GiB) == "host"
    assert b.place("small", GiB // 4) == "device"
    assert b.on_device(8 * GiB) is False
    assert b.notes == ["repeat_calls: the previous call's outputs: 8.00 GiB kept on the host (over the device "
                       "budget of 1.00 GiB for a copy)"]


# ------------------------------------------------------------------ copies, hashes, chunks


@pytest.mark.parametrize("where", ["device", "host"])
def test_a_stash_restores_and_counts_identical_elements_in_chunks(monkeypatch, where):
    monkeypatch.setattr(vm, "HOST_CHUNK", 7)  # chunks that do not divide the tensor
    a = torch.randn(5, 13, generator=torch.Generator().manual_seed(1))
    st = vm.Stash(where).save([a])
    assert st.available
    b = a.clone()
    b.view(-1)[[0, 20, 64]] += 1.0  # three elements changed, one in the last chunk
    mask = torch.ones_like(a, dtype=torch.bool)
    assert vm.count_same(mask, b, st, 0) == a.numel() - 3
    mask.view(-1)[:10] = False
    assert vm.count_same(mask, b, st, 0) == a.numel() - 10 - 2
    out = torch.empty_like(a)
    st.restore_into([out])
    assert torch.equal(out, a)
    assert st.save([b]) is st and vm.count_same(torch.ones_like(mask), b, st, 0) == a.numel()  # reused


def test_a_stash_kept_nowhere_says_so():
    st = vm.Stash("none").save([torch.ones(4)])
    assert not st.available
    with pytest.raises(RuntimeError):
        st.restore_into([torch.empty(4)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int8])
def test_the_keyed_hash_catches_one_flipped_bit_anywhere(monkeypatch, dtype):
    monkeypatch.setattr(compare, "CHUNK", 64)  # many chunks
    t = (torch.randn(1000, generator=torch.Generator().manual_seed(2)) * 50).to(dtype)
    key = 0x5EC12E7_1234567
    h = compare.fingerprint(t, key)
    for i in (0, 63, 64, 500, 999):
        u = t.clone()
        compare.bits(u).view(-1)[i] ^= 1  # the lowest bit of one element
        assert compare.fingerprint(u, key) != h, i
    u = t.clone()
    u[[10, 900]] = t[[900, 10]]  # two elements swapped, in different chunks
    assert torch.equal(u, t) or compare.fingerprint(u, key) != h


def test_count_where_counts_and_finds_the_first_across_chunks(monkeypatch):
    monkeypatch.setattr(compare, "CHUNK", 16)
    t = torch.zeros(7, 11)
    t[3, 4] = t[5, 0] = t[6, 10] = 1.0
    assert count_where(lambda c: c != 0, [t]) == (3, (3, 4))
    assert count_where(lambda c: c > 5, [t]) == (0, ())


def test_the_reference_checksum_sees_a_write_and_a_swap():
    t = torch.randn(1001, generator=torch.Generator().manual_seed(3))
    c = harness._checksum(t)
    u = t.clone()
    u[17] += 1.0
    assert harness._checksum(u) != c
    u = t.clone()
    u[[2, 3]] = t[[3, 2]]
    assert harness._checksum(u) != c


# ------------------------------------------------------------------ the checks, copies on the host or nowhere


@pytest.fixture
def adv_problem():
    m = mf.Manifest.load(ADV / "correct")
    return harness.ReferenceHarness(reference.resolve_reference(None, ADV / "correct", m), m, "cpu", weights_seed=SEED)


def _force(P, where: str):
    """The problem and a budget as on a small card: every copy over 0 bytes goes to the host, or
    (``none``) nowhere."""
    room = vm.Room(device_free=1 << 40, host_free=0 if where == "none" else 1 << 40)
    P.budget = vm.CopyBudget("cpu", limit=0, room_fn=lambda: room)
    return vm.CopyBudget("cpu", limit=0, room_fn=lambda: room)


CHEATS = [
    ("honest", None),
    ("pointer_cache", "no_output_reuse"),
    ("same_buffers_skip", "no_output_reuse"),
    ("fingerprint_memo", "sensitivity"),
    ("value_range", "varied_inputs"),
    ("partial_output", "outputs_written"),
    ("zero_inputs", "inputs_unchanged"),
    ("nondeterministic", "deterministic"),
    ("side_stream", "stream_ordered"),
]


@pytest.mark.parametrize("name, failed_check", CHEATS)
def test_with_copies_on_the_host_every_cheat_gets_its_reason(adv_problem, name, failed_check):
    budget = _force(adv_problem, "host")
    res = check_correctness(FakeRunner(_programs(adv_problem)[name]), adv_problem, precision="fp32", seed=SEED,
                            budget=budget)
    v = build_result(trials=res.trials, checks=res.checks, tolerance=res.tolerance)
    assert any("kept on the host" in n for n in res.notes), res.notes
    if failed_check is None:
        assert res.passed and v.ok, [c for c in res.checks if c.status == "fail"]
        edges = [t for t in res.trials if t.label.startswith("sensitivity at")]
        assert len(res.trials) == 5 + 4 + 6 + 3 + len(edges)
        return
    assert v.kind == "rejected" and v.verdict.checks[0].name == failed_check, (SEED, v.verdict.reasons)


@pytest.mark.parametrize("name, failed_check", CHEATS)
def test_with_no_room_for_copies_every_cheat_is_still_rejected(adv_problem, name, failed_check):
    budget = _force(adv_problem, "none")
    res = check_correctness(FakeRunner(_programs(adv_problem)[name]), adv_problem, precision="fp32", seed=SEED,
                            budget=budget)
    v = build_result(trials=res.trials, checks=res.checks, tolerance=res.tolerance)
    assert any("done without a copy" in n for n in res.notes), res.notes
    if failed_check is None:
        assert res.passed and v.ok, [c for c in res.checks if c.status == "fail"]
        return
    assert v.kind in ("rejected", "wrong_answer"), v.verdict


def _writer_problem() -> harness.ReferenceHarness:
    src = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        y = x * 2\n"
           "        x.zero_()\n        return y\n"
           "def get_inputs():\n    return [torch.randn(64, 32)]\ndef get_init_inputs():\n    return []\n")
    spec = reference.ReferenceSpec("writer.py", "writer", source=src)
    m = mf.Manifest.from_dict({
        "format": "stitchcuda-program", "version": 1, "name": "writer", "abi_version": 1, "precision": "fp32",
        "arch": "sm_90", "source_hash": "0" * 64, "reference": {"path": "reference.py"},
        "inputs": [{"name": "x", "dtype": "float32", "shape": [64, 32]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [64, 32]}]})
    return harness.ReferenceHarness(spec, m, "cpu", weights_seed=SEED)


def test_a_reference_writing_its_inputs_gets_a_copy_or_is_named():
    P = _writer_problem()
    d = P.draw(SEED)
    x = d.program[0].clone()
    (y,) = P.forward(d)  # room for a copy: the program's tensor is left alone
    assert torch.equal(d.program[0], x) and torch.equal(y, 2 * x)
    _force(P, "host")
    with pytest.raises(reference.ProblemError, match="writes its inputs in place"):
        P.forward(d)


# ------------------------------------------------------------------ on the device


class _MulRunner:
    """``y = 2 x`` on one stream, with no temporaries of its own (GPU)."""

    def __init__(self, stream):
        self.stream, self.device = stream, stream.device

    def context(self):
        return torch.cuda.stream(self.stream)

    def run(self, inputs, outputs):
        with torch.cuda.stream(self.stream):
            torch.mul(inputs[0], 2.0, out=outputs[0])

    def sync(self):
        self.stream.synchronize()

    def sync_device(self):
        torch.cuda.synchronize(self.device)

    def hold(self):
        with torch.cuda.stream(self.stream):
            torch.cuda._sleep(200_000_000)

    def ordered(self, fn):
        with torch.cuda.stream(self.stream):
            fn()


@pytest.mark.gpu
def test_peak_device_memory_is_the_working_set_and_a_bounded_rest():
    """A 2 GiB input and a 2 GiB output: the Verifier's peak stays a small multiple of the problem.
    Measured on an H100 (2026-11-22): 12.1 GiB, six sizes — two input sets (the repeated calls'
    two buffers, or a draw and its copy), the program's and the reference's outputs, and a draw
    and an output in flight. The bound is that plus 1 GiB of chunked temporaries: a seventh
    input-sized copy fails it (before the budgeted copies the peak was past nine)."""
    rows, cols = 16384, 32768  # 2 GiB of fp32
    src = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
           f"def get_inputs():\n    return [torch.rand({rows}, {cols})]\ndef get_init_inputs():\n    return []\n")
    spec = reference.ReferenceSpec("double.py", "double", source=src)
    m = mf.Manifest.from_dict({
        "format": "stitchcuda-program", "version": 1, "name": "double", "abi_version": 1, "precision": "fp32",
        "arch": "sm_90", "source_hash": "0" * 64, "reference": {"path": "reference.py"},
        "inputs": [{"name": "x", "dtype": "float32", "shape": [rows, cols]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [rows, cols]}]})
    P = harness.ReferenceHarness(spec, m, "cuda:0", weights_seed=SEED)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    res = check_correctness(_MulRunner(torch.cuda.Stream()), P, precision="fp32", seed=SEED)
    peak = torch.cuda.max_memory_allocated() - base
    assert res.passed, [c for c in res.checks if c.status == "fail"]
    assert any("kept on the host" in n for n in res.notes), res.notes
    size = rows * cols * 4
    assert peak <= 6 * size + 1 * GiB, (peak / GiB, res.notes)
