"""The captured graph, indexed for planning: producers, users, shapes, positions, constants.

Takes a :class:`~stitchcuda.ir.Graph`; gives :class:`GraphIndex`. The *match* pass may put
synthetic nodes in place of recognised patterns (a tanh-GELU written out becomes one
``gelu``; batch norm becomes statistics plus ``stitch.affine_channel``) and add tensors; it
then freezes the index, and every later pass only reads it. A synthetic node remembers which
reference nodes it stands for (:meth:`expand`), so tasks always name reference nodes.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Sequence

from ..ir import Graph, Node, TensorSpec


def scalar_attr(node: Node, key: str) -> float | None:
    """A numeric attribute of ``node`` as a float (bools as 0/1), or None."""
    return node.scalar(key)


class GraphIndex:
    """Read-mostly index over a graph; see the module docstring."""

    def __init__(self, graph: Graph):
        self.g = graph
        self.name = graph.name
        self.specs: dict[str, TensorSpec] = {s.name: s for s in graph.inputs + graph.weights}
        self.nodes: dict[str, Node] = {}
        self.gnodes: dict[str, Node] = {n.name: n for n in graph.nodes}
        self.producer: dict[str, Node] = {}
        self.users: dict[str, list[Node]] = defaultdict(list)
        self.pos: dict[str, float] = {}
        for i, n in enumerate(graph.nodes):
            self._add(n, float(i))
        self.inputs = frozenset(s.name for s in graph.inputs)
        self.weights = frozenset(s.name for s in graph.weights)
        self.graph_outputs = frozenset(graph.outputs)
        self.synthetic_cover: dict[str, list[str]] = {}
        const = set(self.weights)
        for n in graph.nodes:
            if all(i in const for i in n.inputs):
                const.update(o.name for o in n.outputs)
        #: Tensors computed from weights alone (their tasks can run once, at create).
        self.const = frozenset(const)
        self._frozen = False

    def _add(self, n: Node, pos: float) -> None:
        self.nodes[n.name] = n
        self.pos[n.name] = pos
        for o in n.outputs:
            self.specs[o.name] = o
            self.producer[o.name] = n
        for i in dict.fromkeys(n.inputs):
            self.users[i].append(n)

    def freeze(self) -> "GraphIndex":
        """No more rewriting: later passes read only."""
        self._frozen = True
        return self

    def _writable(self) -> None:
        if self._frozen:
            raise AssertionError(f"graph index of {self.name} is frozen: only the match pass rewrites it")

    # ------------------------------------------------------------------ queries

    def spec(self, t: str) -> TensorSpec:
        return self.specs[t]

    def shape(self, t: str) -> tuple[int, ...]:
        return self.specs[t].shape

    def args(self, node: Node, names: Sequence[str]) -> dict[str, tuple[str, Any] | None]:
        """Schema tensor arguments: name -> ("t", tensor) | ("s", scalar) | None (absent)."""
        out: dict[str, tuple[str, Any] | None] = {}
        pending = list(node.inputs)
        for nm in names:
            if node.has_attr(nm):
                v = node.attr(nm)
                out[nm] = None if v is None else ("s", v)
            elif pending:
                out[nm] = ("t", pending.pop(0))
            else:
                out[nm] = None
        return out

    def tensor_arg(self, node: Node, names: Sequence[str], key: str) -> str | None:
        a = self.args(node, names).get(key)
        return a[1] if a and a[0] == "t" else None

    def only_user(self, t: str) -> Node | None:
        """The one node reading ``t``, when ``t`` is not also a graph output."""
        us = self.users.get(t, [])
        if len(us) != 1 or t in self.graph_outputs:
            return None
        return us[0]

    def expand(self, names: Iterable[str]) -> list[str]:
        """Node names with each synthetic node replaced by the reference nodes it stands for."""
        out: list[str] = []
        for x in names:
            for y in self.synthetic_cover.get(x, [x]):
                if y not in out:
                    out.append(y)
        return out

    def where(self, node_name: str) -> str:
        n = self.nodes.get(node_name)
        return n.source if n is not None else ""

    def node(self, name: str) -> Node:
        return self.nodes.get(name) or self.gnodes[name]

    # ------------------------------------------------------------------ rewriting (match only)

    def replace_nodes(self, old: Sequence[Node], new: Node) -> None:
        """Put synthetic ``new`` (one output, a reference tensor) in place of the nodes ``old``."""
        self._writable()
        gone = {o.name for o in old}
        for o in old:
            del self.nodes[o.name]
            for t in o.inputs:
                self.users[t] = [u for u in self.users[t] if u.name not in gone]
        self.synthetic_cover[new.name] = sorted(gone, key=lambda nm: self.pos[nm])
        self.nodes[new.name] = new
        self.pos[new.name] = max(self.pos[nm] for nm in gone)
        self.producer[new.outputs[0].name] = new
        for t in dict.fromkeys(new.inputs):
            self.users[t].append(new)

    def insert_node(self, new: Node, covers: Sequence[str], pos: float, *, takes_from: str | None = None,
                    take_inputs: Sequence[str] = ()) -> None:
        """Add synthetic ``new`` (standing for ``covers``) at position ``pos``; for each tensor in
        ``take_inputs`` it replaces node ``takes_from`` among that tensor's users."""
        self._writable()
        self.synthetic_cover[new.name] = list(covers)
        self.nodes[new.name] = new
        self.pos[new.name] = pos
        for o in new.outputs:
            self.producer[o.name] = new
        for t in take_inputs:
            self.users[t] = [u for u in self.users[t] if u.name != takes_from]
        for i in dict.fromkeys(new.inputs):
            if new not in self.users[i]:
                self.users[i].append(new)

    def add_tensor(self, name: str, shape: Sequence[int], dtype: str) -> str:
        """A new tensor name (suffixed until unique) with this shape and dtype."""
        base, k = name, 1
        while name in self.specs:
            name, k = f"{base}_{k}", k + 1
        self.specs[name] = TensorSpec(name, tuple(shape), dtype)
        return name


__all__ = ["GraphIndex", "scalar_attr"]
