"""Every operator of the op registry (``stitchcuda.ops``) swept over its arguments: for each, the
strategy of tests/sweep_cases.py that reaches it draws cases (its parameters as PyTorch has them,
dtypes, broadcast and empty shapes, inputs read through views), and each is captured, planned,
interpreted and compared with PyTorch in float64 (tests/sweep.py). The tables must cover the
registry and the task kinds: an operator or a kind added without a strategy fails here."""

from __future__ import annotations

import typing

import pytest
from hypothesis import given

from stitchcuda import ops
from stitchcuda import plan as P
from tests import sweep_cases as C
from tests.sweep import check, sweep

#: The planner's own operators (the match pass makes them from patterns; no capture emits them):
#: the attention and norm sweeps reach them through their patterns.
SYNTHETIC = sorted(n for n in ops.ATEN if not n.startswith("aten."))


def test_every_registry_operator_has_a_strategy():
    missing = sorted(n for n in ops.ATEN if n.startswith("aten.") and n not in C.OPS)
    assert not missing, f"operators of the registry no sweep reaches: {missing}"
    assert not [n for n in C.OPS if n not in ops.ATEN], "a strategy for an operator the registry does not hold"
    assert SYNTHETIC == ["stitch.affine_channel", "stitch.mask_add", "stitch.mask_bool"]


def test_every_task_kind_has_a_strategy():
    kinds = {cls.__name__.removesuffix("Spec") for cls in typing.get_args(P.TaskSpec)}
    assert kinds == set(C.KINDS)


def _test(op: str):
    def run(case):
        check(case)

    run.__name__ = "sweep_" + op.replace(".", "_")  # (the seed is drawn from the name)
    return sweep(1)(given(case=C.OPS[op](op))(run))


@pytest.mark.parametrize("op", sorted(C.OPS))
def test_operator(op):
    _test(op)()
