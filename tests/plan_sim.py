"""The plan interpreter lives in the package now (:mod:`stitchcuda.check.interp`); tests import it here."""

import copy

from stitchcuda.check.interp import Memory, Simulator, eval_instrs, run_task, simulate  # noqa: F401


def where_narrow(graph, option: str, precision=None):
    """Constraints asking the conv strategy ``option`` (``narrow``, or a cuDNN layout:
    ``channels_first`` / ``channels_last``) on every convolution the narrow kernel
    (kinds/narrow_conv.py) is offered, and ``precision`` per node."""
    from stitchcuda import plan as P

    want = {n: option for n, opts in P.choices(graph).strategies if "narrow" in opts}
    return P.Constraints.of(precision or {}, (), want, ())


def check_float64(plan, model, cap, x, tol: float, what="") -> None:
    """The plan interpreted on input ``x`` (``cap``: the capture it was planned from) against
    ``model`` in float64: no NaN, every element within ``tol`` of 1 + |expected| relatively."""
    import torch

    from stitchcuda.pipeline import model_weights

    out = simulate(plan, model_weights(model, cap.graph) or cap.weights, [x])[0].double()
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double())
    err = ((out - want).abs() / (1 + want.abs())).max().item()
    assert not torch.isnan(out).any() and err < tol, (what, err)
