"""The graph IR: construction checks, queries, text listing and the JSON round trip.

The IR is plain data, so these tests build graphs by hand and need no PyTorch.
"""

from __future__ import annotations

import json
import math

import pytest

from stitchcuda.ir import DTYPE_SIZES, Graph, LiftedRandom, Node, TensorSpec, format_node


def _attention_like() -> Graph:
    """A small hand-made graph with a multi-output node, -inf, a lifted draw and a weight."""
    x = TensorSpec("x", (2, 8), "float32")
    noise = TensorSpec("randn", (2, 8), "float32")
    w = TensorSpec("fc.weight", (4, 8), "float32")
    b = TensorSpec("fc.bias", (4,), "float32")
    nodes = (
        Node("add", "aten.add.Tensor", ("x", "randn"), (TensorSpec("add", (2, 8), "float32"),), (("alpha", 1),), "model (M), m.py line 3: x + noise"),
        Node("linear", "aten.linear.default", ("add", "fc.weight", "fc.bias"), (TensorSpec("linear", (2, 4), "float32"),), (), "model.fc (Linear), m.py line 4: self.fc(h)"),
        Node(
            "split_with_sizes",
            "aten.split_with_sizes.default",
            ("linear",),
            (TensorSpec("split_with_sizes.0", (2, 2), "float32"), TensorSpec("split_with_sizes.1", (2, 2), "float32")),
            {"split_sizes": [2, 2], "dim": 1},
        ),
        Node("eq", "aten.eq.Scalar", ("split_with_sizes.0",), (TensorSpec("eq", (2, 2), "bool"),), (("other", 0),)),
        Node("scalar_tensor", "aten.scalar_tensor.default", (), (TensorSpec("scalar_tensor", (), "float32"),), (("s", -math.inf), ("dtype", "float32"))),
        Node("where", "aten.where.self", ("eq", "scalar_tensor", "split_with_sizes.1"), (TensorSpec("where", (2, 2), "float32"),)),
    )
    return Graph(
        name="tiny",
        inputs=(x, noise),
        weights=(w, b),
        outputs=("where", "split_with_sizes.0"),
        nodes=nodes,
        lifted_random=(
            LiftedRandom("randn", "aten.randn.default", (2, 8), "float32", "normal", (("mean", 0.0), ("std", 1.0)), "m.py line 2"),
        ),
    )


def test_json_round_trip_is_exact_and_strict():
    g = _attention_like()
    text = g.to_json()
    assert "Infinity" not in text  # strict JSON: -inf is encoded, not a bare literal
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    back = Graph.from_json(text)
    assert back == g
    assert back.nodes[4].attr("s") == -math.inf
    assert back.nodes[2].attr("split_sizes") == (2, 2)  # lists come back as tuples
    assert back.lifted_random[0].param("std") == 1.0
    assert back.to_json() == text


def test_nan_attribute_round_trips():
    g = Graph("n", (TensorSpec("x", (1,), "float32"),), (), ("y",), (Node("y", "aten.add.Tensor", ("x",), (TensorSpec("y", (1,), "float32"),), (("other", math.nan),)),))
    assert math.isnan(Graph.from_json(g.to_json()).nodes[0].attr("other"))


def test_text_listing_has_one_line_per_node():
    g = _attention_like()
    text = str(g)
    lines = text.splitlines()
    assert lines[0] == "graph tiny(%x: float32[2,8])"
    assert "  weight %fc.weight: float32[4,8]" in lines
    assert any(line.startswith("  random %randn: float32[2,8] ~ normal(mean=0.0, std=1.0)") for line in lines)
    assert "  %linear = aten.linear.default(%add, %fc.weight, %fc.bias) : float32[2,4]  # model.fc (Linear), m.py line 4: self.fc(h)" in lines
    assert "  %split_with_sizes = aten.split_with_sizes.default(%linear, split_sizes=[2, 2], dim=1) : (float32[2,2], float32[2,2])" in lines
    assert "  %scalar_tensor = aten.scalar_tensor.default(s=-inf, dtype='float32') : float32[]" in lines
    assert lines[-1] == "  return (%where, %split_with_sizes.0)"
    assert sum(1 for line in lines if " = aten." in line) == len(g.nodes)


def test_queries():
    g = _attention_like()
    assert g.spec("split_with_sizes.1").shape == (2, 2)
    assert g.spec("fc.bias").nbytes == 16
    assert g.producer("eq").op == "aten.eq.Scalar"
    assert g.producer("x") is None
    assert [n.name for n in g.users("linear")] == ["split_with_sizes"]
    assert [s.name for s in g.user_inputs] == ["x"]
    assert [s.shape for s in g.output_specs] == [(2, 2), (2, 2)]
    assert g.ops() >= {"aten.linear.default", "aten.where.self"}
    assert g.nodes[2].attrs_dict == {"split_sizes": (2, 2), "dim": 1}
    assert g.nodes[0].output.name == "add"
    with pytest.raises(ValueError):
        g.nodes[2].output
    with pytest.raises(KeyError):
        g.spec("nope")


def test_graph_refuses_bad_wiring():
    x = TensorSpec("x", (2,), "float32")
    y = (TensorSpec("y", (2,), "float32"),)
    with pytest.raises(ValueError, match="before it is defined"):
        Graph("g", (x,), (), ("y",), (Node("y", "aten.relu.default", ("z",), y),))
    with pytest.raises(ValueError, match="defined twice"):
        Graph("g", (x,), (TensorSpec("x", (2,), "float32"),), ("x",), ())
    with pytest.raises(ValueError, match="not defined"):
        Graph("g", (x,), (), ("y",), ())
    with pytest.raises(ValueError, match="not a graph input"):
        Graph("g", (x,), (), ("x",), (), (LiftedRandom("r", "aten.rand.default", (2,), "float32", "uniform"),))
    with pytest.raises(ValueError, match="unknown dtype"):
        TensorSpec("x", (2,), "float33")
    with pytest.raises(TypeError, match="not plain data"):
        Node("y", "aten.relu.default", ("x",), y, (("bad", object()),))


def test_values_are_frozen_and_hashable():
    node = Node("y", "aten.view.default", ["x"], [TensorSpec("y", [2, 3], "float32")], {"size": [2, 3]})
    assert node.inputs == ("x",) and node.outputs[0].shape == (2, 3)
    assert node.attrs == (("size", (2, 3)),)
    hash(node)
    with pytest.raises(AttributeError):
        node.op = "aten.relu.default"  # type: ignore[misc]


def test_format_node_without_source():
    node = Node("r", "aten.relu.default", ("x",), (TensorSpec("r", (3,), "float16"),))
    assert format_node(node) == "%r = aten.relu.default(%x) : float16[3]"


def test_dtype_table_covers_common_dtypes():
    for name in ("float32", "float16", "bfloat16", "float64", "int64", "int32", "bool", "uint8", "int8"):
        assert name in DTYPE_SIZES
