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
