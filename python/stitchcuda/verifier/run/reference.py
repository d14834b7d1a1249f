"""Which reference, and whether it fits the manifest: found, loaded and checked on the CPU.

A reference is named by a file (KernelBench format: ``Model``, ``get_inputs``,
``get_init_inputs``), by ``kernelbench:LEVEL:ID`` (read from the development set,
``$STITCHCUDA_KERNELBENCH`` or ``shared/kernelbench/dev.jsonl`` beside the checkout), or by the
manifest's own ``reference`` field.

:func:`validate_reference` is cheap and CPU-only (inputs and model on the meta device): it
catches a reference that does not load, whose ``get_inputs`` fails or returns non-tensors, or
whose inputs or parameters do not match the manifest, before anything is built or run. The
reference on the verification device is :class:`~.harness.ReferenceHarness`. Every problem raises
:class:`ProblemError`, whose message names the file and the problem.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import manifest as mf
from ...errors import ArgumentError

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
    sizes: tuple[tuple[str, int], ...] = ()  # module-level sizes set after loading (a dynamic program's shape)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "name": self.name, "path": self.path, "source": self.source,
                **({"sizes": [list(x) for x in self.sizes]} if self.sizes else {})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ReferenceSpec":
        return cls(d["label"], d["name"], d.get("path"), d.get("source"),
                   tuple((str(k), int(v)) for k, v in d.get("sizes", ())))


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
            return at_largest(load_kernelbench(int(parts[1]), int(parts[2]), root), manifest)
        return at_largest(_file_spec(Path(text)), manifest)
    if manifest is None:
        raise ProblemError(root / mf.MANIFEST_FILE, "no reference given and no manifest to name one")
    ref = manifest.reference
    if ref.kernelbench is not None:
        spec = load_kernelbench(ref.kernelbench.level, ref.kernelbench.problem_id, root)
    else:
        path = Path(ref.path or "")
        spec = _file_spec(path if path.is_absolute() else root / path, via=root / mf.MANIFEST_FILE)
    return at_largest(spec, manifest)


def at_largest(spec: ReferenceSpec, manifest: mf.Manifest | None) -> ReferenceSpec:
    """``spec`` with a dynamic program's module-level sizes at their largest: the shapes its manifest lists."""
    if manifest is None or manifest.dynamic is None:
        return spec
    return dataclasses.replace(spec, sizes=tuple(manifest.dynamic.largest_sizes().items()))


def _file_spec(path: Path, via: Path | None = None) -> ReferenceSpec:
    if not path.is_file():
        where = f" (named by {via})" if via else ""
        raise ProblemError(path, f"reference file not found{where}")
    return ReferenceSpec(str(path), path.stem, path=str(path.resolve()))


def load_module(spec: ReferenceSpec):
    """The reference as a ``frontend.Reference`` (its module executed)."""
    from ...frontend import CaptureError, load_reference

    try:
        ref = (load_reference(Path(spec.path), name=spec.name) if spec.path is not None
               else load_reference(spec.source or "", name=spec.name))
        for k, v in spec.sizes:  # a dynamic program judged at one shape of its range
            if not isinstance(getattr(ref.module, k, None), int):
                raise ProblemError(spec.label, f"the program's dynamic dimension sets {k}, which the reference does "
                                               "not define as a module-level integer")
            setattr(ref.module, k, v)
        return ref
    except CaptureError as e:
        text = str(e)
        for prefix in (spec.path or "", f"<{spec.name}>"):
            if prefix and text.startswith(prefix):
                text = text[len(prefix):].lstrip(": ")
        raise ProblemError(spec.label, text) from None
    except OSError as e:
        raise ProblemError(spec.label, f"cannot read: {e.strerror or e}") from None


def call_reference(spec: ReferenceSpec, fn, what: str) -> list[Any]:
    try:
        value = fn()
    except Exception as e:  # noqa: BLE001 - a broken reference is reported, not raised through
        raise ProblemError(spec.label, f"{what} failed: {type(e).__name__}: {e}") from None
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ProblemError(spec.label, f"{what} returned {type(value).__name__}, expected a list")


def split_args(spec: ReferenceSpec, args: list[Any], what: str):
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


def program_inputs(manifest: mf.Manifest) -> list[mf.TensorSpec]:
    """The inputs ``get_inputs()`` gives: not lifted random draws, not state."""
    lifted = {r.input for r in manifest.lifted_random} | {st.input for st in manifest.state}
    return [t for t in manifest.inputs if t.name not in lifted]


def state_attributes(model: Any, manifest: mf.Manifest, manifest_file: str | os.PathLike = mf.MANIFEST_FILE
                     ) -> list[tuple[Any, str]]:
    """``(owner module, attribute name)`` of each manifest ``state`` entry on ``model``: a plain tensor
    attribute (not a parameter or buffer) of the input's shape; ProblemError naming the entry otherwise."""
    from ...stateful import attribute_path, plain_tensor_attributes

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
    from ...stateful import changed_by_forward, plain_tensor_attributes

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


def inputs_on(spec: ReferenceSpec, module: Any, device: Any) -> list[Any]:
    """``get_inputs()`` with factory functions on ``device`` (the meta device gives shapes without
    data; a CUDA device draws on the GPU, where a multi-GiB input takes milliseconds, not the seconds
    the CPU's generator takes); tensors made elsewhere are moved there."""
    import torch

    with torch.device(device):
        args = call_reference(spec, module.get_inputs, "get_inputs()")
    return [a.to(device) if isinstance(a, torch.Tensor) and a.device != torch.device(device) else a for a in args]


def validate_reference(spec: ReferenceSpec, manifest: mf.Manifest, *, manifest_file: str | os.PathLike = "",
                       weights_file: str | os.PathLike | None = None) -> list[str]:
    """Load the reference and check it against the manifest on the CPU (no forward pass; inputs and
    model on the meta device where they can be). Returns notes; raises ProblemError on a mismatch."""
    import torch

    ref = load_module(spec)
    torch.manual_seed(0)
    init = call_reference(spec, ref.module.get_init_inputs, "get_init_inputs()")
    try:
        args = inputs_on(spec, ref.module, "meta")
    except ProblemError:
        args = call_reference(spec, ref.module.get_inputs, "get_inputs()")  # the error, or the values, on the CPU
    idx = split_args(spec, args, "get_inputs()")
    want = program_inputs(manifest)
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


def fp32_exact():
    """PyTorch's fp32 without TF32 (matmul and cuDNN), as the reference is computed."""
    from ...precision import fp32_exact as exact

    return exact()


def flatten_outputs(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flatten_outputs(o)]
    return []


__all__ = ["ProblemError", "ReferenceSpec", "KERNELBENCH_ENV", "kernelbench_candidates", "load_kernelbench",
           "resolve_reference", "load_module", "call_reference", "split_args", "program_inputs", "inputs_on",
           "state_attributes", "model_state", "validate_reference", "fp32_exact", "flatten_outputs"]
