"""The op registry: one entry adds an op to every stage (capture, plan, code, interpreter)."""

from __future__ import annotations

import torch
import pytest

from stitchcuda import build, frontend, ops
from stitchcuda import plan as P
from stitchcuda.check import check_plan_semantics
from stitchcuda.code import code
from stitchcuda.ops.registry import Domain

SOURCE = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 48)

    def forward(self, x):
        return torch.atan(self.fc(x)) * 2.0

def get_inputs():
    return [torch.randn(32, 64)]

def get_init_inputs():
    return []
'''


def _atan():
    ops.elementwise("atan", "atanf({0})", lambda x: torch.atan(x), domain=Domain(-50.0, 50.0))


def test_without_the_entry_the_op_is_named_unsupported():
    assert "aten.atan.default" not in ops.supported()
    with pytest.raises(frontend.UnsupportedOpError, match="aten.atan.default"):
        frontend.capture_reference(frontend.load_reference(SOURCE, name="atan_net"), device="meta")


def test_one_entry_adds_an_op_to_every_stage(nvcc):
    with ops.registered(_atan):
        ref = frontend.load_reference(SOURCE, name="atan_net")
        cap = frontend.capture_reference(ref, device="cpu", seed=0)  # the frontend's support check reads the registry
        assert "aten.atan.default" in cap.graph.ops()
        plan = P.plan(cap.graph, "fp32")  # the planner groups it with the scale after it
        ew = [t for t in plan.tasks if isinstance(t.params, P.EwSpec)]
        assert [i.op for t in ew for i in t.params.instrs] == ["atan", "mul"]
        ok, err = check_plan_semantics(plan, cap.graph, cap.weights)  # the interpreter evaluates its reference
        assert ok and err < 1e-5, err
        src = code(plan, cap.graph, cap.weights)  # the Coder spells its C expression ...
        assert "atanf(" in src.program_cu
        res = build.build(src.program_cu, arch="sm_90")  # ... and nvcc compiles the program
        assert res.ok, res.message
    assert "aten.atan.default" not in ops.supported()  # gone again after the block


def test_registry_tables_are_consistent():
    for name, e in ops.ATEN.items():
        assert e.kind in ops.registry.KINDS, name
        if e.kind == "elementwise":
            assert e.lower is not None, name
            if isinstance(e.lower, str):
                assert e.lower in ops.INSTRS, name
    for name, i in ops.INSTRS.items():
        assert i.c.count("{") >= 1 or name == "const", name
        if i.epilogue:
            assert i.epilogue in ops.EPILOGUES, name
