"""Planner decisions as JSON that a llama.cpp grammar keeps valid.

A decision is the planner's ``Constraints`` in JSON::

    {"precision": {"<node>": "fp32" | "tf32" | "bf16" | "fp16"},
     "unfuse":    ["<node>", ...],
     "strategy":  {"<node>": "<one of that node's options>"},
     "rewrites":  ["<rewrite>", ...]}

:func:`constraints_grammar` writes a GBNF grammar (llama.cpp's grammar language) in which every
node name, policy, strategy option and rewrite of the request is spelled out as a literal, so a
model sampling under it can only write a decision that :func:`parse_constraints` accepts. The
grammar also fixes the key order, the separators (``", "`` and ``": "``, no free whitespace)
and lists every name at most once, in the order given: the language is finite, its longest
sentence is :attr:`Grammar.max_chars` characters, so with ``max_tokens >= max_chars`` even a
model that rambles must close the JSON. With fewer tokens a reply can be cut short;
:func:`parse_constraints` then returns a :class:`DecisionFailure` with reason ``"truncated"``.

:func:`parse_constraints` also reads decisions that no grammar constrained (hand-written, or
from a model run without one): it takes the first JSON object in the text, fills absent keys
with empty values and checks every name against the request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping, Sequence

from .. import precision

FIELDS = ("precision", "unfuse", "strategy", "rewrites")


@dataclass(frozen=True)
class Grammar:
    """A GBNF grammar (root rule ``root``) and the length of the longest text it accepts."""

    text: str
    max_chars: int


@dataclass(frozen=True)
class DecisionSpec:
    """What a decision may name: the request's nodes, policies, strategy options and rewrites."""

    nodes: tuple[str, ...]
    policies: tuple[str, ...] = precision.NAMES
    strategies: tuple[tuple[str, tuple[str, ...]], ...] = ()   #: (node, options) pairs, in order
    rewrites: tuple[str, ...] = ()

    @classmethod
    def make(cls, nodes: Iterable[str], policies: Iterable[str] | None = None,
             strategies: Mapping[str, Sequence[str]] | None = None,
             rewrites: Iterable[str] = ()) -> "DecisionSpec":
        """Names deduplicated in order; nodes with no strategy option are dropped from
        ``strategies`` (there is nothing to choose)."""
        pols = tuple(dict.fromkeys(policies)) if policies is not None else precision.NAMES
        strat = tuple((str(n), tuple(dict.fromkeys(map(str, opts))))
                      for n, opts in (strategies or {}).items() if len(opts) > 0)
        spec = cls(tuple(dict.fromkeys(map(str, nodes))), tuple(map(str, pols)), strat,
                   tuple(dict.fromkeys(map(str, rewrites))))
        if not spec.policies:
            raise ValueError("a decision needs at least one precision policy")
        return spec

    @property
    def strategy_options(self) -> dict[str, tuple[str, ...]]:
        return dict(self.strategies)

    def grammar(self) -> Grammar:
        return _build_grammar(self)

    def to_json(self) -> dict:
        return {"nodes": list(self.nodes), "policies": list(self.policies),
                "strategies": {n: list(o) for n, o in self.strategies}, "rewrites": list(self.rewrites)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "DecisionSpec":
        return cls.make(d.get("nodes", ()), d.get("policies"), d.get("strategies"), d.get("rewrites", ()))


@dataclass(frozen=True)
class DecisionFailure:
    """A reply that is not a usable decision.

    reason: ``"empty"`` (no text), ``"truncated"`` (the JSON stops before it closes: the reply hit
    max tokens), ``"not_json"`` (no JSON object in it), ``"invalid"`` (JSON, but a name, value or
    shape the request does not allow; ``detail`` says which).
    """

    reason: Literal["empty", "truncated", "not_json", "invalid"]
    detail: str
    text: str = field(repr=False, default="")

    def __str__(self) -> str:
        return f"unusable decision ({self.reason}): {self.detail}"


def constraints_grammar(nodes: Iterable[str], policies: Iterable[str] | None = None,
                        strategies: Mapping[str, Sequence[str]] | None = None,
                        rewrites: Iterable[str] = ()) -> Grammar:
    """The GBNF grammar of decisions over these names (``policies`` default: every policy)."""
    return DecisionSpec.make(nodes, policies, strategies, rewrites).grammar()


# ---------------------------------------------------------------------------- grammar


def _lit(text: str) -> str:
    """A GBNF string literal matching ``text`` exactly."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _js(name: str) -> str:
    """``name`` as JSON writes it (quoted, escaped, ASCII)."""
    return json.dumps(name)


def _subset_rules(prefix: str, items: Sequence[tuple[str, int]]) -> tuple[list[str], int]:
    """Rules for a comma-separated, ordered subset (each at most once) of ``items``.

    ``items`` are (GBNF expression, longest length). ``prefix-0`` matches a non-empty subset:
    ``s-i ::= item-i (", " s-(i+1))? | s-(i+1)``. Returns the rules and the longest match.
    """
    n = len(items)
    rules = []
    for i, (expr, _) in enumerate(items):
        if i == n - 1:
            rules.append(f"{prefix}-{i} ::= {expr}")
        else:
            rules.append(f'{prefix}-{i} ::= {expr} (", " {prefix}-{i + 1})? | {prefix}-{i + 1}')
    longest = sum(m for _, m in items) + 2 * max(n - 1, 0)
    return rules, longest


def _container(prefix: str, open_: str, close: str, items: Sequence[tuple[str, int]]) -> tuple[list[str], int]:
    if not items:
        return [f"{prefix} ::= {_lit(open_ + close)}"], 2
    rules, longest = _subset_rules(prefix, items)
    return [f"{prefix} ::= {_lit(open_)} {prefix}-0? {_lit(close)}"] + rules, longest + 2


def _alternatives(values: Sequence[str]) -> tuple[str, int]:
    """A GBNF group matching any one of ``values`` as a JSON string."""
    lits = [_lit(_js(v)) for v in values]
    return "(" + " | ".join(lits) + ")", max(len(_js(v)) for v in values)


def _build_grammar(spec: DecisionSpec) -> Grammar:
    policy_expr, policy_len = _alternatives(spec.policies)
    rules = [f"policy ::= {policy_expr}"]
    prec, prec_len = _container(
        "prec", "{", "}", [(f"{_lit(_js(n) + ': ')} policy", len(_js(n)) + 2 + policy_len) for n in spec.nodes])
    unf, unf_len = _container("unfuse", "[", "]", [(_lit(_js(n)), len(_js(n))) for n in spec.nodes])
    strat_items = []
    for n, opts in spec.strategies:
        expr, m = _alternatives(opts)
        strat_items.append((f"{_lit(_js(n) + ': ')} {expr}", len(_js(n)) + 2 + m))
    strat, strat_len = _container("strat", "{", "}", strat_items)
    rw, rw_len = _container("rw", "[", "]", [(_lit(_js(r)), len(_js(r))) for r in spec.rewrites])
    heads = [_js(f) + ": " for f in FIELDS]
    root = (f'root ::= {_lit("{" + heads[0])} prec {_lit(", " + heads[1])} unfuse '
            f'{_lit(", " + heads[2])} strat {_lit(", " + heads[3])} rw {_lit("}")}')
    fixed = 2 + sum(len(h) for h in heads) + 2 * 3
    text = "\n".join([root] + prec + unf + strat + rw + rules) + "\n"
    return Grammar(text, fixed + prec_len + unf_len + strat_len + rw_len)


# ---------------------------------------------------------------------------- parsing


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict[str, Any] = {}
    for k, v in pairs:
        if k in seen:
            raise _Duplicate(k)
        seen[k] = v
    return seen


def _first_object(text: str) -> Any:
    """The JSON value starting at the first ``{``; trailing text is ignored."""
    start = text.find("{")
    if start < 0:
        raise json.JSONDecodeError("no JSON object", text, 0)
    return json.JSONDecoder(object_pairs_hook=_no_duplicates).raw_decode(text, start)[0]


def parse_constraints(text: str, spec: DecisionSpec) -> dict | DecisionFailure:
    """The decision in ``text`` as a plain dict with all four keys, or why there is none.

    The dict always satisfies ``spec``: precision keys are nodes and values policies, unfuse
    lists nodes, strategy keys are nodes with options and values one of their options, rewrites
    lists rewrite names; no name twice. Absent keys become empty.
    """
    body = text.strip()
    if not body:
        return DecisionFailure("empty", "the reply is empty", text)
    try:
        value = _first_object(body)
    except _Duplicate as e:
        return DecisionFailure("invalid", f"key {e} appears twice in one object", text)
    except json.JSONDecodeError as e:
        # Cut short: the parser ran off the end, or a string never closes (its error points
        # at the opening quote, not the end).
        if "{" in body and (e.pos >= len(body) or e.msg.startswith("Unterminated string")):
            return DecisionFailure("truncated", f"the JSON ends before it closes ({e.msg})", text)
        return DecisionFailure("not_json", f"{e.msg} at character {e.pos}", text)
    problem = _check(value, spec)
    if problem:
        return DecisionFailure("invalid", problem, text)
    return {
        "precision": dict(value.get("precision", {})),
        "unfuse": list(value.get("unfuse", [])),
        "strategy": dict(value.get("strategy", {})),
        "rewrites": list(value.get("rewrites", [])),
    }


def _check(value: Any, spec: DecisionSpec) -> str | None:
    """The first way ``value`` breaks ``spec``, or None."""
    if not isinstance(value, dict):
        return f"the decision is a {type(value).__name__}, not an object"
    extra = [k for k in value if k not in FIELDS]
    if extra:
        return f"unknown key {extra[0]!r} (allowed: {', '.join(FIELDS)})"
    nodes, policies, options = set(spec.nodes), set(spec.policies), spec.strategy_options

    prec = value.get("precision", {})
    if not isinstance(prec, dict):
        return "precision must be an object"
    for n, p in prec.items():
        if n not in nodes:
            return f"precision names unknown node {n!r}"
        if p not in policies:
            return f"precision of {n!r} is {p!r}, not one of {', '.join(spec.policies)}"

    for key, allowed, what in (("unfuse", nodes, "node"), ("rewrites", set(spec.rewrites), "rewrite")):
        items = value.get(key, [])
        if not isinstance(items, list):
            return f"{key} must be a list"
        for x in items:
            if not isinstance(x, str) or x not in allowed:
                return f"{key} names unknown {what} {x!r}"
        if len(set(items)) != len(items):
            return f"{key} names a {what} twice"

    strat = value.get("strategy", {})
    if not isinstance(strat, dict):
        return "strategy must be an object"
    for n, s in strat.items():
        if n not in options:
            return f"strategy names node {n!r}, which has no strategy options"
        if s not in options[n]:
            return f"strategy of {n!r} is {s!r}, not one of {', '.join(options[n])}"
    return None


__all__ = ["FIELDS", "Grammar", "DecisionSpec", "DecisionFailure", "constraints_grammar", "parse_constraints"]
