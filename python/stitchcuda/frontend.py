"""Capture: a PyTorch reference program in, a :class:`~stitchcuda.ir.Graph` and its weights out.

The stage in four steps:

1. :func:`~stitchcuda.reference.load_reference` reads a KernelBench-format program
   (``class Model``, ``get_inputs()``, ``get_init_inputs()``) from a file or a source string.
2. :func:`capture` refuses what cannot be captured before spending time on it (recurrent
   layers with projections or live dropout between layers), runs ``torch.export.export`` (non-strict) on the module as given — training
   mode included, since KernelBench never calls ``.eval()`` — and decomposes the result
   to core ATen with :func:`decomposition_table`.
3. The exported graph becomes a Graph: shapes and dtypes from each node's ``meta["val"]``,
   a ``source`` per node from ``nn_module_stack`` and ``stack_trace``, random draws
   lifted to program inputs, buffer mutations (BatchNorm running statistics) dropped and
   dead nodes removed.
4. :func:`check_supported` lists the operators the code generator cannot handle;
   ``capture`` raises :class:`UnsupportedOpError` naming each one and where it appears in
   the reference. Nothing ever falls back to PyTorch.

Decomposition choice
--------------------
The graph is core ATen, except for the operators in :data:`PRESERVED_OPS`, which stay
whole because the planner maps each to one strong kernel and their decompositions would
only have to be pattern-matched back together: ``linear`` (a GEMM with a bias epilogue
instead of ``permute`` + ``addmm`` + ``view``), ``matmul`` (a batched GEMM with
broadcasting instead of ``expand`` + ``clone`` + ``view`` + ``bmm`` + ``view``),
``scaled_dot_product_attention`` (fused attention; its decomposition also depends on the
device the capture ran on), ``logsumexp`` (a row reduction instead of seven
elementwise ops) and the recurrent layers (``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``: one node
each instead of a node set per time step; :mod:`stitchcuda.recurrent`). ``gelu``, ``_softmax``,
``_log_softmax``, ``native_layer_norm`` and
``_native_batch_norm_legit_functional`` are core ATen already and stay as they are. On
torch older than 2.6, export itself may already have decomposed the preserved operators;
the graph is then plain core ATen, which is still valid input for the planner.

Random draws
------------
Every operator tagged ``nondeterministic_seeded`` (``rand``, ``randn``, ``*_like``,
``uniform``, ``normal``, ``bernoulli``, ``randint``, ``randperm``, ``exponential``, live
``native_dropout``) becomes an explicit program input, recorded in
``Graph.lifted_random`` with its distribution, so a program never draws numbers itself
and can be checked against the reference given the same draws. Live dropout lifts its
keep-mask (``bernoulli(1 - p)``, bool) and keeps the scaling as graph nodes; dropout with
``p = 0`` or outside training is the identity. A draw whose value ends up unused stays
an input, so the record of draws (and their order) is complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import re
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch
from safetensors.torch import save_file
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from . import aten
from . import stateful as _stateful
from .aten import (_TORCH_DIR, PRESERVED_OPS, SUPPORTED_OPS, UnsupportedOp,  # noqa: F401 - the stage's names
                   UnsupportedOpError, check_supported, decomposition_table, op_name, resolve_op)
# The Verifier still reads two names of the graph-running oracle from here; the oracle lives in
# evaluate, which imports nothing of capture. Import them from there.
from .evaluate import evaluate_graph, sample_random_inputs
from .exported import dtype_name, node_source, short_file, to_graph  # noqa: F401 - the stage's names
from .ir import Graph
from .reference import CaptureError, Reference, load_reference
from .stateful import StateIO

# --------------------------------------------------------------------------------------
# Capture
# --------------------------------------------------------------------------------------


@dataclass
class Captured:
    """What capture hands on: the graph, its weights by name, and the exported program.

    ``weights`` maps every name in ``graph.weights`` to its tensor (on the device, and of
    the kind, the model was captured with: meta tensors after a meta capture).
    ``exported`` is the decomposed ``ExportedProgram``, for debugging. ``state`` lists the
    attributes lifted to inputs and outputs (see :mod:`stitchcuda.stateful`).
    """

    graph: Graph
    weights: dict[str, torch.Tensor]
    exported: Any = field(repr=False)
    #: Plain tensor attributes lifted to explicit inputs / outputs (``state="lift"``).
    state: tuple[StateIO, ...] = ()
    #: What capture did that a caller should know (a CPU fallback, lifted state), one line each.
    notes: tuple[str, ...] = ()


def capture(
    model: nn.Module,
    example_inputs: Sequence[Any],
    name: str = "model",
    *,
    supported_ops: Iterable[str] | None = SUPPORTED_OPS,
    state: str = "refuse",
) -> Captured:
    """Capture ``model(*example_inputs)`` as a Graph, specialised to these inputs' shapes.

    Non-tensor inputs are baked into the graph as constants. Raises
    :class:`UnsupportedOpError` when the model holds recurrent layers the lowering does not
    compute (checked before export; :func:`stitchcuda.aten.refuse_unsupported_recurrent`), keeps state in a plain tensor attribute that forward
    changes (unless ``state="lift"``: each such attribute becomes an extra input, its value
    before the call, and an extra output, its value after; :mod:`stitchcuda.stateful`), or —
    unless ``supported_ops`` is None — uses operators outside ``supported_ops``; raises
    :class:`CaptureError` when ``torch.export`` fails otherwise. The model's attributes are as
    they were before the call, whatever forward assigns.
    """
    if state not in ("refuse", "lift"):
        raise ValueError(f"state={state!r}: 'refuse' or 'lift'")
    aten.refuse_unsupported_recurrent(model, name)
    inputs = tuple(example_inputs)
    lifted: tuple[StateIO, ...] = ()
    notes: tuple[str, ...] = ()
    try:
        exported = _export(model, inputs, name, lift=state == "lift")
        graph, weights = to_graph(exported, name)
    except _StateFound as found:
        attrs = _stateful.find_attributes(model, found.paths)
        if not attrs:
            raise found.error from None
        n_out = _stateful.count_outputs(model, inputs)
        paths = [_stateful.attribute_path(a) for a in attrs]
        with _stateful.lifted(model, attrs, len(inputs)):
            exported = _export(model, inputs + tuple(vars(m)[k] for m, _, k in attrs), name,
                               lifted=paths + [a[2] for a in attrs])
        graph, weights = to_graph(exported, name)
        lifted = _stateful.describe(model, attrs, graph, n_out)
        notes = (f"state kept in {', '.join(s.attribute for s in lifted)} is an explicit input and output "
                 f"({', '.join(f'{s.input} -> {s.output}' for s in lifted)})",)
    if supported_ops is not None:
        unsupported = check_supported(graph, supported_ops)
        if unsupported:
            raise UnsupportedOpError(name, unsupported, graph)
    return Captured(graph=graph, weights=weights, exported=exported, state=lifted, notes=notes)


def capture_reference(
    reference: Reference,
    *,
    device: str | torch.device | None = None,
    seed: int | None = None,
    supported_ops: Iterable[str] | None = SUPPORTED_OPS,
    state: str = "refuse",
) -> Captured:
    """:meth:`Reference.instantiate` then :func:`capture`, named after the reference.

    On the meta device (shapes only) a reference may fail to build or to trace — a constructor
    that calls ``.item()`` (a stochastic-depth schedule from ``torch.linspace``), an operator
    without a meta kernel. Capture then falls back to the CPU with the reference's own shapes,
    says so in a warning and in ``Captured.notes`` (with the time it took), and raises only if
    that fails too. Unsupported operators are not a meta problem and raise at once.
    """
    try:
        model, inputs = reference.instantiate(device=device, seed=seed)
        return capture(model, inputs, reference.name, supported_ops=supported_ops, state=state)
    except UnsupportedOpError:
        raise
    except Exception as err:  # noqa: BLE001 - any meta failure earns one CPU attempt
        if device is None or torch.device(device).type != "meta":
            raise
        why = (str(err).strip().splitlines() or [type(err).__name__])[0]
    t0 = time.monotonic()
    model, inputs = reference.instantiate(device="cpu", seed=seed)
    cap = capture(model, inputs, reference.name, supported_ops=supported_ops, state=state)
    note = (f"capture on the meta device failed ({why}); captured on the CPU with the reference's own shapes "
            f"in {time.monotonic() - t0:.1f} s")
    warnings.warn(f"{reference.name}: {note}", stacklevel=2)
    return dataclasses.replace(cap, notes=cap.notes + (note,))


def save_weights(captured: Captured, path: str | os.PathLike) -> None:
    """Write the graph's weights to a safetensors file, keyed by their graph names.

    Each tensor is copied to the CPU as a contiguous clone, so tied or strided weights
    save as independent arrays. Refuses weights from a meta capture.
    """
    tensors = {}
    for spec in captured.graph.weights:
        tensor = captured.weights[spec.name]
        if tensor.is_meta or _is_fake(tensor):
            raise CaptureError(
                f"weight {spec.name!r} of {captured.graph.name!r} has no data (captured on the meta device); "
                "capture with real tensors to save weights"
            )
        tensors[spec.name] = tensor.detach().to("cpu").contiguous().clone()
    save_file(tensors, os.fspath(path), metadata={"graph": captured.graph.name, "generator": "stitchcuda.frontend"})


def _is_fake(t: torch.Tensor) -> bool:
    return isinstance(t, FakeTensor)


# --------------------------------------------------------------------------------------
# Refusals made before or around export
# --------------------------------------------------------------------------------------


class _StateFound(Exception):
    """Forward changes plain tensor attributes (``paths``); ``error`` is the refusal."""

    def __init__(self, paths: Sequence[str], error: UnsupportedOpError):
        super().__init__(", ".join(paths))
        self.paths = list(paths)
        self.error = error


def _export(model: nn.Module, inputs: tuple[Any, ...], name: str, lift: bool = False,
            lifted: Sequence[str] = ()) -> Any:
    """``torch.export`` (non-strict) then :func:`decomposition_table`; failures typed. A forward
    that changes a plain tensor attribute is refused, or (``lift``) reported to the caller by
    :class:`_StateFound` with every such attribute; the ``lifted`` ones are inputs already."""
    attributes = _plain_tensor_attributes(model)
    noise = io.StringIO()  # what export prints on a failure (graph dumps): replaced by one message
    try:
        with warnings.catch_warnings(record=True) as caught, _quiet_torch(noise), aten.recurrent_shapes_only():
            warnings.simplefilter("always")
            exported = torch.export.export(model, inputs, strict=False)
        sys.stderr.write(noise.getvalue())
        # Forward that assigns a tensor attribute keeps state between calls. Recent torch
        # puts the attribute back itself and only warns; older torch leaves it changed.
        assigned = [m.group(1) for w in caught if (m := _ASSIGNED.search(str(w.message)))]
        changed = _restore_attributes(attributes)
        assigned = [a for a in assigned if a not in lifted and a.split(".")[-1] not in lifted]
        changed = [a for a in changed if a not in lifted]
        # (assigning a lifted attribute is how its state input gets in: not worth a warning)
        caught = [w for w in caught if not ((m := _ASSIGNED.search(str(w.message))) and
                                            (m.group(1) in lifted or m.group(1).split(".")[-1] in lifted))]
        if assigned or changed:
            error = _state_error(model, name, (assigned or changed)[0], "assigns")
            if lift:
                raise _StateFound(list(dict.fromkeys(assigned + changed)), error)
            raise error
        _replay_warnings(caught)
        with warnings.catch_warnings(record=True) as caught, aten.recurrent_shapes_only():
            warnings.simplefilter("always")
            exported = exported.run_decompositions(decomposition_table())
        _replay_warnings(caught)
        return exported
    except (CaptureError, _StateFound):
        raise
    except Exception as err:  # noqa: BLE001 - every export failure becomes a typed error
        _restore_attributes(attributes)
        # Export refuses a plain tensor attribute that forward mutates in place (depending
        # on the torch version, while tracing or while decomposing).
        mutated = re.search(r"Constant (\S+) is mutated", str(err))
        if mutated:
            error = _state_error(model, name, mutated.group(1), "mutates")
            if lift:
                # Every attribute forward changes, not only the first export tripped over.
                raise _StateFound([mutated.group(1)] + _stateful.changed_by_forward(model, inputs), error) from err
            raise error from err
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "data-dependent" in first or "DataDependent" in type(err).__name__:
            raise CaptureError(f"torch.export could not capture {name!r}: forward {_data_dependent_hint(err)}") from err
        raise CaptureError(f"torch.export could not capture {name!r}: {type(err).__name__}: {first}") from err


@contextlib.contextmanager
def _quiet_torch(sink: io.StringIO):
    """Hold back what torch prints and logs while exporting (it dumps the partial graph on a
    failure, which the CaptureError replaces with one line)."""
    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield
    finally:
        logger.setLevel(level)


def _data_dependent_hint(err: BaseException) -> str:
    """Where forward branches on a tensor's value, and what to do instead."""
    user = [f for f in traceback.extract_tb(err.__traceback__)
            if not f.filename.startswith((_TORCH_DIR, os.path.dirname(os.__file__), os.path.dirname(__file__)))]
    where = f" at {short_file(user[-1].filename)}:{user[-1].lineno} (`{(user[-1].line or '').strip()}`)" if user else ""
    return (f"branches on a tensor's value{where}: a program is one static graph; compute both sides and "
            "pick with torch.where, or branch on shapes only")


_ASSIGNED = re.compile(r"tensor attribute self\.(\S+) was assigned during export")


def _replay_warnings(caught: Sequence[warnings.WarningMessage]) -> None:
    """Re-issue warnings recorded around export, minus torch's internal deprecation noise."""
    for w in caught:
        if issubclass(w.category, FutureWarning) and w.filename.startswith((_TORCH_DIR, os.path.dirname(os.__file__))):
            continue
        if "_flat_weights" in str(w.message):  # nn.RNNBase re-lists its weights on every call: no state
            continue
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _state_error(model: nn.Module, name: str, attribute: str, verb: str) -> UnsupportedOpError:
    where = _attribute_location(model, attribute, "tensor attribute", mutation=True)
    return UnsupportedOpError(
        name,
        [
            UnsupportedOp(
                op="tensor attribute state",
                node=attribute,
                where=where,
                reason=f"forward {verb} the plain tensor attribute {attribute!r}, state kept between calls, "
                "which is not supported yet",
            )
        ],
    )


_plain_tensor_attributes = _stateful.plain_tensor_attributes
_restore_attributes = _stateful.restore_attributes
_attribute_location = _stateful.attribute_location


__all__ = [
    "evaluate_graph",  # for the Verifier, until it imports them from evaluate
    "sample_random_inputs",
    "PRESERVED_OPS",
    "SUPPORTED_OPS",
    "UnsupportedOp",
    "CaptureError",
    "UnsupportedOpError",
    "Reference",
    "Captured",
    "StateIO",
    "load_reference",
    "capture",
    "capture_reference",
    "check_supported",
    "save_weights",
    "decomposition_table",
    "node_source",
    "op_name",
    "resolve_op",
    "dtype_name",
]
