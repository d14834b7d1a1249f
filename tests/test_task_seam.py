"""The task seam: a task's contract, a hand-written body in place of the template's through
``code(..., overrides=...)``, checked alone by ``check_task`` (compiled here; run on the GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitchcuda import frontend
from stitchcuda import plan as P
from stitchcuda.check import check_task
from stitchcuda.code import CodeError, Override, code, contract

REPO = Path(__file__).resolve().parents[1]
BODY = (REPO / "tests" / "fixtures" / "bodies" / "mlp_linear_2_naive.cu").read_text()


@pytest.fixture(scope="module")
def mlp():
    cap = frontend.capture_reference(frontend.load_reference(REPO / "models" / "mlp.py"), device="meta")
    return cap.graph, P.plan(cap.graph, "fp32")


def test_contract_names_every_pointer(mlp):
    graph, plan = mlp
    c = contract(plan, "linear_2")
    assert c.signature == ("st_status linear_2(const float* a, const float* b, const float* bias, float* out, "
                           "cudaStream_t stream)")
    roles = {p.name: (p.role, p.shape, p.strides, p.buffer_kind) for p in c.params}
    assert roles["a"] == ("in", (256, 1024), (1024, 1), "arena")
    assert roles["b"] == ("in", (1024, 256), (1, 1024), "weight")  # W^T, read through its transpose
    assert roles["out"] == ("out", (256, 256), (256, 1), "output")
    assert c.covers == ("linear_2",) and not c.aliases
    text = c.describe()
    assert c.signature in text and "weight fc3.weight" in text and "linear_2" in text


def test_override_replaces_the_template_body(mlp):
    graph, plan = mlp
    src = code(plan, graph, overrides={"linear_2": Override(BODY, "hand")})
    text = src.program_cu
    assert "linear_2_naive<<<" in text and "namespace linear_2_impl {" in text
    assert "using linear_2_impl::linear_2;" in text
    # The other tasks keep the template's body; the manifest says where each body came from.
    assert text.count("st_gemm_args g{}") == 2  # the two template GEMMs; linear_2 has none
    origins = {t.name: t.origin for t in src.manifest.tasks}
    assert origins == {"linear_relu": "template", "linear_1_relu_1": "template", "linear_2": "override: hand"}
    assert "1 task body from overrides" in src.manifest.generator


def test_override_that_does_not_define_the_function_is_refused(mlp):
    graph, plan = mlp
    with pytest.raises(CodeError, match="does not define its function"):
        code(plan, graph, overrides={"linear_2": "st_status linear_3(const float* a) { return ST_OK; }"})
    with pytest.raises(CodeError, match="no such task"):
        code(plan, graph, overrides={"nope": BODY})


def test_check_task_compiles_the_body_and_refuses_to_call_it_passed_without_a_gpu(mlp, nvcc):
    graph, plan = mlp
    r = check_task(plan, "linear_2", BODY, graph=graph, device="cpu")
    assert not r.ok and not r.ran and r.stage == "build" and "not run" in r.reason, r
    broken = BODY.replace("acc + bias[j]", "acc + bias[j] +")
    r = check_task(plan, "linear_2", broken, graph=graph, device="cpu")
    assert not r.ok and r.stage == "build" and "error" in r.compile_output, r
    r = check_task(plan, "linear_2", "st_status linear_2(int) { return ST_OK; }", graph=graph, device="cpu")
    assert not r.ok and r.stage == "contract", r


def test_check_task_applies_the_static_rules(mlp):
    graph, plan = mlp
    cheat = "#include <dlfcn.h>\n" + BODY.replace("linear_2_naive<<<", "(void)dlopen(\"libtorch.so\", 0);\n  linear_2_naive<<<")
    r = check_task(plan, "linear_2", cheat, graph=graph, device="cpu")
    assert not r.ok and r.stage == "static" and "dynamic-loading" in r.reason, r


def test_interpreter_state_around_a_task_is_what_the_body_reads(mlp):
    """The inputs check_task hands a body, and the outputs it compares with, are the plan
    interpreter's: an fp32 emulation of the hand-written body matches them within tolerance."""
    import torch

    from stitchcuda.check.interp import Simulator
    from stitchcuda.check.task import _view, random_values

    graph, plan = mlp
    weights = random_values(graph.weights, 3, scale_by_fan_in=True)
    inputs = list(random_values(graph.inputs, 4).values())
    sim = Simulator(plan)
    sim.create(weights)
    before, after = sim.around("linear_2", inputs, weights)
    p = {q.name: q for q in contract(plan, "linear_2").params}
    a, b, bias = (_view(before.bufs[p[k].buffer], p[k]) for k in ("a", "b", "bias"))
    want = _view(after.bufs[p["out"].buffer], p["out"]).double()
    assert torch.allclose((a.double() @ b.double() + bias.double()), want, rtol=1e-6, atol=1e-7)  # stored as fp32
    got = (a @ b + bias).double()  # fp32, as the body computes it
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
