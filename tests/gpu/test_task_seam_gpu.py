"""The task seam on the GPU: a body checked against the plan interpreter, with the current stream
busy (the check's stream must wait for the copies and poison queued on it)."""

from __future__ import annotations

import pytest

from stitchcuda import frontend
from stitchcuda.check import check_task
from tests.test_task_seam import BODY, REPO, mlp  # noqa: F401 - mlp is a fixture


@pytest.mark.gpu
def test_check_task_runs_the_body_against_the_interpreter(mlp):
    graph, plan = mlp
    weights = frontend.capture_reference(frontend.load_reference(REPO / "models" / "mlp.py"), device="cpu",
                                         seed=0).weights  # the model's own
    r = check_task(plan, "linear_2", BODY, graph=graph, weights=weights, device="cuda", seed=7)
    print(r)
    assert r.ok and r.ran and r.stage == "done" and r.trials == 3, r
    # the current stream busy (~0.1 s) right before the check queues the body's input copies and
    # output poison on it: the body's stream must wait for them, or it reads unfinished copies
    import torch

    from stitchcuda.check import task as task_check

    task_check.HOLD_CURRENT_STREAM = lambda: torch.cuda._sleep(200_000_000)
    try:
        r = check_task(plan, "linear_2", BODY, graph=graph, weights=weights, device="cuda", seed=7)
    finally:
        task_check.HOLD_CURRENT_STREAM = None
    assert r.ok, r
    wrong = BODY.replace("acc + bias[j]", "acc")  # forgets the bias
    r = check_task(plan, "linear_2", wrong, graph=graph, weights=weights, device="cuda", seed=7)
    assert not r.ok and r.ran and r.stage == "compare" and "output out differs" in r.reason, r
    half = BODY.replace("if (i >= 256 || j >= 256) return;", "if (i >= 128 || j >= 256) return;")  # writes half
    r = check_task(plan, "linear_2", half, graph=graph, weights=weights, device="cuda", seed=7)
    assert not r.ok and r.stage == "compare", r
    assert check_task(plan, "linear_relu", None, graph=graph, device="cuda", seed=7).ok  # the template's, random weights
