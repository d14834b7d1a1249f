"""Decisions sampled under the loop's decision grammar: the automaton takes exactly the grammar's
language (key order, separators, names in the request's order and at most once), and a tiny random
model sampling under it writes only decisions that parse."""

from __future__ import annotations

import pytest

from stitchcuda.llm import DecisionSpec, parse_constraints
from stitchcuda.rl.constrained import DecisionAutomaton

SPEC = DecisionSpec.make(["linear", "relu", "linear_1"], None, {"softmax": ["a", "b"]}, ["rw1"])
EMPTY = '{"precision": {}, "unfuse": [], "strategy": {}, "rewrites": []}'


@pytest.mark.parametrize("text", [
    EMPTY,
    '{"precision": {"linear": "fp32", "linear_1": "bf16"}, "unfuse": ["relu"], "strategy": {"softmax": "b"}, '
    '"rewrites": ["rw1"]}',
    '{"precision": {"relu": "tf32"}, "unfuse": ["linear", "relu", "linear_1"], "strategy": {}, "rewrites": []}',
])
def test_the_grammars_sentences_are_accepted(text):
    a = DecisionAutomaton(SPEC)
    assert a.accepting(a.run(text)) and isinstance(parse_constraints(text, SPEC), dict)
    assert not a.accepting(a.run(text[:-1])) and a.run(text[:-1])       # a prefix: alive, not complete


@pytest.mark.parametrize("text", [
    EMPTY.replace('"unfuse": []', '"unfuse": ["linear_1", "linear"]'),        # out of the request's order
    EMPTY.replace('"unfuse": []', '"unfuse": ["relu", "relu"]'),             # twice
    EMPTY.replace('"precision": {}', '"precision": {"nope": "fp32"}'),       # a name not asked about
    EMPTY.replace('"precision": {}', '"precision": {"relu": "fp64"}'),       # a policy that is none
    EMPTY.replace('"unfuse": []', '"unfuse": ["linear_1", ]'),               # a separator with nothing after
    EMPTY.replace(", ", ","),                                                # other separators
    '{"unfuse": [], "precision": {}, "strategy": {}, "rewrites": []}',       # other key order
    EMPTY + " ",                                                             # anything after it
])
def test_anything_else_is_refused(text):
    a = DecisionAutomaton(SPEC)
    assert not a.accepting(a.run(text))


def test_a_tiny_model_under_the_grammar_writes_only_valid_decisions():
    pytest.importorskip("transformers", reason="needs transformers (pip install 'stitchcuda[train]')")
    from stitchcuda.rl.dataset import Example
    from stitchcuda.rl.grpo import GRPOSettings, sample
    from stitchcuda.rl.model import tiny_policy

    pol = tiny_policy(seed=3)
    ex = Example("x", "plan", "r", "n", "fp32", "S", "U", spec=SPEC.to_json())
    ids = pol.tokenizer("decide:", add_special_tokens=True).input_ids
    texts = [pol.tokenizer.decode(c, skip_special_tokens=True)
             for c in sample(pol, ids, 12, GRPOSettings(max_new_tokens=8), ex)]
    decisions = [parse_constraints(t, SPEC) for t in texts]
    assert all(isinstance(d, dict) for d in decisions), texts
    assert len({str(d) for d in decisions}) > 1          # sampled, not one forced answer
    free = [pol.tokenizer.decode(c, skip_special_tokens=True)
            for c in sample(pol, ids, 4, GRPOSettings(max_new_tokens=8, grammar=False), ex)]
    assert not any(isinstance(parse_constraints(t, SPEC), dict) for t in free)
