"""GPU twin of tests/test_op_harness.py: every registry instruction through the real elementwise
template (stitch::launch_elementwise, vectorised and scalar paths) on the device, for each storage
dtype, against the same PyTorch reference and the same cases — and equal to the host result."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from stitchcuda import ops
from stitchcuda.check import harness as H

pytestmark = pytest.mark.gpu
SEED = 20261122


@pytest.fixture(scope="module")
def harnesses():
    print(f"building the op harness for {', '.join(H.DTYPES)} (one library each, in parallel)", flush=True)
    with ThreadPoolExecutor(len(H.DTYPES)) as pool:
        built = dict(zip(H.DTYPES, pool.map(lambda d: H.Harness(device=(d,)), H.DTYPES)))
    return built


@pytest.mark.parametrize("dtype", H.DTYPES)
@pytest.mark.parametrize("name", sorted(ops.INSTRS))
def test_instruction_on_the_device(harnesses, name, dtype):
    h = harnesses[dtype]
    i = ops.instr(name)
    for n in (4096, 4093):  # a multiple of every vector width, and not (the scalar tail)
        c = H.cases(i, dtype, n=n, seed=SEED)
        got = h.device(i, c)
        ok, why = H.compare(got, H.reference(i, c), dtype)
        assert ok, f"{name} ({dtype}, n={n}, seed {SEED}) on the device: {why}"
        ok, why = H.compare(got, h.host(i, c), dtype)
        assert ok, f"{name} ({dtype}, n={n}): device and host differ: {why}"
