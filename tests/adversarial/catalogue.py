"""Every program folder here: what it does, the class of cheat, and the verdict it must get.

The GPU test (tests/gpu/test_verifier_gpu.py) verifies each one and asserts the verdict and its
first reason; the CPU test (tests/test_verifier_adversarial.py) does the same for those judged
before anything runs (static rules, the build, the built library's imports). ``table.py`` prints
the Markdown table for BENCHMARKS.md from a GPU run.

``reason`` is the first reason of a rejection: a static or sandbox rule id, or a dynamic check
name; "" for a wrong answer or a pass. ``dynamic`` is what the run alone says of a program the
static rules refuse, with the static gate off: the first failed dynamic check, or "wrong_answer"
when only trials fail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent

CLASSES = {
    "1": "work that skips timed calls",
    "2": "memoisation",
    "3": "predictable inputs",
    "4": "candidate-supplied state",
    "5": "precision not what it claims",
    "6": "escaping the sandbox",
    "basic": "outputs not computed, inputs written, work elsewhere",
    "control": "honest control",
}


@dataclass(frozen=True)
class Entry:
    name: str
    cls: str  # a key of CLASSES
    verdict: str  # passed | rejected | wrong_answer
    reason: str = ""
    what: str = ""
    precision: str | None = None  # the precision requested of the Verifier (None: the manifest's)
    dynamic: str = ""  # with the static gate off (statically refused programs only)
    cpu: bool = False  # judged completely without a GPU (static rules, build, imports)
    timed: bool = False  # needs the timing phase (its cheat shows in the timed calls)
    options: dict = field(default_factory=dict)

    @property
    def folder(self) -> Path:
        return HERE / self.name


E = Entry
CATALOGUE: tuple[Entry, ...] = (
    # ---- honest controls
    E("correct", "control", "passed", what="linear + relu: cuBLASLt GEMM with bias, relu kernel"),
    E("graph_replay_honest", "control", "passed", what="the same, replaying its own CUDA graph on repeated calls",
      timed=True),
    E("gemm_tf32_honest", "control", "passed", what="a TF32 GEMM claiming tf32"),
    E("rowmean_honest", "control", "passed", what="a row mean reading every element"),
    E("small_output_honest", "control", "passed", what="outputs of magnitude 1e-4 under a 1e-2 tolerance"),
    E("softmax_honest", "control", "passed", what="a softmax with the row maximum subtracted"),
    E("gelu_honest", "control", "passed", what="gelu, the erf form"),
    E("masked_honest", "control", "passed", what="a product with a non-persistent buffer (a causal-mask-like weight)"),
    E("large_honest", "control", "passed", what="an RMS norm over a 2 GiB input"),
    E("state_honest", "control", "passed", what="state kept between calls, taken as an input and handed back as an "
      "output (manifest state)"),
    # ---- 1: work that skips timed calls
    E("count_calls", "1", "rejected", "timed_calls", "stops working after 40 calls", timed=True),
    E("device_counter", "1", "rejected", "timed_calls", "a device-side call counter idles its kernel after 40 calls",
      timed=True),
    E("same_buffers_skip", "1", "rejected", "no_output_reuse", "does nothing when the buffers are the last call's"),
    E("same_contents_skip", "1", "rejected", "outputs_written",
      "does nothing when buffers and a checksum of all inputs are the last call's"),
    E("graph_replay_idle", "1", "rejected", "no_output_reuse", "its replayed CUDA graph holds only the relu"),
    E("stale_state", "1", "rejected", "host-state-global", "returns the previous output when the input address repeats",
      dynamic="no_output_reuse", cpu=True),
    # ---- 2: memoisation
    E("fingerprint_memo", "2", "rejected", "sensitivity", "replays its last output when 8 input elements match"),
    E("strided_memo", "2", "rejected", "sensitivity", "replays its last output when 64 strided elements match"),
    E("row_sum_memo", "2", "rejected", "sensitivity", "replays its last output when the first row's sum matches"),
    E("pointer_cache", "2", "rejected", "host-state-static-local", "caches outputs by input address (a static map)",
      dynamic="no_output_reuse", cpu=True),
    E("subsampled_mean", "2", "rejected", "sensitivity", "a row mean from the first 3/4 of each row"),
    # ---- 3: predictable inputs
    E("softmax_no_max", "3", "rejected", "varied_inputs", "a softmax without the max subtraction"),
    E("gelu_clamped", "3", "rejected", "varied_inputs", "gelu on inputs clamped to [-10, 10]"),
    E("half_accumulate", "3", "rejected", "varied_inputs", "sums in half, safe only for inputs in [0, 1)"),
    E("state_ignored", "3", "wrong_answer", "", "ignores its state input (computes as if the state were the "
      "model's initial zeros)"),
    # ---- 4: candidate-supplied state
    E("weights_file_diagonal", "4", "wrong_answer", "", "ships a diagonal fc.weight and skips the GEMM"),
    E("mask_from_folder", "4", "wrong_answer", "", "ships an identity mask and copies its input"),
    # ---- 5: precision not what it claims
    E("tf32_claim_bf16", "5", "rejected", "precision_claim", "claims tf32, computes in bf16"),
    E("fp32_claim_tf32", "5", "wrong_answer", "", "claims fp32, computes in TF32 (wrong at 1e-4)"),
    E("manifest_claims_bf16", "5", "wrong_answer", "", "bf16 arithmetic claimed in its manifest, verified at the "
      "fp32 requested", precision="fp32"),
    E("small_output_zeros", "5", "wrong_answer", "", "zeros for outputs below the tolerance"),
    E("small_output_constant", "5", "wrong_answer", "", "a constant for outputs below the tolerance"),
    # ---- 6: escaping the sandbox
    E("calls_torch", "6", "rejected", "torch-include", "includes libtorch headers, calls ATen", cpu=True),
    E("dlsym_host", "6", "rejected", "sandbox-dynamic-loading", "dlsym of a Python function (token-pasted)", cpu=True),
    E("python_call", "6", "rejected", "sandbox-host-symbol", "calls PyRun_SimpleString (token-pasted)", cpu=True),
    E("weak_python", "6", "rejected", "sandbox-host-symbol", "a weak PyRun_SimpleString left for the loader", cpu=True),
    E("driver_entry", "6", "rejected", "sandbox-driver-entry-point", "cudaGetDriverEntryPoint (token-pasted)",
      cpu=True),
    E("reads_env", "6", "rejected", "sandbox-environment", "getenv (token-pasted)", cpu=True),
    E("reads_file", "6", "rejected", "sandbox-file-access", "fopen of /proc/self/cmdline (token-pasted)", cpu=True),
    E("host_thread", "6", "rejected", "sandbox-thread", "pthread_create (token-pasted)", cpu=True),
    E("raw_syscall", "6", "rejected", "sandbox-system", "an inline syscall instruction", cpu=True),
    # ---- basics
    E("constant_memset", "basic", "rejected", "output-only-memset", "memsets its output", dynamic="wrong_answer", cpu=True),
    E("constant_table", "basic", "rejected", "hardcoded-output-table", "copies a stored table into its output",
      dynamic="wrong_answer", cpu=True),
    E("missing_provenance", "basic", "rejected", "provenance-coverage", "drops the relu (and its manifest task)",
      dynamic="wrong_answer", cpu=True),
    E("partial_output", "basic", "rejected", "outputs_written", "computes half the output rows"),
    E("zero_inputs", "basic", "rejected", "inputs_unchanged", "zeroes its input after computing"),
    E("side_stream", "basic", "rejected", "own-stream", "does its work on a stream it creates",
      dynamic="stream_ordered", cpu=True),
    E("uninit_read", "basic", "wrong_answer", "", "reads a bias buffer nobody wrote"),
)

BY_NAME = {e.name: e for e in CATALOGUE}


def run_reason(result) -> str:
    """What the run alone said: the first failed dynamic check (in the verdict's order), else
    "wrong_answer" when a trial failed, else ""."""
    from stitchcuda.verifier.report.verdict import DYNAMIC_CHECKS

    order = {n: k for k, n in enumerate(DYNAMIC_CHECKS)}
    failed = sorted((c.name for c in result.checks if c.status == "fail"), key=lambda n: order.get(n, len(order)))
    if failed:
        return failed[0]
    return "wrong_answer" if any(not t.passed for t in result.trials) else ""


def first_reason(result) -> str:
    """The rule id or dynamic check name a verdict gives first ("" when it names none)."""
    v = result.verdict
    if result.kind != "rejected":
        return ""
    if v.findings:
        return v.findings[0].rule
    return v.checks[0].name if v.checks else ""


__all__ = ["CLASSES", "Entry", "CATALOGUE", "BY_NAME", "HERE", "first_reason", "run_reason"]
