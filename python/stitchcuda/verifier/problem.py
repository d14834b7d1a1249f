"""The reference side of verification: which reference, its weights, fresh inputs, its outputs.

A reference is named by a file (KernelBench format: ``Model``, ``get_inputs``,
``get_init_inputs``), by ``kernelbench:LEVEL:ID`` (read from the development set,
``$STITCHCUDA_KERNELBENCH`` or ``shared/kernelbench/dev.jsonl`` beside the checkout), or by the
manifest's own ``reference`` field.

:func:`validate_reference` is cheap and CPU-only (inputs and model on the meta device): it
catches a reference that does not load, whose ``get_inputs`` fails or returns non-tensors, or
whose inputs or parameters do not match the manifest, before anything is built or run.
:class:`Problem` is the real thing, on the verification device: the model built with the
Verifier's own seed, every parameter and buffer the manifest names taken from it (non-persistent
buffers included) and handed to both the reference and the program, fresh inputs per seed drawn
on the device, and the reference's outputs in fp32 eager (TF32 off, the KernelBench setting), in
float64 where it fits, and at a precision policy. Nothing in the program folder (its weights file)
flows into the reference. Every problem raises :class:`ProblemError`, whose message names the
file and the problem.

Random draws inside the reference's forward (manifest ``lifted_random``) are program inputs: the
harness draws them (``frontend.sample_random_inputs``) and the reference is evaluated from its
captured graph with the same draws (``frontend.evaluate_graph``), since the eager model would
draw its own.

State the reference keeps between calls in a plain tensor attribute (manifest ``state``) is a
program input and output too: each draw supplies the attribute's value before the call (for the
first seed drawn, the value the model holds once built; for every other seed, a fresh draw of
the attribute's shape, standard normal for floats, so a program that ignores its state input
cannot pass), the reference's attribute is set to a copy of that value before forward and read
after it, and the value read is the reference's output for the state's program output, judged
like any other. The model's attribute is put back after every call. A reference whose forward
changes an attribute the manifest's ``state`` does not list is refused.
"""

from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import manifest as mf
from ..errors import ArgumentError

KERNELBENCH_ENV = "STITCHCUDA_KERNELBENCH"


class ProblemError(ArgumentError):
    """A reference, manifest or weights file the Verifier cannot use; names the file and the problem."""

    def __init__(self, file: str | os.PathLike, problem: str):
        self.file = str(file)
        self.problem = problem
        super().__init__(f"{self.file}: {problem}")


@dataclass(frozen=True)
class ReferenceSpec:
    """Where the reference's source comes from; JSON-able, so a child process can load it again."""

    label: str  # what error messages name: the file path, or "kernelbench:L:ID (name)"
    name: str
    path: str | None = None
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "name": self.name, "path": self.path, "source": self.source}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ReferenceSpec":
        return cls(d["label"], d["name"], d.get("path"), d.get("source"))


# ------------------------------------------------------------------ finding the reference


def kernelbench_candidates(start: Path | None = None) -> list[Path]:
    """Where a KernelBench set may be: $STITCHCUDA_KERNELBENCH, then ``shared/kernelbench/dev.jsonl``
    and ``all.jsonl`` in or beside the working directory and ``start``'s parents."""
    out: list[Path] = []
    if os.environ.get(KERNELBENCH_ENV):
        out.append(Path(os.environ[KERNELBENCH_ENV]))
    bases = [Path.cwd()] + ([start.resolve()] if start else [])
    for base in bases:
        for d in (base, *base.parents):
            for name in ("dev.jsonl", "all.jsonl"):
                for cand in (d / "shared" / "kernelbench" / name, d.parent / "shared" / "kernelbench" / name):
                    if cand not in out:
                        out.append(cand)
    return out


def load_kernelbench(level: int, problem_id: int, start: Path | None = None) -> ReferenceSpec:
    label = f"kernelbench:{level}:{problem_id}"
    searched: list[Path] = []
    for path in kernelbench_candidates(start):
        if not path.is_file():
            continue
        searched.append(path)
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ProblemError(path, f"line {n}: not valid JSON ({e.msg})") from None
                if int(rec.get("level", -1)) == level and int(rec.get("problem_id", -1)) == problem_id:
                    name = str(rec.get("name") or f"level{level}_{problem_id}")
                    return ReferenceSpec(f"{label} ({name}, {path})", name, source=rec["source"])
    if searched:
        raise ProblemError(searched[0], f"no problem level {level} id {problem_id} in the KernelBench set"
                                        + (f" (nor in {', '.join(map(str, searched[1:]))})" if searched[1:] else ""))
    raise ProblemError(label, f"no KernelBench set found: set {KERNELBENCH_ENV} to a dev.jsonl "
                              "(one {level, problem_id, name, source} object per line)")


def resolve_reference(arg: str | os.PathLike | None, program_dir: str | os.PathLike,
                      manifest: mf.Manifest | None = None) -> ReferenceSpec:
    """``--reference FILE|kernelbench:L:ID``, or (``arg`` None) the manifest's own reference."""
    root = Path(program_dir)
    if arg is not None:
        text = os.fspath(arg)
        if text.startswith("kernelbench:"):
            parts = text.split(":")
            if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
                raise ProblemError(text, "expected kernelbench:LEVEL:ID, e.g. kernelbench:1:23")
            return load_kernelbench(int(parts[1]), int(parts[2]), root)
        return _file_spec(Path(text))
    if manifest is None:
        raise ProblemError(root / mf.MANIFEST_FILE, "no reference given and no manifest to name one")
    ref = manifest.reference
    if ref.kernelbench is not None:
        return load_kernelbench(ref.kernelbench.level, ref.kernelbench.problem_id, root)
    path = Path(ref.path or "")
    return _file_spec(path if path.is_absolute() else root / path, via=root / mf.MANIFEST_FILE)


def _file_spec(path: Path, via: Path | None = None) -> ReferenceSpec:
    if not path.is_file():
        where = f" (named by {via})" if via else ""
        raise ProblemError(path, f"reference file not found{where}")
    return ReferenceSpec(str(path), path.stem, path=str(path.resolve()))


def load_module(spec: ReferenceSpec):
    """The reference as a ``frontend.Reference`` (its module executed)."""
    from ..frontend import CaptureError, load_reference

    try:
        if spec.path is not None:
            return load_reference(Path(spec.path), name=spec.name)
        return load_reference(spec.source or "", name=spec.name)
    except CaptureError as e:
        text = str(e)
        for prefix in (spec.path or "", f"<{spec.name}>"):
            if prefix and text.startswith(prefix):
                text = text[len(prefix):].lstrip(": ")
        raise ProblemError(spec.label, text) from None
    except OSError as e:
        raise ProblemError(spec.label, f"cannot read: {e.strerror or e}") from None


def _call(spec: ReferenceSpec, fn, what: str) -> list[Any]:
    try:
        value = fn()
    except Exception as e:  # noqa: BLE001 - a broken reference is reported, not raised through
        raise ProblemError(spec.label, f"{what} failed: {type(e).__name__}: {e}") from None
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ProblemError(spec.label, f"{what} returned {type(value).__name__}, expected a list")


def _split_args(spec: ReferenceSpec, args: list[Any], what: str):
    import torch

    tensors = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            tensors.append(i)
        elif not isinstance(a, (bool, int, float)) and a is not None:
            raise ProblemError(spec.label, f"{what}[{i}] is a {type(a).__name__}: expected tensors (or plain "
                                           "numbers, which the program bakes in)")
    if not tensors:
        raise ProblemError(spec.label, f"{what} returned no tensor")
    return tensors


def _program_inputs(manifest: mf.Manifest) -> list[mf.TensorSpec]:
    """The inputs ``get_inputs()`` gives: not lifted random draws, not state."""
    lifted = {r.input for r in manifest.lifted_random} | {st.input for st in manifest.state}
    return [t for t in manifest.inputs if t.name not in lifted]


def state_attributes(model: Any, manifest: mf.Manifest, manifest_file: str | os.PathLike = mf.MANIFEST_FILE
                     ) -> list[tuple[Any, str]]:
    """``(owner module, attribute name)`` of each manifest ``state`` entry on ``model``: a plain tensor
    attribute (not a parameter or buffer) of the input's shape; ProblemError naming the entry otherwise."""
    from ..stateful import attribute_path, plain_tensor_attributes

    attrs = {attribute_path(a): a for a in plain_tensor_attributes(model)}
    specs = {t.name: t for t in manifest.inputs}
    out = []
    for i, st in enumerate(manifest.state):
        a = attrs.get(st.attribute)
        if a is None:
            raise ProblemError(manifest_file, f"state[{i}].attribute: the reference model has no plain tensor "
                                              f"attribute {st.attribute!r} (it has {', '.join(attrs) or 'none'})")
        have, want = tuple(vars(a[0])[a[2]].shape), specs[st.input].shape
        if have != want:
            raise ProblemError(manifest_file, f"state[{i}]: model.{st.attribute} is {list(have)}; input {st.input} "
                                              f"is {list(want)}")
        out.append((a[0], a[2]))
    return out


def _unlisted_state(spec: ReferenceSpec, model: Any, args: list[Any], manifest: mf.Manifest) -> None:
    """Refuse a reference whose forward changes a plain tensor attribute the manifest's ``state``
    does not list: its outputs would depend on the calls before, which the program cannot see."""
    from ..stateful import changed_by_forward, plain_tensor_attributes

    if not plain_tensor_attributes(model):
        return  # nothing to keep state in (most references): no trial forward
    listed = {st.attribute for st in manifest.state}
    unlisted = [a for a in changed_by_forward(model, args) if a not in listed]
    if unlisted:
        raise ProblemError(spec.label, f"forward changes the tensor attribute {unlisted[0]!r}, state kept between "
                                       "calls that the manifest's state does not list: build the program again "
                                       "(stitchcuda build makes it an input and an output)")


def model_state(model: Any) -> dict[str, Any]:
    """Every parameter and buffer of ``model`` by its qualified name, non-persistent buffers included
    (a causal mask registered with ``persistent=False`` is not in ``state_dict()`` but is a weight of
    the program all the same)."""
    state = dict(model.named_parameters(remove_duplicate=False))
    state.update(dict(model.named_buffers(remove_duplicate=False)))
    return state


def _inputs_on(spec: ReferenceSpec, module: Any, device: Any) -> list[Any]:
    """``get_inputs()`` with factory functions on ``device`` (the meta device gives shapes without
    data; a CUDA device draws on the GPU, where a multi-GiB input takes milliseconds, not the seconds
    the CPU's generator takes); tensors made elsewhere are moved there."""
    import torch

    with torch.device(device):
        args = _call(spec, module.get_inputs, "get_inputs()")
    return [a.to(device) if isinstance(a, torch.Tensor) and a.device != torch.device(device) else a for a in args]


def validate_reference(spec: ReferenceSpec, manifest: mf.Manifest, *, manifest_file: str | os.PathLike = "",
                       weights_file: str | os.PathLike | None = None) -> list[str]:
    """Load the reference and check it against the manifest on the CPU (no forward pass; inputs and
    model on the meta device where they can be). Returns notes; raises ProblemError on a mismatch."""
    import torch

    ref = load_module(spec)
    torch.manual_seed(0)
    init = _call(spec, ref.module.get_init_inputs, "get_init_inputs()")
    try:
        args = _inputs_on(spec, ref.module, "meta")
    except ProblemError:
        args = _call(spec, ref.module.get_inputs, "get_inputs()")  # the error, or the values, on the CPU
    idx = _split_args(spec, args, "get_inputs()")
    want = _program_inputs(manifest)
    mfile = manifest_file or mf.MANIFEST_FILE
    if len(idx) != len(want):
        raise ProblemError(mfile, f"lists {len(want)} input(s) ({', '.join(t.name for t in want) or 'none'}) "
                                  f"besides lifted random draws; the reference's get_inputs() gives {len(idx)} "
                                  f"tensor(s)")
    notes = []
    for i, t in zip(idx, want):
        a = args[i]
        if tuple(a.shape) != t.shape:
            raise ProblemError(mfile, f"input {t.name} is {t.dtype}{list(t.shape)}; the reference's get_inputs()[{i}] "
                                      f"is {str(a.dtype).replace('torch.', '')}{list(a.shape)}")
        have = str(a.dtype).replace("torch.", "")
        if have != t.dtype:
            if not (a.dtype.is_floating_point and t.dtype in ("float32", "float16", "bfloat16", "float64")):
                raise ProblemError(mfile, f"input {t.name} is {t.dtype}; the reference gives {have}, which cannot be "
                                          "converted")
            notes.append(f"input {t.name}: the reference draws {have}, the program takes {t.dtype} (rounded once, "
                         "and the reference gets the rounded values)")
    try:
        with torch.device("meta"):
            model = ref.Model(*init)
        state = model_state(model)
    except Exception as e:  # noqa: BLE001 - some models cannot be built on meta; checked on the device later
        return notes + [f"parameters not checked before the run (the model cannot be built on the meta device: "
                        f"{type(e).__name__})"]
    state_attributes(model, manifest, mfile)
    _unlisted_state(spec, model, args, manifest)
    for w in manifest.weights:
        if w.name not in state:
            raise ProblemError(mfile, f"weight {w.name!r} is not a parameter or buffer of the reference model "
                                      f"(it has {', '.join(list(state)[:6])}{' ...' if len(state) > 6 else ''})")
        have = tuple(state[w.name].shape)
        if have != w.shape:
            raise ProblemError(mfile, f"weight {w.name!r} is {list(w.shape)}; the reference's parameter is "
                                      f"{list(have)}")
    del weights_file  # the Verifier draws the weights itself: the folder's file plays no part
    return notes


# ------------------------------------------------------------------ the problem on a device


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"


def fp32_exact():
    """PyTorch's fp32 without TF32 (matmul and cuDNN), as the reference is computed."""
    from ..precision import fp32_exact as exact

    return exact()


def _flatten(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flatten(o)]
    return []


class Problem:
    """The reference on ``device`` with weights the Verifier drew itself (module docstring).

    The model is built with ``weights_seed`` (``torch.manual_seed`` then ``Model(*get_init_inputs())``)
    and every tensor the manifest lists as a weight is taken from it by name: parameters, buffers,
    non-persistent buffers. ``weights`` (manifest order and dtypes, contiguous, on the device) is what
    the program's create() gets; the reference computes with the same values. Nothing of the program
    folder (its weights file) flows into the reference.

    ``draw(seed)`` gives fresh inputs (drawn on the device, state as the module docstring says);
    ``forward`` the reference's outputs in
    fp32 eager with TF32 off, ``forward64`` in float64 (None when the model cannot be cast or the
    device has no room), ``forward_at(policy)`` with PyTorch allowed that policy's precision.
    Implements ``correctness.ReferenceLike``.
    """

    def __init__(self, spec: ReferenceSpec, manifest: mf.Manifest, device: Any, *, weights_seed: int = 0,
                 manifest_file: str | os.PathLike = mf.MANIFEST_FILE):
        import torch

        from .compare import torch_dtype

        self.spec, self.manifest, self.device = spec, manifest, torch.device(device)
        self.input_specs, self.output_specs = manifest.inputs, manifest.outputs
        self.notes: list[str] = []
        self.module = load_module(spec)
        torch.manual_seed(weights_seed)
        init = _call(spec, self.module.module.get_init_inputs, "get_init_inputs()")
        try:
            with torch.device(self.device):  # initialised where it runs: a GiB of weights in milliseconds
                model = self.module.Model(*init)
        except Exception as e:  # noqa: BLE001
            raise ProblemError(spec.label, f"Model(*get_init_inputs()) failed: {type(e).__name__}: {e}") from None
        model = model.to(self.device)
        state = model_state(model)
        weights = []
        for w in manifest.weights:
            if w.name not in state:
                raise ProblemError(manifest_file, f"weight {w.name!r} is not a parameter or buffer of the reference "
                                                  f"model (it has {', '.join(list(state)[:6])}"
                                                  f"{' ...' if len(state) > 6 else ''})")
            value = state[w.name].detach()
            if tuple(value.shape) != w.shape:
                raise ProblemError(manifest_file, f"weight {w.name!r} is {list(value.shape)} in the reference; the "
                                                  f"manifest says {list(w.shape)}")
            weights.append(value.to(torch_dtype(w.dtype)).contiguous().clone())
        self.weights = weights
        self.model = model
        from .memory import Budget

        self.budget = Budget(self.device)  # where the copies of the inputs handed to the reference go
        self._model64: Any = None
        self._no64 = ""
        self._graph = None
        self._graph_weights: dict[str, Any] = {}
        lifted = {r.input for r in manifest.lifted_random}
        self._lifted = [t for t in manifest.inputs if t.name in lifted]
        self._plain = _program_inputs(manifest)
        self.lifted_indices = tuple(i for i, t in enumerate(manifest.inputs) if t.name in lifted)
        position = {t.name: i for i, t in enumerate(manifest.inputs)}
        #: Where each state entry's value before the call is among the program's inputs.
        self.state_indices = tuple(position[st.input] for st in manifest.state)
        self._state_attrs = state_attributes(model, manifest, manifest_file)
        self._initial_state = [vars(m)[k].detach().to(self.device).clone() for m, k in self._state_attrs]
        self._first_seed: int | None = None
        if self._lifted:
            self._capture()

    def nbytes(self) -> int:
        """Bytes of one set of inputs, outputs and weights (what a float64 copy would double)."""
        return sum(t.nbytes for t in (*self.manifest.inputs, *self.manifest.outputs, *self.manifest.weights))

    def _capture(self) -> None:
        import torch

        from ..frontend import CaptureError, capture

        torch.manual_seed(0)
        args = [a.to(self.device) if isinstance(a, torch.Tensor) else a
                for a in _call(self.spec, self.module.module.get_inputs, "get_inputs()")]
        try:
            cap = capture(self.model, args, self.spec.name, supported_ops=None,
                          state="lift" if self.manifest.state else "refuse")
        except CaptureError as e:
            raise ProblemError(self.spec.label, f"the reference draws random numbers in forward and could not be "
                                                f"captured to evaluate it with the harness's draws: {e}") from None
        names = [t.name for t in cap.graph.inputs]
        missing = [t.name for t in self.manifest.inputs if t.name not in names]
        if missing:
            raise ProblemError(mf.MANIFEST_FILE, f"input(s) {', '.join(missing)} are not inputs of the captured "
                                                 f"reference graph ({', '.join(names)})")
        self._graph = cap.graph
        self._graph_weights = dict(cap.weights)
        self.notes.append("the reference draws random numbers in forward: its outputs come from the captured graph "
                          "evaluated on the harness's draws")

    def draw(self, seed: int):
        """Fresh inputs under ``seed``: ``get_inputs()`` drawn on the device, in manifest order and
        dtypes (a Draw), with the draws lifted from forward made by the harness."""
        import torch

        from .compare import torch_dtype
        from .correctness import Draw

        torch.manual_seed(seed)
        args = _inputs_on(self.spec, self.module.module, self.device)
        idx = _split_args(self.spec, args, "get_inputs()")
        if len(idx) != len(self._plain):
            raise ProblemError(mf.MANIFEST_FILE, f"lists {len(self._plain)} input(s); get_inputs() gave {len(idx)} "
                                                 "tensor(s)")
        program: dict[str, Any] = {}
        model_args = list(args)
        dtypes = []
        for i, spec in zip(idx, self._plain):
            a = args[i]
            p = a.to(device=self.device, dtype=torch_dtype(spec.dtype)).contiguous()
            if tuple(p.shape) != spec.shape:
                raise ProblemError(mf.MANIFEST_FILE, f"input {spec.name} is {list(spec.shape)}; get_inputs() gave "
                                                     f"{list(p.shape)}")
            program[spec.name] = p
            model_args[i] = None  # filled with whatever inputs the reference is asked about
            dtypes.append(a.dtype)
        del args
        if self._lifted:
            from ..frontend import sample_random_inputs

            drawn = sample_random_inputs(self._graph, seed=seed, device=self.device)
            for spec in self._lifted:
                program[spec.name] = drawn[spec.name].to(torch_dtype(spec.dtype)).contiguous()
        if self._first_seed is None:
            self._first_seed = seed
        for i, initial in zip(self.state_indices, self._initial_state):
            spec = self.manifest.inputs[i]
            value = initial if seed == self._first_seed else _draw_like(spec.shape, initial.dtype, self.device)
            program[spec.name] = value.to(torch_dtype(spec.dtype)).contiguous().clone()
        return Draw(program=[program[t.name] for t in self.manifest.inputs], model_args=model_args, seed=seed,
                    arg_index=tuple(idx), arg_dtypes=tuple(dtypes))

    # -------------------------------------------------------------- outputs

    def model_args(self, draw, inputs=None) -> list[Any]:
        """The reference's forward arguments for program ``inputs`` (default: the draw's), each in the
        dtype the reference drew; copies where the memory budget allows one on the device (a
        reference may write its inputs), else the program's own tensors (through an alias, so an
        in-place metadata change stays the reference's)."""
        return self._model_args(draw, inputs)[0]

    def _model_args(self, draw, inputs=None) -> tuple[list[Any], list[Any]]:
        """``(arguments, the program's tensors handed over uncopied)``."""
        inputs = list(draw.program if inputs is None else inputs)
        given = {s.name for s in self._plain}
        plain = [t for spec, t in zip(self.manifest.inputs, inputs) if spec.name in given]
        args = list(draw.model_args)
        same = [t for want, t in zip(draw.arg_dtypes, plain) if t.dtype == want]
        copy_ok = self.budget.on_device(sum(t.numel() * t.element_size() for t in same))
        shared = []
        for pos, want, t in zip(draw.arg_index, draw.arg_dtypes, plain):
            if t.dtype != want:
                args[pos] = t.to(want)
            elif copy_ok:
                args[pos] = t.clone()
            else:
                args[pos] = t.view(t.shape)
                shared.append(t)
        return args, shared

    def _run_model(self, model, draw, inputs) -> Any:
        """``model`` on the arguments for ``inputs``; where the program's own tensors were handed over
        uncopied, a checksum before and after proves the reference left them as they were."""
        args, shared = self._model_args(draw, inputs)
        before = [_checksum(t) for t in shared]
        out = self._call_with_state(model, args, draw.program if inputs is None else inputs)
        for t, c in zip(shared, before):
            if _checksum(t) != c:
                raise ProblemError(self.spec.label, "the reference's forward writes its inputs in place, and they are "
                                                    "too large for a device copy under the Verifier's memory budget: "
                                                    "set STITCHCUDA_VERIFY_COPY_GIB above "
                                                    f"{t.numel() * t.element_size() / 2**30:.1f} to verify it")
        return out

    def forward(self, draw, inputs=None) -> list[Any]:
        """The reference's outputs for ``inputs`` (default: the draw's), fp32 eager, TF32 off."""
        import torch

        with torch.no_grad(), fp32_exact():
            if self._graph is not None:
                return self._graph_forward(draw, inputs, self._graph_weights, torch.float32)
            out = self._run_model(self.model, draw, inputs)
        return [t.detach() for t in _flatten(out)]

    def forward_at(self, policy: str, draw, inputs=None) -> list[Any] | None:
        """The reference's outputs with PyTorch allowed ``policy``'s precision (TF32 flags, autocast),
        as a program honestly computing at that policy would get them; None where that means nothing
        here (a CPU device, where neither TF32 nor CUDA autocast applies)."""
        import torch

        from ..precision import get

        if self.device.type != "cuda":
            return None
        try:
            with torch.no_grad(), get(policy).baseline():
                if self._graph is not None:
                    return [t.float() for t in self._graph_forward(draw, inputs, self._graph_weights, torch.float32)]
                out = self._run_model(self.model, draw, inputs)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as e:  # PyTorch's own limit (an op autocast leaves in the wrong dtype): no comparison
            note = f"PyTorch cannot run the reference at {policy} ({_first_line(e)}): not compared at {policy}"
            if note not in self.notes:
                self.notes.append(note)
            return None
        return [t.detach().float() if t.is_floating_point() else t.detach() for t in _flatten(out)]

    def forward64(self, draw, inputs=None) -> list[Any] | None:
        """The reference in float64, or None (with a note) when the model cannot be cast or a float64
        copy of its inputs, outputs and weights does not fit on the device."""
        import torch

        if self._no64:
            return None
        if not _room_for(2 * self.nbytes(), 3, self.device):
            self._no64 = "no float64 reference: a float64 copy of inputs, outputs and weights does not fit on the device"
            self.notes.append(self._no64)
            return None
        try:
            with torch.no_grad():
                if self._graph is not None:
                    w64 = {k: (v.double() if v.is_floating_point() else v) for k, v in self._graph_weights.items()}
                    return self._graph_forward(draw, inputs, w64, torch.float64)
                if self._model64 is None:
                    self._model64 = copy.deepcopy(self.model).double()
                args = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                        for a in self.model_args(draw, inputs)]  # float64 copies: the inputs cannot be written
                out = self._call_with_state(self._model64, args, draw.program if inputs is None else inputs,
                                            torch.float64)
                return [t.detach() for t in _flatten(out)]
        except Exception as e:  # noqa: BLE001 - some ops have no float64 kernel, or no room: fp32 only
            self._no64 = f"no float64 reference ({type(e).__name__}: {str(e)[:120]})"
            self.notes.append(self._no64)
            self._model64 = None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return None

    def _call_with_state(self, model, args: list[Any], inputs, float_dtype: Any = None) -> Any:
        """``model(*args)`` with each state attribute set to a copy of its program input (cast to
        ``float_dtype`` for a float64 model, else to the dtype the model holds it in) and read after
        the call into the state's output slot; the attributes are put back whatever forward did."""
        if not self.state_indices:
            return model(*args)
        from ..stateful import find_attributes

        attrs = [(m, k) for m, _, k in find_attributes(model, [st.attribute for st in self.manifest.state])] \
            if model is not self.model else self._state_attrs
        saved = [vars(m)[k] for m, k in attrs]
        try:
            for (m, k), i, initial in zip(attrs, self.state_indices, self._initial_state):
                want = float_dtype if float_dtype is not None and initial.is_floating_point() else initial.dtype
                vars(m)[k] = inputs[i].to(dtype=want, copy=True)
            outs = _flatten(model(*args))
            after = [vars(m)[k] for m, k in attrs]
        finally:
            for (m, k), v in zip(attrs, saved):
                vars(m)[k] = v
        return self._with_state(outs, after)

    def _with_state(self, outs: list[Any], after: list[Any]) -> list[Any]:
        """The reference's outputs in manifest order: the state's values after the call in the state
        entries' output slots, forward's own outputs in the others (in order)."""
        slot = {st.output: k for k, st in enumerate(self.manifest.state)}
        if len(outs) != len(self.manifest.outputs) - len(slot):
            return outs + after  # a count the manifest does not have: check_shapes names it
        own = iter(outs)
        return [after[slot[o.name]] if o.name in slot else next(own) for o in self.manifest.outputs]

    def _graph_forward(self, draw, inputs, weights, float_dtype) -> list[Any]:
        from ..frontend import evaluate_graph

        feed = {}
        for spec, t in zip(self.manifest.inputs, draw.program if inputs is None else inputs):
            feed[spec.name] = t.to(float_dtype) if t.is_floating_point() else t
        return [t.detach() for t in evaluate_graph(self._graph, feed, weights)]


def _draw_like(shape: tuple[int, ...], dtype: Any, device: Any) -> Any:
    """A state value for a trial: standard normal for floats, 0..15 for integers, fair coins for
    booleans (drawn from the global generator, seeded by the draw)."""
    import torch

    if dtype.is_floating_point:
        return torch.randn(shape, device=device).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, device=device) < 0.5
    return torch.randint(0, 16, shape, device=device, dtype=dtype)


def _checksum(t: Any) -> tuple[int, int]:
    """Two sums of ``t``'s bits (all elements, even positions): any write the reference makes to its
    inputs changes one (a cheap read; the reference is not an adversary, the program is)."""
    import torch

    from .compare import CHUNK, bits

    b = bits(t).reshape(-1)
    acc = torch.zeros(2, dtype=torch.int64, device=b.device)
    for lo in range(0, b.numel(), CHUNK):
        c = b[lo:lo + CHUNK]
        acc[0] += c.sum(dtype=torch.int64)
        acc[1] += c[0::2].sum(dtype=torch.int64)  # CHUNK is even: the even positions of the whole
    a0, a1 = acc.tolist()
    return a0, a1


def _room_for(nbytes: int, factor: float, device: Any) -> bool:
    """Whether ``factor`` times ``nbytes`` fits in the device's free memory (always on the CPU)."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return True
    free, total = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)  # torch's own cache
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda d: 0.9)(device)
    cap = fraction * total - torch.cuda.memory_allocated(device)  # what torch may still take in this process
    return nbytes * factor <= 0.9 * min(free, cap)


def tensor_bytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * mf.DTYPE_SIZES[dtype]


__all__ = ["ProblemError", "ReferenceSpec", "resolve_reference", "load_kernelbench", "kernelbench_candidates",
           "load_module", "validate_reference", "model_state", "state_attributes", "fp32_exact", "Problem",
           "KERNELBENCH_ENV"]
