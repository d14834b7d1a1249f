"""The mutation check's faults: each one a deliberate bug, as an exact text patch of one source
file, with the tests that must fail because of it (``benchmarks/mutate.py`` runs them).

A mutant names its area (the Coder, the templates, the planner, the Verifier), what it breaks in
words, the file and the text replaced (which must occur exactly once, so a change to the source
that moves the text makes the check say so instead of testing nothing), and the pytest arguments
of the tests that catch it. ``device`` mutants break what only a GPU run shows (a dropped
synchronisation, wrong tile bounds, a transposed GEMM operand): their ``tests`` are GPU tests, run
on a machine with a device. ``fast`` marks the few that CI runs as a test (tests/test_mutation.py).

A surviving mutant is a missing test: add the test, not an exception here.
"""

from __future__ import annotations

from dataclasses import dataclass

AREAS = ("coder", "templates", "planner", "verifier")


@dataclass(frozen=True)
class Mutant:
    name: str
    area: str  #: one of AREAS
    fault: str  #: what the mutant breaks, in words
    path: str  #: the file patched, relative to the repository root
    old: str  #: text replaced; must occur exactly once in the file
    new: str
    tests: tuple[str, ...]  #: pytest arguments selecting the tests that must fail
    device: bool = False  #: only a GPU run can catch it (its tests are GPU tests)
    fast: bool = False  #: in the CI subset


M = Mutant
OPS_CUH = "templates/stitch/ops.cuh"
OP_HARNESS = "tests/test_op_harness.py"
TOL = "tests/test_verifier_tolerance.py"
RUN = "tests/test_verifier_run.py"
STATIC = "tests/test_verifier_static.py"
PLANNER = "tests/test_planner.py"
VERIFIER_PY = "python/stitchcuda/verifier/"
SWEEP_KINDS = "tests/test_sweep_kinds.py"
SWEEP_RW = "tests/test_sweep_rewrites.py"
COSTS = "tests/test_costs.py"

MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------------------------ the Coder (code/, the op registry)
    M("ew-mul-as-add", "coder", "the elementwise mul rendered as an add",
      "python/stitchcuda/ops/elementwise.py",
      'elementwise("mul", "{0} * {1}",', 'elementwise("mul", "{0} + {1}",',
      (OP_HARNESS, "-k", "mul")),
    M("ew-sub-swapped", "coder", "sub renders its operands in the wrong order",
      "python/stitchcuda/ops/elementwise.py",
      'elementwise("sub", "{0} - {1}",', 'elementwise("sub", "{1} - {0}",',
      (OP_HARNESS, "-k", "sub")),
    M("ew-sign-wrong", "coder", "sign(x) with the comparison the wrong way round",
      "python/stitchcuda/ops/elementwise.py",
      '"float(({0} > 0.f) - ({0} < 0.f))"', '"float(({0} < 0.f) - ({0} > 0.f))"',
      (OP_HARNESS, "-k", "sign")),
    M("literal-6-digits", "coder", "float literals printed with 6 significant digits (constants rounded)",
      "python/stitchcuda/kinds/cxx.py", 'text = f"{f:.9g}"', 'text = f"{f:.6g}"',
      ("tests/test_coder.py::test_float_literals_read_back",)),
    M("input-checks-dropped", "coder", "the generated program stops checking its input descriptors",
      "python/stitchcuda/code/skeleton.py",
      "lines.append(f'  ST_TRY(st_check_tensor(&{arr}[{i}],",
      "lines.append(f'  // ST_TRY(st_check_tensor(&{arr}[{i}],",
      ("tests/test_coder.py", "-k", "generated_sources and mlp")),
    M("gemm-trans-b-flipped", "coder", "every GEMM told its B operand is the other way round",
      "python/stitchcuda/kinds/gemm.py", "g.trans_b = {int(g.trans_b)};", "g.trans_b = {int(not g.trans_b)};",
      ("tests/gpu/test_programs_gpu.py", "-k", "mlp and fp32"), device=True),

    # ------------------------------------------------------------------ templates (templates/stitch/*.cuh)
    M("relu-wrong-operator", "templates", "relu keeps the negative half (> became <)", OPS_CUH,
      "return x > 0.f ? x : (x == x ? 0.f : x);", "return x < 0.f ? x : (x == x ? 0.f : x);",
      (OP_HARNESS, "-k", "relu and not relu6"), fast=True),
    M("sigmoid-sign-dropped", "templates", "sigmoid without its minus sign", OPS_CUH,
      "ST_OP float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }",
      "ST_OP float sigmoid(float x) { return 1.f / (1.f + expf(x)); }",
      (OP_HARNESS, "-k", "sigmoid and not hardsigmoid")),
    M("gelu-erf-constant", "templates", "the erf GELU with the tanh GELU's constant (sqrt(2/pi) for 1/sqrt(2))",
      OPS_CUH, "erff(x * 0.7071067811865476f)", "erff(x * 0.7978845608028654f)",
      (OP_HARNESS, "-k", "gelu_erf")),
    M("clamp-nan-lost", "templates", "clamp (relu6, hardswish) forgets PyTorch's NaN propagation", OPS_CUH,
      "return (x != x || lo != lo || hi != hi) ? x + lo + hi : fminf(fmaxf(x, lo), hi);",
      "return fminf(fmaxf(x, lo), hi);",
      (OP_HARNESS, "-k", "relu6 or hardswish")),
    M("softplus-threshold-flipped", "templates", "softplus linear below its threshold instead of above", OPS_CUH,
      "return x * beta > threshold ? x :", "return x * beta < threshold ? x :",
      (OP_HARNESS, "-k", "softplus")),
    M("ew-tail-off-by-one", "templates", "the elementwise kernel's scalar tail stops one element short",
      "templates/stitch/elementwise.cuh",
      "for (int64_t i = nvec * VEC + tid; i < n; i += stride) {",
      "for (int64_t i = nvec * VEC + tid; i < n - 1; i += stride) {",
      ("tests/gpu/test_templates_gpu.py", "tests/gpu/test_op_harness_gpu.py", "-k", "ew_ or instruction_on_the_device"),
      device=True),
    M("rmsnorm-divisor-off-by-one", "templates", "RMS norm divides the sum of squares by cols - 1",
      "templates/stitch/reduce.cuh", "rsqrtf(ss / fcols + p.eps)", "rsqrtf(ss / (fcols - 1.f) + p.eps)",
      ("tests/gpu/test_templates_gpu.py", "-k", "norm"), device=True),
    M("axis-reduce-tile-bounds", "templates", "the axis reduction's row tile stops one row short",
      "templates/stitch/reduce.cuh", "for (int64_t r = r_begin + ty; r < r_end; r += by) {",
      "for (int64_t r = r_begin + ty; r < r_end - 1; r += by) {",
      ("tests/gpu/test_templates_gpu.py", "-k", "axis"), device=True),
    M("axis-tree-sync-dropped", "templates", "the axis reduction's tree over the block's row lanes without its "
      "__syncthreads (a level reads partials the level before has not written)",
      "templates/stitch/reduce.cuh",
      "part[((ty + h) * bx + tx) * V + e]);\n      }\n      __syncthreads();\n",
      "part[((ty + h) * bx + tx) * V + e]);\n      }\n",
      ("tests/gpu/test_templates_gpu.py", "-k", "axis"), device=True),

    # ------------------------------------------------------------------ the planner (plan/)
    M("arena-liveness-off-by-one", "planner", "arena buffers whose lifetimes touch at one task share bytes",
      "python/stitchcuda/plan/schedule.py", "if not (h2 < lo or hi < l2)", "if not (h2 <= lo or hi < l2)",
      (PLANNER, "-k", "simulated_models or arena or dev_problems_plan"), fast=True),
    M("sdpa-scale-wrong", "planner", "attention's default scale 1/sqrt(d + 1) instead of 1/sqrt(d)",
      "python/stitchcuda/kinds/attention.py", "scale = 1.0 / math.sqrt(d) if scale is None else float(scale)",
      "scale = 1.0 / math.sqrt(d + 1) if scale is None else float(scale)",
      (PLANNER, "-k", "simulated_sdpa")),
    M("gemm-div-as-scale", "planner", "a GEMM's division by a scalar folded into alpha as a multiplication",
      "python/stitchcuda/kinds/gemm.py",
      's = step.value if kind == "scale" else 1.0 / step.value',
      's = step.value if kind == "scale" else step.value',
      (PLANNER, "-k", "simulated_gemm_scalars")),
    M("erf-gelu-to-cublaslt", "planner", "the erf GELU handed to cuBLASLt's (tanh) GELU epilogue under fp32",
      "python/stitchcuda/kinds/gemm.py",
      'if head == "RELU" or (head == "GELU_TANH" and policy != "fp32"):',
      'if head in ("RELU", "GELU_ERF") or (head == "GELU_TANH" and policy != "fp32"):',
      (PLANNER, "-k", "gelu_epilogue_rules or simulated")),
    M("rewrite-mean-divisor", "planner", "the reduce-after-linear rewrite divides a mean by K instead of N",
      "python/stitchcuda/plan/rewrite.py", '(("other", 1.0 / n_out),)', '(("other", 1.0 / k),)',
      (PLANNER, "-k", "simulated_rewrites")),

    # ------------------------------------------------------------------ parameters the sweeps draw (tests/test_sweep_*.py,
    # tests/test_costs.py): the three faults of the audit that led to the sweeps, and five more
    M("pool-before-biased-conv-divisor", "planner", "an average pool with a divisor override moved before the biased "
      "1x1 convolution it follows (a weighted sum of the bias is not the bias)",
      "python/stitchcuda/plan/rewrite.py",
      'if biased and (any(int(v) for v in pool.attr("padding") or ()) or pool.attr("divisor_override") is not None):',
      'if biased and any(int(v) for v in pool.attr("padding") or ()):',
      (SWEEP_RW, "-k", "pool_before_pointwise_conv or biased_conv")),
    M("nearest-scale-from-sizes", "planner", "nearest upsampling's source index from the size ratio, not the scale "
      "factor given (they differ for a scale that is not an integer)",
      "python/stitchcuda/kinds/gather.py",
      "nearest[d] = 1.0 / float(sf[j]) if sf and sf[j] else xs[d] / oshape[d]", "nearest[d] = xs[d] / oshape[d]",
      (SWEEP_KINDS, "-k", "upsample")),
    M("transposed-conv-flops-over-output", "planner", "a transposed convolution's FLOPs counted over its output "
      "positions instead of its input's", "python/stitchcuda/kinds/conv.py",
      "spec.in_size if spec.transposed else spec.out_size", "spec.out_size",
      (COSTS, "-k", "convolution")),
    M("avg-pool-divisor-dropped", "planner", "an average pool's divisor override ignored",
      "python/stitchcuda/kinds/pool.py", 'divisor = int(n.attr("divisor_override") or 0)', "divisor = 0",
      (SWEEP_KINDS, "-k", "pool")),
    M("avg-pool-count-include-pad-ignored", "planner", "an average pool always divides by the padded window",
      "python/stitchcuda/kinds/pool.py", 'count_include_pad = bool(n.attr("count_include_pad", True))',
      "count_include_pad = True",
      (SWEEP_KINDS, "-k", "pool")),
    M("conv-dilation-dropped", "planner", "a convolution's dilation taken as 1",
      "python/stitchcuda/kinds/conv.py", 'dilation=int_list(n.attr("dilation"), nsp, 1),', "dilation=(1,) * nsp,",
      (SWEEP_KINDS, "-k", "conv")),
    M("var-correction-clamped", "planner", "a variance's correction above 1 taken as 1 (Bessel's)",
      "python/stitchcuda/kinds/row.py", "correction = 1.0 if corr is None else float(corr)",
      "correction = 1.0 if corr is None else min(float(corr), 1.0)",
      (SWEEP_KINDS, "-k", "reduction")),
    M("pad-value-dropped", "planner", "constant padding always pads with zeros", "python/stitchcuda/kinds/gather.py",
      'fill = float(n.attr("value") or 0.0)', "fill = 0.0",
      (SWEEP_KINDS, "-k", "pad")),

    # ------------------------------------------------------------------ the Verifier (verifier/, precision.py)
    M("fp32-tolerance-loosened", "verifier", "the fp32 tolerance loosened from 1e-4 to 1e-2",
      "python/stitchcuda/precision.py", 'FP32 = Policy("fp32", "float32", tf32=False, tensor_cores=False, '
      "tolerance=1e-4,", 'FP32 = Policy("fp32", "float32", tf32=False, tensor_cores=False, tolerance=1e-2,',
      (TOL, "-k", "tolerances_are_the_policy_table or 2e4"), fast=True),
    M("nan-passes", "verifier", "a NaN where the reference is finite is not counted as wrong",
      VERIFIER_PY + "run/compare.py", "nonfinite_bad = (fin_r & ~fin_o) | (~fin_r", "nonfinite_bad = (fin_r & fin_o & ~fin_o) | (~fin_r",
      (TOL, "-k", "nan_never_passes"), fast=True),
    M("scale-relative-atol-dropped", "verifier", "small outputs judged with the plain absolute tolerance",
      VERIFIER_PY + "run/compare.py", "return tol * min(1.0, max(scale, SCALE_FLOOR))", "return tol",
      (TOL, "-k", "small_outputs")),
    M("float64-rescue-deleted", "verifier", "no float64 reference where the fp32 comparison fails",
      VERIFIER_PY + "run/compare.py", "if e.passed or not out.dtype.is_floating_point or e.bad_nonfinite:",
      "if True:",
      (TOL, "-k", "float64")),
    M("inputs-unchanged-skipped", "verifier", "the check that the program left its inputs unchanged skipped",
      VERIFIER_PY + "run/session.py", "if _hash(t, self.key) != h:", "if False and _hash(t, self.key) != h:",
      (RUN, "-k", "dynamic_cheats_get_their_reason and zero_inputs")),
    M("stale-outputs-undetected", "verifier", "outputs repeated from the previous call no longer recognised",
      VERIFIER_PY + "run/dynamic.py", "n_stale = count_same(bad, o, prev, k, exclude=any_poison) if prev is not None and prev.available else 0",
      "n_stale = 0",
      (RUN, "-k", "dynamic_cheats_get_their_reason and (pointer_cache or same_buffers_skip)")),
    M("outputs-follow-inputs-unnamed", "verifier", "outputs kept from the last call on new input buffers not named so",
      VERIFIER_PY + "run/dynamic.py",
      '("x2", 3, "keep", "new input buffers into outputs holding call 3\'s", "outputs_follow_inputs"),',
      '("x2", 3, "keep", "new input buffers into outputs holding call 3\'s", ""),',
      (RUN, "-k", "dynamic_cheats_get_their_reason and input_bound_to_output")),
    M("sensitivity-skipped", "verifier", "the single-element sensitivity check never fails",
      VERIFIER_PY + "run/dynamic.py",
      's.fail("sensitivity", f"{what}: output {spec.name} did not follow the change as the reference\'s did: '
      '{how}")',
      's.note(f"{what}: output {spec.name} did not follow the change as the reference\'s did: {how}")',
      (RUN, "-k", "dynamic_cheats_get_their_reason and fingerprint_memo")),
    M("stream-order-skipped", "verifier", "stream order taken for granted (work on another stream passes)",
      VERIFIER_PY + "run/stream_checks.py",
      "if all(bool(close_mask(a, r, tol).all().item()) for a, r in zip(snap, ref)):",
      "if True:",
      (RUN, "-k", "dynamic_cheats_get_their_reason and side_stream")),
    M("unwritten-outputs-unchecked", "verifier", "outputs left unwritten no longer fail the outputs_written check",
      VERIFIER_PY + "run/correctness.py",
      'DynamicCheck("outputs_written", "fail" if "outputs_written" in s.failures else "pass",',
      'DynamicCheck("outputs_written", "pass",',
      (RUN, "-k", "dynamic_cheats_get_their_reason and partial_output")),
    M("determinism-unchecked", "verifier", "two runs on the same inputs may differ beyond the tolerance",
      VERIFIER_PY + "run/session.py",
      '            if not e.passed:\n                return DynamicCheck("deterministic", "fail",',
      '            if False:\n                return DynamicCheck("deterministic", "fail",',
      (RUN, "-k", "dynamic_cheats_get_their_reason and nondeterministic")),
    M("varied-inputs-unchecked", "verifier", "a program wrong only on the varied distributions passes",
      VERIFIER_PY + "run/correctness.py", "    if failed and plain_ok:\n", "    if False:\n",
      (RUN, "-k", "dynamic_cheats_get_their_reason and value_range")),
    M("precision-claim-unchecked", "verifier", "a tf32 claim computed in bf16 is not told apart",
      VERIFIER_PY + "run/precision_claim.py", "if e_c >= e_low / 3 and e_c >= 2.5 * max(base, e_trunc):", "if False:",
      (TOL, "-k", "tf32_claim_computed_in_bf16")),
    M("repeat-calls-unchecked", "verifier", "a wrong answer on a repeated call with the same buffers is not named",
      VERIFIER_PY + "run/dynamic.py", "        if n:  # (outputs left as filled: outputs_written says so)",
      "        if False:  # (outputs left as filled: outputs_written says so)",
      (RUN, "-k", "called_again_on_its_buffers")),
    M("timed-calls-unchecked", "verifier", "a wrong output on a checked timed call is not recorded",
      VERIFIER_PY + "run/timed_calls.py", "        if ok:\n            return\n",
      "        if True:\n            return\n",
      (RUN, "-k", "timed")),
    M("fp32-own-slack-loose", "verifier", "near the bound, ten times fp32's own distance from float64 passes",
      VERIFIER_PY + "run/compare.py", "FP32_OWN_SLACK = 2.0", "FP32_OWN_SLACK = 20.0",
      (RUN, "-k", "fp32s_own")),
    M("hidden-work-accepted", "verifier", "the speedup recheck accepts work the stream's events do not see",
      VERIFIER_PY + "measure/timing.py", "time_ok = hidden <= max(program_event_ms, 0.02)", "time_ok = True",
      (RUN, "-k", "recheck")),
    M("pointer-cache-rule-skipped", "verifier", "the static rule against cached I/O pointers not run",
      VERIFIER_PY + "static/source.py", "        self.pointer_caches()\n", "",
      (STATIC, "-k", "static_cheats_are_rejected or rule_fires")),
    M("sandbox-findings-dropped", "verifier", "the sandbox's findings on the built library thrown away",
      VERIFIER_PY + "static/sandbox.py", "return SandboxResult(tuple(unique), tuple(new), tuple(notes))",
      "return SandboxResult((), tuple(new), tuple(notes))",
      ("tests/test_verifier_adversarial.py", "-k", "refused_before_running and (reads_env or dlsym_host)")),
    M("illegal-address-unnamed", "verifier", "CUDA error 700 no longer classified as an illegal address",
      VERIFIER_PY + "report/verdict.py", 'if any(s in low for s in ("illegal memory access", "illegal address", ',
      'if any(s in low for s in ("illegal address", ',
      (RUN, "-k", "cuda_error_700")),
    M("phase-limit-ignored", "verifier", "a hung phase runs on until the total limit",
      VERIFIER_PY + "run/child.py", "if now - phase_t0 > limits.budget(phase):",
      "if now - phase_t0 > 10 * limits.budget(phase):",
      (RUN, "-k", "hang_is_a_timeout")),
    M("compile-error-not-a-verdict", "verifier", "a program that does not compile judged inconclusive",
      VERIFIER_PY + "verification.py",
      "        return run.finish(build_result(findings=run.findings, compile_error=CompileError.from_output(built.output)))",
      '        run.inconclusive(f"the build failed: {built.output[:200]}")',
      ("tests/test_verifier_adversarial.py", "-k", "compile_error_is_a_verdict")),
    # (Two Verifier-side mutants survived on an H100 and are equivalent, not missing tests: each
    # removes one of two orderings that are each enough. "stream-sync-dropped" deleted the runner's
    # event wait, but the correctness run is on the program's stream; "stream-order-dropped" moved
    # the run off that stream, but every run ends in the host waiting for the program's stream.
    # The device-only synchronisation faults that change a result are "axis-tree-sync-dropped" and
    # "task-check-stream-wait-dropped".)
    M("task-check-stream-wait-dropped", "verifier", "the task check runs a body on its own stream without waiting "
      "for the copies and poison queued on the current one",
      "python/stitchcuda/check/task.py", "        stream.wait_stream(torch.cuda.current_stream(dev))\n", "",
      ("tests/gpu/test_task_seam_gpu.py",), device=True),
    M("event-timer-empty", "verifier", "the timing events recorded around nothing (end recorded before the call)",
      VERIFIER_PY + "measure/timing.py",
      '        fn()\n        _check(rt.cudaEventRecord(self.end, self.stream), "cudaEventRecord")\n',
      '        _check(rt.cudaEventRecord(self.end, self.stream), "cudaEventRecord")\n        fn()\n',
      ("tests/gpu/test_verifier_gpu.py", "-k", "timing_is_stable or honest_program_passes"), device=True),
)

BY_NAME = {m.name: m for m in MUTANTS}
