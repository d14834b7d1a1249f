"""``gather(log_softmax(x, d), i, d) = gather(x, i, d) - logsumexp(x, d)`` (plan/rewrite.py), on the
losses that decompose to it and on the cases where it must not fire (CPU, the plan interpreter)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from stitchcuda import frontend
from stitchcuda import ops
from stitchcuda import plan as P
from stitchcuda.plan.rewrite import ALWAYS
from tests.plan_sim import simulate


class Loss(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x, t):
        return self.f(x, t)


def _run(f, x, t, policy="fp32"):
    model = Loss(f)
    cap = frontend.capture(model, [x, t], "loss", supported_ops=ops.supported())
    plan = P.plan(cap.graph, policy)
    got = simulate(plan, {}, [x, t])[0].double()
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double(), t)
    return plan, cap, ((got - want).abs() / (1 + want.abs())).max().item()


def _row_ops(plan):
    return [t.params.op for t in plan.tasks if isinstance(t.params, P.RowSpec)]


@pytest.mark.parametrize("f", [
    lambda x, t: F.cross_entropy(x, t),
    lambda x, t: F.cross_entropy(x, t, reduction="sum"),
    lambda x, t: F.cross_entropy(x, t, reduction="none"),
    lambda x, t: F.cross_entropy(x, t, ignore_index=3),
    lambda x, t: F.nll_loss(F.log_softmax(x, 1), t),
    lambda x, t: torch.gather(torch.log_softmax(x, -1), -1, t[:, None]) * 2,
], ids=["mean", "sum", "none", "ignore_index", "nll", "gather"])
def test_losses_read_the_logits_once(f):
    torch.manual_seed(0)
    x = torch.randn(16, 37) * 3
    t = torch.randint(0, 37, (16,))
    t[5] = 3  # a row the ignore_index case skips
    plan, _, err = _run(f, x, t)
    assert "log_softmax" not in _row_ops(plan) and "logsumexp" in _row_ops(plan)
    assert err < 1e-6


def test_not_taken_where_the_log_probabilities_are_read_elsewhere():
    def f(x, t):
        y = torch.log_softmax(x, 1)
        return torch.gather(y, 1, t[:, None]).sum() + y.mean()

    torch.manual_seed(0)
    x, t = torch.randn(8, 11), torch.randint(0, 11, (8,))
    plan, _, err = _run(f, x, t)
    assert "log_softmax" in _row_ops(plan) and err < 1e-6


def test_not_taken_along_another_dim_or_a_narrower_index():
    def other_dim(x, t):
        return torch.gather(torch.log_softmax(x, 0), 1, t[:, None])

    def narrower(x, t):  # the index covers 4 of the 8 rows: logsumexp would not broadcast over it
        return torch.gather(torch.log_softmax(x, 1), 1, t[:4, None])

    torch.manual_seed(0)
    x, t = torch.randn(8, 11), torch.randint(0, 11, (8,))
    for f in (other_dim, narrower):
        plan, _, err = _run(f, x, t)
        assert "log_softmax" in _row_ops(plan) and err < 1e-6
    assert "gather_of_log_softmax" in {r.name for r in ALWAYS}


def test_tf32_and_bf16_stay_within_their_tolerance():
    torch.manual_seed(1)
    x, t = torch.randn(64, 1000) * 4, torch.randint(0, 1000, (64,))
    for policy, tol in (("tf32", 1e-2), ("bf16", 2e-2)):
        _, _, err = _run(lambda a, b: F.cross_entropy(a, b), x, t, policy)
        assert err < tol, policy
