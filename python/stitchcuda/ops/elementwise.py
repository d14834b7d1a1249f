"""Elementwise entries: instructions (C++, PyTorch reference, cost, domain) and ATen lowerings.

The C++ expressions are fp32 and compile for the host and the device alike: the ops whose
numerics are not one libm call (sigmoid, the GELUs, mish, softplus, ...) call the functions of
``templates/stitch/ops.cuh``, which the runtime's GEMM epilogue functors call too, so each
function is spelled once. Lowerings turn an ATen node into instructions through a
:class:`Lowering` (operand references, constants, ``emit``); a lowering returns False when the
node's arguments are outside what the instructions compute (the node is then unsupported).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

def _t():
    import torch

    return torch


def _F():
    return _t().nn.functional


def _one(b):
    t = _t()
    return t.where(b, t.ones((), dtype=t.float64), t.zeros((), dtype=t.float64))


from .registry import A, Domain, elementwise  # noqa: E402


class Lowering:
    """What a lowering sees: the node, its operands (``val``) and ``emit``.

    ``val(key)`` is the schema argument ``key`` as an operand reference (``"a0"``, ``"t3"``) when
    it is a tensor, as a float when it is a scalar, None when absent; ``emit(name, *args)``
    appends an instruction (strings are references, numbers constants) and returns its result's
    reference; ``in_dtype(i)`` is the dtype of the node's i-th tensor input."""

    def __init__(self, node: Any, val: Callable[[str], Any], emit: Callable[..., str],
                 in_dtype: Callable[[int], str]):
        self.node = node
        self.val = val
        self.emit = emit
        self.in_dtype = in_dtype

    def attr(self, key: str, default: Any = None) -> Any:
        v = self.node.attr(key)
        return default if v is None else v

    def c(self, key: str, default: Any = None) -> float:
        return num(self.attr(key, default))


def num(v: Any) -> float:
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    return float(v)


def unary(name: str) -> Callable[[Lowering], bool]:
    def lower(lw: Lowering) -> bool:
        lw.emit(name, lw.val("self"))
        return True

    return lower


def binary(name: str) -> Callable[[Lowering], bool]:
    def lower(lw: Lowering) -> bool:
        lw.emit(name, lw.val("self"), lw.val("other"))
        return True

    return lower


# ---------------------------------------------------------------------- unary math

POS = Domain(1e-3, 8.0)
UNIT = Domain(-0.999, 0.999)
INT = Domain(-8.0, 8.0, integers=True)
BOOL = Domain(0.0, 1.0, integers=True)

elementwise("copy", "{0}", lambda x: x, aten=())
elementwise("neg", "-{0}", lambda x: -x, epilogue="SCALE", epilogue_params=lambda c: (-1.0, 0.0))
elementwise("rsqrt", "rsqrtf({0})", lambda x: _t().rsqrt(x), domain=POS)
elementwise("sqrt", "sqrtf({0})", lambda x: _t().sqrt(x), domain=POS)
elementwise("exp", "expf({0})", lambda x: _t().exp(x), epilogue="EXP")
elementwise("log", "logf({0})", lambda x: _t().log(x), domain=POS)
elementwise("tanh", "stitch::op::tanh({0})", lambda x: _t().tanh(x), flops=4, epilogue="TANH")
elementwise("relu", "stitch::op::relu({0})", lambda x: _t().clamp_min(x, 0), epilogue="RELU")
elementwise("sigmoid", "stitch::op::sigmoid({0})", lambda x: _t().sigmoid(x), flops=4, epilogue="SIGMOID")
elementwise("silu", "stitch::op::silu({0})", lambda x: x * _t().sigmoid(x), flops=4, epilogue="SILU")
elementwise("abs", "fabsf({0})", lambda x: x.abs(), epilogue="ABS")
elementwise("reciprocal", "1.f / {0}", lambda x: 1 / x)
elementwise("erf", "erff({0})", lambda x: _t().erf(x))
elementwise("sin", "sinf({0})", lambda x: _t().sin(x))
elementwise("cos", "cosf({0})", lambda x: _t().cos(x))
elementwise("log1p", "log1pf({0})", lambda x: _t().log1p(x), domain=Domain(-0.999, 8.0))
elementwise("expm1", "expm1f({0})", lambda x: _t().expm1(x))
elementwise("floor", "floorf({0})", lambda x: _t().floor(x))
elementwise("ceil", "ceilf({0})", lambda x: _t().ceil(x))
elementwise("round", "rintf({0})", lambda x: _t().round(x))
elementwise("sign", "float(({0} > 0.f) - ({0} < 0.f))", lambda x: _t().sign(x))
elementwise("trunc", "truncf({0})", lambda x: _t().trunc(x))
elementwise("square", "{0} * {0}", lambda x: x * x, aten=(), epilogue="SQUARE")
elementwise("cube", "{0} * {0} * {0}", lambda x: x ** 3, aten=())
elementwise("gelu_erf", "stitch::op::gelu_erf({0})", lambda x: _F().gelu(x), aten=(), flops=8, epilogue="GELU_ERF")
elementwise("gelu_tanh", "stitch::op::gelu_tanh({0})", lambda x: _F().gelu(x, approximate="tanh"), aten=(), flops=8,
            epilogue="GELU_TANH")
elementwise("hardswish", "stitch::op::hardswish({0})", lambda x: _F().hardswish(x), flops=4, epilogue="HARDSWISH")
elementwise("hardsigmoid", "stitch::op::hardsigmoid({0})", lambda x: _F().hardsigmoid(x))
elementwise("relu6", "stitch::op::clamp({0}, 0.f, 6.f)", lambda x: _t().clamp(x, 0, 6))
elementwise("mish", "stitch::op::mish({0})", lambda x: _F().mish(x), flops=6, epilogue="MISH")
elementwise("not", "({0} != 0.f ? 0.f : 1.f)", lambda x: _one(x == 0), aten=(), domain=BOOL)
elementwise("to_bool", "({0} != 0.f ? 1.f : 0.f)", lambda x: _one(x != 0), aten=())
elementwise("to_half", "__half2float(__float2half_rn({0}))", lambda x: x.to(_t().float16).to(_t().float64), aten=())
elementwise("to_bf16", "__bfloat162float(__float2bfloat16_rn({0}))",
            lambda x: x.to(_t().bfloat16).to(_t().float64), aten=())
elementwise("const", "{0}", lambda x: x, aten=())

# ---------------------------------------------------------------------- binary and ternary math

elementwise("add", "{0} + {1}", lambda x, y: x + y, arity=2)
elementwise("sub", "{0} - {1}", lambda x, y: x - y, arity=2)
elementwise("mul", "{0} * {1}", lambda x, y: x * y, arity=2)
elementwise("div", "{0} / {1}", lambda x, y: x / y, arity=2)
elementwise("pow", "powf({0}, {1})", lambda x, y: _t().pow(x, y), arity=2, domain=Domain(1e-3, 4.0))
elementwise("max", "stitch::op::max({0}, {1})", lambda x, y: _t().maximum(x, y), arity=2)
elementwise("min", "stitch::op::min({0}, {1})", lambda x, y: _t().minimum(x, y), arity=2)
for _cmp, _sym in (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">=")):
    elementwise(_cmp, f"({{0}} {_sym} {{1}} ? 1.f : 0.f)",
                (lambda s: lambda x, y: _one(getattr(_t(), s)(x, y)))(_cmp), arity=2, domain=INT)
elementwise("and", "({0} != 0.f && {1} != 0.f ? 1.f : 0.f)", lambda x, y: _one((x != 0) & (y != 0)), arity=2,
            domain=BOOL)
elementwise("or", "({0} != 0.f || {1} != 0.f ? 1.f : 0.f)", lambda x, y: _one((x != 0) | (y != 0)), arity=2,
            domain=BOOL)
elementwise("leaky_relu", "({0} > 0.f ? {0} : {0} * {1})", lambda x, s: _t().where(x > 0, x, x * s), arity=2,
            flops=2, epilogue="LEAKY_RELU")
elementwise("elu", "({0} > 0.f ? {0} : {1} * expm1f({0}))", lambda x, a: _t().where(x > 0, x, a * _t().expm1(x)),
            arity=2, flops=3, epilogue="ELU")
elementwise("softplus", "stitch::op::softplus({0}, {1}, {2})",
            lambda x, b, th: _t().where(x * b > th, x, _t().log1p(_t().exp(x * b)) / b), arity=3, flops=4,
            epilogue="SOFTPLUS", epilogue_params=lambda c: (0.0, 0.0) if tuple(c) == (1.0, 20.0) else None)
elementwise("clamp", "stitch::op::clamp({0}, {1}, {2})", lambda x, lo, hi: _t().minimum(_t().maximum(x, lo), hi),
            arity=3, epilogue="CLAMP")
elementwise("where", "({0} != 0.f ? {1} : {2})", lambda c, x, y: _t().where(c != 0, x, y), arity=3)
elementwise("div_trunc", "truncf({0} / {1})", lambda x, y: _t().trunc(x / y), arity=2)
elementwise("div_floor", "stitch::op::div_floor({0}, {1})", lambda x, y: _div_floor(x, y), arity=2, flops=4)


def _div_floor(x, y):
    """PyTorch's floor division (NaN for an infinite dividend, exact near integers), on tensors or numbers."""
    t = _t()
    x = x if isinstance(x, t.Tensor) else t.tensor(x, dtype=t.float64)
    return t.div(x, y, rounding_mode="floor")

# ---------------------------------------------------------------------- ATen lowerings with arguments

from .registry import AtenOp, add_aten  # noqa: E402


def _aten(names: Sequence[str], lower: Callable[[Lowering], bool], args: Sequence[str] = ("self", "other"),
          flops: int = 1, chain: bool = False) -> None:
    for n in names:
        add_aten(AtenOp(n if n.startswith(("aten.", "stitch.")) else A + n, "elementwise", tuple(args), flops, lower,
                        chain))


def _alpha(lw: Lowering) -> float:
    return num(lw.node.attr("alpha", 1) if lw.node.attr("alpha") is not None else 1)


def _add_sub(lw: Lowering) -> bool:
    o, alpha = lw.val("other"), _alpha(lw)
    if not isinstance(o, str):
        o = alpha * o
    elif alpha != 1.0:
        o = lw.emit("mul", o, alpha)
    lw.emit("add" if lw.node.op.split(".")[1] == "add" else "sub", lw.val("self"), o)
    return True


def _rsub(lw: Lowering) -> bool:
    s, alpha = lw.val("self"), _alpha(lw)
    t = lw.emit("mul", s, alpha) if alpha != 1.0 else s
    lw.emit("sub", lw.val("other"), t)
    return True


def _div_mode(lw: Lowering) -> bool:
    mode = lw.node.attr("rounding_mode")
    lw.emit({None: "div", "trunc": "div_trunc", "floor": "div_floor"}[mode], lw.val("self"), lw.val("other"))
    return True


_POW_TABLE = {2.0: "square", 3.0: "cube", 0.5: "sqrt", -1.0: "reciprocal", -0.5: "rsqrt", 1.0: "copy"}


def _pow_scalar(lw: Lowering) -> bool:
    e = lw.c("exponent")
    if e in _POW_TABLE:
        lw.emit(_POW_TABLE[e], lw.val("self"))
    else:
        lw.emit("pow", lw.val("self"), e)
    return True


def _not(lw: Lowering) -> bool:
    if lw.node.op == A + "bitwise_not.default" and lw.in_dtype(0) != "bool":
        lw.emit("bitnot", lw.val("self"))  # an integer bitwise not is not a logical one
        return True
    lw.emit("not", lw.val("self"))
    return True


def _const(key: str) -> Callable[[Lowering], bool]:
    def lower(lw: Lowering) -> bool:
        lw.emit("const", lw.c(key))
        return True

    return lower


def _clamp(lw: Lowering) -> bool:
    op = lw.node.op
    if op.startswith(A + "hardtanh"):
        lo, hi = lw.c("min_val", -1.0), lw.c("max_val", 1.0)
    else:
        lo = lw.node.attr("min") if op != A + "clamp_max.default" else None
        hi = lw.node.attr("max") if op != A + "clamp_min.default" else None
        lo = -math.inf if lo is None else num(lo)
        hi = math.inf if hi is None else num(hi)
    lw.emit("clamp", lw.val("self"), lo, hi)
    return True


def _elu(lw: Lowering) -> bool:
    scale, input_scale = lw.c("scale", 1), lw.c("input_scale", 1)
    if scale != 1.0 or input_scale != 1.0:  # SELU, and ELUs with scales
        lw.emit("elu_scaled", lw.val("self"), lw.c("alpha", 1.0), scale, input_scale)
        return True
    lw.emit("elu", lw.val("self"), lw.c("alpha", 1.0))
    return True


def _to_copy(lw: Lowering) -> bool:
    src = lw.in_dtype(0)
    dt = lw.node.attr("dtype") or src
    s = lw.val("self")
    if dt == "bool":
        lw.emit("to_bool", s)
    elif dt in ("int8", "int16", "int32", "int64", "uint8") and src in ("float32", "float16", "bfloat16"):
        lw.emit("trunc", s)
    elif dt == "float16" and src != dt:
        lw.emit("to_half", s)
    elif dt == "bfloat16" and src != dt:
        lw.emit("to_bf16", s)
    else:
        lw.emit("copy", s)
    return True


def _affine_channel(lw: Lowering) -> bool:
    t = lw.emit("mul", lw.val("input"), lw.val("scale"))
    lw.emit("add", t, lw.val("shift"))
    return True


_aten(("add.Tensor", "sub.Tensor"), _add_sub)
_aten(("add.Scalar", "sub.Scalar"), _add_sub, args=("self",))
_aten(("rsub.Scalar",), _rsub, args=("self",))
_aten(("mul.Tensor",), binary("mul"))
_aten(("mul.Scalar",), binary("mul"), args=("self",))
_aten(("div.Tensor",), binary("div"))
_aten(("div.Scalar",), binary("div"), args=("self",))
_aten(("div.Tensor_mode",), _div_mode)
_aten(("pow.Tensor_Scalar",), _pow_scalar, args=("self",), chain=True)
_aten(("pow.Tensor_Tensor",), binary("pow"))
_aten(("maximum.default",), binary("max"))
_aten(("minimum.default",), binary("min"))
for _cmp in ("eq", "ne", "lt", "le", "gt", "ge"):
    _aten((f"{_cmp}.Tensor",), binary(_cmp))
    _aten((f"{_cmp}.Scalar",), binary(_cmp), args=("self",))
_aten(("logical_and.default",), binary("and"))
_aten(("logical_or.default",), binary("or"))
_aten(("bitwise_not.default", "logical_not.default"), _not, args=("self",))
_aten(("where.self",), lambda lw: bool(lw.emit("where", lw.val("condition"), lw.val("self"), lw.val("other"))),
      args=("condition", "self", "other"))
_aten(("scalar_tensor.default",), _const("s"), args=())
_aten(("full.default",), _const("fill_value"), args=())
_aten(("leaky_relu.default",), lambda lw: bool(lw.emit("leaky_relu", lw.val("self"), lw.c("negative_slope", 0.01))),
      args=("self",), flops=2, chain=True)
_aten(("gelu.default",), lambda lw: bool(lw.emit("gelu_tanh" if lw.node.attr("approximate") == "tanh" else "gelu_erf",
                                                 lw.val("self"))), args=("self",), flops=8, chain=True)
_aten(("hardtanh.default", "clamp.default"), _clamp, args=("self",), chain=True)
_aten(("clamp_min.default", "clamp_max.default"), _clamp, args=("self",))
_aten(("elu.default",), _elu, args=("self",), flops=3, chain=True)
_aten(("softplus.default",), lambda lw: bool(lw.emit("softplus", lw.val("self"), lw.c("beta", 1.0),
                                                     lw.c("threshold", 20.0))), args=("self",), flops=4, chain=True)
_aten(("_to_copy.default",), _to_copy, args=("self",))
# Synthetic operators the planner's match pass creates.
_aten(("stitch.affine_channel",), _affine_channel, args=("input", "scale", "shift"))
_aten(("stitch.mask_bool",), lambda lw: bool(lw.emit("where", lw.val("mask"), lw.val("scores"), -math.inf)),
      args=("scores", "mask"))
_aten(("stitch.mask_add",), lambda lw: bool(lw.emit("add", lw.val("scores"), lw.val("mask"))), args=("scores", "mask"))

__all__ = ["Lowering", "num", "unary", "binary"]
