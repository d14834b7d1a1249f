"""The mutation check: deliberate faults (benchmarks/mutants.py), each of which the tests must catch.

Each mutant is applied as an exact text patch to a *copy* of the sources, never to the checkout:

* a staged tree in a temporary folder: this checkout's files (``git ls-files``, untracked ones not
  ignored included) and the installed ``stitchcuda`` package (its compiled parts hard-linked),
  with this checkout's Python sources and templates laid over it, so the staged package is the
  checkout's code with the installed runtime;
* the patch goes to both copies of the file (the checkout's and the package's, for templates
  ``include/stitch/``), then the mutant's tests run with ``PYTHONPATH`` on the staged package
  (the Verifier's child processes inherit it), from the staged checkout, with bytecode writing off
  and a build cache shared across mutants (its keys hash every header, so a mutated template is
  never served a clean build).

A mutant is *caught* when its tests fail (pytest exit status 1), *survived* when they pass, an
*error* when the patch does not apply (the text moved: update mutants.py) or pytest could not
run them. Before the mutants, every selection runs once on the unmutated copy and must pass
(otherwise a "catch" would mean nothing). Device mutants run only with ``--device`` (a GPU
machine); without it they are listed as not run.

    python benchmarks/mutate.py                      # every CPU mutant; the score on stdout
    python benchmarks/mutate.py --write benchmarks/mutation.md
    python benchmarks/mutate.py --device --write benchmarks/mutation.md   # on a GPU machine
    python benchmarks/mutate.py --only relu-wrong-operator nan-passes
    python benchmarks/mutate.py --fast               # the CI subset (tests/test_mutation.py runs it too)
    python benchmarks/mutate.py --list
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import AREAS, BY_NAME, MUTANTS, Mutant  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PY_SRC = REPO / "python" / "stitchcuda"
TEMPLATES = REPO / "templates"


class PatchError(ValueError):
    """The mutant's text is not in its file exactly once."""


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str  # caught | survived | error | not run
    seconds: float
    summary: str  # pytest's last line, or why it did not run
    output: str = ""  # the tail of pytest's output (for errors and survivors)


# ------------------------------------------------------------------ the staged copy


def installed_package() -> Path:
    """The folder of the installed ``stitchcuda`` (compiled runtime, binding, headers)."""
    out = subprocess.run([sys.executable, "-c", "import stitchcuda, os; print(os.path.dirname(stitchcuda.__file__))"],
                         capture_output=True, text=True, cwd=tempfile.gettempdir(),
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if out.returncode != 0:
        raise SystemExit("stitchcuda is not installed in this Python: pip install --no-build-isolation --no-deps .")
    return Path(out.stdout.strip())


def _checkout_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, check=True)
        return [f for f in out.stdout.decode().split("\0") if f and (REPO / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "build", "__pycache__", ".pytest_cache"}
        return [str(p.relative_to(REPO)) for p in REPO.rglob("*")
                if p.is_file() and not skip.intersection(p.relative_to(REPO).parts)]


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _replace_file(dst: Path, text: str | None = None, src: Path | None = None) -> None:
    """Write ``dst`` as a new file (never through a hard link into the installed package)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() or dst.is_symlink():
        dst.unlink()
    if src is not None:
        shutil.copyfile(src, dst)
    else:
        dst.write_text(text or "", encoding="utf-8")


def stage(root: Path, package: Path) -> tuple[Path, Path]:
    """The staged checkout and package folder (the PYTHONPATH entry) under ``root``."""
    repo, site = root / "repo", root / "site"
    for f in _checkout_files():
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / f, repo / f)
    pkg = site / "stitchcuda"
    shutil.copytree(package, pkg, ignore=shutil.ignore_patterns("__pycache__"), copy_function=_link_or_copy)
    # The checkout's Python, exactly: modules removed from the checkout are removed here too.
    for p in list(pkg.rglob("*.py")) + list(pkg.rglob("*.pyi")):
        p.unlink()
    for p in list(PY_SRC.rglob("*.py")) + list(PY_SRC.rglob("*.pyi")):
        if "__pycache__" not in p.parts:
            _replace_file(pkg / p.relative_to(PY_SRC), src=p)
    for p in (TEMPLATES / "stitch").rglob("*"):
        if p.is_file():
            _replace_file(pkg / "include" / p.relative_to(TEMPLATES), src=p)
    return repo, site


def targets(m: Mutant, repo: Path, site: Path) -> list[Path]:
    """Every staged copy of the mutant's file: the checkout's, and the package's when it ships."""
    out = [repo / m.path]
    rel = Path(m.path)
    if rel.parts[:2] == ("python", "stitchcuda"):
        out.append(site / "stitchcuda" / Path(*rel.parts[2:]))
    elif rel.parts[0] == "templates":
        out.append(site / "stitchcuda" / "include" / Path(*rel.parts[1:]))
    return out


def check_applies(m: Mutant, text: str) -> None:
    n = text.count(m.old)
    if n != 1 or m.old == m.new:
        raise PatchError(f"{m.name}: the text to replace occurs {n} times in {m.path} (expected once): "
                         "the source changed; update benchmarks/mutants.py")


def apply(m: Mutant, repo: Path, site: Path) -> None:
    for p in targets(m, repo, site):
        text = p.read_text(encoding="utf-8")
        check_applies(m, text)
        _replace_file(p, text.replace(m.old, m.new, 1))


# ------------------------------------------------------------------ running tests


def _env(site: Path, cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a patched module is never served a stale .pyc
    env["STITCHCUDA_CACHE"] = str(cache)
    env.setdefault("STITCHCUDA_SHARED", str(REPO.parent / "shared"))
    return env


_SUMMARY = re.compile(r"=*\s*(\d+ (?:passed|failed|error|errors|skipped|deselected|xfailed|xpassed)\b.*?)\s*=*$")


def _summary(output: str) -> str:
    for line in reversed(output.strip().splitlines()):
        m = _SUMMARY.search(line.strip())
        if m:
            return m.group(1)
    return output.strip().splitlines()[-1] if output.strip() else ""


def pytest(args: tuple[str, ...], repo: Path, site: Path, cache: Path, timeout: float, stop_first: bool = True
           ) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "--no-header", "-p", "no:cacheprovider"]
    cmd += ["-x"] if stop_first else []
    try:
        r = subprocess.run(cmd + list(args), cwd=repo, env=_env(site, cache), capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return -1, out + f"\n(timed out after {timeout:.0f} s)"
    return r.returncode, r.stdout + r.stderr


def run_mutant(m: Mutant, root: Path, package: Path, cache: Path, timeout: float = 900.0) -> Outcome:
    """Stage a fresh copy under ``root``, apply ``m``, run its tests: caught / survived / error."""
    t0 = time.monotonic()
    repo, site = stage(root, package)
    try:
        apply(m, repo, site)
    except PatchError as e:
        return Outcome(m.name, "error", time.monotonic() - t0, str(e))
    rc, out = pytest(m.tests, repo, site, cache, timeout)
    took = time.monotonic() - t0
    summary = _summary(out)
    if rc == 1:
        return Outcome(m.name, "caught", took, summary)
    if rc == 0:
        if re.search(r"\b\d+ passed\b", summary) is None:  # every test skipped: nothing was asked
            return Outcome(m.name, "error", took, f"no test ran ({summary})", out[-3000:])
        return Outcome(m.name, "survived", took, summary, out[-3000:])
    return Outcome(m.name, "error", took, f"pytest exit status {rc}: {summary}", out[-3000:])


def baseline(selected: list[Mutant], root: Path, package: Path, cache: Path, timeout: float) -> None:
    """Every selection on the unmutated copy (one pytest run per set of files, their ``-k``
    expressions joined): each must pass, and run something."""
    repo, site = stage(root, package)
    probe = subprocess.run([sys.executable, "-c", "import stitchcuda; print(stitchcuda.__file__)"], cwd=repo,
                           env=_env(site, cache), capture_output=True, text=True)
    if not probe.stdout.strip().startswith(str(site)):
        raise SystemExit(f"the staged package is not the one imported: {probe.stdout.strip() or probe.stderr}")
    for files, expr in selections(selected).items():
        args = list(files) + (["-k", expr] if expr else [])
        rc, out = pytest(tuple(args), repo, site, cache, timeout, stop_first=False)
        if rc != 0 or re.search(r"\b\d+ passed\b", _summary(out)) is None:
            raise SystemExit(f"the unmutated copy does not pass `pytest {' '.join(args)}` (exit status {rc}); fix "
                             "that first:\n" + out[-4000:])
        print(f"baseline: {' '.join(files)}: {_summary(out)}", flush=True)


def selections(selected: list[Mutant]) -> dict[tuple[str, ...], str | None]:
    """Files (and node ids) -> the union of the mutants' ``-k`` expressions (None: all of them)."""
    groups: dict[tuple[str, ...], list[str | None]] = {}
    for m in selected:
        args, expr = list(m.tests), None
        if "-k" in args:
            i = args.index("-k")
            expr = args[i + 1]
            del args[i:i + 2]
        groups.setdefault(tuple(args), []).append(expr)
    return {files: (None if None in exprs else " or ".join(f"({e})" for e in dict.fromkeys(exprs)))
            for files, exprs in groups.items()}


# ------------------------------------------------------------------ the score


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return head + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


_ROW = re.compile(r"^\| `(?P<name>[^`]+)` \|.*\| (?P<status>caught|survived|error|not run)\b")


def _row(r: Outcome, command: str) -> str:
    m = BY_NAME[r.name]
    return (f"| `{m.name}` | {m.area} | {m.fault} | `{m.path}` | {r.status} ({r.summary}) | {r.seconds:.0f} | "
            f"`{' '.join(m.tests)}` |")


def markdown(kind: str, results: list[Outcome], command: str, seconds: float, old: str = "") -> str:
    """This kind's section: the rows of ``results``, and the rows of ``old`` (the section as it
    was) for mutants not run now, so a run split over several commands (``--only``) adds up."""
    rows: dict[str, tuple[str, str]] = {}
    runs = [ln for ln in old.splitlines() if ln.startswith("- ")]
    for ln in old.splitlines():
        m = _ROW.match(ln)
        if m and m.group("name") in BY_NAME:
            rows[m.group("name")] = (ln, m.group("status"))
    for r in results:
        rows[r.name] = (_row(r, command), r.status)
    runs.append(f"- {datetime.date.today().isoformat()}, commit {_commit()}, {os.cpu_count()} CPU cores, "
                f"{seconds / 60:.1f} min: `{command}`")
    order = [m.name for m in MUTANTS if m.name in rows]
    ran = [n for n in order if rows[n][1] in ("caught", "survived")]
    caught = [n for n in ran if rows[n][1] == "caught"]
    lines = [f"<!-- mutate:{kind} -->",
             f"### {'CPU' if kind == 'cpu' else 'GPU'} run: {len(caught)} of {len(ran)} mutants caught", "",
             *runs, "",
             "| mutant | area | fault | file | result | s | tests |",
             "|---|---|---|---|---|---|---|"]
    lines += [rows[n][0] for n in order]
    lines.append(f"<!-- /mutate:{kind} -->")
    return "\n".join(lines) + "\n"


def _section(text: str, kind: str) -> re.Pattern[str]:
    return re.compile(rf"<!-- mutate:{kind} -->.*?<!-- /mutate:{kind} -->\n?", re.S)


def write_section(path: Path, kind: str, results: list[Outcome], command: str, seconds: float,
                  fresh: bool = False) -> None:
    """Replace this kind's section of ``path`` (the other kind's section, and the text around, kept);
    ``fresh``: a run of every mutant of its kind, which replaces the rows of earlier runs."""
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    pat = _section(old, kind)
    found = pat.search(old)
    text = markdown(kind, results, command, seconds, found.group(0) if found and not fresh else "")
    new = pat.sub(lambda _: text, old) if found else old.rstrip("\n") + ("\n\n" if old else "") + text
    path.write_text(new, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", action="store_true", help="run the device mutants (needs a GPU) instead of the CPU ones")
    ap.add_argument("--fast", action="store_true", help="only the CI subset")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these mutants")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--no-baseline", action="store_true", help="skip the run on the unmutated copy")
    ap.add_argument("--write", type=Path, metavar="FILE", help="write the score into FILE's section for this run")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant (default 900)")
    ap.add_argument("--keep", action="store_true", help="keep the staged copies (their folder is printed)")
    ap.add_argument("--cache", type=Path, metavar="DIR",
                    help="the build cache to use (default: a fresh one for the run); entries are keyed by source "
                         "and every header, so an existing cache serves only what is unchanged")
    a = ap.parse_args(argv)

    if a.list:
        for m in MUTANTS:
            tags = ", ".join(t for t, on in (("device", m.device), ("fast", m.fast)) if on)
            print(f"{m.name:32} {m.area:10} {m.fault}" + (f"  [{tags}]" if tags else ""))
        by_area = {ar: sum(1 for m in MUTANTS if m.area == ar) for ar in AREAS}
        print(f"{len(MUTANTS)} mutants ({sum(m.device for m in MUTANTS)} device-only): {by_area}")
        return 0
    if a.only:
        unknown = [n for n in a.only if n not in BY_NAME]
        if unknown:
            ap.error(f"unknown mutant(s): {', '.join(unknown)} (see --list)")
        selected = [BY_NAME[n] for n in a.only]
    else:
        selected = [m for m in MUTANTS if m.device == a.device and (m.fast or not a.fast)]
    kind = "gpu" if a.device or any(m.device for m in selected) else "cpu"

    package = installed_package()
    work = Path(tempfile.mkdtemp(prefix="stitchcuda-mutate-"))
    cache = a.cache.resolve() if a.cache else work / "cache"
    t0 = time.monotonic()
    results: list[Outcome] = []
    try:
        if not a.no_baseline:
            baseline(selected, work / "baseline", package, cache, a.timeout)
        for k, m in enumerate(selected, 1):
            r = run_mutant(m, work / f"m{k:02d}", package, cache, a.timeout)
            results.append(r)
            print(f"[{k}/{len(selected)}] {m.name:32} {r.status:9} {r.seconds:5.0f} s  {r.summary}", flush=True)
            if r.status in ("survived", "error") and r.output:
                print("    " + "\n    ".join(r.output.strip().splitlines()[-15:]), flush=True)
            if not a.keep:
                shutil.rmtree(work / f"m{k:02d}", ignore_errors=True)
    finally:
        if a.keep:
            print(f"staged copies kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    took = time.monotonic() - t0
    ran = [r for r in results if r.status in ("caught", "survived")]
    caught = sum(r.status == "caught" for r in ran)
    bad = [r.name for r in results if r.status != "caught"]
    print(f"score: {caught} of {len(ran)} mutants caught in {took / 60:.1f} min"
          + (f"; not caught: {', '.join(bad)}" if bad else ""))
    if a.write:
        command = "python benchmarks/mutate.py " + " ".join(argv if argv is not None else sys.argv[1:])
        write_section(a.write, kind, results, command.strip(), took, fresh=not (a.only or a.fast))
        print(f"written: {a.write}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
