"""Claims: the protos a pass has made so far and which proto claimed each node.

Takes a :class:`~.graph.GraphIndex` and (optionally) the previous pass's result; gives the
builder *match* and *fuse* add protos to, with the queries both need (is a node still free,
which elementwise nodes can join a group, a task's readable name). A pass ends by turning its
builder into a frozen :class:`~.protos.Fused`.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .. import ops
from ..ir import Node
from .constraints import Constraints
from .graph import GraphIndex
from .protos import AnyProto, Fused
from .specs import PlanError


class Claims:
    def __init__(self, index: GraphIndex, policy: str, constraints: Constraints, prev: Fused | None = None):
        self.ix = index
        self.policy = policy
        self.constraints = constraints
        self.unfuse = frozenset(constraints.unfuse)
        self.protos: list[AnyProto] = list(prev.protos) if prev else []
        self.claimed: dict[str, int] = dict(prev.claimed) if prev else {}
        self.keep_f32: set[str] = set(prev.keep_f32) if prev else set()
        self.notes: list[str] = list(prev.notes) if prev else []

    # ------------------------------------------------------------------ claiming

    def free(self, node: Node) -> bool:
        return node.name not in self.claimed

    def claim(self, proto: AnyProto, nodes: Iterable[str] | None = None) -> int:
        """Add ``proto``; the nodes it covers (or ``nodes``) are claimed by it."""
        idx = len(self.protos)
        self.protos.append(proto)
        for n in (proto.nodes if nodes is None else nodes):
            if n in self.ix.nodes:
                self.claimed[n] = idx
        return idx

    def fail(self, node: Node, why: str) -> PlanError:
        return PlanError(self.ix.name, [(node.op, node.name, node.source, why)])

    def policy_of(self, nodes: Iterable[str]) -> str:
        """The policy a task covering ``nodes`` computes at (constraints may raise it)."""
        return self.constraints.policy_of(self.ix.expand(nodes), self.policy)

    def absorbs_unfused(self, nodes: Iterable[str], anchor: str | None = None) -> bool:
        """Whether a fused task over ``nodes`` would absorb a node the constraints keep apart."""
        return any(n in self.unfuse and n != anchor for n in self.ix.expand(nodes))

    # ------------------------------------------------------------------ elementwise groups

    def pull_ew_group(self, root: Node, outside_ok: set[str], limit: int) -> list[str]:
        """Elementwise nodes feeding ``root`` that no one else needs, root included, in order.
        ``outside_ok``: node names whose use of a tensor does not count as another user."""
        ix = self.ix
        members = {root.name}
        order = [root]
        changed = True
        while changed:
            changed = False
            for m in list(order):
                if m.name in self.unfuse:
                    continue  # a node kept apart starts its group: nothing before it joins
                for t in dict.fromkeys(m.inputs):
                    p = ix.producer.get(t)
                    if p is None or p.name in members or ops.kind(p.op) != "elementwise" or not self.free(p):
                        continue
                    if t in ix.graph_outputs or len(p.outputs) != 1:
                        continue
                    if not all(u.name in members or u.name in outside_ok for u in ix.users[t]):
                        continue
                    trial = members | {p.name}
                    if len(self.leaves(trial)) > limit:
                        continue
                    members.add(p.name)
                    order.append(p)
                    changed = True
        return sorted(members, key=lambda nm: ix.pos[nm])

    def leaves(self, members: set[str]) -> list[str]:
        ix = self.ix
        produced = {o.name for m in members for o in ix.nodes[m].outputs}
        leaves = []
        for m in sorted(members, key=lambda nm: ix.pos[nm]):
            for t in ix.nodes[m].inputs:
                if t not in produced and t not in leaves:
                    leaves.append(t)
        return leaves

    def name(self, nodes: Sequence[str]) -> str:
        """A task's name: its (reference) compute nodes, or the first and last of many."""
        ix = self.ix
        compute = [x for x in nodes if x in ix.nodes and ops.kind(ix.nodes[x].op) != "view"] or list(nodes)
        compute = list(dict.fromkeys(ix.expand(compute)))
        if len(compute) <= 3:
            return "_".join(compute)
        return f"{compute[0]}__{compute[-1]}"

    # ------------------------------------------------------------------ result

    def result(self, node_policy: dict[str, str] | None = None) -> Fused:
        return Fused(self.ix, tuple(self.protos), dict(self.claimed), frozenset(self.keep_f32),
                     tuple(dict.fromkeys(self.notes)), self.policy, dict(node_policy or {}))


__all__ = ["Claims"]
