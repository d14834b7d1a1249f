"""Planner decisions sampled under the decision grammar, as the loop samples them with llama.cpp.

The loop's decision grammar (:func:`stitchcuda.llm.grammar.constraints_grammar`) is a finite
language: ``{"precision": {...}, "unfuse": [...], "strategy": {...}, "rewrites": [...]}`` with the
keys in that order, ``", "`` and ``": "`` as separators, and each container an ordered subset
(every name at most once, in the request's order) of its items. :class:`DecisionAutomaton` is that
language as a nondeterministic automaton over characters, built from the same
:class:`~stitchcuda.llm.DecisionSpec`; :class:`TokenConstraint` walks a trie of the tokenizer's
token texts with it, so a sampler can be told which tokens keep the reply a prefix of some valid
decision (and, once the decision is complete, only the end-of-sequence token). With
``transformers``' ``generate(prefix_allowed_tokens_fn=...)`` every sampled decision parses.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from ..llm.grammar import FIELDS, DecisionSpec

State = tuple


class DecisionAutomaton:
    """The decision language of ``spec`` (see the module docstring).

    A state is (segment, position): segments alternate between literals (``'{"precision": '`` ...)
    and containers; a container position is ``("start",)`` (after its opening bracket),
    ``("item", group, alternative, offset)``, ``("after", group)`` or ``("sep", group, offset)``.
    """

    def __init__(self, spec: DecisionSpec):
        js = json.dumps
        groups = [
            [[f"{js(n)}: {js(p)}" for p in spec.policies] for n in spec.nodes],
            [[js(n)] for n in spec.nodes],
            [[f"{js(n)}: {js(o)}" for o in opts] for n, opts in spec.strategies],
            [[js(r)] for r in spec.rewrites],
        ]
        brackets = ["{}", "[]", "{}", "[]"]
        heads = [js(f) + ": " for f in FIELDS]
        self.segments: list[Any] = []
        for k in range(4):
            self.segments.append(("{" if k == 0 else ", ") + heads[k] + brackets[k][0])
            self.segments.append((groups[k], brackets[k][1]))
        self.segments.append("}")
        self.chars = frozenset("".join(s if isinstance(s, str) else s[1] + "".join(
            a for g in s[0] for a in g) for s in self.segments) + ", ")

    def start(self) -> frozenset:
        return frozenset({(0, 0)})

    def accepting(self, states: Iterable[State]) -> bool:
        return (len(self.segments), 0) in states

    def _closure(self, state: State) -> State:
        """The end of a literal is the start of what follows it (a container, or the end)."""
        seg, pos = state
        if seg < len(self.segments) and isinstance(self.segments[seg], str) and pos == len(self.segments[seg]):
            return (seg + 1, ("start",)) if seg + 1 < len(self.segments) else (seg + 1, 0)
        return state

    def step(self, states: Iterable[State], ch: str) -> frozenset:
        """The states after reading ``ch`` from any of ``states``."""
        out: set[State] = set()
        for seg, pos in states:
            if seg >= len(self.segments):
                continue
            s = self.segments[seg]
            if isinstance(s, str):
                if s[pos] == ch:
                    out.add(self._closure((seg, pos + 1)))
                continue
            groups, close = s
            kind = pos[0]
            if kind in ("start", "after") and ch == close:
                out.add((seg + 1, 0))                 # the literal after the container
            if kind == "start":
                out.update(self._begin(seg, groups, 0, ch))
            elif kind == "after" and ch == "," and pos[1] + 1 < len(groups):   # a later item exists
                out.add((seg, ("sep", pos[1])))
            elif kind == "sep" and ch == " ":
                out.add((seg, ("ready", pos[1])))
            elif kind == "ready":
                out.update(self._begin(seg, groups, pos[1] + 1, ch))
            elif kind == "item":
                _, g, a, off = pos
                text = groups[g][a]
                if text[off] == ch:
                    out.add((seg, ("after", g)) if off + 1 == len(text) else (seg, ("item", g, a, off + 1)))
        return frozenset(out)

    @staticmethod
    def _begin(seg: int, groups: list[list[str]], first: int, ch: str) -> list[State]:
        out = []
        for g in range(first, len(groups)):
            for a, text in enumerate(groups[g]):
                if text[0] == ch:
                    out.append((seg, ("after", g)) if len(text) == 1 else (seg, ("item", g, a, 1)))
        return out

    def run(self, text: str) -> frozenset:
        """The states after reading ``text`` from the start (empty: not a prefix of any decision)."""
        states = self.start()
        for ch in text:
            states = self.step(states, ch)
            if not states:
                break
        return states


_TEXTS: dict[int, list[str]] = {}


def token_texts(tokenizer: Any) -> list[str]:
    """Each token's text, decoded alone (once per tokenizer: a 262k vocabulary takes seconds)."""
    key = id(tokenizer)
    if key not in _TEXTS:
        _TEXTS[key] = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
    return _TEXTS[key]


def for_example(tokenizer: Any, spec_json: dict, _cache: dict = {}) -> "TokenConstraint":  # noqa: B006
    """The constraint of a plan example's request (kept per tokenizer and request)."""
    key = (id(tokenizer), json.dumps(spec_json, sort_keys=True))
    if key not in _cache:
        if len(_cache) > 256:
            _cache.clear()
        _cache[key] = TokenConstraint(tokenizer, DecisionSpec.from_json(spec_json))
    return _cache[key]


class TokenConstraint:
    """Which tokens of ``tokenizer`` may come next in a decision of ``spec``."""

    def __init__(self, tokenizer: Any, spec: DecisionSpec):
        self.auto = DecisionAutomaton(spec)
        self.tok = tokenizer
        self.eos = tokenizer.eos_token_id
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        texts = token_texts(tokenizer)
        self.trie: dict = {}
        for i, t in enumerate(texts):
            if i in special or not t or not set(t) <= self.auto.chars:
                continue
            node = self.trie
            for ch in t:
                node = node.setdefault(ch, {})
            node.setdefault(None, []).append(i)
        self._memo: dict[str, list[int]] = {}

    def allowed(self, generated: str) -> list[int]:
        """Token ids that keep ``generated`` a prefix of a decision; only EOS once it is one."""
        hit = self._memo.get(generated)
        if hit is not None:
            return hit
        states = self.auto.run(generated)
        if self.auto.accepting(states) or not states:
            out = [self.eos]          # complete (or already off the language: end it, the parser says why)
        else:
            out = []
            stack = [(self.trie, states)]
            while stack:
                node, st = stack.pop()
                for ch, child in node.items():
                    if ch is None:
                        continue
                    ns = self.auto.step(st, ch)
                    if ns:
                        out.extend(child.get(None, ()))
                        stack.append((child, ns))
            out = out or [self.eos]
        if len(self._memo) > 4096:
            self._memo.clear()
        self._memo[generated] = out
        return out

    def prefix_fn(self, prompt_len: int):
        """For ``generate(prefix_allowed_tokens_fn=...)``: ids of a row -> allowed next ids."""
        def fn(batch_id: int, ids: Any) -> list[int]:
            return self.allowed(self.tok.decode(ids[prompt_len:], skip_special_tokens=True))
        return fn


__all__ = ["DecisionAutomaton", "TokenConstraint", "token_texts", "for_example"]
