"""Counts of a sweep run (the JSON lines ``STITCHCUDA_SWEEP_LOG`` makes tests/sweep.py write), as the
markdown tables of BENCHMARKS.md's "Sweeps" section: cases per sweep (planned, refused by name,
rejected because PyTorch itself refuses the drawn arguments), the task kinds the planned cases
held, and the refusals by reason.

    STITCHCUDA_SWEEP_LOG=sweep.jsonl STITCHCUDA_SWEEP_EXAMPLES=50 python -m pytest -q -n 2 \\
        tests/test_sweep_ops.py tests/test_sweep_kinds.py tests/test_sweep_rewrites.py tests/test_costs.py
    python benchmarks/sweep_counts.py sweep.jsonl
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path


def load(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


def sweep_of(rec: dict) -> str:
    """``kinds: pool``, ``ops: aten.relu.default``, ``rewrites: drop_identities`` ... from the test id."""
    test = rec["test"]
    module = test.split("::")[0].rsplit("/", 1)[-1].removeprefix("test_sweep_").removeprefix("test_").removesuffix(".py")
    name = test.split("::")[-1]
    param = re.search(r"\[(.*)\]$", name)
    base = re.sub(r"\[.*\]$", "", name).removeprefix("test_")
    if module == "ops":
        return f"ops: {param.group(1) if param else base}"
    if module == "kinds":
        return f"kinds: {param.group(1) if param else base}"
    if module == "rewrites":
        return f"rewrites: {base}"
    return f"{module}: {base}"


def tables(recs: list[dict]) -> str:
    by = collections.defaultdict(collections.Counter)
    kinds = collections.Counter()
    reasons = collections.Counter()
    for r in recs:
        by[sweep_of(r)][r["outcome"]] += 1
        for k in r.get("kinds", []):
            kinds[k] += 1
        if r["outcome"] == "refused":
            why = re.sub(r"^.*?\((.*)\)\s*$", r"\1", r.get("why", "")) or r.get("why", "")
            reasons[(r["op"] or "-", why[:120])] += 1
    total = collections.Counter()
    for c in by.values():
        total.update(c)
    lines = [f"{sum(total.values())} cases: {total['planned']} planned and matched float64 PyTorch, "
             f"{total['refused']} refused by name, {total['rejected']} drawn arguments PyTorch itself refuses", ""]
    groups = collections.defaultdict(collections.Counter)
    for name, c in by.items():
        groups[name.split(":")[0]].update(c)
    lines += ["| sweeps | cases | planned | refused | rejected |", "|---|---:|---:|---:|---:|"]
    for g, c in sorted(groups.items()):
        lines.append(f"| {g} | {sum(c.values())} | {c['planned']} | {c['refused']} | {c['rejected']} |")
    lines += ["", "| sweep | cases | planned | refused | rejected |", "|---|---:|---:|---:|---:|"]
    for name, c in sorted(by.items()):
        if name.startswith("ops:"):
            continue
        lines.append(f"| {name} | {sum(c.values())} | {c['planned']} | {c['refused']} | {c['rejected']} |")
    ops = {n: c for n, c in by.items() if n.startswith("ops:")}
    if ops:
        lines += ["", f"Per registry operator ({len(ops)}): cases min {min(sum(c.values()) for c in ops.values())}, "
                      f"max {max(sum(c.values()) for c in ops.values())}; operators with refusals: "
                      + (", ".join(f"`{n[5:]}` {c['refused']}" for n, c in sorted(ops.items()) if c["refused"]) or "none")]
    lines += ["", "| task kind | planned cases holding one |", "|---|---:|"]
    lines += [f"| {k} | {n} |" for k, n in sorted(kinds.items())]
    if reasons:
        lines += ["", "| refused op | reason | cases |", "|---|---|---:|"]
        lines += [f"| `{op}` | {why} | {n} |" for (op, why), n in reasons.most_common()]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path)
    a = ap.parse_args(argv)
    print(tables(load(a.log)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
