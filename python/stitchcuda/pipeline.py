"""Reference to program folder, deterministically: capture -> plan -> code -> write -> compile.

:func:`build_program` is the whole path without an LLM, and ``stitchcuda build`` its command:

1. load the reference (a KernelBench-format file, ``kernelbench:LEVEL:ID`` from the
   development set, or an ``nn.Module`` with example inputs) and capture it on the meta
   device (shapes only: the development problems' tensors run to gigabytes); state the
   reference keeps between calls in a plain tensor attribute becomes an explicit input and
   output of the program (``state="lift"``, recorded in the manifest's ``state``);
2. build the model on the CPU with ``torch.manual_seed(seed)`` first — exactly as the
   Verifier and KernelBench's harness do — and take its weights by ``state_dict`` name;
3. :func:`stitchcuda.plan.plan` under the precision policy, :func:`stitchcuda.code.code`;
4. write the program folder into a staging folder beside the target (``.<name>.staging-*``):
   ``program.cu``, ``manifest.json``, ``weights.safetensors``, ``plan.json`` and a copy of the
   reference (``reference.py``);
5. compile through the build cache (:mod:`stitchcuda.build`) for ``arch`` (the GPU's, else
   ``STITCHCUDA_ARCH`` or sm_90: a machine without a GPU builds too) and copy the library
   into the staging folder with a build record, so the folder is self-contained;
6. check the staged folder loads (:func:`stitchcuda.manifest.load_program_dir`), then put it in
   place of the target with two renames. The target is whole or absent: a failed, refused or
   interrupted build leaves the previous folder as it was (with its report) or nothing, and a
   rebuild never keeps a report of an older program.

Failures are typed, each one line naming the cause and the fix: bad input raises
:class:`BuildInputError` (an unusable ``out`` or ``arch``), ``CaptureError`` /
``UnsupportedOpError`` (the reference, with its line), ``PlanError`` or ``FileNotFoundError``;
a machine that cannot build raises :class:`BuildEnvironmentError` (no PyTorch, no nvcc, an
unwritable build cache) or ``MemoryError``. A compile failure is a value in the returned
:class:`BuildOutcome` (``ok`` False, nothing written).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from . import build as _build
from . import manifest as mf
from .precision import NAMES as _POLICY_NAMES

DEFAULT_OUT = "run"
_ARCH_RE = re.compile(r"^sm_\d{2,3}[a-z]?$")


class BuildInputError(ValueError):
    """An argument ``build_program`` cannot use (``out``, ``arch``, ``precision``); one line."""


class BuildEnvironmentError(RuntimeError):
    """The machine cannot build (no PyTorch, no nvcc, an unwritable build cache); one line with the fix."""


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


def load_source(reference: Any, name: str | None):
    """A reference named by a path, ``kernelbench:L:ID`` or a Reference: (frontend.Reference,
    manifest ReferenceSource, source text or None). Shared by ``build`` and the loop."""
    from . import frontend

    if isinstance(reference, frontend.Reference):
        return reference, mf.ReferenceSource(path="reference.py"), reference.source
    text = os.fspath(reference)
    m = re.fullmatch(r"kernelbench:(\d+):(\d+)", text)
    if m:
        from .verifier.run.reference import load_kernelbench

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


def reference_weights(ref: Any, graph: Any, seed: int) -> dict[str, Any]:
    """The reference's own weights (its constructor run under ``seed``), contiguous CPU tensors
    keyed by the graph's weight names."""
    import torch

    from . import frontend

    torch.manual_seed(seed)
    try:
        model = ref.Model(*ref.get_init_inputs())
    except (MemoryError, RuntimeError) as e:
        if isinstance(e, MemoryError) or "can't allocate memory" in str(e):
            need = sum(w.nbytes for w in graph.weights)
            raise MemoryError(f"out of host memory building {graph.name}'s weights on the CPU ({need / 2**30:.1f} GiB "
                              "of weights): free memory or build on a machine with more") from None
        raise
    w = model_weights(model, graph)
    if w or not graph.weights:
        return w
    # Tensor constants that are not parameters or buffers: capture on the CPU for real.
    from .ops import supported

    cap = frontend.capture_reference(ref, device="cpu", seed=seed, supported_ops=supported(), state="lift")
    return {k: v.detach().contiguous() for k, v in cap.weights.items()}


def write_weights(path: Path, tensors: dict[str, Any], graph: Any) -> None:
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
                  ceilings: Any = None, quiet: bool = False, cache: str | os.PathLike | None = None,
                  progress: Any = None, constraints: Any = None, overrides: Any = None) -> BuildOutcome:
    """Turn a reference into a program folder and compile it (see the module docstring).

    ``reference``: a path, ``kernelbench:LEVEL:ID``, a ``frontend.Reference``, or — with
    ``example_inputs`` — an ``nn.Module``. ``model``: take the weights from this instance
    instead of building one (its state must be the reference's architecture).
    ``weights=False`` skips them (capture and build only: no weights file is written).
    ``progress(stage)`` is called as each stage starts (capture, weights, plan, code, write,
    compile, check), for a command's progress display. ``constraints`` go to the planner
    (:class:`stitchcuda.plan.Constraints`: per-node precision, fusion boundaries, strategies,
    rewrites); ``overrides`` to the Coder (task name -> a body in place of the template's).
    """
    step = progress or (lambda stage: None)
    if precision not in _POLICY_NAMES:
        raise BuildInputError(f"unknown precision {precision!r}: use one of {', '.join(_POLICY_NAMES)}")
    if arch is not None:
        arch = check_arch(arch, compiling=compile)
    target = _check_out(Path(out)) if out is not None else None
    need_torch("build")
    from . import code as coder
    from . import frontend, ops, toolchain
    from . import plan as planner

    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    step("capture")
    if example_inputs is not None:
        module = reference
        gname = name or type(module).__name__
        captured = frontend.capture(module, list(example_inputs), gname, supported_ops=ops.supported(), state="lift")
        ref_source = mf.ReferenceSource(path=f"{gname}.py")
        source_text = None
        tensors = model_weights(module, captured.graph) if weights else {}
    else:
        ref, ref_source, source_text = load_source(reference, name)
        captured = frontend.capture_reference(ref, device="meta", seed=seed, supported_ops=ops.supported(),
                                              state="lift")
        tensors = {}
        if weights:
            step("weights")
            tensors = (model_weights(model, captured.graph) if model is not None
                       else reference_weights(ref, captured.graph, seed))
    graph = captured.graph
    seconds["capture"] = time.monotonic() - t0

    t1 = time.monotonic()
    step("plan")
    if ceilings is None:
        from .device import for_planning

        ceilings = for_planning()
    p = planner.plan(graph, precision, ceilings, constraints=constraints)
    seconds["plan"] = time.monotonic() - t1
    t1 = time.monotonic()
    step("code")
    arch = arch or check_arch(toolchain.default_arch(), compiling=compile)
    src = coder.code(p, graph, tensors if weights else None, reference=ref_source, arch=arch, overrides=overrides,
                     state=captured.state)
    seconds["code"] = time.monotonic() - t1

    t1 = time.monotonic()
    step("write")
    directory = target if target is not None else _check_out(Path(DEFAULT_OUT) / graph.name)
    with staged_folder(directory) as staging:
        stage = staging.path
        _write_if_changed(stage / mf.PROGRAM_SOURCE, src.program_cu)
        _write_if_changed(stage / mf.MANIFEST_FILE, src.manifest.to_json())
        _write_if_changed(stage / "plan.json", p.to_json() + "\n")
        if source_text is not None and ref_source.path:
            _write_if_changed(stage / ref_source.path, source_text)
        if weights:
            write_weights(stage / mf.WEIGHTS_FILE, tensors, graph)
        seconds["write"] = time.monotonic() - t1

        result = None
        if compile:
            t1 = time.monotonic()
            step("compile")
            result = _build.build(src.program_cu, arch=arch, cache=cache)
            if not result.ok and result.compile is None:  # nothing compiled: the machine's problem
                raise BuildEnvironmentError(result.message)
            if result.ok:
                from .program import write_build_record

                shutil.copyfile(result.library, stage / mf.LIBRARY_FILE)
                write_build_record(stage, src.manifest, result)
            seconds["compile"] = time.monotonic() - t1
        if result is None or result.ok:
            step("check")
            # The folder must open as a program before it replaces anything.
            mf.load_program_dir(stage, require_weights=weights)
            staging.publish()
    seconds["total"] = time.monotonic() - t0
    outcome = BuildOutcome(directory, p, src.manifest, result, seconds)
    if not quiet:
        print(p)
        _report(outcome)
    return outcome


# ---------------------------------------------------------------------- checks before any work


def check_arch(arch: str, *, compiling: bool = True) -> str:
    """``arch`` when it names a CUDA target this nvcc can build (``sm_90``); else BuildInputError
    with the names it can (checked before anything is captured or written)."""
    if not _ARCH_RE.match(arch):
        digits = re.sub(r"\D", "", arch)
        hint = f"sm_{digits}" if digits and re.fullmatch(r"\d{2,3}", digits) else "sm_90"
        raise BuildInputError(f"--arch {arch}: not a CUDA target name; use the sm_XY form, e.g. {hint}")
    known = _nvcc_targets() if compiling else ()
    if known and arch not in known:
        raise BuildInputError(f"--arch {arch}: this nvcc cannot build it; it builds {', '.join(known)}")
    return arch


@functools.lru_cache(maxsize=None)
def _nvcc_targets() -> tuple[str, ...]:
    """The sm_XY targets of the nvcc in use (``nvcc --list-gpu-code``), () when unknown."""
    from .toolchain import find_nvcc

    nvcc = find_nvcc()
    if nvcc is None:
        return ()
    try:
        r = subprocess.run([str(nvcc), "--list-gpu-code"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(dict.fromkeys(t for t in r.stdout.split() if _ARCH_RE.match(t)))


def _check_out(target: Path) -> Path:
    """The program folder to write, refused (BuildInputError) when it is a file, a folder that is
    not a program folder (it would be replaced), or in a place that cannot be written."""
    if target.exists() and not target.is_dir():
        raise BuildInputError(f"--out {target}: is a file, not a folder; give a folder path for the program")
    if target.is_dir() and any(target.iterdir()) and not (target / mf.MANIFEST_FILE).is_file():
        raise BuildInputError(f"--out {target}: holds files that are not a program (no {mf.MANIFEST_FILE}); "
                              "a build replaces its folder whole, so give an empty or new folder")
    parent = target.resolve().parent
    blocker = next((a for a in (parent, *parent.parents) if a.exists() and not a.is_dir()), None)
    if blocker is not None:
        raise BuildInputError(f"--out {target}: {blocker} is a file, not a folder; choose another --out")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = parent / f".{target.name}.probe-{os.getpid()}"
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        raise BuildInputError(f"--out {target}: cannot write in {parent} ({e.strerror or e}); "
                              "choose a writable folder") from None
    return target


def need_torch(what: str) -> None:
    """Raise a one-line BuildEnvironmentError naming the fix when PyTorch is missing for ``what``."""
    try:
        importlib.import_module("torch")
    except ImportError:
        raise BuildEnvironmentError(f"{what} needs PyTorch to capture the reference, and it is not installed: "
                                    "pip install torch  (a built program runs without it)") from None


# ---------------------------------------------------------------------- the folder, whole or absent


class Staging:
    """The staging folder of :func:`staged_folder` (``path``) and the target it replaces."""

    def __init__(self, path: Path, target: Path):
        self.path, self.target, self.published = path, target, False

    def publish(self) -> None:
        """Put the staged folder in the target's place (the previous one, if any, is removed)."""
        old = None
        if self.target.exists():
            old = self.target.with_name(f".{self.target.name}.old-{os.getpid()}")
            os.rename(self.target, old)
        try:
            os.rename(self.path, self.target)
        except BaseException:
            if old is not None:
                os.rename(old, self.target)
            raise
        self.published = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staged_folder(target: Path):
    """A :class:`Staging` folder beside ``target`` to write into; ``publish()`` renames it into place.

    Whatever happens before ``publish`` (an exception, Ctrl-C, a failed compile that skips it),
    the staging folder is removed and ``target`` is untouched. Staging folders left by killed
    processes are removed the next time.
    """
    target = Path(target)
    _remove_stale(target)
    stage = Staging(target.parent / f".{target.name}.staging-{os.getpid()}-{time.monotonic_ns() % 10**9}", target)
    stage.path.mkdir(parents=True)
    try:
        yield stage
    finally:
        if not stage.published:
            shutil.rmtree(stage.path, ignore_errors=True)


def _remove_stale(target: Path) -> None:
    if not target.parent.is_dir():
        return
    for d in target.parent.glob(f".{glob_escape(target.name)}.*-*"):
        m = re.fullmatch(rf"\.{re.escape(target.name)}\.(staging|old)-(\d+)(-\d+)?", d.name)
        if m and not _alive(int(m.group(2))):
            shutil.rmtree(d, ignore_errors=True)


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _report(o: BuildOutcome) -> None:
    s = o.seconds
    print(f"program {o.manifest.name} ({o.manifest.precision}, {o.manifest.arch}) written to {o.directory}")
    for st in o.manifest.state:
        print(f"  state kept in {st.attribute} between calls: input {st.input} (before the call), output {st.output} "
              "(after it); the caller carries it from call to call")
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


__all__ = ["BuildOutcome", "BuildInputError", "BuildEnvironmentError", "build_program", "check_arch",
           "model_weights", "staged_folder", "Staging"]
