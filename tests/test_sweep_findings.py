"""What the sweeps (tests/test_sweep_*.py) found, each fault as an example of its own: the smallest
case that showed it, captured, planned, interpreted and compared with PyTorch in float64 (or, for
a refusal, the message it must carry)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

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
