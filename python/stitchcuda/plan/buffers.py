"""Buffers and the walks between tensors that *place*, *lower* and *schedule* share.

Takes a :class:`~.fused.Fused`; gives :class:`Alloc`, the buffer table the back half fills in
order (the program's inputs, weights and outputs first, then a buffer per materialised tensor:
``t_<tensor>`` in the arena, ``c<k>_<tensor>`` computed at create), and :class:`Tensors`, the
answers to "which proto materialises this tensor" and "which materialised tensors does this
layout op read through".
"""

from __future__ import annotations

from typing import Any, Sequence

from .. import layout as L
from .. import ops
from ..ir import TensorSpec
from ..kinds.cxx import ident
from ..layout import View
from .fused import Fused
from .specs import Buffer


class Alloc:
    """The plan's buffers, in creation order, and the tensors lowering adds."""

    def __init__(self, fused: Fused):
        self.ix = fused.index
        self.buffers: dict[str, Buffer] = {}
        self.const_count = 0
        self.extra: dict[str, TensorSpec] = {}

    def spec(self, t: str) -> TensorSpec:
        s = self.extra.get(t)
        return s if s is not None else self.ix.spec(t)

    def add_tensor(self, name: str, shape: Sequence[int], dtype: str) -> str:
        """A new tensor name (suffixed until unique across the graph and lowering's own)."""
        base, k = name, 1
        while name in self.ix.specs or name in self.extra:
            name, k = f"{base}_{k}", k + 1
        self.extra[name] = TensorSpec(name, tuple(shape), dtype)
        return name

    def new_buffer(self, name: str, kind: str, dtype: str, shape: Sequence[int], **kw: Any) -> Buffer:
        b = Buffer(name, kind, dtype, tuple(shape), **kw)
        self.buffers[name] = b
        return b

    def fresh(self, tensor: str, dtype: str, shape: Sequence[int], phase: str) -> View:
        """A new contiguous buffer for ``tensor``: a create-time constant or an arena slot."""
        safe = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in tensor)
        if phase == "create":
            name = f"c{self.const_count}_{safe}"
            b = self.new_buffer(name, "const", dtype, shape, index=self.const_count, source=tensor)
            self.const_count += 1
        else:
            name = f"t_{safe}"
            k = 1
            while name in self.buffers:
                name, k = f"t_{safe}_{k}", k + 1
            b = self.new_buffer(name, "arena", dtype, shape, source=tensor)
        return L.contiguous(b.name, b.shape, dtype)


class Tensors:
    """Which proto materialises each tensor, and the walks through layout ops."""

    def __init__(self, fused: Fused):
        self.ix = fused.index
        self.materialized: dict[str, int] = {}
        for idx, pr in enumerate(fused.protos):
            for o in pr.outs:
                self.materialized[o] = idx

    def roots(self, t: str) -> list[str]:
        """The materialised tensors, inputs and weights that ``t`` is computed from through
        layout ops (``t`` itself when it is one)."""
        ix = self.ix
        seen = []
        stack = [t]
        while stack:
            x = stack.pop()
            if x in self.materialized or x in ix.inputs or x in ix.weights:
                seen.append(x)
                continue
            n = ix.producer.get(x)
            if n is None:
                continue
            stack.extend(n.inputs)
        return seen

    def chain(self, t: str) -> list[str]:
        """``t`` and the layout-op tensors between it and its materialised root."""
        ix = self.ix
        out = [t]
        n = ix.producer.get(t)
        while n is not None and ops.kind(n.op) == "view" and t not in self.materialized:
            t = n.inputs[0]
            out.append(t)
            n = ix.producer.get(t)
        return out


__all__ = ["Alloc", "Tensors", "ident"]
