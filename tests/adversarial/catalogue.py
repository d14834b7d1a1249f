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
    # the second round (issue 25): what the project added since the ABI (convolutions, recurrent and
    # stateful programs, the graph runner, output slack, longer timed runs) made room for
    "25.1": "memory outside the outputs",
    "25.2": "races right almost always",
    "25.3": "parameters never varied",
    "25.4": "precision claimed but not computed",
    "25.5": "work hidden from timing through the runtime's API",
    "25.6": "behaviour that changes late",
    "25.7": "leaks",
    "25.8": "reaching the host process without importing it",
    "25.9": "ties",
    "25.10": "shortcuts through long dependencies",
    "25.11": "stream capture",
    "25.12": "degenerate references",
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
    options: dict = field(default_factory=dict)  # LoopSettings fields for its timing (e.g. a longer phase)
    degenerate: bool = False  # a pass that must say "degenerate: outputs independent of inputs"
    # other (verdict, reason) pairs that refuse the same cheat as rightly: which defence fires first can
    # depend on the draws (a bf16 program claiming tf32 is either too wrong for tf32's tolerance on some
    # trial, or within it with bf16's error statistics)
    also: tuple[tuple[str, str], ...] = ()

    def accepts(self, verdict: str, reason: str) -> bool:
        return (verdict, reason) == (self.verdict, self.reason) or (verdict, reason) in self.also

    @property
    def folder(self) -> Path:
        return HERE / self.name

    def timing(self, **default):
        """The timing loop to verify it with: ``default`` (LoopSettings fields) and its own options."""
        from stitchcuda.verifier.measure.timing import LoopSettings

        return LoopSettings(**{**default, **self.options})


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
    E("conv_honest", "control", "passed", what="a cuDNN convolution through the runtime (st_conv), fp32, with its bias"),
    E("memset_scratch_honest", "control", "passed", what="a memset of scratch and a launch on the output in one "
      "statement"),
    E("argmax_honest", "control", "passed", what="an argmax whose ties go to the first maximal element, as PyTorch's"),
    E("scan_honest", "control", "passed", what="the last state of a decaying scan over all of its 2048 steps"),
    E("constant_honest", "control", "passed", what="y = x - x + 1: right, and marked degenerate", degenerate=True),
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
    E("tf32_claim_bf16", "5", "rejected", "precision_claim", "claims tf32, computes in bf16",
      also=(("wrong_answer", ""),)),
    E("fp32_claim_tf32", "5", "rejected", "precision_claim", "claims fp32, asks the runtime for a TF32 GEMM (wrong at "
      "1e-4 too)"),
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
      dynamic="runtime_stream", cpu=True),
    E("uninit_read", "basic", "wrong_answer", "", "reads a bias buffer nobody wrote"),
    # ---- the second round (issue 25)
    E("tail_scratch", "25.1", "rejected", "memory_bounds", "right outputs, and 4 KiB of scratch past the end of y"),
    E("weights_scribble", "25.1", "rejected", "weights_unchanged", "writes into the weights it was given"),
    E("rare_race", "25.2", "rejected", "sanitizer", "swaps values between two warps through shared memory without a "
      "barrier: right almost always (racecheck)"),
    E("norm_assumes_init", "25.3", "wrong_answer", "", "a LayerNorm that skips its weight and bias (ones and zeros at "
      "init)"),
    E("tf32_claim_fp16_lib", "25.4", "rejected", "precision_claim", "claims tf32, has cuBLASLt compute in fp16 (TF32's "
      "error statistics; the runtime call says fp16)"),
    E("masked_stream_gemm", "25.5", "rejected", "runtime_stream", "st_gemm on a stream computed from the caller's "
      "(NULL): the legacy default stream"),
    E("conv_default_stream", "25.5", "rejected", "foreign-stream", "st_conv on the legacy default stream",
      dynamic="runtime_stream", cpu=True),
    E("late_idle", "25.6", "rejected", "timed_calls", "honest for the first 300 calls on the same buffers, idle after",
      timed=True, options={"min_trials": 1000, "min_seconds": 0.2, "max_seconds": 10.0}),
    E("leak_per_call", "25.7", "rejected", "memory_leak", "64 KiB of device memory taken on every call, never freed"),
    E("host_via_link_map", "25.8", "rejected", "sandbox-link-map", "walks the dynamic linker's list to the "
      "interpreter and has PyTorch compute its outputs", dynamic="outputs_written", cpu=True),
    E("argmax_last_tie", "25.9", "rejected", "ties", "an argmax whose ties go to the last maximal element"),
    E("scan_last_steps", "25.10", "rejected", "sensitivity", "a decaying scan that skips its first 128 of 2048 "
      "steps (off by 1e-4 of y's scale)"),
    E("capture_idle", "25.11", "rejected", "stream_capture", "does nothing when the caller captures its stream"),
    E("zero_head_zeros", "25.12", "wrong_answer", "", "returns zeros for a head initialised to zeros"),
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
