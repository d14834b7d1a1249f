"""benchmarks/verify_all.py's scheduling (the Verifier itself needs a GPU; the script is run there):
builds and verifications side by side, and a program that ran out of device memory beside other
Verifiers verified again alone, not recorded as the problem's failure."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from tests.bench_script import load


va = load("verify_all")
OOM = "crash: crash (oom): RunnerError: create: out of memory: cudaErrorMemoryAllocation"


class FakeGpu:
    """Two 'big' problems verified at once run out of memory; either alone passes (a barrier of two:
    both there, crowded; one waits out its timeout alone)."""

    def __init__(self):
        self.both = threading.Barrier(2, timeout=0.5)
        self.alone_seen: list[str] = []
        self.ooms = 0

    def verify(self, rec: dict) -> dict:
        out = dict(rec, stage="verified", verdict="passed")
        if rec["name"] == "wrong":
            out.update(verdict="wrong_answer", cause="wrong_answer: output 0 beyond tolerance")
        elif rec["name"].startswith("big"):
            try:
                self.both.wait()
            except threading.BrokenBarrierError:
                self.alone_seen.append(rec["problem"])
            else:
                self.ooms += 1
                out.update(verdict="crash", cause=OOM)
        return out


def _rows(names):
    return [{"level": 1, "problem_id": i, "name": n} for i, n in enumerate(names, 1)]


def _run(names, verifiers, in_budget=None, gpu=None):
    gpu = gpu or FakeGpu()
    in_budget = in_budget or (lambda: True)
    recorded: list[dict] = []
    with ThreadPoolExecutor(2) as builders, ThreadPoolExecutor(verifiers) as vs:
        va.schedule(_rows(names),
                    lambda row: builders.submit(lambda: {"problem": f"1:{row['problem_id']}", "name": row["name"],
                                                         "stage": "built" if row["name"] != "nvcc" else "build",
                                                         "cause": "nvcc: error" if row["name"] == "nvcc" else ""}),
                    lambda rec: vs.submit(gpu.verify, rec), recorded.append,
                    workers=2, verifiers=verifiers, in_budget=in_budget)
    return {r["problem"]: r for r in recorded}, gpu


def test_out_of_memory_beside_others_is_verified_again_alone():
    got, gpu = _run(["big1", "small", "big2", "small", "wrong", "nvcc"], verifiers=3)
    assert set(got) == {f"1:{i}" for i in range(1, 7)}
    assert got["1:1"]["verdict"] == got["1:3"]["verdict"] == "passed"
    assert gpu.ooms == 2 and sorted(gpu.alone_seen) == ["1:1", "1:3"]
    assert got["1:5"]["verdict"] == "wrong_answer"  # a real failure is recorded as it came
    assert got["1:6"]["stage"] == "build" and "verdict" not in got["1:6"]


def test_out_of_memory_alone_is_the_problems_own():
    """With one Verifier there is nobody else to blame: the failure is recorded."""
    gpu = FakeGpu()
    recorded: list[dict] = []
    with ThreadPoolExecutor(1) as builders, ThreadPoolExecutor(1) as vs:
        def verify(rec):
            return vs.submit(lambda: dict(rec, stage="verified", verdict="crash", cause=OOM))
        va.schedule(_rows(["big"]), lambda row: builders.submit(lambda: {"problem": "1:1", "name": "big",
                                                                         "stage": "built"}),
                    verify, recorded.append, workers=1, verifiers=1, in_budget=lambda: True)
    assert [r["verdict"] for r in recorded] == ["crash"]
    assert not gpu.alone_seen


def test_a_turn_alone_past_the_budget_is_not_recorded(capsys):
    gpu = FakeGpu()
    got, _ = _run(["big1", "big2"], verifiers=2, in_budget=lambda: gpu.ooms == 0, gpu=gpu)
    assert gpu.ooms == 2 and not got  # neither recorded: a rerun tries them
    line = [ln for ln in capsys.readouterr().out.splitlines() if "out of budget before their turn alone" in ln]
    assert len(line) == 1 and sorted(line[0].split(": ")[-1].split()) == ["1:1", "1:2"], line


def test_out_of_memory_causes():
    assert va.out_of_memory({"cause": OOM})
    assert va.out_of_memory({"cause": "VerifyEnvironmentError: the Verifier failed (RuntimeError: cudaMalloc failed: "
                                      "cudaErrorMemoryAllocation)"})
    assert va.out_of_memory({"cause": "inconclusive: the Verifier ran out of device memory"})
    assert not va.out_of_memory({"cause": "wrong_answer: output 0 beyond tolerance"})
    assert not va.out_of_memory({})


def test_the_summary_adds_up_the_correctness_phases_parts():
    rows = _rows(["a", "b"])
    done = {"1:1": {"level": 1, "verdict": "passed", "phases": {"correctness": 9.0, "correctness: program calls": 2.0,
                                                              "correctness: reference in float64": 5.0}},
            "1:2": {"level": 1, "verdict": "passed", "phases": {"correctness": 4.0,
                                                              "correctness: reference in float64": 3.0}}}
    text = va.summary(rows, done)
    assert "level 1: 2/2 correct" in text
    assert "the correctness phases' time: reference in float64 8 s, program calls 2 s" in text, text
