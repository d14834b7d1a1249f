"""The operators of capture: which ATen operators stay whole (:data:`PRESERVED_OPS`), which the
later stages support (:data:`SUPPORTED_OPS`, read from the op registry), the decompositions
applied, the error that names an unsupported operator and where the reference uses it, and how
an operator's schema reads (:func:`resolve_op`, :func:`arg_kind`), which capture and the graph
oracle (:mod:`stitchcuda.evaluate`) share.

Split from :mod:`stitchcuda.frontend`, which re-exports the operator names here.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import torch

from . import ops
from .ir import Graph
from .recurrent import RECURRENT_OPS
from .reference import CaptureError
from .stateful import attribute_location

# --------------------------------------------------------------------------------------
# Operators
# --------------------------------------------------------------------------------------

#: The linear interpolations kept whole (a gather task each; the op registry lists the same).
LINEAR_INTERPOLATIONS: tuple[str, ...] = ("aten.upsample_linear1d.vec", "aten.upsample_linear1d.default",
                                          "aten.upsample_bilinear2d.vec", "aten.upsample_trilinear3d.vec",
                                          "aten.upsample_trilinear3d.default")

#: High-level operators kept whole instead of decomposed (see :mod:`stitchcuda.frontend`).
PRESERVED_OPS: tuple[str, ...] = (
    "aten.linear.default",
    "aten.matmul.default",
    "aten.scaled_dot_product_attention.default",
    "aten.logsumexp.default",
    # Recurrent layers: one node each, lowered as a recurrence (see :mod:`stitchcuda.recurrent`)
    # instead of a node set per time step.
    "aten.lstm.input",
    "aten.gru.input",
    "aten.rnn_tanh.input",
    "aten.rnn_relu.input",
    # Linear interpolations: one gather task reads each output's two, four or eight taps and blends
    # them (kinds/gather.py); taken apart they were four gathers and a blend, each gather writing a
    # tensor as large as the output. (upsample_bilinear2d.default is taken apart while tracing: only
    # its .vec form reaches the graph.)
    *LINEAR_INTERPOLATIONS,
)

class _Registry:
    """The default set of supported operators: whatever the op registry maps when asked
    (:func:`stitchcuda.ops.supported`), so an op added to the registry is accepted at once."""

    def __iter__(self):
        return iter(ops.supported())

    def __repr__(self) -> str:
        return "stitchcuda.ops.supported()"


#: Operators the later stages handle: the op registry's (see :class:`_Registry`).
SUPPORTED_OPS = _Registry()

# Arguments that say where a tensor lives, not what it holds: a program runs on one device.
_DROPPED_ARGS = frozenset({"device", "layout", "pin_memory", "generator"})

_TORCH_DIR = os.path.dirname(torch.__file__)


def op_name(target: Any) -> str:
    """The IR name of an FX call target: ``"aten.add.Tensor"`` for an ATen overload."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    return f"{module}.{getattr(target, '__name__', repr(target))}".lstrip(".")


def arg_kind(arg: Any) -> str:
    """``tensor``, ``tensor_list`` or ``other`` for an operator schema's argument."""
    t = arg.type
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    if isinstance(t, torch.TensorType):
        return "tensor"
    if isinstance(t, torch.ListType):
        e = t.getElementType()
        if isinstance(e, torch.OptionalType):
            e = e.getElementType()
        if isinstance(e, torch.TensorType):
            return "tensor_list"
    return "other"


def resolve_op(name: str) -> torch._ops.OpOverload | None:
    """The ATen overload an IR op name denotes, or None where this torch lacks it."""
    parts = name.split(".")
    if len(parts) != 3:
        return None
    namespace, packet, overload = parts
    try:
        return getattr(getattr(getattr(torch.ops, namespace), packet), overload)
    except (AttributeError, RuntimeError):
        return None


def decomposition_table() -> dict:
    """Core-ATen decompositions minus :data:`PRESERVED_OPS`."""
    try:
        table = torch.export.default_decompositions()  # torch >= 2.6
    except AttributeError:  # torch 2.4/2.5
        from torch._decomp import core_aten_decompositions

        table = dict(core_aten_decompositions())
    for name in PRESERVED_OPS:
        op = resolve_op(name)
        if op is not None and op in table:
            table.pop(op)
    table.update(_decomposed_interpolation())
    return table


#: Interpolations core ATen keeps whole, taken apart into gathers and arithmetic by PyTorch's own
#: decompositions (the index math is computed once, at create; the weighted taps fuse).
DECOMPOSED_OPS: tuple[str, ...] = ("aten.upsample_bicubic2d.vec", "aten.upsample_bicubic2d.default",
                                   "aten.upsample_bilinear2d.default")


def _decomposed_interpolation() -> dict:
    from torch._decomp import get_decompositions

    return get_decompositions([op for op in map(resolve_op, DECOMPOSED_OPS) if op is not None])


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UnsupportedOp:
    """One thing in a reference that stitchcuda cannot handle, and where it is.

    ``op`` is the ATen operator (``"aten.convolution.default"``) or, for what is refused
    before export, the construct (``"nn.LSTM"``); ``node`` the graph node or module
    attribute; ``where`` the location (module path, file, line, code); ``reason`` says
    why when "not supported yet" is not the whole story.
    """

    op: str
    node: str
    where: str
    reason: str = ""

    def describe(self) -> str:
        text = f"{self.op} at {self.where}" if self.where else self.op
        return f"{text} ({self.reason})" if self.reason else text


#: The module part of a location (``model.layers.0.attn (Attention), ``), before its file and line.
_MODULE = re.compile(r"^[\w.]+ \([\w.]+\), ")


class UnsupportedOpError(CaptureError):
    """The reference uses operators (or constructs) stitchcuda does not support.

    ``ops`` lists each one with its location; ``graph`` is the captured graph where the
    failure came after export (so a later stage may still inspect it), else None.
    """

    def __init__(self, name: str, ops: Sequence[UnsupportedOp], graph: Graph | None = None):
        self.name = name
        self.ops = list(ops)
        self.graph = graph
        lines = [f"reference {name!r} uses what stitchcuda does not support yet (there is no PyTorch fallback):"]
        # One line per operator and source line: the same line reached from many modules (every
        # layer of a transformer) is one line, the first module named and the others counted.
        first: dict[tuple[str, str, str], int] = {}
        more: dict[int, int] = {}
        for u in self.ops:
            key = (u.op, u.reason, _MODULE.sub("", u.where, count=1))
            if key not in first:
                first[key] = len(lines)
                lines.append("  " + u.describe())
            elif lines[first[key]] != "  " + u.describe():
                more[first[key]] = more.get(first[key], 0) + 1
        for i, n in more.items():
            lines[i] += f" (and {n} more place{'s' if n > 1 else ''} reaching this line)"
        super().__init__("\n".join(lines))


def check_supported(graph: Graph, supported_ops: Iterable[str] = SUPPORTED_OPS) -> list[UnsupportedOp]:
    """Every node of ``graph`` whose op is not in ``supported_ops``, in graph order."""
    supported = set(supported_ops)
    return [UnsupportedOp(n.op, n.name, n.source) for n in graph.nodes if n.op not in supported]


# --------------------------------------------------------------------------------------
# Recurrent layers: refused before export, shapes only while exporting
# --------------------------------------------------------------------------------------


def refuse_unsupported_recurrent(model, name: str) -> None:
    """Raise :class:`UnsupportedOpError` for recurrent modules the lowering does
    not compute: ``proj_size > 0`` (LSTM projections), dropout between layers in training mode
    (random masks inside the operator), and subclasses of ``nn.RNNBase`` that are not
    ``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM`` themselves or override their forward."""
    from torch import nn

    found = []
    for path, module in model.named_modules():
        if not isinstance(module, nn.RNNBase):
            continue
        base = next((c for c in type(module).__mro__ if c in (nn.RNN, nn.GRU, nn.LSTM)), None)
        kind = type(module).__name__
        why = ""
        if base is None or type(module).forward is not base.forward:
            why = "a recurrent module other than nn.RNN, nn.GRU or nn.LSTM (or with its own forward)"
        elif getattr(module, "proj_size", 0):
            why = f"an LSTM with proj_size={module.proj_size} (projections are not supported)"
        elif module.dropout > 0 and module.training and module.num_layers > 1:
            why = (f"dropout={module.dropout} between layers in training mode draws random masks inside the "
                   "recurrent operator; call .eval() or use dropout=0")
        if why:
            found.append(UnsupportedOp(op=f"nn.{base.__name__ if base else 'RNNBase'}", node=path,
                                       where=attribute_location(model, path, kind), reason=why))
    if found:
        raise UnsupportedOpError(name, found)


@contextlib.contextmanager
def recurrent_shapes_only() -> Iterator[None]:
    """While capturing, compute a recurrent operator's result on fake (or meta) tensors from its
    shapes alone.

    ``torch.export`` keeps the operator as one node but, to know its result's shape, runs PyTorch's
    Python decomposition on fake tensors — every step of every layer, twice (export, then
    ``run_decompositions``): half a minute for one small GRU, minutes for a KernelBench LSTM. The
    shapes need none of that. For the length of the block this puts a shape function in the places
    fake-tensor dispatch looks (the operator's Python kernels for the composite, autograd and meta
    keys, and torch's meta table); real tensors still take PyTorch's own implementation. These are
    torch internals: where they are not as expected nothing is changed, and capture is only slower.
    """
    saved: list[tuple[Any, Any, Any]] = []
    saved_meta: list[tuple[Any, Any]] = []
    try:
        from torch._C import DispatchKey
        from torch._decomp import meta_table

        keys = (DispatchKey.CompositeImplicitAutograd, DispatchKey.Autograd, DispatchKey.Meta)
        for op in recurrent_aten_ops():
            original = op.py_kernels.get(DispatchKey.CompositeImplicitAutograd)
            if original is None:
                continue
            fn = _shape_function(op, original)
            for k in keys:
                if k in op.py_kernels:
                    saved.append((op, k, op.py_kernels[k]))
                    op.py_kernels[k] = fn
            saved_meta.append((op, meta_table.get(op)))
            meta_table[op] = fn
            op._dispatch_cache.clear()
    except (ImportError, AttributeError):  # another torch: keep its (slower) path
        pass
    try:
        yield
    finally:
        for op, k, original in saved:
            op.py_kernels[k] = original
            op._dispatch_cache.clear()
        for op, previous in saved_meta:
            if previous is None:
                meta_table.pop(op, None)
            else:
                meta_table[op] = previous


def _shape_function(op, original):
    lstm = "lstm" in str(op)

    def run(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
        from torch._subclasses.fake_tensor import FakeTensor

        if not isinstance(input, FakeTensor) and input.device.type != "meta":
            return original(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        h0 = hx[0] if isinstance(hx, (list, tuple)) else hx
        width = (2 if bidirectional else 1) * h0.shape[-1]
        out = input.new_empty((*input.shape[:2], width))  # [T, B] or [B, T]: the input's own order
        if lstm:
            return out, h0.new_empty(h0.shape), hx[1].new_empty(hx[1].shape)
        return out, h0.new_empty(h0.shape)

    return run


def recurrent_aten_ops() -> tuple:
    """The ATen overloads of :data:`~stitchcuda.recurrent.RECURRENT_OPS` this torch has."""
    return tuple(op for op in map(resolve_op, RECURRENT_OPS) if op is not None)


__all__ = ["PRESERVED_OPS", "SUPPORTED_OPS", "UnsupportedOp", "UnsupportedOpError", "check_supported",
           "decomposition_table", "op_name", "resolve_op", "arg_kind", "refuse_unsupported_recurrent",
           "recurrent_shapes_only", "recurrent_aten_ops"]
