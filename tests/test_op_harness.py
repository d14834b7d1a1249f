"""Every elementwise instruction of the op registry, compiled by nvcc for the host (the very C++
expression generated programs contain) and checked against its PyTorch reference: across its
domain, at the IEEE edges, for each storage dtype. The GPU twin runs the same cases through the
real elementwise template (tests/gpu/test_op_harness_gpu.py)."""

from __future__ import annotations

import pytest

from stitchcuda import ops
from stitchcuda.check import harness as H

SEED = 20261122


@pytest.fixture(scope="module")
def harness(nvcc):
    return H.Harness()


@pytest.mark.parametrize("dtype", H.DTYPES)
@pytest.mark.parametrize("name", sorted(ops.INSTRS))
def test_instruction_matches_its_reference(harness, name, dtype):
    i = ops.instr(name)
    c = H.cases(i, dtype, seed=SEED)
    ok, why = H.compare(harness.host(i, c), H.reference(i, c), dtype)
    assert ok, f"{name} ({dtype}, seed {SEED}): {why}"


def test_a_wrong_rendering_is_caught(nvcc):
    """The harness fails on a wrong expression (the check can fail)."""
    good = ops.instr("silu")
    bad = ops.registry.Instr("silu", 1, "{0} / (1.f + expf({0}))", good.ref, domain=good.domain)  # sign dropped
    h = H.Harness([bad])
    c = H.cases(bad, "float32", seed=SEED)
    ok, why = H.compare(h.host(bad, c), H.reference(good, c), "float32")
    assert not ok and "wrong" in why


def test_every_instruction_is_in_the_harness():
    src = H.source()
    for name in ops.INSTRS:
        assert f"struct Op_{H._ident(name)} " in src, name


def test_the_device_entry_compiles_for_the_op_of_most_operands(nvcc):
    """The GPU twin's entry passes every operand of the widest op (elu with scale and input scale
    takes four; a fixed three-pointer entry left the whole device harness uncompilable). Built
    for the device from two ops only: the full registry takes minutes of nvcc."""
    widest = max(ops.INSTRS.values(), key=lambda i: i.arity)
    assert widest.arity >= 4
    h = H.Harness([widest, ops.instr("silu")], device=("float32",))
    assert h.most == widest.arity and hasattr(h.lib, "st_op_float32")
