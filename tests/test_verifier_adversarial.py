"""The Verifier end to end on the CPU, through the real build (nvcc): everything judged before a GPU
is needed. The adversarial programs refused by their source, their build or their built library's
imports get their verdict and reason here; a compile error is a verdict with the diagnostic; an
environment fault (a missing TMPDIR, a toolchain that cannot build an honest program) is never a
verdict on the candidate; and with no GPU, ``verify`` writes a partial report and the CLI exits 3.

Seeds are fixed (SEED). Builds go to a private cache shared by the module.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

from stitchcuda.verifier.static import sandbox  # noqa: E402
from stitchcuda.verifier.report.document import load_report  # noqa: E402
from stitchcuda.verifier.verification import VerifyEnvironmentError, VerifyOptions, verify_program  # noqa: E402

from .adversarial.catalogue import BY_NAME, CATALOGUE, first_reason  # noqa: E402

ADV = Path(__file__).resolve().parent / "adversarial"
SEED = 20261122


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("STITCHCUDA_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.setenv("CUDA_VISIBLE_DEVICES", "")  # a GPU on this machine must not be used: nothing here may run
    yield
    mp.undo()


def copy_program(src: Path, dst_root: Path) -> Path:
    """The folder (program.cu, manifest.json, a weights file if any) into ``dst_root``, the
    reference path made absolute."""
    dst = dst_root / src.name
    dst.mkdir(parents=True, exist_ok=True)
    for f in ("program.cu", "manifest.json", "weights.safetensors"):
        if (src / f).is_file():
            shutil.copy(src / f, dst / f)
    data = json.loads((dst / "manifest.json").read_text())
    ref = data["reference"].get("path")
    if ref and not Path(ref).is_absolute():
        data["reference"]["path"] = str((src / ref).resolve())
    (dst / "manifest.json").write_text(json.dumps(data, indent=2))
    return dst


def options(**kw) -> VerifyOptions:
    return VerifyOptions(seed=SEED, weights_seed=SEED, **kw)


@pytest.mark.parametrize("name", sorted(e.name for e in CATALOGUE if e.cpu))
def test_refused_before_running(name, tmp_path, nvcc):
    e = BY_NAME[name]
    v = verify_program(copy_program(ADV / name, tmp_path), options=options(precision=e.precision))
    assert v.result.kind == e.verdict, v.result.verdict.summary()
    assert first_reason(v.result) == e.reason, v.result.verdict.summary()
    assert not v.result.trials and not any(p.name.startswith("setup") for p in v.phases)  # nothing ran
    assert load_report(v.files.json).result.kind == e.verdict


def test_sandbox_findings_name_the_symbol_and_its_family(tmp_path, nvcc):
    v = verify_program(copy_program(ADV / "reads_env", tmp_path), options=options())
    (f,) = [f for f in v.result.findings if f.rule == "sandbox-environment"]
    assert f.severity == "reject" and "getenv" in f.message and f.file == "program.so"
    v = verify_program(copy_program(ADV / "python_call", tmp_path), options=options())
    assert "PyRun_SimpleString" in v.result.verdict.reasons[0] and "host process" in v.result.verdict.reasons[0]
    assert "not run: the link refused symbols only the host process could provide" in v.report.notes


def test_compile_error_is_a_verdict_with_the_diagnostic(tmp_path, nvcc):
    d = copy_program(ADV / "correct", tmp_path)
    src = (d / "program.cu").read_text().replace("g.alpha = 1.f;", "g.alpha = 1.f  // the semicolon is gone", 1)
    (d / "program.cu").write_text(src)
    v = verify_program(d, options=options())
    assert v.result.kind == "compile_error", v.result.verdict.summary()
    line = next(k for k, text in enumerate(src.splitlines(), 1) if "the semicolon is gone" in text)
    diags = [x for x in v.result.verdict.diagnostics if x.severity == "error"]
    assert diags and diags[0].file == "program.cu" and abs(diags[0].line - line) <= 1, diags
    assert v.exit_code == 1


def test_no_gpu_gives_a_partial_report_and_exit_code_3(tmp_path, nvcc):
    """Static rules, the build and the sandbox run; the correctness child finds no device: an
    Inconclusive report (never a pass, never a verdict on the candidate) and exit code 3."""
    d = copy_program(ADV / "correct", tmp_path)
    with pytest.raises(VerifyEnvironmentError) as e:
        verify_program(d, options=options())
    v = e.value.verification
    assert v.result.kind == "inconclusive" and v.exit_code == 3
    assert v.result.verdict.ran == ("static rules", "build", "sandbox")
    assert "no CUDA device" in v.result.verdict.reason
    assert load_report(d).result.kind == "inconclusive" and "inconclusive" in (d / "report.md").read_text()

    from stitchcuda import cli

    (d / "report.json").unlink()
    assert cli.main(["verify", str(d)]) == 3
    assert load_report(d).result.kind == "inconclusive"


def test_a_missing_tmpdir_is_not_a_compile_error(tmp_path, nvcc, monkeypatch):
    d = copy_program(ADV / "correct", tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "no-such-folder"))
    with pytest.raises(VerifyEnvironmentError, match="TMPDIR=.*no-such-folder is not a writable folder") as e:
        verify_program(d, options=options())
    assert e.value.verification.result.kind == "inconclusive"
    assert e.value.verification.result.verdict.ran == ("static rules",)


def test_a_toolchain_that_cannot_build_the_honest_baseline_is_not_a_compile_error(tmp_path, monkeypatch):
    from stitchcuda.verifier import verification as vrun
    from stitchcuda.verifier.run.build import CandidateBuild

    monkeypatch.setattr(vrun, "build_baseline", lambda arch: CandidateBuild(
        False, None, "ptxas fatal   : Memory allocation failure", 1.0))
    monkeypatch.setattr(vrun, "build_candidate", lambda prog, arch: CandidateBuild(
        False, None, "ptxas fatal   : Memory allocation failure", 1.0))
    with pytest.raises(VerifyEnvironmentError, match="honest baseline program does not build here either"):
        verify_program(copy_program(ADV / "correct", tmp_path), options=options())


def test_static_rejection_holds_without_a_gpu(tmp_path):
    """A definite verdict from what could run is returned, not raised: no build, no GPU needed."""
    v = verify_program(copy_program(ADV / "stale_state", tmp_path), options=options())
    assert v.result.kind == "rejected" and v.exit_code == 1


def test_link_output_parsing():
    ok = ("/usr/bin/ld: /scratch/tmpxft_00006c3c_00000000-11_program.o: reference to dlsym\n"
          "/usr/bin/ld: /usr/local/cuda/lib64/libcudart_static.a(cudart_static.o): reference to dlsym\n"
          "/usr/bin/ld: /usr/local/cuda/lib64/libcudart_static.a(cudart_static.o): reference to getenv\n"
          "/usr/bin/ld: /lib/x86_64-linux-gnu/libc.so.6: definition of dlsym\n")
    refs = sandbox.traced_references(ok)
    assert refs["dlsym"][0].endswith("program.o") and len(refs["getenv"]) == 1
    own = {s for s, files in refs.items() if any(sandbox._own_object(f) for f in files)}
    assert own == {"dlsym"}  # the runtime's own getenv is not the program's
    refused = ("/usr/bin/ld: /scratch/tmpxft_1-11_program.o: in function `st_program_create':\n"
               "program.cu:(.text+0x1c): undefined reference to `PyRun_SimpleString'\n"
               "collect2: error: ld returned 1 exit status\n")
    assert sandbox.undefined_at_link(refused) == ["PyRun_SimpleString"]
    assert sandbox.link_refused_only_imports(refused)
    assert not sandbox.link_refused_only_imports("program.cu(12): error: expected a \";\"\n" + refused)
    for sym, rule in (("dlopen", "sandbox-dynamic-loading"), ("cuGetProcAddress_v2", "sandbox-driver-entry-point"),
                      ("_ZNSt14basic_ofstreamIcSt11char_traitsIcEEC1EPKcSt13_Ios_Openmode", "sandbox-file-access"),
                      ("_ZNSt6thread15_M_start_threadESt10unique_ptrINS_6_StateESt14default_deleteIS1_EEPFvvE",
                       "sandbox-thread"), ("secure_getenv", "sandbox-environment"), ("syscall", "sandbox-system"),
                      ("PyRun_SimpleString", "sandbox-host-symbol")):
        assert sandbox.family_of(sym)[1] == rule, sym
    for sym in ("memcpy", "cudaLaunchKernel", "st_gemm", "_ZSt20__throw_length_errorPKc", "expf", "snprintf"):
        assert sandbox.family_of(sym) is None, sym
