"""Reference to program folder, deterministically: capture -> plan -> code -> write -> compile.

:func:`build_program` is the whole path without an LLM, and ``stitchcuda build`` its command:

1. load the reference (a KernelBench-format file, ``kernelbench:LEVEL:ID`` from the
   development set, or an ``nn.Module`` with example inputs) and capture it on the meta
   device (shapes only: the development problems' tensors run to gigabytes);
2. build the model on the CPU with ``torch.manual_seed(seed)`` first — exactly as the
   Verifier and KernelBench's harness do — and take its weights by ``state_dict`` name;
3. :func:`stitchcuda.plan.plan` under the precision policy, :func:`stitchcuda.code.code`;
4. write the program folder atomically: ``program.cu``, ``manifest.json``,
   ``weights.safetensors``, ``plan.json`` and a copy of the reference (``reference.py``);
5. compile through the build cache (:mod:`stitchcuda.build`) for ``arch`` (the GPU's, else
   ``STITCHCUDA_ARCH`` or sm_90: a machine without a GPU builds too) and copy the library
   into the folder with a build record, so the folder is self-contained.

Failures before the program exists raise (``UnsupportedOpError`` names every unsupported
operator and its line; ``PlanError`` what the planner cannot map); a compile failure is a
value in the returned :class:`BuildOutcome`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from . import build as _build
from . import manifest as mf
from .precision import NAMES as _POLICY_NAMES

DEFAULT_OUT = "run"


@dataclass(frozen=True)
class BuildOutcome:
    """Where the program went and what it took: the folder, the plan, the manifest, the build
    result (None when not compiled), and seconds per stage."""

    directory: Path
    plan: Any
    manifest: mf.Manifest
    build: _build.BuildResult | None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.build is None or self.build.ok


def _reference(reference: Any, name: str | None):
    """(frontend.Reference, manifest ReferenceSource, source text or None)."""
    from . import frontend

    if isinstance(reference, frontend.Reference):
        return reference, mf.ReferenceSource(path="reference.py"), reference.source
    text = os.fspath(reference)
    m = re.fullmatch(r"kernelbench:(\d+):(\d+)", text)
    if m:
        from .verifier.problem import load_kernelbench

        level, pid = int(m.group(1)), int(m.group(2))
        spec = load_kernelbench(level, pid)
        ref = frontend.load_reference(spec.source, name=name or spec.name)
        return ref, mf.ReferenceSource(kernelbench=mf.KernelBenchRef(level, pid, spec.name)), spec.source
    path = Path(text)
    if not path.is_file():
        raise FileNotFoundError(f"{text}: no such reference file (or use kernelbench:LEVEL:ID)")
    ref = frontend.load_reference(path, name=name)
    return ref, mf.ReferenceSource(path="reference.py"), ref.source


def model_weights(model: Any, graph: Any) -> dict[str, Any]:
    """The graph's weights from a model's parameters and buffers (persistent or not), as
    contiguous CPU tensors keyed by their state_dict names."""
    named = dict(model.named_parameters(remove_duplicate=False))
    named.update(dict(model.named_buffers(remove_duplicate=False)))
    out = {}
    for w in graph.weights:
        if w.name not in named:
            return {}
        out[w.name] = named[w.name].detach().to("cpu").contiguous()
    return out


def _weights(ref: Any, graph: Any, seed: int) -> dict[str, Any]:
    import torch

    from . import frontend

    torch.manual_seed(seed)
    model = ref.Model(*ref.get_init_inputs())
    w = model_weights(model, graph)
    if w or not graph.weights:
        return w
    # Tensor constants that are not parameters or buffers: capture on the CPU for real.
    from .ops import supported

    cap = frontend.capture_reference(ref, device="cpu", seed=seed, supported_ops=supported())
    return {k: v.detach().contiguous() for k, v in cap.weights.items()}


def _write_weights(path: Path, tensors: dict[str, Any], graph: Any) -> None:
    """weights.safetensors in graph (manifest) order, written to a temporary file and renamed
    into place (safetensors streams each tensor: no second copy of gigabytes of weights)."""
    from safetensors.torch import save_file

    data, seen = {}, set()
    for spec in graph.weights:
        t = tensors[spec.name].detach().to("cpu").contiguous()
        if t.numel() and t.data_ptr() in seen:  # tied weights: safetensors wants separate storage
            t = t.clone()
        seen.add(t.data_ptr())
        data[spec.name] = t
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(data, str(tmp), metadata={"generator": "stitchcuda.pipeline", "graph": graph.name})
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _write_if_changed(path: Path, text: str) -> None:
    from .fsutil import atomic_write_text

    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return
    atomic_write_text(path, text)


def build_program(reference: Any, *, precision: str = "fp32", out: str | os.PathLike | None = None,
                  arch: str | None = None, seed: int = 0, name: str | None = None, model: Any = None,
                  example_inputs: Sequence[Any] | None = None, weights: bool = True, compile: bool = True,
                  ceilings: Any = None, quiet: bool = False, cache: str | os.PathLike | None = None) -> BuildOutcome:
    """Turn a reference into a program folder and compile it (see the module docstring).

    ``reference``: a path, ``kernelbench:LEVEL:ID``, a ``frontend.Reference``, or — with
    ``example_inputs`` — an ``nn.Module``. ``model``: take the weights from this instance
    instead of building one (its state must be the reference's architecture).
    ``weights=False`` skips them (capture and build only: no weights file is written).
    """
    from . import code as coder
    from . import frontend, ops, toolchain
    from . import plan as planner

    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    if example_inputs is not None:
        module = reference
        gname = name or type(module).__name__
        captured = frontend.capture(module, list(example_inputs), gname, supported_ops=ops.supported())
        ref_source = mf.ReferenceSource(path=f"{gname}.py")
        source_text = None
        tensors = model_weights(module, captured.graph) if weights else {}
    else:
        ref, ref_source, source_text = _reference(reference, name)
        captured = frontend.capture_reference(ref, device="meta", seed=seed, supported_ops=ops.supported())
        tensors = {}
        if weights:
            tensors = model_weights(model, captured.graph) if model is not None else _weights(ref, captured.graph, seed)
    graph = captured.graph
    seconds["capture"] = time.monotonic() - t0

    t1 = time.monotonic()
    if ceilings is None:
        from .device import for_planning

        ceilings = for_planning()
    p = planner.plan(graph, precision, ceilings)
    seconds["plan"] = time.monotonic() - t1
    t1 = time.monotonic()
    arch = arch or toolchain.default_arch()
    src = coder.code(p, graph, tensors if weights else None, reference=ref_source, arch=arch)
    seconds["code"] = time.monotonic() - t1

    t1 = time.monotonic()
    directory = Path(out) if out is not None else Path(DEFAULT_OUT) / graph.name
    directory.mkdir(parents=True, exist_ok=True)
    _write_if_changed(directory / mf.PROGRAM_SOURCE, src.program_cu)
    _write_if_changed(directory / mf.MANIFEST_FILE, src.manifest.to_json())
    _write_if_changed(directory / "plan.json", p.to_json() + "\n")
    if source_text is not None and ref_source.path:
        _write_if_changed(directory / ref_source.path, source_text)
    if weights:
        _write_weights(directory / mf.WEIGHTS_FILE, tensors, graph)
    seconds["write"] = time.monotonic() - t1

    result = None
    if compile:
        t1 = time.monotonic()
        result = _build.build(src.program_cu, arch=arch, cache=cache)
        if result.ok:
            from .program import write_build_record

            lib = directory / mf.LIBRARY_FILE
            tmp = directory / f".{mf.LIBRARY_FILE}.tmp"
            shutil.copyfile(result.library, tmp)
            os.replace(tmp, lib)
            write_build_record(directory, src.manifest, result)
        seconds["compile"] = time.monotonic() - t1
    seconds["total"] = time.monotonic() - t0
    outcome = BuildOutcome(directory, p, src.manifest, result, seconds)
    if not quiet:
        print(p)
        _report(outcome)
    return outcome


def _report(o: BuildOutcome) -> None:
    s = o.seconds
    print(f"program {o.manifest.name} ({o.manifest.precision}, {o.manifest.arch}) written to {o.directory}")
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in s.items() if k != "total")
    if o.build is None:
        print(f"  not compiled; {stages}")
    elif o.build.ok:
        how = "from the build cache" if o.build.cached else "compiled"
        print(f"  library {o.directory / mf.LIBRARY_FILE} ({how}); {stages}; total {s.get('total', 0):.1f} s")
    else:
        print(f"  BUILD FAILED: {o.build.message}")
        if o.build.compile is not None:
            print("\n".join("    " + ln for ln in o.build.compile.output.strip().splitlines()[:20]))


# ---------------------------------------------------------------------- the command


def add_build_command(sub: Any) -> None:
    """Register ``stitchcuda build`` on an argparse subparsers object."""
    p = sub.add_parser("build", help="reference -> program folder: capture, plan, generate CUDA, compile")
    p.add_argument("reference", metavar="FILE", help="a KernelBench-format .py file, or kernelbench:LEVEL:ID")
    p.add_argument("--precision", "-p", default="fp32", choices=_POLICY_NAMES,
                   help="precision policy (default fp32: exact fp32 math)")
    p.add_argument("--out", "-o", help=f"program folder (default {DEFAULT_OUT}/<name>)")
    p.add_argument("--arch", help="target, e.g. sm_90 (default: the GPU's, else $STITCHCUDA_ARCH or sm_90)")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed before building the model (default 0)")
    p.add_argument("--no-compile", action="store_true", help="write the folder only")
    p.set_defaults(func=_build_command)


def _build_command(args: argparse.Namespace) -> int:
    from .frontend import CaptureError
    from .plan import PlanError

    try:
        o = build_program(args.reference, precision=args.precision, out=args.out, arch=args.arch, seed=args.seed,
                          compile=not args.no_compile)
    except (CaptureError, PlanError, FileNotFoundError) as e:
        print(f"stitchcuda build: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a bad KernelBench id, an unreadable file: say so, briefly
        if type(e).__name__ == "ProblemError":
            print(f"stitchcuda build: {e}", file=sys.stderr)
            return 2
        raise
    return 0 if o.ok else 1


__all__ = ["BuildOutcome", "build_program", "model_weights", "add_build_command"]
