"""The CUDA templates on the device, against PyTorch in float64 on fresh random inputs.

Each template is built into a harness .so (tests/gpu/harness/*.cu: extern "C" launchers over raw
pointers) by nvcc, cached by source hash, loaded with ctypes and run on torch CUDA tensors on
torch's current stream. Outputs are poisoned with NaN before each run, so an element left
unwritten fails (NaN never passes); inputs must be unchanged after it. Tolerance (atol and rtol):
1e-4 for fp32 storage, 1e-2 for fp16 / bf16 storage and for TF32 attention (the tf32 policy's).
Seeds are fixed per test and printed (``_seed``; ``STITCHCUDA_TEST_SEED`` changes the base).
"""

from __future__ import annotations

import ctypes
import math
import os
import zlib

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


#: Every draw here starts from $STITCHCUDA_TEST_SEED (default fixed): each test mixes in its node
#: id, so it draws the same inputs on every run, and a failure prints its seed (to rerun it, or to
#: try other inputs with another base).
BASE_SEED = int(os.environ.get("STITCHCUDA_TEST_SEED", "20261122"))


def _seed() -> int:
    """The running test's fixed seed, set for torch and printed (shown with a failure)."""
    node = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    seed = (BASE_SEED ^ zlib.crc32(node.encode())) & 0x7FFFFFFF
    torch.manual_seed(seed)
    print(f"seed={seed} (STITCHCUDA_TEST_SEED={BASE_SEED}, {node})")
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
              (3, 2048), (5, 4097), (2, 20000), (1, 1 << 20), (70000, 7), (65537, 64),
              # rows held in a thread-block cluster's shared memory (sm_90+): odd lengths, many clusters
              (2, 100003), (130, 65536), (3, 393216)]


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


@pytest.mark.parametrize("cols", [5, 1000, 4097])
def test_softmax_keeps_subnormal_probabilities(reduce_lib, cols):
    """A probability below 2^-126 stays subnormal, as in PyTorch (the exponential's .ftz form
    flushed it to zero): logits 0 and -90 give exp(-90) = 8.2e-40 over the row's sum."""
    x = torch.zeros(4, cols, device="cuda")
    x[:, 1::2] = -90.0
    out = torch.full_like(x, NAN)
    _run(reduce_lib.row_reduce, OP_CODE["softmax"], DT_CODE[torch.float32], x.data_ptr(), cols, out.data_ptr(), cols,
         None, None, 4, cols, EPS, 0, 0, _stream())
    ref = torch.softmax(x.double(), -1)
    tiny = out[:, 1::2]
    assert (tiny > 0).all(), f"subnormal probabilities flushed: {int((tiny == 0).sum())} zeros"
    # (subnormals are spaced 2^-149 apart: a few of those, beside the relative error)
    assert torch.allclose(tiny.double(), ref[:, 1::2], rtol=1e-3, atol=4 * 2.0 ** -149), (tiny[0, :3], ref[0, 1:6:2])


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


@pytest.mark.parametrize("rows,cols,ldi,hooks", [(1, 1 << 20, None, False), (3, 40000, None, False),
                                                (16, 65537, None, False), (5, 50000, 50003, False),
                                                (7, 131072, None, True)], ids=str)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_norm_split_rows(reduce_lib, op, dtype, rows, cols, ldi, hooks):
    """Few, long rows with a workspace: each row cut over many blocks (two passes), vector and
    scalar paths (odd cols, a leading dim past cols), hooks; the same answer as one block per row."""
    if hooks and op == "rms_norm":
        pytest.skip("the harness instantiates hooks for layer norm only")
    seed = _seed()
    ldi = cols if ldi is None else ldi
    x = (_randn(rows * ldi, dtype=dtype, scale=2.0) + 3.0).as_strided((rows, cols), (ldi, 1))  # mean far from 0
    w, b = _randn(cols, dtype=dtype), _randn(cols, dtype=dtype) if op == "layer_norm" else None
    ws_floats = reduce_lib.row_workspace_floats(rows, cols)
    assert ws_floats == rows * 256 * 3
    ws = torch.full((ws_floats,), NAN, device="cuda")
    out_base = torch.full((rows, ldi), NAN, device="cuda", dtype=dtype)
    out = out_base[:, :cols]
    _run(reduce_lib.row_norm_ws, OP_CODE[op], DT_CODE[dtype], x.data_ptr(), ldi, out.data_ptr(), ldi,
         w.data_ptr(), None if b is None else b.data_ptr(), rows, cols, EPS, ws.data_ptr(), ws_floats,
         int(hooks), _stream())
    xd = x.double() * (0.5 if hooks else 1.0)
    ref = _row_ref(op, xd, w.double(), None if b is None else b.double())
    if hooks:
        ref = F.gelu(ref)
    _close(out, ref, _tol(dtype), f"{op} {DT_IDS[dtype]} {rows}x{cols} split seed={seed}")
    assert torch.isnan(out_base[:, cols:]).all(), "wrote outside the output view"
    assert not torch.isnan(ws[: rows * 3]).any(), "a row too long to split was not split"


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


# ---- softmax over a middle axis ---------------------------------------------------------------

#: (outer, red, inner): red within the register cache (16) and past it; inner in 16-byte packs
#: and not (33: scalar loads); one outer, one reduced element.
AXIS_ROW_SHAPES = [(2, 3, 40), (8, 16, 1000), (3, 17, 64), (2, 100, 33), (1, 5, 4096), (5, 1, 64),
                   (4, 16, 12600)]


@pytest.mark.parametrize("layout", ["contig", "out_transposed", "inplace"])
@pytest.mark.parametrize("shape", AXIS_ROW_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("op", ["softmax", "softmax_hooks", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_softmax_axis(reduce_lib, op, dtype, shape, layout):
    """out_transposed: the result's inner dim outermost in memory (scalar stores); inplace: out is x."""
    seed = _seed()
    outer, red, inner = shape
    x = _randn(outer, red, inner, dtype=dtype, scale=3.0)
    x[0, :, 1] = -math.inf  # a column of -inf: NaN, as PyTorch's
    if red > 1:
        x[-1, 0, -1] = -math.inf  # one -inf among finite values: exactly zero
    x_before = x.clone()
    if layout == "inplace":
        out = x
    elif layout == "out_transposed":
        out = torch.full((inner, outer, red), NAN, device="cuda", dtype=dtype).permute(1, 2, 0)
    else:
        out = torch.full((outer, red, inner), NAN, device="cuda", dtype=dtype)
    _run(reduce_lib.softmax_axis, 1 if op == "log_softmax" else 0, DT_CODE[dtype], x_before.data_ptr()
         if layout != "inplace" else x.data_ptr(), outer, red, inner, *x.stride(), out.data_ptr(),
         *out.stride(), int(op == "softmax_hooks"), _stream())
    if layout != "inplace":
        assert torch.equal(x, x_before)
    xd = x_before.double()
    if op == "softmax_hooks":
        ref = F.gelu(torch.softmax(xd * 0.5, 1))
    elif op == "softmax":
        ref = torch.softmax(xd, 1)
    else:
        ref = torch.log_softmax(xd, 1)
    nan = torch.isnan(ref)
    assert torch.isnan(out.double()[nan]).all(), f"a column of -inf must give NaN seed={seed}"
    if red > 1 and op != "log_softmax":
        assert out[-1, 0, -1].item() == (F.gelu(torch.zeros(())).item() if op == "softmax_hooks" else 0.0)
    _close(out.double().masked_fill(nan, 0.0), ref.masked_fill(nan, 0.0), _tol(dtype), f"{op} {shape} {layout} seed={seed}")


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


#: (shape, why): the tile's sides follow the extents (a side of 8 channels, a short batch of
#: rows, both sides long, partial tiles on both, a channel count that is no power of two).
LAYOUT_SHAPES = [((3, 37, 11, 13), "odd extents"), ((2, 8, 33, 35), "8 channels"), ((3, 16, 9, 130), "16 channels"),
                 ((2, 64, 5, 7), "64 channels, short planes"), ((1, 9, 300, 2), "9 channels"),
                 ((4, 200, 3, 3), "200 channels, 9-element planes"), ((2, 32, 64, 64), "full tiles"),
                 ((3, 12, 10, 30), "packs of 4, partial tiles on both"), ((2, 48, 16, 20), "packs of 4, 48 channels")]


@pytest.mark.parametrize("out_layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("shape,why", LAYOUT_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_ew_layout_change(ew_lib, dtype, shape, why, out_layout):
    """A layout change in one elementwise launch (the tiled path), over shapes whose sides pick
    every tile shape: inputs in both layouts (one of them staged whichever layout out takes), a
    per-channel operand, a scalar; odd extents leave partial tiles on both tile dims."""
    seed = _seed()
    a = _randn(*shape, dtype=dtype).to(memory_format=torch.channels_last)
    b, c, d = _randn(shape[1], 1, 1, dtype=dtype), _randn(*shape, dtype=dtype), _randn(dtype=dtype)
    out = torch.full(shape, NAN, device="cuda", dtype=dtype)
    if out_layout == "channels_last":
        out = out.to(memory_format=torch.channels_last)
    _run(ew_lib.ew_fma4, DT_CODE[dtype], a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr(),
         out.data_ptr(), 4, _i64(shape), _i64(out.stride()),
         *[_i64(_bcast_strides(t, shape)) for t in (a, b, c, d)], _stream())
    ref = a.double() * b.double() + c.double() - d.double()
    _close(out, ref, _tol(dtype), f"{why} {out_layout} seed={seed}")


@pytest.mark.parametrize("which", ["a", "c", "out"])
@pytest.mark.parametrize("out_layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_ew_layout_change_off_a_pack(ew_lib, dtype, out_layout, which):
    """The tiled path in packs of 4 only where a pack's address is aligned: one tensor (a staged
    input, the other input, the output) starting one element past a pack boundary takes the
    element-wise accesses for that tensor, and the result is the same."""
    seed = _seed()
    shape = (2, 16, 8, 12)

    def off(make):  # the same tensor one element past an aligned start
        flat = make(math.prod(shape) + 1)
        return flat[1:]

    a = (off(lambda n: _randn(n, dtype=dtype)) if which == "a" else _randn(math.prod(shape), dtype=dtype))
    a = a.view(shape[0], shape[2], shape[3], shape[1]).permute(0, 3, 1, 2)      # channels-last
    c = (off(lambda n: _randn(n, dtype=dtype)) if which == "c" else _randn(math.prod(shape), dtype=dtype)).view(shape)
    b, d = _randn(shape[1], 1, 1, dtype=dtype), _randn(dtype=dtype)
    o = off(lambda n: torch.full((n,), NAN, device="cuda", dtype=dtype)) if which == "out" else \
        torch.full((math.prod(shape),), NAN, device="cuda", dtype=dtype)
    out = o.view(shape) if out_layout == "channels_first" else \
        o.view(shape[0], shape[2], shape[3], shape[1]).permute(0, 3, 1, 2)
    _run(ew_lib.ew_fma4, DT_CODE[dtype], a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr(),
         out.data_ptr(), 4, _i64(shape), _i64(out.stride()),
         *[_i64(_bcast_strides(t, shape)) for t in (a, b, c, d)], _stream())
    ref = a.double() * b.double() + c.double() - d.double()
    _close(out, ref, _tol(dtype), f"{which} off a pack, {out_layout} seed={seed}")


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=DT_IDS.get)
def test_strided_copy_channel_slice(ew_lib, dtype):
    """A join along channels in channels-last memory, described in logical (N, C, H, W) order:
    each input copied into its channel slice of the output (the dims are walked in the output's
    memory order, channels innermost)."""
    _seed()
    parts = [_randn(3, c, 7, 9, dtype=dtype).to(memory_format=torch.channels_last) for c in (24, 16, 5)]
    out = torch.full((3, 45, 7, 9), NAN, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    lo = 0
    for x in parts:
        dst = out[:, lo:lo + x.shape[1]]
        _run(ew_lib.strided_copy, DT_CODE[dtype], DT_CODE[dtype], x.data_ptr(), dst.data_ptr(), 4,
             _i64(x.shape), _i64(x.stride()), _i64(dst.stride()), _stream())
        lo += x.shape[1]
    assert torch.equal(out, torch.cat(parts, dim=1))


# ---- attention --------------------------------------------------------------------------------

MASK_CODE = {"none": 0, "add": 1, "add_f32": 2, "bool": 3}
#: attention_harness.cu's modes: the type's default kernel, the SIMT kernel, TF32 (float), split
#: TF32 (float: three TF32 products each, held to fp32's tolerance).
MODE = {"default": 0, "simt": 1, "tf32": 2, "split": 3}
ATTN_HEAD_DIMS = [16, 32, 48, 64, 80, 96, 112, 128]
CELL_Q, CELL_K = 64, 32  # kAttnMaskBlockQ, kAttnMaskBlockK

_I32, _I64, _F32, _PTR = ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
_ATTN_EX_ARGS = [_I32, _I32, _I32, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I32, _I32, _I32, _I32,
                 _I32, _F32, _I32, _I64, _I32, _PTR, _PTR, _PTR, _PTR, _PTR]
_MASK_BLOCKS_ARGS = [_I32, _I32, _I32, _I32, _I32, _I32, _PTR, _PTR, _PTR, _PTR, _PTR]


def _attn_fns(lib):
    """attention_ex and attention_mask_blocks with their argument types (nvcc_util.SIGNATURES
    types the original `attention` launcher only)."""
    ex, mb = lib.attention_ex, lib.attention_mask_blocks
    ex.argtypes, ex.restype = _ATTN_EX_ARGS, _I32
    mb.argtypes, mb.restype = _MASK_BLOCKS_ARGS, _I32
    return ex, mb


def _attn_tol(dtype, mode) -> float:
    return 1e-2 if mode == "tf32" else _tol(dtype)


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


def _mask_blocks_ref(mask, mask_kind, Lq, Lk) -> torch.Tensor:
    """The summary launch_attention_mask_blocks documents, over a [b, h, Lq, Lk] mask."""
    m = mask.to("cpu")
    below = torch.ones(Lq, Lk, dtype=torch.bool).tril()  # the causal mask: key j attends query i iff j <= i
    if mask_kind == "bool":
        vis, masked, not_causal = m, ~m, m != below
    else:
        m = m.double()
        vis, masked = m != float("-inf"), m != 0
        not_causal = torch.where(below, m != 0, m != float("-inf"))
    nq, nk = -(-Lq // CELL_Q), -(-Lk // CELL_K)
    pad = (0, nk * CELL_K - Lk, 0, nq * CELL_Q - Lq)

    def cells(x):
        x = F.pad(x.to(torch.uint8), pad)
        return x.view(*x.shape[:2], nq, CELL_Q, nk, CELL_K).amax(dim=(3, 5))

    return cells(vis) | (cells(masked) << 1) | (cells(not_causal) << 2)


def _mask_blocks(lib, dtype, mask, mask_kind, B, H, Lq, Lk) -> tuple[torch.Tensor, list[int]]:
    """The device summary of `mask` (a [B, H, Lq, Lk] view, zero strides broadcast) and its
    strides (0 where the mask broadcasts), its cells poisoned with 0 (every tile skipped) first so
    that an unwritten cell fails the test."""
    _, mb = _attn_fns(lib)
    ms = mask.stride()
    nb = B if ms[0] else 1
    nh = H if ms[1] else 1
    nq, nk = -(-Lq // CELL_Q), -(-Lk // CELL_K)
    blocks = torch.zeros((nb, nh, nq, nk), dtype=torch.uint8, device="cuda")
    st = blocks.stride()
    bs = [st[0] if nb > 1 else 0, st[1] if nh > 1 else 0, st[2], st[3]]
    _run(mb, DT_CODE[dtype], B, H, Lq, Lk, MASK_CODE[mask_kind], mask.data_ptr(), _i64(ms),
         blocks.data_ptr(), _i64(bs), _stream())
    want = _mask_blocks_ref(mask[:nb, :nh], mask_kind, Lq, Lk)
    assert torch.equal(blocks.cpu(), want), "mask summary"
    return blocks, bs


def _attn_case(lib, dtype, D, causal, mask_kind, Lq, Lk, *, B=2, H=3, heads_per_kv=1,
               layout="bhld", mode="default", simt=False, offset=0, misaligned=False, mask_bcast=False,
               mask=None, blocks=False, scale=None, seed=None, kernel_mask=None, ref_mask=None):
    """One launch against the float64 reference. `mask`: a given [B or 1, H or 1, Lq, Lk] mask
    instead of a random one; `blocks`: pass launch_attention_mask_blocks' summary of it; `seed`:
    a given seed instead of the test's own; `kernel_mask`: the mask the kernel is given instead
    (`mask` still summarised), and `ref_mask` the one the reference applies."""
    if seed is None:
        seed = _seed()
    else:
        torch.manual_seed(seed)
    mode = "simt" if simt else mode
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
    ms = (0, 0, 0, 0)
    mshape = (B, 1, Lq, Lk) if mask_bcast else (B, H, Lq, Lk)
    if mask is None:
        if mask_kind in ("add", "add_f32"):
            mdt = dtype if mask_kind == "add" else torch.float32
            mask = _randn(*mshape, dtype=mdt)
            mask[torch.rand(mshape, device="cuda") < 0.1] = float("-inf")
        elif mask_kind == "bool":
            mask = torch.rand(mshape, device="cuda") < 0.7
    if mask is not None:
        mask = mask.expand(B, H, Lq, Lk)
        ms = mask.stride()
    bl, bs, summary = None, None, None
    if blocks:
        summary, sstrides = _mask_blocks(lib, dtype, mask, mask_kind, B, H, Lq, Lk)
        bl, bs = summary.data_ptr(), _i64(sstrides)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    ins = [t.clone() for t in (q, k, v)]
    ex, _ = _attn_fns(lib)
    _run(ex, DT_CODE[dtype], D, MODE[mode], q.data_ptr(), _i64(q.stride()),
         k.data_ptr(), _i64(k.stride()), v.data_ptr(), _i64(v.stride()), o.data_ptr(),
         _i64(o.stride()), B, H, Lq, Lk, heads_per_kv, scale, int(causal), offset,
         MASK_CODE[mask_kind], None if mask is None else (kernel_mask if kernel_mask is not None else mask).data_ptr(),
         _i64(ms), bl, bs, _stream())
    for t, t0 in zip((q, k, v), ins):
        assert torch.equal(t, t0), "input changed"
    ref = _attn_ref(q, k, v, scale, causal, offset, mask_kind, mask if ref_mask is None else ref_mask, heads_per_kv)
    _close(o, ref, _attn_tol(dtype, mode),
           f"{DT_IDS[dtype]} {mode} D={D} causal={causal} mask={mask_kind} {Lq}x{Lk} blocks={blocks} seed={seed}")
    return o


@pytest.mark.parametrize("Lq,Lk", [(128, 128), (77, 200), (200, 77), (1, 33)], ids=lambda v: str(v))
@pytest.mark.parametrize("mask", ["none", "add", "bool"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [48, 64, 80, 96, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_attention(attn_lib, dtype, D, causal, mask, Lq, Lk):
    _attn_case(attn_lib, dtype, D, causal, mask, Lq, Lk)


@pytest.mark.parametrize("Lq,Lk", [(128, 128), (77, 200), (200, 77), (1, 33)], ids=lambda v: str(v))
@pytest.mark.parametrize("mask", ["none", "add", "add_f32", "bool"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [32, 48, 64, 80, 96, 128])
def test_attention_tf32(attn_lib, D, causal, mask, Lq, Lk):
    """fp32 storage on TF32 tensor cores: the tf32 policy's tolerance against float64."""
    _attn_case(attn_lib, torch.float32, D, causal, mask, Lq, Lk, mode="tf32")


@pytest.mark.parametrize("D", ATTN_HEAD_DIMS)
@pytest.mark.parametrize("mode", ["f32_simt", "f32_tf32", "f16", "bf16"])
def test_attention_head_dims(attn_lib, mode, D):
    """Every head dim of every kernel (112 runs padded to 128 on the 16-bit kernel)."""
    dtype = {"f32_simt": torch.float32, "f32_tf32": torch.float32, "f16": torch.float16,
             "bf16": torch.bfloat16}[mode]
    kmode = {"f32_simt": "simt", "f32_tf32": "tf32"}.get(mode, "default")
    _attn_case(attn_lib, dtype, D, True, "bool", 150, 261, B=1, H=2, mode=kmode, offset=111)
    _attn_case(attn_lib, dtype, D, False, "add", 70, 33, B=2, H=2, mode=kmode)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
@pytest.mark.parametrize(
    "variant",
    ["d32", "blhd_view", "gqa", "misaligned", "bottom_right", "mask_f32_bcast", "mask_f32_dense", "long",
     "simt", "one_head_many_rows", "d96_misaligned", "d80_long"],
)
def test_attention_variants(attn_lib, dtype, variant):
    _attention_variant(attn_lib, dtype, variant, "default")


@pytest.mark.parametrize(
    "variant",
    ["d32", "blhd_view", "gqa", "misaligned", "bottom_right", "mask_f32_bcast", "mask_f32_dense", "long",
     "one_head_many_rows", "d96_misaligned", "d80_long", "d16", "d112"],
)
def test_attention_tf32_variants(attn_lib, variant):
    _attention_variant(attn_lib, torch.float32, variant, "tf32")


def _attention_variant(lib, dtype, variant, mode):
    kw = dict(dtype=dtype, D=64, causal=False, mask_kind="none", Lq=130, Lk=257, mode=mode)
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
    elif variant == "mask_f32_dense":  # rows whole float4s: staged by cp.async (a partial last key tile)
        kw.update(mask_kind="add_f32", Lk=200)
    elif variant == "long":
        kw.update(Lq=1000, Lk=1500, D=128, causal=True, B=1, H=2)
    elif variant == "simt":
        kw.update(mode="simt", D=128, mask_kind="bool", causal=True)
    elif variant == "one_head_many_rows":
        kw.update(B=1, H=1, Lq=4099, Lk=64)
    elif variant == "d96_misaligned":  # element loads, odd strides, a bool mask read bytewise
        kw.update(misaligned=True, D=96, mask_kind="bool", causal=True, layout="blhd")
    elif variant == "d80_long":
        kw.update(Lq=700, Lk=900, D=80, mask_kind="bool", B=1, H=2)
    elif variant == "d16":
        kw.update(D=16, causal=True, mask_kind="add")
    elif variant == "d112":
        kw.update(D=112, mask_kind="bool", layout="blhd")
    _attn_case(lib, **kw)


@pytest.mark.parametrize("Lq,Lk", [(128, 128), (77, 200), (1, 33)], ids=lambda v: str(v))
@pytest.mark.parametrize("mask", ["none", "add_f32", "bool"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [32, 64, 96, 112, 128])
def test_attention_split_tf32(attn_lib, D, causal, mask, Lq, Lk):
    """fp32 storage, split-TF32 products on tensor cores: fp32's tolerance against float64 (D 112
    and 128 run one m-tile per warp, the others two)."""
    _attn_case(attn_lib, torch.float32, D, causal, mask, Lq, Lk, mode="split")


@pytest.mark.parametrize("variant", ["blhd_view", "gqa", "misaligned", "bottom_right", "mask_f32_dense", "long",
                                     "one_head_many_rows", "d80_long", "d16"])
def test_attention_split_tf32_variants(attn_lib, variant):
    _attention_variant(attn_lib, torch.float32, variant, "split")


def test_attention_split_tf32_is_fp32_grade(attn_lib):
    """Split TF32's error against float64 is of the exact SIMT kernel's order (the runtime's
    split-TF32 GEMM measured 4-5x fp32's) and far below TF32's: the three products are there, and
    the small parts are not lost."""
    B, H, L, D = 2, 4, 512, 64
    torch.manual_seed(7)
    q, k, v = (torch.randn(B, H, L, D, device="cuda") for _ in range(3))
    ref = _attn_ref(q, k, v, 1 / math.sqrt(D), False, 0, "none", None, 1)
    ex, _ = _attn_fns(attn_lib)
    err = {}
    for mode in ("simt", "tf32", "split"):
        o = torch.full_like(q, NAN)
        _run(ex, 0, D, MODE[mode], q.data_ptr(), _i64(q.stride()), k.data_ptr(), _i64(k.stride()), v.data_ptr(),
             _i64(v.stride()), o.data_ptr(), _i64(o.stride()), B, H, L, L, 1, 1 / math.sqrt(D), 0, 0, 0, None,
             _i64((0, 0, 0, 0)), None, None, _stream())
        torch.cuda.synchronize()
        err[mode] = (o.double() - ref).abs().mean().item()
    assert err["split"] < 10 * err["simt"] and err["split"] * 50 < err["tf32"], err


def test_attention_tf32_is_tf32(attn_lib):
    """mode tf32 runs the tensor-core kernel: its result differs from the exact SIMT kernel's
    by TF32 rounding (and both are within their tolerances)."""
    outs = [_attn_case(attn_lib, torch.float32, 96, True, "none", 256, 256, B=1, H=2, mode=mode, seed=1)
            for mode in ("simt", "tf32")]
    diff = (outs[0] - outs[1]).abs().max().item()
    assert 1e-6 < diff < 1e-2, diff


ATTN_MODES = [("f32_simt", torch.float32, "simt"), ("f32_tf32", torch.float32, "tf32"),
              ("f16", torch.float16, "default"), ("bf16", torch.bfloat16, "default")]


def _block_mask(kind, Lq, Lk, B=2, H=3):
    """Masks whose summary lets tiles be skipped or read without the mask."""
    if kind == "tril":  # a causal mask held as data (a registered tril buffer), broadcast over B, H
        return torch.ones(Lq, Lk, device="cuda").tril().bool()[None, None]
    if kind == "tril_slice":  # the top-left corner of a larger causal mask: rows 255 bytes apart, unaligned
        return torch.ones(255, 255, device="cuda").tril().bool()[:Lq, :Lk][None, None]
    if kind == "tril_broken":  # causal but for one element in some cells on the diagonal: those read the mask
        m = torch.ones(Lq, Lk, device="cuda").tril().bool()
        for i in range(3, min(Lq, Lk), 97):
            m[i, i] = False  # the diagonal itself masked
            m[i, min(i + 1, Lk - 1)] = True  # a key past the diagonal visible
        return m[None, None]
    if kind == "tril_float":  # the additive form: 0 on and below the diagonal, -inf above
        return torch.zeros(Lq, Lk, device="cuda").masked_fill(
            ~torch.ones(Lq, Lk, device="cuda").tril().bool(), float("-inf"))[None, None]
    if kind == "block_sparse":  # whole 64 x 32 cells on / off, one cell in four mixed
        cells = torch.rand(B, H, -(-Lq // CELL_Q), -(-Lk // CELL_K), device="cuda")
        m = (cells > 0.4).repeat_interleave(CELL_Q, 2).repeat_interleave(CELL_K, 3)[..., :Lq, :Lk].clone()
        mixed = (cells < 0.15).repeat_interleave(CELL_Q, 2).repeat_interleave(CELL_K, 3)[..., :Lq, :Lk]
        m[mixed] = torch.rand(int(mixed.sum()), device="cuda") < 0.5
        m[..., 0] = True  # every row sees a key
        return m
    if kind == "empty_rows":  # some query blocks see nothing at all: O = 0 there
        m = torch.ones(B, 1, Lq, Lk, dtype=torch.bool, device="cuda")
        m[:, :, : min(Lq, 130)] = False
        return m
    raise ValueError(kind)


@pytest.mark.parametrize("pattern,Lq,Lk", [("tril", 512, 512), ("tril", 300, 300), ("tril_float", 200, 200),
                                           ("tril", 150, 240), ("tril_slice", 200, 200), ("tril_broken", 300, 300),
                                           ("block_sparse", 300, 450), ("empty_rows", 260, 100)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("D", [64, 96])
@pytest.mark.parametrize("mode", ATTN_MODES, ids=lambda m: m[0])
def test_attention_mask_blocks(attn_lib, mode, D, pattern, Lq, Lk):
    """The mask summary (launch_attention_mask_blocks, checked cell by cell) and the kernels given
    it: fully masked tiles skipped, tiles without a masked element read without the mask."""
    _, dtype, kmode = mode
    mask = _block_mask(pattern, Lq, Lk)
    if mask.dtype == torch.bool:
        _attn_case(attn_lib, dtype, D, False, "bool", Lq, Lk, mode=kmode, mask=mask, blocks=True)
    else:  # an additive mask, as float and in the storage type
        _attn_case(attn_lib, dtype, D, False, "add_f32", Lq, Lk, mode=kmode, mask=mask, blocks=True)
        _attn_case(attn_lib, dtype, D, False, "add", Lq, Lk, mode=kmode, mask=mask.to(dtype), blocks=True)


@pytest.mark.parametrize("mode", ATTN_MODES, ids=lambda m: m[0])
def test_attention_causal_cells_computed_not_read(attn_lib, mode):
    """Cells the summary says are masked as the causal mask is are masked by position, the mask
    not read there: given a causal mask's summary and a mask of all ones, every kernel computes
    causal attention (a kernel that read the mask there would attend to every key)."""
    _, dtype, kmode = mode
    causal_mask = _block_mask("tril", 300, 300)
    _attn_case(attn_lib, dtype, 64, False, "bool", 300, 300, mode=kmode, mask=causal_mask, blocks=True,
               kernel_mask=torch.ones_like(causal_mask), ref_mask=causal_mask)


@pytest.mark.parametrize("mode", ATTN_MODES, ids=lambda m: m[0])
def test_attention_mask_blocks_with_causal(attn_lib, mode):
    """A summary and is_causal together; and a summary of a mask on one batch / head only."""
    _, dtype, kmode = mode
    mask = _block_mask("block_sparse", 333, 333)
    _attn_case(attn_lib, dtype, 96, True, "bool", 333, 333, mode=kmode, mask=mask, blocks=True)
    mask = _block_mask("block_sparse", 200, 300, B=1, H=1)  # broadcast over B and H: one summary
    _attn_case(attn_lib, dtype, 48, True, "bool", 200, 300, mode=kmode, mask=mask, blocks=True, offset=100)
