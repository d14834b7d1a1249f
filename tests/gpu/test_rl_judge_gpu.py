"""The RL judge on the device: an honest body is correct and timed against the template's body; a body
that writes its input is a hard penalty; one that reads out of bounds is a crash, never the end of
the run; a decision is verified as a whole program at ``level="program"``."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitchcuda.rl.reward import PENALTIES, score

REPO = Path(__file__).resolve().parents[2]
BODY = (REPO / "tests" / "fixtures" / "bodies" / "mlp_linear_2_naive.cu").read_text()


@pytest.fixture(scope="module")
def mlp():
    from stitchcuda.rl.dataset import capture, examples_from_reference, iter_references

    entry = next(iter_references([REPO / "models" / "mlp.py"]))
    exs = examples_from_reference(capture(entry))
    return entry, next(e for e in exs if e.kind == "body" and e.task == "linear_2"), \
        next(e for e in exs if e.kind == "plan")


@pytest.mark.gpu
def test_bodies_on_the_device(mlp):
    from stitchcuda.rl.judge import JudgeSettings, RewardJudge

    entry, ex, _ = mlp
    judge = RewardJudge({entry.id: entry}, JudgeSettings(device="cuda", workers=3))
    writes_input = BODY.replace("out[i * 256 + j] = acc + bias[j];",
                                "out[i * 256 + j] = acc + bias[j];\n  if (j == 0) ((float*)a)[i] = 0.f;")
    out_of_bounds = BODY.replace("a[i * 1024 + k]", "a[i * 1024 + k + (1 << 28)]")
    ok, cheat, crash = judge.judge_many([(ex, f"```cuda\n{b}```") for b in (BODY, writes_input, out_of_bounds)])
    assert ok.correct and ok.ran and ok.speedup is not None and ok.speedup > 0, ok
    r = score(ok)
    assert r.components["correct"] == 1.0 and "speed" in r.components
    assert score(cheat).penalties == ("task-input-write",) and score(cheat).total == PENALTIES["task-input-write"], cheat
    assert crash.ran and not crash.correct, crash         # an illegal address, as a rule; never a pass
    assert score(crash).total < score(ok).total


@pytest.mark.gpu
def test_a_decision_verified_as_a_program(mlp):
    from stitchcuda.rl.judge import JudgeSettings, RewardJudge

    entry, _, ex = mlp
    judge = RewardJudge({entry.id: entry}, JudgeSettings(device="cuda", level="program", workers=1))
    o = judge.judge(ex, '{"precision": {}, "unfuse": [], "strategy": {}, "rewrites": []}')
    assert o.correct and o.speedup is not None and "Verifier" in o.speed_basis, o
