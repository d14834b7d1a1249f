"""The native runner on the CPU: it builds (nvcc), and its protocol works end to end on a program that
computes on the host (tests/fixtures/host_program.cpp) through a shared host file — create, run,
errors and crashes as values, the log of the runtime calls the program made (its policy, a stream
that is not the run's), memory readings — with no GPU and no Python in the runner's process.

The GPU half (CUDA IPC buffers, timing, capture, the sanitizer) runs in tests/gpu/test_verifier_gpu.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stitchcuda.paths import INCLUDE_DIR, LIB_DIR  # noqa: E402
from stitchcuda.verifier.run import native  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def built(tmp_path_factory, nvcc):
    """Building the native runner (nvcc) and a host-only program (g++)"""
    mp = pytest.MonkeyPatch()
    cache = tmp_path_factory.mktemp("cache")
    mp.setenv("STITCHCUDA_CACHE", str(cache))
    mp.setenv("CUDA_VISIBLE_DEVICES", "")  # nothing here may use a GPU
    exe = native.runner_binary()
    out = tmp_path_factory.mktemp("prog")
    lib = out / "host_program.so"
    cxx = os.environ.get("CXX", "g++")
    r = subprocess.run([cxx, "-std=c++17", "-shared", "-fPIC", "-O1", f"-I{INCLUDE_DIR}", str(FIXTURES /
                        "host_program.cpp"), f"-L{LIB_DIR}", "-lstitchrt", f"-Wl,-rpath,{LIB_DIR.resolve()}",
                        "-Wl,-z,defs", "-o", str(lib)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    yield exe, lib
    mp.undo()


class HostFile:
    """float32 [16] tensors in a shared host file (a memfd the runner maps)."""

    def __init__(self, n: int = 4):
        self.fd = os.memfd_create("test-host", 0)
        os.ftruncate(self.fd, n * 64)

    def put(self, slot: int, values: list[float]) -> None:
        os.pwrite(self.fd, torch.tensor(values, dtype=torch.float32).numpy().tobytes(), slot * 64)

    def get(self, slot: int) -> list[float]:
        return torch.frombuffer(bytearray(os.pread(self.fd, 64, slot * 64)), dtype=torch.float32).tolist()


def start(built, host: HostFile) -> native.NativeRunner:
    exe, lib = built
    r = native.NativeRunner(exe, lib, host_fd=host.fd)
    for slot in range(3):  # w, x, y
        r.call("buf", slot + 1, "host", slot * 64, 64)
        r.call("tensor", 10 + slot, slot + 1, 0, 1, 16)
    return r


def test_the_runner_is_built_once_and_says_which_source(built):
    exe, _ = built
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True).stdout
    assert out.split() == ["stitch-runner", native.source_hash()]
    assert native.runner_binary() == exe  # cached: not built again


def test_create_run_and_read_the_outputs(built):
    host = HostFile()
    host.put(0, [float(i) for i in range(16)])
    host.put(1, [2.0] * 16)
    r = start(built, host)
    try:
        assert r.call("hello")["abi"] == 1
        r.call("create", 0, 1, 10)
        r.call("run", 1, 11, 1, 12)
        assert host.get(2) == [2.0 * i for i in range(16)]
        host.put(1, [3.0] * 16)  # new contents, same buffers
        r.call("run", 1, 11, 1, 12)
        assert host.get(2) == [3.0 * i for i in range(16)]
        mem = r.call("memory")
        assert mem["rss"] > 0 and mem["device_free"] == 0  # no CUDA used: nothing on a device
    finally:
        r.close()


def test_the_runtime_calls_a_program_makes_are_logged(built):
    """Every st_* call resolves to the runner first: counted with its policy and dtypes, and a call on a
    stream other than the run's is recorded (here the run's stream is none: the host)."""
    host = HostFile()
    host.put(0, [1.0] * 16)
    host.put(1, [42.0] + [1.0] * 15)
    r = start(built, host)
    try:
        r.call("create", 0, 1, 10)
        r.call("calls")  # what create did
        r.call("run", 1, 11, 1, 12)
        log = r.call("calls")
        assert log["foreign_stream"] == 1 and "st_memset on stream 0x1" in log["foreign_first"]
        assert r.call("calls")["foreign_stream"] == 0  # read once
        host.put(1, [-4.0] + [1.0] * 15)
        r.call("run", 1, 11, 1, 12)
        (gemm,) = [c for c in r.call("calls")["calls"] if c["fn"] == "st_gemm"]
        assert gemm["policy"] == 3 and gemm["dtypes"] == "1,1,1" and gemm["count"] == 1
        from stitchcuda.verifier.run.precision_claim import library_evidence

        assert "fp16 policy under a tf32 claim" in library_evidence([gemm], "tf32")
        assert library_evidence([gemm], "fp16") == ""
    finally:
        r.close()


def test_a_failed_call_and_a_crash_are_values(built):
    host = HostFile()
    host.put(0, [1.0] * 16)
    host.put(1, [-2.0] + [1.0] * 15)
    r = start(built, host)
    try:
        r.call("create", 0, 1, 10)
        with pytest.raises(native.RunnerError, match="told to fail"):
            r.call("run", 1, 11, 1, 12)
        with pytest.raises(native.RunnerError, match="unknown command"):
            r.call("frobnicate")
        with pytest.raises(native.RunnerError, match="unknown buffer"):
            r.call("tensor", 99, 77, 0, 1, 16)
        host.put(1, [-3.0] + [1.0] * 15)
        with pytest.raises(native.RunnerDied, match="signal"):
            r.call("run", 1, 11, 1, 12)
    finally:
        r.close()


def test_a_library_that_is_not_a_program_answers_every_command_with_the_load_error(built, tmp_path):
    exe, _ = built
    r = native.NativeRunner(exe, tmp_path / "missing.so")
    try:
        with pytest.raises(native.RunnerError, match="cannot load the program"):
            r.call("hello")
    finally:
        r.close()


def test_the_runners_process_holds_no_interpreter_and_no_pytorch(built):
    """The root of "reaching the host process without importing it": walk what the runner's process
    has loaded (its memory map) and find no Python, no PyTorch, no stitchcuda binding."""
    host = HostFile()
    host.put(0, [1.0] * 16)
    host.put(1, [1.0] * 16)
    r = start(built, host)
    try:
        r.call("create", 0, 1, 10)
        r.call("run", 1, 11, 1, 12)
        maps = Path(f"/proc/{r.proc.pid}/maps").read_text()
        loaded = {Path(line.split()[-1]).name for line in maps.splitlines() if "/" in line}
        assert "libstitchrt.so" in loaded and "host_program.so" in loaded, loaded
        assert not [n for n in loaded if n.startswith(("libpython", "libtorch", "libc10", "_rt."))], loaded
        env = Path(f"/proc/{r.proc.pid}/environ").read_bytes().split(b"\0")
        assert not [e for e in env if e.startswith(b"PYTHON")]
    finally:
        r.close()


# ------------------------------------------------------------------ the sanitizer's trial, with a stand-in tool

FAKE_SANITIZER = """#!/bin/sh
# a stand-in for compute-sanitizer: --tool T --error-exitcode N --print-limit M, then the program
tool=$2
shift 6
if [ "$tool" = racecheck ]; then
  echo "========= Error: Race reported between Write access at k(float*)+0x90 in program.cu:31"
  echo "=========     and Read access at k(float*)+0xa0 in program.cu:33 [32 hazards]"
  echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"
elif [ "$tool" = synccheck ]; then
  exec sleep 30
else
  echo "========= ERROR SUMMARY: 0 errors"
fi
exec "$@"
"""


def test_the_sanitizers_reports_become_one_check(built, tmp_path):
    """Each tool runs the program once through the runner (shared host file); an error is the
    ``sanitizer`` check naming the tool and the kernel; a tool over its time is a note, not a verdict."""
    from stitchcuda.verifier.run.sanitizer import ToolReport, parse_report, run_tool, sanitizer_check

    exe, lib = built
    tool = tmp_path / "compute-sanitizer"
    tool.write_text(FAKE_SANITIZER)
    tool.chmod(0o755)
    tensors = [("weight", torch.ones(16)), ("input", torch.full((16,), 3.0)), ("output", torch.zeros(16))]
    reports = [run_tool(str(tool), name, str(exe), str(lib), 0, tensors, 1, 1, seconds=5, where="host")
               for name in ("memcheck", "racecheck", "synccheck")]
    assert [r.errors for r in reports] == [0, 1, 0]
    assert not reports[2].finished and "did not finish" in reports[2].note
    check = sanitizer_check(reports)
    assert check.status == "fail" and "racecheck" in check.detail and "program.cu:31" in check.detail
    passed = sanitizer_check([reports[0], reports[2]])
    assert passed.status == "pass" and "took memcheck" in passed.detail and "synccheck 5 s" in passed.detail, passed
    assert 4.5 <= reports[2].seconds < 30 and reports[0].seconds < reports[2].seconds   # where the time went
    # a run that ended early under a tool: the failure carries the runner's word with the tool's
    died = ToolReport("racecheck", 1, ("Error: process didn't terminate successfully",), True,
                      "racecheck: the run ended early (run: task conv_3: out of memory)")
    check = sanitizer_check([reports[0], died])
    assert check.status == "fail" and "out of memory" in check.detail and "terminate" in check.detail
    mem = parse_report("memcheck", "========= Invalid __global__ write of size 4 bytes\n"
                                   "=========     at relu_f4(float4*, long)+0x70\n"
                                   "========= ERROR SUMMARY: 1 error\n")
    assert mem.errors == 1 and mem.lines[0].startswith("Invalid __global__ write")
    # racecheck's hazards name the kernel as "at k+0xoff": in a library kernel (cuBLASLt's, TMA and
    # wgmma, reported on an H100) they are the library's; in the program's own kernel they stay
    race = ("========= Error: Race reported between Read access at nvjet_sm90_tss_128x128_64x6_2x1_v_bz_bias_TNT+0xa50\n"
            "=========     and Write access at nvjet_sm90_tss_128x128_64x6_2x1_v_bz_bias_TNT+0x6000 [512 hazards]\n"
            "========= RACECHECK SUMMARY: 3 hazards displayed (3 errors, 0 warnings)\n")
    assert parse_report("racecheck", race).errors == 0
    own = parse_report("racecheck", race.replace("nvjet_sm90_tss_128x128_64x6_2x1_v_bz_bias_TNT", "stitch_task_3"))
    assert own.errors == 1 and "stitch_task_3" in own.lines[0]


FILTERING_SANITIZER = """#!/bin/sh
# a stand-in for a compute-sanitizer that takes --kernel-name-exclude: each run's options on one line
echo "$@" >> "$(dirname "$0")/calls.txt"
while [ "${1#--}" != "$1" ]; do shift 2; done
echo "========= ERROR SUMMARY: 0 errors"
exec "$@"
"""


def test_racecheck_and_synccheck_leave_the_libraries_kernels_out_where_the_tool_can(built, tmp_path):
    """racecheck and synccheck skip NVIDIA's library kernels (whose reports they drop anyway) where the
    tool takes --kernel-name-exclude, asked once by running it over `true`; memcheck checks every
    kernel; a tool that refuses the option (the stand-in of the test above) runs every tool as before.
    The pattern leaves the program's own kernels checked: not one template kernel's name matches it."""
    import re

    from stitchcuda.verifier.run import sanitizer as sz

    exe, lib = built
    tool = tmp_path / "compute-sanitizer"
    tool.write_text(FILTERING_SANITIZER)
    tool.chmod(0o755)
    tensors = [("weight", torch.ones(16)), ("input", torch.full((16,), 3.0)), ("output", torch.zeros(16))]
    reports = [sz.run_tool(str(tool), name, str(exe), str(lib), 0, tensors, 1, 1, seconds=5, where="host")
               for name in sz.TOOLS]
    assert [r.errors for r in reports] == [0, 0, 0] and all(r.finished for r in reports), reports
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    probes = [c for c in calls if c.endswith("true")]
    assert len(probes) == 1 and "--kernel-name-exclude" in probes[0], calls   # asked once
    runs = {c.split()[1]: c for c in calls if c not in probes}
    assert "--kernel-name-exclude" not in runs["memcheck"]
    assert all(sz.LIBRARY_EXCLUDE in runs[t] for t in ("racecheck", "synccheck")), runs
    assert "racecheck and synccheck left NVIDIA's library kernels out" in sz.sanitizer_check(reports).detail
    refusing = tmp_path / "old" / "compute-sanitizer"
    refusing.parent.mkdir()
    refusing.write_text(FAKE_SANITIZER)
    refusing.chmod(0o755)
    assert not sz.excludes_libraries(str(refusing))
    pattern = re.compile(sz.LIBRARY_EXCLUDE.split("=", 1)[1])
    for name in ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", "nvjet_tst_128x64_64x8_1x2_h_bz_TNT",
                 "_ZN7cutlass6KernelINS_4gemm6kernel", "cudnn::cnn::conv2d_grouped_direct_kernel",
                 "ampere_sgemm_128x64_nn"):
        assert pattern.fullmatch(name), name
    templates = Path(__file__).resolve().parents[1] / "templates" / "stitch"
    own = set(re.findall(r"\b(\w+_kernel\w*|group_stats\w*|bias_act\w*)\s*\(",
                         "".join(f.read_text() for f in templates.glob("*.cuh"))))
    assert own and not [k for k in own if pattern.fullmatch(k)], own


def test_the_tuning_command_answers_with_a_value_and_the_runner_goes_on(built):
    """``tuning`` (the runtime's choices by timing, for the folder's tuning file): without a device there is
    no identity to give, and the reply says so as a value; the runner goes on serving."""
    host = HostFile()
    r = start(built, host)
    try:
        reply = r.call("tuning", check=False)
        assert reply["ok"] is False and reply["error"].startswith("tuning: "), reply
        assert r.call("hello")["abi"] == 1
    finally:
        r.close()
