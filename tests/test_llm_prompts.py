"""Prompt building (contract, sub-graph, feedback, API excerpts within a budget), the header
cutter behind the API excerpts, and code extraction from replies."""

from __future__ import annotations

import pytest

from stitchcuda.llm import (Attempt, CodeBlock, DecisionSpec, NoCode, api_entries, api_reference, code_prompt,
                            decision_prompt, estimate_tokens, extract_code)
from stitchcuda.llm.apiref import rank
from stitchcuda.paths import INCLUDE_DIR

CONTRACT = """\
st_status task_3_softmax(const float* x, float* out, void* stream)
  x    float32 [128, 4096] strides [4096, 1]  input, read only
  out  float32 [128, 4096] strides [4096, 1]  output, written whole, does not alias x
  stream: the cudaStream_t to launch on"""
SUBGRAPH = """\
%div_1 = aten.div.Tensor(%x, 2.0)                 # [128, 4096] float32
%softmax = aten._softmax.default(%div_1, -1, False)  # [128, 4096] float32"""
FN = "task_3_softmax"


def _names(excerpt):
    return {e.name for e in excerpt.entries}


# ---------------------------------------------------------------------------- headers


def test_headers_are_cut_into_documented_entries():
    entries = api_entries(INCLUDE_DIR)
    files = {e.file for e in entries}
    assert {"stitchrt/stitchrt.h", "stitchrt/program.h"} <= files
    assert {"stitch/reduce.cuh", "stitch/epilogue.cuh", "stitch/elementwise.cuh"} <= files
    by_name = {e.name: e for e in entries}
    gemm = by_name["st_gemm_args"].text
    assert "out[b] = alpha * op(A[b])" in gemm and "float alpha, beta;" in gemm     # comment + members
    assert "launch_softmax" in by_name and "out = softmax(pro(in))" in by_name["launch_softmax"].text
    layer_norm = by_name["launch_layer_norm"].text
    assert "rsqrt(var + eps)" in layer_norm and "launch_row_reduce<RowOp::LayerNorm>" not in layer_norm
    assert "row_reduce_kernel" not in by_name            # namespace detail is no API
    assert all(e.name != "ST_API" for e in entries)      # nor the export macro
    overviews = [e for e in entries if e.kind == "overview" and e.file == "stitch/reduce.cuh"]
    assert len(overviews) >= 2 and overviews[0].text.startswith("// reduce.cuh")


@pytest.mark.parametrize("query, expected", [
    (SUBGRAPH, "launch_softmax"),
    ("%addmm = aten.addmm.default(%b, %x, %w_t)", "st_gemm"),
    ("%ln = aten.native_layer_norm.default(%x, [768], %w, %b, 1e-05)", "launch_layer_norm"),
    ("%y = aten.gelu.default(%x)", "GeluErf"),
    ("%a = aten._scaled_dot_product_flash_attention.default(%q, %k, %v)", "launch_attention"),
])
def test_ranking_finds_the_entry_a_task_needs(query, expected):
    top = [e.name for _, e in rank(query, api_entries(INCLUDE_DIR))[:8]]
    assert expected in top, top


def test_api_reference_keeps_to_its_budget_and_takes_the_macro_behind_an_entry():
    for budget in (0, 50, 300, 1000, 4000):
        ex = api_reference({SUBGRAPH: 2.0, CONTRACT: 1.0}, budget)
        assert ex.tokens <= budget and estimate_tokens(ex.text) == ex.tokens
    ex = api_reference({SUBGRAPH: 2.0, CONTRACT: 1.0}, 1000)
    assert "launch_softmax" in _names(ex) and "STITCH_ROW_ENTRY" in _names(ex)
    assert "#define STITCH_ROW_ENTRY" in ex.text and "// ---- stitch/reduce.cuh" in ex.text
    assert api_reference("zzz qqq", 1000).entries == ()
    gelu = api_reference("%gelu = aten.gelu.default(%x)", 1000)
    assert {"GeluErf", "EwUnary", "launch_elementwise", "EwLayout"} <= _names(gelu)   # EwLayout: a need
    assert "launch_softmax" not in _names(gelu)                                          # below the floor


# ---------------------------------------------------------------------------- code prompts


def test_code_prompt_carries_contract_subgraph_feedback_api_and_rules():
    attempts = [Attempt("void old1() {}", "build failed: 'launch_sofmax' was not declared"),
                Attempt("__global__ void k() {}\nst_status task_3_softmax(...) {}",
                        "wrong: max abs error 0.31 at out[0, 17] (tolerance 1e-4)")]
    p = code_prompt(FN, CONTRACT, SUBGRAPH, attempts=attempts, budget_tokens=4000, api_budget_tokens=1200)
    user = p.user
    assert CONTRACT in user and SUBGRAPH in user
    assert "launch_sofmax" in user and "max abs error 0.31" in user
    assert user.index("Attempt 1") < user.index("Attempt 2")
    assert "Code of attempt 2" in user and "__global__ void k() {}" in user
    assert "void old1() {}" not in user                       # only the newest code
    assert "launch_softmax" in user and "Runtime API reference" in user
    assert f"defines the function `{FN}`" in user and "```cuda" in user and "No PyTorch" in user
    assert "CUDA" in p.system and estimate_tokens(p.system + user) <= 4000 + 64
    assert p.opening == "```cuda\n" and extract_code(p.opening + f"void {FN}() {{}}\n```", FN).code  # a primed reply parses


def test_a_request_is_sent_and_read_back_one_way_for_every_backend():
    """The llama.cpp client and the RL policy both send a request through these: a chat model
    gets one user turn without the opening; a plain model continues the text and the opening, and
    the reply read back starts with the opening."""
    from stitchcuda.llm import Prompt

    p = Prompt("You write CUDA.", "Task: add.", "```cuda\n")
    assert p.user_turn() == "You write CUDA.\n\nTask: add."
    assert p.plain() == "You write CUDA.\n\nTask: add.\n```cuda\n"
    assert p.reply("void f() {}\n```") == "```cuda\nvoid f() {}\n```"
    bare = Prompt("S", "U")
    assert bare.plain() == bare.text() and bare.reply("x") == "x"


def test_code_prompt_api_excerpt_shrinks_to_the_budget():
    big = code_prompt(FN, CONTRACT, SUBGRAPH, budget_tokens=8000, api_budget_tokens=3000)
    small = code_prompt(FN, CONTRACT, SUBGRAPH, budget_tokens=900, api_budget_tokens=3000)
    assert estimate_tokens(small.system + small.user) <= 900 + 64
    assert len(small.user) < len(big.user) and CONTRACT in small.user and SUBGRAPH in small.user
    none = code_prompt(FN, CONTRACT, SUBGRAPH, budget_tokens=10)   # contract and rules stay regardless
    assert CONTRACT in none.user and "Runtime API reference" not in none.user


def test_code_prompt_drops_oldest_feedback_first():
    attempts = [Attempt("", f"feedback number {k} " + "x" * 400) for k in range(20)]
    p = code_prompt(FN, CONTRACT, SUBGRAPH, attempts=attempts, budget_tokens=1500, api_budget_tokens=0)
    assert "feedback number 19" in p.user and "feedback number 0 " not in p.user


def test_decision_prompt_lists_the_choices():
    spec = DecisionSpec.make(["addmm", "sum_1"], None, {"addmm": ["cublaslt", "split_gelu"]}, ["sum_of_gemm"])
    p = decision_prompt("graph text here", spec, plan="plan text", feedback=["task 2 wrong at tf32"])
    for s in ("graph text here", "plan text", "task 2 wrong at tf32", "addmm: cublaslt, split_gelu",
              "- sum_of_gemm", "fp32, tf32, bf16, fp16", '"precision": {}'):
        assert s in p.user, s
    assert "JSON" in p.system


# ---------------------------------------------------------------------------- extraction

GOOD = f"""Here is the kernel.

```cuda
__global__ void {FN}_kernel(const float* x, float* out) {{ }}

st_status {FN}(const float* x, float* out, void* stream) {{
  {FN}_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(x, out);
  return ST_OK;
}}
```
That is all."""


def test_extract_finds_the_defining_block():
    got = extract_code(GOOD, FN)
    assert isinstance(got, CodeBlock) and got.language == "cuda"
    assert got.code.startswith("__global__ void") and got.code.rstrip().endswith("}")
    assert "That is all" not in got.code and "```" not in got.code


@pytest.mark.parametrize("text, reason", [
    ("", "no_block"),
    ("I would use a softmax kernel.", "no_block"),
    ("```python\ndef task_3_softmax(x): pass\n```", "no_block"),
    ("```cuda\n```", "no_block"),                                                      # blank blocks
    ("```cuda\n```\n```\n  \n```\n```\n", "no_block"),
    ("```cuda\n", "no_block"),                                                          # opened, nothing in it
    ("```cuda\n__global__ void k(float* x) {\n  x[0] = 1;\n", "unterminated"),
    ("```cuda\n__global__ void helper() {}\n```", "missing_function"),
    (f"```cuda\nst_status {FN}(const float* x) {{\n  return ST_OK;\n", "partial_function"),  # cut
    (f"```cuda\nst_status {FN}(const float* x);\n```", "partial_function"),          # a declaration
    (f"```cuda\nvoid g() {{ {FN}(x); }}\n```", "partial_function"),                    # a call
    (f"```cuda\nst_status {FN}(int a) {{ }}\nst_status {FN}(int b) {{ }}\n```", "ambiguous"),
])
def test_replies_without_usable_code(text, reason):
    got = extract_code(text, FN)
    assert isinstance(got, NoCode) and got.reason == reason, got


def test_extract_accepts_other_fences_and_picks_the_defining_block():
    text = ("```json\n{}\n```\n~~~cpp\nint helper() { return 1; }\n~~~\n"
            f"```\nst_status {FN}(const float* x,\n    float* out, void* stream) {{ return ST_OK; }}\n```")
    got = extract_code(text, FN)
    assert isinstance(got, CodeBlock) and got.language == "cuda" and got.code.startswith("st_status")
