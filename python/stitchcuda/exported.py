"""Capture, step 3: a decomposed ``ExportedProgram`` walked once into a :class:`~stitchcuda.ir.Graph`.

:func:`to_graph` turns every call of the exported graph into a :class:`~stitchcuda.ir.Node`
(operator, operands, attributes, and a ``source`` from ``nn_module_stack`` and ``stack_trace``:
:func:`node_source`), lifts each random draw to a program input recorded in
``Graph.lifted_random``, turns tensors the forward creates with one value into ``full`` nodes,
drops buffer mutations and removes dead nodes. Operators it cannot represent are collected and
raised together as one :class:`~stitchcuda.aten.UnsupportedOpError`.
:mod:`stitchcuda.frontend` runs ``torch.export`` and calls it; see its docstring for the stage
as a whole (decompositions, random draws, state).
"""

from __future__ import annotations

import operator
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.fx
from torch.export.graph_signature import InputKind, OutputKind

from . import aten
from .aten import _DROPPED_ARGS, _TORCH_DIR, UnsupportedOp, UnsupportedOpError, arg_kind, op_name
from .ir import DTYPE_SIZES, Graph, LiftedRandom, Node, TensorSpec
from .reference import CaptureError


def to_graph(exported: Any, name: str) -> tuple[Graph, dict[str, torch.Tensor]]:
    """The Graph of a decomposed ExportedProgram and its weights by name (tensors of the kind
    the model was exported with: meta tensors after a meta export)."""
    return _Converter(exported, name).convert()


# Random operators lifted to inputs: packet -> (distribution, {param: (argument, default)}).
# The first tensor argument of each is only a template for shape and dtype.
_RANDOM_OPS: dict[str, tuple[str, dict[str, tuple[str | None, Any]]]] = {
    "aten::rand": ("uniform", {"low": (None, 0.0), "high": (None, 1.0)}),
    "aten::rand_like": ("uniform", {"low": (None, 0.0), "high": (None, 1.0)}),
    "aten::uniform": ("uniform", {"low": ("from", 0.0), "high": ("to", 1.0)}),
    "aten::randn": ("normal", {"mean": (None, 0.0), "std": (None, 1.0)}),
    "aten::randn_like": ("normal", {"mean": (None, 0.0), "std": (None, 1.0)}),
    "aten::normal": ("normal", {"mean": ("mean", 0.0), "std": ("std", 1.0)}),
    "aten::normal_functional": ("normal", {"mean": ("mean", 0.0), "std": ("std", 1.0)}),
    "aten::bernoulli": ("bernoulli", {"p": ("p", None)}),
    "aten::randint": ("randint", {"low": ("low", 0), "high": ("high", None)}),
    "aten::randint_like": ("randint", {"low": ("low", 0), "high": ("high", None)}),
    "aten::randperm": ("permutation", {"n": ("n", None)}),
    "aten::exponential": ("exponential", {"lambd": ("lambd", 1.0)}),
}


def _draws(op: torch._ops.OpOverload, fx: torch.fx.Node) -> bool:
    """Whether a node of an operator tagged ``nondeterministic_seeded`` really draws.

    Fused attention carries the tag for its dropout; with ``dropout_p == 0`` it is
    deterministic and stays an ordinary node. So do the recurrent operators, for dropout between
    layers, outside training or with ``dropout == 0``.
    """
    names = [a.name for a in op._schema.arguments]
    if "dropout_p" in names:
        bound = {a.name: v for a, v in _bind(op, fx.args, fx.kwargs)}
        return bound["dropout_p"] != 0.0
    if op in aten.recurrent_aten_ops():  # dropout between layers: only while training, only with p > 0
        bound = {a.name: v for a, v in _bind(op, fx.args, fx.kwargs)}
        return bool(bound["train"]) and bound["dropout"] != 0.0 and bound["num_layers"] > 1
    return True


#: Unsigned integers wider than a byte, which the IR lacks, held as int64 (exact for every value):
#: decompositions make them (torch.eye's index ramps are uint16 from 256 rows), user code rarely.
WIDENED = {"uint16": "int64", "uint32": "int64"}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``; raises CaptureError for dtypes the IR lacks."""
    name = str(dtype).removeprefix("torch.")
    name = WIDENED.get(name, name)
    if name not in DTYPE_SIZES:
        raise CaptureError(f"dtype {dtype} is not supported by the IR")
    return name


def short_file(filename: str) -> str:
    return filename if filename.startswith("<") else Path(filename).name


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)\n(?P<code>[^\n]*)')


def node_source(meta: Mapping[str, Any]) -> str:
    """``model.attn.c_attn (Linear), <file> line 35: q, k, v = ...`` for an FX node's meta.

    The module is the innermost entry of ``nn_module_stack``; the line is the last frame
    of ``stack_trace`` outside torch itself, i.e. the reference's own code.
    """
    module = "model"
    stack = meta.get("nn_module_stack") or {}
    if stack:
        path, kind = list(stack.values())[-1]
        path = re.sub(r"^L\['self'\]\.?", "", str(path))
        kind = getattr(kind, "__name__", None) or str(kind).strip("<>'").removeprefix("class '").split(".")[-1]
        module = f"model.{path} ({kind})" if path else f"model ({kind})"
    frames = [m for m in _FRAME.finditer(meta.get("stack_trace") or "")]
    user = [m for m in frames if not m.group("file").startswith(_TORCH_DIR)]
    if not user:
        return module
    frame = user[-1]
    return f"{module}, {short_file(frame.group('file'))} line {frame.group('line')}: {frame.group('code').strip()}"


def _bind(op: torch._ops.OpOverload, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    """(schema argument, value) for every argument, defaults filled in."""
    bound = []
    for i, arg in enumerate(op._schema.arguments):
        if not arg.kwarg_only and i < len(args):
            value = args[i]
        elif arg.name in kwargs:
            value = kwargs[arg.name]
        elif arg.has_default_value():
            value = arg.default_value
        elif arg_kind(arg) == "tensor" and str(arg.type).startswith("Optional"):
            value = None
        else:
            raise CaptureError(f"{op}: argument {arg.name!r} is missing")
        bound.append((arg, value))
    return bound


def _plain(value: Any, where: str) -> Any:
    """An attr value from an FX argument: dtypes by name, lists as tuples."""
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, torch.memory_format):
        return str(value).removeprefix("torch.")
    if isinstance(value, (list, tuple, torch.Size)):
        return tuple(_plain(v, where) for v in value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.fx.Node):
        raise CaptureError(f"{where}: a symbolic value ({value.name}) where a constant was expected; dynamic shapes are not supported")
    raise CaptureError(f"{where}: argument {value!r} of type {type(value).__name__} cannot be stored in the IR")


@dataclass(frozen=True)
class _Ref:
    """A graph tensor, by IR name, in the argument list of a node capture emits itself."""

    name: str


def _holds_ref(value: Any) -> bool:
    return isinstance(value, _Ref) or (isinstance(value, (list, tuple)) and any(_holds_ref(v) for v in value))


class _Converter:
    """Walks a decomposed ExportedProgram once and builds the Graph (see :func:`to_graph`)."""

    def __init__(self, exported: Any, name: str):
        self.ep = exported
        self.name = name
        self.used: set[str] = set()
        self.env: dict[str, Any] = {}  # FX node name -> IR tensor name, or list of them
        self.specs: dict[str, TensorSpec] = {}
        self.nodes: list[Node] = []
        self.lifted: list[LiftedRandom] = []
        self.lifted_specs: list[TensorSpec] = []
        self.unsupported: list[UnsupportedOp] = []

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        return name

    # -- entry ------------------------------------------------------------------------

    def convert(self) -> tuple[Graph, dict[str, torch.Tensor]]:
        sig = self.ep.graph_signature
        fx_nodes = {n.name: n for n in self.ep.graph.nodes}
        state = dict(self.ep.state_dict)
        constants = dict(getattr(self.ep, "constants", {}) or {})

        # Weights first: their names are state_dict keys and must stay as they are.
        weights: list[TensorSpec] = []
        weight_values: dict[str, torch.Tensor] = {}
        user_inputs: list[tuple[str, Any]] = []
        for spec in sig.input_specs:
            arg_name = getattr(spec.arg, "name", None)
            if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                target = spec.target
                value = state[target] if target in state else constants[target]
                self.used.add(target)
                if spec.kind == InputKind.CONSTANT_TENSOR and self._uniform_constant(arg_name, target, value):
                    continue
                self.env[arg_name] = target
                ts = self._spec(target, value)
                weights.append(ts)
                weight_values[target] = value
            elif spec.kind == InputKind.USER_INPUT:
                user_inputs.append((arg_name, fx_nodes.get(arg_name)))
            elif spec.kind == getattr(InputKind, "TOKEN", None):
                continue
            else:
                raise CaptureError(f"{self.name}: export input {arg_name} of kind {spec.kind} is not supported")

        inputs: list[TensorSpec] = []
        for arg_name, fx in user_inputs:
            val = fx.meta.get("val") if fx is not None else None
            if not isinstance(val, torch.Tensor):
                continue  # a Python scalar argument: export has baked its value into the graph
            ir_name = self.fresh(arg_name)
            self.env[arg_name] = ir_name
            inputs.append(self._spec(ir_name, val))

        for fx in self.ep.graph.nodes:
            if fx.op == "call_function":
                self._call(fx)
            elif fx.op == "get_attr":
                self._unsupported(fx, op_name(fx.target) if callable(fx.target) else "get_attr")

        outputs = []
        for spec in sig.output_specs:
            arg_name = getattr(spec.arg, "name", None)  # (for a mutation: the node of the new value)
            where = node_source(fx_nodes[arg_name].meta) if arg_name in fx_nodes else ""
            if spec.kind == OutputKind.BUFFER_MUTATION and spec.target.rsplit(".", 1)[-1] not in RUNNING_STATISTICS:
                # a buffer that forward changes is state kept between calls: a program would keep
                # its first value and answer the second call as the first, so it is refused by name
                self.unsupported.append(UnsupportedOp(
                    "buffer state", spec.target, where,
                    f"forward changes the registered buffer {spec.target!r}, state kept between calls, which is "
                    "not supported yet (a plain tensor attribute, self.x = torch.zeros(...), is: carried between "
                    "calls as an input and an output)"))
                continue
            if spec.kind == OutputKind.USER_INPUT_MUTATION:
                warnings.warn(f"{self.name}: forward changes its input {spec.target!r} in place ({where}); a program "
                              "leaves its inputs as they were and returns forward's results only", stacklevel=2)
                continue
            if spec.kind != OutputKind.USER_OUTPUT:
                continue  # a norm's running statistics (training mode): not program results
            if arg_name not in self.env or not isinstance(self.env[arg_name], str):
                raise CaptureError(f"{self.name}: output {spec.arg} is not a tensor; only tensor outputs are supported")
            outputs.append(self.env[arg_name])

        if self.unsupported:
            raise UnsupportedOpError(self.name, _without_size_checks(self.unsupported))

        nodes = self._live_nodes(outputs)
        read = {i for n in nodes for i in n.inputs} | set(outputs)
        weights = [w for w in weights if w.name in read]
        graph = Graph(
            name=self.name,
            inputs=tuple(inputs + self.lifted_specs),
            weights=tuple(weights),
            outputs=tuple(outputs),
            nodes=tuple(nodes),
            lifted_random=tuple(self.lifted),
        )
        return graph, {w.name: weight_values[w.name] for w in weights}

    def _uniform_constant(self, arg_name: str, target: str, value: torch.Tensor) -> bool:
        """A tensor the forward creates with one value (``torch.tensor(0.5)``, ``torch.ones(n) * c``
        folded by export) becomes a ``full`` node, not a weight: it is no parameter or buffer of
        the model, so a program's weights could not be checked against the reference's."""
        if value.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                               torch.int32, torch.bool) or value.numel() > 1 << 20:
            return False
        flat = value.detach().reshape(-1)
        if flat.numel() and not bool((flat == flat[0]).all()):
            return False
        fill = flat[0].item() if flat.numel() else 0
        name = self.fresh(target.replace(".", "_"))
        self.env[arg_name] = name
        out = self._spec(name, value)
        self.nodes.append(Node(name, "aten.full.default", (), (out,),
                               (("size", tuple(value.shape)), ("fill_value", fill), ("dtype", None)),
                               f"a constant tensor the forward creates ({target})"))
        return True

    # -- nodes ------------------------------------------------------------------------

    def _call(self, fx: torch.fx.Node) -> None:
        if fx.target is operator.getitem:
            parent, index = fx.args
            outputs = self.env[parent.name]
            # An unsupported parent is already reported; its items stand in by name.
            self.env[fx.name] = outputs[index] if isinstance(outputs, list) else fx.name
            return
        val = fx.meta.get("val")
        if val is None and not fx.users:
            return  # runtime assertions (_assert_tensor_metadata, ...): nothing to compute
        op = fx.target
        if not isinstance(op, torch._ops.OpOverload):
            self._unsupported(fx, op_name(op))
            return
        if torch.Tag.nondeterministic_seeded in op.tags and _draws(op, fx):
            self._random(fx, op)
            return
        if not self._is_tensors(val):
            self._unsupported(fx, str(op), "produces a non-tensor value (data-dependent control flow or .item())")
            return
        args = [self._ref_args(a) for a in fx.args]
        kwargs = {k: self._ref_args(v) for k, v in fx.kwargs.items()}
        if op is torch.ops.aten.as_strided.default and _restrides_contiguous(fx):
            op, args, kwargs = torch.ops.aten.alias.default, args[:1], {}
        self.env[fx.name] = self._emit(fx.name, op, args, kwargs, val, node_source(fx.meta))

    def _ref_args(self, value: Any) -> Any:
        """FX argument with graph tensors replaced by _Ref (symbolic scalars left as nodes)."""
        if isinstance(value, torch.fx.Node):
            target = self.env.get(value.name)
            return _Ref(target) if isinstance(target, str) else value
        if isinstance(value, (list, tuple)):
            return type(value)(self._ref_args(v) for v in value)
        return value

    def _emit(self, base: str, op: torch._ops.OpOverload, args: Sequence[Any], kwargs: Mapping[str, Any], val: Any, source: str) -> str | list[str]:
        """Append a node for ``op(*args, **kwargs)``; return its output name(s)."""
        name = self.fresh(base)
        where = f"{self.name}:{name}"
        inputs: list[str] = []
        attrs: list[tuple[str, Any]] = []
        # Two Tensor[] arguments (lstm's hx and params) share Node.inputs: record each list's names.
        lists = sum(arg_kind(a) == "tensor_list" for a in op._schema.arguments) > 1
        bound = list(_bind(op, args, kwargs))
        if self.unsupported and any(arg_kind(a) == "other" and _holds_ref(v) for a, v in bound):
            # A scalar argument that is the value of an operator already reported (``.item()``, a
            # tensor's value used as an index): that operator is the refusal; this node stands in by name.
            return name
        for arg, value in bound:
            kind = arg_kind(arg)
            if arg.name in _DROPPED_ARGS:
                continue
            if kind == "tensor" and isinstance(value, _Ref):
                inputs.append(value.name)
            elif kind == "tensor_list" and isinstance(value, (list, tuple)):
                inputs.extend(v.name for v in value if isinstance(v, _Ref))
                if lists or any(v is None for v in value):  # Tensor?[] with holes: say where they are
                    attrs.append((arg.name, tuple(v.name if isinstance(v, _Ref) else None for v in value)))
            else:
                attrs.append((arg.name, _plain(value, where)))
        vals = list(val) if isinstance(val, (list, tuple)) else [val]
        if any(isinstance(v, torch.Tensor) and not all(isinstance(d, int) for d in v.shape) for v in vals):
            # x[x > 0], nonzero, unique: a result whose size the data decides, refused by name and line
            self.unsupported.append(UnsupportedOp(str(op), name, source, _DATA_SIZED +
                                                  " (a boolean mask's selection, nonzero, unique); a program's shapes "
                                                  "are fixed before it runs"))
            return [f"{name}.{i}" for i in range(len(vals))] if isinstance(val, (list, tuple)) else name
        if isinstance(val, (list, tuple)):
            outputs = tuple(self._spec(f"{name}.{i}", v) for i, v in enumerate(val))
            result: str | list[str] = [o.name for o in outputs]
        else:
            outputs = (self._spec(name, val),)
            result = name
        self.nodes.append(Node(name, str(op), tuple(inputs), outputs, tuple(attrs), source))
        return result

    # -- random draws -----------------------------------------------------------------

    def _random(self, fx: torch.fx.Node, op: torch._ops.OpOverload) -> None:
        source = node_source(fx.meta)
        packet = op._schema.name
        bound = {a.name: v for a, v in _bind(op, fx.args, fx.kwargs)}
        val = fx.meta["val"]

        if packet == "aten::native_dropout":
            self._dropout(fx, op, bound, val, source)
            return
        # bernoulli(probabilities) reads them from self; bernoulli.Tensor from a tensor p.
        probabilities = bound["self"] if packet == "aten::bernoulli" and "p" not in bound else bound.get("p")
        if packet == "aten::bernoulli" and isinstance(probabilities, torch.fx.Node):
            # Lift a uniform draw u instead, and bernoulli = (u < p), as PyTorch decomposes it.
            p = probabilities
            u = self._lift(fx.name + "_uniform", str(op), tuple(val.shape), dtype_name(val.dtype), "uniform", {"low": 0.0, "high": 1.0}, source)
            lt = self._emit(fx.name + "_lt", torch.ops.aten.lt.Tensor, [_Ref(u), self._ref_args(p)], {}, _meta_like(val, torch.bool), source)
            self.env[fx.name] = self._emit(fx.name, torch.ops.aten._to_copy.default, [_Ref(lt)], {"dtype": val.dtype}, val, source)
            return
        if packet not in _RANDOM_OPS:
            self._unsupported(fx, str(op), "a random operator that cannot be lifted to an input")
            return
        distribution, spec = _RANDOM_OPS[packet]
        params = {}
        for key, (arg_name, default) in spec.items():
            value = bound.get(arg_name, default) if arg_name else default
            if isinstance(value, torch.fx.Node):
                self._unsupported(fx, str(op), f"a random draw whose {arg_name} is a tensor cannot be lifted yet")
                return
            params[key] = value
        self.env[fx.name] = self._lift(fx.name, str(op), tuple(val.shape), dtype_name(val.dtype), distribution, params, source)

    def _dropout(self, fx: torch.fx.Node, op: Any, bound: Mapping[str, Any], val: Any, source: str) -> None:
        """native_dropout(x, p, train) -> (x * mask * 1/(1-p), mask) with the mask lifted.

        The node order matches PyTorch's own decomposition (mask * x, then * scale), so
        results agree with the reference bit for bit given the same mask.
        """
        x, p, train = bound["input"], float(bound["p"]), bound["train"]
        out_val, mask_val = val
        x_ref = self._ref_args(x)
        if not train or p == 0.0:
            ones = self._emit(fx.name + "_mask", torch.ops.aten.full.default, [tuple(mask_val.shape), True], {"dtype": torch.bool}, mask_val, source)
            self.env[fx.name] = [x_ref.name, ones]
            return
        mask = self._lift(fx.name + "_mask", str(op), tuple(mask_val.shape), "bool", "bernoulli", {"p": 1.0 - p}, source)
        if p >= 1.0:
            out = self._emit(fx.name, torch.ops.aten.mul.Tensor, [x_ref, 0.0], {}, out_val, source)
        else:
            masked = self._emit(fx.name + "_masked", torch.ops.aten.mul.Tensor, [_Ref(mask), x_ref], {}, out_val, source)
            out = self._emit(fx.name, torch.ops.aten.mul.Tensor, [_Ref(masked), 1.0 / (1.0 - p)], {}, out_val, source)
        self.env[fx.name] = [out, mask]

    def _lift(self, base: str, op: str, shape: tuple[int, ...], dtype: str, distribution: str, params: Mapping[str, Any], source: str) -> str:
        name = self.fresh(base)
        self.lifted_specs.append(TensorSpec(name, shape, dtype))
        self.lifted.append(LiftedRandom(name, op, shape, dtype, distribution, tuple(params.items()), source))
        return name

    # -- helpers ----------------------------------------------------------------------

    def _unsupported(self, fx: torch.fx.Node, op: str, reason: str = "") -> None:
        self.unsupported.append(UnsupportedOp(op, fx.name, node_source(fx.meta), reason))
        self.env[fx.name] = fx.name

    @staticmethod
    def _is_tensors(val: Any) -> bool:
        if isinstance(val, torch.Tensor):
            return True
        return isinstance(val, (list, tuple)) and len(val) > 0 and all(isinstance(v, torch.Tensor) for v in val)

    def _spec(self, name: str, val: Any) -> TensorSpec:
        if not isinstance(val, torch.Tensor):
            raise CaptureError(f"{self.name}: {name} is not a tensor ({type(val).__name__})")
        try:
            shape = tuple(int(d) for d in val.shape)
        except (TypeError, RuntimeError) as err:
            raise CaptureError(f"{self.name}: {name} has a symbolic shape {tuple(val.shape)}; dynamic shapes are not supported") from err
        return TensorSpec(name, shape, dtype_name(val.dtype))

    def _live_nodes(self, outputs: Sequence[str]) -> list[Node]:
        live = set(outputs)
        kept = []
        for node in reversed(self.nodes):
            if any(o.name in live for o in node.outputs):
                kept.append(node)
                live.update(node.inputs)
        return kept[::-1]


#: The buffers a norm in training mode updates (BatchNorm, InstanceNorm with running stats): not
#: results, and never read by the call that updates them; a program leaves them out.
RUNNING_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")

_DATA_SIZED = "its result's size depends on the data"


def _without_size_checks(found: list[UnsupportedOp]) -> list[UnsupportedOp]:
    """The refusals without the symbolic-size arithmetic export adds after a result whose size the
    data decides (``sym_size``, comparisons of it): that result's own line says it all."""
    if not any(u.reason.startswith(_DATA_SIZED) for u in found):
        return found
    return [u for u in found if not (u.op.startswith("_operator.") or u.op.startswith("aten.sym_")
                                     or u.op.startswith("aten._assert"))]


def _restrides_contiguous(fx: torch.fx.Node) -> bool:
    """``as_strided(x, x.shape, contiguous strides)`` of a contiguous x (decompositions use it to
    set a memory format): the value is x's, an alias."""
    x = fx.args[0].meta.get("val") if isinstance(fx.args[0], torch.fx.Node) else None
    size, stride = fx.args[1], fx.args[2]
    offset = fx.args[3] if len(fx.args) > 3 else fx.kwargs.get("storage_offset")
    if not isinstance(x, torch.Tensor) or not x.is_contiguous() or tuple(size) != tuple(x.shape) or offset not in (None, 0):
        return False
    want = torch.empty(tuple(size), device="meta").stride()
    return all(d == 1 or s == w for d, s, w in zip(size, stride, want))


def _meta_like(val: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(tuple(val.shape), dtype=dtype, device="meta")


__all__ = ["to_graph", "node_source", "dtype_name", "short_file"]
