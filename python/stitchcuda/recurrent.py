"""Recurrent layers: ``nn.RNN`` (tanh / relu), ``nn.GRU`` and ``nn.LSTM`` kept whole through capture.

``torch.export`` turns a recurrent module into one call of ``aten.lstm.input``,
``aten.gru.input``, ``aten.rnn_tanh.input`` or ``aten.rnn_relu.input`` (input, initial state,
the flat weight list, and the layer count, direction, ``batch_first`` flags); only the
core-ATen decomposition would unroll it into a node set per time step (tens of thousands of
nodes). Capture keeps these four operators (:data:`RECURRENT_OPS`, in
:data:`stitchcuda.aten.PRESERVED_OPS`), so a recurrent module is one graph node whose weights are
ordinary program weights, and the planner lowers it as a recurrence
(:mod:`stitchcuda.kinds.recurrent`). This module owns what the planner and the plan interpreter
read of such a node (capture's side — refusing what the lowering does not compute, computing only
shapes while exporting — is in :mod:`stitchcuda.aten`):

* :func:`recurrence` reads a node into a :class:`Recurrence` (mode, layers, directions,
  ``batch_first``, sizes, and which graph tensor is which weight);
* :func:`cell` is the one statement of each mode's cell, in float64, for the plan interpreter
  and the tests (PyTorch's formulas, including GRU's ``n = tanh(x_n + r * (W_hn h + b_hn))``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .ir import Node

#: The recurrent ATen operators capture keeps whole, and their mode.
RECURRENT_OPS: dict[str, str] = {
    "aten.lstm.input": "lstm",
    "aten.gru.input": "gru",
    "aten.rnn_tanh.input": "rnn_tanh",
    "aten.rnn_relu.input": "rnn_relu",
}

#: Gate rows per hidden unit, in PyTorch's weight order: LSTM (i, f, g, o), GRU (r, z, n), RNN (one).
GATES: dict[str, int] = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


@dataclass(frozen=True)
class LayerWeights:
    """One (layer, direction)'s weights, by graph tensor name: ``w_ih`` [G·H, in], ``w_hh``
    [G·H, H], the biases [G·H] (None without ``bias=True``)."""

    w_ih: str
    w_hh: str
    b_ih: str | None = None
    b_hh: str | None = None


@dataclass(frozen=True)
class Recurrence:
    """What one recurrent node computes.

    ``x`` is [T, B, I] ([B, T, I] when ``batch_first``); ``h0`` (and ``c0`` for an LSTM) is
    [layers · directions, B, H]; ``out`` is the last layer's hidden state at every step, [T, B,
    directions · H] (batch first likewise), the reverse direction in the second half; ``hn`` /
    ``cn`` the final state of every (layer, direction), ordered as ``h0``. ``weights[l * D + d]``
    belongs to layer ``l``, direction ``d`` (1: reverse, walking t from T-1 down); layer ``l > 0``
    reads the concatenated outputs of layer ``l - 1``.
    """

    mode: str
    layers: int
    directions: int
    batch_first: bool
    steps: int
    batch: int
    input_size: int
    hidden: int
    x: str
    h0: str
    c0: str | None
    weights: tuple[LayerWeights, ...]
    out: str
    hn: str
    cn: str | None

    @property
    def gates(self) -> int:
        return GATES[self.mode]

    def layer_input(self, layer: int) -> int:
        """Features per step that layer ``layer`` reads."""
        return self.input_size if layer == 0 else self.directions * self.hidden


def recurrence(node: Node, shape_of) -> Recurrence:
    """The :class:`Recurrence` of a node of :data:`RECURRENT_OPS`; ``shape_of(tensor)`` gives a
    graph tensor's shape. Raises ValueError for what the lowering does not compute (dropout
    between layers while training, a weight list that does not match the layer count)."""
    mode = RECURRENT_OPS[node.op]
    layers = int(node.attr("num_layers"))
    directions = 2 if node.attr("bidirectional") else 1
    has_biases = bool(node.attr("has_biases"))
    batch_first = bool(node.attr("batch_first"))
    if float(node.attr("dropout") or 0.0) > 0.0 and node.attr("train") and layers > 1:
        raise ValueError(f"dropout {node.attr('dropout')} between layers while training draws random masks "
                         "inside the operator; call .eval() or use dropout=0")
    nh = 2 if mode == "lstm" else 1
    x, state, params = node.inputs[0], node.inputs[1:1 + nh], node.inputs[1 + nh:]
    per = 4 if has_biases else 2
    if len(params) != layers * directions * per:
        raise ValueError(f"{len(params)} weights for {layers} layer(s) x {directions} direction(s) "
                         f"(expected {layers * directions * per}; projections are not supported)")
    weights = tuple(LayerWeights(*params[i * per:(i + 1) * per]) for i in range(layers * directions))
    xs = shape_of(x)
    if len(xs) != 3:
        raise ValueError(f"input of shape {tuple(xs)}: [steps, batch, features] expected")
    steps, batch = (xs[1], xs[0]) if batch_first else (xs[0], xs[1])
    hidden = shape_of(state[0])[-1]
    outs = [o.name for o in node.outputs]
    return Recurrence(mode, layers, directions, batch_first, steps, batch, xs[2], hidden, x, state[0],
                      state[1] if mode == "lstm" else None, weights, outs[0], outs[1],
                      outs[2] if mode == "lstm" else None)


def cell(mode: str, gx, gh, h, c=None):
    """One step of a recurrent cell (any tensor library with ``sigmoid`` / ``tanh`` methods):
    ``gx = x W_ihᵀ + b_ih`` and ``gh = h W_hhᵀ + b_hh`` are [..., G·H] in PyTorch's gate order;
    returns (h', c') (c' None except for an LSTM)."""
    if mode == "lstm":
        i, f, g, o = (gx + gh).chunk(4, -1)
        c2 = f.sigmoid() * c + i.sigmoid() * g.tanh()
        return o.sigmoid() * c2.tanh(), c2
    if mode == "gru":
        xr, xz, xn = gx.chunk(3, -1)
        hr, hz, hn = gh.chunk(3, -1)
        r, z = (xr + hr).sigmoid(), (xz + hz).sigmoid()
        n = (xn + r * hn).tanh()
        return (1 - z) * n + z * h, None
    a = gx + gh
    return (a.tanh() if mode == "rnn_tanh" else a.clamp_min(0)), None


__all__ = ["RECURRENT_OPS", "GATES", "LayerWeights", "Recurrence", "recurrence", "cell"]
