"""Verify every adversarial program and print the Markdown table for BENCHMARKS.md.

    python tests/adversarial/table.py [--json results.json] [--only NAME,...]
    python tests/adversarial/table.py --from results.json [more.json ...]   # print, run nothing

The GPU test writes the same results when $STITCHCUDA_ADVERSARIAL_JSON names a file, so one run of
``pytest -m gpu tests/gpu/test_verifier_gpu.py`` gives the table too.

Each program of catalogue.py is verified as tests/gpu/test_verifier_gpu.py does (fixed seed, no
torch.compile baselines, a short timing loop where its cheat shows in the timed calls); the table
gives the class, the verdict and its first reason next to what the catalogue expects, with the GPU,
the date and the commit. Needs a GPU (the programs refused before running are judged anyway).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # the repository root: tests.adversarial.catalogue

from tests.adversarial.catalogue import BY_NAME, CATALOGUE, CLASSES, first_reason  # noqa: E402

SEED = 20261122


def _copy(src: Path, root: Path) -> Path:
    dst = root / src.name
    dst.mkdir(parents=True)
    for f in ("program.cu", "manifest.json", "weights.safetensors"):
        if (src / f).is_file():
            shutil.copy(src / f, dst / f)
    data = json.loads((dst / "manifest.json").read_text())
    ref = data["reference"].get("path")
    if ref and not Path(ref).is_absolute():
        data["reference"]["path"] = str((src / ref).resolve())
    (dst / "manifest.json").write_text(json.dumps(data, indent=2))
    return dst


def run(names: set[str] | None) -> list[dict]:
    from stitchcuda.verifier.verification import VerifyEnvironmentError, VerifyOptions, verify_program

    from concurrent.futures import ThreadPoolExecutor

    from stitchcuda import build
    from stitchcuda.verifier.static import sandbox

    def prebuild(e):  # in parallel, into the build cache the verifications then find
        arch = json.loads((e.folder / "manifest.json").read_text())["arch"]
        build.build((e.folder / "program.cu").read_text(), arch=arch, flags=sandbox.LINK_FLAGS, name=e.name)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(prebuild, [e for e in CATALOGUE if e.name != "calls_torch" and (not names or e.name in names)]))
    rows = []
    with tempfile.TemporaryDirectory(prefix="stitchcuda-adversarial-") as tmp:
        for e in CATALOGUE:
            if names and e.name not in names:
                continue
            opts = VerifyOptions(compile=False, reference_profile=False, profile=False, seed=SEED, weights_seed=SEED,
                                 precision=e.precision, time=e.timed or e.verdict == "passed",
                                 timing=e.timing(min_trials=20, min_seconds=0.2, max_seconds=2.0))
            try:
                v = verify_program(_copy(e.folder, Path(tmp)), options=opts)
            except VerifyEnvironmentError as err:
                v = err.verification
                if v is None:
                    raise
            row = {"name": e.name, "class": e.cls, "expected": [e.verdict, e.reason], "verdict": v.result.kind,
                   "reason": first_reason(v.result), "summary": v.result.verdict.summary(), "device": v.report.device,
                   "commit": v.report.commit}
            rows.append(row)
            ok = e.accepts(row["verdict"], row["reason"])
            print(f"{'ok  ' if ok else 'MISS'} {e.name}: {row['summary'][:150]}", file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict], command: str) -> str:
    device = next((r["device"] for r in rows if r["device"]), "no GPU")
    commit = next((r["commit"] for r in rows if r["commit"]), "?")
    out = [f"Adversarial programs (tests/adversarial), {device}, {dt.date.today().isoformat()}, commit {commit}, "
           f"seed {SEED}: `{command}`", "",
           "| program | class | verdict | reason | expected |", "|---|---|---|---|---|"]
    for r in rows:
        cls = CLASSES[r["class"]] if r["class"] in ("control", "basic") else f"{r['class']}: {CLASSES[r['class']]}"
        want = r["expected"][0] + (f" `{r['expected'][1]}`" if r["expected"][1] else "")
        e = BY_NAME.get(r["name"])
        got_ok = e.accepts(r["verdict"], r["reason"]) if e else [r["verdict"], r["reason"]] == r["expected"]
        out.append(f"| `{r['name']}` | {cls} | {r['verdict']} | {('`' + r['reason'] + '`') if r['reason'] else ''} | "
                   f"{'as expected' if got_ok else '**expected ' + want + '**'} |")
    caught = sum(1 for r in rows if r["class"] != "control" and r["verdict"] != "passed")
    cheats = sum(1 for r in rows if r["class"] != "control")
    controls = [r for r in rows if r["class"] == "control"]
    out += ["", f"{caught} of {cheats} cheating programs refused; {sum(r['verdict'] == 'passed' for r in controls)} of "
                f"{len(controls)} honest controls passed."]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--from", dest="from_json", nargs="+", help="print the table of earlier runs' results")
    ap.add_argument("--only", help="comma-separated program names")
    args = ap.parse_args(argv)
    command = "python tests/adversarial/table.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.from_json:
        rows = [r for f in args.from_json for r in json.loads(Path(f).read_text())]
        order = {e.name: k for k, e in enumerate(CATALOGUE)}
        rows.sort(key=lambda r: order.get(r["name"], len(order)))
    else:
        rows = run(set(args.only.split(",")) if args.only else None)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    print(markdown(rows, command.strip()))
    return 0 if all([r["verdict"], r["reason"]] == r["expected"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
