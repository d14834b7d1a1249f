"""Verdicts, the nvcc diagnostic parser, rubric, feedback and the written report (no GPU)."""

from __future__ import annotations

import json
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from stitchcuda import manifest as mf
from stitchcuda.verifier import (H100_SXM, CompileError, Crash, DynamicCheck, KernelRecord, OutputCheck, Passed,
                                 Rejected, Timeout, Timing, TimingTable, TrialResult, VerificationReport,
                                 WrongAnswer, build_result, build_rubric, check_program, classify_crash,
                                 detect_techniques, load_report, make_feedback, parse_nvcc_output,
                                 score_anti_hacking, score_cuda_engineering, score_operator_coverage,
                                 score_skill_compliance, summarise, write_report)
from stitchcuda.verifier import serde
from stitchcuda.verifier.report.feedback import NextStep
from stitchcuda.verifier.report.timeline import render_timeline_png
from stitchcuda.verifier.static import Finding

REPO = Path(__file__).resolve().parents[1]
ADVERSARIAL = Path(__file__).resolve().parent / "adversarial"
CHECKS_PASS = tuple(DynamicCheck(n, "pass") for n in
                    ("outputs_follow_inputs", "no_output_reuse", "inputs_unchanged", "outputs_written", "repeat_calls",
                     "sensitivity", "varied_inputs"))

# ------------------------------------------------------------------ nvcc diagnostics on real output

BROKEN = """\
#include <cuda_runtime.h>

__global__ void k(float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = undefined_thing(i);
}

int f() {
  return missing_var + 1
}
"""


def _nvcc(nvcc: str, tmp_path: Path, name: str, source: str, *extra: str) -> str:
    src = tmp_path / name
    src.write_text(source)
    p = subprocess.run([nvcc, "-arch=sm_90", "-c", str(src), "-o", str(tmp_path / "out.o"), *extra],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    return p.stdout + p.stderr


@pytest.fixture(scope="module")
def nvcc_outputs(nvcc, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nvcc")
    return {
        "frontend": _nvcc(nvcc, tmp, "program.cu", BROKEN),
        "host": _nvcc(nvcc, tmp, "torchy.cu", "#include <torch/extension.h>\nint main() {}\n"),
        "instantiation": _nvcc(nvcc, tmp, "tmpl.cu", "template <class T> __global__ void t(T* y) {\n"
                                                     "  T v = y[0].field; y[0] = v;\n}\n"
                                                     "void launch(float* p) { t<<<1, 1>>>(p); }\n"),
        "ptxas": _nvcc(nvcc, tmp, "smem.cu", "__global__ void k(float* y) { __shared__ float big[100000];\n"
                                             "big[threadIdx.x] = 1; __syncthreads(); y[0] = big[threadIdx.x + 1]; }\n"),
    }


def test_parse_front_end_errors(nvcc_outputs):
    diags = parse_nvcc_output(nvcc_outputs["frontend"])
    errors = [d for d in diags if d.severity == "error"]
    assert [(d.file, d.line) for d in errors][:1] == [("program.cu", 5)]
    assert 'identifier "undefined_thing" is undefined' in errors[0].message
    assert "undefined_thing(i)" in errors[0].source_line
    assert any(d.line == 9 and "missing_var" in d.message for d in errors)
    assert errors[-1].line == 10 and errors[-1].message == 'expected a ";"'
    assert all(d.tool == "nvcc" for d in errors)
    (inst,) = [d for d in parse_nvcc_output(nvcc_outputs["instantiation"]) if d.severity == "error"]
    assert (inst.file, inst.line) == ("tmpl.cu", 2)
    assert any("detected during instantiation" in x and "at line 4" in x for x in inst.details)


def test_parse_host_compiler_and_ptxas_errors(nvcc_outputs):
    (d,) = [d for d in parse_nvcc_output(nvcc_outputs["host"]) if d.severity == "error"]
    assert (d.file, d.line, d.tool) == ("torchy.cu", 1, "host")
    assert "torch/extension.h" in d.message and "#include" in d.source_line
    (p,) = parse_nvcc_output(nvcc_outputs["ptxas"])
    assert (p.tool, p.severity, p.file) == ("ptxas", "error", "")
    assert "too much shared data" in p.message
    assert p.format().startswith("ptxas: error: ")


def test_compile_error_for_prompt_is_trimmed(nvcc_outputs):
    ce = CompileError.from_output(nvcc_outputs["frontend"])
    full = ce.for_prompt(4000)
    assert full.startswith("program.cu:5: error: identifier \"undefined_thing\" is undefined")
    for budget in (60, 150, 300):
        text = ce.for_prompt(budget)
        assert len(text) <= budget
        assert text.startswith("program.cu:5:")
    short = ce.for_prompt(150)
    assert "more)" in short or short.endswith("…")
    assert ce.summary().startswith("compile error: program.cu:5:")


def test_parse_canned_tool_lines():
    text = ("nvcc fatal   : Unsupported gpu architecture 'compute_99'\n"
            "nvlink error   : Undefined reference to '_Z3fooi' in 'a.o'\n"
            "/usr/bin/ld: a.o: in function `f': undefined reference to `st_gemm'\n"
            "1 error detected in the compilation of \"x.cu\".\n")
    diags = parse_nvcc_output(text)
    assert [(d.tool, d.severity) for d in diags] == [("nvcc", "error"), ("nvlink", "error"), ("ld", "error")]
    assert CompileError.from_output("garbage only\n").for_prompt(200).startswith("compiler failed")


def test_warnings_only_when_no_error():
    text = ('a.cu(3): warning #177-D: variable "u" was declared but never referenced\n  int u;\n      ^\n\n'
            'a.cu(9): error: expected a ";"\n  }\n  ^\n\n')
    ce = CompileError.from_output(text)
    assert ce.for_prompt(500).startswith("a.cu:9: error")
    assert "warning" not in ce.for_prompt(500)


# ------------------------------------------------------------------ crashes and verdict precedence


@pytest.mark.parametrize("rc,out,kind", [
    (1, "CUDA error: an illegal memory access was encountered (st_gemm)", "illegal_address"),
    (-11, "", "segfault"),
    (139, "Segmentation fault (core dumped)", "segfault"),
    (-6, "terminate called after throwing an instance of 'std::bad_alloc'", "abort"),
    (1, "cudaErrorMemoryAllocation: out of memory", "oom"),
    (3, "something else", "other"),
])
def test_classify_crash(rc, out, kind):
    c = classify_crash(rc, out, trial=2)
    assert c.kind == kind and c.trial == 2
    assert len(c.message) <= 600


def _trial(i: int, err: float = 1e-6, tol: float = 1e-4, nan: int = 0) -> TrialResult:
    return TrialResult(i, (OutputCheck("y", err, err / 3, tol, (3, 7), 0.5, 0.5 + err, nan, err <= tol and not nan),))


def test_build_result_precedence():
    reject = Finding("own-stream", "reject", "program.cu", 12, "creates its own stream", "cudaStreamCreate(&s);")
    warn = Finding("alloc-in-run", "warn", "program.cu", 20, "cudaMalloc on every call")
    ce = CompileError.from_output("a.cu(1): error: oops\n")
    trials = [_trial(0), _trial(1, err=0.5), _trial(2, err=0.7)]
    assert isinstance(build_result(findings=[reject], compile_error=ce).verdict, Rejected)
    assert isinstance(build_result(findings=[warn], compile_error=ce, crash=Crash("oom")).verdict, CompileError)
    assert isinstance(build_result(crash=Crash("oom"), timeout=Timeout(30)).verdict, Crash)
    assert isinstance(build_result(timeout=Timeout(30), trials=trials).verdict, Timeout)
    failed = DynamicCheck("inputs_unchanged", "fail", "x changed at [0, 0]")
    v = build_result(trials=trials, checks=[failed]).verdict
    assert isinstance(v, Rejected) and "inputs_unchanged" in v.reasons[0] and v.checks == (failed,)
    wa = build_result(trials=trials).verdict
    assert isinstance(wa, WrongAnswer)
    assert (wa.trial, wa.output, wa.where, wa.failed_trials, wa.n_trials) == (1, "y", (3, 7), 2, 3)
    assert wa.max_abs_err == 0.5
    ok = build_result(findings=[warn], trials=[_trial(0), _trial(1)], checks=CHECKS_PASS)
    assert ok.ok and isinstance(ok.verdict, Passed) and ok.verdict.trials == 2
    assert ok.verdict.warnings and "alloc-in-run" in ok.verdict.warnings[0]
    with pytest.raises(ValueError):
        build_result()


def test_nan_output_is_wrong_answer():
    v = build_result(trials=[_trial(0, err=float("nan"), nan=12)]).verdict
    assert isinstance(v, WrongAnswer) and v.nan_count == 12
    assert "12 NaN" in v.summary()


# ------------------------------------------------------------------ rubric


def test_anti_hacking_scores():
    assert score_anti_hacking().score == 0.5  # clean static pass, no dynamic evidence yet
    assert "not run" in " ".join(score_anti_hacking().reasons)
    assert score_anti_hacking(checks=CHECKS_PASS).score == 1.0
    warn = Finding("alloc-in-run", "warn", "p.cu", 3, "m")
    assert score_anti_hacking([warn], CHECKS_PASS).score == pytest.approx(0.9)
    rej = Finding("own-stream", "reject", "p.cu", 3, "m")
    s = score_anti_hacking([rej], CHECKS_PASS)
    assert s.score == 0.0 and "own-stream" in s.reasons[0]
    fail = score_anti_hacking(checks=[DynamicCheck("no_output_reuse", "fail", "same output twice")])
    assert fail.score == 0.0 and "no_output_reuse" in fail.reasons[0]
    assert {c.name for c in fail.checks} >= {"outputs_follow_inputs", "inputs_unchanged"}


def test_technique_detection_ignores_comments():
    src = ("// we could use __shared__ tiles, float4 and cudaStreamBeginCapture here\n"
           "__global__ void k(float* y) { y[0] = 1; }\n")
    assert detect_techniques(src) == {}
    src2 = ("__global__ void k(const float4* x) { __shared__ float t[32]; }\n"
            "void r() { g.policy = ST_POLICY_TF32; g.epilogue = ST_EPI_BIAS_GELU; cudaGraphLaunch(e, s); }\n")
    found = detect_techniques(src2)
    assert set(found) == {"vectorised_access", "shared_memory_tiling", "tensor_cores", "cublaslt_epilogue",
                          "cuda_graph"}
    assert found["shared_memory_tiling"][0].startswith("program.cu:1:")


def test_cuda_engineering_applicability():
    m = mf.Manifest.load(ADVERSARIAL / "correct")
    src = (ADVERSARIAL / "correct" / "program.cu").read_text()
    ce = score_cuda_engineering(src, m)
    assert ce.score == 1.0
    by = {t.id: t for t in ce.techniques}
    assert by["cublaslt_epilogue"].detected and by["vectorised_access"].detected
    assert not by["tensor_cores"].applicable  # fp32 policy
    tf32 = mf.Manifest.from_dict({**m.to_dict(), "precision": "tf32"})
    ce2 = score_cuda_engineering(src, tf32)
    assert ce2.score == pytest.approx(2 / 3, abs=1e-3)
    assert "tensor cores: applies but not used" in ce2.reasons
    cupti = [KernelRecord("sm90_xmma_gemm_tf32f32_tf32f32_f32_tn_n", 0, 5000)]
    ce3 = score_cuda_engineering(src, tf32, cupti)
    assert ce3.score == 1.0 and any("cupti" in e for e in ce3.kernel_evidence)


@pytest.mark.parametrize("call", ["launch_attention_split_tf32<64>(p, stream)", "st_gemm_split_tf32(&g, stream)",
                                  "st_conv_split_tf32(&c, stream)", "st_gemm_split_bf16(&g, stream)"])
def test_split_products_under_fp32_are_tensor_cores_used(call):
    """An fp32 program whose products run split on tensor cores (three TF32 or bf16 products each) is
    credited with them, and not told in the same breath that its policy is plain fp32 math."""
    m = mf.Manifest.load(ADVERSARIAL / "correct")
    src = (ADVERSARIAL / "correct" / "program.cu").read_text() + f"\nvoid split() {{ {call}; }}\n"
    ce = score_cuda_engineering(src, m)
    by = {t.id: t for t in ce.techniques}
    assert by["tensor_cores"].detected and not by["tensor_cores"].applicable
    assert any(r.startswith("tensor cores: used (not required under fp32") for r in ce.reasons), ce.reasons
    assert not any("fp32 is fp32 math" in r for r in ce.reasons)
    plain = score_cuda_engineering((ADVERSARIAL / "correct" / "program.cu").read_text(), m)
    assert any("fp32 is fp32 math" in r for r in plain.reasons)


def test_operator_coverage_from_manifest():
    full = score_operator_coverage(mf.Manifest.load(ADVERSARIAL / "correct"))
    assert full.score == 1.0 and full.uncovered == ()
    part = score_operator_coverage(mf.Manifest.load(ADVERSARIAL / "missing_provenance"))
    assert part.uncovered == ("relu",)
    assert part.flops_share == pytest.approx(4202496 / (4202496 + 8192))
    assert part.bytes_share == pytest.approx(229888 / (229888 + 65536))
    assert any("not covered: relu" in r for r in part.reasons)


def _profile(**totals_us):
    recs, t = [], 0
    for name, us in totals_us.items():
        recs.append(KernelRecord(name, t, t + int(us * 1000), bytes=int(us * 1e6), flops=0))
        t += int(us * 1000) + 500
    return summarise(recs, H100_SXM)


def test_skill_compliance():
    first = score_skill_compliance(None)
    assert first.score is None and "first candidate" in first.reasons[0]
    fix = NextStep("fix_compile", "fix the first error at program.cu:5", target="program.cu:5")
    assert score_skill_compliance(fix, previous_verdict="compile_error", current_verdict="passed").score == 1.0
    same = score_skill_compliance(fix, previous_verdict="compile_error", current_verdict="compile_error",
                                  previous_failure="program.cu:5", current_failure="program.cu:5")
    assert same.score == 0.0 and same.acted is False
    moved = score_skill_compliance(fix, previous_verdict="compile_error", current_verdict="wrong_answer")
    assert moved.score == 0.5
    step = NextStep("vectorise", "relu reaches 30% of bandwidth", target="relu", technique="vectorised_access")
    before, after = _profile(gemm=20, relu=10), _profile(gemm=20, relu=4)
    good = score_skill_compliance(step, previous=before, current=after, current_verdict="passed",
                                  techniques_now=("vectorised_access",))
    assert good.score == 1.0 and good.acted
    assert good.moved[0].name == "relu" and good.moved[0].after_ns < good.moved[0].before_ns
    ignored = score_skill_compliance(step, previous=before, current=_profile(gemm=20, relu=10),
                                     current_verdict="passed")
    assert ignored.score == 0.0 and not ignored.acted
    fused = score_skill_compliance(NextStep("fuse", "fuse relu", target="relu"), previous=before,
                                   current=_profile(gemm=21), current_verdict="passed")
    assert fused.score == 1.0 and "gone" in " ".join(fused.reasons)
    broke = score_skill_compliance(step, previous=before, current=after, current_verdict="wrong_answer")
    assert broke.score == 0.0


# ------------------------------------------------------------------ feedback


KERNELS = (
    KernelRecord("sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3", 0, 60_000, (8, 4, 1), (256, 1, 1),
                 128, 49152, 4 * 1024 * 1024, 2 * 1024 ** 3, task="linear"),
    KernelRecord("relu_scalar", 61_000, 101_000, (4096, 1, 1), (256, 1, 1), 16, 0, 64 * 1024 * 1024, 0, task="relu"),
    KernelRecord("softmax_rows", 102_000, 122_000, (64, 1, 1), (128, 1, 1), 32, 1024, 32 * 1024 * 1024, 0),
    KernelRecord("tiny_a", 123_000, 125_000, (1, 1, 1), (32, 1, 1), 8, 0, 4096, 0),
    KernelRecord("tiny_b", 126_000, 127_500, (1, 1, 1), (32, 1, 1), 8, 0, 4096, 0),
)
TIMINGS = TimingTable(Timing(0.130, 0.004, 200), Timing(0.52, 0.01, 200), Timing(0.31, 0.01, 200),
                      Timing(0.25, 0.01, 200), Timing(0.18, 0.01, 200))


def test_feedback_when_passed_names_top_three_kernels_and_one_step():
    res = build_result(trials=[_trial(0), _trial(1)], checks=CHECKS_PASS)
    prof = summarise(KERNELS, H100_SXM, "tf32")
    fb = make_feedback(res, profile=prof, timings=TIMINGS, precision="tf32")
    lines = fb.text.splitlines()
    assert lines[0].startswith("PASSED: 2 trials")
    assert "eager fp32 4.00x" in fb.text and "torch.compile tf32 1.38x" in fb.text
    ranked = [ln for ln in lines if ln.lstrip().startswith(("1.", "2.", "3.", "4."))]
    assert len(ranked) == 3
    assert "sm90_xmma_gemm" in ranked[0] and "compute-bound" in ranked[0]
    assert "relu_scalar" in ranked[1] and "memory-bound" in ranked[1]
    assert "tiny_a" not in fb.text
    assert lines[-1].startswith("Next step: ")
    assert fb.next_step.kind == "tensor_cores" and fb.next_step.technique == "tensor_cores"
    assert fb.verdict == "passed"
    # with tensor cores in use, the low-efficiency GEMM asks for shared-memory tiling instead
    fb2 = make_feedback(res, profile=prof, precision="tf32", techniques=("tensor_cores",))
    assert fb2.next_step.kind == "tile_shared"
    # a memory-bound kernel on top, far from the bandwidth floor: vectorise
    fb3 = make_feedback(res, profile=summarise(KERNELS[1:], H100_SXM, "tf32"), precision="tf32")
    assert (fb3.next_step.kind, fb3.next_step.target) == ("vectorise", "relu_scalar")
    assert fb3.next_step.technique == "vectorised_access"


def test_feedback_is_trimmed_to_budget_and_keeps_next_step():
    findings = tuple(Finding("host-state-global", "reject", "program.cu", 10 + i, f"mutable variable 'g{i}' " * 4,
                             f"static float* g{i} = nullptr;") for i in range(8))
    res = build_result(findings=findings)
    for budget in (120, 250, 600, 2000):
        fb = make_feedback(res, profile=summarise(KERNELS, H100_SXM), timings=TIMINGS, budget=budget)
        assert len(fb.text) <= budget
        assert "Next step:" in fb.text
    fb = make_feedback(res, budget=600)
    assert fb.text.startswith("REJECTED: host-state-global at program.cu:10")
    assert "program.cu:10: [host-state-global]" in fb.text
    assert fb.next_step.kind == "fix_rejection" and fb.next_step.target == "host-state-global"
    assert "st_program" in fb.next_step.text


@pytest.mark.parametrize("result,kind,needle", [
    (build_result(compile_error=CompileError.from_output('p.cu(7): error: identifier "q" is undefined\n')),
     "fix_compile", "p.cu:7"),
    (build_result(crash=Crash("illegal_address", "an illegal memory access was encountered", 0)),
     "fix_crash", "out-of-bounds"),
    (build_result(timeout=Timeout(60.0)), "fix_timeout", "60 s"),
    (build_result(trials=[_trial(0, err=3e-4)]), "fix_correctness", "precision"),
    (build_result(trials=[_trial(0, err=float("nan"), nan=5)]), "fix_correctness", "NaN"),
    (build_result(trials=[_trial(0, err=2.0)]), "fix_correctness", "op by op"),
    (build_result(trials=[_trial(0)], checks=[DynamicCheck("inputs_unchanged", "fail")]), "fix_rejection",
     "inputs"),
])
def test_next_step_per_verdict(result, kind, needle):
    fb = make_feedback(result)
    assert fb.next_step.kind == kind
    assert needle in fb.next_step.text
    assert len(fb.text) <= 1200


def test_next_step_for_launch_bound_profile():
    recs = [KernelRecord(f"k{i}", i * 3000, i * 3000 + 2000, bytes=1024) for i in range(8)]
    res = build_result(trials=[_trial(0)])
    fb = make_feedback(res, profile=summarise(recs, H100_SXM))
    assert fb.next_step.kind == "graph_capture" and fb.next_step.technique == "cuda_graph"


# ------------------------------------------------------------------ report files


def _report(result=None, kernels=KERNELS) -> VerificationReport:
    d = ADVERSARIAL / "correct"
    m = mf.Manifest.load(d)
    src = (d / "program.cu").read_text()
    static = check_program(d)
    result = result or build_result(findings=static.findings, trials=[_trial(i) for i in range(5)],
                                    checks=CHECKS_PASS)
    rubric = build_rubric(source=src, manifest=m, findings=static.findings, checks=result.checks, kernels=kernels)
    fb = make_feedback(result, profile=summarise(kernels, H100_SXM), timings=TIMINGS)
    return VerificationReport(program=m.name, precision=m.precision, arch=m.arch, result=result, rubric=rubric,
                              timings=TIMINGS, kernels=tuple(kernels), ceilings=H100_SXM, feedback=fb.text,
                              device="NVIDIA H100 80GB HBM3", created="2026-01-02T03:04:05+00:00",
                              commit="abc1234", command="stitchcuda verify run/correct")


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_write_report_files(tmp_path):
    rep = _report()
    files = write_report(rep, tmp_path / "run")
    assert files.json.name == "report.json" and files.markdown.name == "report.md"
    assert files.timeline is not None and files.timeline.name == "timeline.png"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["report.json", "report.md", "timeline.png"]
    w, h = _png_size(files.timeline.read_bytes())
    assert w >= 400 and h >= 100

    md = files.markdown.read_text()
    for header in ("| trial | output | max abs err | mean abs err |",
                   "|  | median ms | IQR ms | n | speedup of this program |",
                   "| dimension | score (0-1) | reasons |",
                   "| technique | used | applies | evidence |",
                   "| kernel | calls | total | mean | share |",
                   "| dynamic check | status | detail |"):
        assert header in md, header
    assert "| eager fp32 | 0.52 |" in md and "| torch.compile at fp32 | 0.18 |" in md
    assert "![kernel timeline](timeline.png)" in md
    assert "Next step:" in md
    assert "relu_scalar" in md

    data = json.loads(files.json.read_text())
    assert data["schema"] == "stitchcuda-report" and data["result"]["verdict"]["verdict"] == "passed"
    assert set(data["rubric"]) == {"anti_hacking", "cuda_engineering", "operator_coverage", "skill_compliance"}
    assert load_report(tmp_path / "run") == rep


def test_report_of_a_failure_without_kernels(tmp_path):
    res = build_result(findings=check_program(ADVERSARIAL / "side_stream").findings)
    rep = _report(result=res, kernels=())
    files = write_report(rep, tmp_path)
    assert files.timeline is None
    md = files.markdown.read_text()
    assert "**rejected**" in md and "| own-stream | reject | program.cu:" in md
    assert "No trials were run." in md and "No kernel records" in md and "No timeline" in md
    assert load_report(files.json).result.verdict == res.verdict


def test_report_round_trips_every_verdict(tmp_path):
    verdicts = [
        build_result(compile_error=CompileError.from_output("a.cu(1): error: x\n  y\n  ^\n")),
        build_result(crash=Crash("segfault", "boom", 1)),
        build_result(timeout=Timeout(12.5, "build")),
        build_result(trials=[_trial(0, err=float("nan"), nan=3)]),
    ]
    for i, res in enumerate(verdicts):
        rep = _report(result=res, kernels=())
        def strict(name):
            raise AssertionError(f"non-standard JSON constant {name}")

        json.loads(rep.to_json(), parse_constant=strict)  # non-finite floats are written as strings
        files = write_report(rep, tmp_path / str(i))
        back = load_report(files.json)
        assert type(back.result.verdict) is type(res.verdict)
        assert serde.to_jsonable(back) == serde.to_jsonable(rep)


def test_a_degenerate_pass_says_so_in_the_verdict_the_report_and_the_suite(tmp_path):
    """A pass on a reference whose outputs do not depend on its inputs proves nothing: the verdict,
    report.md and a suite's report (stitchcuda bench) say "degenerate: outputs independent of inputs"."""
    from stitchcuda.ship.suite import record_from_report
    from stitchcuda.ship.report import _tables, metrics

    res = build_result(trials=[_trial(0)], degenerate="the outputs of 2 sets of inputs are within tolerance")
    assert res.ok and res.verdict.summary().startswith("passed (degenerate: outputs independent of inputs)")
    assert any("this pass proves nothing" in w for w in res.verdict.warnings)
    files = write_report(_report(result=res, kernels=()), tmp_path)
    md = files.markdown.read_text()
    assert "**passed** (degenerate: outputs independent of inputs): 1 trials" in md
    assert load_report(files.json).result.verdict.degenerate
    rec = record_from_report(type("P", (), {"id": "x"})(), load_report(files.json))
    assert rec["degenerate"] and rec["summary"].startswith("passed (degenerate")
    summary, *_ = _tables([rec], metrics([rec]))
    assert ["degenerate: outputs independent of inputs", "1"] in summary


def test_builtin_timeline_png_decodes(tmp_path):
    path, renderer = render_timeline_png(KERNELS, tmp_path / "t.png", summarise(KERNELS, H100_SXM), "t",
                                         prefer_matplotlib=False)
    assert renderer == "builtin"
    data = path.read_bytes()
    w, h = _png_size(data)
    pos, idat = 8, b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        tag = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(tag + body) & 0xFFFFFFFF
        if tag == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    assert len(raw) == h * (1 + 3 * w)
    assert raw.count(bytes((244, 160, 0))) > 0 or raw.count(bytes((66, 133, 244))) > 0  # bars were drawn


def test_matplotlib_timeline(tmp_path):
    pytest.importorskip("matplotlib")
    path, renderer = render_timeline_png(KERNELS, tmp_path / "t.png", summarise(KERNELS, H100_SXM), "t")
    assert renderer == "matplotlib"
    _png_size(path.read_bytes())


def test_timing_from_samples():
    t = Timing.from_samples([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (t.median_ms, t.n) == (3.0, 5)
    assert t.iqr_ms == pytest.approx(2.0)
    assert TIMINGS.speedup(TIMINGS.eager_fp32) == pytest.approx(4.0)
    assert TIMINGS.best_baseline()[0] == "torch.compile at policy"


def test_roofline_classification():
    prof = summarise(KERNELS, H100_SXM, "tf32")
    by = prof.by_name()
    assert by["relu_scalar"].bound == "memory"
    assert 0 < by["relu_scalar"].efficiency < 1
    assert by["sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3"].bound == "compute"
    assert by["tiny_a"].bound == "latency"
    assert prof.launches == 5 and prof.kernels[0].name.startswith("sm90_xmma")
    assert sum(k.share for k in prof.kernels) == pytest.approx(1.0)


def test_a_timed_result_carries_the_machine_ceilings_without_a_profile(monkeypatch):
    """stitchcuda bench --no-profile: a timed result still records the bandwidth and rate its floor
    is counted at (this GPU's measured ceilings), and a result with no timings records none."""
    import dataclasses as dc

    from stitchcuda.ship import suite

    rep = dc.replace(_report(), ceilings=None)
    monkeypatch.setattr(suite, "_machine", [H100_SXM])
    rec = suite.record_from_report(type("P", (), {"id": "x"})(), rep)
    assert rec["ceilings"]["bandwidth"] == H100_SXM.bandwidth and rec["ceilings"]["peak"] == H100_SXM.peak(rep.precision)
    rec = suite.record_from_report(type("P", (), {"id": "x"})(), dc.replace(rep, timings=None))
    assert "ceilings" not in rec
