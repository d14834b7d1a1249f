"""Training data for the two atomic skills, generated offline from references and run histories.

Two kinds of example, each one prompt exactly as the loop's LLM proposer
(:mod:`stitchcuda.workflow.llm`) builds it, with the prompt builders of :mod:`stitchcuda.llm`:

``plan``  the reference graph, the current plan and the Verifier's feedback -> a planner decision
          (JSON under the decision grammar); ``spec`` holds the names the decision may use.
``body``  a task's contract, the reference nodes it covers and the Verifier's feedback on earlier
          attempts -> the body of the task's function; ``task``/``constraints`` say which plan.

Sources: reference programs (a ``.py`` file, a folder of them, a KernelBench ``.jsonl``, or
``kernelbench:L:ID``), each captured on the meta device and planned at each precision asked for
(one ``plan`` example, one ``body`` example per run-phase task, no feedback yet); and run folders
written by ``stitchcuda optimize`` (``runs/<id>/``), whose LLM candidates become examples with
the feedback the loop had at the time and the verified outcome (``outcome``) of what was
proposed (``completion``).

Invariants the tests hold:

- **deduplicated** by prompt hash (system text, user text, kind): the first example of a prompt
  is kept, and a run's example (which knows its outcome) is preferred to a reference's;
- **split by reference**: a reference's id is the SHA-256 of its source text, whatever path or
  KernelBench line it came from, and its split is a pure function of that id and the seed, so an
  evaluation problem never appears in training, whichever source brought it;
- written as ``train.jsonl``, ``eval.jsonl``, ``references.jsonl`` (id, name, origin, source: the
  reward recaptures from it) and ``manifest.json`` (counts, sources, split rule, prompt settings).

The token count used to fit prompts is the loop's before a model is loaded
(:func:`stitchcuda.llm.estimate_tokens`); pass ``count_tokens`` (a tokenizer's) to match a loop
whose client has loaded its model.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from .. import plan as planner
from ..code import contract
from ..device import for_planning
from ..llm import (Attempt, DecisionSpec, Prompt, ResponseCache, code_prompt, decision_prompt, estimate_tokens,
                   import_llama_cpp)
from ..ops import supported
from ..verifier.run.reference import load_kernelbench
from ..workflow.llm import graph_text, subgraph_text
from ..workflow.runs import RunDir

SCHEMA = "stitchcuda.rl_dataset"
VERSION = 1
KINDS = ("plan", "body")


@dataclass(frozen=True)
class ReferenceEntry:
    """One reference program: ``id`` the SHA-256 (16 hex) of its source, ``origin`` where it was
    read (a file, ``kernelbench:L:ID``, a run folder)."""

    id: str
    name: str
    origin: str
    source: str

    @classmethod
    def of(cls, name: str, origin: str, source: str) -> "ReferenceEntry":
        return cls(reference_id(source), name, origin, source)


@dataclass(frozen=True)
class Example:
    """One prompt and what is known of it. ``id`` is the prompt hash; ``completion`` a reply the
    loop once got for it and ``outcome`` the verdict on that reply (from a run), else empty."""

    id: str
    kind: str
    reference: str
    name: str
    precision: str
    system: str
    user: str
    task: str = ""
    function: str = ""
    constraints: dict = field(default_factory=dict)
    spec: dict = field(default_factory=dict)
    attempts: int = 0
    origin: str = ""
    completion: str = ""
    outcome: dict = field(default_factory=dict)
    split: str = ""
    opening: str = ""       #: the start of the reply (:class:`stitchcuda.llm.Prompt`'s ``opening``)

    def prompt(self) -> Any:
        """The request, as the loop sends it."""
        return Prompt(self.system, self.user, self.opening)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "Example":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def reference_id(source: str) -> str:
    """A reference's identity: its source text, line endings and trailing blanks normalised."""
    norm = "\n".join(ln.rstrip() for ln in source.replace("\r\n", "\n").strip().splitlines())
    return hashlib.sha256(norm.encode()).hexdigest()[:16]


def prompt_hash(kind: str, system: str, user: str) -> str:
    return hashlib.sha256(json.dumps([kind, system, user]).encode()).hexdigest()[:20]


def split_of(ref_id: str, eval_fraction: float, seed: int = 0) -> str:
    """``eval`` or ``train``, from the reference id alone (stable across sources and runs)."""
    h = int(hashlib.sha256(f"{seed}:{ref_id}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "eval" if h < eval_fraction else "train"


# ---------------------------------------------------------------------------- references


def iter_references(sources: Iterable[str | os.PathLike]) -> Iterator[ReferenceEntry]:
    """Every reference of ``sources``: ``.py`` files, folders of them, ``.jsonl`` KernelBench
    files, ``kernelbench:L:ID``. A path that does not exist is a ValueError naming it."""
    for s in sources:
        text = os.fspath(s)
        m = re.fullmatch(r"kernelbench:(\d+):(\d+)", text)
        if m:
            spec = load_kernelbench(int(m.group(1)), int(m.group(2)))
            yield ReferenceEntry.of(spec.name, text, spec.source)
            continue
        p = Path(text)
        if p.is_dir():
            for f in sorted(p.glob("*.py")):
                if not f.name.startswith("_"):
                    yield ReferenceEntry.of(f.stem, str(f), f.read_text(encoding="utf-8"))
        elif p.suffix == ".jsonl" and p.is_file():
            for line in p.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    rec = json.loads(line)
                    yield ReferenceEntry.of(str(rec.get("name") or rec.get("problem_id")),
                                            f"kernelbench:{rec.get('level')}:{rec.get('problem_id')}",
                                            rec["source"])
        elif p.is_file():
            yield ReferenceEntry.of(p.stem, str(p), p.read_text(encoding="utf-8"))
        else:
            raise ValueError(f"{text}: no such reference file, folder, .jsonl or kernelbench:L:ID")


@dataclass
class ReferenceGraph:
    """A reference entry and its graph, captured on the meta device, ready to plan at any
    precision (no weights: prompts and plans do not need them)."""

    entry: ReferenceEntry
    graph: Any
    ceilings: Any

    def plan(self, precision: str, constraints: dict | None = None):
        return planner.plan(self.graph, precision, self.ceilings,
                            constraints=planner.Constraints.from_dict(constraints or {}))


def capture(entry: ReferenceEntry) -> ReferenceGraph:
    """Capture ``entry`` on the meta device (no weights drawn, no GPU); raises what capture raises."""
    from .. import frontend  # PyTorch

    ref = frontend.load_reference(entry.source, name=entry.name)
    cap = frontend.capture_reference(ref, device="meta", seed=0, supported_ops=supported())
    return ReferenceGraph(entry, cap.graph, for_planning())


# ---------------------------------------------------------------------------- prompts


@dataclass(frozen=True)
class PromptSettings:
    """The LLM proposer's prompt budgets (:class:`stitchcuda.workflow.llm.LLMProposer` defaults)."""

    budget_tokens: int = 6000

    @property
    def api_budget_tokens(self) -> int:
        return min(2000, self.budget_tokens // 3)


def body_prompt(cap: ReferenceGraph, plan: Any, task: str, attempts: Sequence[Any] = (), *,
                settings: PromptSettings = PromptSettings(), count_tokens: Callable[[str], int] | None = None):
    """(function, Prompt) for the body of ``task``: what ``LLMProposer._body`` sends."""
    c = contract(plan, task)
    return c.function, code_prompt(c.function, c.describe(), subgraph_text(cap.graph, c.covers), attempts=attempts,
                                   budget_tokens=settings.budget_tokens,
                                   api_budget_tokens=settings.api_budget_tokens,
                                   count_tokens=count_tokens or estimate_tokens)


def plan_prompt(cap: ReferenceGraph, plan: Any, feedback: Sequence[str] = (), *,
                settings: PromptSettings = PromptSettings(), count_tokens: Callable[[str], int] | None = None):
    """(DecisionSpec, Prompt) for a planner decision: what ``LLMProposer._decision`` sends."""
    ch = planner.choices(cap.graph)
    spec = DecisionSpec.make(ch.nodes, None, dict(ch.strategies), ch.rewrites)
    return spec, decision_prompt(graph_text(cap.graph), spec, plan=str(plan), feedback=feedback,
                                 budget_tokens=settings.budget_tokens, count_tokens=count_tokens or estimate_tokens)


def _example(kind: str, entry: ReferenceEntry, precision: str, prompt: Any, **kw: Any) -> Example:
    return Example(prompt_hash(kind, prompt.system, prompt.user), kind, entry.id, entry.name, precision,
                   prompt.system, prompt.user, opening=prompt.opening, **kw)


def examples_from_reference(cap: ReferenceGraph, precisions: Sequence[str] = ("fp32",), *,
                            settings: PromptSettings = PromptSettings(),
                            count_tokens: Callable[[str], int] | None = None) -> list[Example]:
    """One plan example and one body example per run-phase task, per precision; no feedback."""
    out = []
    for prec in precisions:
        plan = cap.plan(prec)
        spec, p = plan_prompt(cap, plan, settings=settings, count_tokens=count_tokens)
        out.append(_example("plan", cap.entry, prec, p, spec=spec.to_json(), origin=cap.entry.origin))
        for t in plan.run_tasks:
            try:
                fn, p = body_prompt(cap, plan, t.name, settings=settings, count_tokens=count_tokens)
            except KeyError:
                continue
            out.append(_example("body", cap.entry, prec, p, task=t.name, function=fn, origin=cap.entry.origin))
    return out


def examples_from_run(run_root: str | os.PathLike, *, settings: PromptSettings = PromptSettings(),
                      count_tokens: Callable[[str], int] | None = None,
                      captured: dict[str, ReferenceGraph] | None = None) -> tuple[ReferenceEntry | None, list[Example]]:
    """The LLM candidates of one run folder as examples with their verified outcome.

    A body candidate's prompt is rebuilt from the plan its base had (the candidate's constraints)
    and the feedback on the earlier LLM bodies for the same task, oldest first, as the loop built
    it; a decision's from the plan of the candidate it revised and the verdicts before it."""
    run = RunDir(Path(run_root))
    asked = run.asked()
    sent = ResponseCache(run.llm_dir) if run.llm_dir.is_dir() else None
    state = run.load()
    src_file = run.root / "reference.py"
    if src_file.is_file():
        entry = ReferenceEntry.of(asked.get("name") or Path(str(asked["reference"])).stem,
                                  str(asked["reference"]), src_file.read_text(encoding="utf-8"))
    else:
        try:
            entry = next(iter_references([asked["reference"]]))
        except (ValueError, StopIteration, OSError):
            return None, []
    captured = captured if captured is not None else {}
    cap = captured.get(entry.id) or capture(entry)
    captured[entry.id] = cap
    out: list[Example] = []
    seen: list[Any] = []
    for c in state.candidates:
        if c.proposer == "llm" and c.judgement is not None:
            outcome = {"kind": c.judgement.kind, "summary": c.judgement.summary, "ms": c.judgement.ms,
                       "baselines": dict(c.judgement.baselines),
                       "task_checks": [asdict(t) for t in c.task_checks], "run": run.root.name, "candidate": c.id}
            parent = state.candidate(c.parent)
            try:
                if c.meta.get("task"):
                    task = c.meta["task"]
                    earlier = [x for x in seen if x.proposer == "llm" and x.meta.get("task") == task]
                    attempts = [Attempt(x.overrides.get(task, {}).get("source", x.meta.get("reply", "")),
                                        x.judgement.summary if x.judgement else "") for x in earlier]
                    base = parent.constraints if parent is not None else c.constraints
                    plan = cap.plan(state.precision, base)
                    fn, p = body_prompt(cap, plan, task, attempts, settings=settings, count_tokens=count_tokens)
                    body = c.overrides.get(task, {}).get("source", "")
                    reply = f"```cuda\n{body}```" if body else c.meta.get("reply", "")
                    rec = sent.get(c.meta["key"]) if sent is not None and c.meta.get("key") else None
                    if rec is not None:       # what was really sent (its token counts were the model's)
                        p, reply = rec.prompt, rec.text
                    out.append(_example("body", entry, state.precision, p, task=task, function=fn,
                                        constraints=dict(base), attempts=len(attempts),
                                        origin=f"run:{run.root.name}/{c.id}", completion=reply,
                                        outcome={**outcome, "prompt": "sent" if rec is not None else "rebuilt"}))
                elif c.meta.get("decision"):
                    base = parent.constraints if parent is not None else {}
                    feedback = [f"{x.id} ({x.description}): {x.judgement.summary}" for x in seen[-6:]
                                if x.judgement is not None]
                    spec, p = plan_prompt(cap, cap.plan(state.precision, base), feedback, settings=settings,
                                          count_tokens=count_tokens)
                    out.append(_example("plan", entry, state.precision, p, spec=spec.to_json(),
                                        constraints=dict(base), origin=f"run:{run.root.name}/{c.id}",
                                        completion=c.meta.get("reply", ""), outcome={**outcome, "prompt": "rebuilt"}))
            except Exception:  # noqa: BLE001 - a candidate whose plan no longer forms is skipped, not fatal
                pass
        seen.append(c)
    return entry, out


def gguf_token_counter(path: str | os.PathLike) -> Callable[[str], int]:
    """Token counts of a GGUF model's own vocabulary, as the loop's client counts once its model
    is loaded (llama.cpp, vocabulary only: no weights are read)."""
    llama = import_llama_cpp().Llama(model_path=str(path), vocab_only=True, verbose=False)
    return lambda text: len(llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))


# ---------------------------------------------------------------------------- the dataset


@dataclass(frozen=True)
class DatasetManifest:
    """What ``manifest.json`` of a dataset folder says: the sources and runs it was made from,
    the split rule, the prompt budget, counts per split and kind, and what was skipped."""

    schema: str
    version: int
    sources: tuple[str, ...]
    runs: tuple[str, ...]
    precisions: tuple[str, ...]
    eval_fraction: float
    seed: int
    budget_tokens: int
    counts: dict
    references: dict
    skipped: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"


def build_dataset(out: str | os.PathLike, *, sources: Sequence[str | os.PathLike] = (),
                  runs: Sequence[str | os.PathLike] = (), precisions: Sequence[str] = ("fp32",),
                  eval_fraction: float = 0.2, seed: int = 0, settings: PromptSettings = PromptSettings(),
                  count_tokens: Callable[[str], int] | None = None, eval_references: Sequence[str] = (),
                  progress: Callable[[str], None] | None = None) -> DatasetManifest:
    """Write the dataset to ``out`` (see the module docstring). A reference that does not capture
    or plan is skipped and named in the manifest. ``eval_references``: reference names, origins or
    ids forced into the evaluation split (a held-out set the user names)."""
    say = progress or (lambda text: None)
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    refs: dict[str, ReferenceEntry] = {}
    examples: dict[str, Example] = {}
    skipped: list[str] = []
    captured: dict[str, ReferenceGraph] = {}
    done: set[str] = set()

    def add(ex: Example) -> None:
        old = examples.get(ex.id)
        if old is None or (ex.outcome and not old.outcome):
            examples[ex.id] = ex

    for run in runs:             # first: a run's example knows its outcome
        try:
            entry, exs = examples_from_run(run, settings=settings, count_tokens=count_tokens, captured=captured)
        except Exception as e:  # noqa: BLE001 - a broken run folder is named, not fatal
            skipped.append(f"{run}: {type(e).__name__}: {e}")
            continue
        if entry is not None:
            refs.setdefault(entry.id, entry)
        for ex in exs:
            add(ex)
        say(f"run {run}: {len(exs)} example(s)")
    for entry in iter_references(sources):
        if entry.id in done:       # the same program from another source (dev.jsonl and all.jsonl)
            continue
        done.add(entry.id)
        try:
            cap = captured.get(entry.id) or capture(entry)
            exs = examples_from_reference(cap, precisions, settings=settings, count_tokens=count_tokens)
        except Exception as e:  # noqa: BLE001 - unsupported ops, a reference that does not load
            skipped.append(f"{entry.origin}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            say(f"skip {entry.origin}: {type(e).__name__}")
            continue
        captured[entry.id] = cap
        refs.setdefault(entry.id, entry)
        for ex in exs:
            add(ex)
        say(f"{entry.origin}: {len(exs)} example(s)")

    forced = set(eval_references)
    split = {rid: ("eval" if ({rid, e.name, e.origin} & forced) else split_of(rid, eval_fraction, seed))
             for rid, e in refs.items()}
    counts: dict[str, dict[str, int]] = {"train": {k: 0 for k in KINDS}, "eval": {k: 0 for k in KINDS}}
    files = {s: (root / f"{s}.jsonl").open("w", encoding="utf-8") for s in ("train", "eval")}
    try:
        for ex in sorted(examples.values(), key=lambda e: (e.reference, e.kind, e.task, e.id)):
            s = split[ex.reference]
            files[s].write(Example(**{**asdict(ex), "split": s}).to_json() + "\n")
            counts[s][ex.kind] += 1
    finally:
        for f in files.values():
            f.close()
    with (root / "references.jsonl").open("w", encoding="utf-8") as f:
        for rid, e in sorted(refs.items()):
            f.write(json.dumps({**asdict(e), "split": split[rid]}, sort_keys=True) + "\n")
    m = DatasetManifest(SCHEMA, VERSION, tuple(map(os.fspath, sources)), tuple(map(os.fspath, runs)), tuple(precisions),
                 eval_fraction, seed, settings.budget_tokens, counts,
                 {"train": sorted(e.name for r, e in refs.items() if split[r] == "train"),
                  "eval": sorted(e.name for r, e in refs.items() if split[r] == "eval")}, tuple(skipped))
    (root / "manifest.json").write_text(m.to_json(), encoding="utf-8")
    return m


def load_examples(root: str | os.PathLike, split: str) -> list[Example]:
    p = Path(root) / f"{split}.jsonl"
    return [Example.from_dict(json.loads(ln)) for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]


def load_references(root: str | os.PathLike) -> dict[str, ReferenceEntry]:
    out = {}
    for ln in (Path(root) / "references.jsonl").read_text(encoding="utf-8").splitlines():
        if ln.strip():
            d = json.loads(ln)
            out[d["id"]] = ReferenceEntry(d["id"], d["name"], d["origin"], d["source"])
    return out


__all__ = ["SCHEMA", "KINDS", "ReferenceEntry", "Example", "ReferenceGraph", "PromptSettings", "DatasetManifest", "reference_id",
           "prompt_hash", "split_of", "iter_references", "capture", "body_prompt", "plan_prompt",
           "examples_from_reference", "examples_from_run", "gguf_token_counter", "build_dataset", "load_examples", "load_references"]
