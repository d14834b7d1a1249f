"""The runtime on a GPU: every GEMM epilogue x precision policy against PyTorch in float64,
plan cache, per-stream workspace, pinned transfers, every fused epilogue op, the program ABI,
and the errors bad input gets."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import stitchcuda  # noqa: E402
from tests.dlpack_fake import fake_dlpack  # noqa: E402
from stitchcuda import rt  # noqa: E402

pytestmark = pytest.mark.gpu

POLICIES = {"fp32": (torch.float32, 1e-4), "tf32": (torch.float32, 1e-2), "bf16": (torch.bfloat16, 1e-2),
            "fp16": (torch.float16, 1e-2)}
EPILOGUES = ["none", "bias", "relu", "gelu", "bias_relu", "bias_gelu"]


@pytest.fixture(autouse=True)
def _no_tf32():
    # The float64 reference must not depend on PyTorch's TF32 flags.
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


def stream_int() -> int:
    return torch.cuda.current_stream().cuda_stream


def reference_epilogue(y: torch.Tensor, epilogue: str, bias: torch.Tensor | None) -> torch.Tensor:
    if "bias" in epilogue:
        y = y + bias
    if epilogue.endswith("relu"):
        y = F.relu(y)
    if epilogue.endswith("gelu"):
        y = F.gelu(y, approximate="tanh")  # cuBLASLt's GELU is the tanh form
    return y


def check_close(out: torch.Tensor, ref: torch.Tensor, tol: float, what: str) -> None:
    out64 = out.double()
    assert not torch.isnan(out64).any(), f"{what}: NaN in output"
    err = (out64 - ref).abs()
    bound = tol + tol * ref.abs()
    worst = (err - bound).max().item()
    assert worst <= 0, f"{what}: max abs err {err.max().item():.3e} exceeds tol {tol} (mean {err.mean().item():.2e})"


SHAPES = [  # (batch, m, n, k): odd sizes, batch > 1, thin and wide
    (1, 1, 1, 1), (1, 7, 13, 5), (1, 33, 65, 17), (3, 31, 47, 129), (2, 128, 256, 64), (1, 257, 1, 300),
    (4, 1, 96, 33), (1, 512, 384, 768),
]


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_gemm_epilogue_policy(policy, epilogue):
    dt, tol = POLICIES[policy]
    gen = torch.Generator(device="cuda").manual_seed(hash((policy, epilogue)) % 2**31)
    for (batch, m, n, k) in SHAPES:
        for trans_a, trans_b in [(False, False), (True, False), (False, True), (True, True)]:
            a_shape = (batch, k, m) if trans_a else (batch, m, k)
            b_shape = (batch, n, k) if trans_b else (batch, k, n)
            a = (torch.randn(a_shape, device="cuda", generator=gen) / k**0.5).to(dt)
            b = torch.randn(b_shape, device="cuda", generator=gen).to(dt)
            bias = torch.randn(n, device="cuda", generator=gen).to(dt) if "bias" in epilogue else None
            if batch == 1 and m % 2:  # also exercise 2-D operands
                a, b = a[0], b[0]
            out = rt.gemm(a, b, policy=policy, trans_a=trans_a, trans_b=trans_b, epilogue=epilogue, bias=bias,
                          stream=stream_int())
            out = torch.from_dlpack(out)
            a64, b64 = a.double(), b.double()
            if trans_a:
                a64 = a64.transpose(-1, -2)
            if trans_b:
                b64 = b64.transpose(-1, -2)
            ref = reference_epilogue(a64 @ b64, epilogue, bias.double() if bias is not None else None)
            check_close(out, ref.reshape(out.shape), tol, f"{policy}/{epilogue} b{batch} {m}x{n}x{k} ta{trans_a} tb{trans_b}")


@pytest.mark.parametrize("policy", list(POLICIES))
def test_gemm_residual_beta_c(policy):
    dt, tol = POLICIES[policy]
    for (batch, m, n, k) in [(1, 65, 33, 17), (3, 64, 128, 96)]:
        a = (torch.randn(batch, m, k, device="cuda") / k**0.5).to(dt)
        b = torch.randn(batch, k, n, device="cuda").to(dt)
        c = torch.randn(batch, m, n, device="cuda").to(dt)
        out = torch.empty(batch, m, n, device="cuda", dtype=dt)
        rt.gemm(a, b, out, policy=policy, c=c, alpha=0.5, beta=2.0, stream=stream_int())
        ref = 0.5 * (a.double() @ b.double()) + 2.0 * c.double()
        check_close(out, ref, tol, f"{policy} beta*C")
        # C aliasing out: in-place residual accumulate.
        out.copy_(c)
        rt.gemm(a, b, out, policy=policy, c=out, beta=1.0, epilogue="none", stream=stream_int())
        check_close(out, a.double() @ b.double() + c.double(), tol, f"{policy} C aliasing out")


def test_gemm_views_and_broadcast_batch():
    a = torch.randn(4, 64, 32, device="cuda")
    w = torch.randn(48, 32, device="cuda")
    out = torch.from_dlpack(rt.gemm(a, w.t(), stream=stream_int()))  # a transposed view as b, broadcast over batch
    check_close(out, a.double() @ w.double().t(), 1e-4, "broadcast b")
    big = torch.randn(64, 100, device="cuda")
    view = big[:, 10:42]  # leading dimension 100, not contiguous
    out = torch.from_dlpack(rt.gemm(view, torch.randn(32, 16, device="cuda") * 1.0, stream=stream_int()))
    assert out.shape == (64, 16)


@pytest.mark.parametrize("case", ["plain", "aligned", "transposed_a", "transposed_b_bias_relu",
                                  "batched_broadcast_b_residual", "batched_broadcast_a"])
def test_split_gemms_beside_fp32_and_tf32(case):
    """The split GEMMs' error against float64, through transposed operands (K the inner or the outer
    axis of each), a bias and activation, a broadcast batch of either operand, a residual (beta * C),
    and odd and vector-friendly sizes: split TF32 is fp32's order, far below TF32's; split bf16 lies
    between, well below TF32's."""
    g = torch.Generator(device="cuda").manual_seed(7)
    m, n, k = (256, 128, 1024) if case == "aligned" else (257, 129, 1031)
    batched = case.startswith("batched")
    a = torch.randn((3, m, k) if batched and case != "batched_broadcast_a" else (m, k), device="cuda", generator=g)
    if case == "transposed_a":
        a = a.t().contiguous().t()  # stored k x m
    w = torch.randn(n, k, device="cuda", generator=g)
    b = w.t() if case.startswith("transposed_b") else w.t().contiguous()
    if case == "batched_broadcast_a":
        b = torch.randn(3, k, n, device="cuda", generator=g)
    epilogue = "bias_relu" if "bias" in case else "none"
    bias = torch.randn(n, device="cuda", generator=g) if "bias" in case else None
    c = torch.randn((3, m, n) if batched else (m, n), device="cuda", generator=g) if "residual" in case else None
    beta = 0.5 if c is not None else 0.0
    kw = dict(epilogue=epilogue, bias=bias, c=c, beta=beta, stream=stream_int())
    ref = a.double() @ b.double() + (bias.double() if bias is not None else 0.0)
    ref = (ref.clamp_min(0.0) if epilogue == "bias_relu" else ref) + (beta * c.double() if c is not None else 0.0)

    def err(out) -> float:
        return ((torch.from_dlpack(out).double() - ref).abs().max() / ref.abs().max()).item()

    split = err(rt.gemm_split_tf32(a, b, **kw))
    bf16 = err(rt.gemm_split_bf16(a, b, **kw))
    fp32 = err(rt.gemm(a, b, policy="fp32", **kw))
    tf32 = err(rt.gemm(a, b, policy="tf32", **kw))
    assert split <= 4 * fp32 + 1e-7, f"{case}: split {split:.2e}, fp32 {fp32:.2e}"
    assert split * 50 < tf32, f"{case}: split {split:.2e}, tf32 {tf32:.2e}"
    assert split < bf16 and bf16 * 16 < tf32, f"{case}: bf16 parts {bf16:.2e}, split TF32 {split:.2e}, tf32 {tf32:.2e}"


def test_plan_cache_is_bounded_least_recently_used_first():
    """A context keeps at most its bound of GEMM plans: a fourth shape under a bound of three gives
    up the plan used longest ago (asked again: a miss), while the one used just before stays (a hit),
    and every call stays right."""
    s = torch.cuda.Stream()
    sid = s.cuda_stream
    with torch.cuda.stream(s):
        rt.plan_cache_clear(stream=sid)
        before = rt.plan_cache_stats(stream=sid)["capacity"]
        assert before >= 256, before
        rt.set_plan_cache_capacity(gemm=3)
        try:
            b = torch.randn(64, 48, device="cuda")
            xs = {m: torch.randn(m, 64, device="cuda") for m in (16, 24, 32, 40)}
            for m in (16, 24, 32):
                rt.gemm(xs[m], b, stream=sid)
            rt.gemm(xs[16], b, stream=sid)  # 16 used again: 24 is now the oldest
            rt.gemm(xs[40], b, stream=sid)  # a fourth plan: 24's is given up
            st = rt.plan_cache_stats(stream=sid)
            assert (st["size"], st["capacity"], st["misses"], st["hits"]) == (3, 3, 4, 1), st
            assert st["evictions"] >= 1, st
            rt.gemm(xs[32], b, stream=sid)
            assert rt.plan_cache_stats(stream=sid)["hits"] == 2, "a plan used recently was given up"
            out = torch.from_dlpack(rt.gemm(xs[24], b, stream=sid))
            st = rt.plan_cache_stats(stream=sid)
            assert (st["misses"], st["size"]) == (5, 3), "the oldest plan was kept past the bound"
            torch.cuda.current_stream().synchronize()
            check_close(out, xs[24].double() @ b.double(), 1e-4, "a plan made again after it was given up")
        finally:
            rt.set_plan_cache_capacity(gemm=before)
            rt.plan_cache_clear(stream=sid)


def test_plan_cache_hits_and_cached_call_matches():
    s = torch.cuda.Stream()
    sid = s.cuda_stream
    with torch.cuda.stream(s):
        rt.plan_cache_clear(stream=sid)
        a = torch.randn(96, 80, device="cuda")
        b = torch.randn(80, 112, device="cuda")
        bias = torch.randn(112, device="cuda")
        first = torch.from_dlpack(rt.gemm(a, b, epilogue="bias_relu", bias=bias, stream=sid)).clone()
        st = rt.plan_cache_stats(stream=sid)
        assert (st["hits"], st["misses"], st["size"]) == (0, 1, 1)
        second = torch.from_dlpack(rt.gemm(a, b, epilogue="bias_relu", bias=bias, stream=sid))
        st = rt.plan_cache_stats(stream=sid)
        assert (st["hits"], st["misses"], st["size"]) == (1, 1, 1)
        torch.cuda.current_stream().synchronize()
        assert torch.equal(first, second), "cached call differs from the first"
        # A new bias pointer reuses the plan and must be honoured.
        bias2 = bias + 1.0
        third = torch.from_dlpack(rt.gemm(a, b, epilogue="bias_relu", bias=bias2, stream=sid))
        assert rt.plan_cache_stats(stream=sid)["hits"] == 2
        check_close(third, F.relu(a.double() @ b.double() + bias2.double()), 1e-4, "new bias pointer")
        # A different shape is a different plan.
        rt.gemm(a[:50], b, epilogue="bias_relu", bias=bias, stream=sid)
        assert rt.plan_cache_stats(stream=sid)["misses"] == 2
    s.synchronize()


def test_workspace_persists_per_stream():
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    a = torch.randn(256, 256, device="cuda")
    rt.gemm(a, a, stream=s1.cuda_stream)
    rt.gemm(a, a, stream=s2.cuda_stream)
    p1, n1 = rt.workspace_info(stream=s1.cuda_stream)
    p2, n2 = rt.workspace_info(stream=s2.cuda_stream)
    assert p1 != 0 and p2 != 0 and p1 != p2, "each stream owns its workspace"
    cc = rt.device_info(torch.cuda.current_device())["compute_capability"]
    assert n1 == n2 == ((32 << 20) if cc[0] >= 9 else (4 << 20))
    for _ in range(3):
        rt.gemm(a, a, stream=s1.cuda_stream)
    assert rt.workspace_info(stream=s1.cuda_stream) == (p1, n1), "workspace reallocated between calls"
    torch.cuda.synchronize()


def test_pinned_round_trip_bit_exact():
    for nbytes in [1, 4095, 1 << 20, (64 << 20) + 3]:
        src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
        hb = rt.HostBuffer(nbytes)
        assert hb.pinned, "pinning should work on this machine"
        view = memoryview(hb)
        view[:] = src.numpy().tobytes()
        dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        rt.h2d(dev, hb, stream=stream_int())
        back = rt.HostBuffer(nbytes)
        rt.d2h(back, dev, stream=stream_int())
        rt.synchronize(stream_int())
        assert bytes(memoryview(back)) == src.numpy().tobytes()
        assert torch.equal(dev.cpu(), src)
        hb.close()
        back.close()
    stats = rt.host_pool_stats()
    assert stats["pinning_enabled"] and stats["cached_bytes"] > 0


def test_pageable_staged_round_trip_bit_exact():
    import numpy as np

    arr = np.random.default_rng(1).integers(0, 256, size=(20 << 20) + 5, dtype=np.uint8)
    dev = torch.empty(arr.size, dtype=torch.uint8, device="cuda")
    rt.h2d(dev, arr, stream=stream_int())
    out = np.zeros_like(arr)
    rt.d2h(out, dev, stream=stream_int())
    rt.synchronize(stream_int())
    assert np.array_equal(arr, out)


def test_pinning_disabled_falls_back_with_warning(tmp_path):
    code = (
        "import stitchcuda; from stitchcuda import rt; h = rt.HostBuffer(1 << 20); "
        "print('PINNED', h.pinned)"
    )
    import os
    import sys

    env = dict(os.environ, STITCHCUDA_NO_PINNED="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "PINNED False" in r.stdout
    assert "pinned host memory unavailable" in r.stderr


EP_OPS = [
    (("scale", 0.75), lambda x, r, b: x * 0.75),
    (("add", -0.5), lambda x, r, b: x - 0.5),
    (("div", 3.0), lambda x, r, b: x / 3.0),
    (("leaky_relu", 0.2), lambda x, r, b: F.leaky_relu(x, 0.2)),
    ("silu", lambda x, r, b: F.silu(x)),
    ("sigmoid", lambda x, r, b: torch.sigmoid(x)),
    ("tanh", lambda x, r, b: torch.tanh(x)),
    ("mish", lambda x, r, b: F.mish(x)),
    ("hardtanh", lambda x, r, b: F.hardtanh(x)),
    (("clamp", -0.3, 0.4), lambda x, r, b: x.clamp(-0.3, 0.4)),
    ("gelu_tanh", lambda x, r, b: F.gelu(x, approximate="tanh")),
    ("gelu", lambda x, r, b: F.gelu(x)),
    ("relu", lambda x, r, b: F.relu(x)),
    (("residual_add", 0.5), lambda x, r, b: x + 0.5 * r),
    ("bias_add", lambda x, r, b: x + b),
    ("hardswish", lambda x, r, b: F.hardswish(x)),
    ("softplus", lambda x, r, b: F.softplus(x)),
    (("elu", 0.7), lambda x, r, b: F.elu(x, 0.7)),
    ("abs", lambda x, r, b: x.abs()),
    ("exp", lambda x, r, b: x.exp()),
    ("square", lambda x, r, b: x * x),
]


def _name(op):
    return op if isinstance(op, str) else op[0]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 1e-2), (torch.float16, 1e-2)])
@pytest.mark.parametrize("op,fn", EP_OPS, ids=[_name(o) for o, _ in EP_OPS])
def test_epilogue_template_op(op, fn, dtype, tol):
    for shape in [(1, 1), (3, 7), (64, 128), (129, 1000), (2, 70000)]:
        x = (torch.randn(shape, device="cuda") * 2).to(dtype)
        res = torch.randn(shape, device="cuda").to(dtype)
        bias = torch.randn(shape[-1], device="cuda").to(dtype)
        out = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
        rt.epilogue(x, [op], out, residual=res, bias=bias, stream=stream_int())
        ref = fn(x.double(), res.double(), bias.double())
        # Storage rounding: compare against the reference rounded to the storage type too.
        check_close(out, ref.to(dtype).double() if dtype != torch.float32 else ref, tol, f"{_name(op)} {shape}")


@pytest.mark.parametrize("policy", list(POLICIES))
def test_gemm_with_fused_chain(policy):
    """GEMM + bias (absorbed by cuBLASLt) + a chain the template applies: scale, leaky_relu, mish."""
    dt, tol = POLICIES[policy]
    m, n, k = 77, 136, 64
    a = (torch.randn(m, k, device="cuda") / k**0.5).to(dt)
    w = torch.randn(n, k, device="cuda").to(dt)
    bias = torch.randn(n, device="cuda").to(dt)
    res = torch.randn(m, n, device="cuda").to(dt)
    ops = ["bias_add", ("scale", 1.5), ("leaky_relu", 0.1), "mish", ("residual_add", 1.0)]
    out = torch.from_dlpack(rt.gemm(a, w, policy=policy, trans_b=True, bias=bias, ops=ops, residual=res,
                                    stream=stream_int()))
    y = a.double() @ w.double().t() + bias.double()
    if dt != torch.float32:
        y = y.to(dt).double()  # the GEMM's output is rounded to storage before the chain
    ref = F.mish(F.leaky_relu(y * 1.5, 0.1)) + res.double()
    check_close(out, ref, tol, f"{policy} chain")


def test_vectorised_and_scalar_paths_agree():
    x = torch.randn(1000, 1024, device="cuda")
    full = torch.from_dlpack(rt.epilogue(x, ["gelu"], stream=stream_int()))
    odd = torch.randn(1000, 1023, device="cuda")  # cols not a multiple of 4: scalar path
    odd_out = torch.from_dlpack(rt.epilogue(odd, ["gelu"], stream=stream_int()))
    check_close(full, F.gelu(x.double()), 1e-4, "vector path")
    check_close(odd_out, F.gelu(odd.double()), 1e-4, "scalar path")


# ----------------------------------------------------------------------- the program ABI


def _build_example(tmp: Path) -> Path:
    from stitchcuda import toolchain

    so = tmp / "example_mlp.so"
    res = toolchain.compile_program(stitchcuda.PACKAGE_DIR / "examples" / "example_mlp.cu", so)
    assert res.ok, res.output
    return so


def test_example_program_through_c_abi(tmp_path):
    so = _build_example(tmp_path)
    lib = rt.ProgramLibrary(str(so))
    man = json.loads(lib.manifest)
    assert lib.abi_version == rt.PROGRAM_ABI_VERSION and man["precision"] == "fp32"
    w1, b1 = torch.randn(512, 256) / 16, torch.randn(512)
    w2, b2 = torch.randn(128, 512) / 22, torch.randn(128)
    inst = lib.create([w1, b1, w2.cuda(), b2.cuda()])  # host and device weights both accepted
    for trial in range(3):
        x = torch.randn(64, 256, device="cuda")
        x_before = x.clone()
        y = torch.full((64, 128), float("nan"), device="cuda")
        inst.run([x], [y], stream=stream_int())
        torch.cuda.synchronize()
        ref = F.relu(x.double() @ w1.double().cuda().t() + b1.double().cuda()) @ w2.double().cuda().t() + b2.double().cuda()
        check_close(y, ref, 1e-4, f"example program trial {trial}")
        assert torch.equal(x, x_before), "program changed its input"
    # A bound run: tensors resolved once, launched with no DLPack exchange.
    x = torch.randn(64, 256, device="cuda")
    y = torch.full((64, 128), float("nan"), device="cuda")
    bound = inst.bind([x], [y], stream=stream_int())
    for _ in range(2):
        x.normal_()
        bound(stream_int())
        torch.cuda.synchronize()
        ref = F.relu(x.double() @ w1.double().cuda().t() + b1.double().cuda()) @ w2.double().cuda().t() + b2.double().cuda()
        check_close(y, ref, 1e-4, "bound run")
    with pytest.raises(stitchcuda.ArgumentError, match="input x: expected float32\\[64, 256\\]"):
        inst.run([torch.randn(32, 256, device="cuda")], [torch.empty(64, 128, device="cuda")])
    with pytest.raises(stitchcuda.ArgumentError, match="expected a CUDA tensor"):
        inst.run([torch.randn(64, 256)], [torch.empty(64, 128, device="cuda")])
    with pytest.raises(stitchcuda.ArgumentError, match="w1"):
        lib.create([torch.randn(3, 3), b1, w2, b2])
    inst.close()


# ----------------------------------------------------------------------- bad input


def test_bad_input_errors_name_the_argument():
    s = stream_int()
    a = torch.randn(8, 16, device="cuda")
    with pytest.raises(stitchcuda.ArgumentError, match="inner dimensions differ"):
        rt.gemm(a, torch.randn(15, 4, device="cuda"), stream=s)
    with pytest.raises(stitchcuda.ArgumentError, match="b: expected dtype float32 \\(policy fp32\\), got float64"):
        rt.gemm(a, torch.randn(16, 4, device="cuda", dtype=torch.float64), stream=s)
    with pytest.raises(stitchcuda.ArgumentError, match="a: expected dtype bfloat16 \\(policy bf16\\)"):
        rt.gemm(a, a.t(), policy="bf16", stream=s)
    with pytest.raises(stitchcuda.ArgumentError, match="layout not handled"):
        rt.gemm(torch.randn(8, 16, 2, device="cuda")[:, :, 0], torch.randn(16, 4, device="cuda"), stream=s)
    with pytest.raises(stitchcuda.ArgumentError, match="a: expected a CUDA tensor on cuda:0, got a tensor on cpu"):
        rt.gemm(torch.randn(8, 16), torch.randn(16, 4, device="cuda"), stream=s)
    # An fp16 view 2 bytes into its storage: element-aligned, not 16-byte aligned; it must work.
    raw = torch.randn(8 * 16 + 1, device="cuda", dtype=torch.float16)
    out = rt.gemm(raw[1:].view(8, 16), torch.randn(16, 4, device="cuda", dtype=torch.float16), policy="fp16", stream=s)
    assert tuple(out.shape) == (8, 4)
    # A float32 pointer one byte off: refused, naming the argument.
    base = torch.randn(8 * 16 + 4, device="cuda")
    with pytest.raises(stitchcuda.ArgumentError, match="a is not aligned to its element size"):
        rt.gemm(fake_dlpack(base.data_ptr() + 1, (8, 16), "float32", device=("cuda", 0)),
                torch.randn(16, 4, device="cuda"), stream=s)
    with pytest.raises(stitchcuda.ArgumentError, match="out: expected shape \\(8, 4\\)"):
        rt.gemm(a, torch.randn(16, 4, device="cuda"), torch.empty(8, 5, device="cuda"), stream=s)
    with pytest.raises(stitchcuda.ArgumentError, match="bias: expected shape \\(4,\\)"):
        rt.gemm(a, torch.randn(16, 4, device="cuda"), epilogue="bias", bias=torch.randn(5, device="cuda"), stream=s)
    with pytest.raises(stitchcuda.ArgumentError, match="needs a bias"):
        rt.gemm(a, torch.randn(16, 4, device="cuda"), epilogue="bias_gelu", stream=s)
    with pytest.raises(stitchcuda.ArgumentError, match="beta != 0 needs c"):
        rt.gemm(a, torch.randn(16, 4, device="cuda"), beta=1.0, stream=s)
    with pytest.raises(stitchcuda.ArgumentError, match="batch sizes differ"):
        rt.gemm(torch.randn(2, 8, 16, device="cuda"), torch.randn(3, 16, 4, device="cuda"), stream=s)
    with pytest.raises(stitchcuda.ArgumentError, match="expected a 2-D"):
        rt.gemm(torch.randn(16, device="cuda"), torch.randn(16, 4, device="cuda"), stream=s)
    with pytest.raises(stitchcuda.ArgumentError, match="x: must be contiguous"):
        rt.epilogue(torch.randn(8, 16, device="cuda").t(), ["relu"], stream=s)
    with pytest.raises(stitchcuda.ArgumentError, match="residual_add op needs a residual"):
        rt.epilogue(torch.randn(8, 16, device="cuda"), [("residual_add", 1.0)], stream=s)
    if torch.cuda.device_count() > 1:
        with pytest.raises(stitchcuda.ArgumentError, match="cuda:1"):
            rt.gemm(torch.randn(8, 16, device="cuda:1"), torch.randn(16, 4, device="cuda"), stream=s)


def test_bound_gemm_matches_and_relaunches():
    a = torch.randn(70, 50, device="cuda")
    w = torch.randn(30, 50, device="cuda")
    bias = torch.randn(30, device="cuda")
    out = torch.empty(70, 30, device="cuda")
    call = rt.bind_gemm(a, w, out, trans_b=True, epilogue="bias_relu", bias=bias, ops=[("scale", 2.0)],
                        stream=stream_int())
    for _ in range(2):
        a.normal_()  # new values in the same buffer: the bound call must see them
        out.fill_(float("nan"))
        assert call(stream_int()) is out
        check_close(out, 2.0 * F.relu(a.double() @ w.double().t() + bias.double()), 1e-4, "bound gemm")


@pytest.mark.parametrize("strategy", ["fused", "split"])
def test_gelu_epilogue_both_strategies(strategy):
    """cuBLASLt's own GELU epilogue and the split one (GEMM, then the epilogue kernel) agree."""
    import os
    import sys

    code = r"""
import torch, torch.nn.functional as F
from stitchcuda import rt
for dt, pol, tol in [(torch.float32, 'fp32', 1e-4), (torch.bfloat16, 'bf16', 1e-2)]:
    for (b, m, n, k) in [(1, 33, 65, 17), (3, 64, 96, 40)]:
        a = (torch.randn(b, m, k, device='cuda') / k ** 0.5).to(dt)
        w = torch.randn(b, k, n, device='cuda').to(dt)
        bias = torch.randn(n, device='cuda').to(dt)
        for epi in ['gelu', 'bias_gelu']:
            out = torch.from_dlpack(rt.gemm(a, w, policy=pol, epilogue=epi, bias=bias if 'bias' in epi else None))
            y = a.double() @ w.double() + (bias.double() if 'bias' in epi else 0)
            if dt != torch.float32:
                y = y.to(dt).double()
            ref = F.gelu(y, approximate='tanh')
            err = ((out.double() - ref).abs() - tol - tol * ref.abs()).max().item()
            assert err <= 0, (pol, epi, b, m, n, k, err)
print('OK')
"""
    env = dict(os.environ, STITCHCUDA_GEMM_GELU=strategy)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]


# ----------------------------------------------------------------------- the CUDA-graph runner

GRAPH_PROGRAM = r"""
// A tiny program around st_graph_run: y = 2 x + 1, and a device counter of the launches that ran.
#include <cuda_runtime.h>
#include "stitchrt/program.h"

namespace {
__global__ void affine(const float* x, float* y, int64_t n, int* launches) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i == 0) atomicAdd(launches, 1);
  if (i < n) y[i] = 2.f * x[i] + 1.f;
}
struct Run { const float* x; float* y; int64_t n; int* launches; int sync_inside; };
st_status body(void* ctx, void* stream) {
  const Run* r = static_cast<const Run*>(ctx);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  affine<<<unsigned((r->n + 255) / 256), 256, 0, s>>>(r->x, r->y, r->n, r->launches);
  if (cudaGetLastError() != cudaSuccess) { st_set_error(ST_ERR_CUDA, "affine: launch failed"); return ST_ERR_CUDA; }
  // Synchronising a stream is illegal while it is captured: this body makes every capture fail.
  if (r->sync_inside && cudaStreamSynchronize(s) != cudaSuccess) {
    cudaGetLastError();
    st_set_error(ST_ERR_CUDA, "affine: synchronize failed");
    return ST_ERR_CUDA;
  }
  return ST_OK;
}
}  // namespace

extern "C" {
st_status graph_test_create(int32_t slots, st_graph_cache** out) { return st_graph_cache_create(slots, out); }
void graph_test_destroy(st_graph_cache* g) { st_graph_cache_destroy(g); }
st_status graph_test_stats(st_graph_cache* g, int64_t* e, int64_t* c, int64_t* r) { return st_graph_cache_stats(g, e, c, r); }
st_status graph_test_run(st_graph_cache* g, const float* x, float* y, int64_t n, int* launches, int sync_inside,
                         void* stream) {
  Run r{x, y, n, launches, sync_inside};
  const void* key[2] = {x, y};
  return st_graph_run(g, stream, key, 2, body, &r);
}
}
"""


@pytest.fixture(scope="module")
def graph_lib():
    import ctypes

    from stitchcuda import build

    res = build.build(GRAPH_PROGRAM, export_all=True, name="graph_runner_test")
    assert res.ok, res.message + "\n" + (res.compile.output if res.compile else "")
    lib = ctypes.CDLL(res.library)
    vp, i64p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)
    lib.graph_test_create.argtypes = [ctypes.c_int32, ctypes.POINTER(vp)]
    lib.graph_test_destroy.argtypes = [vp]
    lib.graph_test_destroy.restype = None
    lib.graph_test_stats.argtypes = [vp, i64p, i64p, i64p]
    lib.graph_test_run.argtypes = [vp, vp, vp, ctypes.c_int64, vp, ctypes.c_int, vp]
    lib.st_last_error.restype = ctypes.c_char_p
    return lib


class _Cache:
    """One st_graph_cache of the test program, with its counters."""

    def __init__(self, lib, slots: int):
        import ctypes

        self.lib, self.ptr = lib, ctypes.c_void_p()
        assert lib.graph_test_create(slots, ctypes.byref(self.ptr)) == 0

    def run(self, x, y, launches, stream: int, sync_inside: bool = False) -> None:
        st = self.lib.graph_test_run(self.ptr, x.data_ptr(), y.data_ptr(), x.numel(), launches.data_ptr(),
                                     int(sync_inside), stream)
        assert st == 0, self.lib.st_last_error().decode()

    def stats(self) -> tuple[int, int, int]:
        import ctypes

        e, c, r = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
        assert self.lib.graph_test_stats(self.ptr, ctypes.byref(e), ctypes.byref(c), ctypes.byref(r)) == 0
        return e.value, c.value, r.value

    def close(self) -> None:
        self.lib.graph_test_destroy(self.ptr)


def _fresh(x, s) -> None:
    with torch.cuda.stream(s):
        x.copy_(torch.randn_like(x))


def _check_affine(x, y, s, what: str) -> None:
    s.synchronize()
    assert torch.equal(y, x * 2 + 1), f"{what}: y != 2x + 1 (max err {(y - (x * 2 + 1)).abs().max().item()})"


def test_graph_runner_eager_capture_replay_and_new_addresses(graph_lib):
    torch.manual_seed(11)
    s = torch.cuda.Stream()
    g = _Cache(graph_lib, 4)
    x, y = torch.empty(3000, device="cuda"), torch.empty(3000, device="cuda")
    launches = torch.zeros(1, dtype=torch.int32, device="cuda")
    expected = [(1, 0, 0), (1, 1, 0), (1, 1, 1), (1, 1, 2)]
    for i, want in enumerate(expected):
        _fresh(x, s)  # the graph reads the inputs' current values: a graph holds work, not results
        g.run(x, y, launches, s.cuda_stream)
        _check_affine(x, y, s, f"run {i}")
        assert g.stats() == want, f"run {i}: (eager, captures, replays) = {g.stats()}, expected {want}"
    assert launches.item() == 4, "every run ran the kernel exactly once"
    y2 = torch.empty_like(y)  # other addresses: another entry, eager first
    for want in [(2, 1, 2), (2, 2, 2), (2, 2, 3)]:
        _fresh(x, s)
        g.run(x, y2, launches, s.cuda_stream)
        _check_affine(x, y2, s, "new output address")
        assert g.stats() == want
    _fresh(x, s)
    g.run(x, y, launches, s.cuda_stream)  # the first entry is still there: a replay
    _check_affine(x, y, s, "first entry again")
    assert g.stats() == (2, 2, 4)
    s2 = torch.cuda.Stream()  # the same addresses on another stream: another entry
    _fresh(x, s)
    s.synchronize()
    g.run(x, y, launches, s2.cuda_stream)
    _check_affine(x, y, s2, "other stream")
    assert g.stats() == (3, 2, 4)
    assert launches.item() == 4 + 3 + 1 + 1
    g.close()


def test_graph_runner_lru_slots(graph_lib):
    s = torch.cuda.Stream()
    g = _Cache(graph_lib, 2)
    x = torch.randn(512, device="cuda")
    ys = [torch.empty_like(x) for _ in range(3)]
    launches = torch.zeros(1, dtype=torch.int32, device="cuda")
    for y in [ys[0], ys[1], ys[2], ys[0]]:  # the third evicts the first, so the first is new again
        g.run(x, y, launches, s.cuda_stream)
    assert g.stats() == (4, 0, 0)
    g.run(x, ys[0], launches, s.cuda_stream)  # second sighting since it came back: captured
    assert g.stats() == (4, 1, 0)
    for y in ys:
        _check_affine(x, y, s, "lru")
    g.close()


def test_graph_runner_legacy_default_stream_goes_by_a_stream_of_its_own(graph_lib):
    # the legacy stream's runs are captured and replayed on the runtime's stream, in the legacy
    # stream's order: each run sees the x written just before it on the legacy stream (a large
    # write, still running when the run is enqueued), and the y a later legacy-stream read gets
    # is that run's, with no synchronisation of the host between them
    g = _Cache(graph_lib, 4)
    n = 1 << 24
    x, y = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
    launches = torch.zeros(1, dtype=torch.int32, device="cuda")
    seen = []
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.default_stream()):
        assert torch.cuda.current_stream().cuda_stream == 0
        for k in range(4):
            x.fill_(float(k)).mul_(1.0)
            g.run(x, y, launches, 0)
            seen.append((y == 2 * k + 1).all())
    torch.cuda.synchronize()
    assert [bool(v.item()) for v in seen] == [True] * 4
    assert g.stats() == (1, 1, 2) and launches.item() == 4
    g.close()


def test_graph_runner_inside_a_callers_capture_runs_eagerly_into_it(graph_lib):
    """A stream the caller is capturing takes our kernels into the caller's graph."""
    g = _Cache(graph_lib, 4)
    x, y = torch.randn(700, device="cuda"), torch.empty(700, device="cuda")
    launches = torch.zeros(1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    outer = torch.cuda.CUDAGraph()
    cs = torch.cuda.Stream()
    for _ in range(2):  # the same key twice: still eager, the runner never nests a capture
        with torch.cuda.graph(outer if _ == 0 else torch.cuda.CUDAGraph(), stream=cs):
            g.run(x, y, launches, torch.cuda.current_stream().cuda_stream)
    assert g.stats() == (2, 0, 0)
    torch.cuda.synchronize()
    assert launches.item() == 0, "nothing ran during the caller's capture"
    for trial in range(3):
        x.copy_(torch.randn_like(x))
        outer.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, x * 2 + 1), f"replay {trial}"
    assert launches.item() == 3
    g.close()


def test_graph_runner_failed_capture_runs_for_real_and_turns_graphs_off(graph_lib):
    s = torch.cuda.Stream()
    g = _Cache(graph_lib, 4)
    x, y = torch.empty(2048, device="cuda"), torch.empty(2048, device="cuda")
    launches = torch.zeros(1, dtype=torch.int32, device="cuda")
    _fresh(x, s)
    g.run(x, y, launches, s.cuda_stream, sync_inside=True)  # first sighting: eager
    _check_affine(x, y, s, "eager")
    _fresh(x, s)
    g.run(x, y, launches, s.cuda_stream, sync_inside=True)  # capture fails, then runs eagerly
    _check_affine(x, y, s, "after the failed capture")
    assert g.stats() == (2, 0, 0)
    assert launches.item() == 2, "the failed capture ran nothing; the eager rerun ran once"
    y2 = torch.empty_like(y)
    for i in range(3):  # graphs are off for this cache, even for a body that could be captured
        _fresh(x, s)
        g.run(x, y2, launches, s.cuda_stream)
        _check_affine(x, y2, s, f"graphs off, run {i}")
    assert g.stats() == (5, 0, 0) and launches.item() == 5
    g.close()


def test_graph_runner_threads_share_one_cache(graph_lib):
    import threading

    g = _Cache(graph_lib, 8)
    n_threads, runs = 4, 10
    streams = [torch.cuda.Stream() for _ in range(n_threads)]
    xs = [torch.randn(4096, device="cuda") for _ in range(n_threads)]
    ys = [torch.empty(4096, device="cuda") for _ in range(n_threads)]
    launches = torch.zeros(1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    errors = []

    def work(i):
        try:
            for _ in range(runs):
                g.run(xs[i], ys[i], launches, streams[i].cuda_stream)
            streams[i].synchronize()
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    torch.cuda.synchronize()
    for i in range(n_threads):
        assert torch.equal(ys[i], xs[i] * 2 + 1), f"thread {i}"
    assert g.stats() == (n_threads, n_threads, n_threads * (runs - 2))
    assert launches.item() == n_threads * runs
    g.close()
