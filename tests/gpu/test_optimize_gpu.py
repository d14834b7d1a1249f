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


#: A reference with three linears wide enough for cuBLASLt's tensor-core kernels.
MLP = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.ReLU(),
                                 nn.Linear(1024, 256))

    def forward(self, x):
        return self.net(x)


def get_inputs():
    return [torch.randn(2048, 512)]


def get_init_inputs():
    return []
"""


@pytest.mark.gpu
@pytest.mark.parametrize("parts,call", [("auto", "st_gemm_split_bf16"), ("tf32x3", "st_gemm_split_tf32")])
def test_raised_gemms_verify_as_split_products_with_their_profile_judged(tmp_path, parts, call):
    """Every GEMM raised to fp32 in a TF32 program: split into bf16 parts (the default) or TF32 parts,
    the program verifies at tf32 with its CUPTI profile judged, so the bf16 kernels the split-bf16 GEMM
    launches pass the precision claim's kernel-name check (SPLIT_BF16_LAUNCHES a call excused, no more)."""
    from stitchcuda import ops
    from stitchcuda import plan as P
    from stitchcuda.pipeline import build_program, capture_problem
    from stitchcuda.verifier import verify

    ref = tmp_path / "mlp.py"
    ref.write_text(MLP)
    graph = capture_problem(str(ref), precision="tf32").graph
    gemms = [n.name for n in graph.nodes if ops.kind(n.op) == "gemm"]
    assert len(gemms) == 3, [n.op for n in graph.nodes]
    c = P.Constraints.of(precision={n: "fp32" for n in gemms},
                         strategy={n: parts for n in gemms} if parts != "auto" else None)
    out = tmp_path / "mlp"
    outcome = build_program(str(ref), precision="tf32", out=out, constraints=c, quiet=True)
    assert outcome.ok, outcome.build.message if outcome.build else "not built"
    assert (out / "program.cu").read_text().count(f"{call}(&g, stream)") == 3
    result = verify(out, precision="tf32", trials=5, time=False, profile=True)
    assert result.ok, f"{result.kind}: {result.verdict.summary()}"
    checks = {ch.name: (ch.status, ch.detail) for ch in result.checks}
    assert checks["precision_claim"][0] == "pass", checks


#: Rotary angles as a product over K = 1 (positions x frequencies, as transformers 5.17 writes them),
#: then a linear: at TF32 the product alone is 9.95x the tf32 bound in the interpreter's model.
ROTARY = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64)))
        self.proj = nn.Linear(64, 256)

    def forward(self, pos):
        freqs = (self.inv_freq[None, :, None] @ pos[:, None, :]).transpose(1, 2)
        return self.proj(torch.cat([freqs.cos(), freqs.sin()], -1))


def get_inputs():
    return [torch.arange(2048.0).repeat(8, 1)]


def get_init_inputs():
    return []
"""


@pytest.mark.gpu
def test_a_short_sum_product_verifies_at_tf32_as_built(tmp_path):
    """The rotary angles' K = 1 product computes at fp32 under tf32 (kinds/gemm.py, SHORT_K), so
    `build`'s program verifies at tf32 with no repair; its linear (K = 64) stays on TF32."""
    from stitchcuda.pipeline import build_program
    from stitchcuda.verifier import verify

    ref = tmp_path / "rotary.py"
    ref.write_text(ROTARY)
    out = tmp_path / "rotary"
    outcome = build_program(str(ref), precision="tf32", out=out, quiet=True)
    assert outcome.ok, outcome.build.message if outcome.build else "not built"
    src = (out / "program.cu").read_text()
    assert "ST_POLICY_FP32" in src and "ST_POLICY_TF32" in src
    result = verify(out, precision="tf32", trials=5, time=False, profile=False)
    assert result.ok, f"{result.kind}: {result.verdict.summary()}"
