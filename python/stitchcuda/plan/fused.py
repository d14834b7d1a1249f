"""The front half's result: every node in a proto, frozen for the back half.

*match* and *fuse* produce :class:`Fused` (each proto a kind's own type: :mod:`stitchcuda.kinds`);
*place*, *schedule* and *lower* read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..kinds import AnyProto
from .graph import GraphIndex


@dataclass(frozen=True)
class Fused:
    """The front half's result: the (frozen) graph index, every proto in claim order, which
    proto claimed each node, the tensors kept in float32 whatever the policy, and notes."""

    index: GraphIndex
    protos: tuple[AnyProto, ...]
    claimed: Mapping[str, int]
    keep_f32: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()
    policy: str = "fp32"
    node_policy: Mapping[str, str] = field(default_factory=dict)

    def tensor_storage(self, t: str, storage_of) -> str:
        """Storage dtype of a tensor: the policy's for float32, except fp32-kept tensors."""
        return "float32" if t in self.keep_f32 else storage_of(self.index.spec(t).dtype)


__all__ = ["Fused"]
