"""The runtime's GEMM epilogue ops (``st_ep_kind`` in ``stitchrt.h``; functors in
``templates/stitch/epilogue.cuh``), with a PyTorch reference of each for the plan interpreter.

``ref(x, a, b, ctx)`` computes the op over float64 ``x`` with its scalar parameters ``a``, ``b``
and, for the ops that read them, ``ctx["residual"]`` and ``ctx["bias"]``. The C enum is checked
against this table by a test; the instruction an op computes the same function as names it in
its ``epilogue`` field (:mod:`.elementwise`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


def _t():
    import torch

    return torch


@dataclass(frozen=True)
class EpKind:
    name: str       # without ST_EP_
    value: int      # st_ep_kind value
    ref: Callable[[Any, float, float, dict], Any]


_F = lambda: _t().nn.functional  # noqa: E731

EPILOGUES: dict[str, EpKind] = {k.name: k for k in (
    EpKind("SCALE", 0, lambda x, a, b, c: x * a),
    EpKind("ADD_SCALAR", 1, lambda x, a, b, c: x + a),
    EpKind("LEAKY_RELU", 2, lambda x, a, b, c: _t().where(x >= 0, x, x * a)),
    EpKind("SILU", 3, lambda x, a, b, c: x * _t().sigmoid(x)),
    EpKind("SIGMOID", 4, lambda x, a, b, c: _t().sigmoid(x)),
    EpKind("TANH", 5, lambda x, a, b, c: _t().tanh(x)),
    EpKind("MISH", 6, lambda x, a, b, c: _F().mish(x)),
    EpKind("HARDTANH", 7, lambda x, a, b, c: _t().clamp(x, a, b)),
    EpKind("CLAMP", 8, lambda x, a, b, c: _t().clamp(x, a, b)),
    EpKind("GELU_TANH", 9, lambda x, a, b, c: _F().gelu(x, approximate="tanh")),
    EpKind("GELU_ERF", 10, lambda x, a, b, c: _F().gelu(x)),
    EpKind("RELU", 11, lambda x, a, b, c: _t().clamp_min(x, 0)),
    EpKind("RESIDUAL_ADD", 12, lambda x, a, b, c: x + a * c["residual"]),
    EpKind("BIAS_ADD", 13, lambda x, a, b, c: x + c["bias"]),
    EpKind("DIV_SCALAR", 14, lambda x, a, b, c: x / a),
    EpKind("HARDSWISH", 15, lambda x, a, b, c: _F().hardswish(x)),
    EpKind("SOFTPLUS", 16, lambda x, a, b, c: _F().softplus(x)),
    EpKind("ELU", 17, lambda x, a, b, c: _F().elu(x, a)),
    EpKind("ABS", 18, lambda x, a, b, c: x.abs()),
    EpKind("EXP", 19, lambda x, a, b, c: _t().exp(x)),
    EpKind("SQUARE", 20, lambda x, a, b, c: x * x),
)}

__all__ = ["EpKind", "EPILOGUES"]
