"""Pass 3, *fuse* (continued): the single-node task kinds — convolutions, recurrent layers, arg reductions,
pooling, scans, gathers, ``arange`` and slice assignments (``slice_scatter``, ``select_scatter``).

Takes the :class:`~.fuse.Fuser` after the row reductions, GEMMs and concatenations claimed
theirs; adds one proto per node. Pooling and scans take the unary elementwise ops before and
after them as prologue / epilogue hooks, as row reductions do; ``max.dim`` / ``min.dim`` whose
indices nobody reads are row reductions, and an arg reduction whose values are read too is two
tasks (values by the row template, indices by the arg template). ``cumsum(x.flip(d), d).flip(d)``
is one reverse scan. A convolution (cuDNN through the runtime) takes the activation right after
it (ReLU, GELU, sigmoid, tanh, or SiLU written as ``x * sigmoid(x)``) into cuDNN's fused
epilogue; :func:`claim_conv` runs before the reductions and GEMMs, so that a reduction's
prologue hook does not take that activation first. ``arange`` runs at create (it reads nothing). A node whose arguments are
outside what the templates compute is named in a :class:`~.specs.PlanError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .. import layout as L
from .. import ops
from ..ir import Node
from .protos import ArgProto, ConvProto, GatherProto, IotaProto, PoolProto, RecurrentProto, ScanProto, ScatterProto

if TYPE_CHECKING:
    from .fuse import Fuser

A = ops.A
_FLOAT = ("float32", "float16", "bfloat16")


def claim(fz: "Fuser") -> None:
    """Claim every free node of the tail kinds: kind by kind (scans before gathers, which would
    take a scan's flips), in graph order within a kind."""
    ix, cl = fz.ix, fz.cl
    nodes = sorted(ix.nodes.values(), key=lambda m: ix.pos[m.name])
    for kind, handler in (("arg", _arg), ("pool", _pool), ("scan", _scan), ("gather", _gather), ("iota", _iota),
                          ("scatter", _scatter)):
        for n in nodes:
            if ops.kind(n.op) == kind and cl.free(n):
                handler(fz, n)


def _used(fz: "Fuser", t: str) -> bool:
    return bool(fz.ix.users.get(t)) or t in fz.ix.graph_outputs


def _ints(v, n: int, default: int) -> tuple[int, ...]:
    """An int-list schema argument as ``n`` ints (a single value or an empty list repeats)."""
    if v is None or v == ():
        return (default,) * n
    if isinstance(v, (int, float)):
        return (int(v),) * n
    v = tuple(int(x) for x in v)
    return v * n if len(v) == 1 else v


# ---------------------------------------------------------------------- convolutions

#: Elementwise ops cuDNN's convolution epilogue computes (st_activation), by ATen overload.
_CONV_ACT = {A + "relu.default": "relu", A + "sigmoid.default": "sigmoid", A + "tanh.default": "tanh",
             A + "silu.default": "silu"}


def claim_conv(fz: "Fuser") -> None:
    """Claim every free convolution, in graph order, with the activation after it."""
    ix, cl = fz.ix, fz.cl
    for n in sorted(ix.nodes.values(), key=lambda m: ix.pos[m.name]):
        if ops.kind(n.op) == "conv" and cl.free(n):
            _conv(fz, n)


def _conv(fz: "Fuser", n: Node) -> None:
    ix, cl = fz.ix, fz.cl
    a = ix.args(n, ops.args(n.op))
    x, w = a["input"][1], a["weight"][1]
    bias = a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None
    nsp = len(ix.shape(w)) - 2
    if not 1 <= nsp <= 3:
        raise cl.fail(n, f"a convolution over {nsp} spatial dims (cuDNN: 1 to 3)")
    if len(ix.shape(x)) != nsp + 2:
        raise cl.fail(n, f"a {nsp}-d convolution of a {len(ix.shape(x))}-d input (batch and channels expected)")
    for t in (x, w) + ((bias,) if bias else ()):
        if ix.spec(t).dtype not in _FLOAT:
            raise cl.fail(n, f"a convolution over {ix.spec(t).dtype}")
    out = n.outputs[0].name
    nodes = [n.name]
    act, last = _conv_activation(fz, n, out)
    if act != "none":
        nodes += [m for m in last]
        out = ix.nodes[last[-1]].outputs[0].name
    transposed = bool(n.attr("transposed"))
    cl.claim(ConvProto(cl.name(nodes), tuple(nodes), (out,), tuple(t for t in (x, w, bias) if t), x=x, w=w,
                       bias=bias, out=out, stride=_ints(n.attr("stride"), nsp, 1),
                       padding=_ints(n.attr("padding"), nsp, 0), dilation=_ints(n.attr("dilation"), nsp, 1),
                       output_padding=_ints(n.attr("output_padding"), nsp, 0) if transposed else (0,) * nsp,
                       transposed=transposed, groups=int(n.attr("groups") or 1), activation=act,
                       policy=cl.policy_of(nodes)))


def _conv_activation(fz: "Fuser", n: Node, out: str) -> tuple[str, list[str]]:
    """The activation cuDNN can fuse after convolution ``n`` and the nodes that compute it:
    the one user of ``out`` when it is an activation of float32 data, or ``x * sigmoid(x)``."""
    ix, cl = fz.ix, fz.cl
    if n.name in cl.unfuse or ix.spec(out).dtype != "float32" or out in ix.graph_outputs:
        return "none", []

    def ok(u: Node | None) -> bool:
        return u is not None and cl.free(u) and u.name not in cl.unfuse and len(u.outputs) == 1 and \
            u.outputs[0].dtype == "float32" and u.outputs[0].shape == ix.shape(out)

    u = ix.only_user(out)
    if ok(u) and u.inputs == (out,):
        if u.op in _CONV_ACT:
            return _CONV_ACT[u.op], [u.name]
        if u.op == A + "gelu.default":
            return ("gelu" if (u.attr("approximate") or "none") == "none" else "gelu_tanh"), [u.name]
    users = ix.users.get(out, [])
    if len(users) == 2:  # x * sigmoid(x), in either order
        sig = next((m for m in users if m.op == A + "sigmoid.default"), None)
        mul = next((m for m in users if m.op == A + "mul.Tensor"), None)
        if sig is not None and mul is not None and ok(sig) and ok(mul) and sig.inputs == (out,) and \
                sorted(mul.inputs) == sorted((out, sig.outputs[0].name)) and \
                ix.only_user(sig.outputs[0].name) is mul:
            return "silu", [sig.name, mul.name]
    return "none", []


# ---------------------------------------------------------------------- recurrent layers


def claim_recurrent(fz: "Fuser") -> None:
    """Claim every recurrent node (one proto each: see :mod:`.lower_recurrent`)."""
    from ..recurrent import recurrence

    ix, cl = fz.ix, fz.cl
    for n in sorted(ix.nodes.values(), key=lambda m: ix.pos[m.name]):
        if ops.kind(n.op) != "recurrent" or not cl.free(n):
            continue
        try:
            r = recurrence(n, ix.shape)
        except ValueError as err:
            raise cl.fail(n, str(err)) from None
        for t in n.inputs:
            if ix.spec(t).dtype not in _FLOAT:
                raise cl.fail(n, f"a recurrent layer over {ix.spec(t).dtype}")
        hn = r.hn if _used(fz, r.hn) else None
        cn = r.cn if r.cn and _used(fz, r.cn) else None
        outs = tuple(t for t in (r.out if _used(fz, r.out) else None, hn, cn) if t)
        cl.claim(RecurrentProto(cl.name([n.name]), (n.name,), outs, tuple(dict.fromkeys(n.inputs)), node=n.name,
                                out=r.out, hn=hn, cn=cn, policy=cl.policy_of([n.name])))


# ---------------------------------------------------------------------- arg reductions


def _arg(fz: "Fuser", n: Node) -> None:
    ix, cl = fz.ix, fz.cl
    x = n.inputs[0]
    xs = ix.shape(x)
    op = "max" if n.op in (A + "max.dim", A + "argmax.default") else "min"
    if ix.spec(x).dtype not in _FLOAT:
        raise cl.fail(n, f"arg reduction over {ix.spec(x).dtype}")
    d = n.attr("dim")
    dim = None if d is None else (L.norm_dim(int(d), len(xs)) if xs else 0)
    if n.op in (A + "max.dim", A + "min.dim"):
        values, indices = n.outputs[0].name, n.outputs[1].name
        if not _used(fz, indices):
            fz.reduce(n)  # values only: a row / axis reduction, hooks and all
            return
        if _used(fz, values):
            fz.reduce(n, hooks=False)
        cl.claim(ArgProto(f"{cl.name([n.name])}_indices", (n.name,), (indices,), (x,), op=op, x=x, out=indices,
                          dim=dim))
        return
    cl.claim(ArgProto(cl.name([n.name]), (n.name,), (n.outputs[0].name,), (x,), op=op, x=x,
                      out=n.outputs[0].name, dim=dim))


# ---------------------------------------------------------------------- pooling


def _pool(fz: "Fuser", n: Node) -> None:
    ix, cl = fz.ix, fz.cl
    x = n.inputs[0]
    xs = ix.shape(x)
    name = n.op.removeprefix(A).split(".")[0]
    for extra in n.outputs[1:]:
        if _used(fz, extra.name):
            raise cl.fail(n, "the indices of max pooling are used; only its values are supported")
    if ix.spec(x).dtype not in _FLOAT:
        raise cl.fail(n, f"pooling over {ix.spec(x).dtype}")
    adaptive = "adaptive" in name
    mode = "max" if "max" in name else "avg"
    nsp = int(name[name.index("pool") + 4])
    if len(xs) < nsp + 1:
        raise cl.fail(n, f"{nsp}-d pooling of a {len(xs)}-d tensor")
    count_include_pad, divisor = True, 0
    if adaptive:
        kernel = _ints(n.attr("output_size"), nsp, 1)
        stride, padding, dilation = (1,) * nsp, (0,) * nsp, (1,) * nsp
    else:
        kernel = _ints(n.attr("kernel_size"), nsp, 1)
        stride = _ints(n.attr("stride"), nsp, 0)
        stride = kernel if not any(stride) else stride
        padding = _ints(n.attr("padding"), nsp, 0)
        dilation = _ints(n.attr("dilation"), nsp, 1)
        if mode == "avg":
            count_include_pad = bool(n.attr("count_include_pad", True))
            divisor = int(n.attr("divisor_override") or 0)
    out = n.outputs[0].name
    pro, x, epi, out = fz.hooks(n, x, out)
    nodes = pro + [n.name] + epi
    cl.claim(PoolProto(cl.name(nodes), tuple(nodes), (out,), (x,), op=mode, x=x, out=out, kernel=kernel,
                       stride=stride, padding=padding, dilation=dilation, adaptive=adaptive,
                       count_include_pad=count_include_pad, divisor=divisor, pro=tuple(pro), epi=tuple(epi)))


# ---------------------------------------------------------------------- scans


def _flip_of(fz: "Fuser", n: Node | None, dim: int) -> bool:
    if n is None or n.op != A + "flip.default" or not fz.cl.free(n):
        return False
    nd = len(fz.ix.shape(n.inputs[0]))
    return [L.norm_dim(int(d), nd) for d in n.attr("dims")] == [dim]


def _scan(fz: "Fuser", n: Node) -> None:
    ix, cl = fz.ix, fz.cl
    x = n.inputs[0]
    xs = ix.shape(x)
    op = {"cumsum": "sum", "cumprod": "prod", "logcumsumexp": "logsumexp", "cummax": "max",
          "cummin": "min"}[n.op.removeprefix(A).split(".")[0]]
    for extra in n.outputs[1:]:
        if _used(fz, extra.name):
            raise cl.fail(n, f"the indices of cum{op} are used; only its values are supported")
    if ix.spec(x).dtype in ("float64", "complex64", "complex128"):
        raise cl.fail(n, f"scan over {ix.spec(x).dtype}")
    dim = L.norm_dim(int(n.attr("dim")), len(xs)) if xs else 0
    out = n.outputs[0].name
    nodes = [n.name]
    reverse = False
    # cumsum(x.flip(d), d).flip(d) is the reverse scan of x.
    p = ix.producer.get(x)
    u = ix.only_user(out)
    if xs and _flip_of(fz, p, dim) and ix.only_user(x) is not None and _flip_of(fz, u, dim):
        nodes = [p.name, n.name, u.name]
        x, out, reverse = p.inputs[0], u.outputs[0].name, True
    pro: list[str] = []
    epi: list[str] = []
    if not reverse:
        pro, x, epi, out = fz.hooks(n, x, out)
        nodes = pro + nodes + epi
    cl.claim(ScanProto(cl.name(nodes), tuple(nodes), (out,), (x,), op=op, x=x, out=out, dim=dim, reverse=reverse,
                       pro=tuple(pro), epi=tuple(epi)))


# ---------------------------------------------------------------------- gathers and arange


def _gather(fz: "Fuser", n: Node) -> None:
    ix, cl = fz.ix, fz.cl
    base = n.op.removeprefix(A).split(".")[0]
    x = n.inputs[0]
    indices: Sequence[str] = n.inputs[1:]
    if base == "embedding":
        x, indices = n.inputs[0], n.inputs[1:2]
    for t in indices:
        if ix.spec(t).dtype not in ("int64", "int32", "int16", "int8", "uint8", "bool"):
            raise cl.fail(n, f"indices of dtype {ix.spec(t).dtype}")
        if base == "index" and ix.spec(t).dtype in ("bool", "uint8"):
            raise cl.fail(n, "indexing with a boolean mask (the result's shape depends on the data)")
    if base.startswith("upsample") and (n.attr("output_size") is None and n.attr("scale_factors") is None
                                        and n.attr("scales_h") is None):
        raise cl.fail(n, "upsampling without a size")
    cl.claim(GatherProto(cl.name([n.name]), (n.name,), (n.outputs[0].name,), (x,) + tuple(indices), node=n.name,
                         x=x, indices=tuple(indices), out=n.outputs[0].name))


def _scatter(fz: "Fuser", n: Node) -> None:
    cl = fz.cl
    x, src = n.inputs[0], n.inputs[1]
    cl.claim(ScatterProto(cl.name([n.name]), (n.name,), (n.outputs[0].name,), (x, src), node=n.name, x=x, src=src,
                          out=n.outputs[0].name))


def _iota(fz: "Fuser", n: Node) -> None:
    ix, cl = fz.ix, fz.cl
    start = float(n.attr("start", 0) or 0)
    step = float(n.attr("step", 1) if n.attr("step") is not None else 1)
    out = n.outputs[0].name
    phase = "run" if out in ix.graph_outputs else "create"
    cl.claim(IotaProto(cl.name([n.name]), (n.name,), (out,), (), phase, out=out, start=start, step=step))


__all__ = ["claim"]
