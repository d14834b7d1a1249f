"""The problem a run works on, captured once, and the candidate program folders made from it.

:func:`load_problem` captures the reference (a file, ``kernelbench:L:ID``, or an ``nn.Module``
with example inputs) once and draws its weights once, as ``build`` does (``torch.manual_seed``
first); every candidate after that is only plan -> code -> write -> compile
(:func:`materialise`), so a run does not pay the capture per candidate. The weights file is
written once into the run folder and hard-linked into each candidate's program folder.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .. import manifest as mf


@dataclass
class Problem:
    """A captured reference: its graph, weights (name -> CPU tensor), manifest reference entry and
    source text, and the precision the run targets; ``state`` the attributes lifted to explicit
    inputs and outputs (capture's ``StateIO``, for the manifest)."""

    name: str
    graph: Any
    weights: Mapping[str, Any]
    reference: mf.ReferenceSource
    source: str | None
    precision: str
    arch: str = "sm_90"
    ceilings: Any = None
    state: tuple = ()
    _choices: Any = field(default=None, repr=False)

    def choices(self):
        if self._choices is None:
            from ..plan import choices

            self._choices = choices(self.graph)
        return self._choices

    def plan(self, constraints: Mapping[str, Any] | None = None):
        """The plan under ``constraints`` (a dict); raises ConstraintError / PlanError."""
        from .. import plan as P

        c = P.Constraints.from_dict(constraints or {})
        return P.plan(self.graph, self.precision, self.ceilings, constraints=c)


def load_problem(reference: Any, *, precision: str, example_inputs: Any = None, name: str | None = None,
                 seed: int = 0, arch: str | None = None) -> Problem:
    """Capture ``reference`` once (see the module docstring)."""
    from .. import frontend, ops, toolchain
    from ..device import for_planning
    from ..pipeline import need_torch, load_source, reference_weights, check_arch, model_weights

    need_torch("optimize")
    if example_inputs is not None:
        gname = name or type(reference).__name__
        cap = frontend.capture(reference, list(example_inputs), gname, supported_ops=ops.supported(), state="lift")
        ref_source, text = mf.ReferenceSource(path=f"{gname}.py"), None
        weights = model_weights(reference, cap.graph)
    else:
        ref, ref_source, text = load_source(reference, name)
        cap = frontend.capture_reference(ref, device="meta", seed=seed, supported_ops=ops.supported(), state="lift")
        weights = reference_weights(ref, cap.graph, seed)
    arch = check_arch(arch or toolchain.default_arch(), compiling=True)
    return Problem(cap.graph.name, cap.graph, weights, ref_source, text, precision, arch, for_planning(),
                   state=cap.state)


@dataclass(frozen=True)
class Built:
    """A candidate program folder, or why there is none (``kind``: invalid, compile_error)."""

    ok: bool
    directory: Path | None
    kind: str = ""
    message: str = ""
    plan: Any = None
    origins: Mapping[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def materialise(problem: Problem, constraints: Mapping[str, Any], overrides: Mapping[str, Any], out: Path, *,
                weights_file: Path | None = None, compile: bool = True, cache: Any = None) -> Built:
    """Plan under ``constraints``, code with ``overrides`` (task -> {source, origin}), write the
    program folder ``out`` and compile it. Never raises for the candidate's faults: constraints
    that do not fit, an override the Coder refuses, or a compile error are a failed :class:`Built`."""
    import time

    from .. import build as _build
    from .. import code as coder
    from ..plan import ConstraintError, PlanError
    from ..pipeline import write_weights, staged_folder

    t0 = time.monotonic()
    try:
        p = problem.plan(constraints)
    except (ConstraintError, PlanError, ValueError) as e:
        return Built(False, None, "invalid", f"the planner refuses these constraints: {e}")
    ovs = {t: coder.Override(o["source"], o.get("origin", "hand")) for t, o in overrides.items()}
    try:
        src = coder.code(p, problem.graph, problem.weights, reference=problem.reference, arch=problem.arch,
                         overrides=ovs, state=problem.state)
    except coder.CodeError as e:
        return Built(False, None, "invalid", f"the Coder refuses it: {e}", p)
    origins = {t.name: t.origin for t in src.manifest.tasks}
    out.parent.mkdir(parents=True, exist_ok=True)
    with staged_folder(out) as staging:
        stage = staging.path
        (stage / mf.PROGRAM_SOURCE).write_text(src.program_cu, encoding="utf-8")
        (stage / mf.MANIFEST_FILE).write_text(src.manifest.to_json(), encoding="utf-8")
        (stage / "plan.json").write_text(p.to_json() + "\n", encoding="utf-8")
        if problem.source is not None and problem.reference.path:
            (stage / problem.reference.path).write_text(problem.source, encoding="utf-8")
        if weights_file is not None and weights_file.is_file():
            _link(weights_file, stage / mf.WEIGHTS_FILE)
        else:
            write_weights(stage / mf.WEIGHTS_FILE, dict(problem.weights), problem.graph)
        if compile:
            res = _build.build(src.program_cu, arch=problem.arch, cache=cache)
            if not res.ok:
                if res.compile is None:
                    from ..pipeline import BuildEnvironmentError

                    raise BuildEnvironmentError(res.message)
                return Built(False, None, "compile_error", res.message, p, origins, time.monotonic() - t0)
            from ..program import write_build_record

            shutil.copyfile(res.library, stage / mf.LIBRARY_FILE)
            write_build_record(stage, src.manifest, res)
            mf.load_program_dir(stage, require_weights=True)
        staging.publish()
    return Built(True, out, "", "", p, origins, time.monotonic() - t0)


def write_weights_once(problem: Problem, path: Path) -> Path:
    """The run's one weights file (written on first use)."""
    from ..pipeline import write_weights

    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_weights(path, dict(problem.weights), problem.graph)
    return path


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


__all__ = ["Problem", "Built", "load_problem", "materialise", "write_weights_once"]
