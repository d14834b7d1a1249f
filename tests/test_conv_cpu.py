"""Convolutions where there is no GPU: rt.conv and st_conv refuse bad arguments by name before any
device work, st_conv_output_size follows PyTorch's shape rules, and a program calling st_conv
compiles and links against the installed runtime."""

from __future__ import annotations

import ctypes
import subprocess

import pytest

import stitchcuda
from stitchcuda import rt

torch = pytest.importorskip("torch")

NO_GPU = not stitchcuda.has_gpu()
ST_OK, ST_ERR_INVALID_ARGUMENT, ST_ERR_NO_DEVICE, ST_ERR_CUDNN = 0, 1, 4, 8
ST_FLOAT32, ST_FLOAT16, ST_BFLOAT16, ST_FLOAT64 = 0, 1, 2, 3
ST_POLICY_FP32, ST_POLICY_TF32, ST_POLICY_BF16, ST_POLICY_FP16 = 0, 1, 2, 3
ST_ACT_NONE, ST_ACT_RELU = 0, 1

I64x3 = ctypes.c_int64 * 3


class ConvArgs(ctypes.Structure):
    """st_conv_args, field for field."""

    _fields_ = [
        ("policy", ctypes.c_int), ("spatial_dims", ctypes.c_int32), ("transposed", ctypes.c_int32),
        ("channels_last", ctypes.c_int32),
        ("batch", ctypes.c_int64), ("in_channels", ctypes.c_int64), ("out_channels", ctypes.c_int64),
        ("groups", ctypes.c_int64),
        ("in_size", I64x3), ("kernel_size", I64x3), ("stride", I64x3), ("padding", I64x3), ("dilation", I64x3),
        ("output_padding", I64x3),
        ("x", ctypes.c_void_p), ("x_dtype", ctypes.c_int),
        ("w", ctypes.c_void_p), ("w_dtype", ctypes.c_int),
        ("bias", ctypes.c_void_p), ("bias_dtype", ctypes.c_int),
        ("y", ctypes.c_void_p), ("y_dtype", ctypes.c_int),
        ("activation", ctypes.c_int),
    ]


@pytest.fixture(scope="module")
def lib():
    lib = ctypes.CDLL(str(stitchcuda.LIB_DIR / "libstitchrt.so"))
    lib.st_last_error.restype = ctypes.c_char_p
    lib.st_status_name.restype = ctypes.c_char_p
    lib.st_conv.argtypes = [ctypes.POINTER(ConvArgs), ctypes.c_void_p]
    lib.st_conv_output_size.argtypes = [ctypes.POINTER(ConvArgs), ctypes.POINTER(ctypes.c_int64)]
    return lib


def conv_args(**over) -> ConvArgs:
    """A valid 2-d convolution, 8 -> 16 channels, 3x3 on 10x12, with bias and ReLU, over fake,
    well-separated device addresses."""
    a = ConvArgs(policy=ST_POLICY_FP32, spatial_dims=2, transposed=0, channels_last=0, batch=2, in_channels=8,
                 out_channels=16, groups=1, in_size=I64x3(10, 12, 0), kernel_size=I64x3(3, 3, 0),
                 stride=I64x3(1, 1, 0), padding=I64x3(1, 1, 0), dilation=I64x3(1, 1, 0),
                 output_padding=I64x3(0, 0, 0), x=0x100000, x_dtype=ST_FLOAT32, w=0x200000, w_dtype=ST_FLOAT32,
                 bias=0x300000, bias_dtype=ST_FLOAT32, y=0x400000, y_dtype=ST_FLOAT32, activation=ST_ACT_RELU)
    for k, v in over.items():
        setattr(a, k, I64x3(*v, *[0] * (3 - len(v))) if isinstance(v, tuple) else v)
    return a


# --------------------------------------------------------------------------- the C ABI


@pytest.mark.parametrize("over,message", [
    (dict(x_dtype=ST_FLOAT64), "conv: x has dtype float64, policy fp32 expects float32"),
    (dict(policy=ST_POLICY_BF16), "conv: x has dtype float32, policy bf16 expects bfloat16"),
    (dict(w_dtype=ST_FLOAT16), "conv: w has dtype float16, policy fp32 expects float32"),
    (dict(y_dtype=ST_BFLOAT16), "conv: y has dtype bfloat16, policy fp32 expects float32"),
    (dict(bias_dtype=ST_FLOAT64), "conv: bias has dtype float64"),
    (dict(policy=9), "policy 9 is not one of fp32, tf32, bf16, fp16"),
    (dict(spatial_dims=4), "conv: spatial_dims must be 1, 2 or 3, got 4"),
    (dict(spatial_dims=0), "conv: spatial_dims must be 1, 2 or 3, got 0"),
    (dict(groups=3), "conv: groups=3 does not divide in_channels=8"),
    (dict(groups=0), "conv: groups must be >= 1, got 0"),
    (dict(groups=4, out_channels=10), "conv: groups=4 does not divide out_channels=10"),
    (dict(batch=0), "conv: batch must be >= 1, got 0"),
    (dict(in_channels=0), "conv: in_channels and out_channels must be >= 1"),
    (dict(activation=42), "conv: activation 42 is not one of st_activation"),
    (dict(activation=8), "conv: activation 8 is not one of st_activation"),
    (dict(activation=7, batch=0), "conv: batch must be >= 1, got 0"),  # ReLU6 (7) is one: the next check speaks
    (dict(stride=(0, 1)), "conv: stride (0, 1) has a value < 1"),
    (dict(dilation=(1, 0)), "conv: dilation (1, 0) has a value < 1"),
    (dict(padding=(-1, 0)), "conv: padding (-1, 0) has a negative value"),
    (dict(kernel_size=(0, 3)), "conv: kernel size (0, 3) has a dim < 1"),
    (dict(in_size=(10, 0)), "conv: input spatial size (10, 0) has a dim < 1"),
    (dict(kernel_size=(13, 3), padding=(0, 0)), "conv: the output would be empty"),
    (dict(output_padding=(1, 0)), "conv: output_padding (1, 0) is for transposed convolutions only"),
    (dict(transposed=1, stride=(2, 2), output_padding=(2, 0)), "must be >= 0 and smaller than stride (2, 2)"),
    (dict(x=None), "conv: x, w and y must be non-null device pointers"),
    (dict(y=None), "conv: x, w and y must be non-null device pointers"),
    (dict(x=0x100002), "conv: x is not aligned to its element size (4 bytes)"),
    (dict(bias=0x300001), "conv: bias is not aligned"),
    (dict(y=0x100000 + 4 * 8), "conv: y overlaps x"),
    (dict(y=0x200000 - 4 * 8), "conv: y overlaps w"),
])
def test_c_abi_conv_argument_errors(lib, over, message):
    status = lib.st_conv(ctypes.byref(conv_args(**over)), None)
    msg = lib.st_last_error().decode()
    assert status == ST_ERR_INVALID_ARGUMENT, msg
    assert message in msg, msg


@pytest.mark.parametrize("over,message", [
    (dict(policy=ST_POLICY_TF32), "the policy must be fp32 (the precision it stands in for), got tf32"),
    (dict(w_dtype=ST_FLOAT16), "conv: w has dtype float16, policy fp32 expects float32"),
    (dict(groups=3), "conv: groups=3 does not divide in_channels=8"),
    (dict(x=None), "conv: x, w and y must be non-null device pointers"),
])
def test_c_abi_split_tf32_conv_argument_errors(lib, over, message):
    """The split-TF32 convolution takes an fp32 convolution's arguments, judged as st_conv judges
    them, before any device work (its scratch is allocated after)."""
    lib.st_conv_split_tf32.argtypes = [ctypes.POINTER(ConvArgs), ctypes.c_void_p]
    status = lib.st_conv_split_tf32(ctypes.byref(conv_args(**over)), None)
    msg = lib.st_last_error().decode()
    assert status == ST_ERR_INVALID_ARGUMENT, msg
    assert message in msg, msg
    if NO_GPU:
        assert lib.st_conv_split_tf32(ctypes.byref(conv_args()), None) == ST_ERR_NO_DEVICE, \
            lib.st_last_error().decode()


def test_rt_conv_split_tf32_is_for_the_fp32_policy():
    with pytest.raises(stitchcuda.ArgumentError, match="stands in for an fp32 convolution"):
        rt.conv(None, None, policy="tf32", split_tf32=True)


def test_c_abi_conv_null_args(lib):
    assert lib.st_conv(None, None) == ST_ERR_INVALID_ARGUMENT
    assert "st_conv: args is null" in lib.st_last_error().decode()
    out = (ctypes.c_int64 * 3)()
    assert lib.st_conv_output_size(None, out) == ST_ERR_INVALID_ARGUMENT
    assert lib.st_conv_output_size(ctypes.byref(conv_args()), None) == ST_ERR_INVALID_ARGUMENT
    assert "out_size is null" in lib.st_last_error().decode()


def test_c_abi_valid_conv_without_gpu_is_no_device(lib):
    if not NO_GPU:
        pytest.skip("a GPU is present")
    status = lib.st_conv(ctypes.byref(conv_args()), None)
    assert status == ST_ERR_NO_DEVICE, lib.st_last_error().decode()


def test_c_abi_status_name(lib):
    assert lib.st_status_name(ST_ERR_CUDNN) == b"cuDNN error"


SHAPE_CASES = [  # (transposed, batch, cin, cout, groups, in_size, kernel, stride, padding, dilation, output_padding)
    (False, 2, 4, 6, 1, (11,), (3,), (2,), (1,), (1,), (0,)),
    (False, 1, 4, 8, 4, (9, 10), (3, 5), (2, 1), (1, 2), (2, 1), (0, 0)),
    (False, 3, 6, 6, 3, (7, 8, 9), (3, 1, 2), (1, 2, 3), (0, 1, 1), (1, 1, 2), (0, 0, 0)),
    (True, 2, 4, 6, 2, (5,), (4,), (3,), (1,), (2,), (2,)),
    (True, 1, 6, 4, 1, (6, 7), (3, 3), (2, 2), (1, 0), (1, 2), (1, 0)),
    (True, 2, 4, 4, 4, (3, 4, 5), (2, 3, 3), (2, 1, 2), (0, 1, 1), (1, 1, 1), (1, 0, 1)),
]


@pytest.mark.parametrize("case", SHAPE_CASES)
def test_output_size_matches_pytorch(lib, case):
    transposed, batch, cin, cout, groups, in_size, kernel, stride, padding, dilation, output_padding = case
    d = len(in_size)
    a = conv_args(spatial_dims=d, transposed=int(transposed), batch=batch, in_channels=cin, out_channels=cout,
                  groups=groups, in_size=in_size, kernel_size=kernel, stride=stride, padding=padding,
                  dilation=dilation, output_padding=output_padding)
    out = (ctypes.c_int64 * 3)()
    assert lib.st_conv_output_size(ctypes.byref(a), out) == ST_OK, lib.st_last_error().decode()
    x = torch.zeros(batch, cin, *in_size)
    F = torch.nn.functional
    if transposed:
        w = torch.zeros(cin, cout // groups, *kernel)
        fn = [F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d][d - 1]
        y = fn(x, w, stride=stride, padding=padding, output_padding=output_padding, groups=groups, dilation=dilation)
    else:
        w = torch.zeros(cout, cin // groups, *kernel)
        fn = [F.conv1d, F.conv2d, F.conv3d][d - 1]
        y = fn(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    assert tuple(out[:d]) == tuple(y.shape[2:])


# --------------------------------------------------------------------------- the binding


def t(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("call,message", [
    (lambda: rt.conv(t(2, 8, 10, 10), t(16, 8, 3, 3), policy="fp8"),
     "policy must be one of 'fp32', 'tf32', 'bf16', 'fp16'; got 'fp8'"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(16, 8, 3, 3), activation="swish"), "activation must be one of 'none', 'relu'"),
    (lambda: rt.conv(t(8, 10), t(16, 8, 3)), "x: expected a 3-D, 4-D or 5-D tensor (batch, channels, spatial...), got shape (8, 10)"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(16, 8, 3)), "w: expected a 4-D weight like x, got shape (16, 8, 3)"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(16, 8, 3, 3), stride=(1, 1, 1)), "stride: expected 2 values (one per spatial dim), got 3"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(16, 8, 3, 3), padding="same"), "padding: expected an int or a sequence of 2 ints"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(15, 8, 3, 3), groups=3), "groups=3 does not divide in_channels=8"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(15, 2, 3, 3), groups=4), "groups=4 does not divide out_channels=15"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(16, 8, 3, 3), groups=0), "groups must be >= 1, got 0"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(16, 4, 3, 3)), "w: expected shape (out_channels, in_channels / groups = 8, kernel...)"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(16, 8, 3, 3), groups=2), "in_channels / groups = 4"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(4, 8, 3, 3), transposed=True),
     "w: a transposed convolution's weight is (in_channels = 8, out_channels / groups, kernel...), got (4, 8, 3, 3)"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(8, 4, 3, 3), transposed=True, stride=2, output_padding=2),
     "output_padding (2, 2) must be >= 0 and smaller than stride (2, 2)"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(16, 8, 3, 3), output_padding=1), "is for transposed convolutions only"),
    (lambda: rt.conv(t(2, 8, 2, 2), t(16, 8, 3, 3)), "the output would be empty"),
    (lambda: rt.conv(t(2, 8, 6, 6, 6), t(16, 8, 1, 1, 1), dilation=(1, 0, 1)), "dilation (1, 0, 1) has a value < 1"),
    (lambda: rt.conv(t(2, 8, 10, 10, dtype=torch.float64), t(16, 8, 3, 3)),
     "x: expected dtype float32 (policy fp32), got float64"),
    (lambda: rt.conv(t(2, 8, 10, 10, dtype=torch.int32), t(16, 8, 3, 3)), "x: expected dtype float32 (policy fp32), got int32"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(16, 8, 3, 3), policy="bf16"), "x: expected dtype bfloat16 (policy bf16), got float32"),
    (lambda: rt.conv(t(2, 8, 10, 10, dtype=torch.float16), t(16, 8, 3, 3), policy="fp16"),
     "w: expected dtype float16 (policy fp16), got float32"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(16, 8, 3, 3), t(16, dtype=torch.float16)), "bias: expected dtype float32"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(16, 8, 3, 3), t(8)), "bias: expected shape (16,), got (8,)"),
    (lambda: rt.conv(t(2, 8, 10, 10), t(16, 8, 3, 3), channels_last=True), "x: expected a dense channels-last tensor"),
    (lambda: rt.conv(t(2, 8, 10, 10).to(memory_format=torch.channels_last), t(16, 8, 3, 3)),
     "x: expected a dense channels-first (contiguous) tensor since channels_last=False"),
    (lambda: rt.conv(t(2, 8, 10, 10).to(memory_format=torch.channels_last), t(16, 8, 3, 3), channels_last=True),
     "w: expected a dense channels-last tensor"),
    (lambda: rt.conv(t(2, 8, 10, 10)[:, :, ::2], t(16, 8, 3, 3)), "x: expected a dense channels-first"),
])
def test_binding_argument_errors_before_any_device_work(call, message):
    with pytest.raises(stitchcuda.ArgumentError) as e:
        call()
    assert message in str(e.value), str(e.value)


def test_binding_valid_host_tensors_reach_the_device_check():
    x = t(2, 8, 10, 10).to(memory_format=torch.channels_last)
    w = t(16, 8, 3, 3).to(memory_format=torch.channels_last)
    if NO_GPU:
        with pytest.raises(stitchcuda.NoDeviceError):
            rt.conv(x, w, t(16), padding=1, channels_last=True, activation="relu")
    else:
        with pytest.raises(stitchcuda.ArgumentError, match="x: expected a CUDA tensor"):
            rt.conv(x, w, t(16), padding=1, channels_last=True, activation="relu")


def test_binding_names():
    assert issubclass(rt.CudnnError, stitchcuda.StitchError)
    if NO_GPU:
        with pytest.raises(stitchcuda.NoDeviceError):
            rt.conv_plan_cache_stats()


# --------------------------------------------------------------------------- compile check

CONV_PROGRAM = r"""
#include <cuda_runtime.h>
#include "stitchrt/program.h"

// A depthwise 3x3 convolution with bias and ReLU, channels-last bf16: how a program calls st_conv.
extern "C" st_status depthwise(const void* x, const void* w, const void* b, void* y, void* stream) {
  st_conv_args a{};
  a.policy = ST_POLICY_BF16;
  a.spatial_dims = 2;
  a.channels_last = 1;
  a.batch = 8;
  a.in_channels = a.out_channels = a.groups = 96;
  a.in_size[0] = a.in_size[1] = 56;
  a.kernel_size[0] = a.kernel_size[1] = 3;
  a.stride[0] = a.stride[1] = 1;
  a.padding[0] = a.padding[1] = 1;
  a.dilation[0] = a.dilation[1] = 1;
  a.x = x; a.x_dtype = ST_BFLOAT16;
  a.w = w; a.w_dtype = ST_BFLOAT16;
  a.bias = b; a.bias_dtype = ST_BFLOAT16;
  a.y = y; a.y_dtype = ST_BFLOAT16;
  a.activation = ST_ACT_RELU;
  int64_t out[ST_CONV_MAX_SPATIAL];
  const st_status s = st_conv_output_size(&a, out);
  if (s != ST_OK) return s;
  return st_conv(&a, stream);
}
"""


def test_program_calling_st_conv_compiles_and_links(nvcc, tmp_path):
    src = tmp_path / "conv_program.cu"
    src.write_text(CONV_PROGRAM)
    so = tmp_path / "conv_program.so"
    cmd = [nvcc, "-arch=sm_90", "-std=c++17", "-O2", f"-I{stitchcuda.INCLUDE_DIR}", "-shared", "-Xcompiler", "-fPIC",
           str(src), f"-L{stitchcuda.LIB_DIR}", "-lstitchrt", "-o", str(so)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"nvcc failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}"
    syms = subprocess.run(["nm", "-D", "--undefined-only", str(so)], capture_output=True, text=True).stdout
    assert "st_conv" in syms and "st_conv_output_size" in syms
