"""The ``stitchcuda`` command: every subcommand, its help with examples, and its exit code.

argparse, with rich for the display (:mod:`stitchcuda.ship.ui`): the parser is the standard
library's, so the command starts fast and its subcommands stay plain functions that tests call
with a list of arguments; rich draws the progress (a spinner per step on a terminal, one line per
finished step elsewhere) and the tables. typer would add a dependency and a second way to declare
what argparse already declares. Every failure ends in one line naming the cause and what to do,
with the exit codes of :mod:`stitchcuda.ship.errors` (2 bad input, 3 this machine cannot, 1 the
candidate failed); ``STITCHCUDA_DEBUG=1`` shows the traceback instead.

One rule for every command: its input is checked before the machine is asked anything. The
parser's types check each value's form (a count, a duration, an age, a target name); then the
command's ``check`` (set beside its function, run by :func:`main` before it) checks what the
values name (files, folders, a model, a server's address); only then does the command look for
PyTorch, nvcc, a GPU or an optional package, and only then does it write anything. A parser
error is one line too (the usage only with ``--help``).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from .paths import version
from .ship import checks, commands, errors
from .ship.ui import UI

EXAMPLES = """examples:
  stitchcuda build models/gpt_block.py --precision tf32 --out run/gpt_block
  stitchcuda verify run/gpt_block
  stitchcuda optimize models/gemm_row_sum.py --precision tf32 --budget 3m
  stitchcuda runs list
  stitchcuda wheel run/gpt_block --name gpt_block --arch sm_90 --arch sm_80
  stitchcuda bench ../shared/kernelbench/dev.jsonl --precision tf32 --gpus 2 --out bench/dev
  stitchcuda cache list
  stitchcuda doctor
  stitchcuda train run --data train/data --model test --out train/run --steps 300

exit codes: 0 done, 1 the program failed (compile or verdict), 2 bad input,
3 this machine cannot (missing package, no GPU, no nvcc, out of memory), 130 interrupted.
"""

# ---------------------------------------------------------------------- checks before any work


class UsageError(Exception):
    """The parser refused the command line (one line; exit 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block: that is what ``--help`` is for)."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        raise UsageError(f"{message} (see: {self.prog} --help)")


def _join_dashed_values(top: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--budget -3m`` as ``--budget=-3m``: argparse reads a value that starts with a dash as an
    option ("expected one argument"); joined, the value reaches its own check and is refused there."""
    takes_value: set[str] = set()
    known: set[str] = set()
    parsers = [top]
    while parsers:
        p = parsers.pop()
        for a in p._actions:
            known.update(a.option_strings)
            if a.option_strings and a.nargs is None and isinstance(a, (argparse._StoreAction, argparse._AppendAction)):
                takes_value.update(a.option_strings)
            if isinstance(a, argparse._SubParsersAction):
                parsers.extend(a.choices.values())
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        if (tok in takes_value and i + 1 < len(argv) and argv[i + 1].startswith("-") and argv[i + 1] != "--"
                and len(argv[i + 1]) > 1 and argv[i + 1].split("=", 1)[0] not in known):
            out.append(f"{tok}={argv[i + 1]}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out



def _version() -> str:
    return version()


def _common() -> argparse.ArgumentParser:
    """Options every subcommand takes (also before the subcommand: ``stitchcuda --json build ...``)."""
    p = _Parser(add_help=False)
    p.add_argument("--quiet", "-q", action="store_true", default=argparse.SUPPRESS,
                   help="only results and errors")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print one JSON object (the result) on stdout and nothing else")
    return p


def parser() -> argparse.ArgumentParser:
    from .precision import NAMES

    common = _common()
    top = _Parser(prog="stitchcuda", parents=[common],
                                  description="PyTorch reference -> verified, self-contained CUDA program.",
                                  epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action="version", version=f"stitchcuda {_version()}")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, help: str, func, example: str, check=None):
        p = sub.add_parser(name, help=help, description=help, parents=[common], epilog=f"example:\n  {example}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=func, validate=check)   # not "check": train has a --check flag
        return p

    p = add("selfcheck", "check the install: runtime, nvcc, example program, GPU", commands.selfcheck, "stitchcuda selfcheck")
    p.add_argument("--arch", type=checks.arch, help="target for the example build (default: the GPU's, else sm_90)")

    p = add("build", "reference -> program folder: capture, plan, generate CUDA, compile", commands.build,
            "stitchcuda build models/gpt_block.py --precision tf32 --out run/gpt_block", commands.check_build)
    p.add_argument("reference", metavar="FILE", help="a KernelBench-format .py file, or kernelbench:LEVEL:ID")
    p.add_argument("--precision", "-p", default="fp32", choices=NAMES,
                   help="precision policy (default fp32: exact fp32 math)")
    p.add_argument("--out", "-o", help="program folder (default run/<name>); replaced whole when the build succeeds")
    p.add_argument("--arch", type=checks.arch, help="target, e.g. sm_90 (default: the GPU's, else $STITCHCUDA_ARCH or sm_90)")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed before building the model (default 0)")
    p.add_argument("--no-compile", action="store_true", help="write the folder only")
    p.add_argument("--dynamic", action="append", metavar="NAME=MIN:MAX", default=None,
                   help="serve this dimension over a range (a module-level size of the reference, e.g. "
                        "batch=2:64; repeatable): one program for every shape in range")
    p.add_argument("--tune-shapes", action="append", metavar="NAME=SIZE,SIZE", default=None,
                   help="with --dynamic: sizes to tune at (e.g. batch=1,8,32; repeatable): stitchcuda verify times "
                        "each and keeps the library choices it made, so a process's first call there is warm")

    p = add("optimize", "the loop: build, verify, then repair / optimize / replan until the budget ends", commands.optimize,
            "stitchcuda optimize models/gemm_row_sum.py --precision tf32 --budget 3m", commands.check_optimize)
    p.add_argument("reference", metavar="FILE", nargs="?", help="a KernelBench-format .py file, or kernelbench:LEVEL:ID")
    p.add_argument("--precision", "-p", default="fp32", choices=NAMES, help="precision policy (default fp32)")
    p.add_argument("--budget", type=checks.duration, default=None, help="wall time: 90s, 3m, 1h or seconds (default 3m)")
    p.add_argument("--iterations", type=checks.count(), default=None, help="at most this many candidates")
    p.add_argument("--gpu-budget", type=checks.duration, default=None, help="at most this much judging (Verifier) time")
    p.add_argument("--llm", default=None, metavar="FILE.gguf|URL",
                   help="the LLM proposer's model: a GGUF file, or an OpenAI-compatible server on this machine "
                        "(http://127.0.0.1:PORT/v1, e.g. llama.cpp's) (default $STITCHCUDA_LLM; none: no LLM)")
    p.add_argument("--out", "-o", default=None, help="the run folder (default runs/<name>-<precision>-<time>)")
    p.add_argument("--resume", nargs="?", const=True, default=False, metavar="RUN",
                   help="go on with a run (killed, or given more budget); RUN defaults to --out")
    p.add_argument("--arch", type=checks.arch, help="target, e.g. sm_90 (default: the GPU's, else $STITCHCUDA_ARCH or sm_90)")

    p = add("runs", "list, show or diff optimisation runs", commands.runs, "stitchcuda runs diff RUN:c0000 RUN")
    p.add_argument("action", choices=["list", "show", "diff"])
    p.add_argument("items", nargs="*", help="show: RUN; diff: RUN[:CANDIDATE] RUN[:CANDIDATE] (a run alone: its best)")
    p.add_argument("--dir", default="runs", help="where runs are (default runs)")

    p = add("verify", "verify a program folder: correctness, anti-hacking, timing, CUPTI profile", commands.verify,
            "stitchcuda verify run/gpt_block --trials 5", commands.check_program_command)
    p.add_argument("dir", help="the program folder (manifest.json, program.cu, weights.safetensors)")
    p.add_argument("--reference", help="a KernelBench-format file or kernelbench:LEVEL:ID (default: the manifest's)")
    p.add_argument("--trials", type=checks.count(), default=5, help="random trials (default 5)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the first trial (default: drawn fresh, written to the report after the run)")
    p.add_argument("--precision", "-p", default=None, choices=NAMES,
                   help="the policy to judge at (default: the one the manifest states; the report says which)")
    p.add_argument("--no-time", action="store_true", help="skip timing")
    p.add_argument("--no-profile", action="store_true", help="skip the CUPTI profile")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    p.add_argument("--baselines", type=checks.baselines, default=(),
                   help="extra baselines: max-autotune (torch.compile(mode='max-autotune') at the policy; minutes)")
    p.add_argument("--arch", type=checks.arch, help="build target (default: $STITCHCUDA_ARCH, else the manifest's)")
    p.add_argument("--at", action="append", type=checks.size_value, default=None, metavar="NAME=SIZE",
                   help="judge a dynamic program at this size of a dimension only (repeat for each dimension; "
                        "default: its smallest shape, --between shapes drawn from the seed, its largest)")
    p.add_argument("--between", type=checks.count(0), default=3, metavar="N",
                   help="a dynamic program: shapes drawn between its smallest and largest, each judged (default 3)")

    p = add("profile", "CUPTI-profile a program folder (kernels, tasks, roofline)", commands.profile,
            "stitchcuda profile run/gpt_block --runs 20", commands.check_program_command)
    p.add_argument("dir", help="the program folder")
    p.add_argument("--reference", help="a KernelBench-format file or kernelbench:LEVEL:ID (default: the manifest's)")
    p.add_argument("--runs", type=checks.count(), default=20, help="profiled runs (default 20)")
    p.add_argument("--precision", "-p", default=None, choices=NAMES, help="the policy to judge at (default: the manifest's)")
    p.add_argument("--arch", type=checks.arch, help="build target (default: $STITCHCUDA_ARCH, else the manifest's)")

    p = add("wheel", "package a program folder as a wheel that runs without PyTorch", commands.wheel,
            "stitchcuda wheel run/gpt_block --name gpt_block --arch sm_90 --arch sm_80  "
            "# then: import gpt_block; m = gpt_block.load(); y = m(x)", commands.check_wheel)
    p.add_argument("dir", help="a built program folder")
    p.add_argument("--name", help="the Python package name (default: the program's name)")
    p.add_argument("--arch", action="append", type=checks.arch, help="a target to include, repeatable (default: the folder's)")
    p.add_argument("--out", default="dist", help="folder for the wheels (default dist)")
    p.add_argument("--wheel-version", default="0.1.0", help="the program wheel's version (default 0.1.0)")
    p.add_argument("--unverified", action="store_true",
                   help="pack a program without a passed verification report (the wheel's metadata says so)")

    p = add("bench", "run a suite: one worker per GPU, resumable, report.md / report.html with plots", commands.bench,
            "stitchcuda bench ../shared/kernelbench/dev.jsonl --precision tf32 --gpus 2 --out bench/dev", commands.check_bench)
    p.add_argument("suite", help="a .jsonl of KernelBench problems, or a folder of reference .py files")
    p.add_argument("--precision", "-p", default="fp32", choices=NAMES, help="precision policy (default fp32)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--build", action="store_true", help="build_program then verify each problem (the default)")
    how.add_argument("--optimize", action="store_true", help="run the optimisation loop on each problem")
    p.add_argument("--budget", type=checks.duration, default=None,
                   help="--optimize: budget per problem: 90s, 3m, 1h or seconds (default 3m)")
    p.add_argument("--gpus", type=checks.count(), default=None, help="worker processes, one per GPU (default: every visible GPU)")
    p.add_argument("--per-gpu", type=checks.count(), default=1, metavar="N",
                   help="N workers on each GPU: one builds while another verifies, and whatever runs on the GPU "
                        "holds it alone, timing included (default 1)")
    p.add_argument("--out", "-o", default=None, help="results folder (default bench/<suite>-<precision>); "
                                                    "a rerun skips the problems already there")
    p.add_argument("--limit", type=checks.count(), default=None, help="only the first N problems")
    p.add_argument("--trials", type=checks.count(), default=5, help="verification trials per problem (default 5)")
    p.add_argument("--no-profile", action="store_true", help="skip the CUPTI profile of each program")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    p.add_argument("--baselines", type=checks.baselines, default=(),
                   help="extra baselines: max-autotune (torch.compile(mode='max-autotune') at the policy; minutes "
                        "a problem)")
    p.add_argument("--no-sanitizer", action="store_true",
                   help="skip compute-sanitizer (up to three tools of 90 s each per problem); the other checks run")
    p.add_argument("--only", action="append", help="only problems whose id contains this text (repeatable)")
    p.add_argument("--failed-in", metavar="DIR", default=None,
                   help="only the problems that did not pass in the results folder DIR (a build run, say: "
                        "--optimize what it left)")
    p.add_argument("--ray", metavar="ADDRESS", help="run the problems as Ray tasks of one GPU each (pip install ray; "
                                                   "'auto', host:port, or 'local' for a new local instance)")
    p.add_argument("--solver", help=argparse.SUPPRESS)  # module:attribute of another solver (tests)

    p = add("cache", "list or clean the build cache", commands.cache, "stitchcuda cache clean --older-than 30", commands.check_cache)
    p.add_argument("action", choices=["list", "clean"])
    p.add_argument("--older-than", type=checks.days, metavar="DAYS", help="clean: only entries older than this many days")
    p.add_argument("--failed", action="store_true", help="clean: only failed builds")
    p.add_argument("--program", help="clean: only this program's entries")

    add("doctor", "check this machine: driver, GPU, nvcc, cuBLAS, cuDNN, CUPTI, PyTorch, the LLM", commands.doctor,
        "stitchcuda doctor")

    from .rl.cli import register as _register_train   # its code lives with the RL modules

    _register_train(add)
    return top


def _our_warnings_as_lines(ui: UI, show):
    """A warning stitchcuda raises reaches the user as one ``stitchcuda: warning:`` line, not as Python
    prints it (our file, line and source text); other packages' warnings are shown as before."""
    package = str(Path(__file__).resolve().parent)

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if str(Path(filename).resolve()).startswith(package):
            ui.warn(" ".join(str(message).split()))
        else:
            show(message, category, filename, lineno, file, line)
    return showwarning


def main(argv: list[str] | None = None) -> int:
    """Parse, check the input (:func:`_Parser` types, then the command's ``check``), then run."""
    argv = list(sys.argv[1:] if argv is None else argv)
    top = parser()
    json_mode = "--json" in argv
    ui = UI(quiet="--quiet" in argv or "-q" in argv, json_mode=json_mode)
    try:
        args = top.parse_args(_join_dashed_values(top, [str(a) for a in argv]))
    except UsageError as e:
        ui.error(str(e))
        ui.result({"ok": False, "error": str(e), "exit_code": errors.BAD_INPUT})
        return errors.BAD_INPUT
    ui = UI(quiet=getattr(args, "quiet", False), json_mode=getattr(args, "json", False))
    try:
        if getattr(args, "validate", None) is not None:
            args.validate(args)
        with warnings.catch_warnings():
            warnings.showwarning = _our_warnings_as_lines(ui, warnings.showwarning)
            return args.func(args, ui)
    except BaseException as e:  # noqa: BLE001 - every failure ends in one line and an exit code
        if isinstance(e, SystemExit):
            raise
        if errors.debug():
            raise
        f = errors.explain(e)
        ui.error(f.message)
        ui.result({"ok": False, "error": f.message, "exit_code": f.code})
        return f.code


if __name__ == "__main__":
    sys.exit(main())
