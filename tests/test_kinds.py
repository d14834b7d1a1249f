"""Task kinds and the planner's passes, each alone, on hand-made inputs (CPU only).

* the registry (:mod:`stitchcuda.kinds`): one kind per spec, every proto lowered by exactly one
  kind, claim rules in a total order per stage, the fields a kind says it writes are views of its
  spec, every kind's spec survives a JSON round trip by its tag;
* *match*, *fuse*, *schedule* and *lower* run on graphs and protos built here by hand (no capture),
  each pass checked by what it alone must give: frozen values in and out, nothing mutated.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest

from stitchcuda import kinds
from stitchcuda import layout as L
from stitchcuda import plan as P
from stitchcuda.device import DEFAULT
from stitchcuda.ir import Graph, Node, TensorSpec
from stitchcuda.kinds.copy import CopySpec
from stitchcuda.kinds.elementwise import EwProto
from stitchcuda.kinds.gemm import GemmProto
from stitchcuda.kinds.row import RowProto
from stitchcuda.layout import View
from stitchcuda.plan import buffers as B
from stitchcuda.plan import place as PL
from stitchcuda.plan import schedule as S
from stitchcuda.plan.constraints import Constraints
from stitchcuda.plan.fuse import fuse
from stitchcuda.plan.fused import Fused
from stitchcuda.plan.graph import GraphIndex
from stitchcuda.plan.lower import lower
from stitchcuda.plan.match import match
from stitchcuda.serial import from_jsonable, to_jsonable

A = "aten."


def _t(name: str, *shape: int, dtype: str = "float32") -> TensorSpec:
    return TensorSpec(name, tuple(shape), dtype)


def _n(name: str, op: str, ins: tuple[str, ...], out: TensorSpec, **attrs) -> Node:
    return Node(name, A + op, ins, (out,), tuple(attrs.items()))


# ---------------------------------------------------------------------- the registry


def test_every_spec_and_proto_has_exactly_one_kind():
    specs = [k.spec for k in kinds.KINDS]
    assert len(specs) == len(set(specs)), "two kinds share a spec type"
    assert len({k.name for k in kinds.KINDS}) == len(kinds.KINDS)
    protos = [p for k in kinds.KINDS for p, _ in k.lowers]
    assert len(protos) == len(set(protos)), "two kinds lower the same proto type"
    for p in protos:
        assert issubclass(p, kinds.Proto) and dataclasses.is_dataclass(p)
    assert set(typing.get_args(kinds.TaskSpec)) == set(specs)


def test_claim_rules_run_in_a_total_order_per_stage():
    for stage in ("match", "fuse"):
        orders = [r.order for r in kinds.claim_rules(stage)]
        assert orders == sorted(orders) and len(orders) == len(set(orders)), stage
    assert all(r.stage in ("match", "fuse") for k in kinds.KINDS for r in k.claims)


def test_written_and_scratch_fields_are_views_of_the_spec():
    for k in kinds.KINDS:
        hints = typing.get_type_hints(k.spec)
        for f in k.writes | k.scratch:
            assert f in hints, f"{k.name}: {f} is not a field of {k.spec.__name__}"
            assert View in (typing.get_args(hints[f]) or (hints[f],)), f"{k.name}.{f} is not a view"
        assert not (k.writes & k.scratch)
        assert k.spec.JSON_TAG[1] and k.strategy


def test_unknown_specs_and_protos_are_named():
    with pytest.raises(KeyError, match="no task kind has spec int"):
        kinds.of_spec(3)
    with pytest.raises(KeyError, match="no task kind lowers str"):
        kinds.lowering("x")


def test_a_spec_round_trips_through_json_by_its_tag():
    v = L.contiguous("b", (4, 8), "float32")
    w = L.contiguous("c", (4, 8), "float32")
    spec = CopySpec("copy", (kinds.copy.copy_item(v, w),))
    back = from_jsonable(kinds.TaskSpec, to_jsonable(spec))
    assert back == spec and kinds.of_spec(back) is kinds.copy.KIND


# ---------------------------------------------------------------------- match, alone


def _rms_graph() -> Graph:
    """x * rsqrt(mean(x * x, -1, keepdim) + eps) * w, written out node by node."""
    x, w = _t("x", 4, 16), _t("w", 16)
    nodes = (_n("sq", "mul.Tensor", ("x", "x"), _t("sq", 4, 16)),
             _n("mean", "mean.dim", ("sq",), _t("mean", 4, 1), dim=(-1,), keepdim=True),
             _n("add", "add.Tensor", ("mean",), _t("add", 4, 1), other=1e-5),
             _n("rsqrt", "rsqrt.default", ("add",), _t("rsqrt", 4, 1)),
             _n("norm", "mul.Tensor", ("x", "rsqrt"), _t("norm", 4, 16)),
             _n("scaled", "mul.Tensor", ("norm", "w"), _t("scaled", 4, 16)))
    return Graph("rms", (x,), (w,), ("scaled",), nodes)


def test_match_claims_a_written_out_rms_norm_and_freezes_the_index():
    ix = GraphIndex(_rms_graph())
    fused = match(ix, "fp32", Constraints(), DEFAULT)
    assert isinstance(fused, Fused)
    (pr,) = fused.protos
    assert isinstance(pr, RowProto) and pr.op == "rms_norm" and pr.weight == "w" and pr.eps == pytest.approx(1e-5)
    assert set(pr.nodes) == {"sq", "mean", "add", "rsqrt", "norm", "scaled"}
    assert all(fused.claimed[n] == 0 for n in pr.nodes)
    with pytest.raises(AssertionError, match="frozen"):
        ix.insert_node(Node("y", A + "neg.default", ("x",), (_t("y", 4, 16),)), ["x"], 0.0)


def test_match_leaves_a_pattern_broken_by_another_reader_alone():
    g = _rms_graph()
    # the mean is also a graph output: fusing it away would lose it
    g = Graph(g.name, g.inputs, g.weights, ("scaled", "mean"), g.nodes)
    fused = match(GraphIndex(g), "fp32", Constraints(), DEFAULT)
    assert fused.protos == ()


# ---------------------------------------------------------------------- fuse, alone


def _linear_graph() -> Graph:
    """relu(x @ w.T + b) * 2, then its row sums."""
    x, w, b = _t("x", 8, 32), _t("w", 16, 32), _t("b", 16)
    nodes = (_n("lin", "linear.default", ("x", "w", "b"), _t("lin", 8, 16)),
             _n("relu", "relu.default", ("lin",), _t("relu", 8, 16)),
             _n("dbl", "mul.Tensor", ("relu",), _t("dbl", 8, 16), other=2.0),
             _n("rows", "sum.dim_IntList", ("dbl",), _t("rows", 8), dim=(-1,), keepdim=False),
             _n("neg", "neg.default", ("rows",), _t("neg", 8)))
    return Graph("lin", (x,), (w, b), ("neg", "dbl"), nodes)


def test_fuse_puts_every_node_in_a_proto_without_touching_its_input():
    ix = GraphIndex(_linear_graph())
    before = match(ix, "fp32", Constraints(), DEFAULT)
    snapshot = (before.protos, dict(before.claimed))
    fused = fuse(before, Constraints(), DEFAULT)
    assert (before.protos, dict(before.claimed)) == snapshot, "fuse changed its input"
    assert set(fused.claimed) == {n.name for n in ix.g.nodes}
    gemm = next(p for p in fused.protos if isinstance(p, GemmProto))
    assert gemm.nodes == ("lin", "relu", "dbl") and gemm.bias == "b"
    assert [s.kind for s in gemm.steps] == ["op", "scale"]
    row = next(p for p in fused.protos if isinstance(p, RowProto))
    assert row.op == "sum" and row.epi == ("neg",), "the negation after the sum is its epilogue hook"


def test_fuse_keeps_an_unfused_node_apart():
    ix = GraphIndex(_linear_graph())
    c = Constraints(unfuse=("relu",))
    fused = fuse(match(ix, "fp32", c, DEFAULT), c, DEFAULT)
    gemm = next(p for p in fused.protos if isinstance(p, GemmProto))
    assert gemm.nodes == ("lin",)
    owner = fused.protos[fused.claimed["relu"]]
    assert isinstance(owner, EwProto) and owner.nodes[0] == "relu"


# ---------------------------------------------------------------------- schedule and lower, alone


def _two_adds() -> tuple[Fused, B.Alloc, B.Tensors]:
    """y = x + w (a proto whose input exists at create) then z = y * y, protos made by hand."""
    x, w = _t("x", 4, 4), _t("w", 4, 4)
    nodes = (_n("y", "add.Tensor", ("x", "w"), _t("y", 4, 4)),
             _n("z", "mul.Tensor", ("y", "y"), _t("z", 4, 4)))
    g = Graph("adds", (x,), (w,), ("z",), nodes)
    ix = GraphIndex(g).freeze()
    protos = (EwProto("z", ("z",), ("z",), ("y",), members=("z",), root="z", out_shape=(4, 4)),
              EwProto("y", ("y",), ("y",), ("x", "w"), members=("y",), root="y", out_shape=(4, 4)))
    fused = Fused(ix, protos, {"z": 0, "y": 1})
    alloc = B.Alloc(fused)
    alloc.new_buffer("in0", "input", "float32", (4, 4), index=0, source="x")
    alloc.new_buffer("w0", "weight", "float32", (4, 4), index=0, source="w")
    alloc.new_buffer("out0", "output", "float32", (4, 4), index=0, source="z")
    return fused, alloc, B.Tensors(fused)


def test_schedule_orders_producers_first_whatever_the_claim_order():
    fused, _, tensors = _two_adds()
    assert S.order(fused, tensors) == [1, 0]


def test_lower_gives_unique_names_and_what_each_task_touched():
    fused, alloc, tensors = _two_adds()
    views = {"x": L.contiguous("in0", (4, 4), "float32"), "w": L.contiguous("w0", (4, 4), "float32")}
    targets = PL.targets(fused, alloc, tensors, lambda dt: dt)
    lowered = lower(fused, alloc, tensors, targets, S.order(fused, tensors), views)
    names = [t.name for t in lowered.tasks]
    assert names == ["y", "z"] and set(lowered.touched) == set(names)
    assert {"x", "w", "y"} <= lowered.touched["y"]
    z = lowered.tasks[1]
    assert z.outputs == ("out0",), "the last task writes the graph output in place"
    assert z.strategy == "elementwise_kernel" and z.params.instrs[0].op == "mul"


def test_lowering_names_repeated_task_names_apart():
    fused, alloc, tensors = _two_adds()
    protos = tuple(dataclasses.replace(p, name="same") for p in fused.protos)
    fused = dataclasses.replace(fused, protos=protos)
    views = {"x": L.contiguous("in0", (4, 4), "float32"), "w": L.contiguous("w0", (4, 4), "float32")}
    lowered = lower(fused, alloc, tensors, PL.targets(fused, alloc, tensors, lambda dt: dt),
                    S.order(fused, tensors), views)
    assert [t.name for t in lowered.tasks] == ["same", "same_1"]


def test_the_whole_planner_is_the_passes_in_order():
    plan = P.plan(_linear_graph(), "tf32")
    assert [t.strategy for t in plan.tasks] == ["cublaslt_gemm", "reduction_template"]
    assert plan.tasks[0].params.policy == "tf32" and plan.tasks[0].params.epilogue == "bias_relu"
