"""The RL rubric: every refusal class the Verifier has is a hard penalty below every honest failure;
the honest ladder (parse < contract < compile < run < correct < fast) holds; each component is logged;
the Verifier's own verdicts map to outcomes; real replies to a real task are judged on the CPU
(parse and static refusals without a compile, a compile error, a body that compiles but cannot run
here) through the judge's child processes, and a repeated body comes from the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitchcuda.rl.reward import PENALTIES, TASK_REFUSALS, W, Outcome, refusal_classes, score
from stitchcuda.verifier.static import RULES, Finding
from stitchcuda.verifier.report.verdict import (DYNAMIC_CHECKS, CompileError, Crash, DynamicCheck, OutputCheck, TrialResult,
                                         build_result)

REPO = Path(__file__).resolve().parents[1]
BODY = (REPO / "tests" / "fixtures" / "bodies" / "mlp_linear_2_naive.cu").read_text()

REJECT_RULES = sorted(r.id for r in RULES.values() if r.severity == "reject")
HONEST = {
    "format": Outcome("body", "format"),
    "contract": Outcome("body", "contract"),
    "compile_error": Outcome("body", "build", compiled=False),
    "crash": Outcome("body", "run", compiled=True, ran=True, crash="illegal_address", correct=False),
    "wrong": Outcome("body", "compare", compiled=True, ran=True, correct=False),
    "compiled_not_run": Outcome("body", "build", compiled=True),
    "correct_slow": Outcome("body", "done", compiled=True, ran=True, correct=True, speedup=0.5),
    "correct": Outcome("body", "done", compiled=True, ran=True, correct=True, speedup=1.0),
    "correct_fast": Outcome("body", "done", compiled=True, ran=True, correct=True, speedup=3.0),
}


def test_every_refusal_class_of_the_verifier_has_a_penalty():
    classes = set(REJECT_RULES) | {f"dynamic:{c}" for c in DYNAMIC_CHECKS} | set(TASK_REFUSALS)
    assert classes == set(PENALTIES), (classes ^ set(PENALTIES))
    assert all(v < W["format"] for v in PENALTIES.values())


@pytest.mark.parametrize("rule", REJECT_RULES)
def test_a_static_or_sandbox_rejection_is_a_hard_penalty(rule):
    # even with everything else looking perfect, the penalty is the whole reward
    o = Outcome("body", "done", findings=((rule, "reject"), ("alloc-in-run", "warn")), compiled=True, ran=True,
                correct=True, speedup=8.0)
    r = score(o)
    assert r.total == PENALTIES[rule] and r.penalties == (rule,)
    assert r.components["anti_hacking"] == PENALTIES[rule] and "correct" not in r.components
    assert r.total < min(score(h).total for h in HONEST.values())


@pytest.mark.parametrize("check", sorted(DYNAMIC_CHECKS) + sorted(TASK_REFUSALS))
def test_a_failed_dynamic_check_is_a_hard_penalty(check):
    o = Outcome("body", "done", failed_checks=(check,), compiled=True, ran=True, correct=True, speedup=8.0)
    r = score(o)
    key = check if check in TASK_REFUSALS else f"dynamic:{check}"
    assert r.penalties == (key,) and r.total == PENALTIES[key]
    assert r.total < min(score(h).total for h in HONEST.values())


def test_penalties_add_up_to_a_floor_and_an_unknown_class_is_an_error():
    o = Outcome("body", "static", findings=tuple((r, "reject") for r in REJECT_RULES))
    assert score(o).total == -6.0 and len(refusal_classes(o)) == len(REJECT_RULES)
    with pytest.raises(KeyError, match="no penalty"):
        score(Outcome("body", "done", failed_checks=("dynamic:invented_check",)))


def test_the_honest_ladder_and_the_logged_components():
    t = {k: score(o).total for k, o in HONEST.items()}
    assert t["format"] < t["contract"] < t["compile_error"] < t["crash"] < t["wrong"]
    assert t["wrong"] <= t["compiled_not_run"]     # (never in one group: with a GPU every built body runs)
    assert t["compiled_not_run"] < t["correct_slow"] < t["correct"] < t["correct_fast"]
    r = score(HONEST["correct_fast"])
    assert set(r.components) == {"format", "contract", "anti_hacking", "compiles", "correct", "speed", "quality"}
    assert r.components["speed"] == pytest.approx(0.5) and r.total == pytest.approx(0.2 + 1.0 + 0.5)
    assert r.total == pytest.approx(sum(r.components.values()))
    # undefined behaviour at run time and warnings cost quality
    assert score(HONEST["crash"]).components["quality"] == pytest.approx(W["undefined_behaviour"])
    warned = Outcome("body", "done", findings=(("alloc-in-run", "warn"),) * 5, compiled=True, ran=True, correct=True)
    assert score(warned).components["quality"] == pytest.approx(W["warnings_max"])
    # a reply that cannot run here (no GPU) is not scored on correctness at all
    assert "correct" not in score(HONEST["compiled_not_run"]).components


def test_format_is_graded_by_how_near_the_reply_came():
    from stitchcuda.rl.reward import FORMAT

    ladder = ("no_block", "missing_function", "unterminated", "partial_function")
    t = [score(Outcome("body", "format", format_reason=r)).total for r in ladder]
    assert t == sorted(set(t)) and t[-1] < score(HONEST["contract"]).total, dict(zip(ladder, t))
    assert max(FORMAT.values()) < score(HONEST["contract"]).total and min(FORMAT.values()) == W["format"]
    assert all(v > max(PENALTIES.values()) for v in FORMAT.values())


def _trial(passed: bool) -> TrialResult:
    return TrialResult(0, (OutputCheck("out", 0.0 if passed else 1.0, 0.0, 1e-4, passed=passed),))


def test_the_verifiers_verdicts_map_to_outcomes():
    from stitchcuda.rl.reward import outcome_of_verification

    f = Finding("sandbox-file-access", "reject", "program.so", 0, "opens files")
    o = outcome_of_verification("body", build_result(findings=[f]))
    assert o.stage == "sandbox" and score(o).penalties == ("sandbox-file-access",)
    o = outcome_of_verification("body", build_result(trials=[_trial(True)],
                                                     checks=[DynamicCheck("no_output_reuse", "fail", "same outputs")]))
    assert score(o).penalties == ("dynamic:no_output_reuse",)
    o = outcome_of_verification("body", build_result(compile_error=CompileError.from_output("x.cu(1): error: no")))
    assert o.compiled is False and score(o).total == W["compile_error"]
    o = outcome_of_verification("body", build_result(crash=Crash("illegal_address", "700")))
    assert o.crash == "illegal_address" and score(o).components["runs"] == W["crash"]
    o = outcome_of_verification("body", build_result(trials=[_trial(False)]))
    assert o.correct is False and score(o).components["correct"] == 0.0
    warn = Finding("alloc-in-run", "warn", "program.cu", 3, "allocates")
    o = outcome_of_verification("body", build_result(trials=[_trial(True)], findings=[warn]), speedup=2.0)
    r = score(o)
    assert o.correct and r.components["speed"] == pytest.approx(0.5) and r.components["quality"] == pytest.approx(-0.1)


# ---------------------------------------------------------------------------- the judge, for real


@pytest.fixture(scope="module")
def mlp_judge():
    from stitchcuda.rl.dataset import capture, examples_from_reference, iter_references
    from stitchcuda.rl.judge import JudgeSettings, RewardJudge

    entry = next(iter_references([REPO / "models" / "mlp.py"]))
    exs = examples_from_reference(capture(entry))
    body = next(e for e in exs if e.kind == "body" and e.task == "linear_2")
    plan = next(e for e in exs if e.kind == "plan")
    return RewardJudge({entry.id: entry}, JudgeSettings(device="cpu", workers=2)), body, plan


def test_cheap_exits_need_no_child_and_no_compile(mlp_judge):
    judge, ex, _ = mlp_judge
    before = judge.stats["children"]
    outs = judge.judge_many([
        (ex, "I would write a kernel."),                                                # no code block
        (ex, "```cuda\nst_status linear_2(int x) { return ST_OK; }\n```"),              # wrong signature
        (ex, f"```cuda\nstatic int calls = 0;\n{BODY}```"),                             # state across calls
        (ex, "```cuda\n#include <torch/extension.h>\n" + BODY + "```"),                 # PyTorch
    ])
    assert [o.stage for o in outs] == ["format", "contract", "static", "static"]
    assert outs[0].format_reason == "no_block" and score(outs[0]).total == -1.0
    assert score(outs[2]).penalties == ("host-state-global",)
    assert "torch-include" in score(outs[3]).penalties
    assert judge.stats["children"] == before


def test_closing_the_block_at_once_scores_no_more_than_nothing(mlp_judge):
    # What a 400-step GRPO run converged to while closed blank blocks outscored an attempt cut at
    # max tokens: the primed opening, then fences only.
    judge, ex, _ = mlp_judge
    blank, cut, named = (score(o).total for o in judge.judge_many([
        (ex, "```cuda\n```\n```\n```\n```\n```\n"),
        (ex, "```cuda\n__global__ void k(const float* x, float* y, int n) {\n  int i = blockIdx.x"),
        (ex, "```cuda\n__global__ void k(float* y) { y[0] = 0; }\nst_status linear_2(const float* a,"),
    ]))
    assert blank == score(Outcome("body", "format", format_reason="")).total == -1.0
    assert blank < cut < named


def test_bodies_are_built_in_a_child_and_cached_by_body(mlp_judge, nvcc):
    judge, ex, _ = mlp_judge
    broken = BODY.replace("acc + bias[j]", "acc + bias[j] +")
    outs = judge.judge_many([(ex, f"```cuda\n{BODY}```"), (ex, f"```cuda\n{broken}```")])
    ok, bad = outs
    assert ok.stage == "build" and ok.compiled and ok.correct is None and not ok.ran, ok
    assert score(ok).total == pytest.approx(W["compiled"])
    assert bad.stage == "build" and bad.compiled is False and score(bad).total == W["compile_error"]
    children = judge.stats["children"]
    again = judge.judge(ex, f"Here it is:\n```cuda\n{BODY}```\n")     # other words, the same body
    assert again.cached and again.stage == "build" and judge.stats["children"] == children


def test_decisions_are_planned_and_interpreted(mlp_judge):
    judge, _, ex = mlp_judge
    ok, nonsense, unknown = judge.judge_many([
        (ex, '{"precision": {"linear_2": "fp32"}, "unfuse": [], "strategy": {}, "rewrites": []}'),
        (ex, "make it faster"),
        (ex, '{"precision": {"no_such_node": "fp32"}}')])
    assert ok.stage == "done" and ok.correct and ok.ran and ok.speedup is not None, ok
    assert score(ok).components["correct"] == 1.0
    assert nonsense.stage == "format" and unknown.stage == "format"
