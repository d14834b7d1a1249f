"""``stitchcuda bench``: the suite runner and its report.

* the report's metrics (correctness rate, fast_p, geometric means per baseline) and files from
  hand-made result lines;
* the runner with fake build / verify / optimize functions injected into real worker processes:
  two workers share the problems, results are appended as they finish, a rerun skips what is
  done, a worker that dies costs only its problem, and the report comes out;
* the real ``--build`` path on this machine as far as it goes without a GPU (the program is built;
  verification says why it cannot run here); on a GPU the same test expects a verdict.

Fakes live in this module and are named to the workers as ``tests.test_bench:NAME``.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from stitchcuda import cli
from stitchcuda import manifest as mf
from stitchcuda.ship import bench, errors, report, workers
from stitchcuda.ship.suite import BenchOptions, BuildSolver, OptimizeSolver, SuiteError, SuiteProblem, load_suite

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------- the report from hand-made results


def _r(id, status="passed", program=1.0, **ms):
    rec = {"id": id, "status": status, "seconds": 3.0, "summary": status}
    if program is not None:
        rec["ms"] = {"program": program, **ms}
    return rec


HAND_MADE = [
    _r("a", eager_fp32=4.0, eager_policy=2.0, compile_policy=1.0),   # 4x, 2x, 1x
    _r("b", eager_fp32=1.5, eager_policy=1.2, compile_policy=0.5),   # 1.5x, 1.2x, 0.5x
    _r("c", status="wrong_answer", eager_fp32=10.0, eager_policy=10.0, compile_policy=10.0),  # fast but wrong
    _r("d", status="unsupported", program=None),
]


def test_metrics_from_hand_made_results():
    m = report.metrics(HAND_MADE, "tf32")
    assert (m.total, m.correct, m.correctness) == (4, 2, 0.5)
    assert m.by_status == {"passed": 2, "wrong_answer": 1, "unsupported": 1}
    by = {b.key: b for b in m.baselines}
    assert set(by) == {"eager_fp32", "eager_policy", "compile_policy"}  # compile fp32 was never timed
    assert by["eager_fp32"].geomean == pytest.approx((4.0 * 1.5) ** 0.5)
    assert by["compile_policy"].geomean == pytest.approx((1.0 * 0.5) ** 0.5)
    # fast_p counts correct programs faster than p over ALL problems; the wrong 10x one never counts
    assert by["eager_fp32"].fast[1.0] == 0.5 and by["eager_fp32"].fast[2.0] == 0.25
    assert by["compile_policy"].fast[0.8] == 0.25 and by["compile_policy"].fast[1.0] == 0.0
    assert by["eager_policy"].label == "eager at tf32"


def test_report_files_from_hand_made_results(tmp_path):
    files = report.write_reports(HAND_MADE, tmp_path, {"suite": "hand", "precision": "tf32"}, "tf32")
    md = files.markdown.read_text()
    assert "| eager fp32 | 2.45x | 2 | 50% | 50% | 50% | 50% | 25% | 25% |" in md
    assert "| c | wrong_answer |" in md and "| d | unsupported |" in md
    page = files.html.read_text()
    assert "<h2>Problems</h2>" in page and "class=\"fail\">wrong_answer" in page
    if report._matplotlib() is None:
        assert files.notes and "matplotlib is not installed" in files.notes[0]
    else:
        assert [p.name for p in files.plots] == ["speedups.png", "fast_p.png"]  # no FLOPs: no roofline
        assert all(p.read_bytes()[:4] == b"\x89PNG" for p in files.plots)
        assert page.count("data:image/png;base64,") == 2 and "![speedups](speedups.png)" in md


def test_the_report_gives_each_level_its_own_geometric_mean(tmp_path):
    """A suite over several KernelBench levels: a row per level, each baseline's geometric mean over
    that level's correct, timed problems (the wrong one counted as a problem, not in the mean); a
    suite of one level has no such table."""
    rows = [dict(_r("L1_a", eager_fp32=4.0, compile_policy=2.0), level=1),
            dict(_r("L1_b", eager_fp32=1.0, compile_policy=0.5), level=1),
            dict(_r("L2_a", eager_fp32=3.0, compile_policy=1.5), level=2),
            dict(_r("L2_b", status="wrong_answer", eager_fp32=9.0, compile_policy=9.0), level=2)]
    md = report.write_reports(rows, tmp_path, {"suite": "levels"}, "tf32").markdown.read_text()
    table = md.split("### Per level")[1]
    assert "| 1 | 2 | 2 | 2.00x (2) |  | 1.00x (2) |" in table  # (eager at tf32 never timed: blank)
    assert "| 2 | 2 | 1 | 3.00x (1) |  | 1.50x (1) |" in table
    one = report.write_reports(rows[:2], tmp_path / "one", {"suite": "one"}, "tf32").markdown.read_text()
    assert "### Per level" not in one


def test_a_result_says_where_its_time_went_and_the_report_sums_it(tmp_path):
    """solve() times the stages its solver reports (counts in brackets dropped, time before the
    first is setup); the report sums each over the problems, the longest first."""
    import time as _time

    from stitchcuda.ship import suite

    def solver(problem, folder, opts):
        _time.sleep(0.1)
        suite.report_stage("build: compile")
        _time.sleep(0.3)
        suite.report_stage("verify: correctness trials and dynamic checks (3 trial(s))")
        _time.sleep(0.2)
        suite.report_stage("build: compile")  # a stage met again adds up
        _time.sleep(0.1)
        return {"status": "passed", "ms": {"program": 1.0}}

    seen = []
    suite._stage_out = seen.append
    try:
        rec = suite.solve(SuiteProblem("p", "p", "", None, None), tmp_path / "p", BenchOptions(), solver)
    finally:
        suite._stage_out = lambda text: None
    st = rec["stages"]
    assert set(st) == {"setup", "build: compile", "verify: correctness trials and dynamic checks"}, st
    assert st["build: compile"] == pytest.approx(0.4, abs=0.08) and st["setup"] == pytest.approx(0.1, abs=0.08)
    assert sum(st.values()) == pytest.approx(rec["seconds"], abs=0.2)
    assert seen == ["build: compile", "verify: correctness trials and dynamic checks (3 trial(s))", "build: compile"]
    rows = [dict(_r("a"), stages={"build: compile": 30.0, "verify: timing": 10.0}),
            dict(_r("b"), stages={"build: compile": 50.0}), _r("c")]
    md = report.write_reports(rows, tmp_path / "rep", {"suite": "s"}, "tf32").markdown.read_text()
    part = md.split("## Where the time went")[1]
    assert "| build: compile | 80 | 89% | 2 |" in part and "| verify: timing | 10 | 11% | 1 |" in part
    assert part.index("build: compile") < part.index("verify: timing")


def test_each_problem_stands_beside_its_roofline_floor(tmp_path):
    """A result records the fewest bytes its program moves (inputs and weights read once, outputs
    written once, from the manifest); the report puts each problem's floor beside its time (FLOPs at
    the policy's rate or those bytes at the copy bandwidth, the larger), the time over it, and their
    geometric mean in the summary. A result without ceilings or bytes gets no floor, not a guess."""
    from stitchcuda.ir import TensorSpec
    from stitchcuda.ship.suite import record_from_report

    m = mf.Manifest("p", "fp32", "sm_90", "0" * 64, mf.ReferenceSource(path="reference.py"),
                    (TensorSpec("x", (1024, 1024), "float32"),), (TensorSpec("y", (1024, 512), "float32"),),
                    weights=(TensorSpec("w", (512, 1024), "float32"),),
                    reference_ops=(mf.ReferenceOp("mm", "aten.mm.default", 10**7, 10**8),))
    assert m.io_bytes() == 4 * (1024 * 1024 + 512 * 1024 + 1024 * 512)
    rec = dict(record_from_report(SimpleNamespace(id="p"), _fake_report("p", "fp32", True, 0.004), m), id="p")
    assert rec["io_bytes"] == m.io_bytes() and rec["bytes"] == 10**8  # (the cost model's, kept apart)
    floor = report.floor_ms(rec)  # 8 MiB at 4.3 TB/s take longer than 10 MFLOP at 67 TFLOP/s
    assert floor == pytest.approx(m.io_bytes() / 4.3e12 * 1e3)
    assert report.floor_ms(dict(rec, flops=10**9)) == pytest.approx(1e9 / 67e12 * 1e3)  # (compute-bound)
    assert report.over_floor(rec) == pytest.approx(0.004 / floor)
    bare = _r("q", eager_fp32=2.0)  # no ceilings, no bytes
    assert report.floor_ms(bare) is None and report.over_floor(bare) is None
    md = report.write_reports([rec, bare], tmp_path, {"suite": "s"}, "fp32").markdown.read_text()
    assert "| problem | status | program ms | floor ms | x floor |" in md
    assert f"| p | passed | 0.004 | {floor:.4g} | {0.004 / floor:.2f} |" in md
    assert "| q | passed | 1 |  |  |" in md
    assert f"| time over the roofline floor (geomean) | {0.004 / floor:.2f}x (1) |" in md


def test_roofline_and_no_matplotlib(tmp_path, monkeypatch):
    rows = [dict(_r("g", eager_fp32=2.0), flops=2e9, bytes=1e7,
                 ceilings={"name": "H200", "bandwidth": 4.3e12, "peak": 67e12})]
    if report._matplotlib() is not None:
        files = report.write_reports(rows, tmp_path / "with", {"suite": "s"})
        assert (tmp_path / "with" / "roofline.png").is_file() and len(files.plots) == 3
    monkeypatch.setattr(report, "_matplotlib", lambda: None)
    files = report.write_reports(rows, tmp_path / "without", {"suite": "s"})
    assert not files.plots and "pip install 'stitchcuda[bench]'" in files.notes[0]
    assert "pip install 'stitchcuda[bench]'" in files.markdown.read_text()


# ---------------------------------------------------------------------- fakes for the workers


def _fake_report(name: str, precision: str, ok: bool, program_ms: float):
    from stitchcuda.device import H200
    from stitchcuda.verifier import Passed, Timing, TimingTable, VerificationReport, VerificationResult, WrongAnswer

    from stitchcuda.verifier.report.records import GpuDetails

    verdict = Passed(5, 1e-6, 1e-4) if ok else WrongAnswer(0, 1.0, 0.5, tolerance=1e-4)
    table = TimingTable(Timing(program_ms), eager_fp32=Timing(2.0), eager_policy=Timing(1.5),
                        compile_policy=Timing(1.0)) if ok else None
    said = ("trial 0: output out at tf32: the program's max |err| 0.5; PyTorch's own tf32 on the same inputs 0.4 "
            "(also over the tolerance)", f"host lock {os.environ.get('STITCHCUDA_HOST_LOCK')}",
            f"gpu lock {os.environ.get('STITCHCUDA_GPU_LOCK')}")
    return VerificationReport(name, precision, "sm_90", VerificationResult(verdict), timings=table, ceilings=H200,
                              device="fake GPU", details=GpuDetails(correctness_notes=said))


def fake_build(ref, precision, out, quiet):
    text = Path(ref).read_text()
    if "CRASH_THE_WORKER" in text:
        os._exit(3)
    if "UNSUPPORTED" in text:
        from stitchcuda.frontend import UnsupportedOpError

        raise UnsupportedOpError("x", [])
    from stitchcuda.ir import TensorSpec

    m = mf.Manifest(Path(out).name, precision, "sm_90", "0" * 64, mf.ReferenceSource(path="reference.py"),
                    (TensorSpec("x", (1024, 1024), "float32"),), (TensorSpec("y", (1024, 1024), "float32"),),
                    reference_ops=(mf.ReferenceOp("mm", "aten.mm.default", 10**9, 10**7),))
    Path(out).mkdir(parents=True, exist_ok=True)
    return SimpleNamespace(ok=True, directory=Path(out), manifest=m, build=None)


def fake_verify(directory, reference, options):
    ref = (Path(directory).parent / "reference.py").read_text()
    ms = float(ref.split("PROGRAM_MS=")[1].split()[0]) if "PROGRAM_MS=" in ref else 1.0
    return SimpleNamespace(report=_fake_report(Path(directory).parent.name, "fp32", "WRONG" not in ref, ms))


fake_build_solver = BuildSolver(build=fake_build, verify=fake_verify)


def fake_optimize(reference, precision, budget, out):
    assert budget == 30.0
    Path(out).mkdir(parents=True)
    if "WRONG" in Path(reference).read_text():
        root = SimpleNamespace(proposer="template", judgement=SimpleNamespace(summary="wrong answer: max |err| 0.03"))
        state = SimpleNamespace(finished="no candidate verified, and no proposer has another repair", candidates=[root])
        return SimpleNamespace(best=None, report=None, state=state)
    if "REPAIRED" in Path(reference).read_text():  # build's program wrong at tf32; two of three GEMMs raised
        note = ("trial 0: output out at tf32: the program's max |err| 0.03; PyTorch's own tf32 on the same inputs "
                "0.028 (also over the tolerance)")
        root = SimpleNamespace(id="c0000", proposer="template",
                               judgement=SimpleNamespace(kind="wrong_answer", summary="wrong answer: max |err| 0.03",
                                                         policy_note=note))
        best = SimpleNamespace(id="c0001", proposer="precision",
                               meta={"precision_raised": [["mm_1", ["mm_1"]], ["mm_2", ["mm_2"]]],
                                     "precision_suspects": [["mm_1", ["mm_1"]], ["mm_2", ["mm_2"]], ["mm_3", ["mm_3"]]]})
        state = SimpleNamespace(root_candidate=root, best_candidate=best)
        return SimpleNamespace(best=out, report=_fake_report("opt", precision, True, 0.5), state=state)
    return SimpleNamespace(best=out, report=_fake_report("opt", precision, True, 0.5))


fake_optimize_solver = OptimizeSolver(optimize=fake_optimize)


def fake_optimize_resuming(reference, precision, budget, out, resume=False):
    """fake_optimize that says, in its run folder, whether it was asked to go on with a run there."""
    if not resume:
        return fake_optimize(reference, precision, budget, out)
    assert (Path(out) / "run.json").is_file()
    (Path(out) / "resumed").write_text("yes")
    return SimpleNamespace(best=out, report=_fake_report("opt", precision, True, 0.5))


resuming_optimize_solver = OptimizeSolver(optimize=fake_optimize_resuming)


def _suite(tmp: Path, bodies: dict[str, str]) -> Path:
    d = tmp / "suite"
    d.mkdir()
    for name, body in bodies.items():
        (d / f"{name}.py").write_text(f"# {body}\n")
    return d


@pytest.fixture
def workers_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("STITCHCUDA_CACHE", str(tmp_path / "cache"))      # the timing history stays here
    monkeypatch.chdir(REPO)


def test_several_workers_take_the_longest_problems_first(tmp_path, monkeypatch):
    """One worker keeps the suite's order; several take the longest first: by the seconds a run
    here recorded, else whole networks before fused operators before single ones, longer first."""
    monkeypatch.setenv("STITCHCUDA_CACHE", str(tmp_path / "cache"))
    P = SuiteProblem
    ps = [P("L1_a", "a", "x" * 10, 1), P("L3_b", "b", "x" * 10, 3), P("L2_c", "c", "x" * 50, 2),
          P("L2_d", "d", "x" * 90, 2), P("L1_e", "e", "x" * 99, 1)]
    opts = BenchOptions(gpus=2)
    assert workers.schedule(ps, opts, 1) == ps
    assert [p.id for p in workers.schedule(ps, opts, 2)] == ["L3_b", "L2_d", "L2_c", "L1_e", "L1_a"]
    # a run here took: L1_a 50 s (slow for its level), L2_c 5 s, L3_b 20 s; the rest are guessed
    # by the mean of their level's known problems (L1_e: 50 s, L2_d: 5 s; a longer source breaks a tie)
    workers.remember_seconds([{"id": "L1_a", "seconds": 50.0, "status": "passed"},
                            {"id": "L2_c", "seconds": 5.0, "status": "wrong_answer"},
                            {"id": "L3_b", "seconds": 20.0, "status": "passed"},
                            {"id": "L1_e", "seconds": 900.0, "status": "timeout"}],    # a timeout says nothing
                           {p.id: p for p in ps}, opts)
    assert [p.id for p in workers.schedule(ps, opts, 2)] == ["L1_e", "L1_a", "L3_b", "L2_d", "L2_c"]
    assert workers.schedule(ps, BenchOptions(gpus=2, precision="tf32"), 2)[0].id == "L3_b"   # per precision
    # a reference that runs on the meta device is guessed by its inputs' bytes, before any level
    model = "class Model(torch.nn.Module):\n    pass\ndef get_init_inputs():\n    return []\n"
    big = "import torch\n" + model + "def get_inputs():\n    return [torch.rand(4096, 65536), 3]\n"
    small = "import torch\n" + model + "def get_inputs():\n    return [torch.rand(64, 64)]\n"
    refs = [P("L3_n", "n", small, 3), P("L1_x", "x", big, 1), P("L2_y", "y", "x", 2)]
    assert workers.input_bytes(refs[1]) == 4096 * 65536 * 4 and workers.input_bytes(refs[0]) == 64 * 64 * 4
    assert workers.input_bytes(refs[2]) is None
    assert [p.id for p in workers.schedule(refs, BenchOptions(gpus=2, precision="bf16"), 2)] == ["L1_x", "L3_n", "L2_y"]
    (tmp_path / "cache" / "bench" / "seconds.json").write_text("{not json")
    assert workers.read_history() == {}                                  # a broken history only loses the order


def test_failed_in_runs_what_an_earlier_run_did_not_pass(tmp_path, workers_env):
    """--failed-in DIR: only the problems whose last result in DIR is not a pass (what a build run
    left for --optimize); one DIR never tried is not taken; a folder without results is refused."""
    suite = _suite(tmp_path, {"p1": "PROGRAM_MS=1", "p2": "WRONG", "p3": "UNSUPPORTED", "p4": "PROGRAM_MS=2"})
    first = tmp_path / "first"
    opts = BenchOptions(gpus=1, solver="tests.test_bench:fake_build_solver", only=("p1", "p2", "p3"))
    bench.run_suite(suite, first, opts, log=lambda s: None)
    again = BenchOptions(gpus=1, solver="tests.test_bench:fake_build_solver", failed_in=str(first))
    s = bench.run_suite(suite, tmp_path / "second", again, log=lambda s: None)
    assert sorted(r["id"] for r in bench.read_results(tmp_path / "second" / "results.jsonl")) == ["p2", "p3"]
    assert (s.total, s.ran) == (2, 2)
    with pytest.raises(SuiteError, match="no results.jsonl there"):
        bench.run_suite(suite, tmp_path / "third", replace(again, failed_in=str(tmp_path / "nowhere")),
                        log=lambda s: None)
    with pytest.raises(SuiteError, match="its results are at fp32, this run is at tf32"):
        bench.run_suite(suite, tmp_path / "third", replace(again, precision="tf32"), log=lambda s: None)


def test_workers_sharing_a_gpu_take_turns_on_it(tmp_path, workers_env, monkeypatch):
    """--per-gpu 2 on one GPU: two workers, both on that GPU, both given problems, each with the
    GPU's lock file (hostlock.gpu_alone), which no worker of a one-per-GPU suite inherits."""
    monkeypatch.setenv("STITCHCUDA_GPU_LOCK", "/somewhere/else.lock")   # the caller's own: not inherited
    monkeypatch.setattr(workers, "visible_gpus", lambda: ["3"])
    suite = _suite(tmp_path, {f"p{i}": "PROGRAM_MS=1" if i % 2 else "WRONG" for i in range(1, 7)})
    lines: list[str] = []
    opts = BenchOptions(gpus=1, per_gpu=2, solver="tests.test_bench:fake_build_solver")
    bench.run_suite(suite, tmp_path / "out", opts, log=lines.append)
    res = {r["id"]: r for r in bench.read_results(tmp_path / "out" / "results.jsonl")}
    assert len(res) == 6 and {r["gpu"] for r in res.values()} == {"3"}
    assert any("6 problem(s) on 2 worker(s) (GPUs 3; 2 on each, taking turns on it)" in ln for ln in lines), lines
    wrong = [r for r in res.values() if r["status"] == "wrong_answer"]
    assert len(wrong) == 3 and {r["notes"][2] for r in wrong} == {f"gpu lock {tmp_path / 'cache' / 'gpu-3.lock'}"}
    logs = sorted((tmp_path / "out" / "logs").glob("worker-*.log"))
    assert len(logs) == 2 and all("] p" in f.read_text() for f in logs), "both workers took problems"
    with pytest.raises(SuiteError, match="--per-gpu must be at least 1"):
        bench.run_suite(suite, tmp_path / "out0", BenchOptions(gpus=1, per_gpu=0, solver=opts.solver), log=lines.append)
    with pytest.raises(SuiteError, match="Ray places the tasks"):
        bench.run_suite(suite, tmp_path / "out1", BenchOptions(per_gpu=2, ray="auto", solver=opts.solver),
                        log=lines.append)


def test_runner_two_workers_resume_and_a_dead_worker(tmp_path, workers_env):
    suite = _suite(tmp_path, {"p1": "PROGRAM_MS=0.5", "p2": "PROGRAM_MS=4", "p3": "WRONG", "p4": "UNSUPPORTED",
                              "p5": "CRASH_THE_WORKER", "p6": "PROGRAM_MS=1"})
    out = tmp_path / "out"
    lines = []
    opts = BenchOptions(gpus=2, solver="tests.test_bench:fake_build_solver")
    s = bench.run_suite(suite, out, opts, log=lines.append)
    res = {r["id"]: r for r in bench.read_results(out / "results.jsonl")}
    assert set(res) == {"p1", "p2", "p3", "p4", "p5", "p6"} and (s.total, s.ran, s.skipped) == (6, 6, 0)
    assert res["p1"]["status"] == "passed" and res["p1"]["ms"]["eager_fp32"] / res["p1"]["ms"]["program"] == 4.0
    assert res["p1"]["flops"] == 10**9 and res["p1"]["ceilings"]["name"].startswith("H200")
    assert res["p3"]["status"] == "wrong_answer" and res["p4"]["status"] == "unsupported"
    # a failure keeps the Verifier's notes (PyTorch's own error at the policy); a pass keeps none
    assert "PyTorch's own tf32" in res["p3"]["notes"][0] and "notes" not in res["p1"]
    # the workers take turns with every suite on this host: one lock file in the cache (hostlock.py)
    assert res["p3"]["notes"][1] == f"host lock {tmp_path / 'cache' / 'host.lock'}"
    assert res["p3"]["notes"][2] == "gpu lock None", "a worker alone on its GPU takes no turns on it"
    assert res["p5"]["status"] == "error" and "worker process died" in res["p5"]["summary"]
    assert {r["gpu"] for r in res.values() if r["id"] != "p5"} <= {"0", "1"}
    assert len({r["gpu"] for r in res.values()}) == 2, "both workers took problems"
    assert s.correct == 3 and s.geomeans["eager fp32"] == pytest.approx((4.0 * 0.5 * 2.0) ** (1 / 3))
    # each pass beside its floor (1 GFLOP at the H200's fp32 rate: longer than its 8 MiB at 4.3 TB/s)
    assert res["p1"]["io_bytes"] == 8 << 20 and report.floor_ms(res["p1"]) == pytest.approx(1e9 / 67e12 * 1e3)
    assert s.over_floor == pytest.approx((0.5 * 4.0 * 1.0) ** (1 / 3) / (1e9 / 67e12 * 1e3))
    assert ["time over the roofline floor (geomean)", f"{s.over_floor:.2f}x"] in s.rows()
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    why = (out / "report.md").read_text().split("## Why problems did not pass")[1]
    assert "- **p3** (wrong_answer): wrong answer" in why and "  - trial 0: output out at tf32" in why
    assert "**p1**" not in why
    assert any(ln.startswith("[6/6]") for ln in lines)
    # a rerun skips everything; dropping a line reruns exactly that problem
    s2 = bench.run_suite(suite, out, opts, log=lines.append)
    assert (s2.ran, s2.skipped) == (0, 6)
    kept = [ln for ln in (out / "results.jsonl").read_text().splitlines() if '"id": "p2"' not in ln]
    (out / "results.jsonl").write_text("\n".join(kept) + "\n")
    s3 = bench.run_suite(suite, out, opts, log=lines.append)
    assert (s3.ran, s3.skipped) == (1, 5)
    assert len(bench.read_results(out / "results.jsonl")) == 6
    # other settings never mix into these results
    with pytest.raises(SuiteError, match="other settings"):
        bench.run_suite(suite, out, BenchOptions(precision="tf32", solver=opts.solver))


def test_optimize_mode_through_the_cli(tmp_path, workers_env, capfd):
    suite = _suite(tmp_path, {"q1": "fine", "q2": "WRONG", "q3": "REPAIRED"})
    out = tmp_path / "out"
    rc = cli.main(["bench", str(suite), "--optimize", "--budget", "30", "--gpus", "1", "--out", str(out), "--json",
                   "--solver", "tests.test_bench:fake_optimize_solver"])
    data = json.loads(capfd.readouterr().out)
    assert rc == 0 and data["total"] == 3 and data["correct"] == 2
    res = {r["id"]: r for r in bench.read_results(out / "results.jsonl")}
    assert res["q1"]["status"] == "passed" and res["q1"]["mode"] == "optimize"
    # a run that verified nothing says why: the loop's last word and what its candidates were judged
    assert res["q2"]["status"] == "failed" and res["q2"]["summary"] == (
        "no candidate verified: no candidate verified, and no proposer has another repair; "
        "1 candidate(s) (template: wrong answer: max |err| 0.03)")
    # a repair says what build's program got wrong, what was raised, and whether PyTorch itself meets the
    # tolerance at the policy (here not: a baseline allowed tf32 is timed on an answer that would fail)
    assert "repaired" not in res["q1"] and res["q3"]["repaired"]["raised"] == ["mm_1", "mm_2"]
    rep = (out / "report.md").read_text().split("## Repaired by the loop")[1]
    assert "- **q3**: 2 of 3 rounding tasks raised to fp32; `build` gave: wrong answer: max |err| 0.03" in rep
    assert "PyTorch's own tf32 on the same inputs 0.028 (also over the tolerance)" in rep and "**q1**" not in rep
    page = (out / "report.html").read_text()
    assert "<h2>Repaired by the loop</h2>" in page and "<h2>Why problems did not pass</h2>" in page


def test_an_interrupted_optimize_problem_goes_on_with_its_run(tmp_path, workers_env):
    """A suite stopped inside a problem's loop left that problem's run folder and no result line: the
    rerun goes on with the run (its candidates and spent budget), where it had refused the folder."""
    suite = _suite(tmp_path, {"q1": "fine", "q2": "fine"})
    out = tmp_path / "out"
    left = out / "problems" / "q2" / "run"
    left.mkdir(parents=True)
    (left / "run.json").write_text('{"run_id": "q2-fp32-1"}\n')    # what the loop writes first
    opts = BenchOptions(mode="optimize", budget=30, gpus=1, solver="tests.test_bench:resuming_optimize_solver")
    summary = bench.run_suite(suite, out, opts, log=lambda s: None)
    res = {r["id"]: r for r in bench.read_results(out / "results.jsonl")}
    assert summary.total == 2 and res["q1"]["status"] == res["q2"]["status"] == "passed"
    assert (left / "resumed").is_file() and not (out / "problems" / "q1" / "run" / "resumed").exists()


def test_a_run_folder_without_its_record_is_set_aside_not_refused(tmp_path, workers_env):
    """A problem's run folder with the loop's state but no run.json (copied back in part from another
    machine) cannot be resumed: the problem starts again, the old folder kept beside it, where the
    loop had refused the folder and the problem ended as an error."""
    suite = _suite(tmp_path, {"q1": "fine"})
    out = tmp_path / "out"
    left = out / "problems" / "q1" / "run"
    left.mkdir(parents=True)
    (left / "state.json").write_text("{}\n")
    opts = BenchOptions(mode="optimize", budget=30, gpus=1, solver="tests.test_bench:resuming_optimize_solver")
    bench.run_suite(suite, out, opts, log=lambda s: None)
    res = {r["id"]: r for r in bench.read_results(out / "results.jsonl")}
    aside = out / "problems" / "q1" / "run.incomplete-1"
    assert res["q1"]["status"] == "passed" and not (left / "resumed").exists()
    assert (aside / "state.json").read_text() == "{}\n"


def test_bad_suites_are_one_line(tmp_path, capfd):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"level": 1}\n')
    for suite, expect in ((tmp_path / "none.jsonl", "no such suite"), (bad, "bad.jsonl:1: not a problem line")):
        capfd.readouterr()
        rc = cli.main(["bench", str(suite), "-q", "--out", str(tmp_path / "o")])
        err = capfd.readouterr().err
        assert rc == errors.BAD_INPUT and expect in err and len(err.strip().splitlines()) == 1, err


def test_dev_set_loads(dev_set_path):
    name, problems = load_suite(dev_set_path)
    assert name == "dev" and len(problems) == 18 and problems[0].id == "L1_1_Square_matrix_multiplication"


# ---------------------------------------------------------------------- the real --build path


def test_real_build_path(tmp_path, nvcc, monkeypatch, workers_env):
    """models/mlp.py through the real solver: built everywhere; verified where there is a GPU."""
    import stitchcuda

    suite = tmp_path / "models"
    suite.mkdir()
    shutil.copy(REPO / "models" / "mlp.py", suite / "mlp.py")
    monkeypatch.setenv("STITCHCUDA_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    s = bench.run_suite(suite, out, BenchOptions(gpus=1, trials=2), log=lambda s: None)
    (r,) = bench.read_results(out / "results.jsonl")
    assert (out / "problems" / "mlp" / "program" / mf.LIBRARY_FILE).is_file(), r
    if stitchcuda.has_gpu():
        assert r["status"] == "passed" and r["ms"]["program"] > 0, r
    else:
        assert r["status"] == "not_verified" and "not verified" in r["summary"], r
    assert s.total == 1 and (out / "report.html").is_file()


def test_ray_local_instance(tmp_path, workers_env):
    """The same fake solver as Ray tasks on a local Ray instance (skipped without Ray)."""
    pytest.importorskip("ray")
    suite = _suite(tmp_path, {"r1": "PROGRAM_MS=0.5", "r2": "WRONG"})
    s = bench.run_suite(suite, tmp_path / "out", BenchOptions(ray="local", solver="tests.test_bench:fake_build_solver"),
                        log=lambda s: None)
    res = {r["id"]: r["status"] for r in bench.read_results(tmp_path / "out" / "results.jsonl")}
    assert res == {"r1": "passed", "r2": "wrong_answer"} and s.correct == 1


def test_the_max_autotune_baseline_shows_only_where_it_was_timed():
    """``--baselines max-autotune``: a fifth row of the summary where some result has it, none where none does."""
    from stitchcuda.ship.report import metrics

    base = {"status": "passed", "verdict": "passed"}
    plain = [{**base, "ms": {"program": 1.0, "eager_fp32": 4.0, "eager_policy": 2.0, "compile_policy": 1.5}}]
    assert "compile_autotune" not in {s.key for s in metrics(plain, "tf32").baselines}
    tuned = [{**base, "ms": {**plain[0]["ms"], "compile_autotune": 1.2}}]
    row = {s.key: s for s in metrics(tuned, "tf32").baselines}["compile_autotune"]
    assert row.label == "torch.compile max-autotune at tf32" and abs(row.geomean - 1.2) < 1e-9


def test_an_optimize_suite_passes_its_sanitizer_choice_to_the_loop(tmp_path, monkeypatch):
    """--optimize --no-sanitizer: the loop's Verifier leaves compute-sanitizer out of the final
    verification too (the search never runs it); without the option, the final runs it."""
    import stitchcuda.workflow as wf

    seen = {}

    def fake(reference, precision, budget, out, progress, judge):
        seen[judge.o.sanitizer] = judge.precision
        return SimpleNamespace(best=None, report=None, state=SimpleNamespace(finished="x", candidates=[]))

    monkeypatch.setattr(wf, "optimize", fake)
    problem = SuiteProblem("p", "p", "import torch\n", None)
    for sanitizer in (False, True):
        OptimizeSolver()(problem, tmp_path / f"p{sanitizer}", BenchOptions(mode="optimize", precision="tf32",
                                                                           sanitizer=sanitizer))
    assert seen == {False: "tf32", True: "tf32"}
