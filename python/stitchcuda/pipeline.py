"""Reference to program folder, deterministically: capture -> plan -> code -> write -> compile.

:func:`build_program` is the whole path without an LLM, and ``stitchcuda build`` its command;
``stitchcuda optimize`` (:mod:`stitchcuda.workflow`) and the RL judge go the same way, through the
same two functions, with plans of their own in between:

1. :func:`capture_problem` loads the reference (a KernelBench-format file, ``kernelbench:LEVEL:ID``
   from the development set, or an ``nn.Module`` with example inputs) and captures it on the meta
   device (shapes only: the development problems' tensors run to gigabytes); state the reference
   keeps between calls in a plain tensor attribute becomes an explicit input and output of the
   program (``state="lift"``, recorded in the manifest's ``state``). It then builds the model on
   the CPU with ``torch.manual_seed(seed)`` first — exactly as the Verifier and KernelBench's
   harness do — and takes its weights by ``state_dict`` name. The result, a
   :class:`CapturedProblem`, is captured once and planned and coded as often as asked;
2. :meth:`CapturedProblem.plan` (:func:`stitchcuda.plan.plan` under the precision policy) and
   :meth:`CapturedProblem.code` (:func:`stitchcuda.code.code`);
3. :func:`write_program` writes the program folder into a staging folder beside the target
   (``.<name>.staging-*``): ``program.cu``, ``manifest.json``, ``weights.safetensors`` (or a
   hard link to a weights file already written), ``plan.json`` and a copy of the reference
   (``reference.py``); compiles it through the build cache (:mod:`stitchcuda.build`) for the
   manifest's ``arch`` (the GPU's, else ``STITCHCUDA_ARCH`` or sm_90: a machine without a GPU
   builds too) and copies the library into the staging folder with a build record, so the folder
   is self-contained; checks the staged folder loads (:func:`stitchcuda.manifest.load_program_dir`),
   then puts it in place of the target with two renames. The target is whole or absent: a failed,
   refused or interrupted build leaves the previous folder as it was (with its report) or nothing,
   and a rebuild never keeps a report of an older program.

Failures are typed, each one line naming the cause and the fix: bad input raises
:class:`BuildInputError` (an unusable ``out`` or ``arch``), ``CaptureError`` /
``UnsupportedOpError`` (the reference, with its line), ``PlanError`` or ``FileNotFoundError``;
a machine that cannot build raises :class:`BuildEnvironmentError` (no PyTorch, no nvcc, an
unwritable build cache) or ``MemoryError``. A compile failure is a value in the returned
:class:`BuildOutcome` (``ok`` False, nothing written).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from . import build as _build
from . import code as coder
from . import manifest as mf
from . import plan as planner
from . import toolchain
from .device import for_planning
from .errors import ArgumentError, MachineError
from .ops import supported
from .precision import NAMES as _POLICY_NAMES
from .program import write_build_record
from .verifier.run.reference import load_kernelbench

DEFAULT_OUT = "run"
_ARCH_RE = re.compile(r"^sm_\d{2,3}[a-z]?$")


class BuildInputError(ArgumentError):
    """An argument ``build_program`` cannot use (``out``, ``arch``, ``precision``); one line."""


class BuildEnvironmentError(MachineError):
    """The machine cannot build (no PyTorch, no nvcc, an unwritable build cache); one line with the fix."""


@dataclass(frozen=True)
class BuildOutcome:
    """What writing a program came to: the folder (``directory``; ``program`` names what is in it,
    None when nothing was written), the plan, the manifest, the build result (None when not
    compiled), and seconds per stage. ``ok`` False: the program does not compile, and nothing
    was written."""

    directory: Path
    plan: Any
    manifest: mf.Manifest
    build: _build.BuildResult | None
    seconds: dict[str, float] = field(default_factory=dict)
    program: mf.ProgramDir | None = None

    @property
    def ok(self) -> bool:
        return self.build is None or self.build.ok


# ---------------------------------------------------------------------- capture, once


@dataclass
class CapturedProblem:
    """A reference captured once, with what every program made from it shares: its graph, its
    weights (name -> CPU tensor; None when they were not drawn), its manifest reference entry
    and source text, the precision and target arch, the ceilings the planner costs against, and
    ``state``, the attributes lifted to explicit inputs and outputs (capture's ``StateIO``)."""

    name: str
    graph: Any
    weights: Mapping[str, Any] | None
    reference: mf.ReferenceSource
    source: str | None
    precision: str
    arch: str = "sm_90"
    ceilings: Any = None
    state: tuple = ()
    _choices: Any = field(default=None, repr=False)

    def choices(self):
        """What a plan of this graph may be asked for (:func:`stitchcuda.plan.choices`)."""
        if self._choices is None:
            self._choices = planner.choices(self.graph)
        return self._choices

    def plan(self, constraints: Mapping[str, Any] | planner.Constraints | None = None):
        """The plan under ``constraints`` (a :class:`~stitchcuda.plan.Constraints` or its dict
        form); raises ConstraintError / PlanError."""
        if constraints is not None and not isinstance(constraints, planner.Constraints):
            constraints = planner.Constraints.from_dict(constraints)
        return planner.plan(self.graph, self.precision, self.ceilings, constraints=constraints)

    def code(self, plan: Any, overrides: Mapping[str, str | coder.Override] | None = None):
        """The program source of ``plan`` with ``overrides`` (task -> a body in place of the
        template's); raises ``CodeError`` when the Coder refuses an override."""
        return coder.code(plan, self.graph, self.weights, reference=self.reference, arch=self.arch,
                          overrides=overrides, state=self.state)

    def weights_file(self, path: Path) -> Path:
        """``path`` holding these weights, written on first use (one file for many programs:
        :func:`write_program` hard-links it into each)."""
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_weights(path, dict(self.weights or {}), self.graph.weights, self.graph.name)
        return path

    def write(self, plan: Any, out: Path, *, overrides: Mapping[str, str | coder.Override] | None = None,
              weights_file: Path | None = None, compile: bool = True, cache: str | os.PathLike | None = None,
              progress: Callable[[str], None] | None = None, source: Any | None = None) -> BuildOutcome:
        """:meth:`code` then :func:`write_program` into ``out``: the tail every program goes
        through, ``build``'s and each candidate of the loop. ``weights_file``: these weights already
        written (:meth:`weights_file`), hard-linked instead of written again. ``source``: what
        :meth:`code` gave for this plan and these overrides already (not made again)."""
        step = progress or (lambda stage: None)
        t0 = time.monotonic()
        step("code")
        src = source if source is not None else self.code(plan, overrides)
        took = time.monotonic() - t0
        weights = weights_file if weights_file is not None else self.weights
        o = write_program(plan, src, weights, out, reference_text=self.source, compile=compile, cache=cache,
                          progress=progress)
        return dataclasses.replace(o, seconds={"code": took, **o.seconds})


def capture_problem(reference: Any, *, precision: str = "fp32", example_inputs: Sequence[Any] | None = None,
                    name: str | None = None, seed: int = 0, arch: str | None = None, model: Any = None,
                    weights: bool = True, ceilings: Any = None, compiling: bool = True,
                    progress: Callable[[str], None] | None = None) -> CapturedProblem:
    """Capture ``reference`` once and draw its weights (see the module docstring).

    ``reference``: a path, ``kernelbench:LEVEL:ID``, a ``frontend.Reference``, or — with
    ``example_inputs`` — an ``nn.Module`` (whose own weights are taken). ``model``: take the weights
    from this instance instead of building one (its state must be the reference's architecture).
    ``weights=False`` draws none (capture and plan only). ``arch``: checked against the local nvcc
    when ``compiling`` (default: the GPU's, else ``STITCHCUDA_ARCH`` or sm_90). ``progress(stage)``
    is called as capture and weights start.
    """
    from . import frontend  # PyTorch: needed to capture, never to build or run a program

    step = progress or (lambda stage: None)
    step("capture")
    tensors: dict[str, Any] | None = None
    if example_inputs is not None:
        gname = name or type(reference).__name__
        captured = frontend.capture(reference, list(example_inputs), gname, supported_ops=supported(), state="lift")
        ref_source, text = mf.ReferenceSource(path=f"{gname}.py"), None
        if weights:
            tensors = model_weights(reference, captured.graph)
    else:
        ref, ref_source, text = load_source(reference, name)
        captured = frontend.capture_reference(ref, device="meta", seed=seed, supported_ops=supported(), state="lift")
        if weights:
            step("weights")
            tensors = (model_weights(model, captured.graph) if model is not None
                       else reference_weights(ref, captured.graph, seed))
    arch = check_arch(arch or toolchain.default_arch(), compiling=compiling)
    graph = captured.graph
    return CapturedProblem(graph.name, graph, tensors, ref_source, text, precision, arch,
                           ceilings if ceilings is not None else for_planning(), state=captured.state)


def load_source(reference: Any, name: str | None):
    """A reference named by a path, ``kernelbench:L:ID`` or a Reference: (frontend.Reference,
    manifest ReferenceSource, source text or None)."""
    from . import frontend  # PyTorch

    if isinstance(reference, frontend.Reference):
        return reference, mf.ReferenceSource(path="reference.py"), reference.source
    text = os.fspath(reference)
    m = re.fullmatch(r"kernelbench:(\d+):(\d+)", text)
    if m:
        level, pid = int(m.group(1)), int(m.group(2))
        spec = load_kernelbench(level, pid)
        ref = frontend.load_reference(spec.source, name=name or spec.name)
        return ref, mf.ReferenceSource(kernelbench=mf.KernelBenchRef(level, pid, spec.name)), spec.source
    path = Path(text)
    if path.is_dir():
        raise BuildInputError(f"{text}: is a folder; a reference is one KernelBench-format .py file "
                              "(or kernelbench:LEVEL:ID)")
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
    cap = frontend.capture_reference(ref, device="cpu", seed=seed, supported_ops=supported(), state="lift")
    return {k: v.detach().contiguous() for k, v in cap.weights.items()}


def write_weights(path: Path, tensors: Mapping[str, Any], specs: Sequence[Any], name: str) -> None:
    """weights.safetensors: the tensors named by ``specs`` (the manifest's or the graph's
    weights), in their order, written to a temporary file and renamed into place (safetensors
    streams each tensor: no second copy of gigabytes of weights)."""
    from safetensors.torch import save_file  # PyTorch

    data, seen = {}, set()
    for spec in specs:
        t = tensors[spec.name].detach().to("cpu").contiguous()
        if t.numel() and t.data_ptr() in seen:  # tied weights: safetensors wants separate storage
            t = t.clone()
        seen.add(t.data_ptr())
        data[spec.name] = t
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(data, str(tmp), metadata={"generator": "stitchcuda.pipeline", "graph": name})
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


# ---------------------------------------------------------------------- build


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
    if example_inputs is None and isinstance(reference, (str, os.PathLike)) \
            and not re.fullmatch(r"kernelbench:(\d+):(\d+)", os.fspath(reference)):
        p = Path(reference)
        if p.is_dir():
            raise BuildInputError(f"{reference}: is a folder; a reference is one KernelBench-format .py file "
                                  "(or kernelbench:LEVEL:ID)")
        if not p.is_file():
            raise FileNotFoundError(f"{reference}: no such reference file (or use kernelbench:LEVEL:ID)")
    target = _check_out(Path(out)) if out is not None else None
    need_torch("build")

    t0 = time.monotonic()
    problem = capture_problem(reference, precision=precision, example_inputs=example_inputs, name=name, seed=seed,
                              arch=arch, model=model, weights=weights, ceilings=ceilings, compiling=compile,
                              progress=step)
    seconds = {"capture": time.monotonic() - t0}
    t1 = time.monotonic()
    step("plan")
    p = problem.plan(constraints)
    seconds["plan"] = time.monotonic() - t1
    directory = target if target is not None else _check_out(Path(DEFAULT_OUT) / problem.name)
    outcome = problem.write(p, directory, overrides=overrides, compile=compile, cache=cache, progress=step)
    outcome = dataclasses.replace(outcome, seconds={**seconds, **outcome.seconds,
                                                    "total": time.monotonic() - t0})
    if not quiet:
        print(p)
        _report(outcome)
    return outcome


def write_program(plan: Any, source: Any, weights: Mapping[str, Any] | Path | None, out: str | os.PathLike, *,
                  reference_text: str | None = None, compile: bool = True, cache: str | os.PathLike | None = None,
                  progress: Callable[[str], None] | None = None) -> BuildOutcome:
    """Write the program folder ``out`` for ``plan`` and its ``source`` (the Coder's
    ``ProgramSource``), compile it and put it in place, whole (see the module docstring).

    ``weights``: name -> tensor (written in the manifest's order), a weights file already written
    (hard-linked, or copied across file systems), or None (no weights file). ``reference_text``
    goes to the manifest's reference path. The library is built for the manifest's ``arch``; a
    compile error is a value (``ok`` False, nothing written), a machine that cannot compile raises
    :class:`BuildEnvironmentError`. ``progress(stage)``: write, compile, check.
    """
    step = progress or (lambda stage: None)
    m = source.manifest
    directory = Path(out)
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    step("write")
    with staged_folder(directory) as staging:
        stage = staging.path
        (stage / mf.PROGRAM_SOURCE).write_text(source.program_cu, encoding="utf-8")
        (stage / mf.MANIFEST_FILE).write_text(m.to_json(), encoding="utf-8")
        (stage / "plan.json").write_text(plan.to_json() + "\n", encoding="utf-8")
        if reference_text is not None and m.reference.path:
            (stage / m.reference.path).write_text(reference_text, encoding="utf-8")
        if isinstance(weights, Path):
            _link(weights, stage / mf.WEIGHTS_FILE)
        elif weights is not None:
            write_weights(stage / mf.WEIGHTS_FILE, weights, m.weights, m.name)
        seconds["write"] = time.monotonic() - t0

        result = None
        if compile:
            t1 = time.monotonic()
            step("compile")
            result = _build.build(source.program_cu, arch=m.arch, cache=cache)
            if not result.ok and result.compile is None:  # nothing compiled: the machine's problem
                raise BuildEnvironmentError(result.message)
            seconds["compile"] = time.monotonic() - t1
            if not result.ok:
                return BuildOutcome(directory, plan, m, result, seconds)
            shutil.copyfile(result.library, stage / mf.LIBRARY_FILE)
            write_build_record(stage, m, result)
        step("check")
        # The folder must open as a program before it replaces anything.
        staged = mf.load_program_dir(stage, require_weights=weights is not None)
        staging.publish()
    return BuildOutcome(directory, plan, m, result, seconds, _moved(staged, directory))


def _moved(program: mf.ProgramDir, root: Path) -> mf.ProgramDir:
    """``program``'s description once its folder is renamed to ``root``."""
    def at(p: Path | None) -> Path | None:
        return None if p is None else root / p.name

    return dataclasses.replace(program, root=root, source=at(program.source), weights=at(program.weights),
                               library=at(program.library))


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


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
    nvcc = toolchain.find_nvcc()
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
    # Probe the nearest folder that exists: the missing ones are made only when there is a program
    # to write (staged_folder), so a refused build leaves no empty folders behind.
    base = next(a for a in (parent, *parent.parents) if a.exists())
    try:
        probe = base / f".{target.name}.probe-{os.getpid()}"
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        raise BuildInputError(f"--out {target}: cannot write in {base} ({e.strerror or e}); "
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
    made = [a for a in (target.parent.absolute(), *target.parent.absolute().parents) if not a.exists()]
    stage.path.mkdir(parents=True)
    try:
        yield stage
    finally:
        if not stage.published:
            shutil.rmtree(stage.path, ignore_errors=True)
            for a in made:          # the folders made for it, innermost first, while empty
                with contextlib.suppress(OSError):
                    a.rmdir()


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


__all__ = ["BuildOutcome", "BuildInputError", "BuildEnvironmentError", "CapturedProblem", "build_program",
           "capture_problem", "write_program", "write_weights", "check_arch", "model_weights", "need_torch",
           "staged_folder", "Staging"]
