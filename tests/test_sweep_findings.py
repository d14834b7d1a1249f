"""What the sweeps (tests/test_sweep_*.py) found, each fault as an example of its own: the smallest
case that showed it, captured, planned, interpreted and compared with PyTorch in float64 (or, for
a refusal, the message it must carry)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from stitchcuda import frontend, ops
from tests.sweep import Case, T, check


def _case(op: str, f, *inputs: T, **kw) -> Case:
    return Case(op, {}, f, tuple(inputs), **kw)


def test_inputs_holding_nan_are_not_taken_for_written():
    """The plan interpreter checks that a program leaves its inputs as they were; NaN != NaN made an
    input holding NaN look written (sweep: an argmax over a tensor with NaN in it)."""
    assert check(_case("aten.argmax.default", lambda s, x: (x.argmax(1), torch.relu(x)), T((3, 4), edges=True))) \
        == "planned"


@pytest.mark.parametrize("dim,shape", [(1, (2, 0)), (0, (0, 3)), (1, (2, 3))])
def test_cat_skips_legacy_empty_tensors(dim, shape):
    """``torch.cat`` skips 1-d empty tensors whatever the rank of the others (PyTorch's legacy
    behaviour); the planner put them in as parts and failed (an IndexError placing them, or a copy of
    a (0,) tensor into a (0, 1) slot)."""
    def f(s, x, y):
        return torch.cat([x, torch.zeros(0), y, y.new_zeros(0)], dim) * 2

    assert check(_case("aten.cat.default", f, T(shape), T(shape))) == "planned"


def test_a_tensor_value_used_as_an_index_is_refused_by_name():
    """``x[i]`` with a 0-d index tensor reads the index's value on the host (``.item()``), which a
    program cannot; capture failed with an unrelated message ("argument _Ref(...) cannot be stored in
    the IR") at the node that used the value, instead of naming the operator that reads it."""
    case = _case("aten.index.Tensor", lambda s, x, i: x[i] * 2, T((4, 3)), T((), "int64", "int", 0, 4),
                 names=("_local_scalar_dense",), refusal="non-tensor value")
    with pytest.raises(frontend.UnsupportedOpError, match=r"aten\._local_scalar_dense\.default .*non-tensor value"):
        frontend.capture(case.model(), case.tensors(), "item", supported_ops=ops.supported())
    assert check(case) == "refused"


@pytest.mark.parametrize("policy", ["fp32", "bf16"])
def test_matmul_of_two_vectors(policy):
    """``torch.matmul`` of two 1-d tensors is a dot product with a 0-d result; the GEMM lowering
    gave the output M's unit dim before N's, which a 0-d view cannot take (an IndexError)."""
    f = lambda s, a, b: (torch.matmul(a, b), torch.matmul(a, b) * 2 + 1)  # noqa: E731
    assert check(_case("aten.matmul.default", f, T((7,)), T((7,)), policy=policy)) == "planned"


@pytest.mark.parametrize("dtype", ["bool", "int64", "float32"])
def test_reduction_over_dims_apart_with_an_integer_result(dtype):
    """A reduction over dims that are not adjacent moves them last (a permutation) and reduces rows;
    an integer or bool result is written through a float32 copy, and the lowering permuted that copy
    back as if it held the moved dims (a ValueError: "dim 2 out of range for 2 dims")."""
    x = T((2, 3, 4, 5), dtype, "int", -2, 3)
    f = (lambda s, x: (x.any((0, 2)), x.any((1, 3), keepdim=True))) if dtype == "bool" else \
        (lambda s, x: (x.sum((0, 2)), x.amax((1, 3), keepdim=True)))
    assert check(_case("aten.any.dims" if dtype == "bool" else "aten.sum.dim_IntList", f, x)) == "planned"


@pytest.mark.parametrize("what,shape", [("sum", (0, 3)), ("mean", (3, 0)), ("softmax", (3, 0)), ("sum_rows", (3, 0)),
                                        ("any", (2, 0, 3))])
def test_reductions_over_an_empty_extent_are_refused_by_name(what, shape):
    """The row and axis templates refuse an empty row (reduce.cuh: cols < 1, red < 1 with rows left:
    cudaErrorInvalidValue) where PyTorch gives a constant (a sum 0, a mean NaN, any False, a softmax
    an empty tensor). The plan held such tasks (a sum over dim 0 of a (0, 3) tensor even failed
    planning with a ZeroDivisionError); the plan interpreter, which did not check the templates'
    contract, computed PyTorch's answer. Now the interpreter checks it, and the planner refuses by
    name; a reduction whose result is empty too is still planned."""
    f = {"sum": lambda s, x: x.sum(0), "mean": lambda s, x: x.mean(1), "softmax": lambda s, x: x.softmax(1),
         "sum_rows": lambda s, x: x.sum(1), "any": lambda s, x: (x > 0).any(1)}[what]
    op = {"sum": "aten.sum.dim_IntList", "sum_rows": "aten.sum.dim_IntList", "mean": "aten.mean.dim",
          "softmax": "aten._softmax.default", "any": "aten.any.dim"}[what]
    assert check(_case(op, f, T(shape), refusal="a reduction over an empty extent")) == "refused"
    empty_too = {"sum": (3, 0), "mean": (0, 3), "softmax": (0, 3), "sum_rows": (0, 3), "any": (0, 2, 3)}[what]
    assert check(_case(op, f, T(empty_too))) == "planned"
    if what == "sum":  # an empty result over an empty axis (the axis template's workspace: a ZeroDivisionError)
        assert check(_case(op, f, T((0, 0)))) == "planned"


@pytest.mark.parametrize("dtype,dist", [("float32", "normal"), ("float16", "normal"), ("int64", "int")])
def test_reductions_with_a_dtype_argument(dtype, dist):
    """``x.sum(-1, dtype=torch.float32)`` (and ``mean``, which an integer tensor needs it for) was
    refused ("reductions with a dtype argument"); the result's dtype is the output tensor's, which the
    lowering already stores in."""
    f = lambda s, x: (x.sum(-1, dtype=torch.float32), x.mean((0, 2), dtype=torch.float32),  # noqa: E731
                      x.sum(1, keepdim=True, dtype=torch.float32))
    assert check(_case("aten.sum.dim_IntList", f, T((3, 4, 5), dtype, dist, -4, 5))) == "planned"


@pytest.mark.parametrize("d,dv,why", [(40, 40, "head dim 40 has no fused attention template"),
                                      (64, 32, "the value's dim 32 is not the head dim 64")])
def test_causal_attention_refusals_say_why(d, dv, why):
    """A causal attention the fused template cannot take is refused; the message said "head dim 64
    has no fused attention template" also where 64 is one of its head dims and the value's own dim
    was the reason."""
    f = lambda s, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    case = _case("aten.scaled_dot_product_attention.default", f, T((1, 2, 8, d)), T((1, 2, 8, d)), T((1, 2, 8, dv)),
                 refusal=why)
    assert check(case) == "refused"


# ---------------------------------------------------------------------- the larger run (BENCHMARKS.md, "Sweeps")


@pytest.mark.parametrize("op", ["reshape", "view_of_contiguous"])
def test_an_output_reached_through_a_copying_reshape_is_written(op):
    """A reshape that strides cannot express (of a transposed input) is lowered as a copy into a
    fresh buffer and the output copied from it; the output copy was lost (the lowerer's task and
    touched-set lists fell out of step, and the pairing dropped the last task): the program
    returned an unwritten buffer."""
    f = (lambda s, x: x.t().reshape(6)) if op == "reshape" else (lambda s, x: x.t().contiguous().view(6))
    assert check(_case("aten.view.default", f, T((2, 3)))) == "planned"


@pytest.mark.parametrize("corr", [1, 2, 3])
def test_variance_with_a_correction_past_the_row(corr):
    """PyTorch divides by max(0, n - correction): a correction of the row's length or more gives
    inf (NaN for a constant row); the planner scaled by n / (n - c), a negative factor."""
    assert check(_case("aten.var.correction", lambda s, x: torch.var(x, -1, correction=corr), T((3, 2)))) == "planned"


def test_floor_division_of_an_infinity():
    """PyTorch's floor division goes through fmod (inf // 2 is NaN, and a quotient that rounds up to
    an integer is taken down); the template computed floorf(a / b)."""
    f = lambda s, x: torch.div(x, 2.0, rounding_mode="floor")  # noqa: E731
    assert check(_case("aten.div.Tensor_mode", f, T((64,), "float32", "uniform", -6, 6, edges=True))) == "planned"


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_a_nan_beats_an_infinity_in_arg_reductions(op):
    """The interpreter mapped NaN to +inf, so a real infinity before the NaN won the tie; the
    template (and PyTorch) take the first NaN."""
    x = torch.tensor([1.0, -math.inf, math.inf, math.nan, 0.0, math.nan])
    case = _case(f"aten.{op}.default", lambda s, y: getattr(y + x, op)(), T((6,), "float32", "uniform", 0, 0))
    assert check(case) == "planned"


def test_any_over_an_empty_tensor_with_no_result():
    """``any`` of a [0, 0] tensor over one dim has an empty result: nothing to compute; the plan
    interpreter reduced over the empty dim anyway (an IndexError from amax)."""
    assert check(_case("aten.any.dim", lambda s, x: x.any(0), T((0, 0), "bool"))) == "planned"


def test_bitwise_op_of_a_bool_tensor_and_an_integer():
    """``bool_tensor | 3`` is int64 (PyTorch's promotion); the lowering chose the logical op from
    the input's dtype and gave 1 for 3."""
    assert check(_case("aten.bitwise_or.Scalar", lambda s, x: torch.bitwise_or(x, 3) + torch.bitwise_xor(x, 6),
                       T((5,), "bool"))) == "planned"


@pytest.mark.parametrize("n", [8, 256, 300])
def test_eye_of_any_size(n):
    """``torch.eye(n)`` decomposes into index ramps of the smallest unsigned type that holds n: uint8,
    then uint16 from 256 rows, which the IR lacks, and capture failed with 'dtype torch.uint16 is not
    supported by the IR' (found by a new reference program). uint16 and uint32 are held as int64."""
    f = lambda s, a: a + torch.eye(n)  # noqa: E731
    assert check(_case("aten.arange.start_step", f, T((n, n)))) == "planned"


@pytest.mark.parametrize("cshape,beta,alpha", [((5, 6), 0.5, 2.0), ((5, 1), 1.0, 1.0), ((), -2.0, 0.5),
                                               ((6,), 0.5, 1.0), ((5, 6), 0.0, 1.0)])
def test_addmm_with_any_added_matrix(cshape, beta, alpha):
    """addmm(c, a, b, beta, alpha) is the GEMM's alpha * a @ b + beta * c for any c that broadcasts (a
    full matrix, a per-row column, a scalar, a per-column row at beta != 1), and at beta 0 leaves c out
    (PyTorch ignores it, NaN and inf too: c holds them here). The planner refused all but a per-column
    bias at beta 1 (found by building new reference programs)."""
    f = lambda s, c, a, b: torch.addmm(c, a, b, beta=beta, alpha=alpha)  # noqa: E731
    c = T(cshape, edges=beta == 0.0)
    assert check(_case("aten.addmm.default", f, c, T((5, 4)), T((4, 6)))) == "planned"
