"""The graph IR every stage after capture works on.

A :class:`Graph` is a straight-line program over tensors with static shapes: named
inputs, named weights, and nodes in execution order, each one ATen operator applied to
earlier tensors. It is plain data — frozen dataclasses, no PyTorch — so the planner, the
coder and the tests can build, read and compare graphs without importing torch, and a
graph survives a JSON round trip unchanged.

Naming contract
---------------
* Every tensor has one name, unique in the graph: an input's name, a weight's name (its
  ``state_dict`` key, e.g. ``"fc.weight"``, which is also its key in the weights file), or
  a node output's name.
* A node with one output names it after the node (``"addmm"``). A node with several
  outputs (``native_layer_norm``, ``split_with_sizes``, ...) names output ``i``
  ``"<node>.<i>"``; every output is listed, used or not, so shapes stay visible.
* ``Node.op`` is the ATen overload, spelled as PyTorch prints it:
  ``"aten.addmm.default"``, ``"aten.add.Tensor"``.

Operands contract
-----------------
The operator's schema decides what goes where:

* ``Node.inputs`` holds the graph tensors passed to the operator, in schema order; a
  ``Tensor[]`` argument (``cat``, ``stack``) contributes all of its tensors there.
* ``Node.attrs`` holds every other argument by its schema name, defaults included:
  scalars, int lists (as tuples), strings, dtypes (as dtype names), and ``None`` for an
  optional tensor argument that was not given. A Python number passed where the schema
  says ``Tensor`` (``aten.mul.Tensor(x, 2.0)``) is an attr too, under that argument's name.
  Device, layout and pin-memory arguments are dropped: a program runs on one device.
* ``Node.source`` says where in the reference the node came from: module path, module
  type, file and line, and the line's code.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from .dtypes import SIZES

SCHEMA = "stitchcuda.ir/1"

#: Bytes per element of every dtype the IR knows (:mod:`stitchcuda.dtypes`).
DTYPE_SIZES: dict[str, int] = SIZES

AttrValue = Any  # None | bool | int | float | str | tuple[AttrValue, ...]


def _freeze_value(value: Any, where: str) -> AttrValue:
    """Turn lists into tuples, recursively, and refuse anything that is not plain data."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_freeze_value(v, where) for v in value)
    raise TypeError(f"{where}: attribute value {value!r} of type {type(value).__name__} is not plain data")


def _freeze_attrs(attrs: Any, where: str) -> tuple[tuple[str, AttrValue], ...]:
    items = attrs.items() if isinstance(attrs, Mapping) else attrs
    out = []
    for item in items:
        key, value = item
        if not isinstance(key, str):
            raise TypeError(f"{where}: attribute key {key!r} is not a string")
        out.append((key, _freeze_value(value, f"{where}.{key}")))
    keys = [k for k, _ in out]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{where}: duplicate attribute keys in {keys}")
    return tuple(out)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's name, static shape and dtype name (``"float32"``, ``"bool"``, ...)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.dtype not in DTYPE_SIZES:
            raise ValueError(f"tensor {self.name!r}: unknown dtype {self.dtype!r}")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZES[self.dtype]

    def type_str(self) -> str:
        """``float32[4,64]``; a scalar tensor prints as ``float32[]``."""
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TensorSpec":
        return cls(d["name"], tuple(d["shape"]), d["dtype"])


@dataclass(frozen=True)
class Node:
    """One ATen operator application; see the module docstring for the operand contract."""

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[TensorSpec, ...]
    attrs: tuple[tuple[str, AttrValue], ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "attrs", _freeze_attrs(self.attrs, f"node {self.name}"))

    def attr(self, key: str, default: Any = None) -> AttrValue:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    def has_attr(self, key: str) -> bool:
        return any(k == key for k, _ in self.attrs)

    def scalar(self, key: str) -> float | None:
        """A numeric attribute as a float (bools as 0/1), or None."""
        v = self.attr(key)
        if isinstance(v, bool):
            return float(v)
        if isinstance(v, (int, float)):
            return float(v)
        return None

    @property
    def attrs_dict(self) -> dict[str, AttrValue]:
        return dict(self.attrs)

    @property
    def output(self) -> TensorSpec:
        """The only output; an error for a multi-output node."""
        if len(self.outputs) != 1:
            raise ValueError(f"node {self.name} ({self.op}) has {len(self.outputs)} outputs")
        return self.outputs[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "op": self.op,
            "inputs": list(self.inputs),
            "outputs": [o.to_dict() for o in self.outputs],
            "attrs": [[k, _encode_value(v)] for k, v in self.attrs],
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Node":
        return cls(
            name=d["name"],
            op=d["op"],
            inputs=tuple(d["inputs"]),
            outputs=tuple(TensorSpec.from_dict(o) for o in d["outputs"]),
            attrs=tuple((k, _decode_value(v)) for k, v in d["attrs"]),
            source=d.get("source", ""),
        )


@dataclass(frozen=True)
class LiftedRandom:
    """A random tensor the reference drew inside ``forward``, now a program input.

    ``input`` names the graph input that replaces the draw; ``op`` is the ATen operator
    that drew it; ``distribution`` is one of ``uniform`` (params ``low``, ``high``),
    ``normal`` (``mean``, ``std``), ``bernoulli`` (``p``: probability of a one/True),
    ``randint`` (``low``, ``high``, exclusive), ``permutation`` (``n``) and
    ``exponential`` (``lambd``). Entries are in the order the reference drew them.
    """

    input: str
    op: str
    shape: tuple[int, ...]
    dtype: str
    distribution: str
    params: tuple[tuple[str, AttrValue], ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "params", _freeze_attrs(self.params, f"random {self.input}"))

    def param(self, key: str, default: Any = None) -> AttrValue:
        return dict(self.params).get(key, default)

    def describe(self) -> str:
        params = ", ".join(f"{k}={_format_value(v)}" for k, v in self.params)
        return f"{self.distribution}({params})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "op": self.op,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "distribution": self.distribution,
            "params": [[k, _encode_value(v)] for k, v in self.params],
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LiftedRandom":
        return cls(
            input=d["input"],
            op=d["op"],
            shape=tuple(d["shape"]),
            dtype=d["dtype"],
            distribution=d["distribution"],
            params=tuple((k, _decode_value(v)) for k, v in d["params"]),
            source=d.get("source", ""),
        )


@dataclass(frozen=True)
class Graph:
    """A captured reference program.

    ``inputs`` are the program's tensor inputs in call order: the reference's own tensor
    arguments first, then one per lifted random draw (see ``lifted_random``). ``weights``
    are parameters, buffers and tensor constants, by ``state_dict`` key. ``outputs`` names
    the tensors returned, in order (a name may repeat, and may be an input or a weight).
    ``nodes`` are in a valid execution order. Construction checks that every name is
    defined once and before use.
    """

    name: str
    inputs: tuple[TensorSpec, ...]
    weights: tuple[TensorSpec, ...]
    outputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    lifted_random: tuple[LiftedRandom, ...] = ()
    _specs: dict[str, TensorSpec] = field(init=False, repr=False, compare=False, hash=False)
    _producers: dict[str, Node] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        for attr in ("inputs", "weights", "outputs", "nodes", "lifted_random"):
            object.__setattr__(self, attr, tuple(getattr(self, attr)))
        specs: dict[str, TensorSpec] = {}

        def define(spec: TensorSpec, what: str) -> None:
            if spec.name in specs:
                raise ValueError(f"graph {self.name}: {what} {spec.name!r} is defined twice")
            specs[spec.name] = spec

        for s in self.inputs:
            define(s, "input")
        for s in self.weights:
            define(s, "weight")
        node_names: set[str] = set()
        producers: dict[str, Node] = {}
        for node in self.nodes:
            if node.name in node_names:
                raise ValueError(f"graph {self.name}: node name {node.name!r} is used twice")
            node_names.add(node.name)
            for name in node.inputs:
                if name not in specs:
                    raise ValueError(f"graph {self.name}: node {node.name} reads {name!r} before it is defined")
            for s in node.outputs:
                define(s, f"output of node {node.name}:")
                producers[s.name] = node
        for name in self.outputs:
            if name not in specs:
                raise ValueError(f"graph {self.name}: output {name!r} is not defined")
        input_names = {s.name for s in self.inputs}
        for r in self.lifted_random:
            if r.input not in input_names:
                raise ValueError(f"graph {self.name}: lifted random input {r.input!r} is not a graph input")
        object.__setattr__(self, "_specs", specs)
        object.__setattr__(self, "_producers", producers)

    # -- queries --------------------------------------------------------------------

    def spec(self, name: str) -> TensorSpec:
        """The spec of any tensor of the graph (input, weight or node output)."""
        try:
            return self._specs[name]
        except KeyError:
            raise KeyError(f"graph {self.name} has no tensor {name!r}") from None

    @property
    def user_inputs(self) -> tuple[TensorSpec, ...]:
        """The reference's own tensor arguments (inputs that are not lifted random draws)."""
        lifted = {r.input for r in self.lifted_random}
        return tuple(s for s in self.inputs if s.name not in lifted)

    @property
    def output_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(self.spec(n) for n in self.outputs)

    def ops(self) -> set[str]:
        return {n.op for n in self.nodes}

    def producer(self, name: str) -> Node | None:
        """The node that defines tensor ``name``, or None for inputs and weights."""
        if name not in self._specs:
            raise KeyError(f"graph {self.name} has no tensor {name!r}")
        return self._producers.get(name)

    def users(self, name: str) -> Iterator[Node]:
        return (n for n in self.nodes if name in n.inputs)

    # -- serialisation ----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "name": self.name,
            "inputs": [s.to_dict() for s in self.inputs],
            "weights": [s.to_dict() for s in self.weights],
            "outputs": list(self.outputs),
            "nodes": [n.to_dict() for n in self.nodes],
            "lifted_random": [r.to_dict() for r in self.lifted_random],
        }

    def to_json(self, indent: int | None = 1) -> str:
        """Strict JSON (no NaN/Infinity literals: non-finite floats are encoded)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Graph":
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} graph (schema={d.get('schema')!r})")
        return cls(
            name=d["name"],
            inputs=tuple(TensorSpec.from_dict(s) for s in d["inputs"]),
            weights=tuple(TensorSpec.from_dict(s) for s in d["weights"]),
            outputs=tuple(d["outputs"]),
            nodes=tuple(Node.from_dict(n) for n in d["nodes"]),
            lifted_random=tuple(LiftedRandom.from_dict(r) for r in d.get("lifted_random", ())),
        )

    @classmethod
    def from_json(cls, text: str) -> "Graph":
        return cls.from_dict(json.loads(text))

    # -- text -------------------------------------------------------------------------

    def __str__(self) -> str:
        """A readable listing: header, weights, random draws, one line per node, return."""
        lines = [f"graph {self.name}({', '.join(f'%{s.name}: {s.type_str()}' for s in self.user_inputs)})"]
        for s in self.weights:
            lines.append(f"  weight %{s.name}: {s.type_str()}")
        for r in self.lifted_random:
            spec = self.spec(r.input)
            lines.append(f"  random %{r.input}: {spec.type_str()} ~ {r.describe()}  # {r.op}; {r.source}".rstrip())
        for node in self.nodes:
            lines.append("  " + format_node(node))
        lines.append(f"  return ({', '.join('%' + n for n in self.outputs)})")
        return "\n".join(lines)


def format_node(node: Node) -> str:
    """``%name = op(%a, %b, key=value) : dtype[shape]  # source``."""
    args = [f"%{n}" for n in node.inputs] + [f"{k}={_format_value(v)}" for k, v in node.attrs]
    if len(node.outputs) == 1 and node.outputs[0].name == node.name:
        types = node.outputs[0].type_str()
    else:
        types = "(" + ", ".join(o.type_str() for o in node.outputs) + ")"
    text = f"%{node.name} = {node.op}({', '.join(args)}) : {types}"
    return f"{text}  # {node.source}" if node.source else text


def _format_value(v: AttrValue) -> str:
    if isinstance(v, tuple):
        return "[" + ", ".join(_format_value(x) for x in v) + "]"
    return repr(v)


def _encode_value(v: AttrValue) -> Any:
    """JSON form of an attr value: tuples become lists; inf/nan become {"float": "..."}."""
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": repr(v)}  # 'inf', '-inf', 'nan'
    if isinstance(v, tuple):
        return [_encode_value(x) for x in v]
    return v


def _decode_value(v: Any) -> AttrValue:
    if isinstance(v, dict):
        if set(v) != {"float"}:
            raise ValueError(f"unknown encoded attribute value {v!r}")
        return float(v["float"])
    if isinstance(v, list):
        return tuple(_decode_value(x) for x in v)
    return v


__all__ = [
    "SCHEMA",
    "DTYPE_SIZES",
    "TensorSpec",
    "Node",
    "LiftedRandom",
    "Graph",
    "format_node",
]
