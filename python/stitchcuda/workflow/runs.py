"""The run folder ``runs/<id>/``: everything a run did, so it can be resumed, shown and diffed.

::

    run.json               what was asked: reference, precision, budget, LLM, created
    state.json             the State after the last finished candidate (rewritten atomically)
    events.jsonl           one JSON line per event: route, candidate start / end, new best, end
    reference.py           the reference's source (when it has one)
    weights.safetensors    the weights, once (hard-linked into every candidate's program)
    candidates/<cid>/      candidate.json (proposal, constraints, bodies, verdict, timings) and
                           program/ (the program folder; the Verifier's report.json is in it)
    best/                  the best verified program folder (replaced whole when the best changes)
    llm/                   the LLM's response cache (a run replays exactly)
    report.md              the final report

A run killed at any point resumes from ``state.json``: a candidate whose result was not yet in
it (the one in flight) is evaluated again, nothing else is lost.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..errors import ArgumentError
from ..fsutil import atomic_write_text
from ..pipeline import staged_folder
from .state import Candidate, State, _jsonable

DEFAULT_ROOT = "runs"


class RunError(ArgumentError):
    """A run folder that cannot be used (missing, not a run, another reference); one line."""


def new_run_id(name: str, precision: str) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{precision}-{stamp}"


@dataclass
class RunDir:
    root: Path

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def events_file(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def best_dir(self) -> Path:
        return self.root / "best"

    @property
    def weights_file(self) -> Path:
        return self.root / "weights.safetensors"

    @property
    def llm_dir(self) -> Path:
        return self.root / "llm"

    def candidate_dir(self, cid: str) -> Path:
        return self.root / "candidates" / cid

    def exists(self) -> bool:
        return self.state_file.is_file()

    def create(self, asked: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.root / "run.json", json.dumps(asked, indent=1) + "\n")

    def asked(self) -> dict:
        p = self.root / "run.json"
        if not p.is_file():
            raise RunError(f"{self.root}: not a run folder (no run.json)")
        return json.loads(p.read_text())

    def save(self, state: State) -> None:
        atomic_write_text(self.state_file, state.to_json())

    def load(self) -> State:
        if not self.state_file.is_file():
            raise RunError(f"{self.root}: no state.json (not a run folder, or it never finished a candidate)")
        return State.from_json(self.state_file.read_text())

    def event(self, event: str, **data: Any) -> None:
        """Append one event line (one write: a kill leaves at worst one cut line, which readers skip)."""
        line = json.dumps({"t": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
                           "event": event, **data}, default=str)
        self.root.mkdir(parents=True, exist_ok=True)
        with self.events_file.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()

    def events(self) -> list[dict]:
        out = []
        if self.events_file.is_file():
            for ln in self.events_file.read_text(encoding="utf-8").splitlines():
                try:
                    out.append(json.loads(ln))
                except ValueError:
                    continue
        return out

    def write_candidate(self, c: Candidate) -> None:
        d = self.candidate_dir(c.id)
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_text(d / "candidate.json", json.dumps(_jsonable(c), indent=1) + "\n")

    def publish_best(self, program: Path) -> None:
        """Copy ``program`` over ``best/`` whole (staged beside it, then renamed)."""
        with staged_folder(self.best_dir) as st:
            shutil.rmtree(st.path)
            shutil.copytree(program, st.path, copy_function=_link_or_copy)
            st.publish()


    def withdraw_best(self) -> None:
        """Remove ``best/``: the run has no program to hand back (its candidates keep their folders)."""
        shutil.rmtree(self.best_dir, ignore_errors=True)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def resolve(run: str | os.PathLike, root: str | os.PathLike = DEFAULT_ROOT) -> RunDir:
    """A run by folder or by id under ``root``."""
    p = Path(run)
    for cand in (p, Path(root) / p):
        if (cand / "run.json").is_file():
            return RunDir(cand)
    raise RunError(f"{run}: no such run (neither a run folder nor an id under {root}/)")


def list_runs(root: str | os.PathLike = DEFAULT_ROOT) -> Iterator[tuple[RunDir, dict, State | None]]:
    base = Path(root)
    if not base.is_dir():
        return
    for d in sorted(base.iterdir()):
        if (d / "run.json").is_file():
            r = RunDir(d)
            try:
                st = r.load()
            except (RunError, ValueError, KeyError):
                st = None
            yield r, r.asked(), st


def diff_candidates(a: tuple[RunDir, Candidate], b: tuple[RunDir, Candidate], context: int = 3) -> str:
    """What differs between two candidates: proposal, constraints, bodies, verdict, and program.cu."""
    (ra, ca), (rb, cb) = a, b
    lines = [f"--- {ra.root.name}:{ca.id}  {ca.proposer}: {ca.description}",
             f"+++ {rb.root.name}:{cb.id}  {cb.proposer}: {cb.description}"]
    for what, x, y in (("constraints", ca.constraints, cb.constraints),
                       ("bodies", {k: v.get("origin") for k, v in ca.overrides.items()},
                        {k: v.get("origin") for k, v in cb.overrides.items()})):
        if x != y:
            lines.append(f"{what}: {json.dumps(x, sort_keys=True)} -> {json.dumps(y, sort_keys=True)}")
    va = ca.judgement.summary if ca.judgement else "not judged"
    vb = cb.judgement.summary if cb.judgement else "not judged"
    lines.append(f"verdict: {va} -> {vb}")
    lines.append(f"ms: {_ms(ca.ms)} -> {_ms(cb.ms)}")
    pa, pb = ra.root / ca.program / "program.cu", rb.root / cb.program / "program.cu"
    if ca.program and cb.program and pa.is_file() and pb.is_file():
        lines += list(difflib.unified_diff(pa.read_text().splitlines(), pb.read_text().splitlines(),
                                           f"{ca.id}/program.cu", f"{cb.id}/program.cu", n=context, lineterm=""))
    return "\n".join(lines)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


__all__ = ["DEFAULT_ROOT", "RunDir", "RunError", "new_run_id", "resolve", "list_runs", "diff_candidates"]
