"""Pass 0, *rewrite*: exact algebraic rewrites of the graph, applied when the constraints ask.

Takes a :class:`~stitchcuda.ir.Graph` and rewrite names; gives a Graph computing the same
function in real arithmetic, usually with less work or better conditioned floating point. Each
:class:`Rewrite` says whether it applies to a graph and rewrites every place it applies. New
nodes are named after the node they replace (``<node>__rw<k>``) and keep its source line, so
reports still point at the reference; weight-only subexpressions become create-time tasks.

``reduce_after_linear``  ``sum(x·Wᵀ + b, -1) = x·(ΣW) + Σb`` (and ``mean``): a GEMM followed by
                         a reduction over its whole output row becomes a matrix-vector product
                         with a reduced weight — fewer FLOPs, and no cancellation over thousands
                         of TF32-rounded products (exactly the case where tf32 fails 1e-2).
``drop_identities``      ``x * 1``, ``x / 1``, ``x + 0``, ``x - 0`` become ``x``.

Applied to every graph (:func:`apply_always`), not asked for:

``merge_duplicates``     a node computing what an earlier one computes (the same op on the same
                         operands with the same attributes) is that node: its readers read the
                         earlier result. A model that rebuilds one value in every layer (T5's
                         attention bias and mask, [batch, heads, len, len] in each of its blocks)
                         computed and wrote it once per layer. Random draws are the graph's
                         inputs (lifted), so no two nodes differ by a draw; in-place ops and
                         uninitialised allocations are left alone.
``drop_empty_pads``      ``constant_pad_nd(x, [0, 0, …])`` is ``x``: Hugging Face's MobileNets pad
                         before every convolution in TensorFlow's "same" manner, a 1×1 one by
                         nothing, and each such pad was a copy of the whole tensor (34 of
                         MobileNetV2's 52). Taken where the pad's result is not a graph output.
``pool_before_pointwise_conv``  ``avg_pool(W·x + b) = W·avg_pool(x) + b``: an average pool is a
                         weighted sum over pixels, a 1×1 convolution a linear map over channels
                         at each pixel, so they commute (exactly, in real arithmetic). Pooling
                         first gives the convolution 1/area of the pixels (a DenseNet transition,
                         BN → ReLU → 1×1 conv → 2×2 average pool: a quarter of the FLOPs, and the
                         wide full-size tensor between them is never written). Taken when the
                         pool is the convolution's only reader and the convolution does not
                         narrow the channels by more than the pool's area; with a bias, only
                         where the pool's weights add up to 1 (no padding counted, no divisor
                         override).
``pointwise_conv_as_gemm``  a 1×1 (×1) convolution with stride 1, no padding and no bias is a
                         batched matrix product ``W[Cout, Cin] · x[n, Cin, pixels]`` (per group
                         for a grouped one) on the tensor's own NCHW layout, where cuDNN's
                         engines for NCHW transpose to NHWC and back around the product (twice
                         the output's traffic again). A convolution followed directly by an
                         activation keeps cuDNN, which fuses the activation; one with a bias
                         too (the runtime's GEMM epilogue adds a bias per column, not per
                         output channel). Under a policy with tensor cores convolutions run
                         channels-last, where cuDNN's 1×1 convolution is that GEMM already on the
                         layout its neighbours use: there it is taken only for a convolution no
                         other convolution reaches through elementwise and layout ops, norms,
                         pooling or joins (its input and output channels-first anyway: the
                         product skips converting both).
``fold_batch_norm``      ``bn_eval(conv(x, W, b)) = conv(x, W·s, (b - μ)·s + β)`` with ``s = γ / sqrt(σ² + ε)``
                         per output channel: an inference-mode batch norm after a convolution
                         becomes the convolution's own weights (computed once, at create), so
                         the normalised output is never a pass of its own and an activation after
                         it fuses into the convolution. Taken when the batch norm is the
                         convolution's only reader, its statistics outputs are unused, and every
                         operand but the input is a weight (not transposed convolutions).
``conv_bias_into_elementwise``  ``f(convT(x, W, b)) = f(convT(x, W) + b)``: a transposed
                         convolution whose one reader is an elementwise op other than an
                         activation its epilogue fuses hands its bias to that op, where the
                         elementwise pass adds it for free (one value a channel). cuDNN's
                         transposed (dgrad) engines fuse no bias, so the runtime ran it as a pass
                         of its own over the whole output (ConvTranspose2d + bias + clamp: 1.5 ms
                         of 6.5 on an H100). Forward engines fuse it; there the bias stays. Not
                         taken where the elementwise chain ends in a pool or a reduction, whose
                         prologue hook takes it (a hook is a function of one tensor, not an add of
                         the bias).
``instance_norm_as_group_norm``  ``view(bn(view(x, [1, N·C, …])), [N, C, …])`` with batch
                         statistics (F.instance_norm as PyTorch decomposes it, weight and bias
                         repeated N times) is group norm with one channel a group on ``x`` itself:
                         the same statistics per (sample, channel), the same biased variance. The
                         [1, N·C, …] view of a channels-last tensor is no strided view (it was a
                         copy of the whole tensor), and elementwise groups do not cross views (the
                         op after the norm was a pass of its own). Taken when the views and the
                         norm read and feed only each other and the statistics are unused.
``fold_channel_affine``  ``conv(x, W, b) ⊙ p = conv(x, W ⊙ p, b ⊙ p)`` for ⊙ one of ``+ - × ÷`` and
                         ``p`` a weight with one value per output channel (or one value): the
                         add / scale after a convolution (``x + self.bias``, ``x * self.scale``,
                         ``x / 2``) becomes the convolution's weights and bias (at create), so an
                         activation after it fuses into the convolution and the pass is gone. A
                         chain folds one op at a time (after ``fold_batch_norm``). Taken when the
                         op is the convolution's only reader, every operand but the input is a
                         weight (transposed convolutions of one group too).
``fold_feature_affine``  ``linear(x, W, b) ⊙ p = linear(x, W ⊙ p, b ⊙ p)``, the same for a linear
                         layer, ``p`` a weight of one value per output feature (the last dim): a
                         layer scale (ConvNeXt's, DINOv2's ``gamma * x``) or a ``* self.scale`` /
                         ``+ self.shift`` after ``nn.Linear`` becomes the GEMM's weights and bias
                         (at create). ConvNeXt's scale was a pass of its own: a permute between it
                         and the residual add kept it out of that elementwise group. Not for one
                         value (a number, a one-element weight): the GEMM's epilogue chain applies
                         that at run time for free, where folding would copy W at create.
``group_norm_over_rows``  ``group_norm(x, G, w, b) = view(layer_norm(view(x, [N, G, C/G])), [N, C]) · w + b``
                         where x has one position a channel ([N, C], or [N, C, 1, …]: a group norm
                         after a linear layer). Its statistics task wrote a scale and a shift per
                         (sample, channel), each as large as x, which the affine pass read back
                         beside x (seven times x's bytes in all); a layer norm over rows of C/G
                         and the per-channel affine, which fuses with what follows, move four.
                         Taken for float32 data whose mean / rstd outputs are unused.
``mish_from_parts``     ``x · tanh(where(x > 20, x, log1p(exp(x)))) = mish(x)``: mish as PyTorch
                         decomposes it (F.mish, nn.Mish, and ``x * tanh(softplus(x))`` written out),
                         six ops, is one op of one exponential and one division (stitch/ops.cuh),
                         where the parts took three libm calls an element: two mish passes over a
                         convolution's output ran at 55 % of a copy's bandwidth. Taken when every
                         inner op reads and feeds only the next (no other reader, not an output).
``merge_sibling_linears``  ``[x·W₁ᵀ + b₁, x·W₂ᵀ + b₂, …] = x·[W₁; W₂; …]ᵀ + [b₁; b₂; …]``, sliced: the
                         query, key and value projections of an attention block (separate
                         ``nn.Linear`` layers in most Hugging Face models) read the same input;
                         one GEMM over the joined weights (joined once, at create) reads it once,
                         launches once and fills the GPU with three times the columns. Each
                         result is a column slice of the one product (a view: the attention reads
                         it in place). Taken for linears of weights (not computed ones) whose
                         results are read only through views or by attention: an elementwise
                         reader would have been the GEMM's own epilogue.
``select_before_producer``  ``select(f(x), d, i) = f'(select(x, e, i))``: an element taken along one
                         dim of a result is taken from the operand first, where that dim is one
                         of the operand's — through a permute (dim ``dims[d]``), a reshape (a dim
                         the reshape leaves whole), a batched matrix product (a batch: the two
                         operands' matrices; a row: the left operand's row, a 1-row product; a
                         column: the right operand's). A state-space model's last chunk state
                         (``new_states[:, -1]`` after an einsum) computed all chunks' and copied
                         one out: the product now computes the one, into the output. Taken where
                         the select is the producer's only reader and the producer is no output.
``gather_of_log_softmax``  ``gather(log_softmax(x, d), i, d) = gather(x, i, d) - logsumexp(x, d)``
                         (cross entropy and NLL losses as PyTorch decomposes them): the row
                         reduction writes one value per row instead of the whole log-probability
                         tensor, which only a few elements of were read. Taken when the gather is
                         the log-softmax's only reader and the index spans x's other dims.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from .. import ops
from ..ir import Graph, Node, TensorSpec

A = ops.A


@dataclass(frozen=True)
class Rewrite:
    name: str
    find: Callable[[Graph], list]            # the places it applies
    apply_one: Callable[[Graph, object], Graph]
    #: for a place, {new node: the reference nodes it stands for} where a node stands for several
    #: (by default a new node ``<node>__rw<k>`` stands for ``<node>``, and a kept name for itself)
    covers: Callable[[object], dict[str, tuple[str, ...]]] | None = None

    def applies(self, graph: Graph) -> bool:
        return bool(self.find(graph))

    def apply(self, graph: Graph, covers: dict[str, tuple[str, ...]] | None = None) -> Graph:
        """``graph`` rewritten at every place; ``covers`` (when given) gains what :attr:`covers` says."""
        # Rewrite one place at a time: each rewrite changes the graph the next is found in.
        for _ in range(len(graph.nodes)):
            places = self.find(graph)
            if not places:
                break
            graph = self.apply_one(graph, places[0])
            if covers is not None and self.covers is not None:
                for node, old in self.covers(places[0]).items():
                    # (a node gone now may itself have stood for others: its reader stands for them too)
                    old = tuple(m for o in old for m in (o,) + covers.get(o, ()))
                    covers[node] = tuple(dict.fromkeys(covers.get(node, ()) + old))
        return graph


def _users(graph: Graph, t: str) -> list[Node]:
    return [n for n in graph.nodes if t in n.inputs]


def _replace(graph: Graph, old: Sequence[Node], new: Sequence[Node]) -> Graph:
    """``graph`` with the nodes ``old`` removed and ``new`` put where the last of them was."""
    gone = {n.name for n in old}
    last = max(i for i, n in enumerate(graph.nodes) if n.name in gone)
    nodes = []
    for i, n in enumerate(graph.nodes):
        if n.name not in gone:
            nodes.append(n)
        if i == last:
            nodes.extend(new)
    return dataclasses.replace(graph, nodes=tuple(nodes))


def _renamed(n: Node, names: dict[str, str]) -> Node:
    """``n`` reading ``names[t]`` wherever it read tensor ``t``: in its inputs, and in a tensor list
    recorded as an attr (``index.Tensor``'s indices with holes: a tuple of its input names and None)."""
    if not names.keys() & set(n.inputs):
        return n
    ins = set(n.inputs)
    attrs = tuple((k, tuple(names.get(e, e) if e is not None else None for e in v))
                  if isinstance(v, tuple) and v and all(e is None or (isinstance(e, str) and e in ins) for e in v)
                  else (k, v) for k, v in n.attrs)
    return dataclasses.replace(n, inputs=tuple(names.get(a, a) for a in n.inputs), attrs=attrs)


def _fresh(graph: Graph, base: str) -> Callable[[], str]:
    taken = {n.name for n in graph.nodes} | {s.name for s in graph.inputs + graph.weights}
    taken |= {o.name for n in graph.nodes for o in n.outputs}
    k = [0]

    def name() -> str:
        while f"{base}__rw{k[0]}" in taken:
            k[0] += 1
        taken.add(f"{base}__rw{k[0]}")
        return f"{base}__rw{k[0]}"

    return name


class _NewNodes:
    """The float32 nodes a rewrite adds, in order: each is named after the node it stands for
    (``<node>__rw<k>``, or ``node_name``) and keeps ``source``; ``out`` names its result tensor
    (by default the node's own name). Calling it adds a node and returns its result tensor."""

    def __init__(self, graph: Graph, base: str, source):
        self.name = _fresh(graph, base)
        self.source = source
        self.nodes: list[Node] = []

    def __call__(self, op: str, inputs: Sequence[str], shape: Sequence[int], attrs=(), out: str | None = None,
                 node_name: str | None = None) -> str:
        t = out or self.name()
        self.nodes.append(Node(node_name or t, op, tuple(inputs), (TensorSpec(t, tuple(shape), "float32"),),
                               tuple(attrs), self.source))
        return t


# ---------------------------------------------------------------------- reduce_after_linear


def _find_reduce_after_linear(graph: Graph) -> list[tuple[Node, Node]]:
    weights = {s.name for s in graph.weights}
    out = []
    for red in graph.nodes:
        if red.op not in (A + "sum.dim_IntList", A + "mean.dim") or red.attr("dtype") is not None:
            continue
        lin = graph.producer(red.inputs[0])
        if lin is None or lin.op != A + "linear.default" or lin.outputs[0].dtype != "float32":
            continue
        y = lin.outputs[0]
        dims = red.attr("dim") or ()
        if len(y.shape) < 2 or len(dims) != 1 or int(dims[0]) % len(y.shape) != len(y.shape) - 1:
            continue
        if len(_users(graph, y.name)) != 1 or y.name in graph.outputs:
            continue
        w = lin.inputs[1]
        if w not in weights or len(graph.spec(w).shape) != 2:
            continue
        out.append((lin, red))
    return out


def _apply_reduce_after_linear(graph: Graph, place) -> Graph:
    lin, red = place
    x, w = lin.inputs[0], lin.inputs[1]
    bias = lin.inputs[2] if len(lin.inputs) > 2 else None
    n_out, k = graph.spec(w).shape
    y, r = lin.outputs[0], red.outputs[0]
    lead = y.shape[:-1]
    node = _NewNodes(graph, red.name, red.source or lin.source)
    new = node.nodes

    ws = node(A + "sum.dim_IntList", [w], (k,), (("dim", (0,)), ("keepdim", False), ("dtype", None)))
    t = node(A + "matmul.default", [x, ws], lead)
    if bias is not None:
        bs = node(A + "sum.default", [bias], (), (("dtype", None),))
        t = node(A + "add.Tensor", [t, bs], lead, (("alpha", 1),))
    if red.op == A + "mean.dim":
        t = node(A + "mul.Tensor", [t], lead, (("other", 1.0 / n_out),))
    if red.attr("keepdim"):
        t = node(A + "unsqueeze.default", [t], r.shape, (("dim", len(lead)),))
    # The last new node produces the reduction's own output tensor.
    last = new[-1]
    new[-1] = dataclasses.replace(last, outputs=(dataclasses.replace(last.outputs[0], name=r.name),))
    return _replace(graph, [lin, red], new)


# ---------------------------------------------------------------------- drop_identities

_IDENTITY = {A + "mul.Tensor": 1.0, A + "div.Tensor": 1.0, A + "add.Tensor": 0.0, A + "sub.Tensor": 0.0}


def _find_identities(graph: Graph) -> list[Node]:
    out = []
    for n in graph.nodes:
        if n.op in _IDENTITY and len(n.inputs) == 1 and n.attr("other") == _IDENTITY[n.op] and \
                n.outputs[0].name not in graph.outputs and graph.spec(n.inputs[0]).shape == n.outputs[0].shape and \
                graph.spec(n.inputs[0]).dtype == n.outputs[0].dtype:
            out.append(n)
    return out


def _apply_identity(graph: Graph, n: Node) -> Graph:
    x, y = n.inputs[0], n.outputs[0].name
    nodes = [_renamed(m, {y: x}) for m in graph.nodes if m.name != n.name]
    return dataclasses.replace(graph, nodes=tuple(nodes))


def _find_empty_pads(graph: Graph) -> list[tuple[Node, tuple[str, ...]]]:
    """(the pad, the nodes reading it: they stand for it once it is gone)."""
    return [(n, tuple(u.name for u in _users(graph, n.outputs[0].name))) for n in graph.nodes
            if n.op == A + "constant_pad_nd.default" and len(n.inputs) == 1 and
            not any(int(v) for v in n.attr("pad") or ()) and n.outputs[0].name not in graph.outputs and
            graph.spec(n.inputs[0]).shape == n.outputs[0].shape and graph.spec(n.inputs[0]).dtype == n.outputs[0].dtype]


# ---------------------------------------------------------------------- merge_duplicates


@dataclass(frozen=True)
class _Merges:
    """Every duplicate of a graph, found in one pass: the nodes removed, each output of theirs renamed
    to the earlier node's, and what each remaining reader now stands for."""

    gone: frozenset[str]
    same: dict[str, str]
    stands: dict[str, tuple[str, ...]]


def _find_duplicates(graph: Graph) -> list[_Merges]:
    """[every merge, in one pass] or []. Each node is keyed after its reads are renamed to the earlier
    results, so a duplicate of a duplicate's reader is found in the same pass."""
    seen: dict[tuple, Node] = {}
    same: dict[str, str] = {}
    made_by: dict[str, str] = {}  # a removed output -> the node that made it
    stands: dict[str, tuple[str, ...]] = {}
    for n in graph.nodes:
        m = _renamed(n, same)
        for t in n.inputs:  # a reader of a removed node stands for it, and for what it stood for
            if t in made_by:
                d = made_by[t]
                stands[n.name] = tuple(dict.fromkeys(stands.get(n.name, ()) + (d,) + stands.get(d, ())))
        base = n.op.split(".")[-2] if "." in n.op else n.op
        if base.endswith("_") or "empty" in base or not n.outputs:
            continue
        first = seen.setdefault((m.op, m.inputs, repr(m.attrs), tuple((o.shape, o.dtype) for o in m.outputs)), m)
        if first is not m:
            for d, f in zip(n.outputs, first.outputs):
                same[d.name], made_by[d.name] = f.name, n.name
    gone = frozenset(made_by.values())
    if not gone:
        return []
    return [_Merges(gone, same, {u: (u,) + s for u, s in stands.items() if u not in gone})]


def _apply_merge_duplicates(graph: Graph, place: _Merges) -> Graph:
    nodes = [_renamed(m, place.same) for m in graph.nodes if m.name not in place.gone]
    return dataclasses.replace(graph, nodes=tuple(nodes),
                               outputs=tuple(place.same.get(o, o) for o in graph.outputs))


# ---------------------------------------------------------------------- pointwise_conv_as_gemm

_ACTIVATIONS = frozenset(A + f"{op}.default" for op in ("relu", "sigmoid", "tanh", "gelu", "silu", "hardtanh",
                                                        "leaky_relu", "elu", "hardswish", "mish"))


def _pointwise_conv(graph: Graph, n: Node | None) -> bool:
    """``n`` is a 1×1 (×1) convolution with stride 1, no padding, no dilation, not transposed."""
    if n is None or n.op != A + "convolution.default" or n.attr("transposed"):
        return False
    w = graph.spec(n.inputs[1]).shape
    nsp = len(w) - 2
    return nsp >= 1 and all(k == 1 for k in w[2:]) and tuple(n.attr("stride") or ()) == (1,) * nsp and \
        not any(int(v) for v in n.attr("padding") or ()) and all(int(v) == 1 for v in n.attr("dilation") or ())


def _find_pointwise_convs(graph: Graph) -> list[Node]:
    out = []
    for n in graph.nodes:
        if len(n.inputs) != 2 or not _pointwise_conv(graph, n):
            continue
        x, w = (graph.spec(t) for t in n.inputs)
        y = n.outputs[0]
        if x.dtype != "float32" or w.dtype != "float32" or len(x.shape) != len(w.shape):
            continue
        users = _users(graph, y.name)
        if len(users) == 1 and users[0].op in _ACTIVATIONS and y.name not in graph.outputs:
            continue  # cuDNN fuses the activation
        out.append(n)
    return out


def _apply_pointwise_conv(graph: Graph, n: Node) -> Graph:
    x, w = n.inputs
    xs, ws = graph.spec(x).shape, graph.spec(w).shape
    y = n.outputs[0]
    batch, cin, cout = xs[0], xs[1], ws[0]
    g = int(n.attr("groups") or 1)
    pixels = 1
    for d in xs[2:]:
        pixels *= d
    node = _NewNodes(graph, n.name, n.source)
    new = node.nodes

    def view(t: str, shape: Sequence[int], out: str | None = None) -> str:
        return node(A + "view.default", [t], shape, (("size", tuple(shape)),), out,
                    None if out is None else node.name())

    # The product keeps the convolution's node name: reports, and constraints naming it, still fit.
    if g == 1:
        prod = node(A + "matmul.default", [view(w, (cout, cin)), view(x, (batch, cin, pixels))], (batch, cout, pixels),
                    node_name=n.name)
    else:
        prod = node(A + "matmul.default", [view(w, (g, cout // g, cin // g)), view(x, (batch, g, cin // g, pixels))],
                    (batch, g, cout // g, pixels), node_name=n.name)
    view(prod, y.shape, out=y.name)
    return _replace(graph, [n], new)


# ---------------------------------------------------------------------- pool_before_pointwise_conv

_AVG_POOLS = {A + "avg_pool2d.default": 2, A + "avg_pool3d.default": 3}


def _find_pool_after_pointwise(graph: Graph) -> list[tuple[Node, Node]]:
    out = []
    for pool in graph.nodes:
        nsp = _AVG_POOLS.get(pool.op)
        if nsp is None:
            continue
        conv = graph.producer(pool.inputs[0])
        if not _pointwise_conv(graph, conv) or len(graph.spec(conv.inputs[0]).shape) != nsp + 2:
            continue
        y = conv.outputs[0]
        if y.dtype != "float32" or len(_users(graph, y.name)) != 1 or y.name in graph.outputs:
            continue
        biased = len(conv.inputs) > 2 and conv.inputs[2] is not None
        # Each output of an average pool is a weighted sum of its window with weights adding up to
        # 1 — unless padded zeros are counted or the divisor is overridden; then a bias does not
        # pass through it (a weighted sum of b is not b), while W·x still does.
        if biased and (any(int(v) for v in pool.attr("padding") or ()) or pool.attr("divisor_override") is not None):
            continue
        cin, cout = graph.spec(conv.inputs[0]).shape[1], y.shape[1]
        area = 1
        for a, b in zip(y.shape[2:], pool.outputs[0].shape[2:]):
            area *= a / max(b, 1)
        # Pooling first reads the input and writes it 1/area the size; worth it unless the
        # convolution narrows the channels more than the pool shrinks the pixels.
        if cin > area * cout:
            continue
        out.append((conv, pool))
    return out


def _apply_pool_before_pointwise(graph: Graph, place) -> Graph:
    conv, pool = place
    x = conv.inputs[0]
    xs = graph.spec(x).shape
    z = pool.outputs[0]
    pooled = TensorSpec(_fresh(graph, pool.name)(), (xs[0], xs[1], *z.shape[2:]), graph.spec(x).dtype)
    # The pool keeps its name, the convolution its own (reports and constraints naming either
    # still fit); the convolution now writes the pool's output tensor.
    first = Node(pool.name, pool.op, (x,), (pooled,), pool.attrs, pool.source)
    second = Node(conv.name, conv.op, (pooled.name, *conv.inputs[1:]), (z,), conv.attrs, conv.source)
    return _replace(graph, [conv, pool], [first, second])


# ---------------------------------------------------------------------- gather_of_log_softmax


def _find_gather_of_log_softmax(graph: Graph) -> list[tuple[Node, Node]]:
    out = []
    for g in graph.nodes:
        if g.op != A + "gather.default" or g.attr("sparse_grad"):
            continue
        ls = graph.producer(g.inputs[0])
        if ls is None or ls.op != A + "_log_softmax.default" or ls.attr("half_to_float"):
            continue
        y, idx = ls.outputs[0], graph.spec(g.inputs[1])
        if y.dtype != "float32" or len(_users(graph, y.name)) != 1 or y.name in graph.outputs or not y.shape:
            continue
        d = int(ls.attr("dim")) % len(y.shape)
        if int(g.attr("dim")) % len(y.shape) != d or len(idx.shape) != len(y.shape):
            continue
        if any(a != b for e, (a, b) in enumerate(zip(idx.shape, y.shape)) if e != d):
            continue  # the index must span the other dims, for logsumexp's result to broadcast over it
        out.append((ls, g))
    return out


def _apply_gather_of_log_softmax(graph: Graph, place) -> Graph:
    ls, g = place
    x, idx = ls.inputs[0], g.inputs[1]
    xs = graph.spec(x).shape
    d = int(ls.attr("dim")) % len(xs)
    name = _fresh(graph, g.name)
    lse_shape = tuple(1 if e == d else n for e, n in enumerate(xs))
    # The row reduction stands for the log-softmax (its new node is named after it), the rest for
    # the gather: every reference node stays covered by a task.
    lse = TensorSpec(_fresh(graph, ls.name)(), lse_shape, "float32")
    picked = TensorSpec(name(), g.outputs[0].shape, "float32")
    new = [Node(lse.name, A + "logsumexp.default", (x,), (lse,), (("dim", (d,)), ("keepdim", True)), ls.source),
           # The gather keeps its name: reports, and constraints naming it, still fit.
           Node(g.name, g.op, (x, idx), (picked,), g.attrs, g.source),
           Node(name(), A + "sub.Tensor", (picked.name, lse.name), (g.outputs[0],), (("alpha", 1),), g.source)]
    return _replace(graph, [ls, g], new)


# ---------------------------------------------------------------------- fold_batch_norm

_BN_EVAL = A + "_native_batch_norm_legit_no_training.default"


def _find_conv_then_eval_bn(graph: Graph) -> list[tuple[Node, Node]]:
    weights = {s.name for s in graph.weights}
    out = []
    for bn in graph.nodes:
        if bn.op != _BN_EVAL:
            continue
        conv = graph.producer(bn.inputs[0])
        if conv is None or conv.op != A + "convolution.default" or conv.attr("transposed"):
            continue
        y = conv.outputs[0]
        if len(_users(graph, y.name)) != 1 or y.name in graph.outputs or y.dtype != "float32":
            continue
        if any(_users(graph, o.name) or o.name in graph.outputs for o in bn.outputs[1:]):
            continue
        if not all(t in weights and graph.spec(t).dtype == "float32" for t in conv.inputs[1:] + bn.inputs[1:]):
            continue  # (folding computes new weights once, at create: every operand must be a weight)
        out.append((conv, bn))
    return out


def _bn_operands(bn: Node) -> tuple[str | None, str | None, str, str]:
    """(weight, bias, running mean, running var) of an inference-mode batch norm: an absent affine
    map is an attribute set to None, the rest are its inputs in order."""
    given = iter(bn.inputs[1:])
    absent = {k for k, v in bn.attrs if v is None}
    gamma, beta = (None if k in absent else next(given) for k in ("weight", "bias"))
    return gamma, beta, next(given), next(given)


def _apply_fold_batch_norm(graph: Graph, place) -> Graph:
    conv, bn = place
    x, w = conv.inputs[0], conv.inputs[1]
    b = conv.inputs[2] if len(conv.inputs) > 2 else None
    gamma, beta, mean, var = _bn_operands(bn)
    ws = graph.spec(w).shape
    c = ws[0]
    node = _NewNodes(graph, bn.name, bn.source)
    new = node.nodes

    # scale = gamma / sqrt(var + eps); w' = w * scale (per output channel); b' = (b - mean) * scale + beta
    std = node(A + "add.Tensor", [var], (c,), (("other", float(bn.attr("eps"))), ("alpha", 1)))
    scale = node(A + "rsqrt.default", [std], (c,))
    if gamma is not None:
        scale = node(A + "mul.Tensor", [gamma, scale], (c,))
    w2 = node(A + "mul.Tensor", [w, node(A + "view.default", [scale], (c,) + (1,) * (len(ws) - 1),
                                        (("size", (c,) + (1,) * (len(ws) - 1)),))], ws)
    shifted = node(A + "sub.Tensor", [b, mean], (c,), (("alpha", 1),)) if b is not None else \
        node(A + "neg.default", [mean], (c,))
    b2 = node(A + "mul.Tensor", [shifted, scale], (c,))
    if beta is not None:
        b2 = node(A + "add.Tensor", [b2, beta], (c,), (("alpha", 1),))
    # The convolution keeps its node name and writes the batch norm's result tensor.
    attrs = tuple((k, v) for k, v in conv.attrs if k != "bias")
    new.append(Node(conv.name, conv.op, (x, w2, b2), (bn.outputs[0],), attrs, conv.source))
    return _replace(graph, [conv, bn], new)


# ---------------------------------------------------------------------- instance_norm_as_group_norm

_BN_NO_STATS = A + "_native_batch_norm_legit.no_stats"


def _find_instance_norms(graph: Graph) -> list[tuple[Node, Node, Node]]:
    """(view in, batch norm, view out) of F.instance_norm as PyTorch decomposes it: x [N, C, ...]
    viewed as [1, N*C, ...], batch-normalised with batch statistics, viewed back."""
    out = []
    for bn in graph.nodes:
        if bn.op != _BN_NO_STATS or not bn.inputs:
            continue
        vin = graph.producer(bn.inputs[0])
        if vin is None or vin.op not in ops.RESHAPES:
            continue
        x0, y = graph.spec(vin.inputs[0]), bn.outputs[0]
        if len(x0.shape) < 3 or x0.dtype != "float32" or tuple(y.shape) != (1, x0.shape[0] * x0.shape[1]) + \
                tuple(x0.shape[2:]) or len(_users(graph, vin.outputs[0].name)) != 1:
            continue
        users = _users(graph, y.name)
        if len(users) != 1 or users[0].op not in ops.RESHAPES or y.name in graph.outputs or \
                tuple(users[0].outputs[0].shape) != tuple(x0.shape):
            continue
        if any(_users(graph, o.name) or o.name in graph.outputs for o in bn.outputs[1:]):
            continue
        if any(_affine_source(graph, t, x0.shape[0], x0.shape[1]) is None for t in bn.inputs[1:]):
            continue
        out.append((vin, bn, users[0]))
    return out


def _affine_source(graph: Graph, t: str, n: int, c: int) -> str | None:
    """The [C] tensor an instance norm's weight / bias [N*C] repeats N times, or None."""
    rep = graph.producer(t)
    if rep is None or rep.op != A + "repeat.default" or tuple(rep.attr("repeats") or ()) != (n,):
        return None
    return rep.inputs[0] if tuple(graph.spec(rep.inputs[0]).shape) == (c,) else None


def _apply_instance_norm(graph: Graph, place) -> Graph:
    vin, bn, vout = place
    x0 = graph.spec(vin.inputs[0])
    n, c = x0.shape[0], x0.shape[1]
    hxw = math.prod(x0.shape[2:])
    affine = [_affine_source(graph, t, n, c) for t in bn.inputs[1:]]
    given = {k for k, v in bn.attrs if k in ("weight", "bias") and v is None}
    wb = iter(affine)
    w, b = (None if k in given else next(wb, None) for k in ("weight", "bias"))
    names = _fresh(graph, bn.name)
    outs = (vout.outputs[0], TensorSpec(names(), (n, c), "float32"), TensorSpec(names(), (n, c), "float32"))
    gn = Node(bn.name, A + "native_group_norm.default", tuple(t for t in (x0.name, w, b) if t), outs,
              (("N", n), ("C", c), ("HxW", hxw), ("group", c), ("eps", float(bn.attr("eps")))) +
              tuple((k, None) for k in ("weight", "bias") if (w if k == "weight" else b) is None), bn.source)
    return _replace(graph, [vin, bn, vout], [gn])


# ---------------------------------------------------------------------- group_norm_over_rows

def _find_group_norms_over_rows(graph: Graph) -> list[Node]:
    """Group norms of float32 x with one position a channel ([N, C] or [N, C, 1, ...]) whose
    mean / rstd outputs are unused."""
    out = []
    for gn in graph.nodes:
        if gn.op != A + "native_group_norm.default" or not gn.inputs:
            continue
        xs = tuple(graph.spec(gn.inputs[0]).shape)
        if len(xs) < 2 or math.prod(xs[2:]) != 1 or any(graph.spec(t).dtype != "float32" for t in gn.inputs):
            continue
        if any(_users(graph, o.name) or o.name in graph.outputs for o in gn.outputs[1:]):
            continue
        out.append(gn)
    return out


def _apply_group_norm_over_rows(graph: Graph, gn: Node) -> Graph:
    xs = tuple(graph.spec(gn.inputs[0]).shape)
    n, c, g = xs[0], xs[1], int(gn.attr("group"))
    absent = {k for k, v in gn.attrs if k in ("weight", "bias") and v is None}
    given = iter(gn.inputs[1:])
    affine = [(op, None if k in absent else next(given, None)) for op, k in (("mul", "weight"), ("add", "bias"))]
    affine = [(op, t) for op, t in affine if t is not None]
    node = _NewNodes(graph, gn.name, gn.source)
    rows = node(A + "view.default", [gn.inputs[0]], (n, g, c // g), (("size", (n, g, c // g)),))
    ln = node.name()
    stats = (TensorSpec(node.name(), (n, g, 1), "float32"), TensorSpec(node.name(), (n, g, 1), "float32"))
    node.nodes.append(Node(ln, A + "native_layer_norm.default", (rows,),
                           (TensorSpec(ln, (n, g, c // g), "float32"),) + stats,
                           (("normalized_shape", (c // g,)), ("weight", None), ("bias", None),
                            ("eps", float(gn.attr("eps")))), gn.source))
    last = gn.outputs[0].name
    y = node(A + "view.default", [ln], xs, (("size", xs),), out=None if affine else last,
             node_name=None if affine else node.name())
    per = (c,) + (1,) * (len(xs) - 2)
    for i, (op, t) in enumerate(affine):
        tv = t if tuple(graph.spec(t).shape) == per else node(A + "view.default", [t], per, (("size", per),))
        y = node(A + f"{op}.Tensor", [y, tv], xs, (("alpha", 1),) if op == "add" else (),
                 out=last if i == len(affine) - 1 else None, node_name=node.name() if i == len(affine) - 1 else None)
    return _replace(graph, [gn], node.nodes)


# ---------------------------------------------------------------------- mish_from_parts

def _only_into(graph: Graph, n: Node | None, op: str, user: Node, dtype: str = "float32") -> bool:
    """Whether ``n`` is an ``op`` node with one result, of ``dtype``, that only ``user`` reads."""
    if n is None or n.op != op or len(n.outputs) != 1 or n.outputs[0].dtype != dtype:
        return False
    t = n.outputs[0].name
    return t not in graph.outputs and [u.name for u in _users(graph, t)] == [user.name]


def _find_mish_parts(graph: Graph) -> list[tuple[Node, ...]]:
    """(exp, log1p, gt, where, tanh, mul) of ``x * tanh(where(x > 20, x, log1p(exp(x))))``."""
    out = []
    for mul in graph.nodes:
        if mul.op != A + "mul.Tensor" or len(mul.inputs) != 2 or mul.outputs[0].dtype != "float32":
            continue
        for k in (0, 1):
            x, th = mul.inputs[1 - k], graph.producer(mul.inputs[k])
            if not _only_into(graph, th, A + "tanh.default", mul):
                continue
            wh = graph.producer(th.inputs[0])
            if not _only_into(graph, wh, A + "where.self", th) or wh.inputs[1] != x:
                continue
            gt, lg = graph.producer(wh.inputs[0]), graph.producer(wh.inputs[2])
            if not _only_into(graph, gt, A + "gt.Scalar", wh, "bool") or gt.inputs != (x,) or gt.attr("other") != 20:
                continue
            if not _only_into(graph, lg, A + "log1p.default", wh):
                continue
            ex = graph.producer(lg.inputs[0])
            if _only_into(graph, ex, A + "exp.default", lg) and ex.inputs == (x,) and graph.spec(x).dtype == "float32":
                out.append((ex, lg, gt, wh, th, mul))
                break
    return out


def _apply_mish_parts(graph: Graph, place) -> Graph:
    *parts, mul = place
    x = parts[0].inputs[0]
    # The mish node keeps the product's name and result: it stands for all six (covers).
    return _replace(graph, place, [Node(mul.name, A + "mish.default", (x,), mul.outputs, (), mul.source)])


# ---------------------------------------------------------------------- fold_channel_affine

_AFFINE_OPS = (A + "add.Tensor", A + "sub.Tensor", A + "mul.Tensor", A + "div.Tensor")


def _channel_operand(graph: Graph, y: TensorSpec, u: Node, consts: set[str], dim: int = 1
                     ) -> tuple[str, str | float] | None:
    """How ``u`` (add / sub / mul / div reading ``y``) combines ``y`` with a constant of one value
    per output channel (along ``dim`` of ``y``: 1 for a convolution, the last for a linear layer):
    (op, tensor of ``consts`` or Python scalar), with ``y`` on the left (``p + y`` and ``p * y``
    commute; ``p - y`` and ``p / y`` are not this form). None otherwise."""
    if u.op not in _AFFINE_OPS or u.outputs[0].dtype != "float32" or tuple(u.outputs[0].shape) != tuple(y.shape):
        return None
    op = u.op[len(A):].split(".")[0]
    alpha = u.attr("alpha") if u.has_attr("alpha") else 1
    if len(u.inputs) == 1:
        other = u.attr("other")
        if u.inputs[0] != y.name or isinstance(other, bool) or not isinstance(other, (int, float)):
            return None
        return op, float(other) * (float(alpha) if op in ("add", "sub") else 1.0)
    if len(u.inputs) != 2 or alpha != 1 or u.inputs[0] == u.inputs[1]:
        return None
    if u.inputs[0] == y.name:
        p = u.inputs[1]
    elif op in ("add", "mul"):
        p = u.inputs[0]
    else:
        return None
    if p not in consts or graph.spec(p).dtype != "float32":
        return None
    ps = tuple(graph.spec(p).shape)
    if len(ps) > len(y.shape):
        return None
    full = (1,) * (len(y.shape) - len(ps)) + ps  # p broadcast against y: only its channel dim may exceed 1
    if any(d != 1 for i, d in enumerate(full) if i != dim) or full[dim] not in (1, y.shape[dim]):
        return None
    return op, p


def _of_weights(graph: Graph) -> set[str]:
    """The tensors computed from weights alone (the weights too): what a create-time task makes
    (random draws are the graph's inputs, never a node's)."""
    known = {s.name for s in graph.weights}
    for n in graph.nodes:
        if n.inputs and all(t in known for t in n.inputs):
            known.update(o.name for o in n.outputs)
    return known


def _find_conv_then_channel_affine(graph: Graph) -> list[tuple[Node, Node]]:
    consts = _of_weights(graph)
    out = []
    for conv in graph.nodes:
        if conv.op != A + "convolution.default" or (conv.attr("transposed") and int(conv.attr("groups") or 1) != 1):
            continue  # (a grouped transposed weight interleaves its output channels over the groups)
        y = conv.outputs[0]
        users = _users(graph, y.name)
        if len(users) != 1 or y.name in graph.outputs or y.dtype != "float32":
            continue
        if not all(t in consts and graph.spec(t).dtype == "float32" for t in conv.inputs[1:]):
            continue  # (folding computes new weights once, at create: every operand must be a weight)
        how = _channel_operand(graph, y, users[0], consts)
        if how is None:
            continue
        op, p = how
        if op in ("add", "sub") and len(conv.inputs) < 3 and \
                (not isinstance(p, str) or math.prod(graph.spec(p).shape) != y.shape[1]):
            continue  # (one value added to a convolution without bias would need a bias tensor made)
        out.append((conv, users[0]))
    return out


def _apply_fold_channel_affine(graph: Graph, place) -> Graph:
    conv, u = place
    ws, c = graph.spec(conv.inputs[1]).shape, conv.outputs[0].shape[1]
    # output channels: a forward weight's dim 0, a transposed one's dim 1 (one group)
    wshape = (1, c) + (1,) * (len(ws) - 2) if conv.attr("transposed") else (c,) + (1,) * (len(ws) - 1)
    return _fold_affine(graph, conv, u, 1, wshape)


def _fold_affine(graph: Graph, layer: Node, u: Node, dim: int, wshape: tuple[int, ...]) -> Graph:
    """``layer`` (a convolution or a linear layer: x, W and maybe b) with its one reader ``u`` folded
    into its weights: ``u`` combines the output with a value per output channel (along ``dim`` of
    the output) or one value, which is viewed as ``wshape`` against W and as [C] against b."""
    y = layer.outputs[0]
    op, p = _channel_operand(graph, y, u, _of_weights(graph), dim=dim)
    x, w = layer.inputs[0], layer.inputs[1]
    b = layer.inputs[2] if len(layer.inputs) > 2 else None
    ws = graph.spec(w).shape
    c = y.shape[dim]
    node = _NewNodes(graph, u.name, u.source)

    def per_channel(t: str, shape: Sequence[int]) -> str:
        """``t`` viewed as ``shape`` (one value: all ones, broadcast)."""
        size = tuple(shape) if math.prod(graph.spec(t).shape) > 1 else (1,) * len(shape)
        return node(A + "view.default", [t], size, (("size", size),))

    if op in ("mul", "div"):
        scale = A + f"{op}.Tensor"
        if isinstance(p, str):
            w2 = node(scale, [w, per_channel(p, wshape)], ws)
            b2 = node(scale, [b, per_channel(p, (c,))], (c,)) if b is not None else None
        else:
            w2 = node(scale, [w], ws, (("other", p),))
            b2 = node(scale, [b], (c,), (("other", p),)) if b is not None else None
    else:
        w2 = w
        if isinstance(p, str):
            pc = per_channel(p, (c,))
            if b is None:
                b2 = pc if op == "add" else node(A + "neg.default", [pc], (c,))
            else:
                b2 = node(A + f"{op}.Tensor", [b, pc], (c,), (("alpha", 1),))
        else:
            b2 = node(A + f"{op}.Tensor", [b], (c,), (("other", p), ("alpha", 1)))
    # The layer keeps its node name and writes the folded op's result tensor (an absent bias is an
    # attribute of the node, None: gone once there is one).
    attrs = tuple((k, v) for k, v in layer.attrs if k != "bias") + (() if b2 is not None else (("bias", None),))
    node.nodes.append(Node(layer.name, layer.op, (x, w2) + ((b2,) if b2 is not None else ()), (u.outputs[0],),
                           attrs, layer.source))
    return _replace(graph, [layer, u], node.nodes)


# ---------------------------------------------------------------------- fold_feature_affine


def _find_linear_then_feature_affine(graph: Graph) -> list[tuple[Node, Node]]:
    consts = _of_weights(graph)
    out = []
    for lin in graph.nodes:
        if lin.op != A + "linear.default" or len(lin.inputs) < 2:
            continue
        y = lin.outputs[0]
        users = _users(graph, y.name)
        if len(users) != 1 or y.name in graph.outputs or y.dtype != "float32" or not y.shape:
            continue
        if not all(t in consts and graph.spec(t).dtype == "float32" for t in lin.inputs[1:]):
            continue  # (folding computes new weights once, at create: every operand but x must be a weight)
        how = _channel_operand(graph, y, users[0], consts, dim=len(y.shape) - 1)
        if how is None:
            continue
        op, p = how
        if not isinstance(p, str) or math.prod(graph.spec(p).shape) != y.shape[-1]:
            continue  # (one value for every feature: the GEMM's epilogue chain takes it, free, at run time)
        out.append((lin, users[0]))
    return out


def _apply_fold_feature_affine(graph: Graph, place) -> Graph:
    lin, u = place
    y = lin.outputs[0]
    return _fold_affine(graph, lin, u, len(y.shape) - 1, (y.shape[-1], 1))  # W is [out, in]


# ---------------------------------------------------------------------- merge_sibling_linears

#: Reader kinds a merged linear's slice may have: nothing a GEMM epilogue would have taken.
_SLICE_READERS = ("view", "attention")


def _find_sibling_linears(graph: Graph) -> list[tuple[Node, ...]]:
    """Groups of two or more float32 linears of one input, each of a weight (and bias) of the
    graph, with or without a bias alike, whose results are read only through views or by
    attention (the first group only: each merge changes the graph)."""
    weights = {s.name for s in graph.weights}
    groups: dict[tuple[str, bool], list[Node]] = {}
    for n in graph.nodes:
        if n.op != A + "linear.default" or not 2 <= len(n.inputs) <= 3:
            continue
        y = n.outputs[0]
        if y.dtype != "float32" or y.name in graph.outputs or len(y.shape) < 1:
            continue
        if not all(t in weights and graph.spec(t).dtype == "float32" for t in n.inputs[1:]):
            continue
        if len(graph.spec(n.inputs[1]).shape) != 2 or graph.spec(n.inputs[0]).dtype != "float32":
            continue
        users = _users(graph, y.name)
        if not users or any(ops.kind(u.op) not in _SLICE_READERS for u in users):
            continue
        groups.setdefault((n.inputs[0], len(n.inputs) == 3), []).append(n)
    return [tuple(g) for g in groups.values() if len(g) > 1][:1]


def _apply_sibling_linears(graph: Graph, group: tuple[Node, ...]) -> Graph:
    first = group[0]
    x = first.inputs[0]
    k = graph.spec(first.inputs[1]).shape[1]
    widths = [graph.spec(n.inputs[1]).shape[0] for n in group]
    total = sum(widths)
    node = _NewNodes(graph, first.name, first.source)
    w = node(A + "cat.default", [n.inputs[1] for n in group], (total, k), (("dim", 0),))
    args = [x, w]
    if len(first.inputs) == 3:
        args.append(node(A + "cat.default", [n.inputs[2] for n in group], (total,), (("dim", 0),)))
    lead = tuple(first.outputs[0].shape[:-1])
    # the product keeps the first linear's name (reports, constraints naming it still fit)
    y = node(A + "linear.default", args, lead + (total,), node_name=first.name)
    start = 0
    for n, width in zip(group, widths):
        node(A + "slice.Tensor", [y], lead + (width,),
             (("dim", len(lead)), ("start", start), ("end", start + width), ("step", 1)),
             out=n.outputs[0].name, node_name=node.name())
        start += width
    # The new nodes go where the first linear was: every reader of any of them comes after it, and
    # they read only x (defined before the first) and weights.
    gone = {n.name for n in group}
    nodes: list[Node] = []
    for m in graph.nodes:
        if m.name == first.name:
            nodes.extend(node.nodes)
        elif m.name not in gone:
            nodes.append(m)
    return dataclasses.replace(graph, nodes=tuple(nodes))


# ---------------------------------------------------------------------- conv_bias_into_elementwise

#: Elementwise ops a convolution's epilogue computes after its bias (kinds/conv.py claims them).
_CONV_EPILOGUE_ACTS = (A + "relu.default", A + "sigmoid.default", A + "tanh.default", A + "silu.default",
                       A + "gelu.default")


def _find_conv_bias_before_elementwise(graph: Graph) -> list[tuple[Node, Node]]:
    out = []
    for conv in graph.nodes:
        if conv.op != A + "convolution.default" or len(conv.inputs) < 3 or not conv.attr("transposed"):
            continue  # (forward engines fuse the bias; a bias add would also keep a pool's hook from it)
        y = conv.outputs[0]
        users = _users(graph, y.name)
        if len(users) != 1 or y.name in graph.outputs or y.dtype != "float32":
            continue
        u = users[0]
        if ops.kind(u.op) != "elementwise" or u.op.startswith("stitch."):
            continue
        if u.op in _CONV_EPILOGUE_ACTS and u.inputs == (y.name,):
            continue  # the activation fuses into the convolution, after its bias
        if _ends_in_a_hook(graph, u):
            continue
        if graph.spec(conv.inputs[2]).dtype != "float32":
            continue
        out.append((conv, u))
    return out


def _ends_in_a_hook(graph: Graph, u: Node) -> bool:
    """Whether the chain of elementwise nodes from ``u`` (each the only reader of the last) ends
    in an op that is not elementwise: a pool's or a reduction's prologue hook then takes the chain,
    and a hook takes functions of one tensor only — not an add of the bias."""
    n = u
    for _ in range(len(graph.nodes)):
        t = n.outputs[0].name
        users = _users(graph, t)
        if t in graph.outputs or len(users) != 1:
            return False
        n = users[0]
        if ops.kind(n.op) != "elementwise":
            return True
    return False


def _apply_conv_bias_into_elementwise(graph: Graph, place) -> Graph:
    conv, _ = place
    x, w, b = conv.inputs[:3]
    y = conv.outputs[0]
    node = _NewNodes(graph, conv.name, conv.source)
    # The convolution keeps its node name and writes a fresh tensor; the add writes y.
    plain = node.name()
    attrs = tuple((k, v) for k, v in conv.attrs if k != "bias") + (("bias", None),)
    node.nodes.append(Node(conv.name, conv.op, (x, w), (TensorSpec(plain, y.shape, "float32"),), attrs,
                           conv.source))
    c = graph.spec(b).shape[0]
    per_channel = (c,) + (1,) * (len(y.shape) - 2)
    bv = node(A + "view.default", [b], per_channel, (("size", per_channel),))
    node(A + "add.Tensor", [plain, bv], y.shape, (("alpha", 1),), out=y.name, node_name=node.name())
    return _replace(graph, [conv], node.nodes)


# ---------------------------------------------------------------------- select_before_producer

def _reshape_dim(src: Sequence[int], dst: Sequence[int], d: int) -> int | None:
    """The dim of ``src`` that a row-major reshape to ``dst`` keeps whole as its dim ``d`` (the same
    size, and the same number of elements before it), or None."""
    before = math.prod(dst[:d])
    for e in range(len(src)):
        if math.prod(src[:e]) == before and src[e] == dst[d] and dst[d] != 1:
            return e
    return None


def _select_source(graph: Graph, sel: Node) -> tuple[Node, int] | None:
    """(the producer the select moves before, the dim of its operand it selects) or None."""
    if sel.op != A + "select.int" or len(sel.inputs) != 1:
        return None
    y = sel.inputs[0]
    p = graph.producer(y)
    if p is None or y in graph.outputs or len(_users(graph, y)) != 1 or p.outputs[0].dtype != "float32":
        return None
    shape = graph.spec(y).shape
    d = int(sel.attr("dim")) % len(shape)
    if p.op == A + "permute.default":
        return p, int(p.attr("dims")[d]) % len(shape)
    if p.op in ops.RESHAPES and len(p.inputs) == 1:
        e = _reshape_dim(graph.spec(p.inputs[0]).shape, shape, d)
        return (p, e) if e is not None else None
    if p.op == A + "bmm.default" and len(p.inputs) == 2:
        return p, d
    return None


def _find_selects_of_producers(graph: Graph) -> list[Node]:
    return [n for n in graph.nodes if _select_source(graph, n) is not None]


def _apply_select_before_producer(graph: Graph, sel: Node) -> Graph:
    p, e = _select_source(graph, sel)
    y = graph.spec(sel.inputs[0])
    d = int(sel.attr("dim")) % len(y.shape)
    i = int(sel.attr("index")) % y.shape[d]
    out = sel.outputs[0]
    # named after the reference nodes (a select moved again: after the one it came from)
    node = _NewNodes(graph, sel.name.split("__rw", 1)[0], sel.source or p.source)
    mine = _NewNodes(graph, p.name.split("__rw", 1)[0], p.source or sel.source)  # these stand for the producer

    def select(t: str, dim: int) -> str:
        shape = graph.spec(t).shape
        return node(A + "select.int", [t], shape[:dim] + shape[dim + 1:], (("dim", dim), ("index", i)))

    if p.op == A + "permute.default":
        dims = [int(v) % len(y.shape) for v in p.attr("dims")]
        rest = [v - (v > e) for v in dims if v != e]
        x = select(p.inputs[0], e)
        mine(A + "permute.default", [x], out.shape, (("dims", tuple(rest)),), out=out.name, node_name=mine.name())
    elif p.op in ops.RESHAPES:
        x = select(p.inputs[0], e)
        mine(A + "view.default", [x], out.shape, (("size", tuple(out.shape)),), out=out.name, node_name=mine.name())
    else:  # bmm [B, M, K] x [B, K, N]
        a, b = p.inputs
        (nb, m, k), n = graph.spec(a).shape, graph.spec(b).shape[2]
        if d == 0:
            mine(A + "mm.default", [select(a, 0), select(b, 0)], out.shape, out=out.name, node_name=mine.name())
        else:  # one row of a (a 1-row product), or one column of b (a 1-column one)
            t, keep = (a, 1) if d == 1 else (b, 2)
            shape = list(graph.spec(t).shape)
            shape[keep] = 1
            one = node(A + "slice.Tensor", [t], tuple(shape), (("dim", keep), ("start", i), ("end", i + 1),
                                                                   ("step", 1)))
            prod = mine(A + "bmm.default", [one, b] if d == 1 else [a, one], (nb, 1, n) if d == 1 else (nb, m, 1))
            mine(A + "view.default", [prod], out.shape, (("size", tuple(out.shape)),), out=out.name,
                 node_name=mine.name())
    # (nodes named after the producer stand for it, those after the select for the select)
    return _replace(graph, [p, sel], node.nodes + mine.nodes)


#: Library choices made on every graph (module docstring), in order.
ALWAYS: tuple[Rewrite, ...] = (
    Rewrite("merge_duplicates", _find_duplicates, _apply_merge_duplicates, lambda place: place.stands),
    Rewrite("drop_empty_pads", _find_empty_pads, lambda graph, place: _apply_identity(graph, place[0]),
            lambda place: {u: (u, place[0].name) for u in place[1]}),
    Rewrite("mish_from_parts", _find_mish_parts, _apply_mish_parts,
            lambda place: {place[-1].name: tuple(n.name for n in place)}),
    Rewrite("instance_norm_as_group_norm", _find_instance_norms, _apply_instance_norm,
            lambda place: {place[1].name: tuple(n.name for n in place)}),
    # (first: a folded convolution gains a bias, and is no longer a bare 1x1 product for the next two)
    Rewrite("fold_batch_norm", _find_conv_then_eval_bn, _apply_fold_batch_norm),
    Rewrite("fold_channel_affine", _find_conv_then_channel_affine, _apply_fold_channel_affine),
    Rewrite("fold_feature_affine", _find_linear_then_feature_affine, _apply_fold_feature_affine),
    Rewrite("merge_sibling_linears", _find_sibling_linears, _apply_sibling_linears,
            lambda group: {group[0].name: tuple(n.name for n in group)}),
    Rewrite("pool_before_pointwise_conv", _find_pool_after_pointwise, _apply_pool_before_pointwise),
    Rewrite("pointwise_conv_as_gemm", _find_pointwise_convs, _apply_pointwise_conv),
    Rewrite("gather_of_log_softmax", _find_gather_of_log_softmax, _apply_gather_of_log_softmax),
    Rewrite("select_before_producer", _find_selects_of_producers, _apply_select_before_producer),
    Rewrite("group_norm_over_rows", _find_group_norms_over_rows, _apply_group_norm_over_rows),
    Rewrite("conv_bias_into_elementwise", _find_conv_bias_before_elementwise, _apply_conv_bias_into_elementwise),
)


def _near_conv(graph: Graph, n: Node) -> bool:
    """Whether another convolution reaches ``n``'s input or output through the ops a
    channels-last region keeps its layout through (elementwise, layout ops, norms, pooling, joins):
    then ``n`` sits in that region under tensor cores, and a GEMM there would convert around it."""
    passes = ("elementwise", "view", "batch_norm", "group_norm", "pool", "cat")

    def conv(m: Node) -> bool:
        return m is not n and m.op == A + "convolution.default"

    seen: set[str] = set()
    todo = [n.inputs[0]]
    while todo:
        m = graph.producer(todo.pop())
        if m is None or m.name in seen:
            continue
        seen.add(m.name)
        if conv(m):
            return True
        if ops.kind(m.op) in passes:
            todo.extend(m.inputs)
    todo = [n.outputs[0].name]
    while todo:
        for m in _users(graph, todo.pop()):
            if m.name in seen:
                continue
            seen.add(m.name)
            if conv(m):
                return True
            if ops.kind(m.op) in passes:
                todo.extend(o.name for o in m.outputs)
    return False


def _find_lone_pointwise_convs(graph: Graph) -> list[Node]:
    return [n for n in _find_pointwise_convs(graph) if not _near_conv(graph, n)]


#: The variants of rewrites of ALWAYS taken under a policy with tensor cores (convolutions
#: channels-last): a 1×1 convolution becomes a GEMM only away from other convolutions.
UNDER_TENSOR_CORES = {"pointwise_conv_as_gemm": Rewrite("pointwise_conv_as_gemm", _find_lone_pointwise_convs,
                                                        _apply_pointwise_conv)}


def apply_always(graph: Graph, tensor_cores: bool = False, covers: dict[str, tuple[str, ...]] | None = None) -> Graph:
    """``graph`` with the rewrites of :data:`ALWAYS` applied (under a policy with
    ``tensor_cores``, those of :data:`UNDER_TENSOR_CORES` in their place); ``covers`` gains the
    nodes that stand for several reference nodes (:attr:`Rewrite.covers`)."""
    for rw in ALWAYS:
        graph = (UNDER_TENSOR_CORES.get(rw.name, rw) if tensor_cores else rw).apply(graph, covers)
    return graph


REWRITES: dict[str, Rewrite] = {r.name: r for r in (
    Rewrite("reduce_after_linear", _find_reduce_after_linear, _apply_reduce_after_linear),
    Rewrite("drop_identities", _find_identities, _apply_identity),
)}


def apply_rewrites(graph: Graph, names: Sequence[str]) -> Graph:
    """``graph`` with the named rewrites applied, in order (unknown names raise ValueError)."""
    for nm in names:
        rw = REWRITES.get(nm)
        if rw is None:
            raise ValueError(f"no rewrite {nm!r}; known: {', '.join(REWRITES)}")
        graph = rw.apply(graph)
    return graph


__all__ = ["Rewrite", "REWRITES", "ALWAYS", "UNDER_TENSOR_CORES", "apply_rewrites", "apply_always"]
