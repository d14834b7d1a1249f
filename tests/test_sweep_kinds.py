"""Every task kind swept over its parameter space (tests/sweep.py says how; the strategies are in
tests/sweep_cases.py): convolutions, pools, gathers, reductions, scans, arg reductions, norms, GEMMs,
attention, concatenation and scatter, arange, recurrent layers and fused elementwise graphs, drawn
with their parameters, hooks, layouts and policies, captured, planned, interpreted and compared
with PyTorch in float64."""

from __future__ import annotations

import pytest
from hypothesis import given

from tests import sweep_cases as C
from tests.sweep import check, sweep

#: strategy -> examples per CI run (the larger run: STITCHCUDA_SWEEP_EXAMPLES)
SWEEPS = {
    "conv": (C.conv, 20), "pool": (C.pool, 20), "upsample": (C.upsample, 10), "interpolate": (C.interpolate, 4),
    "pad": (C.pad, 8), "gather": (C.gather, 15), "reduction": (C.reduction, 20), "scan": (C.scan, 10),
    "arg": (C.arg, 10), "norm": (C.norm, 12), "gemm": (C.gemm, 15), "attention": (C.attention, 12),
    "cat": (C.cat, 8), "scatter": (C.scatter, 6), "arange": (C.arange, 4), "recurrent": (C.recurrent, 6),
    "views": (C.views, 12), "fused": (C.fused, 15),
}


def _test(name: str):
    strategy, n = SWEEPS[name]

    def run(case):
        check(case)

    run.__name__ = f"sweep_{name}"  # (the seed is drawn from the name)
    return sweep(n)(given(case=strategy())(run))


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_sweep(name):
    _test(name)()


@pytest.mark.parametrize("layout", ["contiguous", "strided_inner", "reduced_last_in_memory"])
@pytest.mark.parametrize("what", ["softmax", "log_softmax"])
def test_softmax_over_a_middle_axis(what, layout):
    """A softmax over dim 1 of [2, 5, 6, 7] (42 inner elements: the axis softmax) with hooks before
    and after, on contiguous data, on a view whose inner run has stride 2 (its groups still
    collapse), and on data whose reduced dim lies innermost in memory (rows, no copy); the
    sweep's own draws reach it only where 4-d shapes happen to be large enough."""
    import torch

    from tests.sweep import Case, T

    f = torch.softmax if what == "softmax" else torch.log_softmax
    shape = {"contiguous": (2, 5, 6, 7), "strided_inner": (2, 5, 6, 14),
             "reduced_last_in_memory": (2, 6, 7, 5)}[layout]

    def fn(s, x):
        if layout == "strided_inner":
            x = x[..., ::2]
        elif layout == "reduced_last_in_memory":
            x = x.permute(0, 3, 1, 2)
        return torch.tanh(f(x * 1.5, 1)) * 2.0

    kinds = ("Row",) if layout == "reduced_last_in_memory" else ("AxisRow",)
    case = Case(f"aten._{what}.default", {"layout": layout}, fn, (T(shape),), kinds=kinds, names=(what,))
    assert check(case) == "planned"


@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_pool_average_leaves_the_padding_out_of_its_count(nsp):
    """An average pool with padding and ``count_include_pad=False`` divides a border window by the
    taps inside the input (the CI-sized draw of the pool sweep need not meet the combination: the
    mutation check showed a pool that always counted the padding surviving it)."""
    import torch.nn.functional as F

    from tests.sweep import Case, T

    pool = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[nsp - 1]
    case = Case(f"aten.avg_pool{max(nsp, 2) if nsp < 3 else 3}d.default", {"nsp": nsp},
                lambda s, x: pool(x, 3, 2, 1, count_include_pad=False), (T((2, 3) + (7,) * nsp),),
                names=("avg_pool",))
    assert check(case) == "planned"
