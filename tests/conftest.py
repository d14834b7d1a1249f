"""Test tiers: plain tests run anywhere (CI has no GPU); `gpu` tests need a CUDA device."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("STITCHCUDA_SHARED") or REPO.parent / "shared")
DEV_SET = SHARED / "kernelbench" / "dev.jsonl"


def _gpu_available() -> bool:
    if os.environ.get("STITCHCUDA_FORCE_NO_GPU") == "1":
        return False
    try:
        import stitchcuda
    except ImportError:
        return False
    return stitchcuda.has_gpu()


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def find_nvcc() -> str | None:
    """nvcc as the package finds it (stitchcuda.toolchain.find_nvcc)."""
    from stitchcuda.toolchain import find_nvcc as _find

    found = _find()
    return str(found) if found else None


@pytest.fixture(scope="session")
def nvcc() -> str:
    path = find_nvcc()
    if path is None:
        pytest.skip("nvcc not found")
    return path


@pytest.fixture(scope="session")
def dev_set_path() -> Path:
    if not DEV_SET.is_file():
        pytest.skip("KernelBench dev set not present beside the checkout")
    return DEV_SET
