"""GRPO with LoRA: group sampling, group-normalised advantages, a clipped policy gradient with a
KL penalty to the reference (the base model: the adapters switched off).

Why a loop of our own, not TRL's ``GRPOTrainer``: the reward here is an external, slow, parallel
judge (children that compile and run CUDA) whose per-component results must be logged per step;
TRL wants a ``datasets.Dataset`` and in-process reward callables, and brings ``accelerate``,
``datasets`` and ``pyarrow`` — wheels that a GPU machine without a network would have to carry,
for a loop that is about a hundred lines here. What this loop does, per step:

1. take ``prompts_per_step`` training examples (a pure function of the seed and the step, so a
   resumed run takes the same ones), render each as the loop's client would send it;
2. sample ``group`` completions per prompt from the policy (temperature, top-p); the step's
   prompts share one ``generate`` call (left-padded), as do the held-out prompts of an evaluation:
   decoding a small model is bound by its kernel launches, so rows are almost free;
3. judge every completion in parallel (:class:`.judge.RewardJudge`) and score it with the rubric
   (:func:`.reward.score`);
4. advantage of a completion = (reward - group mean) / (group std + eps); a group whose rewards
   are all equal teaches nothing and is skipped;
5. loss per token = -min(rho A, clip(rho, 1-eps, 1+eps) A) + beta KL(pi || pi_ref), with rho the
   ratio to the policy that sampled (1 on the first epoch: its gradient is the plain policy
   gradient, and with ``epochs`` = 1 the sampling policy's log-probs are the current ones, not a
   pass of their own; the clip matters from ``epochs`` >= 2) and KL the k3 estimator
   exp(ref - logp) - (ref - logp) - 1; averaged over a completion's tokens, then over completions;
6. AdamW on the LoRA parameters, gradients clipped to norm 1.

Every step appends a line to ``curve.jsonl`` (reward mean / std / max, each rubric component's
mean, the stages completions stopped at, the penalised classes, KL, loss, seconds per phase);
every ``checkpoint_every`` steps (and at the end, or when ``time_limit_s`` is near) the adapter,
the optimizer and the step are saved under ``checkpoints/``; ``resume`` goes on from the latest.
``curve.png`` is drawn when matplotlib is installed.

Planner decisions are sampled under the decision grammar, as the loop samples them with
llama.cpp (:mod:`.constrained`: the same language, walked over a trie of the token texts), so
every sampled decision parses and the reward ranks decisions, not their spelling; the
log-probabilities in the loss are the model's own (unconstrained), whose gradient raises the
chosen decision's probability among all continuations. ``grammar=False`` samples them free.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from ..llm import DecisionSpec
from .constrained import for_example
from .dataset import Example
from .model import merged_for_sampling
from .reward import Outcome, Reward, score


class ReplyJudge(Protocol):
    """Judges sampled replies (:class:`.judge.RewardJudge`; tests pass scripted ones)."""

    def judge_many(self, items: Sequence[tuple[Example, str]]) -> list[Outcome]: ...


@dataclass(frozen=True)
class GRPOSettings:
    steps: int = 200
    group: int = 8
    prompts_per_step: int = 1
    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 0.95
    lr: float = 2e-5
    beta: float = 0.04
    clip: float = 0.2
    epochs: int = 1
    checkpoint_every: int = 20
    seed: int = 0
    kinds: tuple[str, ...] = ("body", "plan")
    max_prompt_tokens: int = 6144
    time_limit_s: float | None = None
    grammar: bool = True
    max_decision_tokens: int = 2048


# ---------------------------------------------------------------------------- sampling and log-probs


def encode(policy: Any, text: str) -> list[int]:
    """Token ids of a rendered prompt, with the BOS token llama.cpp adds (once: a chat template
    that writes it itself gets none added)."""
    bos = policy.tokenizer.bos_token
    add = not (bos and text.startswith(bos))
    return list(policy.tokenizer(text, add_special_tokens=add).input_ids)


def _constrained(ex: Example | None, s: GRPOSettings) -> bool:
    return ex is not None and ex.kind == "plan" and s.grammar and bool(ex.spec)


def sample(policy: Any, prompt_ids: list[int], n: int, s: GRPOSettings, ex: Example | None = None) -> list[list[int]]:
    """``n`` completions (token ids, cut after the first EOS) of ``prompt_ids``; a plan example's
    under the decision grammar (``s.grammar``)."""
    kw: dict[str, Any] = {}
    if _constrained(ex, s):
        kw["prefix_allowed_tokens_fn"] = for_example(policy.tokenizer, ex.spec).prefix_fn(len(prompt_ids))
        longest = DecisionSpec.from_json(ex.spec).grammar().max_chars    # the loop's bound: max(max_tokens, this)
        kw["max_new_tokens"] = min(max(s.max_new_tokens, longest + 1), s.max_decision_tokens)
    return _generate(policy, [prompt_ids] * n, s, **kw)


def sample_many(policy: Any, jobs: Sequence[tuple[list[int], int, Example | None]], s: GRPOSettings,
                max_batch_tokens: int = 131072) -> list[list[list[int]]]:
    """The completions of several prompts: ``jobs`` are (prompt ids, n, example); the answer has
    ``n`` completions per job, in order. Prompts sampled free share ``generate`` calls (left-padded
    to the longest, at most ``max_batch_tokens`` prompt tokens a call): a decode step costs about
    the same for one row as for dozens, so a batch of prompts takes the time of one. A plan under
    the decision grammar is sampled alone (its constraint is per request)."""
    out: list[list[list[int]] | None] = [None] * len(jobs)
    chunk: list[int] = []

    def flush() -> None:
        if not chunk:
            return
        rows = [jobs[i][0] for i in chunk for _ in range(jobs[i][1])]
        comps = _generate(policy, rows, s)
        k = 0
        for i in chunk:
            out[i] = comps[k:k + jobs[i][1]]
            k += jobs[i][1]
        chunk.clear()

    for i, (ids, n, ex) in enumerate(jobs):
        if _constrained(ex, s):
            out[i] = sample(policy, ids, n, s, ex)
            continue
        longest = max([len(ids)] + [len(jobs[j][0]) for j in chunk])
        if chunk and longest * (n + sum(jobs[j][1] for j in chunk)) > max_batch_tokens:
            flush()
        chunk.append(i)
    flush()
    return [o if o is not None else [] for o in out]


def _generate(policy: Any, prompts: list[list[int]], s: GRPOSettings, **kw: Any) -> list[list[int]]:
    """One ``generate`` call over ``prompts`` (left-padded; the mask hides the padding), each row
    cut after its first EOS."""
    import torch

    pad = policy.tokenizer.pad_token_id
    eos = policy.tokenizer.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=policy.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=policy.device)
    kw.setdefault("max_new_tokens", s.max_new_tokens)
    with torch.no_grad(), merged_for_sampling(policy.model):
        out = policy.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=s.temperature,
                                    top_p=s.top_p, pad_token_id=pad, eos_token_id=eos, **kw)
    comps = []
    for row in out[:, width:].tolist():
        cut = row.index(eos) + 1 if eos in row else len(row)
        comps.append(row[:cut] or [eos])
    return comps


def token_logprobs(model: Any, prompt_ids: list[int], completion: list[int]) -> Any:
    """log pi(completion token | everything before it), one value per completion token."""
    import torch

    dev = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + completion], device=dev)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=len(completion) + 1).logits
    logits = logits[0, :-1].float()
    target = torch.tensor(completion, device=dev)
    return torch.log_softmax(logits, -1).gather(-1, target[:, None])[:, 0]


def group_advantages(rewards: Sequence[float], eps: float = 1e-4) -> list[float]:
    """(r - mean) / (std + eps) over one group; all zeros when the rewards are all equal."""
    m = sum(rewards) / len(rewards)
    sd = math.sqrt(sum((r - m) ** 2 for r in rewards) / len(rewards))
    if sd < 1e-9:
        return [0.0] * len(rewards)
    return [(r - m) / (sd + eps) for r in rewards]


def grpo_loss(logp: Any, old: Any, ref: Any, adv: float, clip: float, beta: float) -> tuple[Any, Any]:
    """(loss, mean KL) of one completion; see the module docstring, step 5."""
    import torch

    ratio = torch.exp(logp - old)
    pg = -torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    d = ref - logp
    kl = torch.exp(d) - d - 1
    return (pg + beta * kl).mean(), kl.mean().detach()


# ---------------------------------------------------------------------------- the trainer


def latest_checkpoint(out: str | Path) -> Path | None:
    """The newest complete checkpoint folder of the training folder ``out`` (its ``adapter/``
    holds the LoRA weights), or None."""
    ckpt = Path(out) / "checkpoints"
    f = ckpt / "latest"
    if f.is_file():
        d = ckpt / f.read_text().strip()
        if (d / "trainer.pt").is_file():
            return d
    return None


class Trainer:
    """GRPO over ``examples`` with ``policy`` (LoRA applied), rewards from ``judge``; writes into
    ``out`` (curve.jsonl, checkpoints/, curve.png)."""

    def __init__(self, policy: Any, examples: Sequence[Example], judge: ReplyJudge, out: str | Path,
                 settings: GRPOSettings = GRPOSettings(), say: Callable[[str], None] | None = None):
        import torch

        self.policy, self.judge, self.s = policy, judge, settings
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.say = say or (lambda text: None)
        self.examples = [e for e in examples if e.kind in settings.kinds]
        if not self.examples:
            raise ValueError(f"no training examples of kind {', '.join(settings.kinds)}")
        self.params = [p for p in policy.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the policy has no trainable parameters (apply LoRA first)")
        self.opt = torch.optim.AdamW(self.params, lr=settings.lr, weight_decay=0.0)
        self.step = 0
        self._tokens: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ checkpoints

    @property
    def ckpt_dir(self) -> Path:
        return self.out / "checkpoints"

    def save(self) -> Path:
        import torch

        d = self.ckpt_dir / f"step-{self.step:05d}"
        d.mkdir(parents=True, exist_ok=True)
        self.policy.model.save_pretrained(str(d / "adapter"))
        torch.save({"optimizer": self.opt.state_dict(), "step": self.step, "settings": asdict(self.s),
                    "torch_rng": torch.get_rng_state()}, d / "trainer.pt")
        (self.ckpt_dir / "latest").write_text(d.name + "\n")
        return d

    def latest(self) -> Path | None:
        return latest_checkpoint(self.out)

    def resume(self) -> bool:
        """Load the latest checkpoint's adapter weights, optimizer and step; False when none."""
        import torch
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        d = self.latest()
        if d is None:
            return False
        st = torch.load(d / "trainer.pt", weights_only=False)
        weights = d / "adapter" / "adapter_model.safetensors"
        set_peft_model_state_dict(self.policy.model, load_file(str(weights)))
        self.opt.load_state_dict(st["optimizer"])
        torch.set_rng_state(st["torch_rng"])
        self.step = int(st["step"])
        lines = []
        if (self.out / "curve.jsonl").is_file():   # the curve past the checkpoint is redone
            lines = [ln for ln in (self.out / "curve.jsonl").read_text().splitlines()
                     if ln.strip() and json.loads(ln)["step"] <= self.step]
            (self.out / "curve.jsonl").write_text("".join(ln + "\n" for ln in lines))
        self.say(f"resumed from {d.name} (step {self.step})")
        return True

    # ------------------------------------------------------------------ one step

    def _prompt_ids(self, ex: Example) -> list[int]:
        if ex.id not in self._tokens:
            self._tokens[ex.id] = encode(self.policy, self.policy.render(ex.prompt()))
        return self._tokens[ex.id]

    def pick(self, step: int) -> list[Example]:
        """The step's prompts: drawn (seeded by the step) among those that fit in
        ``max_prompt_tokens``; a prompt too long is passed over, never a reason to stop."""
        rng = random.Random(self.s.seed * 1_000_003 + step)
        order = list(range(len(self.examples)))
        rng.shuffle(order)
        out: list[Example] = []
        for i in order:
            if len(out) == self.s.prompts_per_step:
                break
            ex = self.examples[i]
            if len(self._prompt_ids(ex)) <= self.s.max_prompt_tokens:
                out.append(ex)
        if not out:
            raise ValueError(f"no training prompt fits in {self.s.max_prompt_tokens} tokens "
                             f"(the shortest has {min(len(self._prompt_ids(e)) for e in self.examples)})")
        return out

    def train_step(self) -> dict:
        import torch

        s, model = self.s, self.policy.model
        t0 = time.monotonic()
        batch = self.pick(self.step)
        model.eval()
        comps = sample_many(self.policy, [(self._prompt_ids(ex), s.group, ex) for ex in batch], s)
        groups = [(ex, self._prompt_ids(ex), c) for ex, c in zip(batch, comps)]
        t_gen = time.monotonic()
        texts = [[self.policy.reply(ex.prompt(), self.policy.tokenizer.decode(c, skip_special_tokens=True)) for c in comps]
                 for ex, _, comps in groups]
        outcomes = self.judge.judge_many([(ex, t) for (ex, _, _), ts in zip(groups, texts) for t in ts])
        rewards = [score(o) for o in outcomes]
        t_judge = time.monotonic()

        k = 0
        work = []   # (prompt ids, completion, advantage)
        for ex, pids, comps in groups:
            rs = [r.total for r in rewards[k:k + len(comps)]]
            k += len(comps)
            for comp, a in zip(comps, group_advantages(rs)):
                if a != 0.0:
                    work.append((pids, comp, a))
        loss_sum, kl_sum, n_tok = 0.0, 0.0, 0
        if work:
            with torch.no_grad():
                # one epoch: the policy that sampled is the one being updated, so its log-probs are
                # the current ones (ratio 1) and need no pass of their own
                olds = [token_logprobs(model, p, c).detach() for p, c, _ in work] if s.epochs > 1 else [None] * len(work)
                with model.disable_adapter():
                    refs = [token_logprobs(model, p, c).detach() for p, c, _ in work]
            model.train()
            for _ in range(s.epochs):
                self.opt.zero_grad(set_to_none=True)
                for (p, c, a), old, ref in zip(work, olds, refs):
                    logp = token_logprobs(model, p, c)
                    loss, kl = grpo_loss(logp, logp.detach() if old is None else old, ref, a, s.clip, s.beta)
                    (loss / len(work)).backward()
                    loss_sum += float(loss.detach()) / (len(work) * s.epochs)
                    kl_sum += float(kl) / (len(work) * s.epochs)
                    n_tok += len(c)
                torch.nn.utils.clip_grad_norm_(self.params, 1.0)
                self.opt.step()
            model.eval()
        self.step += 1
        rec = self._record(rewards, outcomes, loss_sum, kl_sum, len(work), n_tok,
                           {"generate": t_gen - t0, "judge": t_judge - t_gen, "update": time.monotonic() - t_judge},
                           [ex.id for ex in batch])
        with (self.out / "curve.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        return rec

    def _record(self, rewards: list[Reward], outcomes: list[Outcome], loss: float, kl: float, updated: int,
                tokens: int, seconds: dict, ids: list[str]) -> dict:
        tot = [r.total for r in rewards]
        m = sum(tot) / len(tot)
        comps: dict[str, list[float]] = {}
        for r in rewards:
            for name, v in r.components.items():
                comps.setdefault(name, []).append(v)
        return {"step": self.step, "reward_mean": m, "reward_std": math.sqrt(sum((t - m) ** 2 for t in tot) / len(tot)),
                "reward_max": max(tot), "components": {k: sum(v) / len(v) for k, v in comps.items()},
                "component_counts": {k: len(v) for k, v in comps.items()},
                "stages": dict(Counter(o.stage for o in outcomes)),
                "penalties": dict(Counter(p for r in rewards for p in r.penalties)),
                "valid": sum(o.parsed for o in outcomes) / len(outcomes),
                "compiled": sum(bool(o.compiled) for o in outcomes) / len(outcomes),
                "correct": sum(bool(o.correct) for o in outcomes) / len(outcomes),
                "loss": loss, "kl": kl, "updated": updated, "tokens": tokens,
                "seconds": {k: round(v, 3) for k, v in seconds.items()}, "examples": ids}

    # ------------------------------------------------------------------ the run

    def run(self, resume: bool = False) -> list[dict]:
        """Train to ``steps`` (from the latest checkpoint with ``resume``); stops early, saving a
        checkpoint, when the next step would pass ``time_limit_s``."""
        if resume:
            self.resume()
        t0 = time.monotonic()
        recs, slowest = [], 0.0
        while self.step < self.s.steps:
            if self.s.time_limit_s is not None and time.monotonic() - t0 + 1.5 * slowest > self.s.time_limit_s:
                self.say(f"time limit near: stopping at step {self.step} (resume to go on)")
                break
            ts = time.monotonic()
            rec = self.train_step()
            slowest = max(slowest, time.monotonic() - ts)
            recs.append(rec)
            self.say(f"step {rec['step']}: reward {rec['reward_mean']:+.3f} (max {rec['reward_max']:+.2f}) "
                     f"valid {rec['valid']:.2f} compiled {rec['compiled']:.2f} correct {rec['correct']:.2f} "
                     f"kl {rec['kl']:.4f} [{', '.join(f'{k} {v:.1f}s' for k, v in rec['seconds'].items())}]")
            done = len(recs)
            if done in (3, 10) or done % 25 == 0:
                self.say(throughput(recs, self.s, time.monotonic() - t0, self.s.steps - self.step))
            if self.step % self.s.checkpoint_every == 0:
                self.save()
        if not self.latest() or self.latest().name != f"step-{self.step:05d}":
            self.save()
        plot_curve(self.out / "curve.jsonl", self.out / "curve.png")
        return recs


def throughput(recs: Sequence[dict], s: GRPOSettings, elapsed: float, to_go: int) -> str:
    """One line on the speed so far: seconds per step (and per phase), and how many more steps
    this invocation's time limit holds at that rate."""
    n = len(recs)
    per = elapsed / n
    phases = {k: sum(r["seconds"].get(k, 0.0) for r in recs) / n for k in ("generate", "judge", "update")}
    text = (f"throughput: {per:.2f} s/step over {n} step(s) (generate {phases['generate']:.2f}, judge "
            f"{phases['judge']:.2f}, update {phases['update']:.2f}); {to_go} step(s) to go, "
            f"about {to_go * per / 60:.1f} min at this rate")
    if s.time_limit_s is not None:
        fit = max(0, int((s.time_limit_s - elapsed) / per))
        text += f"; about {min(fit, to_go)} more fit in this invocation"
    return text


# ---------------------------------------------------------------------------- evaluation and the curve


def evaluate_policy(policy: Any, examples: Sequence[Example], judge: ReplyJudge, *, samples: int = 1,
                    settings: GRPOSettings = GRPOSettings(), adapter: bool = True) -> dict:
    """Rates over ``examples`` (held-out ones): valid (parses), compiled, correct, and the mean
    reward with each component, per kind; ``adapter=False`` measures the base model."""
    ctx = contextlib.nullcontext() if adapter or not hasattr(policy.model, "disable_adapter") \
        else policy.model.disable_adapter()
    items = []
    too_long: Counter = Counter()
    with ctx:
        policy.model.eval()
        jobs = []
        for ex in examples:
            ids = encode(policy, policy.render(ex.prompt()))
            if len(ids) <= settings.max_prompt_tokens:
                jobs.append((ids, samples, ex))
            else:
                too_long[ex.kind] += 1
        for (_, _, ex), comps in zip(jobs, sample_many(policy, jobs, settings)):
            items += [(ex, policy.reply(ex.prompt(), policy.tokenizer.decode(c, skip_special_tokens=True)))
                      for c in comps]
    if not jobs:
        raise ValueError(f"none of the {len(examples)} prompts fits in {settings.max_prompt_tokens} tokens: "
                         "raise max_prompt_tokens")
    outcomes = judge.judge_many(items)
    out: dict[str, Any] = {}
    for kind in sorted({e.kind for e, _ in items}):
        os_ = [o for (e, _), o in zip(items, outcomes) if e.kind == kind]
        rs = [score(o) for o in os_]
        comps: dict[str, list[float]] = {}
        for r in rs:
            for k, v in r.components.items():
                comps.setdefault(k, []).append(v)
        out[kind] = {"n": len(os_), "valid": sum(o.parsed for o in os_) / len(os_),
                     "compiled": sum(bool(o.compiled) for o in os_) / len(os_),
                     "correct": sum(bool(o.correct) for o in os_) / len(os_),
                     "ran": sum(o.ran for o in os_) / len(os_),
                     "reward_mean": sum(r.total for r in rs) / len(rs),
                     "components": {k: sum(v) / len(v) for k, v in comps.items()},
                     "stages": dict(Counter(o.stage for o in os_)),
                     "prompts_too_long": too_long.get(kind, 0)}
    return out


def plot_curve(curve: Path, png: Path) -> bool:
    """The reward curve and each component's mean per step; False without matplotlib or data."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    if not curve.is_file():
        return False
    recs = [json.loads(ln) for ln in curve.read_text().splitlines() if ln.strip()]
    if not recs:
        return False
    steps = [r["step"] for r in recs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    mean = [r["reward_mean"] for r in recs]
    w = max(1, len(recs) // 20)
    smooth = [sum(mean[max(0, i - w + 1):i + 1]) / len(mean[max(0, i - w + 1):i + 1]) for i in range(len(mean))]
    a.plot(steps, mean, alpha=0.35, label="reward (mean over the step's completions)")
    a.plot(steps, smooth, label=f"moving mean ({w} steps)")
    a.plot(steps, [r["reward_max"] for r in recs], alpha=0.35, label="best in step")
    a.set_xlabel("step")
    a.set_ylabel("reward")
    a.legend(fontsize=8)
    names = sorted({k for r in recs for k in r["components"]})
    for n in names:
        b.plot(steps, [r["components"].get(n, float("nan")) for r in recs], label=n)
    for n in ("valid", "compiled", "correct"):
        b.plot(steps, [r[n] for r in recs], linestyle="--", label=f"rate {n}")
    b.set_xlabel("step")
    b.set_title("rubric components (mean) and rates")
    b.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


__all__ = ["GRPOSettings", "Trainer", "ReplyJudge", "latest_checkpoint", "encode", "sample", "sample_many", "token_logprobs", "group_advantages", "grpo_loss",
           "throughput", "evaluate_policy", "plot_curve"]
