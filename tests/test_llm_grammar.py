"""Decision grammars and parsing: hand-written replies, valid, invalid and cut short.

The grammar text is checked structurally here (every name enumerated, finite, fixed order); a
small matcher below walks the grammar's language to prove that every sentence it accepts
parses, and that its longest sentence is exactly ``max_chars``. llama.cpp itself compiles and
samples under these grammars in test_llm_model.py.
"""

from __future__ import annotations

import itertools
import json
import re

import pytest

from stitchcuda.llm import DecisionFailure, DecisionSpec, constraints_grammar, parse_constraints
from stitchcuda.llm.grammar import FIELDS

NODES = ["addmm", "gelu", "sum_1"]
STRATS = {"addmm": ["cublaslt", "cublaslt_split_gelu"], "sum_1": ["row_reduce"], "gelu": []}
REWRITES = ["sum_of_gemm"]
SPEC = DecisionSpec.make(NODES, None, STRATS, REWRITES)


def parse(text: str):
    return parse_constraints(text, SPEC)


# ---------------------------------------------------------------------------- the grammar's language


def _rules(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"^([\w-]+) ::= (.*)$", text, re.M)}


def _tokens(expr: str) -> list[str]:
    return re.findall(r'"(?:[^"\\]|\\.)*"|[\w-]+|[()|?]', expr)


def _unlit(tok: str) -> str:
    return re.sub(r"\\(.)", r"\1", tok[1:-1])


def _language(rules: dict[str, str], symbol: str) -> set[str]:
    """Every sentence a (finite, non-recursive-in-length) GBNF rule accepts; exhaustive, for
    small grammars. Supports literals, rule references, ( ... ), |, and ?."""

    def seq(toks: list[str]) -> set[str]:
        out = {""}
        i = 0
        while i < len(toks):
            t = toks[i]
            if t == "(":
                depth, j = 1, i + 1
                while depth:
                    depth += {"(": 1, ")": -1}.get(toks[j], 0)
                    j += 1
                inner = alt(toks[i + 1:j - 1])
                i = j
            elif t.startswith('"'):
                inner, i = {_unlit(t)}, i + 1
            else:
                inner, i = _language(rules, t), i + 1
            if i < len(toks) and toks[i] == "?":
                inner, i = inner | {""}, i + 1
            out = {a + b for a in out for b in inner}
        return out

    def alt(toks: list[str]) -> set[str]:
        groups, cur, depth = [], [], 0
        for t in toks:
            if t == "|" and depth == 0:
                groups.append(cur)
                cur = []
                continue
            depth += {"(": 1, ")": -1}.get(t, 0)
            cur.append(t)
        groups.append(cur)
        return set().union(*(seq(g) for g in groups))

    return alt(_tokens(rules[symbol]))


def test_grammar_enumerates_every_name_and_nothing_else():
    g = constraints_grammar(NODES, None, STRATS, REWRITES)
    for name in NODES + ["fp32", "tf32", "bf16", "fp16", "cublaslt", "cublaslt_split_gelu", "row_reduce",
                         "sum_of_gemm"] + list(FIELDS):
        assert f'\\"{name}\\"' in g.text, name
    assert "ws" not in _rules(g.text)           # no free whitespace: a model cannot pad forever
    assert g.text.startswith("root ::= ")


def test_every_sentence_of_the_grammar_parses_and_the_longest_is_max_chars():
    spec = DecisionSpec.make(["a", "b"], ["fp32", "bf16"], {"b": ["x", "y"]}, ["r"])
    g = spec.grammar()
    sentences = _language(_rules(g.text), "root")
    # precision: 1 + 2*2 + 2*2 = 9 subsets-with-values; unfuse 4; strategy 3; rewrites 2.
    assert len(sentences) == 9 * 4 * 3 * 2
    for s in sentences:
        d = parse_constraints(s, spec)
        assert isinstance(d, dict), (s, d)
        assert json.loads(s) == d
    assert max(map(len, sentences)) == g.max_chars


def test_names_that_need_escaping_stay_exact():
    odd = ['we"ird', "back\\slash", "tab\tname", "ünï"]
    spec = DecisionSpec.make(odd, ["fp32"], {}, [])
    sentences = _language(_rules(spec.grammar().text), "root")
    full = [s for s in sentences if all(json.dumps(n) in s for n in odd) and '"unfuse": []' in s]
    assert full
    d = parse_constraints(full[0], spec)
    assert isinstance(d, dict) and set(d["precision"]) == set(odd)


def test_empty_request_grammar_has_one_sentence():
    spec = DecisionSpec.make([], ["fp32"], {}, [])
    (only,) = _language(_rules(spec.grammar().text), "root")
    assert parse_constraints(only, spec) == {"precision": {}, "unfuse": [], "strategy": {}, "rewrites": []}


def test_nodes_without_options_are_not_strategy_keys():
    assert dict(SPEC.strategies) == {"addmm": ("cublaslt", "cublaslt_split_gelu"), "sum_1": ("row_reduce",)}
    assert isinstance(parse('{"strategy": {"gelu": "x"}}'), DecisionFailure)


def test_spec_round_trips_through_json():
    assert DecisionSpec.from_json(json.loads(json.dumps(SPEC.to_json()))) == SPEC


def test_a_spec_needs_a_policy():
    with pytest.raises(ValueError):
        DecisionSpec.make(NODES, [], {}, [])


# ---------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("text, expected", [
    ('{"precision": {"addmm": "fp32"}, "unfuse": ["gelu"], "strategy": {"addmm": "cublaslt"}, "rewrites": ["sum_of_gemm"]}',
     {"precision": {"addmm": "fp32"}, "unfuse": ["gelu"], "strategy": {"addmm": "cublaslt"}, "rewrites": ["sum_of_gemm"]}),
    ('{"precision": {}, "unfuse": [], "strategy": {}, "rewrites": []}',
     {"precision": {}, "unfuse": [], "strategy": {}, "rewrites": []}),
    ('{}', {"precision": {}, "unfuse": [], "strategy": {}, "rewrites": []}),
    ('Sure! Here it is:\n```json\n{"unfuse": ["sum_1", "addmm"]}\n```\nDone.',
     {"precision": {}, "unfuse": ["sum_1", "addmm"], "strategy": {}, "rewrites": []}),
    ('  {"rewrites": ["sum_of_gemm"], "precision": {"gelu": "bf16", "sum_1": "fp32"}}  ',
     {"precision": {"gelu": "bf16", "sum_1": "fp32"}, "unfuse": [], "strategy": {}, "rewrites": ["sum_of_gemm"]}),
])
def test_valid_decisions_parse_to_the_full_shape(text, expected):
    d = parse(text)
    assert d == expected
    assert list(d) == list(FIELDS)


@pytest.mark.parametrize("text, reason, words", [
    ("", "empty", "empty"),
    ("   \n ", "empty", "empty"),
    ("the plan looks fine", "not_json", "no JSON"),
    ('{"precision": {"addmm": fp32}}', "not_json", "Expecting value"),
    ('{"precision": {"addmm": "fp32"}', "truncated", "closes"),
    ('{"precision": {"addmm": "fp', "truncated", "closes"),
    ('{"precision": {"addmm": "fp32"}, "unfuse": [', "truncated", "closes"),
    ('{"precision": {"addmm": "fp32"}, ', "truncated", "closes"),
    ('{"precision": {"relu": "fp32"}}', "invalid", "unknown node 'relu'"),
    ('{"precision": {"addmm": "fp64"}}', "invalid", "'fp64'"),
    ('{"precision": ["addmm"]}', "invalid", "precision must be an object"),
    ('{"unfuse": "addmm"}', "invalid", "unfuse must be a list"),
    ('{"unfuse": ["addmm", "addmm"]}', "invalid", "twice"),
    ('{"unfuse": [3]}', "invalid", "unknown node 3"),
    ('{"strategy": {"addmm": "cutlass"}}', "invalid", "'cutlass'"),
    ('{"strategy": {"gelu": "cublaslt"}}', "invalid", "no strategy options"),
    ('{"rewrites": ["fold_everything"]}', "invalid", "unknown rewrite"),
    ('{"precision": {}, "fuse": []}', "invalid", "unknown key 'fuse'"),
    ('{"precision": {"addmm": "fp32", "addmm": "bf16"}}', "invalid", "twice"),
    ('{"precision": null}', "invalid", "precision must be an object"),
    ('{"strategy": []}', "invalid", "strategy must be an object"),
])
def test_bad_replies_are_typed_failures(text, reason, words):
    d = parse(text)
    assert isinstance(d, DecisionFailure), d
    assert d.reason == reason, d
    assert words in d.detail or words in str(d), d
    assert d.text == text


def test_every_prefix_of_a_valid_reply_is_truncated_or_empty():
    full = ('{"precision": {"addmm": "fp32", "sum_1": "bf16"}, "unfuse": ["gelu"], '
            '"strategy": {"addmm": "cublaslt_split_gelu"}, "rewrites": ["sum_of_gemm"]}')
    assert isinstance(parse(full), dict)
    for k in range(len(full)):
        d = parse(full[:k])
        assert isinstance(d, DecisionFailure)
        assert d.reason in ("empty", "truncated", "not_json"), (full[:k], d)
        if "{" in full[:k]:
            assert d.reason == "truncated", (full[:k], d)


def test_grammar_orders_are_all_accepted_by_the_parser():
    # Subsets of nodes in grammar order, every policy: the shapes a constrained model can write.
    for r in range(len(NODES) + 1):
        for subset in itertools.combinations(NODES, r):
            for pol in ("fp32", "fp16"):
                text = json.dumps({"precision": {n: pol for n in subset}, "unfuse": list(subset),
                                   "strategy": {}, "rewrites": []})
                assert isinstance(parse(text), dict), text
