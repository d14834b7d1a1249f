"""The loop's typed state: budgets, candidates, routes — all frozen and JSON-serialisable.

A :class:`State` is what ``runs/<id>/state.json`` holds after every finished candidate; reading
it back (:meth:`State.from_dict`) is how a killed run resumes. Nothing in it refers to a live
object: candidates carry their constraints and overrides as plain data, verdicts as short typed
records (:class:`Judgement`, :class:`TaskVerdict`), so a run can be diffed and replayed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..plan.constraints import Constraints

#: The routes of the loop (DESIGN.md, "The loop and its proposers").
ROUTES = ("repair", "optimize", "replan", "next", "done")


@dataclass(frozen=True)
class Budget:
    """What a run may spend: wall seconds, candidates evaluated, GPU seconds (the Verifier's and
    the per-task checks' device time). None: no limit on that one."""

    wall_s: float | None = 180.0
    iterations: int | None = None
    gpu_s: float | None = None

    @classmethod
    def parse(cls, text: str | float | int | None, *, iterations: int | None = None,
              gpu: str | float | None = None) -> "Budget":
        """``"3m"``, ``"90s"``, ``"1h"``, ``"2m30s"`` or seconds; None keeps the default (3 minutes)."""
        wall = cls.wall_s if text is None else parse_seconds(text)
        return cls(wall, iterations, None if gpu is None else parse_seconds(gpu))

    def left(self, spent: "Spent") -> str | None:
        """Why the budget is spent (one line), or None while some is left."""
        if self.wall_s is not None and spent.wall_s >= self.wall_s:
            return f"wall-time budget of {self.wall_s:g} s spent"
        if self.iterations is not None and spent.iterations >= self.iterations:
            return f"iteration budget of {self.iterations} candidate(s) spent"
        if self.gpu_s is not None and spent.gpu_s >= self.gpu_s:
            return f"GPU-time budget of {self.gpu_s:g} s spent"
        return None

    def cannot_fit(self, spent: "Spent", fastest_s: float | None) -> str | None:
        """Why no further candidate fits the wall-time budget (one line), or None: the quickest
        candidate built so far took longer than what is left, so the next would overrun it."""
        if self.wall_s is None or fastest_s is None:
            return None
        left = self.wall_s - spent.wall_s
        if fastest_s <= left:
            return None
        return (f"wall-time budget of {self.wall_s:g} s: {max(left, 0.0):.0f} s left, and the quickest candidate "
                f"built so far took {fastest_s:.0f} s")


_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_seconds(text: str | float | int) -> float:
    """Seconds from ``"3m"``, ``"90s"``, ``"1h"``, ``"2m30s"``, ``"45"`` or a number: the one budget
    syntax of every command and of the API; ArgumentError (a ValueError) otherwise."""
    from ..errors import ArgumentError

    if isinstance(text, bool) or not isinstance(text, (int, float, str)):
        raise ArgumentError(f"budget {text!r}: use seconds or a duration like 90s, 3m, 1h, 2m30s")
    if isinstance(text, (int, float)):
        if not text > 0 or text == float("inf"):
            raise ArgumentError(f"budget {text}: a budget is a positive, finite time (90s, 3m, 1h or seconds)")
        return float(text)
    s = str(text).strip().lower()
    if s.startswith("-"):
        raise ArgumentError(f"budget {text!r}: a budget is a positive time (90s, 3m, 1h or seconds)")
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return parse_seconds(float(s))
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(min|h|m|s)", s)
    if not parts or "".join(a + b for a, b in parts) != s.replace(" ", ""):
        raise ArgumentError(f"budget {text!r}: use seconds or a duration like 90s, 3m, 1h, 2m30s")
    return parse_seconds(sum(float(a) * _UNITS[b] for a, b in parts))


@dataclass(frozen=True)
class Spent:
    wall_s: float = 0.0
    iterations: int = 0
    gpu_s: float = 0.0

    def add(self, wall_s: float = 0.0, iterations: int = 0, gpu_s: float = 0.0) -> "Spent":
        return Spent(self.wall_s + wall_s, self.iterations + iterations, self.gpu_s + gpu_s)


@dataclass(frozen=True)
class TaskVerdict:
    """One task body checked alone (:func:`stitchcuda.check.task.check_task`), in short."""

    task: str
    ok: bool
    stage: str
    reason: str
    ran: bool = False
    seconds: float = 0.0


@dataclass(frozen=True)
class TaskTime:
    """A task's measured device time per run and its distance to its roofline floor (0..1: 1 is
    the floor, 0 far from it), from the Verifier's profile (or the plan's estimate)."""

    task: str
    us: float
    efficiency: float
    measured: bool = True

    @property
    def score(self) -> float:
        """time x distance to the roofline: what the *optimize* route goes after first."""
        return self.us * (1.0 - min(max(self.efficiency, 0.0), 1.0))


#: Judgement kinds given before the Verifier runs: nothing was built or judged (next to no time).
BEFORE_VERIFIER = ("invalid", "no_code", "task_failed", "same_program")


@dataclass(frozen=True)
class Judgement:
    """The Verifier's verdict on one whole candidate program, in short.

    ``kind``: passed, wrong_answer, compile_error, crash, timeout, rejected, inconclusive, or
    (before the Verifier, BEFORE_VERIFIER) ``invalid`` (the constraints do not fit), ``no_code`` (an LLM reply
    without a body), ``task_failed`` (a per-task check failed), ``same_program`` (the program of a
    candidate judged before: not judged again). ``ms`` the program's median time;
    ``baselines`` name -> ms; ``tasks`` per-task times; ``report`` the report.json it came from.
    """

    kind: str
    summary: str
    ms: float | None = None
    baselines: tuple[tuple[str, float], ...] = ()
    tasks: tuple[TaskTime, ...] = ()
    gpu_s: float = 0.0
    report: str = ""
    wrong_output: str = ""
    #: a wrong answer's worst reported element: its error over the bound ``atol + tol |expected|``
    error_ratio: float | None = None
    #: a wrong answer under a reduced policy: the Verifier's note on PyTorch's own arithmetic at that
    #: policy on the same inputs (its error, and whether it too is over the tolerance)
    policy_note: str = ""

    @property
    def ok(self) -> bool:
        return self.kind == "passed"


@dataclass(frozen=True)
class Candidate:
    """One attempt: what was asked of the planner and the Coder, who proposed it, and its verdict.

    ``constraints`` is :meth:`stitchcuda.plan.Constraints.to_dict`; ``overrides`` task -> {source,
    origin}; ``parent`` the candidate it revises (None for the first); ``origins`` task -> where
    its code came from (template, rewrite, repair, variant, llm); ``meta`` the proposer's own
    notes (a bisection's step, an LLM call's tokens).
    """

    id: str
    parent: str | None
    proposer: str
    route: str
    target: str | None
    description: str
    constraints: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)
    origins: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    judgement: Judgement | None = None
    task_checks: tuple[TaskVerdict, ...] = ()
    seconds: float = 0.0
    program: str = ""      # the program folder, relative to the run folder

    @property
    def ok(self) -> bool:
        return self.judgement is not None and self.judgement.ok

    @property
    def ms(self) -> float | None:
        return self.judgement.ms if self.judgement is not None else None

    def key(self) -> str:
        """What makes two proposals the same attempt: constraints and bodies."""
        return proposal_key(self.constraints, self.overrides)


def proposal_key(constraints: Mapping[str, Any], overrides: Mapping[str, Any]) -> str:
    blob = json.dumps({"c": _canon(constraints), "o": {k: v.get("source", "") if isinstance(v, Mapping) else str(v)
                                                       for k, v in overrides.items()}},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _canon(c: Mapping[str, Any]) -> dict:
    return Constraints.from_dict(c).to_dict() if c else Constraints().to_dict()


@dataclass(frozen=True)
class Route:
    """Where the loop goes next and why: one of :data:`ROUTES`, the task it is about."""

    kind: str
    target: str | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ROUTES:
            raise ValueError(f"route {self.kind!r} is not one of {', '.join(ROUTES)}")


@dataclass(frozen=True)
class State:
    """The whole run, as of its last finished candidate.

    ``best`` is the id of the best *verified* candidate (fastest that passed), never merely the
    last; ``root`` the first candidate (the plain ``build``); ``exhausted`` the (route, target)
    pairs whose proposers have nothing new; ``target`` the task the *optimize* route is on.
    """

    run_id: str
    reference: str
    precision: str
    budget: Budget
    candidates: tuple[Candidate, ...] = ()
    best: str | None = None
    root: str | None = None
    target: str | None = None
    exhausted: tuple[str, ...] = ()
    routes: tuple[Route, ...] = ()
    spent: Spent = Spent()
    finished: str = ""     # why the run ended ("" while it goes on)
    min_gain: float = 0.02
    final: Judgement | None = None   # the best verified once more with every baseline
    final_of: str | None = None
    #: (id, final verdict) of each best that failed its final verification, set aside for the next
    set_aside: tuple[tuple[str, str], ...] = ()

    def candidate(self, cid: str | None) -> Candidate | None:
        for c in self.candidates:
            if c.id == cid:
                return c
        return None

    @property
    def best_candidate(self) -> Candidate | None:
        return self.candidate(self.best)

    @property
    def root_candidate(self) -> Candidate | None:
        return self.candidate(self.root)

    def base(self) -> Candidate | None:
        """What the next proposals revise: the best verified candidate, else the first one."""
        return self.best_candidate or self.root_candidate

    def next_best(self) -> Candidate | None:
        """The fastest verified candidate that is not the best and was not set aside."""
        gone = {cid for cid, _ in self.set_aside} | {self.best}
        ok = [c for c in self.candidates if c.ok and c.ms is not None and c.id not in gone]
        return min(ok, key=lambda c: c.ms) if ok else None

    def tried(self) -> set[str]:
        return {c.key() for c in self.candidates}

    def next_id(self) -> str:
        return f"c{len(self.candidates):04d}"

    def is_exhausted(self, kind: str, target: str | None) -> bool:
        return f"{kind}:{target or ''}" in self.exhausted

    def exhaust(self, kind: str, target: str | None) -> "State":
        return dataclasses.replace(self, exhausted=tuple(dict.fromkeys(self.exhausted + (f"{kind}:{target or ''}",))))

    def with_candidate(self, c: Candidate) -> "State":
        """The state with ``c`` recorded; ``c`` becomes the best only if it verified and is
        faster than the best by more than ``min_gain`` (the first verified one always is)."""
        st = dataclasses.replace(self, candidates=self.candidates + (c,), root=self.root or c.id)
        best = self.best_candidate
        if c.ok and c.ms is not None and (best is None or best.ms is None or c.ms < best.ms * (1.0 - self.min_gain)):
            st = dataclasses.replace(st, best=c.id)
        return st

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict:
        return {"schema": "stitchcuda.run_state", "version": 1, **_jsonable(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "State":
        def cand(x: Mapping[str, Any]) -> Candidate:
            return Candidate(**{**x, "judgement": _judgement(x.get("judgement")),
                                "task_checks": tuple(TaskVerdict(**t) for t in x.get("task_checks", ()))})

        return cls(run_id=d["run_id"], reference=d["reference"], precision=d["precision"], budget=Budget(**d["budget"]),
                   candidates=tuple(cand(c) for c in d.get("candidates", ())), best=d.get("best"), root=d.get("root"),
                   target=d.get("target"), exhausted=tuple(d.get("exhausted", ())),
                   routes=tuple(Route(**r) for r in d.get("routes", ())), spent=Spent(**d.get("spent", {})),
                   finished=d.get("finished", ""), min_gain=float(d.get("min_gain", 0.02)),
                   final=_judgement(d.get("final")), final_of=d.get("final_of"),
                   set_aside=tuple((str(a), str(b)) for a, b in d.get("set_aside", ())))

    @classmethod
    def from_json(cls, text: str) -> "State":
        return cls.from_dict(json.loads(text))


def _judgement(j: Mapping[str, Any] | None) -> Judgement | None:
    if j is None:
        return None
    return Judgement(**{**j, "baselines": tuple(tuple(b) for b in j.get("baselines", ())),
                        "tasks": tuple(TaskTime(**t) for t in j.get("tasks", ()))})


def _jsonable(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    return x


__all__ = ["ROUTES", "Budget", "Spent", "parse_seconds", "TaskVerdict", "TaskTime", "Judgement", "Candidate", "Route",
           "State", "proposal_key"]
