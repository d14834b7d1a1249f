"""The program directory and its manifest.

A program lives in one folder::

    run/<name>/program.cu            the CUDA C++ source (generated or hand-written)
    run/<name>/manifest.json         what this module describes
    run/<name>/weights.safetensors   the weights, in manifest order (optional: a program may have none)
    run/<name>/program.so            the built library (absent until built)

``manifest.json`` (format ``stitchcuda-program``, version 1)::

    {"format": "stitchcuda-program", "version": 1, "name": "mlp", "abi_version": 1,
     "precision": "fp32" | "tf32" | "bf16" | "fp16", "arch": "sm_90",
     "source_hash": "<sha256 hex of program.cu>",
     "reference": {"path": "model.py"}  or  {"kernelbench": {"level": 1, "problem_id": 23, "name": "23_Softmax"}},
     "inputs":  [{"name": "x", "dtype": "float32", "shape": [64, 256]}],
     "outputs": [...], "weights": [...],
     "lifted_random": [{"input": "noise", "node": "randn_like", "op": "aten.randn_like.default"}],
     "state": [{"attribute": "hidden", "input": "state_hidden", "output": "tanh"}],
     "tasks": [{"name": "linear_relu", "strategy": "cublaslt_gemm", "covers": ["addmm", "relu"],
                "flops": 8388608, "bytes": 688128, "origin": "template", "phase": "run"}],
     "reference_ops": [{"node": "addmm", "op": "aten.addmm.default", "flops": 8388608, "bytes": 688128}]}

``state`` (optional) lists the reference's state kept between calls in a plain tensor attribute
(``self.hidden``): the program takes the attribute's value before the call as the input named by
``input`` and hands its value after the call back as the output named by ``output``; the program
itself keeps nothing between calls (:mod:`stitchcuda.stateful`).

Provenance: every node of ``reference_ops`` must be covered by some task; that is a rule of the
Verifier (``stitchcuda.verifier.static``), not a format error, so a manifest that breaks it
still loads and the Verifier can say what is missing.

Every loading problem raises :class:`ManifestError`, whose message names the file and the
problem (``run/mlp/manifest.json: inputs[0].shape: expected a list of non-negative integers``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import dtypes as _dtypes
from . import loader as _loader
from .errors import ArgumentError
from . import precision as _precision
from .fsutil import atomic_write_text
from .ir import TensorSpec
from .weights_file import WeightsFileError, read_safetensors_header

FORMAT = "stitchcuda-program"
FORMAT_VERSION = 1
ABI_VERSION = 1
#: Precision policy names (:mod:`stitchcuda.precision` says what each means).
PRECISIONS = _precision.NAMES

#: Element sizes of the dtypes a manifest may name (the runtime's st_dtype spellings).
DTYPE_SIZES = _dtypes.ABI_SIZES

#: Strategies the planner and coder use today. Others are allowed (an LLM-written kernel names
#: its own); these are the ones other stages know by name.
KNOWN_STRATEGIES = (
    "cublaslt_gemm", "epilogue_template", "reduction_template", "elementwise_kernel",
    "attention_template", "copy", "custom_kernel", "cudnn_conv", "conv_template", "recurrent_template",
)

PROGRAM_SOURCE = "program.cu"
MANIFEST_FILE = "manifest.json"
WEIGHTS_FILE = "weights.safetensors"
LIBRARY_FILE = "program.so"

_ARCH_RE = re.compile(r"^sm_\d{2,3}[a-z]?$")
_HASH_RE = re.compile(r"^(sha256:)?[0-9a-f]{64}$")
_IDENT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


class ManifestError(ArgumentError):
    """A program directory or manifest that cannot be used; the message names file and problem."""

    def __init__(self, file: str | Path, problem: str):
        self.file = str(file)
        self.problem = problem
        super().__init__(f"{self.file}: {problem}")


# ------------------------------------------------------------------ dataclasses


@dataclass(frozen=True)
class KernelBenchRef:
    level: int
    problem_id: int
    name: str


@dataclass(frozen=True)
class ReferenceSource:
    """Where the reference program came from: a file (relative to the program folder) or a
    KernelBench problem."""

    path: str | None = None
    kernelbench: KernelBenchRef | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.kernelbench is not None:
            return {"kernelbench": dataclasses.asdict(self.kernelbench)}
        return {"path": self.path}

    def describe(self) -> str:
        if self.kernelbench is not None:
            k = self.kernelbench
            return f"KernelBench level {k.level} problem {k.problem_id} ({k.name})"
        return str(self.path)


@dataclass(frozen=True)
class RandomInput:
    """A random draw in the reference's forward, lifted to an explicit program input.

    The fields follow ``stitchcuda.ir.LiftedRandom.to_dict()`` (input, op, shape, dtype,
    distribution, params as ``[[key, value], ...]``, source), plus the graph ``node``; only
    ``input`` is required. ``shape``/``dtype``, when given, must match that input's spec.
    """

    input: str
    node: str = ""
    op: str = ""
    distribution: str = ""
    params: tuple[tuple[str, Any], ...] = ()
    shape: tuple[int, ...] | None = None
    dtype: str = ""
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"input": self.input}
        for k in ("node", "op", "distribution", "dtype", "source"):
            if getattr(self, k):
                d[k] = getattr(self, k)
        if self.shape is not None:
            d["shape"] = list(self.shape)
        if self.params:
            d["params"] = [[k, v] for k, v in self.params]
        return d


@dataclass(frozen=True)
class CarriedState:
    """State the reference keeps between calls in a plain tensor attribute, made explicit: the
    program input holding the attribute's value before the call and the output holding it after
    (same dtype and shape). ``attribute`` is the path from the model (``hidden``, ``cell.h``)."""

    attribute: str
    input: str
    output: str

    def to_dict(self) -> dict[str, Any]:
        return {"attribute": self.attribute, "input": self.input, "output": self.output}


@dataclass(frozen=True)
class TaskRecord:
    """One unit of generated work and the reference nodes it accounts for."""

    name: str
    strategy: str
    covers: tuple[str, ...]
    flops: int = 0
    bytes: int = 0
    origin: str = "template"  # where its body came from: template, or "override: <who>" (hand, rewrite, llm, ...)
    phase: str = "run"  # "run": every call; "create": once, when the program is loaded (weight transforms)
    #: the earlier task whose compiled kernels this one launches (the same elementwise function: the
    #: kernels carry that task's name); "" for its own
    kernels_of: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = {"name": self.name, "strategy": self.strategy, "covers": list(self.covers),
             "flops": self.flops, "bytes": self.bytes, "origin": self.origin, "phase": self.phase}
        return {**d, "kernels_of": self.kernels_of} if self.kernels_of else d


@dataclass(frozen=True)
class ReferenceOp:
    """One node of the captured reference graph with its cost-model FLOPs and bytes."""

    node: str
    op: str
    flops: int = 0
    bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ShapeError(ArgumentError):
    """Tensors whose shapes a dynamic program does not serve (a range or divisibility guard)."""


def eval_dim(expr: int | str, values: Mapping[str, int]) -> int:
    """A dimension of a dynamic shape at the symbols' ``values`` (:func:`stitchcuda.loader.dim_value`,
    which a program wheel's loader uses too); ShapeError where it is not whole."""
    try:
        return _loader.dim_value(expr, values)
    except ValueError as e:
        if str(e).startswith("not a dimension expression"):
            raise
        raise ShapeError(str(e)) from None


@dataclass(frozen=True)
class DynamicDim:
    """A dimension the program serves over a range: where it sits (input name, axis), its range,
    and what it must be a multiple of."""

    name: str
    min: int
    max: int
    places: tuple[tuple[str, int], ...]
    multiple_of: int = 1
    variable: str = ""  # the reference's module-level size it sets (the Verifier sets it to judge a shape)
    tuned: tuple[int, ...] = ()  # sizes named at build (--tune-shapes): the Verifier times each, keeps its choices

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "min": self.min, "max": self.max, "places": [list(p) for p in self.places],
                **({"multiple_of": self.multiple_of} if self.multiple_of != 1 else {}),
                **({"variable": self.variable} if self.variable else {}),
                **({"tuned": list(self.tuned)} if self.tuned else {})}


@dataclass(frozen=True)
class Dynamic:
    """A dynamic program's dimensions, and its inputs' and outputs' shapes over them (an integer or
    an expression a dimension; the tensors' own ``shape`` is the largest)."""

    dims: tuple[DynamicDim, ...]
    inputs: tuple[tuple[int | str, ...], ...]
    outputs: tuple[tuple[int | str, ...], ...]
    arena_bytes: int = 0  # intermediates a run needs, sized for the largest shape (each shape uses a prefix)

    def values(self, names: Sequence[str], shapes: Sequence[Sequence[int]]) -> dict[str, int]:
        """The dimensions' values read from input shapes (inputs named ``names``); ShapeError of one
        line naming the input, the dimension and the symbol when a guard does not hold (the checks a
        program wheel's loader makes too: :func:`stitchcuda.loader.dynamic_sizes`)."""
        try:
            return _loader.dynamic_sizes([d.to_dict() for d in self.dims], list(names), shapes)
        except ValueError as e:
            raise ShapeError(str(e)) from None

    def tuned_shapes(self) -> list[tuple[tuple[str, int], ...]]:
        """The shapes named at build to tune at: every combination of the dimensions' tuned sizes (a
        dimension with none named at its largest); [] when none was named."""
        if not any(d.tuned for d in self.dims):
            return []
        return [tuple(zip((d.name for d in self.dims), c))
                for c in itertools.product(*[d.tuned or (d.max,) for d in self.dims])]

    def largest_sizes(self) -> dict[str, int]:
        """The reference's module-level sizes at the program's largest shape (the manifest's shapes)."""
        return {d.variable: d.max for d in self.dims if d.variable}

    def shape(self, dims: Sequence[int | str], values: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(eval_dim(x, values) for x in dims)

    def to_dict(self) -> dict[str, Any]:
        return {"dims": [d.to_dict() for d in self.dims], "inputs": [list(s) for s in self.inputs],
                "outputs": [list(s) for s in self.outputs], "arena_bytes": self.arena_bytes}


@dataclass(frozen=True)
class Manifest:
    name: str
    precision: str
    arch: str
    source_hash: str
    reference: ReferenceSource
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    weights: tuple[TensorSpec, ...] = ()
    lifted_random: tuple[RandomInput, ...] = ()
    tasks: tuple[TaskRecord, ...] = ()
    reference_ops: tuple[ReferenceOp, ...] = ()
    abi_version: int = ABI_VERSION
    format: str = FORMAT
    version: int = FORMAT_VERSION
    generator: str = ""  # what wrote program.cu (the Coder, or a person)
    state: tuple[CarriedState, ...] = ()
    dynamic: Dynamic | None = None  # dimensions served over a range (None: the shapes above only)

    def at(self, values: Mapping[str, int]) -> "Manifest":
        """A dynamic program's manifest at one shape of its ranges (``values``: every dimension's size,
        checked against its range and multiple): inputs, outputs and lifted draws at that shape, as a
        static program's manifest would list them. ShapeError names what does not hold."""
        if self.dynamic is None:
            raise ShapeError(f"{self.name} is not a dynamic program: it serves its manifest's shapes only")
        names = {d.name: d for d in self.dynamic.dims}
        if set(values) != set(names):
            raise ShapeError(f"{self.name} has dynamic dimension(s) {', '.join(names)}; got "
                             f"{', '.join(f'{k}={v}' for k, v in values.items()) or 'none'}")
        shapes = {t.name: self.dynamic.shape(dims, values) for t, dims in zip(self.inputs, self.dynamic.inputs)}
        self.dynamic.values([t.name for t in self.inputs], [shapes[t.name] for t in self.inputs])  # the guards
        outputs = tuple(dataclasses.replace(t, shape=self.dynamic.shape(dims, values))
                        for t, dims in zip(self.outputs, self.dynamic.outputs))
        lifted = tuple(dataclasses.replace(r, shape=shapes[r.input]) if r.shape is not None else r
                       for r in self.lifted_random)
        return dataclasses.replace(self, inputs=tuple(dataclasses.replace(t, shape=shapes[t.name]) for t in self.inputs),
                                   outputs=outputs, lifted_random=lifted)

    def io_bytes(self) -> int:
        """The fewest bytes a run moves: every input and weight read once, every output written once
        (the memory side of the problem's roofline floor)."""
        return sum(t.nbytes for t in self.inputs + self.weights + self.outputs)

    # -------------------------------------------------------------- provenance

    def covered_nodes(self) -> frozenset[str]:
        return frozenset(n for t in self.tasks for n in t.covers)

    def uncovered_ops(self) -> tuple[ReferenceOp, ...]:
        """Reference ops no task covers (each must be covered: a Verifier rule)."""
        covered = self.covered_nodes()
        return tuple(op for op in self.reference_ops if op.node not in covered)

    def unknown_covers(self) -> tuple[tuple[str, str], ...]:
        """(task, node) pairs naming a node that is not among ``reference_ops``."""
        known = {op.node for op in self.reference_ops}
        return tuple((t.name, n) for t in self.tasks for n in t.covers if n not in known)

    # -------------------------------------------------------------- serialisation

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "version": self.version,
            "name": self.name,
            "abi_version": self.abi_version,
            "precision": self.precision,
            "arch": self.arch,
            "source_hash": self.source_hash,
            "reference": self.reference.to_dict(),
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "weights": [t.to_dict() for t in self.weights],
            "lifted_random": [r.to_dict() for r in self.lifted_random],
            "tasks": [t.to_dict() for t in self.tasks],
            "reference_ops": [o.to_dict() for o in self.reference_ops],
            **({"state": [st.to_dict() for st in self.state]} if self.state else {}),
            **({"generator": self.generator} if self.generator else {}),
            **({"dynamic": self.dynamic.to_dict()} if self.dynamic else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write atomically; ``path`` is the manifest file or its program folder."""
        path = Path(path)
        if path.is_dir():
            path = path / MANIFEST_FILE
        return atomic_write_text(path, self.to_json())

    @classmethod
    def from_dict(cls, data: Any, file: str | Path = "<manifest>") -> "Manifest":
        return _ManifestReader(str(file)).manifest(data)

    @classmethod
    def from_json(cls, text: str, file: str | Path = "<manifest>") -> "Manifest":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ManifestError(file, f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        return cls.from_dict(data, file)

    @classmethod
    def load(cls, path: str | Path) -> "Manifest":
        """Read and validate a manifest file (or the manifest of a program folder)."""
        path = Path(path)
        if path.is_dir():
            path = path / MANIFEST_FILE
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ManifestError(path, "file not found") from None
        except UnicodeDecodeError as e:
            raise ManifestError(path, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
        except OSError as e:
            raise ManifestError(path, f"cannot read: {e.strerror or e}") from None
        return cls.from_json(text, path)


def hash_source(source: str | bytes) -> str:
    """The manifest's ``source_hash`` of a program source: SHA-256 of its UTF-8 bytes, hex."""
    if isinstance(source, str):
        source = source.encode("utf-8")
    return hashlib.sha256(source).hexdigest()


def same_hash(a: str, b: str) -> bool:
    strip = lambda h: h[len("sha256:"):] if h.startswith("sha256:") else h  # noqa: E731
    return strip(a.lower()) == strip(b.lower())


# ------------------------------------------------------------------ parsing


class _ManifestReader:
    def __init__(self, file: str):
        self.file = file

    def fail(self, where: str, problem: str) -> ManifestError:
        return ManifestError(self.file, f"{where}: {problem}" if where else problem)

    def obj(self, v: Any, where: str) -> Mapping[str, Any]:
        if not isinstance(v, dict):
            raise self.fail(where, f"expected an object, got {_kind(v)}")
        return v

    def req(self, d: Mapping[str, Any], key: str, where: str) -> Any:
        if key not in d:
            raise self.fail(where, f"missing required field \"{key}\"")
        return d[key]

    def string(self, v: Any, where: str, *, nonempty: bool = True) -> str:
        if not isinstance(v, str):
            raise self.fail(where, f"expected a string, got {_kind(v)}")
        if nonempty and not v.strip():
            raise self.fail(where, "must not be empty")
        return v

    def count(self, v: Any, where: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise self.fail(where, f"expected a non-negative integer, got {_show(v)}")
        return v

    def phase(self, v: Any, where: str) -> str:
        if v not in ("run", "create"):
            raise self.fail(where, f"expected \"run\" or \"create\", got {_show(v)}")
        return v

    def array(self, v: Any, where: str) -> list[Any]:
        if not isinstance(v, list):
            raise self.fail(where, f"expected a list, got {_kind(v)}")
        return v

    def tensor(self, v: Any, where: str) -> TensorSpec:
        d = self.obj(v, where)
        name = self.string(self.req(d, "name", where), f"{where}.name")
        if not _IDENT_RE.match(name):
            raise self.fail(f"{where}.name", f"{name!r} is not a usable name (letters, digits, _ . -)")
        dtype = self.string(self.req(d, "dtype", where), f"{where}.dtype")
        if dtype not in DTYPE_SIZES:
            raise self.fail(f"{where}.dtype", f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_SIZES)}")
        shape = self.req(d, "shape", where)
        if not isinstance(shape, list) or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in shape):
            raise self.fail(f"{where}.shape", f"expected a list of non-negative integers, got {_show(shape)}")
        if len(shape) > 8:
            raise self.fail(f"{where}.shape", f"{len(shape)} dimensions; the program ABI allows at most 8")
        return TensorSpec(name, tuple(shape), dtype)

    def tensors(self, d: Mapping[str, Any], key: str, *, required: bool) -> tuple[TensorSpec, ...]:
        if key not in d:
            if required:
                raise self.fail("", f"missing required field \"{key}\"")
            return ()
        items = self.array(d[key], key)
        return tuple(self.tensor(t, f"{key}[{i}]") for i, t in enumerate(items))

    def reference(self, v: Any) -> ReferenceSource:
        d = self.obj(v, "reference")
        has_path, has_kb = "path" in d, "kernelbench" in d
        if has_path == has_kb:
            raise self.fail("reference", "expected exactly one of \"path\" or \"kernelbench\"")
        if has_path:
            return ReferenceSource(path=self.string(d["path"], "reference.path"))
        kb = self.obj(d["kernelbench"], "reference.kernelbench")
        w = "reference.kernelbench"
        return ReferenceSource(kernelbench=KernelBenchRef(
            level=self.count(self.req(kb, "level", w), f"{w}.level"),
            problem_id=self.count(self.req(kb, "problem_id", w), f"{w}.problem_id"),
            name=self.string(self.req(kb, "name", w), f"{w}.name"),
        ))

    def lifted(self, v: Any, where: str) -> RandomInput:
        if isinstance(v, str):
            return RandomInput(input=self.string(v, where))
        d = self.obj(v, where)
        raw = d.get("params", [])
        if isinstance(raw, dict):
            raw = [[k, val] for k, val in raw.items()]
        if not isinstance(raw, list) or not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
                                                for p in raw):
            raise self.fail(f"{where}.params", "expected [[name, value], ...] or an object")
        shape = d.get("shape")
        if shape is not None and (not isinstance(shape, list) or
                                  any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in shape)):
            raise self.fail(f"{where}.shape", f"expected a list of non-negative integers, got {_show(shape)}")
        return RandomInput(
            input=self.string(self.req(d, "input", where), f"{where}.input"),
            node=self.string(d.get("node", ""), f"{where}.node", nonempty=False),
            op=self.string(d.get("op", ""), f"{where}.op", nonempty=False),
            distribution=self.string(d.get("distribution", ""), f"{where}.distribution", nonempty=False),
            params=tuple((k, _freeze(val)) for k, val in raw),
            shape=tuple(shape) if shape is not None else None,
            dtype=self.string(d.get("dtype", ""), f"{where}.dtype", nonempty=False),
            source=self.string(d.get("source", ""), f"{where}.source", nonempty=False),
        )

    def state(self, d: Mapping[str, Any], inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...],
              lifted: tuple[RandomInput, ...]) -> tuple[CarriedState, ...]:
        """The optional ``state`` list: each entry names one input and one output of the same dtype
        and shape, neither used by another entry, the input not a lifted random draw."""
        ins, outs = {t.name: t for t in inputs}, {t.name: t for t in outputs}
        drawn = {r.input for r in lifted}
        out: list[CarriedState] = []
        for i, v in enumerate(self.array(d.get("state", []), "state")):
            where = f"state[{i}]"
            e = self.obj(v, where)
            st = CarriedState(attribute=self.string(self.req(e, "attribute", where), f"{where}.attribute"),
                       input=self.string(self.req(e, "input", where), f"{where}.input"),
                       output=self.string(self.req(e, "output", where), f"{where}.output"))
            if st.input not in ins:
                raise self.fail(f"{where}.input", f"{st.input!r} is not one of the inputs")
            if st.input in drawn:
                raise self.fail(f"{where}.input", f"{st.input!r} is a lifted random draw, not state")
            if st.output not in outs:
                raise self.fail(f"{where}.output", f"{st.output!r} is not one of the outputs")
            a, b = ins[st.input], outs[st.output]
            if (a.dtype, a.shape) != (b.dtype, b.shape):
                raise self.fail(where, f"input {a.name} ({a.dtype}{list(a.shape)}) and output {b.name} "
                                       f"({b.dtype}{list(b.shape)}) must have one dtype and shape")
            for key in ("attribute", "input", "output"):
                if any(getattr(o, key) == getattr(st, key) for o in out):
                    raise self.fail(f"{where}.{key}", f"{getattr(st, key)!r} is named by an earlier state entry")
            out.append(st)
        return tuple(out)

    def task(self, v: Any, where: str) -> TaskRecord:
        d = self.obj(v, where)
        covers = self.array(self.req(d, "covers", where), f"{where}.covers")
        return TaskRecord(
            name=self.string(self.req(d, "name", where), f"{where}.name"),
            strategy=self.string(self.req(d, "strategy", where), f"{where}.strategy"),
            covers=tuple(self.string(c, f"{where}.covers[{i}]") for i, c in enumerate(covers)),
            flops=self.count(d.get("flops", 0), f"{where}.flops"),
            bytes=self.count(d.get("bytes", 0), f"{where}.bytes"),
            origin=self.string(d.get("origin", "template"), f"{where}.origin"),
            phase=self.phase(d.get("phase", "run"), f"{where}.phase"),
            kernels_of=self.string(d.get("kernels_of", ""), f"{where}.kernels_of", nonempty=False),
        )

    def ref_op(self, v: Any, where: str) -> ReferenceOp:
        d = self.obj(v, where)
        return ReferenceOp(
            node=self.string(self.req(d, "node", where), f"{where}.node"),
            op=self.string(self.req(d, "op", where), f"{where}.op"),
            flops=self.count(d.get("flops", 0), f"{where}.flops"),
            bytes=self.count(d.get("bytes", 0), f"{where}.bytes"),
        )

    def manifest(self, data: Any) -> Manifest:
        d = self.obj(data, "")
        fmt = self.req(d, "format", "")
        if fmt != FORMAT:
            raise self.fail("format", f"expected \"{FORMAT}\", got {_show(fmt)}")
        version = self.req(d, "version", "")
        if version != FORMAT_VERSION:
            raise self.fail("version", f"this stitchcuda reads version {FORMAT_VERSION}, got {_show(version)}")
        abi = self.req(d, "abi_version", "")
        if abi != ABI_VERSION:
            raise self.fail("abi_version", f"this stitchcuda speaks program ABI {ABI_VERSION}, got {_show(abi)}")
        name = self.string(self.req(d, "name", ""), "name")
        precision = self.string(self.req(d, "precision", ""), "precision")
        if precision not in PRECISIONS:
            raise self.fail("precision", f"expected one of {', '.join(PRECISIONS)}, got {precision!r}")
        arch = self.string(self.req(d, "arch", ""), "arch")
        if not _ARCH_RE.match(arch):
            raise self.fail("arch", f"expected a target like \"sm_90\", got {arch!r}")
        source_hash = self.string(self.req(d, "source_hash", ""), "source_hash")
        if not _HASH_RE.match(source_hash.lower()):
            raise self.fail("source_hash", "expected the SHA-256 hex digest of program.cu")
        reference = self.reference(self.req(d, "reference", ""))

        inputs = self.tensors(d, "inputs", required=True)
        outputs = self.tensors(d, "outputs", required=True)
        weights = self.tensors(d, "weights", required=False)
        if not outputs:
            raise self.fail("outputs", "a program must have at least one output")
        seen: dict[str, str] = {}
        for group, specs in (("inputs", inputs), ("outputs", outputs), ("weights", weights)):
            for i, t in enumerate(specs):
                if t.name in seen:
                    raise self.fail(f"{group}[{i}].name", f"{t.name!r} is already used by {seen[t.name]}")
                seen[t.name] = f"{group}[{i}]"

        lifted = tuple(self.lifted(v, f"lifted_random[{i}]")
                       for i, v in enumerate(self.array(d.get("lifted_random", []), "lifted_random")))
        by_name = {t.name: t for t in inputs}
        for i, r in enumerate(lifted):
            spec = by_name.get(r.input)
            if spec is None:
                raise self.fail(f"lifted_random[{i}].input", f"{r.input!r} is not one of the inputs")
            if (r.shape is not None and r.shape != spec.shape) or (r.dtype and r.dtype != spec.dtype):
                raise self.fail(f"lifted_random[{i}]", f"{r.dtype or spec.dtype}{list(r.shape or spec.shape)} does "
                                                       f"not match input {r.input} ({spec.dtype}{list(spec.shape)})")

        state = self.state(d, inputs, outputs, lifted)
        tasks = tuple(self.task(v, f"tasks[{i}]") for i, v in enumerate(self.array(d.get("tasks", []), "tasks")))
        _unique((t.name for t in tasks), "tasks", "task name", self)
        ops = tuple(self.ref_op(v, f"reference_ops[{i}]")
                    for i, v in enumerate(self.array(d.get("reference_ops", []), "reference_ops")))
        _unique((o.node for o in ops), "reference_ops", "node", self)

        dynamic = self.dynamic(d["dynamic"], inputs, outputs) if "dynamic" in d else None
        return Manifest(name=name, precision=precision, arch=arch, source_hash=source_hash,
                        reference=reference, inputs=inputs, outputs=outputs, weights=weights,
                        lifted_random=lifted, tasks=tasks, reference_ops=ops, state=state,
                        generator=self.string(d.get("generator", ""), "generator", nonempty=False),
                        dynamic=dynamic)

    def tuned(self, v: Any, lo: int, hi: int, where: str) -> tuple[int, ...]:
        sizes = tuple(self.count(x, f"{where}[{i}]") for i, x in enumerate(self.array(v, where)))
        if any(not lo <= x <= hi for x in sizes):
            raise self.fail(where, f"expected sizes within {lo}..{hi}, got {_show(list(sizes))}")
        return sizes

    def dynamic(self, v: Any, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> Dynamic:
        d = self.obj(v, "dynamic")
        names = {t.name: t for t in inputs}
        dims = []
        for i, e in enumerate(self.array(self.req(d, "dims", "dynamic"), "dynamic.dims")):
            w = f"dynamic.dims[{i}]"
            e = self.obj(e, w)
            lo, hi = self.count(self.req(e, "min", w), f"{w}.min"), self.count(self.req(e, "max", w), f"{w}.max")
            if not 1 <= lo <= hi:
                raise self.fail(w, f"expected 1 <= min <= max, got {lo}..{hi}")
            places = []
            for j, pl in enumerate(self.array(self.req(e, "places", w), f"{w}.places")):
                if not (isinstance(pl, list) and len(pl) == 2 and pl[0] in names and isinstance(pl[1], int)
                        and 0 <= pl[1] < len(names[pl[0]].shape)):
                    raise self.fail(f"{w}.places[{j}]", f"expected [input name, axis], got {_show(pl)}")
                places.append((pl[0], pl[1]))
            if not places:
                raise self.fail(f"{w}.places", "a dynamic dimension sits somewhere in the inputs")
            dims.append(DynamicDim(self.string(self.req(e, "name", w), f"{w}.name"), lo, hi, tuple(places),
                                   self.count(e.get("multiple_of", 1), f"{w}.multiple_of") or 1,
                                   self.string(e.get("variable", ""), f"{w}.variable", nonempty=False),
                                   self.tuned(e.get("tuned", []), lo, hi, f"{w}.tuned")))
        symbols = {x.name: x.max for x in dims}

        def shapes(key: str, specs: tuple[TensorSpec, ...]) -> tuple[tuple[int | str, ...], ...]:
            raw = self.array(self.req(d, key, "dynamic"), f"dynamic.{key}")
            if len(raw) != len(specs):
                raise self.fail(f"dynamic.{key}", f"expected {len(specs)} shape(s), got {len(raw)}")
            out = []
            for i, (sh, spec) in enumerate(zip(raw, specs)):
                w = f"dynamic.{key}[{i}]"
                if not isinstance(sh, list) or len(sh) != len(spec.shape):
                    raise self.fail(w, f"expected {len(spec.shape)} dimension(s), got {_show(sh)}")
                for x, largest in zip(sh, spec.shape):
                    try:
                        ok = eval_dim(x, symbols) == largest
                    except (ValueError, SyntaxError, ShapeError):
                        ok = False
                    if isinstance(x, bool) or not isinstance(x, (int, str)) or not ok:
                        raise self.fail(w, f"{_show(x)} is not an expression of {', '.join(symbols)} that is "
                                           f"{largest} at their largest")
                out.append(tuple(sh))
            return tuple(out)

        return Dynamic(tuple(dims), shapes("inputs", inputs), shapes("outputs", outputs),
                       self.count(d.get("arena_bytes", 0), "dynamic.arena_bytes"))


def _unique(names, where: str, what: str, p: _ManifestReader) -> None:
    seen: set[str] = set()
    for i, n in enumerate(names):
        if n in seen:
            raise p.fail(f"{where}[{i}]", f"duplicate {what} {n!r}")
        seen.add(n)


def _freeze(v: Any) -> Any:
    """JSON lists as tuples, so a RandomInput's params compare and hash like the IR's."""
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def _show(v: Any) -> str:
    s = json.dumps(v) if not isinstance(v, (set, tuple)) else repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def check_weights_file(manifest: Manifest, path: str | Path) -> None:
    """Raise ManifestError unless the file holds exactly the manifest's weights (name, dtype, shape)."""
    try:
        stored = read_safetensors_header(path)
    except WeightsFileError as e:
        raise ManifestError(e.file, e.problem) from None
    want = {w.name: w for w in manifest.weights}
    missing = [n for n in want if n not in stored]
    extra = [n for n in stored if n not in want]
    if missing:
        raise ManifestError(path, f"lacks weight(s) the manifest lists: {', '.join(missing)}")
    if extra:
        raise ManifestError(path, f"holds tensor(s) the manifest does not list: {', '.join(extra)}")
    for name, w in want.items():
        s = stored[name]
        if s.dtype != w.dtype or s.shape != w.shape:
            raise ManifestError(path, f"weight {name!r} is {s.dtype}{list(s.shape)}, "
                                      f"the manifest says {w.dtype}{list(w.shape)}")


# ------------------------------------------------------------------ the program folder


@dataclass(frozen=True)
class ProgramDir:
    """A validated program folder."""

    root: Path
    manifest: Manifest
    source: Path
    weights: Path | None = None
    library: Path | None = None

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST_FILE

    def read_source(self) -> str:
        return self.source.read_text(encoding="utf-8", errors="replace")


def load_program_dir(path: str | Path, *, require_weights: bool = False) -> ProgramDir:
    """Open ``run/<name>/``: the manifest must load, program.cu must exist, and a weights file,
    when present (or required, or the manifest lists weights and ``require_weights``), must
    hold exactly the manifest's weights."""
    root = Path(path)
    if not root.is_dir():
        raise ManifestError(root, "program folder not found")
    source = root / PROGRAM_SOURCE
    if not source.is_file():
        raise ManifestError(source, "file not found (every program folder holds its source)")
    manifest = Manifest.load(root / MANIFEST_FILE)
    weights = root / WEIGHTS_FILE
    if weights.is_file():
        check_weights_file(manifest, weights)
    elif require_weights and manifest.weights:
        raise ManifestError(weights, f"file not found; the manifest lists {len(manifest.weights)} weight(s)")
    else:
        weights = None
    library = root / LIBRARY_FILE
    return ProgramDir(root=root, manifest=manifest, source=source, weights=weights,
                      library=library if library.is_file() else None)


__all__ = [
    "FORMAT", "FORMAT_VERSION", "ABI_VERSION", "PRECISIONS", "DTYPE_SIZES", "KNOWN_STRATEGIES",
    "PROGRAM_SOURCE", "MANIFEST_FILE", "WEIGHTS_FILE", "LIBRARY_FILE",
    "ManifestError", "ShapeError", "Dynamic", "DynamicDim", "eval_dim", "TensorSpec", "KernelBenchRef",
    "ReferenceSource", "RandomInput", "CarriedState", "TaskRecord", "ReferenceOp", "Manifest", "ProgramDir",
    "hash_source", "same_hash", "load_program_dir", "check_weights_file",
]
