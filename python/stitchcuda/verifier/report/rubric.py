"""The four scored dimensions every report carries.

=================  ========================================================================
anti_hacking       static findings plus the dynamic checks (outputs follow changed inputs, no
                   reuse of previous outputs, inputs unchanged, outputs fully written, repeated
                   calls, single-element sensitivity, varied distributions; the timed calls and the
                   >10x re-check when timed). 0 on any rejection or failed check; otherwise half for a
                   clean static pass (less 0.1 per warning) and half spread over the dynamic
                   checks that passed, so a CPU-only report honestly scores at most 0.5.
cuda_engineering   techniques found in the source (cuBLASLt epilogue fusion, shared-memory
                   tiling, tensor cores, vectorised access, CUDA graph capture) and in CUPTI
                   kernel names; the score is the share of the techniques that *apply* to this
                   program (by its tasks and precision) which it uses.
operator_coverage  share of the reference's FLOPs (bytes when it has no FLOPs) done by tasks of
                   generated kernels or runtime library calls, from the manifest's provenance.
skill_compliance   given the previous feedback and the previous and current profiles: did the
                   revision act on the one next step it was given, and what moved. ``None``
                   (not scored) for a first candidate.
=================  ========================================================================

All scores are in 0..1; each dimension is a frozen, JSON-serialisable dataclass with reasons.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ... import manifest as mf
from ..static import cxx
from .feedback import NextStep
from .profile import KernelRecord, ProfileSummary
from ..static.rules import Finding
from .verdict import DynamicCheck

REQUIRED_DYNAMIC = ("outputs_follow_inputs", "no_output_reuse", "inputs_unchanged", "outputs_written", "repeat_calls",
                    "sensitivity", "varied_inputs")

# ------------------------------------------------------------------ anti-hacking


@dataclass(frozen=True)
class AntiHacking:
    score: float
    reasons: tuple[str, ...]
    findings: tuple[Finding, ...] = ()
    checks: tuple[DynamicCheck, ...] = ()


def score_anti_hacking(findings: tuple[Finding, ...] | list[Finding] = (),
                       checks: tuple[DynamicCheck, ...] | list[DynamicCheck] = ()) -> AntiHacking:
    findings, checks = tuple(findings), tuple(checks)
    by_name = {c.name: c for c in checks}
    all_checks = tuple(by_name.get(n, DynamicCheck(n)) for n in REQUIRED_DYNAMIC) + tuple(
        c for c in checks if c.name not in REQUIRED_DYNAMIC)
    rejects = [f for f in findings if f.severity == "reject"]
    warns = [f for f in findings if f.severity == "warn"]
    failed = [c for c in all_checks if c.status == "fail"]
    reasons: list[str] = []
    for f in rejects:
        reasons.append(f"rejected by {f.rule} at {f.location}")
    for c in failed:
        reasons.append(f"dynamic check {c.name} failed" + (f": {c.detail}" if c.detail else ""))
    if rejects or failed:
        return AntiHacking(0.0, tuple(reasons), findings, all_checks)
    static_part = max(0.0, 0.5 - 0.1 * len(warns))
    reasons.append("static rules pass" + (f" with {len(warns)} warning(s): " + ", ".join(sorted({f.rule for f in warns}))
                                          if warns else ""))
    passed = [c for c in all_checks if c.name in REQUIRED_DYNAMIC and c.status == "pass"]
    not_run = [c.name for c in all_checks if c.status == "not_run" and c.name in REQUIRED_DYNAMIC]
    dyn_part = 0.5 * len(passed) / len(REQUIRED_DYNAMIC)
    if passed:
        reasons.append("dynamic checks passed: " + ", ".join(c.name for c in passed))
    if not_run:
        reasons.append("dynamic checks not run: " + ", ".join(not_run))
    recheck = by_name.get("speedup_recheck")
    if recheck is not None and recheck.status == "pass":
        reasons.append("speedup over 10x re-checked")
    return AntiHacking(round(static_part + dyn_part, 4), tuple(reasons), findings, all_checks)


# ------------------------------------------------------------------ CUDA engineering


@dataclass(frozen=True)
class Technique:
    id: str
    name: str
    detected: bool
    applicable: bool
    evidence: tuple[str, ...] = ()  # "program.cu:42: <line>" or "cupti: <kernel name>"


@dataclass(frozen=True)
class CudaEngineering:
    score: float
    reasons: tuple[str, ...]
    techniques: tuple[Technique, ...]
    kernel_evidence: tuple[str, ...] = ()  # from CUPTI records, when there were any


TECHNIQUES = {
    "cublaslt_epilogue": "cuBLASLt epilogue fusion",
    "shared_memory_tiling": "shared-memory tiling",
    "tensor_cores": "tensor cores",
    "vectorised_access": "vectorised memory access",
    "cuda_graph": "CUDA graph capture",
}

_TECH_PATTERNS = {
    "cublaslt_epilogue": re.compile(r"\bepilogue\s*=\s*ST_EPI_(?!NONE\b)\w+|\bst_gemm_epilogue\s*\(|"
                                    r"\bCUBLASLT_EPILOGUE_(?!DEFAULT\b)\w+|\bst_epilogue_apply\s*\("),
    "shared_memory_tiling": re.compile(r"__shared__|\bcp\.async\b|\bmemcpy_async\b|\bcp_async\w*|\bcuTensorMap\w*"),
    "tensor_cores": re.compile(r"\bmma\.sync\b|\bwgmma\b|\bwmma\s*::|\bnvcuda\s*::\s*wmma\b|__hmma\w*|\bmma_sync\b|"
                               r"\btcgen05\b|\bpolicy\s*=\s*ST_POLICY_(?:TF32|BF16|FP16)\b|"
                               # fp32-grade products on tensor cores (three TF32 or bf16 products each)
                               r"\bst_(?:gemm|conv)_split_(?:tf32|bf16)\s*\(|\blaunch_attention_split_tf32\b|"
                               r"\bCUBLAS_COMPUTE_32F_FAST_\w+|\bCUBLAS_COMPUTE_16F\b"),
    "vectorised_access": re.compile(r"\b(?:float4|float2|int4|uint4|uint2|int2|double2|__half2|half2|"
                                    r"__nv_bfloat162)\b|\bVec\s*<|\bld\.global\.v[24]|\bst\.global\.v[24]"),
    "cuda_graph": re.compile(r"\b(?:cudaStreamBeginCapture\w*|cudaGraphLaunch|cudaGraphInstantiate\w*|cuGraphLaunch|"
                             r"cudaGraphExecUpdate|cudaGraphCreate)\s*\("),
}

_TC_KERNEL = re.compile(r"xmma|hmma|wgmma|gmma|tensorop|s16816|s1688|h16816|_tf32|bf16|f16", re.I)


def detect_techniques(source: str, file: str = "program.cu") -> dict[str, tuple[str, ...]]:
    """technique id -> evidence lines ("program.cu:42: …") found in the source (comments ignored)."""
    m = cxx.mask(source)
    out: dict[str, tuple[str, ...]] = {}
    for tid, pat in _TECH_PATTERNS.items():
        ev = []
        for hit in pat.finditer(m.code):
            ln = m.line_of(hit.start())
            item = f"{file}:{ln}: {m.line_text(ln).strip()[:100]}"
            if item not in ev:
                ev.append(item)
        if ev:
            out[tid] = tuple(ev[:3])
    return out


def score_cuda_engineering(source: str, manifest: mf.Manifest | None = None,
                           kernels: tuple[KernelRecord, ...] | list[KernelRecord] = (),
                           file: str = "program.cu") -> CudaEngineering:
    found = detect_techniques(source, file)
    code = cxx.mask(source).code
    strategies = {t.strategy for t in manifest.tasks} if manifest else set()
    precision = manifest.precision if manifest else "fp32"
    # GEMMs and convolutions: where tensor cores and library epilogues apply
    has_gemm = bool(re.search(r"\bst_gemm\w*\s*\(|\bst_conv\s*\(|\bcublasLtMatmul\b|\bcublas\w*Gemm\w*", code)) or \
        bool(strategies & {"cublaslt_gemm", "attention_template", "cudnn_conv", "conv_template"})
    own_kernels = bool(re.search(r"__global__", code))
    n_tasks = len(manifest.tasks) if manifest else 0
    launches = sum(1 for k in kernels if k.kind == "kernel")

    kernel_evidence: list[str] = []
    tc_kernels = [k.name for k in kernels if k.kind == "kernel" and _TC_KERNEL.search(k.name)]
    if tc_kernels and precision != "fp32":
        found = dict(found)
        found["tensor_cores"] = tuple(found.get("tensor_cores", ())) + tuple(f"cupti: {n}" for n in sorted(set(tc_kernels))[:2])
    if kernels:
        kernel_evidence.append(f"cupti: {launches} kernel launch(es), {len({k.name for k in kernels})} distinct kernel(s)")
        kernel_evidence += [f"cupti: tensor-core kernel {n}" for n in sorted(set(tc_kernels))[:3]]

    applicable = {
        "cublaslt_epilogue": has_gemm,
        "shared_memory_tiling": bool(strategies & {"reduction_template", "attention_template", "custom_kernel",
                                                   "conv_template"}),
        "tensor_cores": has_gemm and precision != "fp32",
        "vectorised_access": own_kernels or bool(strategies & {"elementwise_kernel", "reduction_template",
                                                                "epilogue_template"}),
        "cuda_graph": n_tasks >= 4 or launches >= 4,
    }
    techniques = tuple(Technique(tid, name, tid in found, applicable[tid], found.get(tid, ()))
                       for tid, name in TECHNIQUES.items())
    app = [t for t in techniques if t.applicable]
    reasons = []
    for t in techniques:
        if t.applicable:
            reasons.append(f"{t.name}: {'used' if t.detected else 'applies but not used'}")
        elif t.detected and t.id == "tensor_cores" and precision == "fp32":
            reasons.append("tensor cores: used (not required under fp32: split products, about fp32's accuracy)")
        elif t.detected:
            reasons.append(f"{t.name}: used (not required here)")
    if precision == "fp32" and has_gemm and "tensor_cores" not in found:
        reasons.append("tensor cores are not required: policy fp32 is fp32 math")
    if not app:
        return CudaEngineering(1.0, tuple(reasons) + ("no listed technique applies to this program",), techniques,
                               tuple(kernel_evidence))
    score = sum(1 for t in app if t.detected) / len(app)
    return CudaEngineering(round(score, 4), tuple(reasons), techniques, tuple(kernel_evidence))


# ------------------------------------------------------------------ operator coverage


@dataclass(frozen=True)
class StrategyShare:
    strategy: str
    flops: int
    bytes: int
    nodes: int


@dataclass(frozen=True)
class OperatorCoverage:
    score: float
    reasons: tuple[str, ...]
    flops_share: float
    bytes_share: float
    covered_flops: int
    total_flops: int
    covered_bytes: int
    total_bytes: int
    uncovered: tuple[str, ...] = ()
    by_strategy: tuple[StrategyShare, ...] = ()


#: Strategies that do not count as generated kernels or runtime library calls.
NOT_COUNTED = frozenset({"host", "reference", "fallback", "torch", "unsupported", "none"})


def score_operator_coverage(manifest: mf.Manifest) -> OperatorCoverage:
    """Reference FLOPs/bytes covered by counted tasks. A node covered by several tasks is counted
    once, under the first counted task that names it."""
    owner: dict[str, str] = {}
    for t in manifest.tasks:
        if t.strategy in NOT_COUNTED:
            continue
        for n in t.covers:
            owner.setdefault(n, t.strategy)
    ops = manifest.reference_ops
    total_f = sum(o.flops for o in ops)
    total_b = sum(o.bytes for o in ops)
    cov = [o for o in ops if o.node in owner]
    unc = tuple(o.node for o in ops if o.node not in owner)
    cf, cb = sum(o.flops for o in cov), sum(o.bytes for o in cov)
    fs = cf / total_f if total_f else (1.0 if not unc else 0.0)
    bs = cb / total_b if total_b else (1.0 if not unc else 0.0)
    shares: dict[str, list[int]] = {}
    for o in cov:
        s = shares.setdefault(owner[o.node], [0, 0, 0])
        s[0] += o.flops
        s[1] += o.bytes
        s[2] += 1
    by_strategy = tuple(StrategyShare(k, v[0], v[1], v[2]) for k, v in sorted(shares.items(), key=lambda kv: -kv[1][0]))
    reasons = []
    if not ops:
        return OperatorCoverage(0.0, ("the manifest lists no reference_ops",), 0.0, 0.0, 0, 0, 0, 0)
    if total_f:
        score = fs
        reasons.append(f"{fs:.1%} of the reference's {total_f:,} FLOPs done by generated kernels or runtime calls")
    elif total_b:
        score = bs
        reasons.append(f"no FLOPs in the cost model; {bs:.1%} of {total_b:,} bytes covered")
    else:
        score = len(cov) / len(ops)
        reasons.append(f"no cost model; {len(cov)}/{len(ops)} reference ops covered")
    if total_f and total_b:
        reasons.append(f"{bs:.1%} of {total_b:,} bytes")
    if unc:
        reasons.append("not covered: " + ", ".join(unc[:8]) + (" …" if len(unc) > 8 else ""))
    for s in by_strategy:
        reasons.append(f"{s.strategy}: {s.nodes} op(s), {s.flops:,} FLOPs, {s.bytes:,} bytes")
    return OperatorCoverage(round(score, 4), tuple(reasons), fs, bs, cf, total_f, cb, total_b, unc, by_strategy)


# ------------------------------------------------------------------ skill compliance


@dataclass(frozen=True)
class KernelDelta:
    name: str
    before_ns: int
    after_ns: int

    @property
    def change(self) -> float:
        """Relative change of total time (after / before - 1); -1 when the kernel disappeared."""
        if self.before_ns == 0:
            return float("inf") if self.after_ns else 0.0
        return self.after_ns / self.before_ns - 1.0


@dataclass(frozen=True)
class SkillCompliance:
    score: float | None
    reasons: tuple[str, ...]
    acted: bool | None = None
    previous_step: str = ""
    moved: tuple[KernelDelta, ...] = ()
    busy_before_ns: int = 0
    busy_after_ns: int = 0


_FIX_KINDS = {"fix_compile": "compile_error", "fix_rejection": "rejected", "fix_crash": "crash",
              "fix_timeout": "timeout", "fix_correctness": "wrong_answer"}


def score_skill_compliance(previous_step: NextStep | None, *, previous_verdict: str = "", current_verdict: str = "",
                           previous_failure: str = "", current_failure: str = "",
                           previous: ProfileSummary | None = None, current: ProfileSummary | None = None,
                           techniques_now: tuple[str, ...] | frozenset[str] = (),
                           techniques_before: tuple[str, ...] | frozenset[str] = ()) -> SkillCompliance:
    """Did the revision act on ``previous_step``?

    Fix steps: 1 when the failure is gone and the candidate passes, 0.5 when the failure changed
    (a new error somewhere else: progress), 0 when it is the same failure. Performance steps: the
    step acted on when its target kernel got >= 5 % faster or vanished (fused away), or the
    technique it asked for is now in the source and was not before; 1 when it acted and the
    device time dropped, 0.5 when it acted without a gain (or gained without acting), 0 otherwise.
    ``previous_failure``/``current_failure`` are short keys of the failure (rule id + location,
    first diagnostic) that tell "the same failure" apart from "another one".
    """
    moved = _deltas(previous, current)
    busy_b = previous.busy_ns if previous else 0
    busy_a = current.busy_ns if current else 0
    if previous_step is None:
        return SkillCompliance(None, ("first candidate: no previous feedback to act on",), None, "", moved,
                               busy_b, busy_a)
    reasons = [f"previous next step ({previous_step.kind}): {previous_step.text}"]
    if previous_step.kind in _FIX_KINDS:
        if current_verdict == "passed":
            reasons.append("the failure is fixed and the candidate passes")
            return SkillCompliance(1.0, tuple(reasons), True, previous_step.text, moved, busy_b, busy_a)
        same = current_verdict == previous_verdict and (current_failure == previous_failure or not current_failure)
        if same:
            reasons.append(f"the same {current_verdict.replace('_', ' ')} is still there")
            return SkillCompliance(0.0, tuple(reasons), False, previous_step.text, moved, busy_b, busy_a)
        reasons.append(f"the {previous_verdict.replace('_', ' ') or 'failure'} changed to "
                       f"{current_verdict.replace('_', ' ') or 'another failure'}: acted, not yet passing")
        return SkillCompliance(0.5, tuple(reasons), True, previous_step.text, moved, busy_b, busy_a)

    acted = False
    if previous_step.target and previous and current:
        before = previous.by_name().get(previous_step.target)
        after = current.by_name().get(previous_step.target)
        if before is not None and after is None:
            acted = True
            reasons.append(f"{previous_step.target} is gone (fused or replaced)")
        elif before is not None and after is not None and after.total_ns <= 0.95 * before.total_ns:
            acted = True
            reasons.append(f"{previous_step.target}: {before.total_ns / 1e3:.1f} -> {after.total_ns / 1e3:.1f} us")
        elif before is not None and after is not None:
            reasons.append(f"{previous_step.target} did not get faster "
                           f"({before.total_ns / 1e3:.1f} -> {after.total_ns / 1e3:.1f} us)")
    if previous_step.technique:
        if previous_step.technique in techniques_now and previous_step.technique not in techniques_before:
            acted = True
            reasons.append(f"now uses {TECHNIQUES.get(previous_step.technique, previous_step.technique)}")
        elif previous_step.technique not in techniques_now:
            reasons.append(f"still does not use {TECHNIQUES.get(previous_step.technique, previous_step.technique)}")
    gained = bool(previous and current and busy_a < 0.98 * busy_b)
    if previous and current:
        reasons.append(f"device time {busy_b / 1e3:.1f} -> {busy_a / 1e3:.1f} us")
    if current_verdict and current_verdict != "passed":
        reasons.append(f"the revision no longer passes ({current_verdict.replace('_', ' ')})")
        return SkillCompliance(0.0, tuple(reasons), acted, previous_step.text, moved, busy_b, busy_a)
    score = 1.0 if acted and gained else 0.5 if (acted or gained) else 0.0
    return SkillCompliance(score, tuple(reasons), acted, previous_step.text, moved, busy_b, busy_a)


def _deltas(previous: ProfileSummary | None, current: ProfileSummary | None, k: int = 5) -> tuple[KernelDelta, ...]:
    if not previous or not current:
        return ()
    b, a = previous.by_name(), current.by_name()
    names = set(b) | set(a)
    ds = [KernelDelta(n, b[n].total_ns if n in b else 0, a[n].total_ns if n in a else 0) for n in names]
    ds.sort(key=lambda d: (-abs(d.after_ns - d.before_ns), d.name))
    return tuple(ds[:k])


# ------------------------------------------------------------------ the rubric


@dataclass(frozen=True)
class Rubric:
    anti_hacking: AntiHacking
    cuda_engineering: CudaEngineering
    operator_coverage: OperatorCoverage
    skill_compliance: SkillCompliance

    def to_dict(self) -> dict:
        from ...serial import to_jsonable

        return to_jsonable(self)

    def scores(self) -> dict[str, float | None]:
        return {"anti_hacking": self.anti_hacking.score, "cuda_engineering": self.cuda_engineering.score,
                "operator_coverage": self.operator_coverage.score, "skill_compliance": self.skill_compliance.score}


def build_rubric(*, source: str, manifest: mf.Manifest, findings: tuple[Finding, ...] | list[Finding] = (),
                 checks: tuple[DynamicCheck, ...] | list[DynamicCheck] = (),
                 kernels: tuple[KernelRecord, ...] | list[KernelRecord] = (),
                 compliance: SkillCompliance | None = None) -> Rubric:
    """All four dimensions from the parts the Verifier has (skill compliance comes precomputed,
    because only the workflow knows the previous candidate)."""
    return Rubric(
        anti_hacking=score_anti_hacking(findings, checks),
        cuda_engineering=score_cuda_engineering(source, manifest, kernels),
        operator_coverage=score_operator_coverage(manifest),
        skill_compliance=compliance or score_skill_compliance(None),
    )


__all__ = [
    "REQUIRED_DYNAMIC", "AntiHacking", "score_anti_hacking", "Technique", "CudaEngineering", "TECHNIQUES",
    "detect_techniques", "score_cuda_engineering", "StrategyShare", "OperatorCoverage", "NOT_COUNTED",
    "score_operator_coverage", "KernelDelta", "SkillCompliance", "score_skill_compliance", "Rubric", "build_rubric",
]
