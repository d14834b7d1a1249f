"""Code: a Plan in, a readable CUDA C++ program out — the Coder.

``code(plan, graph, weights, overrides=...)`` renders every task of the plan — from the templates
in ``templates/stitch`` and the runtime's C ABI, or from a body given in ``overrides`` — and
returns a :class:`ProgramSource`: ``program.cu``, its :class:`~stitchcuda.manifest.Manifest`
and the weights in manifest order. Nothing is decided here that the plan has not decided:
layouts, leading dims, fusion and precision all come from the plan's task specs.

Modules: :mod:`.contract` (the task seam: what a task's function receives and must produce),
:mod:`.render` (one renderer per kind of task spec), :mod:`.skeleton` (the program around them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .. import manifest as mf
from ..ir import Graph
from ..plan.specs import Plan
from .contract import Param, TaskContract, contract
from ..kinds.cxx import CodeError, flit, render_instrs
from .skeleton import GENERATOR, Skeleton


@dataclass(frozen=True)
class ProgramSource:
    """What the Coder hands on: program.cu, its manifest, and the weights (name -> array, in
    manifest order, as the caller gave them: conversion to the policy's storage type happens
    on the device at create time)."""

    program_cu: str
    manifest: mf.Manifest
    weights: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Override:
    """A body for one task in place of the template's: C++ source that defines the task's
    contract function (helper kernels before it are allowed), and who wrote it."""

    source: str
    origin: str = "hand"


def code(plan: Plan, graph: Graph, weights: Mapping[str, Any] | None = None, *,
         reference: mf.ReferenceSource | None = None, arch: str = "sm_90",
         overrides: Mapping[str, str | Override] | None = None, state: Sequence[Any] = ()) -> ProgramSource:
    """Render ``plan`` (made from ``graph``) as a program; ``weights`` maps every graph weight
    name to its array (any object; only presence is checked; None skips the check).

    ``overrides`` maps task names to bodies (:class:`Override`, or plain source for a hand-written
    one) that replace the template's: each must define the function of the task's
    :func:`~.contract.contract` (``CodeError`` names a task that does not exist or a source that
    does not define it; a wrong body is the compiler's or the Verifier's business). The manifest
    records ``arch``, the reference (default: ``<graph name>.py``), inputs, outputs, weights, lifted
    random inputs, the tasks with their FLOPs, bytes and where each body came from, and every
    reference node with its cost-model numbers. ``state`` (capture's ``StateIO``: attribute, graph
    input, graph output) goes into the manifest's ``state``, its output under the program output's
    name (lifted state follows the reference's own outputs).
    """
    if plan.name != graph.name:
        raise CodeError(f"plan {plan.name!r} was not made from graph {graph.name!r}")
    ordered: dict[str, Any] = {}
    if weights is not None:
        missing = [w.name for w in plan.weights if w.name not in weights]
        if missing:
            raise CodeError(f"weights missing for {', '.join(missing)}")
        ordered = {w.name: weights[w.name] for w in plan.weights}
    contracts = {t.name: contract(plan, t) for t in plan.tasks}
    bodies: dict[str, str] = {}
    origin: dict[str, str] = {t.name: "template" for t in plan.tasks}
    for name, ov in (overrides or {}).items():
        if name not in contracts:
            raise CodeError(f"override for {name!r}: plan {plan.name} has no such task "
                            f"(tasks: {', '.join(contracts)})")
        ov = ov if isinstance(ov, Override) else Override(str(ov))
        fn = contracts[name].function
        arity = _defined_arity(ov.source, fn)
        want = len(contracts[name].params) + 1
        if arity != want:
            found = "does not define its function" if arity is None else \
                f"defines {fn} with {arity} parameter(s) instead of {want}"
            raise CodeError(f"override for {name!r} {found}: expected `{contracts[name].signature} {{ ... }}`")
        bodies[name] = ov.source
        origin[name] = f"override: {ov.origin}"
    skeleton = Skeleton(plan, contracts, bodies, origin)
    source = skeleton.render()
    manifest = mf.Manifest(
        name=plan.name,
        precision=plan.policy,
        arch=arch,
        source_hash=mf.hash_source(source),
        reference=reference or mf.ReferenceSource(path=f"{graph.name}.py"),
        inputs=tuple(mf.TensorSpec(s.name, s.shape, s.dtype) for s in plan.inputs),
        outputs=tuple(mf.TensorSpec(s.name, s.shape, s.dtype) for s in plan.outputs),
        weights=tuple(mf.TensorSpec(s.name, s.shape, s.dtype) for s in plan.weights),
        lifted_random=tuple(mf.RandomInput(input=r.input, op=r.op, distribution=r.distribution, params=r.params,
                                            shape=r.shape, dtype=r.dtype, source=r.source)
                            for r in graph.lifted_random),
        tasks=tuple(mf.TaskRecord(t.name, t.strategy, t.covers, int(t.flops), int(t.bytes), origin[t.name], t.phase,
                                  skeleton.kernels_of.get(t.name, "")) for t in plan.tasks),
        reference_ops=tuple(mf.ReferenceOp(c.node, c.op, int(c.flops), int(c.bytes)) for c in plan.node_costs),
        state=_state(plan, state),
        generator=GENERATOR if not bodies else f"{GENERATOR}, with {len(bodies)} task bod{'y' if len(bodies) == 1 else 'ies'} "
                                               "from overrides",
    )
    return ProgramSource(source, manifest, ordered)


def _state(plan: Plan, state: Sequence[Any]) -> tuple[mf.CarriedState, ...]:
    """Lifted state follows the reference's own outputs, in order (:func:`stitchcuda.stateful.lifted`):
    state ``i`` of ``n`` is program output ``len(outputs) - n + i``."""
    out = []
    first = len(plan.outputs) - len(state)
    for i, st in enumerate(state):
        o = plan.outputs[first + i] if first >= 0 else None
        if o is None or (o.tensor or o.name) != st.output or st.input not in {x.name for x in plan.inputs}:
            raise CodeError(f"state {st.attribute}: {st.input} -> {st.output} is not an input and a trailing "
                            f"output of plan {plan.name}")
        out.append(mf.CarriedState(st.attribute, st.input, o.name))
    return tuple(out)


def _defined_arity(source: str, fn: str) -> int | None:
    """The parameter count of the definition ``st_status fn(...) {`` in ``source``, or None."""
    m = re.search(r"\bst_status\s+" + re.escape(fn) + r"\s*\(", source)
    if m is None:
        return None
    depth, i, commas = 1, m.end(), 0
    while i < len(source) and depth:
        ch = source[i]
        depth += ch in "(<[" and 1 or (-1 if ch in ")>]" else 0)
        commas += ch == "," and depth == 1
        i += 1
    inner = source[m.end():i - 1].strip()
    return 0 if inner in ("", "void") else commas + 1


__all__ = ["GENERATOR", "ProgramSource", "Override", "CodeError", "Param", "TaskContract", "code", "contract",
           "flit", "render_instrs"]
