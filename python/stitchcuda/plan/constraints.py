"""Constraints: what a caller (the loop's *replan*, a user, an LLM's decision) asks of ``plan()``.

Everything is keyed by **reference node names** (the captured graph's, as plans and reports print
them), never by task names, which change from plan to plan:

``precision``  node -> policy name: every task covering the node computes at that policy (the
               precision repair raises only the guilty tasks to ``fp32``). Under the 16-bit
               policies raising a node to fp32 also keeps its results in float32 storage.
``unfuse``     nodes that start a task of their own: no GEMM epilogue chain, reduction hook,
               elementwise group or attention pattern absorbs them from the task before.
``strategy``   node -> one of the options :func:`strategy_options` lists for that node
               (e.g. attention ``fused`` / ``unfused``, a row reduction ``single`` / ``split``).
``rewrites``   names of exact algebraic rewrites (:mod:`.rewrite`) to apply to the graph first.

A constraint that names a node the graph does not have, or an option the node does not offer,
is refused with :class:`ConstraintError` naming it: a replan never silently ignores its input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..precision import NAMES, stricter


class ConstraintError(ValueError):
    """A constraint that names what the graph does not have, or an option it does not offer."""


@dataclass(frozen=True)
class Constraints:
    precision: tuple[tuple[str, str], ...] = ()
    unfuse: tuple[str, ...] = ()
    strategy: tuple[tuple[str, str], ...] = ()
    rewrites: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", tuple(sorted((str(n), str(p)) for n, p in dict(self.precision).items())))
        object.__setattr__(self, "unfuse", tuple(sorted(set(map(str, self.unfuse)))))
        object.__setattr__(self, "strategy", tuple(sorted((str(n), str(s)) for n, s in dict(self.strategy).items())))
        object.__setattr__(self, "rewrites", tuple(dict.fromkeys(map(str, self.rewrites))))

    @classmethod
    def of(cls, precision: Mapping[str, str] | None = None, unfuse: Any = (), strategy: Mapping[str, str] | None = None,
           rewrites: Any = ()) -> "Constraints":
        return cls(tuple((precision or {}).items()), tuple(unfuse), tuple((strategy or {}).items()), tuple(rewrites))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Constraints":
        """From the JSON shape ``{"precision": {...}, "unfuse": [...], "strategy": {...}, "rewrites": [...]}``."""
        return cls.of(d.get("precision"), d.get("unfuse", ()), d.get("strategy"), d.get("rewrites", ()))

    def to_dict(self) -> dict[str, Any]:
        return {"precision": dict(self.precision), "unfuse": list(self.unfuse), "strategy": dict(self.strategy),
                "rewrites": list(self.rewrites)}

    def merge(self, other: "Constraints") -> "Constraints":
        """These constraints with ``other``'s added (``other`` wins where both name a node)."""
        return Constraints.of({**dict(self.precision), **dict(other.precision)}, self.unfuse + other.unfuse,
                              {**dict(self.strategy), **dict(other.strategy)}, self.rewrites + other.rewrites)

    def __bool__(self) -> bool:
        return bool(self.precision or self.unfuse or self.strategy or self.rewrites)

    def policy_of(self, nodes: Any, default: str) -> str:
        """The policy of a task covering ``nodes``: the highest precision any of them asks for."""
        asked = dict(self.precision)
        best = default
        for n in nodes:
            p = asked.get(n)
            if p is not None:
                best = stricter(p, best).name
        return best

    def option(self, node: str, default: str) -> str:
        return dict(self.strategy).get(node, default)


#: Strategy options per kind of node the planner decides something about, default first.
STRATEGIES: dict[str, tuple[str, ...]] = {
    # split_tf32: an fp32 attention's products as three TF32 products each (fused; measured by the loop)
    "attention": ("auto", "fused", "unfused", "split_tf32"),
    "row": ("auto", "single", "split"),
    "conv": ("auto", "channels_first", "channels_last"),
    # a convolution kinds/narrow_conv.py can take: cuDNN's options, or that kernel (measured by the loop)
    "narrow_conv": ("auto", "channels_first", "channels_last", "narrow"),
    # a group norm kinds/norm_stream.py can take: its statistics task (auto) or that kernel (measured by the loop)
    "norm": ("auto", "stream"),
    # a GEMM raised to fp32 in a TF32 program: three bf16 products (auto) or three TF32 products
    "gemm": ("auto", "bf16x3", "tf32x3"),
}


@dataclass(frozen=True)
class Choices:
    """What a caller may constrain for one graph: node names, the options per node, rewrites."""

    nodes: tuple[str, ...]
    strategies: tuple[tuple[str, tuple[str, ...]], ...] = ()
    rewrites: tuple[str, ...] = ()
    policies: tuple[str, ...] = field(default=NAMES)

    def check(self, c: Constraints) -> None:
        known = set(self.nodes)
        opts = dict(self.strategies)
        bad = [f"precision: no node {n!r}" for n, _ in c.precision if n not in known]
        bad += [f"precision: {n}: no policy {p!r}" for n, p in c.precision if p not in self.policies]
        bad += [f"unfuse: no node {n!r}" for n in c.unfuse if n not in known]
        bad += [f"strategy: {n!r} has no strategy choice" for n, _ in c.strategy if n not in opts]
        bad += [f"strategy: {n}: {s!r} is not one of {', '.join(opts[n])}" for n, s in c.strategy
                if n in opts and s not in opts[n]]
        bad += [f"rewrites: no rewrite {r!r} (known: {', '.join(self.rewrites) or 'none'})" for r in c.rewrites
                if r not in self.rewrites]
        if bad:
            raise ConstraintError("constraints do not fit the graph: " + "; ".join(bad))


__all__ = ["Constraints", "ConstraintError", "Choices", "STRATEGIES"]
