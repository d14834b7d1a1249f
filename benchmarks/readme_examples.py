"""The README's examples, run as written: every ```sh line and every ```python block, in the order
the README has them, in the root of a checkout (a fresh clone, with the KernelBench set at
``../shared/kernelbench/`` as the README assumes), each timed, with its exit code and last line.

    python benchmarks/readme_examples.py [--match TEXT ...] [--skip TEXT ...] [--out examples.md]

A block is run unless it is one of the kinds below, each skipped with its reason in the table:

* the two commands of "The two commands" (the install is what put this checkout's runtime here;
  the test command is what CI runs);
* a synopsis (``<name>`` or ``[--flag]`` placeholders): a form to fill in, not a command;
* an ``optimize --llm http://...`` line: it needs an OpenAI-compatible server on loopback (the tests
  start one: ``tests/test_llm_server.py``);
* the ``train`` block: it needs the RL packages and the test GGUF (``benchmarks/gpu_session.sh rl``).

``--llm-server`` (a server answers at the README's address) and ``--train`` (the RL packages are here)
run those two as well; an optional ``[--flag]`` in a command is left out
(``gpu_session.sh readme_llm`` does both on a GPU machine).

``--match`` runs only blocks whose text holds one of the strings; ``--skip`` leaves out those that do.
A Python block that neither builds nor imports PyTorch (the wheel's) is run a second time in a
process in which ``import torch`` fails: the README says it needs no PyTorch. Exit status: 0 when
every block run ended with 0.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_TORCH = "import sys\nsys.modules['torch'] = None  # any import of torch now raises\n"


@dataclass
class Block:
    section: str
    lang: str
    text: str

    def commands(self) -> list[str]:
        """A shell block's commands, one a line (a line ending in a backslash goes on)."""
        return [ln for ln in self.text.replace("\\\n", " ").splitlines() if ln.strip()]


def blocks(readme: str) -> list[Block]:
    out, section = [], ""
    for m in re.finditer(r"^## ([^\n]*)$|```(sh|python)\n(.*?)```", readme, re.S | re.M):
        if m.group(1) is not None:
            section = m.group(1).strip()
        else:
            out.append(Block(section, m.group(2), m.group(3)))
    return out


def why_skipped(b: Block, server: bool = False, train: bool = False) -> str:
    """Why ``b`` is not run ("" when it is); ``server``: a server answers on the address the README
    names, ``train``: the RL packages and the test GGUF are here (``gpu_session.sh readme_llm``)."""
    if b.section == "The two commands":
        return "the install and test commands: the install put this runtime here; the tests are CI's"
    if b.lang == "sh" and b.text.lstrip().startswith("stitchcuda train") and not train:
        return "needs the RL packages and the test GGUF (benchmarks/gpu_session.sh rl)"
    if "--llm http" in b.text and not server:
        return "needs an OpenAI-compatible server on loopback (tests/test_llm_server.py starts one)"
    if b.lang == "sh" and re.search(r"<\w+>|\[--", b.text) and not b.text.lstrip().startswith("stitchcuda train"):
        return "a synopsis (placeholders), not a command"
    return ""


def run(argv: list[str], timeout: float) -> tuple[int, float, str]:
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        rc, text = p.returncode, (p.stdout + p.stderr).strip()
    except subprocess.TimeoutExpired as e:
        rc, text = 124, f"timed out after {timeout:.0f} s: {(e.stdout or b'')[-300:]!r}"
    last = text.splitlines()[-1] if text else ""
    return rc, time.monotonic() - t0, last


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--match", action="append", default=[], help="run only blocks holding this text")
    ap.add_argument("--skip", action="append", default=[], help="leave out blocks holding this text")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds for one command")
    ap.add_argument("--out", help="also write the table to this file")
    ap.add_argument("--llm-server", action="store_true", help="a server answers where the README's --llm URL points")
    ap.add_argument("--train", action="store_true", help="the RL packages and the test GGUF are installed here")
    ap.add_argument("--lines", help="N-M: only lines N to M (from 1) of each shell block run (a long block in parts)")
    args = ap.parse_args(argv)

    rows, failed = [], 0
    for b in blocks((ROOT / "README.md").read_text()):
        if args.match and not any(s in b.text for s in args.match) or any(s in b.text for s in args.skip):
            continue
        why = why_skipped(b, server=args.llm_server, train=args.train)
        if why:
            first = b.text.strip().splitlines()[0]
            rows.append((b.section, first + (" ..." if "\n" in b.text.strip() else ""), "skipped", "", why))
            continue
        if b.lang == "sh":
            # a bracketed option in a command the README also runs (train run ... [--resume]) is left out
            cmds = b.commands()
            if args.lines:
                lo, _, hi = args.lines.partition("-")
                cmds = cmds[int(lo) - 1:int(hi or lo)]
            runs = [(c, ["bash", "-c", re.sub(r"\s\[--[^\]]*\]", "", c)]) for c in cmds]
        else:
            runs = [(b.text, [sys.executable, "-c", b.text])]
            if "build_program" not in b.text and "import torch" not in b.text:  # the wheel's: no PyTorch
                runs.append((b.text + "(again, `import torch` blocked)", [sys.executable, "-c", NO_TORCH + b.text]))
        for shown, cmd in runs:
            print(f"$ {shown.strip().splitlines()[0]}", flush=True)
            rc, secs, last = run(cmd, args.timeout)
            failed += rc != 0
            print(f"  exit {rc}, {secs:.1f} s: {last[:200]}", flush=True)
            label = shown.strip().replace("\n", "; ")
            rows.append((b.section, label, str(rc), f"{secs:.1f}", last[:160]))

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "?"
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.strip().splitlines()
    except FileNotFoundError:
        gpu = []
    table = [f"The README's examples as written, {gpu[0] if gpu else 'no GPU'}, {dt.date.today().isoformat()}, "
             f"commit {commit}: `python benchmarks/readme_examples.py {' '.join(argv or sys.argv[1:])}`", "",
             "| section | example | exit | s | last line / why skipped |", "|---|---|---|---|---|"]
    cell = lambda s: s.replace("|", "/").replace("`", "'")  # noqa: E731
    table += [f"| {r[0]} | `{cell(r[1])[:220]}` | {r[2]} | {r[3]} | {cell(r[4])} |" for r in rows]
    ran = sum(r[2] != "skipped" for r in rows)
    table += ["", f"{ran - failed} of {ran} ran with exit 0; {len(rows) - ran} skipped."]
    print("\n".join(table))
    if args.out:
        Path(args.out).write_text("\n".join(table) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
