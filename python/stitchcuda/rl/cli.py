"""``stitchcuda train``: dataset -> GRPO -> evaluation -> GGUF, one action at a time.

::

    stitchcuda train dataset models ../shared/kernelbench/all.jsonl --runs runs/* --out train/data
    stitchcuda train run    --data train/data --model test --out train/run --steps 300 --time-limit 8m
    stitchcuda train run    --data train/data --model test --out train/run --steps 300 --resume
    stitchcuda train eval   --data train/data --model test --out train/run [--base]
    stitchcuda train export --model test --out train/run --gguf train/trained.gguf
    stitchcuda optimize models/mlp.py --llm train/trained.gguf

``--out`` of run / eval / export is the training folder: ``base/`` (the start model as a
transformers folder, converted once), ``checkpoints/``, ``curve.jsonl``, ``curve.png``,
``eval-*.json``, ``judge-cache.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from ..precision import NAMES
from ..ship import errors
from ..ship.checks import count, duration, fraction, out_folder, reference
from ..ship.errors import CommandError

# Every `stitchcuda` command reads this module to build its parser, so each action imports its
# own modules (the dataset builder, the judge, GRPO, the export: the planner, the Verifier,
# transformers) when it runs, not here.

EXAMPLE = "stitchcuda train run --data train/data --model test --out train/run --steps 300 --time-limit 8m"


def register(add: Any) -> None:
    """Add the ``train`` subcommand through cli.py's ``add(name, help, func, example)``."""
    p = add("train", "RL for the loop's LLM: dataset, GRPO with LoRA, evaluation, GGUF export", main, EXAMPLE, check)
    p.add_argument("action", choices=["dataset", "run", "eval", "export"])
    p.add_argument("sources", nargs="*", help="dataset: .py files, folders, KernelBench .jsonl, kernelbench:L:ID")
    p.add_argument("--runs", nargs="*", default=[], help="dataset: run folders of `stitchcuda optimize`")
    p.add_argument("--precision", "-p", action="append", choices=NAMES, help="dataset: a policy to plan at (repeatable; default fp32)")
    p.add_argument("--eval-fraction", type=fraction, default=0.2, help="dataset: share of references held out (default 0.2)")
    p.add_argument("--eval", action="append", default=[], metavar="NAME", help="dataset: a reference held out by name")
    p.add_argument("--seed", type=int, default=0, help="dataset split and training seed (default 0)")
    p.add_argument("--tokens-of", metavar="GGUF", help="dataset: fit prompts with this model's token counts, "
                                                       "as the loop does once its model is loaded (default: the "
                                                       "loop's estimate, as before the model loads)")
    p.add_argument("--data", help="run / eval: the dataset folder")
    p.add_argument("--model", default="test", help="a GGUF file, a transformers folder, or 'test' (default)")
    p.add_argument("--out", "-o", help="dataset: its folder; run / eval / export: the training folder")
    p.add_argument("--steps", type=count(), default=200)
    p.add_argument("--group", type=count(2), default=8, help="completions per prompt (default 8)")
    p.add_argument("--prompts", type=count(), default=1, help="prompts per step (default 1)")
    p.add_argument("--max-new-tokens", type=count(), default=512)
    p.add_argument("--max-prompt-tokens", type=count(), default=6144)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--beta", type=float, default=0.04, help="KL weight (default 0.04)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lora-r", type=count(), default=16)
    p.add_argument("--kinds", default="body,plan", help="which skills: body, plan or both (default)")
    p.add_argument("--no-grammar", action="store_true", help="sample decisions free, not under the loop's grammar")
    p.add_argument("--checkpoint-every", type=count(), default=20)
    p.add_argument("--time-limit", type=duration, default=None,
                   help="run: stop (checkpointed) before this wall time: 8m, 500s or seconds")
    p.add_argument("--resume", action="store_true", help="run: go on from the latest checkpoint")
    p.add_argument("--device", default=None, help="where the model runs (default: cuda when there is one)")
    p.add_argument("--dtype", default="float32", help="model weights' dtype (float32, bfloat16)")
    p.add_argument("--judge-device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where bodies run to be judged (cpu: build only)")
    p.add_argument("--level", default="task", choices=["task", "program"],
                   help="task: check_task and task timing; program: also the whole-program Verifier")
    p.add_argument("--workers", type=count(), default=4, help="judging children at once (default 4)")
    p.add_argument("--base", action="store_true", help="eval: the base model (adapter off)")
    p.add_argument("--samples", type=count(), default=1, help="eval: completions per held-out prompt")
    p.add_argument("--limit", type=count(), default=None, help="eval: at most this many held-out prompts")
    p.add_argument("--gguf", help="export: the GGUF to write")
    p.add_argument("--gguf-dtype", default="f16", choices=["f16", "f32"])
    p.add_argument("--check", action="store_true", help="export: load the GGUF in llama.cpp and complete a prompt")


def check(args: argparse.Namespace) -> None:
    """Everything the action names, before transformers is looked for or a folder is made."""
    if not args.out:
        raise CommandError(f"train {args.action} needs --out")
    out_folder(args.out)
    if args.action == "dataset":
        if not args.sources and not args.runs:
            raise CommandError("train dataset needs references (files, folders, .jsonl) or --runs")
        for s in args.sources:
            p = Path(s)
            if re.fullmatch(r"kernelbench:\d+:\d+", s) or p.is_dir() or (p.is_file() and p.suffix == ".jsonl"):
                continue
            reference(s)
        for r in args.runs:
            if not (Path(r) / "run.json").is_file():
                why = "no such folder" if not Path(r).exists() else "not a run folder (no run.json)"
                hint = " (a pattern that matched nothing reaches here as written)" if any(c in r for c in "*?[") else ""
                raise CommandError(f"--runs {r}: {why}{hint}; give folders `stitchcuda optimize` wrote")
        if args.tokens_of is not None and not Path(args.tokens_of).is_file():
            raise CommandError(f"--tokens-of {args.tokens_of}: no such GGUF file")
        return
    if args.model != "test" and not Path(args.model).exists():
        raise CommandError(f"--model {args.model}: no such GGUF file or transformers folder (or 'test')")
    if args.action in ("run", "eval"):
        if not args.data:
            raise CommandError(f"train {args.action} needs --data (a folder `stitchcuda train dataset` wrote)")
        if not (Path(args.data) / "references.jsonl").is_file():
            raise CommandError(f"--data {args.data}: not a dataset folder (no references.jsonl); "
                               "`stitchcuda train dataset` writes one")
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        if not kinds or set(kinds) - {"body", "plan"}:
            raise CommandError(f"--kinds {args.kinds}: body, plan or body,plan")
    if args.action == "eval" and not args.base or args.action == "export":
        if not (Path(args.out) / "checkpoints" / "latest").is_file():
            raise CommandError(f"--out {args.out}: no checkpoint to {args.action} there (train run writes them"
                               + ("; or --base for the base model)" if args.action == "eval" else ")"))
    if args.action == "export":
        if not args.gguf:
            raise CommandError("train export needs --gguf FILE")
        out_folder(str(Path(args.gguf).parent), "--gguf")


def main(args: argparse.Namespace, ui: Any) -> int:
    if args.action == "dataset":
        return _dataset(args, ui)
    from .model import TrainUnavailable, require

    try:
        require("transformers", "peft")
    except TrainUnavailable as e:
        raise CommandError(str(e), errors.ENVIRONMENT) from None
    if args.action == "export":
        return _export(args, ui)
    return _run(args, ui) if args.action == "run" else _eval(args, ui)


def _dataset(args: argparse.Namespace, ui: Any) -> int:
    from .dataset import build_dataset, gguf_token_counter

    if not args.sources and not args.runs:
        raise CommandError("train dataset needs references (files, folders, .jsonl) or --runs")
    count = None
    if args.tokens_of:
        count = gguf_token_counter(args.tokens_of)
    try:
        m = build_dataset(args.out, sources=args.sources, runs=args.runs, precisions=tuple(args.precision or ["fp32"]),
                          eval_fraction=args.eval_fraction, seed=args.seed, eval_references=args.eval,
                          count_tokens=count, progress=ui.info)
    except ValueError as e:
        raise CommandError(str(e)) from None
    ui.table(f"dataset in {args.out}", ["split", "plan", "body", "references"],
             [[s, m.counts[s]["plan"], m.counts[s]["body"], len(m.references[s])] for s in ("train", "eval")])
    if m.skipped:
        ui.info(f"{len(m.skipped)} reference(s) skipped (manifest.json says why)")
    ui.result({"out": args.out, "counts": m.counts, "skipped": list(m.skipped)})
    return errors.OK


def _policy(args: argparse.Namespace, adapter: bool = True):
    import torch

    from .model import LoraSettings, load_policy_cached, with_lora

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    pol = load_policy_cached(args.model, Path(args.out) / "base", dtype=args.dtype, device=device)
    return with_lora(pol, LoraSettings(r=args.lora_r)) if adapter else pol


def _judge(args: argparse.Namespace):
    from .dataset import load_references
    from .judge import JudgeSettings, RewardJudge

    return RewardJudge(load_references(args.data), JudgeSettings(device=args.judge_device, level=args.level,
                                                                 workers=args.workers),
                       cache_file=Path(args.out) / "judge-cache.jsonl")


def _settings(args: argparse.Namespace):
    from .grpo import GRPOSettings

    return GRPOSettings(steps=args.steps, group=args.group, prompts_per_step=args.prompts,
                        max_new_tokens=args.max_new_tokens, temperature=args.temperature, lr=args.lr, beta=args.beta,
                        checkpoint_every=args.checkpoint_every, seed=args.seed,
                        kinds=tuple(k.strip() for k in args.kinds.split(",") if k.strip()),
                        max_prompt_tokens=args.max_prompt_tokens, grammar=not args.no_grammar,
                        time_limit_s=args.time_limit)


def _run(args: argparse.Namespace, ui: Any) -> int:
    from .dataset import load_examples
    from .grpo import Trainer

    pol = _policy(args)
    t = Trainer(pol, load_examples(args.data, "train"), _judge(args), args.out, _settings(args), say=ui.info)
    recs = t.run(resume=args.resume)
    last = recs[-1] if recs else {}
    ui.result({"out": args.out, "step": t.step, "steps": args.steps, "done": t.step >= args.steps,
               "last": {k: last.get(k) for k in ("reward_mean", "valid", "compiled", "correct", "components")}})
    return errors.OK


def _eval(args: argparse.Namespace, ui: Any) -> int:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from .dataset import load_examples
    from .grpo import evaluate_policy, latest_checkpoint

    pol = _policy(args)
    tag = "base"
    if not args.base:
        d = latest_checkpoint(args.out)
        if d is None:
            raise CommandError(f"{args.out}: no checkpoint to evaluate (train first, or --base)")
        set_peft_model_state_dict(pol.model, load_file(str(d / "adapter" / "adapter_model.safetensors")))
        tag = d.name
    exs = [e for e in load_examples(args.data, "eval") if e.kind in _settings(args).kinds][:args.limit]
    res = evaluate_policy(pol, exs, _judge(args), samples=args.samples, settings=_settings(args), adapter=not args.base)
    path = Path(args.out) / f"eval-{tag}.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    ui.table(f"held-out ({tag})", ["kind", "n", "valid", "compiled", "correct", "reward"],
             [[k, v["n"], f"{v['valid']:.2f}", f"{v['compiled']:.2f}", f"{v['correct']:.2f}", f"{v['reward_mean']:+.3f}"]
              for k, v in res.items()])
    ui.result({"eval": res, "file": str(path)})
    return errors.OK


def _export(args: argparse.Namespace, ui: Any) -> int:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from .export import export_gguf, load_in_llama_cpp, read_gguf
    from .grpo import latest_checkpoint

    if not args.gguf:
        raise CommandError("train export needs --gguf FILE")
    args.device = args.device or "cpu"
    pol = _policy(args)
    d = latest_checkpoint(args.out)
    if d is None:
        raise CommandError(f"{args.out}: no checkpoint to export")
    set_peft_model_state_dict(pol.model, load_file(str(d / "adapter" / "adapter_model.safetensors")))
    path = export_gguf(pol, args.gguf, dtype=args.gguf_dtype)
    info = read_gguf(path)
    out = {"gguf": str(path), "checkpoint": d.name, "tensors": len(info["tensors"]), "architecture": info["architecture"]}
    if args.check:
        out["llama_cpp_completion"] = load_in_llama_cpp(path, "```cuda\n", max_tokens=16)
    ui.info(f"wrote {path} ({len(info['tensors'])} tensors, from {d.name}); run it with --llm {path}")
    ui.result(out)
    return errors.OK


__all__ = ["register", "main"]
