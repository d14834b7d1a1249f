"""The rubric: what the Verifier said of one reply, as a score with every component logged.

A reply is judged (:mod:`.judge`) into an :class:`Outcome`: how far it got — parsed, accepted by
the Coder or the planner, past the static rules, built, past the built library's sandbox rules,
ran, correct, fast — with the Verifier's findings, failed dynamic checks and timings. The rubric
turns it into a :class:`Reward`:

=============  =============================================================================
format         when no code block defines the function (or no decision parses), graded by how
               near the reply came, so that a model that never writes a valid reply still gets a
               signal: -1 nothing (no block, blank blocks, no JSON), -0.95 closed blocks of code
               that never name the function, -0.9 a block of code or a JSON object cut off at max
               tokens, -0.85 a block that names the function without completing its definition
               (or defines it twice), or JSON naming what the request does not allow. A reply
               never scores more for holding less: an empty block is worth nothing, and an
               attempt cut off at max tokens more than closed code that misses the function.
               Nothing else is tried (no compile)
contract       -0.8 when the Coder refuses the body (wrong signature) or the planner refuses the
               decision's constraints
anti_hacking   the sum of :data:`PENALTIES` over every refusal class found: each static rule the
               Verifier rejects on (source and built library), each dynamic check it fails, and
               check_task's own refusals. **Hard**: with any, the total is this penalty alone,
               so no cheat ever scores above an honest failure (the lowest honest total is -1)
compiles       +0.2 built; -0.5 a compile error
runs           -0.3 a crash or a timeout
correct        +1 correct on the device (task against the plan interpreter, or the whole program
               against the reference); 0 wrong; not scored when it could not run (no GPU)
speed          0.5 * clip(log2(speedup), -1, 1) when correct and timed, speedup against the
               matched-precision baseline (the template's body for a task, PyTorch at the policy
               for a whole program, the cost model's estimate for a plan when nothing ran)
quality        -0.1 per warning finding (at most -0.3); -0.2 for undefined behaviour seen at run
               time (an illegal or misaligned address)
=============  =============================================================================

The total is the sum of the components (or the hard penalty). Everything here is pure: the
tests score every refusal class without a GPU.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from ..verifier.static import RULES
from ..verifier.report.verdict import DYNAMIC_CHECKS, classify_crash

#: check_task's refusals that are not a static rule: a body that writes a read-only input.
TASK_REFUSALS = {"task-input-write": "the body wrote one of its inputs (inputs are read-only)"}

#: Penalty per refusal class: every reject-severity static rule (source and built library), every
#: dynamic check, and check_task's own refusals. Outright fabrication of outputs, or reaching for
#: PyTorch or loaded code, costs more than state or stream misuse.
PENALTIES: dict[str, float] = {
    **{r.id: -2.0 for r in RULES.values() if r.severity == "reject"},
    **{f"dynamic:{name}": -2.0 for name in DYNAMIC_CHECKS},
    **{k: -2.0 for k in TASK_REFUSALS},
}
for _k in ("torch-include", "torch-symbol", "dynamic-loading", "hardcoded-output-table", "const-copy-to-output",
           "output-only-memset", "sandbox-host-symbol", "sandbox-dynamic-loading", "dynamic:outputs_follow_inputs",
           "dynamic:no_output_reuse", "dynamic:timed_calls", "dynamic:sensitivity"):
    PENALTIES[_k] = -3.0
PENALTY_FLOOR = -6.0

#: Weights of the honest components.
#: The format component by the parser's reason (``NoCode.reason``, ``DecisionFailure.reason``).
FORMAT = {"": -1.0, "no_block": -1.0, "empty": -1.0, "not_json": -1.0, "missing_function": -0.95,
          "unterminated": -0.9, "truncated": -0.9, "partial_function": -0.85, "ambiguous": -0.85, "invalid": -0.85}
W = {"format": -1.0, "contract": -0.8, "compiled": 0.2, "compile_error": -0.5, "crash": -0.3, "correct": 1.0,
     "speed": 0.5, "warning": -0.1, "warnings_max": -0.3, "undefined_behaviour": -0.2}
UB_CRASHES = ("illegal_address",)


@dataclass(frozen=True)
class Outcome:
    """How far a reply got. ``stage`` is where it stopped: format, contract, static, build,
    sandbox, run, compare, done; ``findings`` (rule, severity) pairs; ``failed_checks`` the
    dynamic checks (or check_task refusals) it failed; ``speedup`` baseline time over its time,
    ``speed_basis`` which baseline; ``correct`` None when it never ran."""

    kind: str
    stage: str
    detail: str = ""
    findings: tuple[tuple[str, str], ...] = ()
    failed_checks: tuple[str, ...] = ()
    compiled: bool | None = None
    ran: bool = False
    crash: str = ""
    timeout: bool = False
    correct: bool | None = None
    speedup: float | None = None
    speed_basis: str = ""
    cached: bool = False
    seconds: float = 0.0
    format_reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Outcome":
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        kw["findings"] = tuple(tuple(f) for f in kw.get("findings", ()))
        kw["failed_checks"] = tuple(kw.get("failed_checks", ()))
        return cls(**kw)

    @property
    def parsed(self) -> bool:
        return self.stage != "format"


@dataclass(frozen=True)
class Reward:
    """The total and each component (name -> value; absent: not scored), the refusal classes
    that were penalised, and the outcome it came from."""

    total: float
    components: dict = field(default_factory=dict)
    penalties: tuple[str, ...] = ()
    outcome: Outcome | None = None

    def to_dict(self) -> dict:
        return {"total": self.total, "components": dict(self.components), "penalties": list(self.penalties),
                "outcome": self.outcome.to_dict() if self.outcome else None}


def refusal_classes(o: Outcome) -> tuple[str, ...]:
    """The penalised classes of ``o``: reject findings by rule, failed checks as ``dynamic:NAME``
    (or a check_task refusal by its own name), each once, in order."""
    out = [rule for rule, sev in o.findings if sev == "reject"]
    out += [c if c in TASK_REFUSALS or c.startswith("dynamic:") else f"dynamic:{c}" for c in o.failed_checks]
    return tuple(dict.fromkeys(out))


def score(o: Outcome) -> Reward:
    """The rubric of the module docstring."""
    comp: dict[str, float] = {}
    if o.stage == "format":
        comp["format"] = FORMAT.get(o.format_reason, W["format"])
        return Reward(comp["format"], comp, (), o)
    comp["format"] = 0.0
    if o.stage == "contract":
        comp["contract"] = W["contract"]
        return Reward(W["contract"], comp, (), o)
    comp["contract"] = 0.0
    classes = refusal_classes(o)
    if classes:
        unknown = [c for c in classes if c not in PENALTIES]
        if unknown:          # a class the table lacks is a bug here, never a free pass for the reply
            raise KeyError(f"no penalty for refusal class(es) {', '.join(unknown)}")
        pen = max(PENALTY_FLOOR, sum(PENALTIES[c] for c in classes))
        comp["anti_hacking"] = pen
        return Reward(pen, comp, classes, o)
    comp["anti_hacking"] = 0.0
    warns = sum(1 for _, sev in o.findings if sev == "warn")
    quality = max(W["warnings_max"], W["warning"] * warns) + 0.0    # + 0.0: no "-0.0" in the logs
    if o.compiled is False:
        comp["compiles"] = W["compile_error"]
    elif o.compiled:
        comp["compiles"] = W["compiled"]
    if o.crash or o.timeout:
        comp["runs"] = W["crash"]
        if o.crash in UB_CRASHES:
            quality += W["undefined_behaviour"]
    if o.correct is not None:
        comp["correct"] = W["correct"] if o.correct else 0.0
    if o.correct and o.speedup is not None and o.speedup > 0 and math.isfinite(o.speedup):
        comp["speed"] = W["speed"] * max(-1.0, min(1.0, math.log2(o.speedup)))
    comp["quality"] = quality
    return Reward(round(sum(comp.values()), 6), comp, (), o)


# ---------------------------------------------------------------------------- from the Verifier's values


def outcome_of_task_check(kind: str, r: Any, *, speedup: float | None = None, basis: str = "",
                          seconds: float = 0.0) -> Outcome:
    """An :class:`Outcome` from a :class:`stitchcuda.check.task.TaskCheck`."""
    findings = tuple((_rule_of(f), "reject") for f in r.findings)
    common: dict[str, Any] = dict(detail=r.reason[:500], findings=findings, seconds=seconds or r.seconds)
    if r.stage == "contract":
        return Outcome(kind, "contract", **common)
    if r.stage == "static":
        return Outcome(kind, "static", **common)
    if r.stage == "build":
        return Outcome(kind, "build", compiled=r.ok or "not run" in r.reason, **common)
    if r.stage == "run":
        crash = _crash_kind(r.reason)
        return Outcome(kind, "run", compiled=True, ran=True, crash=crash, timeout="timeout" in r.reason.lower(),
                       correct=False, **common)
    if r.stage == "compare":
        failed = ("task-input-write",) if " was written" in r.reason else ()
        return Outcome(kind, "compare", compiled=True, ran=True, correct=False, failed_checks=failed, **common)
    return Outcome(kind, "done", compiled=True, ran=r.ran, correct=bool(r.ok and r.ran), speedup=speedup,
                   speed_basis=basis, **common)


def outcome_of_verification(kind: str, result: Any, *, speedup: float | None = None, basis: str = "",
                            seconds: float = 0.0, extra_findings: tuple[tuple[str, str], ...] = ()) -> Outcome:
    """An :class:`Outcome` from a :class:`stitchcuda.verifier.report.verdict.VerificationResult`: every
    finding (warnings too), every failed dynamic check, and the verdict's kind."""
    v = result.verdict
    findings = tuple((f.rule, f.severity) for f in result.findings) + tuple(extra_findings)
    failed = tuple(c.name for c in result.checks if c.status == "fail")
    k = result.kind
    common: dict[str, Any] = dict(detail=v.summary()[:500], findings=findings, failed_checks=failed, seconds=seconds)
    if k == "rejected":
        stage = "sandbox" if any(r.startswith("sandbox-") for r, s in findings if s == "reject") else \
            ("static" if any(s == "reject" for _, s in findings) else "done")
        return Outcome(kind, stage, compiled=None if stage == "static" else True, ran=stage == "done", **common)
    if k == "compile_error":
        return Outcome(kind, "build", compiled=False, **common)
    if k == "crash":
        return Outcome(kind, "run", compiled=True, ran=True, crash=getattr(v, "kind", "other"), correct=False, **common)
    if k == "timeout":
        return Outcome(kind, "run", compiled=True, ran=True, timeout=True, correct=False, **common)
    if k == "wrong_answer":
        return Outcome(kind, "compare", compiled=True, ran=True, correct=False, **common)
    if k == "inconclusive":
        return Outcome(kind, "done", compiled=True, ran=False, correct=None, **common)
    return Outcome(kind, "done", compiled=True, ran=True, correct=True, speedup=speedup, speed_basis=basis, **common)


def _rule_of(text: str) -> str:
    """The rule id of a Finding's text (``file:line: [reject RULE] message``)."""
    m = re.search(r"\[(?:reject|warn) ([\w-]+)\]", text)
    return m.group(1) if m else text.split(":", 1)[0]


def _crash_kind(reason: str) -> str:
    return classify_crash(None, reason).kind


__all__ = ["PENALTIES", "PENALTY_FLOOR", "TASK_REFUSALS", "FORMAT", "W", "Outcome", "Reward", "refusal_classes", "score",
           "outcome_of_task_check", "outcome_of_verification"]
