"""Claims: the context the kinds' claim rules work in, while *match* and *fuse* run.

Takes a :class:`~.graph.GraphIndex`, the policy, the constraints, the ceilings and (optionally)
the previous pass's result; gives the builder the claim rules (:class:`stitchcuda.kinds.ClaimRule`)
add protos to, with the queries they need (is a node still free, the unary hooks around a node,
which elementwise nodes can join a group, a task's readable name, the policy a task computes
at). A pass ends by turning its builder into a frozen :class:`~.fused.Fused`; the builder never
leaves the pass.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .. import ops
from ..device import Ceilings
from ..ir import Node
from ..kinds import AnyProto
from ..precision import get as get_policy
from .constraints import Constraints
from .fused import Fused
from .graph import GraphIndex
from .specs import PlanError

A = ops.A


class Claims:
    def __init__(self, index: GraphIndex, policy: str, constraints: Constraints, ceil: Ceilings,
                 prev: Fused | None = None):
        self.ix = index
        self.policy = policy
        self.storage = get_policy(policy).storage
        self.ceil = ceil
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

    def used(self, t: str) -> bool:
        """Whether someone reads tensor ``t`` (a node, or the caller as a graph output)."""
        return bool(self.ix.users.get(t)) or t in self.ix.graph_outputs

    # ------------------------------------------------------------------ hooks and elementwise groups

    def hooks(self, n: Node, x: str, out: str) -> tuple[list[str], str, list[str], str]:
        """The unary elementwise nodes right before ``n`` on its input ``x`` (its prologue hook,
        in order) and right after its output ``out`` (its epilogue hook): (prologue node names,
        the tensor the prologue reads, epilogue node names, the tensor the epilogue writes)."""
        ix = self.ix
        pro: list[Node] = []
        t = x
        if n.name not in self.unfuse:
            while True:
                p = ix.producer.get(t)
                if p is None or not self.free(p) or not self.hookable(p) or ix.only_user(t) is None:
                    break
                pro.append(p)
                t = p.inputs[0]
        pro.reverse()
        x = t if pro else x
        epi: list[str] = []
        t = out
        while True:
            u = ix.only_user(t)
            if u is None or not self.free(u) or not self.hookable(u):
                break
            epi.append(u.name)
            t = u.outputs[0].name
        return [p.name for p in pro], x, epi, t

    def hookable(self, node: Node) -> bool:
        """An elementwise node with exactly one tensor operand and a float result."""
        if ops.kind(node.op) != "elementwise" or node.op in (A + "where.self", A + "scalar_tensor.default",
                                                             A + "full.default"):
            return False
        if node.op.startswith("stitch.") or len(node.inputs) != 1 or node.name in self.unfuse:
            return False
        out = node.outputs[0]
        if out.dtype != "float32" or self.ix.spec(node.inputs[0]).dtype != "float32":
            return False
        return self.ix.shape(node.inputs[0]) == out.shape

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
