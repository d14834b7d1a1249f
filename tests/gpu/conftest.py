"""Fixtures of the template GPU tests: each harness .so is built once per session and loaded.

tests/conftest.py already skips `gpu` tests when no device is usable; these fixtures also skip
when PyTorch has no CUDA or nvcc is missing, so the module can be run on its own.
"""

from __future__ import annotations

import ctypes

import pytest

from .nvcc_util import find_nvcc, load_harness


@pytest.fixture(scope="session")
def torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    return torch


def _load(name: str, torch) -> ctypes.CDLL:
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    major, minor = torch.cuda.get_device_capability()
    return load_harness(name, arch=f"sm_{major}{minor}")


@pytest.fixture(scope="session")
def reduce_lib(torch_cuda):
    return _load("reduce_harness", torch_cuda)


@pytest.fixture(scope="session")
def ew_lib(torch_cuda):
    return _load("elementwise_harness", torch_cuda)


@pytest.fixture(scope="session")
def attn_lib(torch_cuda):
    return _load("attention_harness", torch_cuda)


@pytest.fixture
def exact_fp32():
    """PyTorch's references in exact fp32 (TF32 off for matmuls and cuDNN) for the test, restored after."""
    import torch

    b = torch.backends
    old = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32)
    b.cuda.matmul.allow_tf32 = b.cudnn.allow_tf32 = False
    yield
    b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 = old
