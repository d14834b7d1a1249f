"""The CUDA templates on the device, against PyTorch in float64 on fresh random inputs.

Each template is built into a harness .so (tests/gpu/harness/*.cu: extern "C" launchers over raw
pointers) by nvcc, cached by source hash, loaded with ctypes and run on torch CUDA tensors on
torch's current stream. Outputs are poisoned with NaN before each run, so an element left
unwritten fails (NaN never passes); inputs must be unchanged after it. Tolerance (atol and rtol):
1e-4 for fp32 storage, 1e-2 for fp16 / bf16 storage.
"""

from __future__ import annotations

import ctypes
import math
import os

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no CUDA device"),
]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DT_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
DT_IDS = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
NAN = float("nan")


def _tol(dtype) -> float:
    return 1e-4 if dtype == torch.float32 else 1e-2


def _seed() -> int:
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    return seed


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def _i64(vals) -> ctypes.Array:
    vals = list(vals)
    return (ctypes.c_int64 * max(len(vals), 1))(*vals)


def _run(fn, *args) -> None:
    rc = fn(*args)
    torch.cuda.synchronize()  # an asynchronous fault surfaces here as an exception
    assert rc == 0, f"launch returned cudaError_t {rc}"


def _close(out: torch.Tensor, ref: torch.Tensor, tol: float, msg: str = "") -> None:
    out = out.double()
    assert not torch.isnan(out).any() or torch.isnan(ref).any(), f"NaN in output {msg}"
    torch.testing.assert_close(out, ref.double(), atol=tol, rtol=tol, equal_nan=False, msg=lambda m: f"{msg}\n{m}")


def _randn(*shape, dtype, scale=1.0) -> torch.Tensor:
    """Standard normal * scale, drawn in fp32 and rounded to dtype; _randn() is a 0-d tensor."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    return (torch.randn(tuple(shape), device="cuda", dtype=torch.float32) * scale).to(dtype)


# ---- row reductions ---------------------------------------------------------------------------

ROW_OPS = ["softmax", "log_softmax", "layer_norm", "rms_norm", "sum", "mean", "max", "min",
           "logsumexp", "var"]
OP_CODE = {name: i for i, name in enumerate(ROW_OPS)}
WRITES_ROW = {"softmax", "log_softmax", "layer_norm", "rms_norm"}
EPS = 1e-5

# Every work split: groups of 1..32 lanes, a warp with 2..8 cached chunks, a block with the row in
# registers, a block looping over global memory; and grids of more than 65535 rows.
ROW_SHAPES = [(3, 1), (5, 7), (64, 32), (33, 33), (16, 100), (8, 256), (7, 1000), (4, 1024),
              (3, 2048), (5, 4097), (2, 20000), (1, 1 << 20), (70000, 7), (65537, 64)]


def _row_ref(op, x, w=None, b=None, unbiased=True):
    """op over the last dim of x (float64)."""
    if op == "softmax":
        return torch.softmax(x, -1)
    if op == "log_softmax":
        return torch.log_softmax(x, -1)
    if op == "layer_norm":
        return F.layer_norm(x, (x.shape[-1],), w, b, EPS)
    if op == "rms_norm":
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
        return y * w if w is not None else y
    if op == "sum":
        return x.sum(-1)
    if op == "mean":
        return x.mean(-1)
    if op == "max":
        return x.amax(-1)
    if op == "min":
        return x.amin(-1)
    if op == "logsumexp":
        return torch.logsumexp(x, -1)
    if op == "var":
        return x.var(-1, correction=1 if unbiased else 0)
    raise ValueError(op)


def _row_case(lib, op, dtype, rows, cols, *, hooks=False, ldi=None, ldo=None, offset=0,
              weights=True):
    seed = _seed()
    ldi = cols if ldi is None else ldi
    base = _randn(rows * ldi + offset, dtype=dtype, scale=2.0)
    x = base[offset:].as_strided((rows, cols), (ldi, 1))
    x_before = x.clone()
    w = b = None
    if op in ("layer_norm", "rms_norm") and weights:
        w = _randn(cols, dtype=dtype)
        b = _randn(cols, dtype=dtype) if op == "layer_norm" else None
    if op in WRITES_ROW:
        ldo = cols if ldo is None else ldo
        out_base = torch.full((rows, ldo), NAN, device="cuda", dtype=dtype)
        out = out_base[:, :cols]
    else:
        ldo = 1 if ldo is None else ldo
        out_base = torch.full((rows, ldo), NAN, device="cuda", dtype=dtype)
        out = out_base[:, 0]
    unbiased = cols > 1
    _run(lib.row_reduce, OP_CODE[op], DT_CODE[dtype], x.data_ptr(), ldi, out.data_ptr(), ldo,
         None if w is None else w.data_ptr(), None if b is None else b.data_ptr(), rows, cols,
         EPS, int(unbiased), int(hooks), _stream())
    assert torch.equal(x, x_before), "input changed"
    xd = x.double() * (0.5 if hooks else 1.0)
    ref = _row_ref(op, xd, None if w is None else w.double(), None if b is None else b.double(),
                   unbiased)
    if hooks:
        ref = F.gelu(ref)
    _close(out, ref, _tol(dtype), f"{op} {DT_IDS[dtype]} {rows}x{cols} seed={seed}")
    # Nothing outside the output view was written.
    rest = out_base[:, cols:] if op in WRITES_ROW else out_base[:, 1:]
    assert torch.isnan(rest).all(), "wrote outside the output view"


@pytest.mark.parametrize("rows,cols", ROW_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("op", ROW_OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_row_reduce(reduce_lib, op, dtype, rows, cols):
    _row_case(reduce_lib, op, dtype, rows, cols)


@pytest.mark.parametrize("cols", [7, 1000, 4097])
@pytest.mark.parametrize("op", ROW_OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_row_reduce_strided(reduce_lib, op, dtype, cols):
    """Leading dims past cols and a misaligned start: the scalar path, writes only in the view."""
    _row_case(reduce_lib, op, dtype, 37, cols, ldi=cols + 3, ldo=cols + 5, offset=1)


@pytest.mark.parametrize("cols", [64, 1024, 20000])
@pytest.mark.parametrize("op", ["softmax", "layer_norm", "sum", "max"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_row_reduce_hooks(reduce_lib, op, dtype, cols):
    """Prologue x * 0.5 and epilogue erf-GELU fused into the reduction."""
    _row_case(reduce_lib, op, dtype, 19, cols, hooks=True)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_norm_without_weights(reduce_lib, op, dtype):
    _row_case(reduce_lib, op, dtype, 9, 768, weights=False)


@pytest.mark.parametrize("cols", [1, 5, 1000, 50000])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_var_biased(reduce_lib, dtype, cols):
    seed = _seed()
    x = _randn(6, cols, dtype=dtype)
    out = torch.full((6,), NAN, device="cuda", dtype=dtype)
    _run(reduce_lib.row_reduce, OP_CODE["var"], DT_CODE[dtype], x.data_ptr(), cols,
         out.data_ptr(), 1, None, None, 6, cols, 0.0, 0, 0, _stream())
    _close(out, x.double().var(-1, correction=0), _tol(dtype), f"seed={seed}")


@pytest.mark.parametrize("cols", [33, 1024, 4097])
@pytest.mark.parametrize("op", ["softmax", "layer_norm", "mean"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=DT_IDS.get)
def test_row_reduce_mixed(reduce_lib, op, dtype, cols):
    """16-bit input, fp32 output and weights: no 16-bit rounding inside, so fp32 tolerance."""
    seed = _seed()
    rows = 23
    x = _randn(rows, cols, dtype=dtype, scale=2.0)
    w = _randn(cols, dtype=torch.float32)
    b = _randn(cols, dtype=torch.float32)
    out = torch.full((rows, cols) if op != "mean" else (rows,), NAN, device="cuda")
    ldo = cols if op != "mean" else 1
    _run(reduce_lib.row_reduce_mixed, OP_CODE[op], DT_CODE[dtype], x.data_ptr(), cols,
         out.data_ptr(), ldo, w.data_ptr(), b.data_ptr(), rows, cols, EPS, _stream())
    ref = _row_ref(op, x.double(), w.double(), b.double())
    _close(out, ref, 1e-4, f"{op} seed={seed}")


# ---- middle-axis reductions -------------------------------------------------------------------

AXIS_OPS = ["sum", "mean", "max", "min"]
AXIS_SHAPES = [(2, 3, 5), (4, 100, 33), (1, 100000, 1), (3, 7, 1), (64, 1, 64), (5, 1000, 70),
               (70000, 3, 2), (1, 4096, 4096), (2, 30000, 64)]


@pytest.mark.parametrize("workspace", [False, True], ids=["one_pass", "workspace"])
@pytest.mark.parametrize("transposed", [False, True], ids=["contig", "transposed"])
@pytest.mark.parametrize("shape", AXIS_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("op", AXIS_OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_reduce_axis(reduce_lib, op, dtype, shape, transposed, workspace):
    """With a workspace, shapes of few output tiles split the reduced axis over blocks."""
    seed = _seed()
    outer, red, inner = shape
    if transposed:  # reduced axis contiguous; output written transposed too
        x = _randn(outer, inner, red, dtype=dtype).permute(0, 2, 1)
        out = torch.full((inner, outer), NAN, device="cuda", dtype=dtype).t()
    else:
        x = _randn(outer, red, inner, dtype=dtype)
        out = torch.full((outer, inner), NAN, device="cuda", dtype=dtype)
    x_before = x.clone()
    so, sr, si = x.stride()
    oso, osi = out.stride()
    ws, ws_floats = None, 0
    if workspace:
        ws_floats = reduce_lib.reduce_axis_ws_floats(DT_CODE[dtype], x.data_ptr(), outer, red,
                                                     inner, so, sr, si)
        assert ws_floats >= 0
        ws = torch.full((max(ws_floats, 1),), NAN, device="cuda")
    _run(reduce_lib.reduce_axis, AXIS_OPS.index(op), DT_CODE[dtype], x.data_ptr(), outer, red,
         inner, so, sr, si, out.data_ptr(), oso, osi, None if ws is None else ws.data_ptr(),
         ws_floats, _stream())
    assert torch.equal(x, x_before)
    xd = x.double()
    ref = {"sum": lambda: xd.sum(1), "mean": lambda: xd.mean(1), "max": lambda: xd.amax(1),
           "min": lambda: xd.amin(1)}[op]()
    _close(out, ref, _tol(dtype), f"{op} {shape} seed={seed}")


# ---- elementwise ------------------------------------------------------------------------------

def _bcast_strides(t: torch.Tensor, shape) -> list[int]:
    return list(t.expand(shape).stride()) if len(shape) else []


EW_CASES = {
    # name: (out shape, a shape, b shape)
    "same_1001": ((1001,), (1001,), (1001,)),
    "scalar_b": ((37, 65), (37, 65), ()),
    "bcast_4d": ((2, 3, 4, 5), (2, 1, 4, 5), (5,)),
    "bcast_6d": ((2, 3, 1, 4, 5, 6), (3, 1, 1, 5, 1), (2, 1, 1, 4, 1, 6)),
    "rows_70000": ((70000, 3), (70000, 1), (1, 3)),
    "same_big": ((4096, 1031), (4096, 1031), (4096, 1031)),
}

EW_DTYPES = {  # code: (a dtype, b dtype, out dtype)
    0: (torch.float32, torch.float32, torch.float32),
    1: (torch.float16, torch.float16, torch.float16),
    2: (torch.bfloat16, torch.bfloat16, torch.bfloat16),
    3: (torch.float16, torch.float32, torch.float32),
}


@pytest.mark.parametrize("layout", ["contig", "out_transposed", "misaligned"])
@pytest.mark.parametrize("case", list(EW_CASES))
@pytest.mark.parametrize("code", list(EW_DTYPES), ids=["f32", "f16", "bf16", "f16+f32"])
def test_ew_add_broadcast(ew_lib, code, case, layout):
    seed = _seed()
    shape, sa, sb = EW_CASES[case]
    ta, tb, to = EW_DTYPES[code]
    if layout == "misaligned":  # inputs start one element past a 16-byte boundary
        a = _randn(math.prod(sa) + 1, dtype=ta)[1:].view(sa)
        b = _randn(math.prod(sb) + 1, dtype=tb)[1:].view(sb)
    else:
        a, b = _randn(*sa, dtype=ta), _randn(*sb, dtype=tb)
    if layout == "out_transposed" and len(shape) >= 2:
        out = torch.full(shape[::-1], NAN, device="cuda", dtype=to).permute(*reversed(range(len(shape))))
    else:
        out = torch.full(shape, NAN, device="cuda", dtype=to)
    a0, b0 = a.clone(), b.clone()
    nd = len(shape)
    _run(ew_lib.ew_add, code, a.data_ptr(), b.data_ptr(), out.data_ptr(), nd, _i64(shape),
         _i64(out.stride()), _i64(_bcast_strides(a, shape)), _i64(_bcast_strides(b, shape)),
         _stream())
    assert torch.equal(a, a0) and torch.equal(b, b0)
    _close(out, (a.double() + b.double()).expand(shape), _tol(to), f"{case} seed={seed}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_ew_fma4(ew_lib, dtype):
    seed = _seed()
    shape = (3, 4, 129)
    a, b = _randn(3, 4, 129, dtype=dtype), _randn(4, 1, dtype=dtype)
    c, d = _randn(129, dtype=dtype), _randn(dtype=dtype)
    out = torch.full(shape, NAN, device="cuda", dtype=dtype)
    _run(ew_lib.ew_fma4, DT_CODE[dtype], a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr(),
         out.data_ptr(), 3, _i64(shape), _i64(out.stride()),
         *[_i64(_bcast_strides(t, shape)) for t in (a, b, c, d)], _stream())
    ref = (a.double() * b.double() + c.double() - d.double()).expand(shape)
    _close(out, ref, _tol(dtype), f"seed={seed}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_ew_where(ew_lib, dtype):
    seed = _seed()
    shape = (3, 4, 65)
    cond = torch.rand(3, 1, 65, device="cuda") > 0.5
    x, y = _randn(*shape, dtype=dtype), _randn(4, 65, dtype=dtype)
    out = torch.full(shape, NAN, device="cuda", dtype=dtype)
    _run(ew_lib.ew_where, DT_CODE[dtype], cond.data_ptr(), x.data_ptr(), y.data_ptr(),
         out.data_ptr(), 3, _i64(shape), _i64(out.stride()),
         *[_i64(_bcast_strides(t, shape)) for t in (cond, x, y)], _stream())
    ref = torch.where(cond, x.double(), y.double()).expand(shape)
    _close(out, ref, 0.0, f"seed={seed}")


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_ew_unary_hook(ew_lib, dtype, transposed):
    seed = _seed()
    x = _randn(300, 77, dtype=dtype, scale=3.0)
    if transposed:
        x = x.t()
    out = torch.full(x.shape, NAN, device="cuda", dtype=dtype)
    _run(ew_lib.ew_gelu, DT_CODE[dtype], x.data_ptr(), out.data_ptr(), 2, _i64(x.shape),
         _i64(out.stride()), _i64(x.stride()), _stream())
    _close(out, F.gelu(x.double()), _tol(dtype), f"seed={seed}")


def test_ew_int64_offsets(ew_lib):
    """An input offset past 2^31 elements takes the 64-bit index path (4 GiB of fp16)."""
    free, _ = torch.cuda.mem_get_info()
    if free < 6 * 2**30:
        pytest.skip("needs 6 GiB free on the device")
    seed = _seed()
    big = torch.empty(2**31 + 64, device="cuda", dtype=torch.float16)
    big[:64] = _randn(64, dtype=torch.float16)
    big[2**31:] = _randn(64, dtype=torch.float16)
    a = big.as_strided((2, 64), (2**31, 1))
    b = _randn(2, 64, dtype=torch.float16)
    out = torch.full((2, 64), NAN, device="cuda", dtype=torch.float16)
    _run(ew_lib.ew_add, 1, a.data_ptr(), b.data_ptr(), out.data_ptr(), 2, _i64((2, 64)),
         _i64(out.stride()), _i64(a.stride()), _i64(b.stride()), _stream())
    _close(out, a.double() + b.double(), 1e-2, f"seed={seed}")
    del big


# ---- strided copy / permute -------------------------------------------------------------------

PERMUTES = [
    ((4, 33, 65), (0, 2, 1)),            # tiled transpose with a batch dim
    ((1000, 1001), (1, 0)),
    ((2, 3, 4, 5), (3, 1, 0, 2)),
    ((7, 3, 9, 11), (0, 2, 3, 1)),       # NCHW -> NHWC with C = 3: strided path
    ((1, 1, 40, 1, 50), (4, 3, 2, 1, 0)),
    ((2, 3, 4, 5, 6, 7), (5, 4, 3, 2, 1, 0)),
    ((70000, 9), (1, 0)),
    ((3, 100000), (1, 0)),
]


@pytest.mark.parametrize("sliced", [False, True], ids=["contig", "sliced"])
@pytest.mark.parametrize("shape,perm", PERMUTES, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_permute(ew_lib, dtype, shape, perm, sliced):
    _seed()
    if sliced:  # a view with a stride-2 last dim
        x = _randn(*shape[:-1], shape[-1] * 2, dtype=dtype)[..., ::2]
    else:
        x = _randn(*shape, dtype=dtype)
    ref = x.permute(*perm).contiguous()
    out = torch.full(ref.shape, NAN, device="cuda", dtype=dtype)
    perm_arr = (ctypes.c_int * len(perm))(*perm)
    _run(ew_lib.permute, DT_CODE[dtype], x.data_ptr(), len(shape), _i64(x.shape),
         _i64(x.stride()), perm_arr, out.data_ptr(), _stream())
    assert torch.equal(out, ref)


COPY_TYPES = [(torch.float32, torch.float32), (torch.float16, torch.float16),
              (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float16),
              (torch.float16, torch.float32), (torch.bfloat16, torch.float32)]


@pytest.mark.parametrize("din,dout", COPY_TYPES, ids=lambda v: DT_IDS[v])
@pytest.mark.parametrize("case", ["transpose_in", "transpose_out", "both_strided", "contig"])
def test_strided_copy(ew_lib, din, dout, case):
    _seed()
    shape = (3, 130, 67)
    if case in ("transpose_in", "both_strided"):
        x = _randn(3, 67, 130, dtype=din).transpose(1, 2)
    else:
        x = _randn(*shape, dtype=din)
    if case == "transpose_out":
        out = torch.full((3, 67, 130), NAN, device="cuda", dtype=dout).transpose(1, 2)
    elif case == "both_strided":
        out = torch.full((3, 130, 134), NAN, device="cuda", dtype=dout)[..., ::2]
    else:
        out = torch.full(shape, NAN, device="cuda", dtype=dout)
    _run(ew_lib.strided_copy, DT_CODE[din], DT_CODE[dout], x.data_ptr(), out.data_ptr(), 3,
         _i64(shape), _i64(x.stride()), _i64(out.stride()), _stream())
    assert torch.equal(out, x.to(dout))


# ---- attention --------------------------------------------------------------------------------

MASK_CODE = {"none": 0, "add": 1, "add_f32": 2, "bool": 3}


def _attn_ref(q, k, v, scale, causal, offset, mask_kind, mask, heads_per_kv):
    q, k, v = q.double(), k.double(), v.double()
    if heads_per_kv > 1:
        k = k.repeat_interleave(heads_per_kv, dim=1)
        v = v.repeat_interleave(heads_per_kv, dim=1)
    s = q @ k.transpose(-1, -2) * scale
    lq, lk = s.shape[-2:]
    visible = torch.ones(lq, lk, dtype=torch.bool, device=s.device)
    if causal:
        i = torch.arange(lq, device=s.device)[:, None]
        j = torch.arange(lk, device=s.device)[None, :]
        visible = j <= i + offset
    if mask_kind in ("add", "add_f32"):
        s = s + mask.double()
    elif mask_kind == "bool":
        visible = visible & mask
    s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(nan=0.0)  # a row with no visible key: O = 0
    return p @ v


def _attn_case(lib, dtype, D, causal, mask_kind, Lq, Lk, *, B=2, H=3, heads_per_kv=1,
               layout="bhld", simt=False, offset=0, misaligned=False, mask_bcast=False):
    seed = _seed()
    Hk = H // heads_per_kv

    def make(h, L, extra=0):
        if layout == "blhd":  # [B, L, H, D] storage seen as [B, H, L, D]
            t = _randn(B * L * h * D + extra, dtype=dtype)[extra:].view(B, L, h, D).transpose(1, 2)
        else:
            t = _randn(B * h * L * D + extra, dtype=dtype)[extra:].view(B, h, L, D)
        return t

    shift = 1 if misaligned else 0
    q, k, v = make(H, Lq, shift), make(Hk, Lk, shift), make(Hk, Lk, shift)
    o = torch.full((B, Lq, H, D) if layout == "blhd" else (B, H, Lq, D), NAN, device="cuda",
                   dtype=dtype)
    if layout == "blhd":
        o = o.transpose(1, 2)
    mask = None
    ms = (0, 0, 0, 0)
    mshape = (B, 1, Lq, Lk) if mask_bcast else (B, H, Lq, Lk)
    if mask_kind in ("add", "add_f32"):
        mdt = dtype if mask_kind == "add" else torch.float32
        mask = _randn(*mshape, dtype=mdt)
        mask[torch.rand(mshape, device="cuda") < 0.1] = float("-inf")
    elif mask_kind == "bool":
        mask = torch.rand(mshape, device="cuda") < 0.7
    if mask is not None:
        mask = mask.expand(B, H, Lq, Lk)
        ms = mask.stride()
    scale = 1.0 / math.sqrt(D)
    ins = [t.clone() for t in (q, k, v)]
    _run(lib.attention, DT_CODE[dtype], D, int(simt), q.data_ptr(), _i64(q.stride()),
         k.data_ptr(), _i64(k.stride()), v.data_ptr(), _i64(v.stride()), o.data_ptr(),
         _i64(o.stride()), B, H, Lq, Lk, heads_per_kv, scale, int(causal), offset,
         MASK_CODE[mask_kind], None if mask is None else mask.data_ptr(), _i64(ms), _stream())
    for t, t0 in zip((q, k, v), ins):
        assert torch.equal(t, t0), "input changed"
    ref = _attn_ref(q, k, v, scale, causal, offset, mask_kind, mask, heads_per_kv)
    _close(o, ref, _tol(dtype),
           f"{DT_IDS[dtype]} D={D} causal={causal} mask={mask_kind} {Lq}x{Lk} seed={seed}")


@pytest.mark.parametrize("Lq,Lk", [(128, 128), (77, 200), (200, 77), (1, 33)], ids=lambda v: str(v))
@pytest.mark.parametrize("mask", ["none", "add", "bool"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_attention(attn_lib, dtype, D, causal, mask, Lq, Lk):
    _attn_case(attn_lib, dtype, D, causal, mask, Lq, Lk)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
@pytest.mark.parametrize(
    "variant",
    ["d32", "blhd_view", "gqa", "misaligned", "bottom_right", "mask_f32_bcast", "long",
     "simt", "one_head_many_rows"],
)
def test_attention_variants(attn_lib, dtype, variant):
    kw = dict(dtype=dtype, D=64, causal=False, mask_kind="none", Lq=130, Lk=257)
    if variant == "d32":
        kw.update(D=32, causal=True)
    elif variant == "blhd_view":
        kw.update(layout="blhd", mask_kind="bool")
    elif variant == "gqa":
        kw.update(H=4, heads_per_kv=2, causal=True)
    elif variant == "misaligned":
        kw.update(misaligned=True, D=128, mask_kind="add")
    elif variant == "bottom_right":
        kw.update(causal=True, offset=257 - 130)
    elif variant == "mask_f32_bcast":
        kw.update(mask_kind="add_f32", mask_bcast=True)
    elif variant == "long":
        kw.update(Lq=1000, Lk=1500, D=128, causal=True, B=1, H=2)
    elif variant == "simt":
        kw.update(simt=True, D=128, mask_kind="bool", causal=True)
    elif variant == "one_head_many_rows":
        kw.update(B=1, H=1, Lq=4099, Lk=64)
    _attn_case(attn_lib, **kw)
