"""RL datasets: prompts exactly as the loop's LLM proposer sends them (from references and from a
run folder of `optimize`), deduplicated by prompt hash across sources, split by reference so that
no evaluation reference is ever in training, whatever source brought it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stitchcuda.rl.dataset import (build_dataset, examples_from_run, load_examples, load_references, reference_id,
                                   split_of)

REPO = Path(__file__).resolve().parents[1]
MODELS = [REPO / "models" / n for n in ("mlp.py", "gemm_row_sum.py", "relu_attention.py", "mlp_sum_head.py")]


def _jsonl_of(path: Path, out: Path, level: int, pid: int) -> Path:
    """A KernelBench-style line holding a program's source (another source of the same program)."""
    out.write_text(json.dumps({"level": level, "problem_id": pid, "name": f"{pid}_copy",
                               "source": path.read_text() + "\n\n"}) + "\n")
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl")
    dup = _jsonl_of(MODELS[0], root / "dup.jsonl", 9, 1)
    m = build_dataset(root / "ds", sources=MODELS + [dup], eval_fraction=0.5, seed=3, eval_references=["mlp_sum_head"])
    return root / "ds", m


def test_split_by_reference_never_leaks(data):
    ds, m = data
    train, ev = load_examples(ds, "train"), load_examples(ds, "eval")
    refs = load_references(ds)
    assert {e.reference for e in train}.isdisjoint({e.reference for e in ev})
    assert train and ev
    assert all(e.split == "train" for e in train) and all(e.split == "eval" for e in ev)
    named = {r.name: r.id for r in refs.values()}
    assert named["mlp_sum_head"] in {e.reference for e in ev}          # held out by name
    # the split is a function of the reference's source alone: another seed or a re-run agrees with it
    for rid, r in refs.items():
        want = "eval" if r.name == "mlp_sum_head" else split_of(rid, 0.5, seed=3)
        assert all(e.split == want for e in train + ev if e.reference == rid)
    assert m.counts["train"]["body"] + m.counts["eval"]["body"] == sum(e.kind == "body" for e in train + ev)


def test_the_same_program_from_two_sources_is_one_reference(data):
    ds, m = data
    refs = load_references(ds)
    assert len(refs) == len(MODELS)          # dup.jsonl's program is mlp.py's: same id, not a fifth reference
    assert reference_id(MODELS[0].read_text()) == reference_id(MODELS[0].read_text() + "\n\n")
    exs = load_examples(ds, "train") + load_examples(ds, "eval")
    ids = [e.id for e in exs]
    assert len(ids) == len(set(ids))         # deduplicated by prompt hash
    assert {e.kind for e in exs} == {"plan", "body"}
    body = next(e for e in exs if e.kind == "body")
    assert body.function and body.task and "## Task contract" in body.user and body.function in body.user
    assert body.opening == "```cuda\n" and body.prompt().opening == body.opening    # the reply starts in its block
    assert all(e.opening == "" for e in exs if e.kind == "plan")


class RecordingClient:
    """A scripted llama.cpp client: records every prompt; an empty decision, or a body that returns."""

    def __init__(self, cache_dir=None):
        from stitchcuda.llm import ModelIdentity, ResponseCache

        self.prompts = []
        self.cache = ResponseCache(cache_dir) if cache_dir is not None else None
        self.model = ModelIdentity.scripted("recording")

    def count_tokens(self, text):
        from stitchcuda.llm import estimate_tokens

        return estimate_tokens(text)

    def complete(self, prompt, grammar=None, max_tokens=None):
        import re

        from stitchcuda.llm.client import Completion

        self.prompts.append(prompt)
        if grammar is not None:
            text = '{"precision": {}, "unfuse": [], "strategy": {}, "rewrites": []}'
        else:
            fn = re.search(r"defines the function `(\w+)`", prompt.user).group(1)
            sig = re.search(r"st_status " + fn + r"\([^)]*\)", prompt.user).group(0)
            text = f"```cuda\n{sig} {{ return ST_OK; }}\n```"
        key = str(len(self.prompts))
        if self.cache is not None:     # as the real client keeps it: the run's llm/ folder
            key = self.cache.insert(self.model, prompt, text, grammar=getattr(grammar, "text", grammar)).key
        return Completion(text, "stop", 10, 10, 0.0, 0.0, False, "model", key)


def test_a_runs_llm_candidates_become_examples_with_the_loops_exact_prompts(tmp_path):
    """The loop runs with a recording client; every example rebuilt from its run folder carries a
    prompt the client was really sent, and the verdict the candidate got."""
    from stitchcuda.workflow import optimize
    from stitchcuda.workflow.llm import LLMProposer

    from .workflow_script import ScriptedJudge

    client = RecordingClient(tmp_path / "run" / "llm")
    r = optimize(str(REPO / "models" / "mlp.py"), precision="fp32", budget="2m", iterations=6,
                 judge=ScriptedJudge(sensitive=()), proposers=[LLMProposer(client)], compile=False,
                 out=tmp_path / "run")
    llm = [c for c in r.state.candidates if c.proposer == "llm"]
    assert llm and client.prompts
    entry, exs = examples_from_run(tmp_path / "run")
    assert entry is not None and entry.id == reference_id(MODELS[0].read_text())
    assert len(exs) == len(llm)
    sent = {(p.system, p.user) for p in client.prompts}
    for e in exs:
        assert (e.system, e.user) in sent, e.origin
        assert e.outcome["kind"] and e.outcome["candidate"] and e.completion
        if e.kind == "body":      # taken from the run's response cache: what was sent, and the whole reply
            assert e.outcome["prompt"] == "sent" and e.completion.startswith("```cuda")
    assert any(e.kind == "body" for e in exs)
    # a dataset from the run and the reference keeps one copy of each prompt, the run's (with its outcome)
    m = build_dataset(tmp_path / "ds", sources=[MODELS[0]], runs=[tmp_path / "run"], eval_fraction=0.0)
    all_ex = load_examples(tmp_path / "ds", "train")
    assert len({e.id for e in all_ex}) == len(all_ex) and m.counts["eval"] == {"plan": 0, "body": 0}
    first_prompts = [e for e in all_ex if e.attempts == 0 and e.kind == "body"]
    assert any(e.outcome for e in first_prompts)   # the run's first body prompt is the reference's own
