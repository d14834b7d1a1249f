"""Running a Graph with PyTorch, node by node: an oracle for tests and for ``check_task``,
never a fallback for a program.

Takes a :class:`~stitchcuda.ir.Graph`, inputs and weights (PyTorch tensors); gives its outputs
(:func:`evaluate_graph`) or every tensor it computes (:func:`evaluate_tensors`), and fresh values
for its lifted random inputs (:func:`sample_random_inputs`).
"""

from __future__ import annotations

from typing import Mapping

import torch

from .aten import _DROPPED_ARGS, arg_kind, resolve_op
from .ir import Graph, Node
from .reference import CaptureError


def sample_random_inputs(graph: Graph, seed: int | None = None, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Fresh values for the graph's lifted random inputs, in the reference's draw order.

    With ``seed``, draws come from a generator seeded with it; for plain ``rand``/``randn``
    draws on the CPU they then equal what the reference drew after
    ``torch.manual_seed(seed)``.
    """
    generator = torch.Generator(device=device)
    if seed is not None:
        generator.manual_seed(seed)
    else:
        generator.seed()
    out = {}
    for r in graph.lifted_random:
        dtype = getattr(torch, r.dtype)
        kw = dict(generator=generator, device=device)
        if r.distribution == "uniform":
            t = torch.rand(r.shape, dtype=dtype, **kw)
            low, high = r.param("low"), r.param("high")
            if (low, high) != (0.0, 1.0):
                t = torch.empty(r.shape, dtype=dtype, device=device).uniform_(low, high, generator=generator)
        elif r.distribution == "normal":
            t = torch.randn(r.shape, dtype=dtype, **kw)
            if (r.param("mean"), r.param("std")) != (0.0, 1.0):
                t = t * r.param("std") + r.param("mean")
        elif r.distribution == "bernoulli":
            t = (torch.rand(r.shape, **kw) < r.param("p")).to(dtype)
        elif r.distribution == "randint":
            t = torch.randint(r.param("low"), r.param("high"), r.shape, dtype=dtype, **kw)
        elif r.distribution == "permutation":
            t = torch.randperm(r.param("n"), dtype=dtype, **kw)
        elif r.distribution == "exponential":
            t = torch.empty(r.shape, dtype=dtype, device=device).exponential_(r.param("lambd"), generator=generator)
        else:
            raise ValueError(f"unknown distribution {r.distribution!r}")
        out[r.input] = t
    return out


def evaluate_graph(graph: Graph, inputs: Mapping[str, torch.Tensor], weights: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """Run ``graph`` node by node with the ATen operators its ops name.

    This checks that a Graph alone — ops, operands and attrs — says everything needed to
    compute the reference (tests compare it with the eager model, on meta tensors for
    shapes). ``inputs`` must hold every graph input, lifted random ones included.
    """
    env = evaluate_tensors(graph, inputs, weights)
    return [env[name] for name in graph.outputs]


def evaluate_tensors(graph: Graph, inputs: Mapping[str, torch.Tensor],
                     weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """:func:`evaluate_graph`, returning every tensor of the graph by name (the intermediate
    values ``check_task`` compares one task's results with)."""
    env: dict[str, torch.Tensor] = {}
    for spec in graph.inputs:
        env[spec.name] = inputs[spec.name]
    for spec in graph.weights:
        env[spec.name] = weights[spec.name]
    device = next(iter(env.values())).device if env else torch.device("cpu")
    for node in graph.nodes:
        op = resolve_op(node.op)
        if op is None:
            raise CaptureError(f"node {node.name}: unknown op {node.op}")
        args, kwargs = _unbind(op, node, env, device)
        result = op(*args, **kwargs)
        if len(node.outputs) == 1 and node.outputs[0].name == node.name:
            env[node.name] = result
        else:
            for spec, value in zip(node.outputs, result):
                env[spec.name] = value
    return env


def _unbind(op: torch._ops.OpOverload, node: Node, env: Mapping[str, torch.Tensor], device: torch.device) -> tuple[list, dict]:
    """Rebuild an operator call from a node (inverse of what :mod:`stitchcuda.exported` emits)."""
    arguments = op._schema.arguments
    attrs = node.attrs_dict
    pending = list(node.inputs)
    # Tensor[] takes what the single tensors after it leave over.
    fixed_after = {
        i: sum(1 for a in arguments[i + 1 :] if arg_kind(a) == "tensor" and a.name not in attrs)
        for i in range(len(arguments))
    }
    args, kwargs = [], {}
    by_name = False  # after a skipped argument, positions no longer line up: pass by name
    for i, arg in enumerate(arguments):
        kind = arg_kind(arg)
        if arg.name in _DROPPED_ARGS:
            if arg.name == "device" and _creates_tensor(op):
                kwargs["device"] = device
            by_name = True
            continue
        if kind == "tensor_list":
            if arg.name in attrs:
                value = [env[v] if v is not None else None for v in attrs[arg.name]]
                pending = pending[sum(v is not None for v in attrs[arg.name]) :]
            else:
                n = len(pending) - fixed_after[i]
                value, pending = [env[v] for v in pending[:n]], pending[n:]
        elif arg.name in attrs:
            value = attrs[arg.name]
            real = str(getattr(arg, "real_type", arg.type))
            if isinstance(value, str) and "ScalarType" in real:
                value = getattr(torch, value)
            elif isinstance(value, str) and "MemoryFormat" in real:
                value = getattr(torch, value)
            elif isinstance(value, tuple):
                value = list(value)
        elif kind == "tensor":
            value, pending = env[pending[0]], pending[1:]
        else:
            by_name = True  # not recorded: leave the schema default
            continue
        if arg.kwarg_only or by_name:
            kwargs[arg.name] = value
        else:
            args.append(value)
    if pending:
        raise CaptureError(f"node {node.name}: {len(pending)} inputs left over for {op}")
    return args, kwargs


def _creates_tensor(op: torch._ops.OpOverload) -> bool:
    return not any(arg_kind(a) in ("tensor", "tensor_list") for a in op._schema.arguments if a.name not in _DROPPED_ARGS)


__all__ = ["sample_random_inputs", "evaluate_graph", "evaluate_tensors"]
