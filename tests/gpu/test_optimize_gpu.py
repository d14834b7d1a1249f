"""optimize on the device: a precision-sensitive reference that build gets wrong under tf32 ends
verified, and a dev problem build covers ends verified and never slower than build's program."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.gpu
def test_optimize_repairs_gemm_row_sum_under_tf32(tmp_path):
    from stitchcuda import optimize

    r = optimize(str(REPO / "models" / "gemm_row_sum.py"), precision="tf32", budget="150s", out=tmp_path / "run")
    st = r.state
    assert st.root_candidate.judgement.kind == "wrong_answer", st.root_candidate.judgement.summary
    best = st.best_candidate
    assert best is not None and best.ok, r.markdown.read_text()
    assert best.proposer in ("rewrite", "precision")
    assert r.report is not None and r.report.result.ok


@pytest.mark.gpu
def test_optimize_never_slower_than_build(tmp_path, dev_set_path):
    from stitchcuda import optimize

    r = optimize("kernelbench:1:23", precision="tf32", budget="90s", out=tmp_path / "run", final_verify=False)
    st = r.state
    root, best = st.root_candidate, st.best_candidate
    assert root.ok and best is not None and best.ok
    assert best.ms <= root.ms
