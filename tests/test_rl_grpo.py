"""GRPO with LoRA on a tiny, randomly initialised Gemma 3 model (two layers, a character tokenizer):
one step changes the adapter (and only the adapter), logs every rubric component, checkpoints, and a
resumed trainer goes on from the same step with the same weights. The judge is scripted here (a
random model writes no code); the real judge is tested in test_rl_reward.py."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

pytest.importorskip("transformers", reason="needs transformers (pip install 'stitchcuda[train]')")
pytest.importorskip("peft", reason="needs peft (pip install 'stitchcuda[train]')")

from stitchcuda.rl.dataset import Example  # noqa: E402
from stitchcuda.rl.grpo import GRPOSettings, Trainer, group_advantages, grpo_loss  # noqa: E402
from stitchcuda.rl.reward import Outcome  # noqa: E402


class ParityJudge:
    """Scripted outcomes from the reply's text: correct and fast, compiled, a compile error, no code,
    or a cheat, so a group has spread and every component shows up."""

    def __init__(self):
        self.seen, self.outcomes = [], []

    def judge_many(self, items):
        outs = []
        for ex, text in items:
            self.seen.append(text)
            k = sum(map(ord, text)) % 5
            outs.append([Outcome(ex.kind, "done", compiled=True, ran=True, correct=True, speedup=2.0),
                         Outcome(ex.kind, "build", compiled=True),
                         Outcome(ex.kind, "build", compiled=False),
                         Outcome(ex.kind, "format"),
                         Outcome(ex.kind, "static", findings=(("host-state-global", "reject"),))][k])
        self.outcomes += outs
        return outs


def _examples():
    return [Example(f"e{i}", "body", "r0", "tiny", "fp32", "Write CUDA.", f"Task {i}: add two vectors.",
                    task="add", function="add") for i in range(3)]


@pytest.fixture()
def tiny():
    from stitchcuda.rl.model import tiny_policy, with_lora

    return with_lora(tiny_policy(seed=0), )


def _lora(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_advantages_and_loss():
    import torch

    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    a = group_advantages([0.0, 1.0])
    assert a[0] == pytest.approx(-1.0, abs=1e-3) and a[1] == pytest.approx(1.0, abs=1e-3)
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    loss, kl = grpo_loss(logp, logp.detach(), logp.detach(), 1.0, 0.2, 0.04)
    loss.backward()
    assert float(kl) == 0.0 and torch.all(logp.grad < 0)       # a positive advantage raises the log-probs
    logp2 = torch.tensor([-1.0], requires_grad=True)
    loss2, _ = grpo_loss(logp2, torch.tensor([-1.5]), logp2.detach(), 1.0, 0.2, 0.0)
    loss2.backward()
    assert float(logp2.grad) == 0.0                             # ratio e^0.5 > 1.2: clipped, no gradient


def test_one_step_changes_the_adapter_and_logs_each_component(tiny, tmp_path):
    judge = ParityJudge()
    s = GRPOSettings(steps=1, group=6, max_new_tokens=12, lr=5e-3, checkpoint_every=1)
    base = {n: p.detach().clone() for n, p in tiny.model.named_parameters() if "lora_" not in n}
    before = _lora(tiny.model)
    t = Trainer(tiny, _examples(), judge, tmp_path, s)
    rec = t.train_step()
    assert len(judge.seen) == 6 and rec["updated"] > 0, rec
    after = _lora(tiny.model)
    assert any(not (before[n] == after[n]).all() for n in before), "the LoRA weights did not move"
    assert all((p.detach() == base[n]).all() for n, p in tiny.model.named_parameters() if "lora_" not in n)
    line = json.loads((tmp_path / "curve.jsonl").read_text().splitlines()[0])
    assert line["step"] == 1 and math.isfinite(line["loss"]) and line["kl"] >= 0.0
    from stitchcuda.rl.reward import score

    rewards = [score(o) for o in judge.outcomes]
    assert set(line["components"]) == set().union(*(r.components for r in rewards))     # every component logged
    for name, mean in line["components"].items():
        vals = [r.components[name] for r in rewards if name in r.components]
        assert mean == pytest.approx(sum(vals) / len(vals))
    assert line["reward_mean"] == pytest.approx(sum(r.total for r in rewards) / 6)
    assert line["penalties"] == ({"host-state-global": line["stages"]["static"]} if "static" in line["stages"] else {})
    assert sum(line["stages"].values()) == 6
    assert line["reward_max"] >= line["reward_mean"] and "seconds" in line


def test_sampling_runs_the_merged_model_and_leaves_the_base_weights_bit_for_bit(tiny):
    """Sampling folds the adapters into the base weights (fewer launches a token): inside, the
    logits are the adapted model's; after, every base weight is what it was, bit for bit, and
    the layers are unmerged. Under ``disable_adapter()`` (the reference model) nothing merges."""
    import torch

    from stitchcuda.rl.model import merged_for_sampling

    torch.manual_seed(1)
    with torch.no_grad():
        for n, p in tiny.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)       # a trained adapter: new ones start at zero
    ids = torch.tensor([[2, 40, 41, 42, 43]])
    base = {n: p.detach().clone() for n, p in tiny.model.named_parameters() if "lora_" not in n}
    with torch.no_grad():
        adapted = tiny.model(input_ids=ids).logits
        with tiny.model.disable_adapter():
            plain = tiny.model(input_ids=ids).logits
        assert (adapted - plain).abs().max() > 1e-3             # the adapter matters
        with merged_for_sampling(tiny.model):
            assert any(getattr(m, "merged", False) for m in tiny.model.modules())
            merged = tiny.model(input_ids=ids).logits
        with tiny.model.disable_adapter(), merged_for_sampling(tiny.model):
            assert not any(getattr(m, "merged", False) for m in tiny.model.modules())
            assert (tiny.model(input_ids=ids).logits == plain).all()
    torch.testing.assert_close(merged, adapted, rtol=1e-5, atol=1e-5)
    assert not any(getattr(m, "merged", False) for m in tiny.model.modules())
    assert all(torch.equal(p.detach(), base[n]) for n, p in tiny.model.named_parameters() if "lora_" not in n)
    with torch.no_grad():
        assert torch.equal(tiny.model(input_ids=ids).logits, adapted)


def test_prompts_batched_with_padding_sample_as_each_alone(tiny):
    """sample_many left-pads prompts of different lengths into one generate call; with sampling
    made greedy (top-p near 0) every prompt's completions are those it gets alone."""
    from stitchcuda.rl.grpo import encode, sample, sample_many

    s = GRPOSettings(max_new_tokens=10, top_p=1e-9)
    prompts = [encode(tiny, t) for t in ("add two vectors", "x", "a longer prompt than the others, by far")]
    assert len({len(p) for p in prompts}) == 3
    got = sample_many(tiny, [(p, 2, None) for p in prompts], s)
    alone = [sample(tiny, p, 2, s) for p in prompts]
    assert got == alone and all(len(c) == 2 for c in got)
    split = sample_many(tiny, [(p, 2, None) for p in prompts], s, max_batch_tokens=2 * max(map(len, prompts)))
    assert split == alone                                   # more than one generate call: the same answer


def test_checkpoint_and_resume(tiny, tmp_path):
    from stitchcuda.rl.model import tiny_policy, with_lora

    s = GRPOSettings(steps=2, group=4, max_new_tokens=8, lr=5e-3, checkpoint_every=1)
    t = Trainer(tiny, _examples(), ParityJudge(), tmp_path, s)
    t.run()
    assert t.step == 2 and t.latest().name == "step-00002"
    saved = _lora(tiny.model)
    fresh = with_lora(tiny_policy(seed=0))
    t2 = Trainer(fresh, _examples(), ParityJudge(), tmp_path, GRPOSettings(**{**s.__dict__, "steps": 3}))
    assert t2.resume() and t2.step == 2
    got = _lora(fresh.model)
    assert all(torch_equal(saved[n], got[n]) for n in saved)
    assert len((tmp_path / "curve.jsonl").read_text().splitlines()) == 2
    t2.run()
    assert t2.step == 3 and len((tmp_path / "curve.jsonl").read_text().splitlines()) == 3
    if importlib.util.find_spec("matplotlib") is None:
        return
    assert (tmp_path / "curve.png").stat().st_size > 1000


def torch_equal(a, b) -> bool:
    return bool((a == b).all())


def test_throughput_is_said_early_with_what_fits(tiny, tmp_path):
    said = []
    s = GRPOSettings(steps=4, group=2, max_new_tokens=4, checkpoint_every=10, time_limit_s=3600.0)
    Trainer(tiny, _examples(), ParityJudge(), tmp_path, s, say=said.append).run()
    line = next(t for t in said if t.startswith("throughput:"))
    assert "over 3 step(s)" in line and "1 step(s) to go" in line and "more fit in this invocation" in line


def test_replies_begin_with_the_opening_and_long_prompts_are_passed_over(tiny, tmp_path):
    """A body prompt's opening is part of what the model continues and of the reply judged (as the
    llama.cpp client returns it); a prompt longer than max_prompt_tokens is never drawn, and the
    held-out rates count the ones left out."""
    from stitchcuda.llm import Prompt
    from stitchcuda.llm.prompts import CODE_OPENING
    from stitchcuda.rl.grpo import evaluate_policy

    short = Example("short", "body", "r0", "tiny", "fp32", "Write CUDA.", "Add.", task="add", function="add",
                    opening=CODE_OPENING)
    long_ = Example("long", "body", "r0", "tiny", "fp32", "Write CUDA.", "Add. " * 400, task="add", function="add",
                    opening=CODE_OPENING)
    assert tiny.render(short.prompt()).endswith("Add.\n" + CODE_OPENING)
    assert tiny.reply(short.prompt(), "x") == CODE_OPENING + "x"
    judge = ParityJudge()
    s = GRPOSettings(steps=1, group=4, max_new_tokens=6, max_prompt_tokens=200)
    t = Trainer(tiny, [long_, long_, short], judge, tmp_path, s)
    for step in range(4):
        assert [e.id for e in t.pick(step)] == ["short"]
    t.train_step()
    assert len(judge.seen) == 4 and all(text.startswith(CODE_OPENING) for text in judge.seen)
    res = evaluate_policy(tiny, [short, long_], ParityJudge(), samples=2, settings=s)
    assert res["body"]["n"] == 2 and res["body"]["prompts_too_long"] == 1
    with pytest.raises(ValueError, match="none of the 1 prompts fits"):
        evaluate_policy(tiny, [long_], ParityJudge(), samples=2, settings=s)
    assert Prompt("a", "b").opening == ""          # other requests are unchanged


def test_a_cached_model_that_no_longer_reads_the_same_is_converted_again(tmp_path):
    """load_policy_cached keeps a fingerprint (a probe's tokens and logits) of what it converted; a
    cached folder that reloads differently (here: other weights written over it) is converted
    again from the source, with a warning, instead of training a different model."""
    import warnings

    from stitchcuda.rl.model import PROBE, fingerprint, load_policy_cached, same_model, tiny_policy

    src = tmp_path / "src"
    pol = tiny_policy(seed=3, vocab_extra="`{}[];*")
    pol.model.save_pretrained(str(src))
    pol.tokenizer.save_pretrained(str(src))
    want = fingerprint(pol)
    first = load_policy_cached(src, tmp_path / "cache")
    assert same_model(fingerprint(first), want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # a faithful cache loads silently
        assert same_model(fingerprint(load_policy_cached(src, tmp_path / "cache")), want)
    # the folder's tokenizer files read as another tokenizer (as transformers 5.17 reads a saved
    # Gemma tokenizer: one token per character): the tokenizer's own serialisation is used instead
    other = tiny_policy(seed=3, vocab_extra="\x01").tokenizer          # every id one higher
    assert list(other(PROBE).input_ids) != want["ids"]
    other.save_pretrained(str(tmp_path / "cache"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert same_model(fingerprint(load_policy_cached(src, tmp_path / "cache")), want)
    tiny_policy(seed=4, vocab_extra="`{}[];*").model.save_pretrained(str(tmp_path / "cache"))
    with pytest.warns(UserWarning, match="converting it again"):
        again = load_policy_cached(src, tmp_path / "cache")
    assert same_model(fingerprint(again), want)
    assert not same_model(want, {**want, "logits": [v + 1.0 for v in want["logits"]]})
