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
        """The elementwise nodes right before ``n`` on its input ``x`` (its prologue hook) and right
        after its output ``out`` (its epilogue hook): (prologue node names, the tensor the prologue
        reads, epilogue node names, the tensor the epilogue writes). A hook is a function of one
        tensor: its nodes may take several operands (hardswish's ``x * clamp(x + 3, 0, 6)``, mish's
        ``x * tanh(softplus(x))``) so long as every operand comes from the hook or its one source."""
        pro, src = self.prologue(n, x)
        epi, last = self._epilogue(out)
        return pro, src, epi, last

    def prologue(self, n: Node, x: str) -> tuple[list[str], str]:
        """The prologue hook of :meth:`hooks` alone: (its node names, the tensor it reads)."""
        return self._prologue(x) if n.name not in self.unfuse else ([], x)

    def _hook_node(self, node: Node | None, shape: tuple[int, ...]) -> bool:
        """A node a hook may take: free, elementwise, not kept apart, one result computed from
        tensors, every one of them (and the result) of ``shape``."""
        if node is None or ops.kind(node.op) != "elementwise" or node.op.startswith("stitch.") or \
                node.name in self.unfuse or not self.free(node) or len(node.outputs) != 1 or not node.inputs:
            return False
        return all(tuple(self.ix.shape(t)) == shape for t in [*node.inputs, node.outputs[0].name])

    def _sources(self, members: Sequence[Node]) -> list[str]:
        """The tensors ``members`` read that none of them produces."""
        made = {m.outputs[0].name for m in members}
        return list(dict.fromkeys(t for m in members for t in m.inputs if t not in made))

    def _prologue(self, x: str) -> tuple[list[str], str]:
        """The largest hook before a reader of ``x``: grown back from ``x``'s producer through every
        node whose users are all in the hook, then cut to the longest prefix with one float source."""
        ix = self.ix
        shape = tuple(ix.shape(x))
        p0 = ix.producer.get(x)
        if ix.only_user(x) is None or ix.spec(x).dtype != "float32" or not self._hook_node(p0, shape):
            return [], x
        order, members = [p0], {p0.name}
        grew = True
        while grew:
            grew = False
            for m in list(order):
                for t in dict.fromkeys(m.inputs):
                    p = ix.producer.get(t)
                    if p is not None and p.name not in members and self._hook_node(p, shape) and \
                            t not in ix.graph_outputs and all(u.name in members for u in ix.users[t]):
                        order.append(p)
                        members.add(p.name)
                        grew = True
        for k in range(len(order), 0, -1):  # every prefix keeps its members' users inside it
            src = self._sources(order[:k])
            if len(src) == 1 and ix.spec(src[0]).dtype == "float32":
                return sorted((m.name for m in order[:k]), key=lambda nm: ix.pos[nm]), src[0]
        return [], x

    def _epilogue(self, out: str) -> tuple[list[str], str]:
        """The largest hook after a writer of ``out``: grown forward through every node that reads
        only ``out`` and the hook, then cut to the longest prefix that reads all of ``out``'s uses
        and has one result used outside it."""
        ix = self.ix
        shape = tuple(ix.shape(out))
        if out in ix.graph_outputs or not ix.users.get(out) or ix.spec(out).dtype != "float32":
            return [], out
        order: list[Node] = []
        members: set[str] = set()
        grew = True
        while grew:
            grew = False
            for t in [out] + [m.outputs[0].name for m in order]:
                for u in ix.users.get(t, []):
                    if u.name not in members and self._hook_node(u, shape) and \
                            all(a == out or (ix.producer.get(a) is not None and ix.producer[a].name in members)
                                for a in u.inputs):
                        order.append(u)
                        members.add(u.name)
                        grew = True
        for k in range(len(order), 0, -1):
            sink = self._epilogue_sink(order[:k], out)
            if sink is not None:
                return sorted((m.name for m in order[:k]), key=lambda nm: ix.pos[nm]), sink
        return [], out

    def _epilogue_sink(self, members: Sequence[Node], out: str) -> str | None:
        """The one result of ``members`` read outside them (or returned), when they read all of
        ``out``'s uses and every other result of theirs is read only by them; else None."""
        ix = self.ix
        names = {m.name for m in members}
        if not all(u.name in names for u in ix.users[out]):
            return None
        sinks = []
        for m in members:
            t = m.outputs[0].name
            us = ix.users.get(t, [])
            if t in ix.graph_outputs or any(u.name not in names for u in us):
                sinks.append(t)
            elif not us:
                return None
        return sinks[0] if len(sinks) == 1 and ix.spec(sinks[0]).dtype == "float32" else None

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
