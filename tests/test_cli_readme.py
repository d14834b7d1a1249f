"""The README's example commands, as written there, through the installed console script.

``## Building a program`` shows ``stitchcuda build models/gpt_block.py ...`` then
``stitchcuda verify run/gpt_block``. Here they run in a scratch folder (the ``run/`` they name
stays relative to it): the build must succeed without a GPU; verify must end in a verdict (with a
GPU) or, without one, in one line naming why it cannot verify here and a non-zero exit code —
never a traceback.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import stitchcuda

REPO = Path(__file__).resolve().parents[1]


def readme_commands(section: str) -> list[list[str]]:
    text = (REPO / "README.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", body, re.S).group(1)
    return [shlex.split(line.split("#", 1)[0]) for line in block.splitlines() if line.strip()]


def test_building_a_program_commands(tmp_path, nvcc):
    cmds = readme_commands("Building a program")
    assert [c[:2] for c in cmds] == [["stitchcuda", "build"], ["stitchcuda", "verify"]]
    (tmp_path / "models").symlink_to(REPO / "models")
    exe = str(Path(sys.executable).parent / "stitchcuda")
    env = {**os.environ, "STITCHCUDA_CACHE": str(tmp_path / "cache")}
    build = subprocess.run([exe, *cmds[0][1:]], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert build.returncode == 0, build.stderr
    assert "Traceback" not in build.stderr and "gpt_block" in build.stdout
    out = tmp_path / cmds[0][cmds[0].index("--out") + 1]
    assert (out / "program.so").is_file() and (out / "manifest.json").is_file()
    verify = subprocess.run([exe, *cmds[1][1:]], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=900)
    assert "Traceback" not in verify.stderr + verify.stdout
    if stitchcuda.has_gpu():
        # the README shows this program passing: a verdict against it is a failing example
        assert verify.returncode == 0 and "gpt_block:" in verify.stdout, verify.stdout + verify.stderr
        assert (out / "report.json").is_file()
    else:
        errors = [ln for ln in verify.stderr.splitlines() if ln.startswith("stitchcuda: error:")]
        assert verify.returncode != 0 and len(errors) == 1, verify.stderr
        assert "cannot verify here" in errors[0] or "GPU" in errors[0] or "CUDA" in errors[0], errors[0]


def test_the_install_command_is_what_ci_runs():
    """.ci/run calls the README's test command verbatim."""
    text = (REPO / "README.md").read_text()
    block = text.split("## The two commands\n", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", block, re.S)
    assert len(commands) == 2 and commands[0] == "pip install . && stitchcuda selfcheck"
    assert commands[1] in (REPO / ".ci" / "run").read_text()
    assert shutil.which("stitchcuda") or (Path(sys.executable).parent / "stitchcuda").is_file()


def test_every_readme_command_parses():
    """Each ``stitchcuda ...`` line of the README's shell blocks is a command line the parser takes
    (the syntax summaries with [options] or <placeholders> aside)."""
    from stitchcuda import cli

    text = (REPO / "README.md").read_text()
    lines = [ln.split("  #", 1)[0].split(" # ", 1)[0].strip()
             for block in re.findall(r"```sh\n(.*?)```", text, re.S) for ln in block.splitlines()]
    commands = [ln for ln in lines if ln.startswith("stitchcuda ") and not re.search(r"[\[<|]", ln)]
    assert len(commands) >= 8, commands
    top = cli.parser()
    for c in commands:
        argv = shlex.split(c)[1:]
        args = top.parse_args(cli._join_dashed_values(top, argv))   # UsageError (one line) if not
        assert args.func is not None, c


def test_every_readme_example_is_run_or_skipped_for_a_named_reason():
    """benchmarks/readme_examples.py (what runs the README's examples on a GPU machine) finds every
    block, runs the commands and the Python, and skips only the install / test commands, synopses,
    the loopback-server line and the train block."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import readme_examples as ex
    finally:
        sys.path.pop(0)
    text = (REPO / "README.md").read_text()
    found = ex.blocks(text)
    assert len(found) == text.count("```sh\n") + text.count("```python\n")
    run = [b for b in found if not ex.why_skipped(b)]
    skipped = {ex.why_skipped(b).split(" (")[0].split(":")[0] for b in found} - {""}
    assert any("stitchcuda verify run/gpt_block" in b.text for b in run)
    assert any("stitchcuda wheel" in b.text for b in run) and any("stitchcuda bench" in b.text for b in run)
    assert sum(b.lang == "python" for b in run) == sum(b.lang == "python" for b in found), "every Python block runs"
    assert skipped <= {"the install and test commands", "a synopsis", "needs an OpenAI-compatible server on loopback",
                       "needs the RL packages and the test GGUF"}, skipped
    # a Python example must define what it uses: no undefined input left for the reader to guess
    for b in run:
        if b.lang == "python" and "(x)" in b.text:
            assert re.search(r"^x = ", b.text, re.M), b.text
