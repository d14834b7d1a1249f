"""The cost model's FLOP and byte counts against counts made by hand, for every task kind and for
the reference nodes (``Plan.tasks[*].flops / .bytes``, ``Plan.node_costs``): the roofline floors
and the loop's choice of the task to work on rest on them.

What is counted, the conventions written once here and used by every hand count below:

* a multiply-add is 2 FLOPs (GEMMs, convolutions, attention's two products, recurrences);
  a convolution reads ``in_channels / groups x kernel`` inputs per output element; a transposed
  one scatters each input element to ``out_channels / groups x kernel`` outputs;
* every elementwise instruction is 1 FLOP per element it makes (a fused Ew task: its instructions
  x its output elements; a hook: per element it touches; a GEMM: one for its epilogue pass and one
  per chained op, per output element; a convolution: one per output element for its bias and one
  for its activation);
* a reduction: its op's FLOPs per input element (sum, mean, max 1; softmax 5; layer norm 8; var,
  logsumexp, RMS norm 4), its epilogue per result; a pool one per window tap; a scan one per
  element; batch / group statistics 4 per element;
* bytes are the fewest a task can move: every distinct element of every view it reads (a
  broadcast view counts once per distinct element) and of every view it writes, at the storage
  dtype's size.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given

from stitchcuda import frontend, ops
from stitchcuda import plan as P
from tests import sweep_cases
from tests.sweep import sweep
from tests.plan_sim import where_narrow
from tests.test_coverage_cases import Fn

F32 = 4


def _plan(f, inputs, policy: str = "fp32", cudnn: bool = False, **modules) -> P.Plan:
    """``cudnn``: cuDNN's convolutions asked for where the narrow kernel would take them by default."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Fn(f, **modules)
    graph = frontend.capture(model, inputs, "costs", supported_ops=ops.supported()).graph
    return P.plan(graph, policy, constraints=where_narrow(graph, "channels_first") if cudnn else None)


def _tasks(plan: P.Plan, kind: str) -> list[P.Task]:
    return [t for t in plan.tasks if type(t.params).__name__ == kind + "Spec"]


def _one(plan: P.Plan, kind: str) -> P.Task:
    (t,) = _tasks(plan, kind)
    return t


def _node(plan: P.Plan, op: str) -> P.NodeCost:
    (c,) = [c for c in plan.node_costs if c.op == "aten." + op]
    return c


# ---------------------------------------------------------------------- pooling


@pytest.mark.parametrize("mode,k,s,p", [("max", 3, 1, 1), ("avg", 3, 2, 1), ("max", 2, 2, 0), ("avg", 4, 1, 0)])
def test_pool(mode, k, s, p):
    """A pool is one FLOP per window tap (padding taps included), its task and its node alike: an
    overlapping 3x3 window at stride 1 reads each input nine times (the node counted the input's
    elements, nine times too few)."""
    n, c, h, w = 2, 3, 9, 8
    f = F.max_pool2d if mode == "max" else F.avg_pool2d
    plan = _plan(lambda s_, x: f(x, k, s, p), [torch.randn(n, c, h, w)])
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    taps = n * c * oh * ow * k * k
    t = _one(plan, "Pool")
    assert (t.flops, t.bytes) == (taps, F32 * (n * c * h * w + n * c * oh * ow))
    node = _node(plan, "max_pool2d_with_indices.default" if mode == "max" else "avg_pool2d.default")
    assert (node.flops, node.bytes) == (taps, t.bytes)


def test_adaptive_pool():
    """An adaptive pool whose windows tile the input: (8, 9) to (2, 3) is 4 x 3 taps per output."""
    plan = _plan(lambda s_, x: F.adaptive_avg_pool2d(torch.tanh(x), (2, 3)), [torch.randn(2, 3, 8, 9)])
    t = _one(plan, "Pool")
    outs = 2 * 3 * 2 * 3
    assert t.flops == outs * 12 * 2, "12 taps, and the tanh hook on each"
    assert _node(plan, "_adaptive_avg_pool2d.default").flops == outs * 12


# ---------------------------------------------------------------------- attention


@pytest.mark.parametrize("d,dv", [(32, 32), (32, 16), (40, 24)])
def test_attention_node(d, dv):
    """The reference's attention: q kᵀ over the head dim, p v over the value's dim, softmax 5 per
    score; the node counted q kᵀ twice (4 d per score) whatever the value's dim."""
    b, h, lq, lk = 2, 3, 9, 11
    q, k, v = torch.randn(b, h, lq, d), torch.randn(b, h, lk, d), torch.randn(b, h, lk, dv)
    plan = _plan(lambda s_, q, k, v: F.scaled_dot_product_attention(q, k, v), [q, k, v])
    node = _node(plan, "scaled_dot_product_attention.default")
    scores = b * h * lq * lk
    assert node.flops == 2 * scores * d + 2 * scores * dv + 5 * scores
    assert node.bytes == F32 * (q.numel() + k.numel() + v.numel() + b * h * lq * dv)


@pytest.mark.parametrize("causal,heads_kv", [(False, 3), (True, 3), (False, 1)])
def test_attention_task(causal, heads_kv):
    """The fused kernel: two products over the visible scores (a causal mask hides those above the
    diagonal), grouped-query heads reading their shared k and v once."""
    b, h, l, d = 2, 3, 16, 32
    q, k, v = torch.randn(b, h, l, d), torch.randn(b, heads_kv, l, d), torch.randn(b, heads_kv, l, d)
    plan = _plan(lambda s_, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                     enable_gqa=heads_kv != h), [q, k, v])
    t = _one(plan, "Attention")
    visible = l * (l + 1) // 2 if causal else l * l
    assert t.flops == 4 * b * h * visible * d
    assert t.bytes == F32 * (2 * q.numel() + k.numel() + v.numel())


# ---------------------------------------------------------------------- reductions


def test_axis_reduction_counts_its_hooks():
    """A middle-axis mean with a hook before (per input element) and after (per result): the axis
    task left its epilogue out."""
    n, c, h, w = 2, 5, 6, 7
    plan = _plan(lambda s_, x: torch.sqrt(torch.exp(x).mean(1)), [torch.randn(n, c, h, w)])
    t = _one(plan, "Axis")
    assert len(t.params.prologue) == 1 and len(t.params.epilogue) == 1
    assert t.flops == n * c * h * w * 2 + n * h * w
    assert t.bytes == F32 * (n * c * h * w + n * h * w)


@pytest.mark.parametrize("op,per", [("softmax", 5), ("log_softmax", 5), ("sum", 1), ("logsumexp", 4)])
def test_row_reduction(op, per):
    rows, cols = 6, 40
    f = {"softmax": lambda x: x.softmax(-1), "log_softmax": lambda x: x.log_softmax(-1), "sum": lambda x: x.sum(-1),
         "logsumexp": lambda x: x.logsumexp(-1)}[op]
    plan = _plan(lambda s_, x: torch.relu(f(torch.tanh(x))), [torch.randn(rows, cols)])
    t = _one(plan, "Row")
    writes_row = op in ("softmax", "log_softmax")
    assert t.flops == rows * cols * (per + 1) + (rows * cols if writes_row else rows), "op + prologue, epilogue"
    assert t.bytes == F32 * (rows * cols + (rows * cols if writes_row else rows))


def test_layer_norm():
    rows, cols = 5, 24
    plan = _plan(lambda s_, x: s_.ln(x), [torch.randn(rows, cols)], ln=nn.LayerNorm(cols))
    t = _one(plan, "Row")
    assert t.flops == 8 * rows * cols
    assert t.bytes == F32 * (2 * rows * cols + 2 * cols), "x, out, weight, bias"
    assert (_node(plan, "native_layer_norm.default").flops, _node(plan, "native_layer_norm.default").bytes) == \
        (t.flops, t.bytes)


def test_scan_and_arg():
    x = torch.randn(4, 9, 5)
    plan = _plan(lambda s_, x: (torch.cumsum(torch.tanh(x), 1), x.argmax(1)), [x])
    scan, arg = _one(plan, "Scan"), _one(plan, "Arg")
    assert scan.flops == x.numel() * 2 and scan.bytes == F32 * 2 * x.numel()
    assert arg.flops == x.numel() and arg.bytes == F32 * x.numel() + 8 * 4 * 5


# ---------------------------------------------------------------------- batch and group statistics


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_statistics(mode, affine):
    """Training mode reads x (4 FLOPs per element) and the weight and bias; eval mode only the
    running statistics, weight and bias; both write scale and shift. The task counted its writes and
    x, not the weight, bias or running statistics it reads."""
    n, c, h, w = 4, 6, 5, 7
    bn = nn.BatchNorm2d(c, affine=affine)
    plan = _plan(lambda s_, x: s_.bn(x), [torch.randn(n, c, h, w)], bn=bn.eval() if mode == "eval" else bn)
    t = _one(plan, "BnStats")
    params = 2 * c if affine else 0
    if mode == "train":
        assert t.phase == "run" and t.flops == 4 * n * c * h * w
        assert t.bytes == F32 * (n * c * h * w + params + 2 * c)
    else:
        assert t.phase == "create" and t.flops == 4 * c
        assert t.bytes == F32 * (2 * c + params + 2 * c)


@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_statistics(affine):
    n, c, g, hw = 3, 8, 4, 25
    plan = _plan(lambda s_, x: s_.gn(x), [torch.randn(n, c, 5, 5)], gn=nn.GroupNorm(g, c, affine=affine))
    t = _one(plan, "GroupStats")
    assert t.flops == 4 * n * c * hw
    assert t.bytes == F32 * (n * c * hw + (2 * c if affine else 0) + 2 * n * c), "x, weight, bias; scale, shift"


# ---------------------------------------------------------------------- convolutions

#: (nsp, transposed, in_channels, out_channels, kernel, stride, padding, dilation, groups, output_padding, size)
CONVS = {
    "plain2d": (2, False, 3, 8, 3, 1, 1, 1, 1, 0, (9, 10)),
    "strided2d": (2, False, 4, 6, (3, 2), (2, 3), (1, 0), 1, 1, 0, (11, 9)),
    "dilated2d": (2, False, 4, 6, 3, 1, 2, 2, 1, 0, (9, 9)),
    "grouped2d": (2, False, 8, 12, 3, 1, 0, 1, 4, 0, (7, 7)),
    "depthwise2d": (2, False, 8, 8, 3, 2, 1, 1, 8, 0, (10, 10)),
    "depthwise_multiplier": (2, False, 4, 12, 5, 1, 2, 1, 4, 0, (6, 6)),
    "conv1d": (1, False, 4, 6, 5, 2, 2, 1, 1, 0, (33,)),
    "conv3d": (3, False, 2, 4, 3, 1, 1, 1, 1, 0, (5, 6, 7)),
    "transposed2d": (2, True, 6, 4, 3, 2, 1, 1, 1, 1, (5, 6)),
    "transposed2d_k4s4": (2, True, 4, 6, 4, 4, 0, 1, 2, 0, (5, 5)),
    "transposed1d_grouped_dilated": (1, True, 4, 6, 4, 3, 0, 2, 2, 0, (9,)),
    "transposed3d": (3, True, 4, 2, (2, 3, 3), (1, 2, 2), 0, 1, 1, 0, (3, 4, 5)),
    "transposed_depthwise": (2, True, 6, 6, 3, 2, 1, 1, 6, 1, (4, 4)),
}


def _tuple(v, nsp: int) -> tuple[int, ...]:
    return tuple(v) if isinstance(v, tuple) else (v,) * nsp


def conv_hand_count(nsp, transposed, cin, cout, kernel, stride, padding, dilation, groups, output_padding, size,
                    batch: int) -> tuple[int, tuple[int, ...]]:
    """(multiply-adds x 2, output size) of a convolution, from its definition: an output element of a
    convolution is a dot product over in_channels / groups x kernel inputs; a transposed convolution
    adds each input element, times out_channels / groups x kernel weights, into the output."""
    k, s, p, d, op = (_tuple(v, nsp) for v in (kernel, stride, padding, dilation, output_padding))
    if transposed:
        out = tuple((n - 1) * s_ - 2 * p_ + d_ * (k_ - 1) + o_ + 1 for n, s_, p_, d_, k_, o_ in zip(size, s, p, d, k, op))
        macs = batch * cin * math.prod(size) * (cout // groups) * math.prod(k)
    else:
        out = tuple((n + 2 * p_ - d_ * (k_ - 1) - 1) // s_ + 1 for n, s_, p_, d_, k_ in zip(size, s, p, d, k))
        macs = batch * cout * math.prod(out) * (cin // groups) * math.prod(k)
    return 2 * macs, out


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("name", sorted(CONVS))
def test_convolution(name, bias):
    """Strided, dilated, grouped, depthwise, 1-3 d and transposed convolutions against the count from
    their definition (a transposed one counted over its output instead of its input is many times
    too much: 16x for a 4x4 kernel at stride 4)."""
    nsp, tr, cin, cout, kernel, stride, padding, dilation, groups, opad, size = CONVS[name]
    batch = 2
    Conv = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)[nsp - 1] if tr else \
        (nn.Conv1d, nn.Conv2d, nn.Conv3d)[nsp - 1]
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias)
    if tr:
        kw["output_padding"] = opad
    conv = Conv(cin, cout, kernel, **kw)
    flops, out = conv_hand_count(nsp, tr, cin, cout, kernel, stride, padding, dilation, groups, opad, size, batch)
    depthwise = nsp == 2 and not tr and groups == cin == cout > 1  # its own kind (kinds/depthwise.py)
    outs = batch * cout * math.prod(out)
    # cuDNN's, and the narrow kernel's where it takes the convolution by default (a returned result)
    for cudnn in (True, False):
        plan = _plan(lambda s_, x: s_.conv(x), [torch.randn(batch, cin, *size)], cudnn=cudnn, conv=conv)
        (t,) = [t for k in ("Depthwise", "Conv", "NarrowConv") for t in _tasks(plan, k)]
        kinds = {"DepthwiseSpec"} if depthwise else {"ConvSpec"} if cudnn else {"ConvSpec", "NarrowConvSpec"}
        assert type(t.params).__name__ in kinds
        assert tuple(t.params.out.shape[2:]) == out
        assert t.flops == flops + (outs if bias else 0), "products, and one add per output element for the bias"
        assert t.bytes == F32 * (batch * cin * math.prod(size) + conv.weight.numel() + (cout if bias else 0) + outs)
        node = _node(plan, "convolution.default")
        assert (node.flops, node.bytes) == (t.flops, t.bytes)


def test_convolution_with_its_activation():
    plan = _plan(lambda s_, x: torch.relu(s_.conv(x)), [torch.randn(2, 3, 8, 8)], cudnn=True, conv=nn.Conv2d(3, 4, 3))
    t = _one(plan, "Conv")
    assert t.params.activation == "relu"
    outs = 2 * 4 * 6 * 6
    assert t.flops == 2 * outs * 3 * 9 + 2 * outs, "bias and activation, one each per output element"


def _conv_sweep_case(case):
    """The drawn convolution's node, task and hand count (from the node's own shapes and arguments)."""
    model, inputs = case.model(), case.tensors()
    cap = frontend.capture(model, inputs, "costs", supported_ops=ops.supported())
    plan = P.plan(cap.graph, case.policy)
    (n,) = [n for n in cap.graph.nodes if n.op == "aten.convolution.default"]
    xs, ws = cap.graph.spec(n.inputs[0]).shape, cap.graph.spec(n.inputs[1]).shape
    nsp, tr, g = len(xs) - 2, bool(n.attr("transposed")), int(n.attr("groups"))
    cin, cout = xs[1], (ws[1] * g if tr else ws[0])
    flops, out = conv_hand_count(nsp, tr, cin, cout, tuple(ws[2:]), tuple(n.attr("stride")), tuple(n.attr("padding")),
                                 tuple(n.attr("dilation")), g, tuple(n.attr("output_padding")), tuple(xs[2:]), xs[0])
    assert tuple(n.outputs[0].shape[2:]) == out
    bias = len(n.inputs) > 2 and n.inputs[2] is not None
    outs = math.prod(n.outputs[0].shape)
    return plan, n, flops + (outs if bias else 0)


@sweep(12)
@given(case=sweep_cases.conv())
def test_convolution_sweep(case):
    """Every drawn convolution (tests/sweep_cases.py: transposed, grouped, depthwise, strided,
    dilated, padded, 1-3 d): its node counts what its definition says, and so does its task (plus
    its activation, when it took one), or the GEMM it became (a pointwise one)."""
    plan, node, hand = _conv_sweep_case(case)
    cost = next(c for c in plan.node_costs if c.node == node.name)
    assert cost.flops == hand
    convs = _tasks(plan, "Conv")
    if convs:
        (t,) = convs
        assert t.flops == hand + (math.prod(t.params.out.shape) if t.params.activation != "none" else 0)


# ---------------------------------------------------------------------- GEMMs


def test_linear_with_bias_and_chain():
    """2 m n k, then per output element one for the epilogue pass (the bias here) and one per op of
    the runtime's chain (sigmoid)."""
    m, k, n = 6, 20, 9
    plan = _plan(lambda s_, x: torch.sigmoid(s_.fc(x)), [torch.randn(m, k)], fc=nn.Linear(k, n))
    t = _one(plan, "Gemm")
    assert t.params.epilogue == "bias" and len(t.params.chain) == 1
    assert t.flops == 2 * m * n * k + m * n * 2
    assert t.bytes == F32 * (m * k + n * k + n + m * n)
    node = _node(plan, "linear.default")
    assert node.flops == 2 * m * n * k + m * n, "the reference's linear: products and the bias add"


def test_batched_matmul_with_a_shared_operand():
    """A batch of products against one matrix: b is read once (its view broadcasts over the batch)."""
    b, m, k, n = 3, 5, 8, 7
    plan = _plan(lambda s_, x, w: torch.matmul(x, w), [torch.randn(b, m, k), torch.randn(k, n)])
    t = _one(plan, "Gemm")
    assert t.flops == 2 * b * m * n * k + b * m * n
    assert t.bytes == F32 * (b * m * k + k * n + b * m * n)


def test_bmm():
    b, m, k, n = 4, 3, 6, 5
    plan = _plan(lambda s_, x, y: torch.bmm(x, y), [torch.randn(b, m, k), torch.randn(b, k, n)])
    t = _one(plan, "Gemm")
    assert t.flops == 2 * b * m * n * k + b * m * n
    assert t.bytes == F32 * (b * m * k + b * k * n + b * m * n)


# ---------------------------------------------------------------------- elementwise, copies, gathers, arange


def test_fused_elementwise_with_a_broadcast_operand():
    r, c = 6, 10
    plan = _plan(lambda s_, x, y: torch.relu(x) * y + 1, [torch.randn(r, c), torch.randn(c)])
    t = _one(plan, "Ew")
    assert t.flops == 3 * r * c, "relu, mul, add over every output element"
    assert t.bytes == F32 * (r * c + c + r * c), "y's row is read once"


def test_copies():
    x, y = torch.randn(4, 8), torch.randn(4, 3)
    plan = _plan(lambda s_, x, y: (torch.cat([x, y], 1) * 2, x.t().contiguous()), [x, y])
    for t in _tasks(plan, "Copy"):
        assert t.flops == 0
        assert t.bytes == F32 * 2 * sum(math.prod(i.shape) for i in t.params.items), "read and written once"


@pytest.mark.parametrize("what", ["flip", "pad", "embedding", "index_select"])
def test_gathers(what):
    x = torch.randn(4, 8)
    if what == "embedding":
        plan = _plan(lambda s_, i: s_.e(i), [torch.randint(0, 10, (3, 4))], e=nn.Embedding(10, 6))
        t = _one(plan, "Gather")
        # the indices, the rows gathered (12 of a 10-row table: 10 distinct at most), the output
        assert t.bytes == 8 * 12 + F32 * min(10 * 6, 12 * 6) + F32 * 12 * 6
    elif what == "index_select":
        plan = _plan(lambda s_, x, i: torch.index_select(x, 1, i), [x, torch.randint(0, 8, (5,))])
        t = _one(plan, "Gather")
        assert t.bytes == 8 * 5 + F32 * (4 * 5) * 2, "the indices, the elements gathered, the output"
    else:
        f = (lambda s_, x: x.flip(1)) if what == "flip" else (lambda s_, x: F.pad(x, (1, 2, 0, 1)))
        plan = _plan(f, [x])
        t = _one(plan, "Gather")
        out = math.prod(t.params.out.shape)
        assert t.bytes == F32 * (min(x.numel(), out) + out)
    assert t.flops == 0


def test_arange():
    plan = _plan(lambda s_, x: x + torch.arange(8), [torch.randn(4, 8)])
    t = _one(plan, "Iota")
    assert (t.phase, t.flops, t.bytes) == ("create", 8, 8 * 8)


# ---------------------------------------------------------------------- recurrent layers


@pytest.mark.parametrize("mode,gates", [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
def test_recurrence(mode, gates):
    """Per step and direction: h W_hhᵀ (2 B H G H) and the cell (4 per gate element); the input
    projections are a GEMM of their own (2 T B G H I, plus the epilogue pass)."""
    t_, b, i, h = 5, 2, 3, 4
    rnn = getattr(nn, mode)(i, h, bidirectional=True)
    plan = _plan(lambda s_, x: s_.rnn(x)[0], [torch.randn(t_, b, i)], rnn=rnn)
    rec = _one(plan, "Recurrent")
    gh = gates * h
    assert rec.flops == 2 * (t_ * 2 * b * h * gh + t_ * b * gh * 4)
    gemm_flops = sum(g.flops for g in _tasks(plan, "Gemm"))
    assert gemm_flops == 2 * (2 * t_ * b * gh * i + t_ * b * gh), "both directions' input projections"
    node = _node(plan, f"{'rnn_tanh' if mode == 'RNN' else mode.lower()}.input")
    assert node.flops == 2 * t_ * b * gh * (2 * i + 2 * h + 4)


def test_constant_mask_summary():
    """A constant mask's summary (run at create): one per mask element it reads."""
    lq, lk, d = 70, 40, 32

    class _M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("m", torch.rand(lq, lk) > 0.3)

    plan = _plan(lambda s_, q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=s_.mm.m),
                 [torch.randn(1, 2, lq, d), torch.randn(1, 2, lk, d), torch.randn(1, 2, lk, d)], mm=_M())
    t = _one(plan, "AttentionMaskBlocks")
    assert t.phase == "create" and t.flops == lq * lk
    assert t.bytes == lq * lk * 1 + math.ceil(lq / 64) * math.ceil(lk / 32)
