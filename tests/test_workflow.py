"""The loop on the CPU: a scripted Verifier and scripted proposers drive every route, the
budgets, best-not-last, per-task checks first, and resume after a real SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stitchcuda.workflow import (Budget, PrecisionRepair, Rewrites, State, Variants, optimize, parse_seconds)
from stitchcuda.workflow.runs import RunDir
from stitchcuda.workflow.state import Spent

from .workflow_script import ScriptedBodies, ScriptedJudge, example

HERE = Path(__file__).resolve().parent


def run(tmp_path, judge, proposers, budget="5m", **kw):
    model, xs = example()
    return optimize(model, xs, precision="tf32", budget=budget, judge=judge, proposers=proposers, compile=False,
                    out=tmp_path / "run", **kw)


def test_budget_parsing():
    assert parse_seconds("3m") == 180 and parse_seconds("2m30s") == 150 and parse_seconds("90") == 90
    assert parse_seconds("1h") == 3600
    for bad in ("3q", "", "-1", "m"):
        with pytest.raises(ValueError):
            parse_seconds(bad)


def test_precision_repair_raises_only_the_responsible_task(tmp_path):
    judge = ScriptedJudge(sensitive=("linear_1",))
    r = run(tmp_path, judge, [PrecisionRepair(), Variants()])
    st = r.state
    root = st.root_candidate
    assert root.judgement.kind == "wrong_answer" and st.best != root.id
    assert st.routes[0].kind == "repair"
    best = st.best_candidate
    # every rounding task raised first, then the bisection kept only linear_1's task at fp32
    first = st.candidates[1]
    assert first.proposer == "precision" and len(first.meta["precision_raised"]) == 2 and first.ok
    raised = [t for t, _ in best.meta["precision_raised"]]
    assert raised == ["linear_1"], raised
    assert best.constraints["precision"] == {"linear_1": "fp32"}
    assert best.origins["linear_1"] == "repair (fp32)" and best.origins["linear_gelu"] == "template"
    assert any(c.ok is False and c.meta.get("precision_raised") == [["linear_gelu", ["linear", "gelu"]]]
               for c in st.candidates)
    md = r.markdown.read_text()
    assert "only linear_1 raised to fp32" in md
    assert r.best is not None and (r.best / "plan.json").is_file()
    kinds = {x.kind for x in st.routes}
    assert {"repair", "replan", "next", "optimize", "done"} <= kinds, kinds


def test_precision_repair_takes_tf32_parts_where_bf16_parts_are_not_enough(tmp_path):
    """A raised GEMM first runs as three bf16 products; where that is still wrong, the repair asks for
    three TF32 products for the raised GEMMs, and the bisection keeps that choice."""
    judge = ScriptedJudge(sensitive=("linear_1",), exact=("linear_1",))
    r = run(tmp_path, judge, [PrecisionRepair(), Variants()])
    st = r.state
    first = st.candidates[1]
    assert first.proposer == "precision" and not first.ok and "bf16 parts" in first.judgement.summary
    esc = next(c for c in st.candidates if "three TF32 products" in c.description)
    assert esc.ok and esc.constraints["strategy"].get("linear_1") == "tf32x3", esc.constraints
    best = st.best_candidate
    assert best.ok and best.constraints["precision"] == {"linear_1": "fp32"}
    assert best.constraints["strategy"].get("linear_1") == "tf32x3"
    # the split is a step of precision, never a speed variant: Variants does not offer it
    assert not any(c.proposer == "variant" and ("bf16x3" in c.description or "tf32x3" in c.description)
                   for c in st.candidates), [c.description for c in st.candidates]


def test_exact_rewrite_repairs_and_beats_fp32(tmp_path):
    judge = ScriptedJudge(sensitive=("linear_1",))
    r = run(tmp_path, judge, [Rewrites(), PrecisionRepair()])
    st = r.state
    assert st.candidates[1].proposer == "rewrite" and st.candidates[1].ok
    best = st.best_candidate
    assert "reduce_after_linear" in best.constraints["rewrites"]
    assert "rewrite" in best.origins.values()
    assert best.ms < st.candidates[1].ms * 1.0001


def test_a_wrong_answer_pytorch_misses_too_is_repaired_by_precision_first(tmp_path):
    """Where the Verifier notes that PyTorch's own arithmetic at the policy misses the tolerance on
    the same inputs, the repair asks the precision proposer before the exact rewrites (each rewrite
    tried first costs a whole verification); without that note the order is the proposers' own."""
    import dataclasses

    from stitchcuda.verifier.run.session import ALSO_OVER, POLICY_NOTE

    judge = ScriptedJudge(sensitive=("linear_1",))
    orig = judge.verify

    def verify(problem, program, final=False):
        j = orig(problem, program, final)
        return j if j.ok else dataclasses.replace(j, policy_note=f"trial 0: {POLICY_NOTE} tf32 0.03 ({ALSO_OVER})")

    judge.verify = verify
    st = run(tmp_path, judge, [Rewrites(), PrecisionRepair()]).state
    assert [c.proposer for c in st.candidates[:2]] == ["template", "precision"], [c.description for c in st.candidates]
    assert st.candidates[1].ok and st.best_candidate.ok
    assert any(c.proposer == "rewrite" for c in st.candidates[2:])  # still tried, from the repaired best


def test_best_is_never_a_slower_or_wrong_candidate(tmp_path):
    # Strategy variants of the sum make it slower; bodies: one wrong, one right but not faster.
    judge = ScriptedJudge(sensitive=(), slower=("sum_1",))
    r = run(tmp_path, judge, [Variants(), ScriptedBodies(["BAD", "GOOD"])])
    st = r.state
    root = st.root_candidate
    assert root.ok and st.best == root.id
    later = st.candidates[1:]
    assert later and all(c.parent == root.id for c in later)   # revised from the best, not the last
    assert any(c.judgement.kind == "task_failed" for c in later)   # BAD stopped by its task check
    assert all(st.best != c.id for c in later)
    # a wrong body never reaches the whole-program Verifier
    assert len(judge.calls) == len([c for c in st.candidates if c.program])


def test_a_faster_verified_body_becomes_best_and_is_revised_from(tmp_path):
    judge = ScriptedJudge(sensitive=())
    judge.ms["elementwise_kernel"] = (0.2, 0.2)

    orig = judge.verify

    def verify(problem, program, final=False):
        j = orig(problem, program, final)
        m = json.loads((Path(program) / "manifest.json").read_text())
        if j.ok and any(t.get("origin") == "override: llm" for t in m["tasks"]):
            import dataclasses
            return dataclasses.replace(j, ms=j.ms * 0.5)
        return j

    judge.verify = verify
    r = run(tmp_path, judge, [ScriptedBodies(["GOOD"])])
    st = r.state
    best = st.best_candidate
    assert best.proposer == "llm" and "llm" in best.origins.values()
    assert st.base().id == best.id and st.candidates.index(best) > 0
    assert "LLM wrote 1 of" in r.markdown.read_text()


def test_iteration_and_gpu_budgets(tmp_path):
    r = run(tmp_path / "a", ScriptedJudge(), [PrecisionRepair(), Variants()], iterations=2)
    assert len(r.state.candidates) == 2 and "iteration budget" in r.state.finished
    r = run(tmp_path / "b", ScriptedJudge(gpu_s=10.0), [PrecisionRepair(), Variants()], gpu_budget=25)
    assert len(r.state.candidates) == 3 and "GPU-time budget" in r.state.finished
    r = run(tmp_path / "c", ScriptedJudge(), [PrecisionRepair(), Variants()], budget=0.001)
    assert len(r.state.candidates) == 1 and "wall-time budget" in r.state.finished
    assert r.best is None and "no candidate verified" in r.markdown.read_text()


def test_a_candidate_that_cannot_finish_in_time_is_not_begun(tmp_path):
    """Candidates take 2-3 s each: after the first verified one (4-6 s into a 6 s budget) the run
    stops and hands back that best rather than begin a third and end past its budget."""
    r = run(tmp_path, ScriptedJudge(delay=2.0), [PrecisionRepair(), Variants()], budget=6.0)
    st = r.state
    assert len(st.candidates) == 2 and st.best == st.candidates[1].id, [c.id for c in st.candidates]
    assert re.search(r"s left, and the quickest candidate built so far took [23] s", st.finished), st.finished
    assert st.spent.wall_s < 6.0
    assert r.best is not None
    # without a verified best the run still tries: a late program beats none
    r = run(tmp_path / "b", ScriptedJudge(delay=2.0), [PrecisionRepair(), Variants()], budget=3.0)
    assert len(r.state.candidates) == 2 and "wall-time budget of 3 s spent" in r.state.finished, r.state.finished


def test_budget_fit_is_judged_by_the_quickest_build():
    spent = Spent(wall_s=100.0)
    assert Budget(180.0).cannot_fit(spent, 79.0) is None
    assert "80 s left" in Budget(180.0).cannot_fit(spent, 81.0)
    assert Budget(180.0).cannot_fit(spent, None) is None and Budget(None).cannot_fit(spent, 1e9) is None


def test_hot_tasks_fall_back_to_the_plan_when_the_profile_placed_no_time():
    """A profile that attributed no kernel time to any task (every task 0 us) must not leave the
    optimize route without targets: the plan's estimates name them."""
    from stitchcuda.workflow.route import hot_tasks
    from stitchcuda.workflow.state import Candidate, Judgement, TaskTime

    def state(tasks):
        c = Candidate("c0000", None, "template", "plan", None, "the plan",
                      judgement=Judgement("passed", "ok", 1.0, (), tasks, 1.0))
        return State("r", "p", "tf32", Budget(), candidates=(c,), best="c0000", root="c0000")
    est = (TaskTime("a", 5.0, 0.5, False), TaskTime("b", 50.0, 0.5, False))
    assert hot_tasks(state((TaskTime("a", 0.0, 0.0), TaskTime("b", 0.0, 0.0))), est) == ["b", "a"]
    assert hot_tasks(state((TaskTime("a", 9.0, 0.1), TaskTime("b", 0.0, 0.0))), est) == ["a"]


def test_a_wrong_answers_judgement_keeps_the_note_on_pytorch_at_the_policy():
    """The Verifier notes what PyTorch itself gets at the policy on a failing trial's inputs; the
    loop's judgement keeps that note (a suite's report shows it beside a repair), and a state with it
    round-trips. A pass keeps none. Of several outputs' notes, the one where PyTorch misses too wins
    over an earlier "within": it is the one that asks for the precision repair."""
    from stitchcuda.verifier import Passed, VerificationReport, VerificationResult, WrongAnswer
    from stitchcuda.verifier.report.records import GpuDetails
    from stitchcuda.verifier.run.session import POLICY_NOTE
    from stitchcuda.workflow.judge import judgement_of
    from stitchcuda.workflow.state import Candidate

    said = ("trial 2: output y judged on norm-relative error 0.01",
            f"trial 0: output z at tf32: the program's max |err| 0.02; {POLICY_NOTE} tf32 on the same inputs 0.001 "
            "(within the tolerance)",
            f"trial 0: output y at tf32: the program's max |err| 0.03; {POLICY_NOTE} tf32 on the same inputs 0.029 "
            "(also over the tolerance)")
    wrong = WrongAnswer(0, 0.03, 0.004, (1, 2), "y", tolerance=1e-2, expected=0.3, got=0.33, atol=4e-3)
    rep = VerificationReport("p", "tf32", "sm_90", VerificationResult(wrong), details=GpuDetails(correctness_notes=said))
    j = judgement_of(rep, 1.0)
    assert j.kind == "wrong_answer" and j.policy_note == said[2] and j.error_ratio == pytest.approx(0.03 / 7e-3)
    ok = VerificationReport("p", "tf32", "sm_90", VerificationResult(Passed(5, 1e-6, 1e-4)),
                            details=GpuDetails(correctness_notes=said))
    assert judgement_of(ok, 1.0).policy_note == ""
    within = VerificationReport("p", "tf32", "sm_90", VerificationResult(wrong), details=GpuDetails(correctness_notes=said[:2]))
    assert judgement_of(within, 1.0).policy_note == said[1]
    st = State("r", "p", "tf32", Budget(), candidates=(Candidate("c0000", None, "template", "plan", None, "d",
                                                                  judgement=j),), root="c0000")
    assert State.from_json(st.to_json()).root_candidate.judgement.policy_note == said[2]


def test_after_a_guided_pass_the_descent_drops_the_least_sensitive_task_first():
    """Once the interpreter's candidate verified, the next step keeps its most sensitive tasks at
    fp32 and lowers the least sensitive one (by the model's ranking, not graph order), before any
    blind half. Without a ranking the bisection is as before: halves in graph order first."""
    from types import SimpleNamespace

    from stitchcuda.workflow.state import Candidate, Judgement

    sus = [["a", ["a"]], ["b", ["b"]], ["c", ["c"]], ["d", ["d"]]]
    wrong, ok = Judgement("wrong_answer", "wrong"), Judgement("passed", "ok", 1.0)

    def state(sensitivity):
        root = Candidate("c0000", None, "template", "repair", None, "build", judgement=wrong)
        meta = {"precision_raised": [["c", ["c"]], ["d", ["d"]]], "precision_suspects": sus}
        if sensitivity:
            meta["sensitivity"] = {"alone": [["d", 3.0], ["c", 2.0], ["a", 0.1], ["b", 0.05]]}
        guided = Candidate("c0001", "c0000", "precision", "repair", None, "guided", meta=meta, judgement=ok)
        return State("r", "p", "tf32", Budget(), candidates=(root, guided), best="c0001", root="c0000")

    def first(st):
        [prop] = PrecisionRepair()._bisect(SimpleNamespace(state=st, base=st.best_candidate))
        return [t for t, _ in prop.meta["precision_raised"]], prop.description

    raised, said = first(state(True))
    assert raised == ["d"] and "without c, the least sensitive in the interpreter's model" in said
    assert first(state(False))[0] == ["c"]  # no ranking: the first half in graph order


def test_state_round_trips_through_json(tmp_path):
    r = run(tmp_path, ScriptedJudge(), [PrecisionRepair(), Variants()])
    st = RunDir(r.run_dir).load()
    assert st == r.state
    assert State.from_json(st.to_json()) == st


KILLED = """
import sys
sys.path.insert(0, {tests!r})
from workflow_script import ScriptedJudge, example
from stitchcuda.workflow import optimize, PrecisionRepair, Variants
model, xs = example()
optimize(model, xs, precision="tf32", budget="5m", judge=ScriptedJudge(sleep_on=3, marker={marker!r}),
         proposers=[PrecisionRepair(), Variants()], compile=False, out={out!r})
"""


def test_resume_after_sigkill_loses_at_most_the_candidate_in_flight(tmp_path):
    marker, out = tmp_path / "sleeping", tmp_path / "run"
    code = KILLED.format(tests=str(HERE), marker=str(marker), out=str(out))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    while not marker.exists():
        assert p.poll() is None, p.stderr.read().decode()[-2000:]
        assert time.monotonic() - t0 < 120, "the child never reached the third verification"
        time.sleep(0.2)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    before = RunDir(out).load()
    assert len(before.candidates) == 2 and not before.finished     # the third was in flight
    events = RunDir(out).events()
    assert events[-1]["event"] == "candidate" and events[-1]["id"] == "c0002"
    model, xs = example()
    r = optimize(model, xs, judge=ScriptedJudge(), proposers=[PrecisionRepair(), Variants()], compile=False, out=out,
                 resume=True)
    st = r.state
    assert st.candidates[:2] == before.candidates
    assert [c.id for c in st.candidates] == [f"c{i:04d}" for i in range(len(st.candidates))]
    assert st.candidates[2].description == events[-1]["description"]   # the lost one, evaluated again
    assert st.finished and st.best_candidate.constraints["precision"] == {"linear_1": "fp32"}
    assert any(e["event"] == "start" and e["resumed"] for e in RunDir(out).events())


def test_cli_optimize_refuses_bad_input(capsys):
    from stitchcuda.cli import main

    assert main(["optimize"]) == 2
    assert main(["optimize", str(HERE / "nothing.py"), "--budget", "3q"]) == 2
    assert main(["runs", "show", "no-such-run", "--dir", str(HERE)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "budget '3q'" in err


def test_cli_runs_list_show_diff(tmp_path, capsys):
    from stitchcuda.cli import main

    model, xs = example()
    optimize(model, xs, precision="tf32", judge=ScriptedJudge(), proposers=[PrecisionRepair()], compile=False,
             out=tmp_path / "runs" / "r1", budget=Budget(60.0))
    capsys.readouterr()
    assert main(["runs", "list", "--dir", str(tmp_path / "runs")]) == 0
    assert "r1" in capsys.readouterr().out
    assert main(["runs", "show", "r1", "--dir", str(tmp_path / "runs")]) == 0
    assert "only linear_1 raised to fp32" in capsys.readouterr().out
    assert main(["runs", "diff", "r1:c0000", "r1", "--dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert '"linear_1": "fp32"' in out and "program.cu" in out


def test_precision_repair_suspects_every_task_the_policy_rounds():
    """Under tf32 cuDNN's convolutions and the recurrent template run on tensor cores as GEMMs do:
    a deep conv net's wrong answer must have suspects to raise (it had none: the loop gave up)."""
    import torch

    from stitchcuda import frontend, plan

    class ConvNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            # (sums of 36 and 72: a convolution of sums under 32 computes at fp32 already)
            self.c1, self.c2 = torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1)
            self.gru = torch.nn.GRU(8, 8, batch_first=True)
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            y = torch.relu(self.c2(torch.relu(self.c1(x))))
            s, _ = self.gru(y.mean(3).transpose(1, 2))
            return self.fc(s[:, -1])

    torch.manual_seed(0)
    g = frontend.capture(ConvNet().eval(), [torch.randn(2, 4, 8, 8)], "convnet").graph
    p = plan.plan(g, "tf32")
    sus = dict(PrecisionRepair().suspects(p))
    by = {t.name: t.strategy for t in p.tasks if t.name in sus}
    assert sorted(set(by.values())) == ["cublaslt_gemm", "cudnn_conv", "recurrent_template"], by
    assert sum(s == "cudnn_conv" for s in by.values()) == 2
    # raising a convolution's nodes is honoured: its task plans at fp32 (the split-TF32 convolution,
    # channels-last like its neighbours)
    conv = next(t for t, s in by.items() if s == "cudnn_conv")
    raised = plan.plan(g, "tf32", constraints=plan.Constraints.from_dict({"precision": {n: "fp32" for n in sus[conv]}}))
    t = next(t for t in raised.tasks if t.strategy == "cudnn_conv" and set(sus[conv]) <= set(t.covers))
    assert t.params.policy == "fp32" and t.params.split_tf32 and t.params.channels_last
    assert all(x.params.policy == "tf32" for x in raised.tasks if x.strategy == "cudnn_conv" and x is not t)


def test_tf32_model_of_the_interpreter_finds_the_sensitive_layer():
    """The interpreter at TF32 (operands to 10 mantissa bits) reproduces a cancellation's failure and
    names the one layer responsible; the other three at TF32 stay within half the bound."""
    import torch

    from stitchcuda import frontend, plan
    from stitchcuda.check.interp import round_tf32
    from stitchcuda.check.sensitivity import tf32_sensitivity

    from .workflow_script import CancellingChain

    vals = torch.tensor([1.0 + 2.0**-11 + 2.0**-20, 1.0 + 2.0**-12, -(1.0 + 3 * 2.0**-12), 96.0 + 2.0**-5], dtype=torch.float64)
    assert round_tf32(vals).tolist() == [1.0 + 2.0**-10, 1.0, -(1.0 + 2.0**-10), 96.0]  # to nearest, 10 bits
    r = round_tf32(torch.randn(1000, dtype=torch.float64) * 1e-30)
    m, _ = torch.frexp(r)
    assert bool((m * 2048 == torch.round(m * 2048)).all())  # 11 significant bits, at any scale
    torch.manual_seed(0)
    x = torch.randn(32, 64)
    cap = frontend.capture(CancellingChain().eval(), [x], "chain")
    p = plan.plan(cap.graph, "tf32")
    sus = [t for t, _ in PrecisionRepair().suspects(p)]
    s = tf32_sensitivity(p, dict(cap.weights), [x], sus, tol=1e-2)
    assert len(sus) == 4 and s.every > 2.0 and s.alone[0][0] == "linear" and s.alone[0][1] > 2.0
    assert all(r < 0.5 for _, r in s.alone[1:]) and s.raise_ == ("linear",) and s.rest <= s.target
    assert "all but 1 of 4" in s.describe()


def test_tf32_model_in_groups_of_consecutive_tasks_when_runs_are_few():
    """Too few runs for one a suspect: the model judges groups of neighbouring tasks, and raises the
    group holding the sensitive layer (not every task); with room for only one group it gives up."""
    import torch

    from stitchcuda import frontend, plan
    from stitchcuda.check.sensitivity import consecutive_groups, runs_needed, tf32_sensitivity

    from .workflow_script import CancellingChain

    assert consecutive_groups(list("abcde"), 2) == [("a", "b", "c"), ("d", "e")]
    assert consecutive_groups(list("abc"), 5) == [("a",), ("b",), ("c",)]
    assert runs_needed(4) == 9 and runs_needed(2) == 6
    torch.manual_seed(0)
    x = torch.randn(32, 64)
    cap = frontend.capture(CancellingChain().eval(), [x], "chain")
    p = plan.plan(cap.graph, "tf32")
    sus = [t for t, _ in PrecisionRepair().suspects(p)]
    one_by_one = tf32_sensitivity(p, dict(cap.weights), [x], sus, tol=1e-2, max_runs=9)
    assert one_by_one.groups == 0 and one_by_one.raise_ == ("linear",) and one_by_one.runs <= 9
    s = tf32_sensitivity(p, dict(cap.weights), [x], sus, tol=1e-2, max_runs=8)  # 3 groups: 2 + 3 + 2 runs
    first = next(g for g in consecutive_groups(sus, 3) if "linear" in g)
    assert s.groups == 3 and set(s.raise_) == set(first) and len(s.raise_) < len(sus), s
    assert s.runs <= 8 and s.rest <= s.target and s.alone[0][0] in first
    assert "judged in 3 groups of consecutive tasks" in s.describe()
    none = tf32_sensitivity(p, dict(cap.weights), [x], sus, tol=1e-2, max_runs=5)
    assert none.raise_ == () and "4 suspects in 5 runs" in none.describe()


def test_precision_repair_raises_the_interpreters_choice_first(tmp_path):
    """A wrong answer at tf32: the candidate after the first raises only the task the interpreter
    found responsible, it verifies, and the every-task candidate is never built."""
    import torch

    from .workflow_script import CancellingChain

    torch.manual_seed(0)
    judge = ScriptedJudge(sensitive=("linear",))
    r = optimize(CancellingChain().eval(), [torch.randn(32, 64)], precision="tf32", budget="5m", judge=judge,
                 proposers=[PrecisionRepair()], compile=False, out=tmp_path / "run")
    st = r.state
    guided = st.candidates[1]
    assert st.root_candidate.judgement.kind == "wrong_answer" and guided.ok
    assert [t for t, _ in guided.meta["precision_raised"]] == ["linear"] and "interpreter" in guided.description
    # an nn.Module has no source for the Verifier's draw: the description says what the model ran on, and why
    assert "on the captured weights, not the Verifier's draw (" in guided.description
    assert guided.meta["sensitivity"]["alone"][0][0] == "linear" and st.best == guided.id
    assert not any(len(c.meta.get("precision_raised", ())) == 4 for c in st.candidates), "every task was raised"


CONV_BN = """
import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)
    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))
def get_inputs():
    return [torch.randn(2, 3, 8, 8)]
def get_init_inputs():
    return []
"""


def test_the_tf32_model_runs_on_the_verifiers_own_draw(tmp_path):
    """The judged parameters, not the captured ones (those of mobilenet_v1 showed 0.13x the bound
    where the Verifier's draw shows the failure): drawn away from the captured values, named and
    ordered as the plan reads them, so the interpreter computes what the reference computes."""
    import torch

    from stitchcuda.check.interp import simulate
    from stitchcuda.evaluate import evaluate_graph
    from stitchcuda.pipeline import capture_problem
    from stitchcuda.workflow.judge import verifier_values

    ref = tmp_path / "conv_bn.py"
    ref.write_text(CONV_BN)
    prob = capture_problem(str(ref), precision="tf32", compiling=False)
    p = prob.plan()
    w, xs = verifier_values(prob, p, "cpu")
    assert set(w) == set(prob.weights)
    assert not torch.equal(w["bn.running_var"].cpu(), prob.weights["bn.running_var"]), "the captured values"
    got = simulate(p, w, xs)[0]
    want = evaluate_graph(prob.graph, {t.name: x for t, x in zip(prob.graph.inputs, xs)}, w)[0]
    assert torch.allclose(got.double(), want.double(), rtol=1e-4, atol=1e-5)


def test_the_tf32_model_is_scaled_up_to_the_gpus_error():
    """The model rounds to nearest; a library may drop the bits instead, and the GPU's error is then
    larger (efficientnet_b0: the model 0.8x the bound, the GPU 3.0x). Given the GPU's own error the
    model is scaled up to it (never down): it guides where it saw too little, and raises more
    where the GPU missed by more."""
    import torch

    from stitchcuda import frontend, plan
    from stitchcuda.check.sensitivity import MAX_SCALE, tf32_sensitivity
    from stitchcuda.verifier.report.verdict import WrongAnswer
    from stitchcuda.workflow.judge import reported_ratio

    from .workflow_script import CancellingChain

    # the GPU's reported element of mobilenet_v1 (call 4): |0.288576 - 0.309394| / (4.4e-3 + 1e-2 * 0.309394)
    v = WrongAnswer(0, 0.0285, 0.0038, (20, 457), "view", tolerance=1e-2, expected=0.309394, got=0.288576, atol=4.4e-3)
    assert reported_ratio(v) == pytest.approx(2.78, abs=0.01)
    assert reported_ratio(WrongAnswer(0, float("nan"), 0.0, tolerance=1e-2, nan_count=3)) is None

    def model(cancel: float, observed):
        torch.manual_seed(0)
        x = torch.randn(32, 64)
        cap = frontend.capture(CancellingChain(cancel=cancel).eval(), [x], "chain")
        p = plan.plan(cap.graph, "tf32")
        sus = [t for t, _ in PrecisionRepair().suspects(p)]
        return tf32_sensitivity(p, dict(cap.weights), [x], sus, tol=1e-2, observed=observed)

    weak, scaled = model(0.2, None), model(0.2, 2.5)  # a milder cancellation: the model alone under the bound
    assert weak.every < 1.0 and weak.raise_ == () and "does not show the failure" in weak.why
    assert scaled.scale == pytest.approx(2.5 / weak.every) and scaled.raise_[0] == "linear"
    assert 1 < len(scaled.raise_) < 4 and scaled.rest * scaled.scale <= 0.5 and "scaled x" in scaled.describe()
    plain, below, above = model(0.01, None), model(0.01, 3.0), model(0.01, 100.0)
    assert plain.raise_ == below.raise_ == ("linear",) and below.scale == 1.0  # a GPU below the model: not scaled down
    assert above.raise_ == () and "sees too little" in above.why  # a GPU far above it: no guide (every task)
    assert plain.every * MAX_SCALE < 100.0 <= plain.every * 20


def _final_judge(judge, fails):
    """``judge`` whose final verification (``final=True``) fails the programs ``fails`` says of their
    plan.json (a best near the tolerance's edge: it passed the search's trials)."""
    import dataclasses

    orig = judge.verify
    finals = []

    def verify(problem, program, final=False):
        j = orig(problem, program, final)
        if final:
            plan = json.loads((Path(program) / "plan.json").read_text())
            finals.append(plan)
            if fails(plan):
                return dataclasses.replace(j, kind="wrong_answer", summary="wrong answer: 1/11 trials over the bound",
                                           ms=None)
        return j

    judge.verify = verify
    return finals


def test_a_best_that_fails_its_final_verification_is_set_aside(tmp_path):
    """The fastest verified candidate fails the final verification: the next fastest verified one
    takes its place, is verified the same way and is what the run hands back; the report says so."""
    judge = ScriptedJudge(sensitive=("linear_1",))
    r = run(tmp_path, judge, [PrecisionRepair(), Variants()], final_verify=False)
    first_best = r.state.best
    first_plan = json.loads((r.run_dir / r.state.best_candidate.program / "plan.json").read_text())
    finals = _final_judge(judge, lambda plan: plan == first_plan)  # the search's best: near the edge
    model, xs = example()
    r2 = optimize(model, xs, out=tmp_path / "run", resume=True, budget=0.001, judge=judge, proposers=[], compile=True)
    st = r2.state
    assert [cid for cid, _ in st.set_aside] == [first_best], st.set_aside
    assert st.best != first_best and st.best_candidate.ok and st.final.ok and st.final_of == st.best
    assert len(finals) == 2 and finals[0] == first_plan and finals[1] != first_plan
    assert st.best == min((c for c in r.state.candidates if c.ok and c.id != first_best), key=lambda c: c.ms).id
    assert r2.ok and json.loads((r2.best / "plan.json").read_text()) == finals[1]
    md = r2.markdown.read_text()
    assert f"set aside: {first_best} passed the search's trials but failed its final verification" in md


def test_a_run_whose_every_final_verification_fails_hands_back_nothing(tmp_path):
    judge = ScriptedJudge(sensitive=("linear_1",))
    run(tmp_path, judge, [PrecisionRepair(), Variants()], final_verify=False)
    finals = _final_judge(judge, lambda plan: True)
    model, xs = example()
    r = optimize(model, xs, out=tmp_path / "run", resume=True, budget=0.001, judge=judge, proposers=[], compile=True)
    verified = [c for c in r.state.candidates if c.ok]
    assert len(finals) == min(len(verified), 3) and len(r.state.set_aside) == len(finals)
    assert r.state.best is None and r.best is None and not r.ok
    assert not (tmp_path / "run" / "best").exists()
    assert "no candidate passed its final verification" in r.markdown.read_text()
    from stitchcuda.ship.suite import _no_candidate
    assert _no_candidate(r.state).startswith("no candidate passed its final verification")


def test_the_loop_measures_the_narrow_convolution_kernel_against_cudnns(tmp_path):
    """A convolution over few input channels with a sum too long for the narrow kernel's default (16
    channels x 3 x 3) is cuDNN's as built; the loop's Variants proposer offers the conv strategy
    ``narrow`` (kinds/narrow_conv.py), and the judge's times decide: kept where it measured faster,
    not where slower."""
    import torch

    class ConvAct(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(16, 24, 3, padding=1)

        def forward(self, x):
            return torch.nn.functional.hardswish(torch.relu(self.c(x)))

    torch.manual_seed(0)
    x = [torch.randn(2, 16, 12, 12)]
    for narrow_ms, kept in ((0.4, True), (3.0, False)):
        judge = ScriptedJudge(sensitive=(), ms={"cudnn_conv": (1.0, 3.0), "conv_template": (narrow_ms, narrow_ms),
                                                "elementwise_kernel": (0.2, 0.2), "copy": (0.1, 0.1)})
        r = optimize(ConvAct(), x, precision="tf32", budget="5m", judge=judge, proposers=[Variants()], compile=False,
                     out=tmp_path / f"run{narrow_ms}")
        st = r.state
        root = json.loads((Path(judge.calls[0]) / "plan.json").read_text())
        assert "cudnn_conv" in {t["strategy"] for t in root["tasks"]}, "as built: cuDNN's"
        best = json.loads((r.best / "plan.json").read_text())
        assert ("conv_template" in {t["strategy"] for t in best["tasks"]}) == kept
        tried = [c for c in st.candidates if c.proposer == "variant" and "strategy narrow" in c.description]
        assert tried and all(c.ok for c in tried), [c.description for c in st.candidates]
        assert ("narrow" in st.best_candidate.constraints.get("strategy", {}).values()) == kept


def test_a_variant_whose_program_is_one_judged_before_is_not_judged_again(tmp_path):
    """Under bf16 the narrow kernel declines (float32 storage only) and convolutions are channels-last
    anyway, so the conv strategies ``narrow`` and ``channels_last`` give the program as built: the loop
    says so and spends no build or verification on them, and a resumed run still knows the programs
    it judged."""
    import torch

    class ConvAct(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(8, 24, 3, padding=1)

        def forward(self, x):
            return torch.relu(self.c(x))

    torch.manual_seed(0)
    x = [torch.randn(2, 8, 12, 12)]
    judge = ScriptedJudge(sensitive=(), ms={"cudnn_conv": (1.0, 3.0), "conv_template": (0.4, 0.4),
                                            "elementwise_kernel": (0.2, 0.2), "copy": (0.1, 0.1)})
    r = optimize(ConvAct(), x, precision="bf16", budget="5m", judge=judge, proposers=[Variants()], compile=False,
                 out=tmp_path / "run")
    cands = r.state.candidates
    (narrow,) = [c for c in cands if "strategy narrow" in c.description]
    assert narrow.judgement.kind == "same_program" and narrow.judgement.summary.startswith("the same program as c0000")
    assert not narrow.program and not (tmp_path / "run" / "candidates" / narrow.id / "program").exists()
    judged = [c for c in cands if c.judgement.kind != "same_program"]
    assert judge.calls == [str(tmp_path / "run" / c.program) for c in judged], "one verification each"
    sources = [(tmp_path / "run" / c.program / "program.cu").read_text() for c in judged]
    assert len(set(sources)) == len(sources), "every program judged is a different program"
    # a resumed run reads the programs it judged from the run folder
    from stitchcuda.workflow.loop import Loop
    loop = Loop.__new__(Loop)
    loop.state, loop.run_dir, loop._sources = r.state, type("R", (), {"root": tmp_path / "run"})(), None
    assert set(loop._programs().values()) == {c.id for c in judged}


def test_the_search_verifies_without_the_sanitizer_and_the_final_with_it(monkeypatch, tmp_path):
    """The loop's Verifier runs compute-sanitizer only in the final verification (the gate a best
    must pass, with the next one in its place if it fails), and not there either when asked not to
    (a suite's --no-sanitizer)."""
    from stitchcuda.verifier import verification
    from stitchcuda.workflow import CannotJudge, JudgeOptions, VerifierJudge

    asked = []

    def fake_verify(program, reference, opts):
        asked.append((opts.sanitizer, opts.compile))
        raise verification.VerifyEnvironmentError("no GPU here")

    monkeypatch.setattr(verification, "verify_program", fake_verify)
    for judge, final in ((VerifierJudge("tf32"), False), (VerifierJudge("tf32"), True),
                         (VerifierJudge("tf32", JudgeOptions(sanitizer=False)), True)):
        with pytest.raises(CannotJudge, match="no GPU here"):
            judge.verify(None, tmp_path, final=final)
    assert asked == [(False, False), (True, True), (False, True)]
