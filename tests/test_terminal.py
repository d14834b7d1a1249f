"""The command as a new user tries it, without a GPU: every bad input is refused by name, in one
line, with the README's exit code, before the machine is asked anything, and nothing is written
or deleted.

Each row of :data:`CASES` is one input that once ended badly (a class of the list that prompted
this: data lost, the machine checked before the input, a misleading exit code, a half-written
leftover, a silent acceptance, a wording or shape): the command line, the exit code, a piece of
the one line it must print. Every case runs in a scratch folder that it must leave as it found it
(and with a build cache whose entries it must not touch). Cases that are about this machine's
lack of a GPU are skipped where there is one.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import stitchcuda
from stitchcuda import cli
from stitchcuda.ship import errors

REPO = Path(__file__).resolve().parents[1]

TINY = """
import torch
from torch import nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x):
        return torch.relu(self.fc(x))

def get_inputs():
    return [torch.randn({batch}, 16)]

def get_init_inputs():
    return []
"""


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]
    code: int
    says: str
    env: tuple[tuple[str, str], ...] = ()
    no_gpu: bool = False          # about this machine having no GPU: skipped where there is one


def case(name: str, argv: str, code: int, says: str, *, env: dict | None = None, no_gpu: bool = False) -> Case:
    return Case(name, tuple(argv.split()), code, says, tuple((env or {}).items()), no_gpu)


BAD, ENV = errors.BAD_INPUT, errors.ENVIRONMENT

CASES = [
    # data lost: a value that makes no sense deletes nothing
    case("clean-negative-age", "cache clean --older-than -5", BAD, "an age is a finite number of days"),
    case("clean-nan-age", "cache clean --older-than nan", BAD, "an age is a finite number of days"),
    case("clean-inf-age", "cache clean --older-than inf", BAD, "an age is a finite number of days"),
    case("clean-word-age", "cache clean --older-than week", BAD, "not a number of days"),
    case("cache-is-a-file-list", "cache list", BAD, "is a file, not a folder", env={"STITCHCUDA_CACHE": "afile"}),
    case("cache-is-a-file-clean", "cache clean", BAD, "nothing was removed", env={"STITCHCUDA_CACHE": "afile"}),
    # the input before the machine
    case("verify-arch-typo", "verify prog --arch sm_1", BAD, "not a CUDA target name"),
    case("verify-no-folder", "verify nothing", BAD, "program folder not found"),
    case("verify-not-a-program", "verify notes", BAD, "not a program folder"),
    case("verify-zero-trials", "verify prog --trials 0", BAD, "at least 1"),
    case("verify-missing-reference", "verify prog --reference gone.py", BAD, "gone.py: no such --reference file"),
    case("profile-zero-runs", "profile prog --runs 0", BAD, "argument --runs: 0 is too small"),
    case("train-no-data", "train run --data nope --out t", BAD, "--data nope: not a dataset folder"),
    case("train-export-no-checkpoint", "train export --out nope --gguf x.gguf", BAD, "no checkpoint to export"),
    case("train-eval-no-checkpoint", "train eval --data data --out nope", BAD, "no checkpoint to eval"),
    case("train-bad-kinds", "train run --data data --out t --kinds code", BAD, "--kinds code"),
    case("optimize-not-gguf", "optimize ref.py --llm not.gguf", BAD, "not a GGUF file"),
    case("optimize-missing-gguf", "optimize ref.py --llm gone.gguf", BAD, "no such GGUF file"),
    case("optimize-remote-llm", "optimize ref.py --llm http://192.0.2.1:8080/v1", BAD, "is not this machine"),
    case("optimize-llm-no-port-number", "optimize ref.py --llm http://127.0.0.1:x/v1", BAD, "port is not a number"),
    case("optimize-llm-nobody-there", "optimize ref.py --llm http://127.0.0.1:9/v1", ENV, "no server answers"),
    # exit codes that say what happened
    case("optimize-no-gpu", "optimize ref.py --budget 10s", ENV, "has none", no_gpu=True),
    case("bench-no-gpu", "bench suite.jsonl --out b", ENV, "has none", no_gpu=True),
    # nothing half-written
    case("build-missing-reference-deep-out", "build gone.py --out deep/er/prog", BAD, "gone.py: no such reference file"),
    case("train-dataset-missing-source", "train dataset gone.py --out data2", BAD, "gone.py: no such reference file"),
    case("bench-zero-gpus", "bench suite.jsonl --gpus 0 --out b", BAD, "argument --gpus: 0 is too small"),
    case("optimize-bad-budget", "optimize ref.py --budget abc --out r", BAD, "budget 'abc'"),
    case("optimize-out-holds-a-run", "optimize ref.py --out oldrun", BAD, "already holds a run"),
    # no silent acceptance
    case("wheel-inconclusive", "wheel prog", BAD, "verification did not pass (inconclusive"),
    case("wheel-no-report", "wheel bare", BAD, "has no verification report"),
    case("train-runs-pattern-matched-nothing", "train dataset --runs runs/* --out data2", BAD,
         "a pattern that matched nothing"),
    case("train-runs-not-a-run", "train dataset ref.py --runs notes --out data2", BAD, "not a run folder"),
    # wording and shape
    case("parser-missing-argument", "build", BAD, "the following arguments are required: FILE"),
    case("parser-unknown-command", "frobnicate", BAD, "invalid choice: 'frobnicate'"),
    case("parser-bad-choice", "build ref.py --precision fp8", BAD, "invalid choice: 'fp8'"),
    case("budget-negative", "optimize ref.py --budget -3m", BAD, "a budget is a positive time"),
    case("budget-zero", "optimize ref.py --budget 0", BAD, "positive"),
    case("build-a-folder", "build notes", BAD, "notes: is a folder"),
    case("bench-budget-syntax", "bench suite.jsonl --optimize --budget 3q --out b", BAD, "budget '3q'"),
    case("bench-budget-without-optimize", "bench suite.jsonl --budget 3m --out b", BAD, "add --optimize"),
    case("kernelbench-typo", "build kernelbench:3", BAD, "use kernelbench:LEVEL:ID"),
    case("selfcheck-arch", "selfcheck --arch 90", BAD, "use the sm_XY form, e.g. sm_90"),
    case("bench-unknown-baseline", "bench suite.jsonl --baselines autotune --out b", BAD,
         "autotune: the extra baselines are max-autotune"),
    case("verify-unknown-baseline", "verify prog --baselines max_autotune", BAD, "the extra baselines are"),
]


def test_at_least_the_thirty_cases_of_the_report():
    assert len(CASES) >= 30 and len({c.name for c in CASES}) == len(CASES)


def _report_json(verdict: dict) -> str:
    """A report.json as the Verifier writes it, with the given verdict."""
    from stitchcuda.verifier.report.document import VerificationReport
    from stitchcuda.verifier.report.verdict import Inconclusive, VerificationResult

    r = VerificationReport(program="tiny", precision="fp32", arch="sm_90",
                           result=VerificationResult(Inconclusive(**verdict)))
    return r.to_json()


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A folder with what the cases name: a reference, a program folder with an inconclusive
    report, one without a report, a folder of notes, a file that is not GGUF, a suite, an old run,
    a dataset, and a build cache with two entries."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "ref.py").write_text(TINY.format(batch=4))
    for name in ("prog", "bare"):
        d = work / name
        d.mkdir()
        (d / "manifest.json").write_text("{}")
    (work / "prog" / "report.json").write_text(_report_json({"reason": "no CUDA device"}))
    (work / "notes").mkdir()
    (work / "notes" / "todo.txt").write_text("mine")
    (work / "not.gguf").write_bytes(b"PK\x03\x04 a zip, not a model")
    (work / "afile").write_text("not a folder")
    (work / "suite.jsonl").write_text(json.dumps({"level": 1, "problem_id": 1, "name": "tiny",
                                                  "source": TINY.format(batch=4)}) + "\n")
    (work / "oldrun").mkdir()
    (work / "oldrun" / "run.json").write_text("{}")
    (work / "data").mkdir()
    (work / "data" / "references.jsonl").write_text("")
    cache = tmp_path / "cache"
    for e in ("tiny_fp32_sm90_0123456789abcdef", "mlp_tf32_sm80_fedcba9876543210"):
        (cache / e).mkdir(parents=True)
        (cache / e / "program.so").write_bytes(b"\x7fELF")
        old = time.time() - 90 * 86400
        os.utime(cache / e / "program.so", (old, old))
    monkeypatch.setenv("STITCHCUDA_CACHE", str(cache))
    monkeypatch.setenv("STITCHCUDA_ARCH", "sm_90")
    monkeypatch.delenv("STITCHCUDA_LLM", raising=False)
    return work, cache


def tree(*roots: Path) -> dict[str, bytes | None]:
    out = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            out[str(p)] = p.read_bytes() if p.is_file() else None
    return out


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_refused_in_one_line_with_nothing_written(c: Case, scratch, capfd, monkeypatch):
    if c.no_gpu and stitchcuda.has_gpu():
        pytest.skip("about a machine without a GPU")
    work, cache = scratch
    for k, v in c.env:
        monkeypatch.setenv(k, str(work / v) if k == "STITCHCUDA_CACHE" else v)
    before = tree(work, cache)
    capfd.readouterr()
    t0 = time.monotonic()
    rc = cli.main([*c.argv, "-q"])
    out, err = capfd.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and "usage:" not in err, err
    assert len(lines) == 1 and lines[0].startswith("stitchcuda: error: "), err
    assert c.says in lines[0], lines[0]
    assert rc == c.code, (rc, lines[0])
    assert tree(work, cache) == before, "the command wrote or removed something"
    assert time.monotonic() - t0 < 60


def test_parser_error_is_one_line_without_quiet(capfd):
    """The README's promise holds without -q too: no usage block before the error."""
    capfd.readouterr()
    assert cli.main(["profile"]) == errors.BAD_INPUT
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "usage" not in err and "stitchcuda profile --help" in err, err


def test_a_dashed_value_reaches_its_check(capfd):
    """``--budget -3m`` was 'expected one argument'; it is the budget's own refusal now."""
    capfd.readouterr()
    assert cli.main(["bench", "x.jsonl", "--optimize", "--budget", "-90s"]) == errors.BAD_INPUT
    assert "a budget is a positive time" in capfd.readouterr().err


# ---------------------------------------------------------------------- cache clean deletes nothing it should not


@pytest.mark.parametrize("age", ["-5", "-0.5", "nan", "-inf", "inf", "1e400", "five"])
def test_cache_clean_with_a_nonsensical_age_deletes_nothing(age, scratch, capfd):
    work, cache = scratch
    before = sorted(p.name for p in cache.iterdir())
    assert len(before) == 2
    rc = cli.main(["cache", "clean", "--older-than", age, "-q"])
    assert rc == errors.BAD_INPUT, capfd.readouterr().err
    assert sorted(p.name for p in cache.iterdir()) == before


def test_cache_clean_with_a_sensible_age_deletes_only_the_old(scratch, capfd):
    work, cache = scratch
    fresh = cache / "new_fp32_sm90_00112233445566778"
    fresh.mkdir()
    (fresh / "program.so").write_bytes(b"\x7fELF")
    assert cli.main(["cache", "clean", "--older-than", "30", "-q"]) == errors.OK
    assert [p.name for p in cache.iterdir()] == [fresh.name]


def test_a_cache_path_that_is_a_file_is_neither_listed_nor_cleaned(scratch, capfd, monkeypatch):
    work, cache = scratch
    f = work / "afile"
    monkeypatch.setenv("STITCHCUDA_CACHE", str(f))
    for argv in (["cache", "list"], ["cache", "clean"], ["cache", "list", "--json"]):
        capfd.readouterr()
        assert cli.main(argv) == errors.BAD_INPUT
        assert "is a file, not a folder" in capfd.readouterr().err
    assert f.read_text() == "not a folder"


# ---------------------------------------------------------------------- the Python API


def test_every_input_error_is_an_argument_error(tmp_path):
    from stitchcuda.errors import MachineError
    from stitchcuda.manifest import ManifestError
    from stitchcuda.pipeline import BuildEnvironmentError, BuildInputError
    from stitchcuda.reference import CaptureError
    from stitchcuda.ship.bench import SuiteError
    from stitchcuda.ship.wheel import WheelError
    from stitchcuda.verifier.run.reference import ProblemError
    from stitchcuda.workflow.runs import RunError

    for e in (BuildInputError, CaptureError, ManifestError, ProblemError, SuiteError, WheelError, RunError):
        assert issubclass(e, stitchcuda.ArgumentError) and issubclass(e, ValueError), e
    assert issubclass(BuildEnvironmentError, MachineError) and issubclass(MachineError, stitchcuda.StitchError)
    assert stitchcuda.BuildInputError is BuildInputError and stitchcuda.MachineError is MachineError
    with pytest.raises(stitchcuda.ArgumentError, match="unknown precision"):
        stitchcuda.build_program(str(REPO / "models" / "mlp.py"), precision="fp8", out=tmp_path / "p")
    with pytest.raises(stitchcuda.ArgumentError, match="is a folder"):
        stitchcuda.build_program(str(tmp_path), out=tmp_path / "p")
    assert list(tmp_path.iterdir()) == []


def test_optimize_refuses_bad_arguments_at_once(tmp_path):
    """Before the reference is captured (which took 7 s) or the run folder is made."""
    from stitchcuda import workflow  # noqa: F401 - imported first: the time below is the checks'

    t0 = time.monotonic()
    for bad in ("abc", -3, 0, "-3m", float("nan")):
        with pytest.raises(stitchcuda.ArgumentError, match="budget"):
            stitchcuda.optimize(str(REPO / "models" / "mlp.py"), budget=bad, out=tmp_path / "run")
    with pytest.raises(stitchcuda.ArgumentError, match="unknown precision policy 'fp8'"):
        stitchcuda.optimize(str(REPO / "models" / "mlp.py"), precision="fp8", out=tmp_path / "run")
    (tmp_path.parent / "not.gguf").write_text("text")
    with pytest.raises(stitchcuda.ArgumentError, match="not a GGUF file"):
        stitchcuda.optimize(str(REPO / "models" / "mlp.py"), llm=str(tmp_path.parent / "not.gguf"), out=tmp_path / "run")
    assert time.monotonic() - t0 < 2 and list(tmp_path.iterdir()) == []


def test_gemm_names_the_shapes_before_asking_for_a_device():
    import numpy as np

    a, b = np.zeros((4, 5), np.float32), np.zeros((6, 7), np.float32)
    with pytest.raises(stitchcuda.ArgumentError, match="inner dimensions differ"):
        stitchcuda.rt.gemm(a, b)
    if not stitchcuda.has_gpu():
        with pytest.raises(stitchcuda.NoDeviceError, match="no CUDA device"):
            stitchcuda.rt.gemm(a, np.zeros((5, 7), np.float32))


def test_no_driver_is_not_called_an_old_driver():
    if stitchcuda.has_gpu():
        pytest.skip("a machine with a GPU has a driver")
    from stitchcuda import rt

    with pytest.raises(stitchcuda.NoDeviceError) as e:
        rt.DeviceTensor([4], "float32")
    if not _driver_present():
        assert "no NVIDIA driver" in str(e.value) and "insufficient" not in str(e.value)


def _driver_present() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


# ---------------------------------------------------------------------- silent acceptance, now said


def test_build_warns_when_the_inputs_exceed_the_device(scratch, capfd, monkeypatch):
    work, _ = scratch
    (work / "huge.py").write_text(TINY.format(batch=2**36))    # 2^36 x 16 float32: 4 TiB of input
    capfd.readouterr()
    rc = cli.main(["build", "huge.py", "--out", "run/huge", "--no-compile", "-q"])
    err = capfd.readouterr().err
    assert rc == errors.OK, err
    warn = [ln for ln in err.splitlines() if ln.startswith("stitchcuda: warning:")]
    assert len(warn) == 1 and "the inputs alone take 4.0 TiB" in warn[0], err


def test_wheel_unverified_says_so_in_its_metadata(scratch, capfd, nvcc, monkeypatch):
    import zipfile

    work, _ = scratch
    rc = cli.main(["build", "ref.py", "--out", "run/tiny", "-q"])
    assert rc == errors.OK
    capfd.readouterr()
    assert cli.main(["wheel", "run/tiny", "-q"]) == errors.BAD_INPUT
    assert "run stitchcuda verify run/tiny first, or pack it anyway with --unverified" in capfd.readouterr().err
    assert not (work / "dist").exists()
    assert cli.main(["wheel", "run/tiny", "--unverified", "-q"]) == errors.OK
    assert "--unverified" in capfd.readouterr().err
    (whl,) = [p for p in (work / "dist").glob("ref-*.whl")]
    with zipfile.ZipFile(whl) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith("METADATA"))).decode()
        init = z.read("ref/__init__.py").decode()
    assert "UNVERIFIED" in meta and "Keywords: stitchcuda,unverified" in meta
    assert "VERIFIED = False" in init


# ---------------------------------------------------------------------- the README is the exit codes' only source


def readme_exit_codes() -> dict[int, str]:
    text = (REPO / "README.md").read_text()
    body = text.split("## The command\n", 1)[1].split("\n## ", 1)[0]
    return {int(m.group(1)): m.group(2).strip() for m in re.finditer(r"^\| (\d+) \| (.+) \|$", body, re.M)}


def test_exit_codes_are_the_readmes():
    table = readme_exit_codes()
    assert set(table) == {0, 1, 2, 3, 130}, table
    consts = {getattr(errors, n) for n in dir(errors) if n.isupper() and isinstance(getattr(errors, n), int)}
    assert consts == set(table), consts
    # the help's summary names the same codes
    said = {int(x) for x in re.findall(r"\b(\d+) ", cli.EXAMPLES.split("exit codes:", 1)[1])}
    assert said == set(table), said
    # and no module returns or raises another code
    for p in (REPO / "python" / "stitchcuda").rglob("*.py"):
        src = p.read_text()
        for m in re.finditer(r"(?:sys\.exit|SystemExit|return_code|exit_code\s*=)\(?\s*(\d+)", src):
            assert int(m.group(1)) in table, f"{p}: exit code {m.group(1)}"


def test_an_unexpected_error_is_a_readme_code(capfd, monkeypatch):
    def boom(args, ui):
        raise ZeroDivisionError("division by zero")

    from stitchcuda.ship import commands

    monkeypatch.setattr(commands, "doctor", boom)
    capfd.readouterr()
    rc = cli.main(["doctor", "-q"])
    err = capfd.readouterr().err
    assert rc in readme_exit_codes() and rc == errors.FAILED
    assert "a bug, not your program's fault" in err and "STITCHCUDA_DEBUG=1" in err


def test_readme_explains_where_kernelbench_comes_from():
    text = (REPO / "README.md").read_text()
    assert "STITCHCUDA_KERNELBENCH" in text.split("## Building a program\n", 1)[1].split("\n## ", 1)[0]


# ---------------------------------------------------------------------- progress within a problem


def test_verify_shows_its_phases_when_piped_and_nothing_when_quiet(scratch, capfd, nvcc):
    """Piped (as here), each phase is one plain line with its time; -q keeps the error alone."""
    work, _ = scratch
    assert cli.main(["build", "ref.py", "--out", "run/tiny", "-q"]) == errors.OK
    capfd.readouterr()
    rc = cli.main(["verify", "run/tiny", "--no-time", "--no-profile"])
    err = capfd.readouterr().err
    phases = [ln.strip() for ln in err.splitlines() if ln.strip().startswith("verify: ")]
    assert [p.split(" ", 2)[1] for p in phases[:3]] == ["inputs:", "static", "build"], err
    assert all(re.search(r"\d+\.\d s$", p) for p in phases), phases
    if not stitchcuda.has_gpu():
        assert rc == errors.ENVIRONMENT
    capfd.readouterr()
    cli.main(["verify", "run/tiny", "--no-time", "--no-profile", "-q"])
    err = capfd.readouterr().err
    assert not [ln for ln in err.splitlines() if ln.strip().startswith("verify: ")], err


def staged_solver(problem, folder, opts):
    """A bench solver that reports two stages, as the real ones do from build and verify."""
    from stitchcuda.ship.suite import report_stage

    report_stage("build: capture")
    report_stage("verify: correctness trials and dynamic checks (5 trial(s))")
    return {"status": "passed", "summary": "fake", "ms": {"program": 1.0}}


def test_bench_tells_each_problems_stage(tmp_path):
    from stitchcuda.ship import bench

    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps({"level": 1, "problem_id": 1, "name": "tiny", "source": TINY.format(batch=4)}) + "\n")
    seen: list[tuple[str, str]] = []
    bench.run_suite(suite, tmp_path / "out", bench.BenchOptions(gpus=1, solver="tests.test_terminal:staged_solver"),
                    log=lambda s: None, stage=lambda pid, text: seen.append((pid, text)))
    assert [t for _, t in seen] == ["build: capture", "verify: correctness trials and dynamic checks (5 trial(s))"]
    assert len({pid for pid, _ in seen}) == 1
    (rec,) = bench.read_results(tmp_path / "out" / "results.jsonl")
    assert rec["status"] == "passed"


def test_bench_refuses_bad_options_before_writing(tmp_path):
    from stitchcuda.ship import bench

    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps({"level": 1, "problem_id": 1, "name": "tiny", "source": TINY.format(batch=4)}) + "\n")
    for opts, says in ((bench.BenchOptions(gpus=0), "at least 1"), (bench.BenchOptions(mode="optimize", budget="3q"),
                                                                     "budget '3q'")):
        with pytest.raises(stitchcuda.ArgumentError, match=re.escape(says)):
            bench.run_suite(suite, tmp_path / "out", opts, log=lambda s: None)
        assert not (tmp_path / "out").exists()


def test_a_line_that_does_not_compile_is_a_compile_error_not_cheating(scratch, capfd, nvcc):
    """``int x = ;`` is also text the static rules refuse (a mutable global); it is a typo first."""
    work, _ = scratch
    assert cli.main(["build", "ref.py", "--out", "run/tiny", "-q"]) == errors.OK
    src = work / "run" / "tiny" / "program.cu"
    lines = src.read_text().splitlines(keepends=True)
    src.write_text("".join(lines[:4] + ["int x = ;\n"] + lines[4:]))
    capfd.readouterr()
    rc = cli.main(["verify", "run/tiny", "-q"])
    out = capfd.readouterr().out
    assert rc == errors.FAILED and "ref: compile error: program.cu:5" in out, out
    assert "rejected" not in out
