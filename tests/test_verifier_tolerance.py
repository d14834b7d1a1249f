"""What each tolerance accepts and rejects, on the CPU: the policy's tolerance (never the manifest's),
NaN never, outputs below the tolerance judged relative to their scale, the float64 reference where
it is needed (and a failure without it), and the precision claim told apart by error statistics.

Every check here goes through ``check_correctness`` with a fake program on a reference written for
the test, except the first, which pins ``compare.errors`` itself. Seeds are fixed (SEED).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stitchcuda import manifest as mf  # noqa: E402
from stitchcuda.precision import get, round_tf32  # noqa: E402
from stitchcuda.verifier import build_result  # noqa: E402
from stitchcuda.verifier.run import harness  # noqa: E402
from stitchcuda.verifier.run.reference import resolve_reference  # noqa: E402
from stitchcuda.verifier.run.compare import atol_for, errors  # noqa: E402
from stitchcuda.verifier.run.correctness import check_correctness  # noqa: E402
from tests.fake_program import FunctionRunner  # noqa: E402

SEED = 20261122
ADV = Path(__file__).resolve().parent / "adversarial"


def reference(tmp_path: Path, body: str, shape=(64, 64), draw="torch.randn") -> harness.ReferenceHarness:
    """A one-input, one-output reference whose forward is ``body`` (an expression of x)."""
    src = (f"import torch\nclass Model(torch.nn.Module):\n  def forward(self, x): return {body}\n"
           f"def get_inputs(): return [{draw}({', '.join(map(str, shape))})]\ndef get_init_inputs(): return []\n")
    path = tmp_path / "ref.py"
    path.write_text(src)
    data = {"format": "stitchcuda-program", "version": 1, "name": "t", "abi_version": 1, "precision": "fp32",
            "arch": "sm_90", "source_hash": "0" * 64, "reference": {"path": str(path)},
            "inputs": [{"name": "x", "dtype": "float32", "shape": list(shape)}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": list(shape)}]}
    m = mf.Manifest.from_dict(data)
    return harness.ReferenceHarness(resolve_reference(str(path), tmp_path), m, "cpu", weights_seed=SEED)


def verdict(P, fn, policy, **kw):
    res = check_correctness(FunctionRunner(fn), P, precision=policy, seed=SEED, **kw)
    return build_result(trials=res.trials, checks=res.checks, tolerance=res.tolerance), res


def test_tolerances_are_the_policy_table():
    ref = torch.randn(4096, generator=torch.Generator().manual_seed(SEED), dtype=torch.float64)
    for name, tol in (("fp32", 1e-4), ("tf32", 1e-2), ("bf16", 1e-2), ("fp16", 1e-2)):
        assert get(name).tolerance == tol
        assert not errors(ref + 2 * tol * (1 + ref.abs()), ref, tol).passed
        assert errors(ref + 0.5 * tol, ref, tol).passed
        nan = ref.clone()
        nan[17] = float("nan")
        e = errors(nan, ref, tol)
        assert not e.passed and e.bad_nonfinite == 1 and e.where == (17,)


def test_2e4_is_rejected_under_fp32(tmp_path):
    P = reference(tmp_path, "x * 1.0")
    v, _ = verdict(P, lambda x: x + 2e-4, "fp32")
    assert v.kind == "wrong_answer" and v.verdict.tolerance == 1e-4 and v.verdict.trial == 0, v.verdict


def test_2e3_is_accepted_under_tf32(tmp_path):
    P = reference(tmp_path, "x * 1.0")
    v, res = verdict(P, lambda x: x + 2e-3, "tf32")
    assert v.ok and res.tolerance == 1e-2, [c for c in res.checks if c.status == "fail"]


@pytest.mark.parametrize("policy", ["fp32", "tf32", "bf16", "fp16"])
def test_nan_never_passes(tmp_path, policy):
    P = reference(tmp_path, "x * 1.0")

    def one_nan(x):
        y = x.clone()
        y[5, 7] = float("nan")
        return y

    v, _ = verdict(P, one_nan, policy)
    assert v.kind == "wrong_answer" and v.verdict.nan_count == 1 and v.verdict.where == (5, 7), v.verdict


def test_small_outputs_are_judged_relative_to_their_scale(tmp_path):
    """Outputs of 1e-4 under a 1e-2 tolerance: zeros and a constant are within an absolute 1e-2 of
    every element, and are wrong; the honest outputs (and rounding noise of their size) pass."""
    P = reference(tmp_path, "1e-4 * torch.sin(x)", shape=(128, 128))
    assert atol_for(1e-2, 7e-5) == pytest.approx(7e-7)
    for fake in (lambda x: torch.zeros_like(x), lambda x: torch.full_like(x, 3e-5)):
        v, _ = verdict(P, fake, "tf32")
        assert v.kind == "wrong_answer" and v.verdict.atol < 1e-5, v.verdict
        assert "judged relative to the output's scale" in v.verdict.summary()
    v, res = verdict(P, lambda x: 1e-4 * torch.sin(x) * (1 + 1e-3), "tf32")
    assert v.ok, [c for c in res.checks if c.status == "fail"]
    # outputs of magnitude 1 and more: KernelBench's absolute tolerance, unchanged
    assert atol_for(1e-2, 3.0) == 1e-2


def test_float64_reference_rescues_an_exact_program_and_only_it(tmp_path, monkeypatch):
    """y = (x + 1e4) - 1e4: the fp32 reference is off by up to 5e-4 (the spacing of fp32 at 1e4);
    a program that returns x exactly is right, which only the float64 reference can tell."""
    P = reference(tmp_path, "(x + 1e4) - 1e4")
    v, res = verdict(P, lambda x: x.clone(), "fp32")
    assert v.ok, [c for c in res.checks if c.status == "fail"]
    rescued = [o for t in res.trials for o in t.outputs if o.judged == "float64"]
    assert rescued and all(o.max_abs_err_f64 == 0.0 for o in rescued)
    monkeypatch.setattr(harness.ReferenceHarness, "forward64", lambda self, draw, inputs=None: None)
    v, _ = verdict(P, lambda x: x.clone(), "fp32")
    assert v.kind == "wrong_answer", v.verdict


def test_varied_trials_judge_gross_errors_not_reordered_rounding(tmp_path):
    """A row sum whose rounding error grows with its terms (3e-8 x sum|x|, another summation order):
    within KernelBench's atol on get_inputs()'s distribution; on varied inputs (x24..x160, ramps
    whose sums cancel) only within 10 x tol, atol scaled with the output's RMS. It passes; a program
    that is off by 2e-3 only on inputs unlike get_inputs()'s fails, and so does one clamping them."""
    P = reference(tmp_path, "x.sum(dim=1, keepdim=True).expand(x.shape).contiguous()", shape=(64, 4096))

    def rounded(x):
        return x.sum(dim=1, keepdim=True).expand(x.shape) + 3e-8 * x.abs().sum(dim=1, keepdim=True)

    v, res = verdict(P, rounded, "fp32")
    assert v.ok, [c for c in res.checks if c.status == "fail"]
    assert any(o.judged == "varied-slack" for t in res.trials for o in t.outputs)
    assert all(o.judged != "varied-slack" for t in res.trials if not t.label for o in t.outputs)

    def off_when_large(x):  # plain inputs (|x| < 6) exact; larger ones 2e-3 off
        y = x.sum(dim=1, keepdim=True).expand(x.shape).contiguous()
        return y * (1 + 2e-3) if float(x.abs().max()) > 10 else y
    v, _ = verdict(P, off_when_large, "fp32")
    assert v.kind != "passed", v.verdict

    def tuned(x):  # right while |x| < 5 (get_inputs()'s), clamped beyond
        return x.clamp(-5, 5).sum(dim=1, keepdim=True).expand(x.shape).contiguous()
    v, _ = verdict(P, tuned, "fp32")
    assert v.kind != "passed", v.verdict


def test_the_slack_of_varied_distributions_never_reaches_changed_elements(tmp_path):
    """A row mean from the first 3/4 of each row (uniform inputs: within tf32's tolerance of the true
    mean): a changed element in the last quarter moves the reference and not the program, by less
    than 10 x tol — the sensitivity check must still refuse it (the slack is for distributions)."""
    P = reference(tmp_path, "x.mean(dim=1, keepdim=True).expand(x.shape).contiguous()", shape=(16, 16384),
                  draw="torch.rand")

    def subsampled(x):
        return x[:, : 3 * x.shape[1] // 4].mean(dim=1, keepdim=True).expand(x.shape).contiguous()

    v, _ = verdict(P, subsampled, "tf32")
    assert v.kind == "rejected" and [c.name for c in v.verdict.checks] == ["sensitivity"], v.verdict


def test_float64_is_computed_only_where_fp32_fails(tmp_path, monkeypatch):
    P = reference(tmp_path, "x * 2.0")
    calls = {"n": 0}
    real = harness.ReferenceHarness.forward64

    def counted(self, draw, inputs=None):
        calls["n"] += 1
        return real(self, draw, inputs)

    monkeypatch.setattr(harness.ReferenceHarness, "forward64", counted)
    v, _ = verdict(P, lambda x: x * 2.0, "fp32")
    assert v.ok and calls["n"] == 0


# ------------------------------------------------------------------ the precision claim, emulated on the CPU


def _round_tf32(t: torch.Tensor) -> torch.Tensor:
    return round_tf32(t.float())


def _round_bf16(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16().float()


class EmulatedGemm(harness.ReferenceHarness):
    """references/gemm.py with the GPU's policies emulated: TF32 rounds the GEMM's inputs to TF32;
    bf16 (autocast) rounds inputs and output to bfloat16."""

    def forward_at(self, policy, draw, inputs=None, emulated=""):
        if emulated:  # (forward_at at tf32 is the emulation here already)
            return None
        (x,) = draw.program if inputs is None else inputs
        w = self.weights[0]
        if policy == "tf32":
            return [_round_tf32(x) @ _round_tf32(w).T]
        if policy == "bf16":
            return [_round_bf16(_round_bf16(x) @ _round_bf16(w).T)]
        return [x @ w.T]


@pytest.fixture(scope="module")
def gemm():
    """At the model's own initialisation (``vary=False``), where the bf16 program's errors sit inside
    the tf32 tolerance: the precision claim alone must tell it apart."""
    m = mf.Manifest.load(ADV / "gemm_tf32_honest")
    return EmulatedGemm(resolve_reference(None, ADV / "gemm_tf32_honest", m), m, "cpu", weights_seed=SEED, vary=False)


def test_a_tf32_claim_computed_in_bf16_is_caught(gemm):
    w = gemm.weights[0]
    v, res = verdict(gemm, lambda x: _round_bf16(x) @ _round_bf16(w).T, "tf32", varied=0)
    assert all(t.passed for t in res.trials)  # within the 1e-2 tolerance ...
    assert v.kind == "rejected" and v.verdict.checks[0].name == "precision_claim", v.verdict  # ... but not TF32
    detail = v.verdict.checks[0].detail
    assert "matches bf16 arithmetic" in detail and "not the tf32 claimed" in detail, detail


def test_an_honest_tf32_program_passes_the_precision_claim(gemm):
    w = gemm.weights[0]
    v, res = verdict(gemm, lambda x: _round_tf32(x) @ _round_tf32(w).T, "tf32", varied=0)
    (c,) = [c for c in res.checks if c.name == "precision_claim"]
    assert v.ok and c.status == "pass" and "mean |err| against float64" in c.detail, c


def test_a_wrong_program_is_a_wrong_answer_not_a_precision_claim(gemm):
    w = gemm.weights[0]
    v, res = verdict(gemm, lambda x: x @ w.T + 0.1, "tf32", varied=0)
    assert v.kind == "wrong_answer", v.verdict
    # the failure set beside PyTorch's own TF32 on the same inputs, once: the program's fault here
    said = [n for n in res.notes if "PyTorch's own tf32 on the same inputs" in n]
    assert len(said) == 1 and "(within the tolerance)" in said[0] and "max |err| 0.1" in said[0], res.notes


def test_round_tf32_keeps_ten_mantissa_bits_to_nearest():
    one = 1.0
    x = torch.tensor([one, one + 2**-10, one + 2**-11, one + 2**-12, -(one + 2**-11), 3.0e38, float("inf"),
                      float("-inf"), float("nan"), 0.0], dtype=torch.float32)
    r = round_tf32(x)
    assert r[:6].tolist() == [one, one + 2**-10, one + 2**-10, one, -(one + 2**-10), r[5].item()]
    assert (round_tf32(r[:6]) == r[:6]).all()                      # TF32 values stay as they are
    assert abs(r[5].item() - 3.0e38) <= 3.0e38 * 2**-11
    assert r[6].item() == float("inf") and r[7].item() == float("-inf") and r[8].isnan() and r[9].item() == 0.0


def test_tf32_emulated_rounds_every_products_operands_and_nothing_else():
    """Policy.emulated() at tf32: a product's float32 operands rounded to TF32 whichever op reaches
    it (a matmul, a linear layer's addmm with its bias left exact, a convolution); elementwise work
    untouched; at fp32 nothing rounded. On the CPU, where PyTorch's TF32 flags do nothing."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(7)
    x, w, b = (torch.randn(s, generator=g) for s in ((16, 64), (32, 64), (32,)))
    img, k = torch.randn(2, 3, 9, 9, generator=g), torch.randn(4, 3, 3, 3, generator=g)
    rx, rw, rimg, rk = (round_tf32(t) for t in (x, w, img, k))
    with torch.no_grad(), get("tf32").emulated():
        mm, lin, conv, ew = x @ w.T, F.linear(x, w, b), F.conv2d(img, k, b[:4]), torch.exp(x)
    assert torch.equal(mm, rx @ rw.T)
    assert torch.equal(lin, torch.addmm(b, rx, rw.T))
    assert torch.equal(conv, F.conv2d(rimg, rk, b[:4]))
    assert torch.equal(ew, torch.exp(x))
    assert not torch.equal(mm, x @ w.T)                                # the rounding is there to see
    with torch.no_grad(), get("fp32").emulated():
        fp32_mm, fp32_lin = x @ w.T, F.linear(x, w, b)
    assert torch.equal(fp32_mm, x @ w.T) and torch.equal(fp32_lin, F.linear(x, w, b))


def test_tf32_emulated_truncation_drops_the_low_bits():
    """round_tf32(truncate=True) keeps the 10 mantissa bits and drops the rest (toward zero, never up),
    and Policy.emulated("truncate") gives a product of truncated operands: the precision claim's
    yardstick for engines that hand the tensor cores fp32 values unconverted."""
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(16, 64, generator=g), torch.randn(32, 64, generator=g)
    tx = round_tf32(x, truncate=True)
    assert torch.equal(tx.view(torch.int32) & 0x1FFF, torch.zeros_like(tx, dtype=torch.int32))
    assert (tx.abs() <= x.abs()).all() and not torch.equal(tx, round_tf32(x))
    with torch.no_grad(), get("tf32").emulated("truncate"):
        got = x @ w.T
    assert torch.equal(got, tx @ round_tf32(w, truncate=True).T)


@pytest.mark.parametrize("policy", ["tf32", "fp32"])
def test_emulated_refuses_a_mode_it_does_not_know(policy):
    """Policy.emulated's modes are precision.EMULATIONS, under every policy: another name is an error
    that lists them, never PyTorch's own arithmetic passed off as an emulation."""
    with pytest.raises(ValueError, match="round, truncate"), get(policy).emulated("nearest"):
        pass


@pytest.mark.parametrize("masked", [False, True])
def test_tf32_emulated_rounds_an_attentions_query_key_and_value(masked):
    """PyTorch's fused attention (scaled_dot_product_attention, whichever backend it picks) under
    Policy.emulated() at tf32: its query, key and value rounded to TF32 — the operands of its two
    products — and a mask left as it is; at fp32 nothing rounded. Before, the emulation of an attention
    was exact fp32, and a TF32 attention had no yardstick on inputs where TF32 itself misses."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 4, 16, 32, generator=g) * 6 for _ in range(3))  # logits of order 1e3
    mask = torch.randn(16, 16, generator=g) if masked else None
    with torch.no_grad(), get("tf32").emulated():
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want = F.scaled_dot_product_attention(*(round_tf32(t) for t in (q, k, v)), attn_mask=mask)
    exact = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(got, want)
    assert (got - exact).abs().max().item() > 1e-3  # the rounding is there to see
    with torch.no_grad(), get("fp32").emulated():
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), exact)
