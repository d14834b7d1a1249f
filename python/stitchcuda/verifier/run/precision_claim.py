"""The precision claim: the program computes at the policy it is judged at, not a lower one.

Two kinds of evidence, either of which fails the ``precision_claim`` check:

1. **Error statistics** (:class:`PrecisionEvidence`), over several plain trials — the first (for a
   stateful program, its initial state) and two with random inputs and random states — summed
   before they are judged: the candidate's mean error against the truth (float64 where it fits)
   beside the reference's at the claimed policy and at the next lower one. An output is judged
   only where the lower policy's error is at least 4x the claimed one's (the two are told apart on
   this problem); it fails when the candidate's is at least a third of the lower policy's and 2.5x
   the claimed one's. (Rounding a GEMM's inputs to bf16 gives about 8x the error of rounding them
   to TF32, 4x that of truncating them; PyTorch's bf16 reference also rounds its outputs, about 1.2x
   more.) Under tf32 it also never fails below 2.5x the error of the reference with its product
   operands *truncated* to TF32 (``Policy.emulated("truncate")``), the least accurate arithmetic
   an honest TF32 engine has (tensor cores given fp32 registers unconverted drop the low bits):
   truncation is a bias, not noise, and where an output averages many products it survives — on
   2:23 (a 3-d convolution, a group norm, the mean of everything) truncated operands give about
   100x the error of rounded ones, near bf16's, while cuDNN ran PyTorch's "tf32" reference without
   TF32 at all (1.5e-8); the channels-last program (9.8e-6, bf16 2.7e-6) was rejected as bf16.
   On a GEMM's outputs bf16 stays about 4x truncated TF32's error, and is still caught.
2. **What the library calls ran** (:func:`library_evidence`): the native runner logs every runtime
   call the program makes with its precision policy and operand dtypes. fp16 arithmetic has TF32's
   mantissa, so a TF32 claim computed in fp16 by the library has TF32's error statistics; the log
   shows it: a GEMM or convolution asked for a policy below the claim (ranked fp32 > tf32 > bf16 =
   fp16), or on 16-bit operands under an fp32 or tf32 claim, is computing below it. And what the
   libraries ran (:func:`kernel_evidence`, over the CUPTI profile's kernel names): cuBLAS, cuBLASLt
   and cuDNN name their kernels by their arithmetic (``sm90_xmma_gemm_f16f16_f16f32_f32_…``,
   ``nvjet_hsh_…``, ``cutlass_80_tensorop_s1688gemm_…`` for TF32, ``…fprop_implicit_gemm_tf32f32…``),
   whatever the call asked for.

The lower policy of each claim is :data:`LOWER`. Not fp16's: bf16 runs at fp16's speed on tensor
cores (nothing to gain), and an honest fp16 program stores every intermediate in fp16 where
PyTorch's autocast keeps softmax, norms and reductions in fp32, so it can sit at bf16-autocast's
error (measured on an H100: models/norm_softmax under fp16, 2.1e-5 mean error against autocast
fp16's 2.5e-6 and bf16's 2.0e-5).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import torch

from ..report.verdict import DynamicCheck
from .compare import fingerprint, mean_abs, mean_abs_error
from .session import Draw, Session, is_float

LOWER = {"fp32": "tf32", "tf32": "bf16"}

#: Rank of each policy's arithmetic (a call below the claim's rank computes below it).
RANK = {"fp32": 3, "tf32": 2, "bf16": 1, "fp16": 1}
#: Library kernel launches one st_gemm_split_bf16 call may make: three bf16 products, each a GEMM kernel
#: and, where cuBLASLt splits K, its reduction.
SPLIT_BF16_LAUNCHES = 6
#: The runtime's policy enum (stitchrt.h st_policy) and 16-bit dtype enums (st_dtype).
ST_POLICY = {0: "fp32", 1: "tf32", 2: "bf16", 3: "fp16"}
ST_HALF = {1: "float16", 2: "bfloat16"}
#: Entry points whose arithmetic a policy sets.
MATH_CALLS = ("st_gemm", "st_gemm_epilogue", "st_conv")

#: A kernel of NVIDIA's libraries (cuBLAS, cuBLASLt, cuDNN, CUTLASS inside them), by its name.
LIBRARY_KERNEL = re.compile(r"xmma|cutlass|nvjet|cudnn|cublas|implicit_convolve|"
                            r"(?:^|\s)(?:ampere|turing|volta|hopper|blackwell|sm\d+)_", re.I)
#: What a library kernel's name says of its arithmetic, lowest first: 16-bit operands (bf16, f16,
#: ``h`` MMA shapes, 16816 MMAs, which exist for 16-bit types only), then TF32.
KERNEL_MATH = (("bf16", re.compile(r"bf16|nvjet_(?:sm\d+_)?b[a-z]{2}_", re.I)),
               ("fp16", re.compile(r"f16|__half|hhgemm|_h\d{3,5}(?:gemm|fprop|dgrad|wgrad)|(?<!\d)16816(?!\d)|"
                                   r"nvjet_(?:sm\d+_)?h[a-z]{2}_", re.I)),
               ("tf32", re.compile(r"tf32|_s1688(?:gemm|fprop|dgrad|wgrad)|nvjet_(?:sm\d+_)?t[a-z]{2}_", re.I)))


class PrecisionEvidence:
    """Error statistics of several trials, summed, then judged (module docstring, 1)."""

    def __init__(self, s: Session):
        self.s = s
        self.lower = LOWER.get(s.policy)
        self.sums: dict[int, list[float]] = {}  # output -> [candidate, reference, at policy, at lower]
        self.truth_name = "float64"
        self.trials = 0
        self.verdict: DynamicCheck | None = None  # decided without statistics (nothing to tell apart, ...)

    def wanted(self) -> bool:
        return self.verdict is None

    def add(self, d: Draw, x: list[torch.Tensor], y: list[torch.Tensor], ref: list[torch.Tensor],
            passed: bool) -> None:
        s = self.s
        if not self.wanted():
            return
        if not passed:
            if self.trials == 0:
                self.verdict = DynamicCheck("precision_claim", "pass", "not judged: the program is wrong at any "
                                                                       "precision on the first trial (a wrong answer)")
            return
        if self.lower is None:
            self.verdict = DynamicCheck("precision_claim", "pass", f"no policy below {s.policy}: nothing to tell apart")
            return
        floats = [k for k, o in enumerate(y) if is_float(o)]
        na = DynamicCheck("precision_claim", "pass", f"not measurable here: PyTorch cannot compute the reference at "
                                                     f"{s.policy} and {self.lower} on {s.device.type}")
        same = DynamicCheck("precision_claim", "pass", f"{s.policy} and {self.lower} give the same results here: "
                                                       "nothing to tell apart")
        side_by_side = s.budget.on_device(2 * sum(y[k].numel() * 4 for k in floats))
        at = s.ref.forward_at(s.policy, d, x)
        if at is None:
            self.verdict = na
            return
        if side_by_side:
            low = s.ref.forward_at(self.lower, d, x)
            if low is None:
                self.verdict = na
                return
            if all(mean_abs_error(low[k], at[k]) <= 1e-6 * max(mean_abs(ref[k]), 1e-30) for k in floats):
                self.verdict = same  # the two policies compute the same here (no GEMM): no float64 needed to say so
                return
        else:  # one output-sized reference at a time: bit-identical results (no GEMM) are the same, by a keyed hash
            h_at = [fingerprint(at[k], s.key) for k in floats]
            at = None
            low = s.ref.forward_at(self.lower, d, x)
            if low is None:
                self.verdict = na
                return
            if all(fingerprint(low[k], s.key) == h for k, h in zip(floats, h_at)):
                self.verdict = same
                return
            low = None
        truth = s.ref.forward64(d, x) or ref
        if truth is ref:
            self.truth_name = "fp32"
        if at is None:  # computed again, one at a time
            at = s.ref.forward_at(s.policy, d, x)
            e_at = {k: mean_abs_error(at[k], truth[k]) for k in floats}
            at = None
            low = s.ref.forward_at(self.lower, d, x)
            e_low = {k: mean_abs_error(low[k], truth[k]) for k in floats}
            low = None
        else:
            e_at = {k: mean_abs_error(at[k], truth[k]) for k in floats}
            e_low = {k: mean_abs_error(low[k], truth[k]) for k in floats}
            at = low = None
        # the least accurate honest arithmetic of the policy whichever engine PyTorch picks: TF32 operands
        # truncated (None where it adds nothing: fp32)
        emu = s.ref.forward_at(s.policy, d, x, emulated="truncate")
        e_emu = {k: mean_abs_error(emu[k], truth[k]) for k in floats} if emu else {}
        emu = None
        for k in floats:
            row = self.sums.setdefault(k, [0.0, 0.0, 0.0, 0.0, 0.0])
            row[0] += mean_abs_error(y[k], truth[k])
            row[1] += mean_abs_error(ref[k], truth[k]) if truth is not ref else 0.0
            row[2] += e_at[k]
            row[3] += e_low[k]
            row[4] += e_emu.get(k, 0.0)
        self.trials += 1

    def result(self) -> DynamicCheck:
        if self.verdict is not None:
            return self.verdict
        s = self.s
        if not self.trials:
            return DynamicCheck("precision_claim", "pass", "not judged: no trial measured")
        told, lines = 0, []
        n = self.trials
        for k, (e_c, e_r, e_at, e_low, e_trunc) in sorted(self.sums.items()):
            spec, base = s.out_specs[k], max(e_at, e_r)
            if e_low < 4 * base or e_low == 0.0:
                continue
            told += 1
            trunc = f", with truncated operands {e_trunc / n:.3g}" if e_trunc else ""
            lines.append(f"{spec.name}: {e_c / n:.3g} (reference at {s.policy} {e_at / n:.3g}{trunc}, at "
                         f"{self.lower} {e_low / n:.3g})")
            if e_c >= e_low / 3 and e_c >= 2.5 * max(base, e_trunc):
                return DynamicCheck("precision_claim", "fail",
                                    f"output {spec.name}: mean |err| {e_c / n:.3g} against the {self.truth_name} "
                                    f"reference over {n} trial(s) matches {self.lower} arithmetic ({e_low / n:.3g}), "
                                    f"not the {s.policy} claimed ({e_at / n:.3g}{trunc})")
        if not told:
            return DynamicCheck("precision_claim", "pass", f"{s.policy} and {self.lower} give the same error here: "
                                                           "nothing to tell apart")
        return DynamicCheck("precision_claim", "pass", f"mean |err| against {self.truth_name} over {n} trial(s): "
                                                       + "; ".join(lines))


def library_evidence(calls: Sequence[dict[str, Any]], policy: str) -> str:
    """Why the runtime calls the program made (the native runner's log: ``fn``, ``policy``, ``dtypes``,
    ``count``) compute below ``policy``, or ""."""
    claim = RANK.get(policy, 0)
    for c in calls:
        if c.get("fn") not in MATH_CALLS:
            continue
        asked = ST_POLICY.get(int(c.get("policy", -1)))
        dtypes = [int(v) for v in str(c.get("dtypes", "")).split(",") if v.strip().lstrip("-").isdigit()]
        half = sorted({ST_HALF[v] for v in dtypes if v in ST_HALF})
        if asked is not None and RANK[asked] < claim:
            return (f"{c['fn']} called {c.get('count', 1)} time(s) with the {asked} policy under a {policy} claim: "
                    f"the library computes in {asked}")
        if half and claim >= RANK["tf32"]:
            return (f"{c['fn']} called {c.get('count', 1)} time(s) on {'/'.join(half)} operands under a {policy} "
                    f"claim: the library computes in 16-bit")
    return ""


def kernel_math(name: str) -> str:
    """The arithmetic a library kernel's name says it runs ("bf16", "fp16", "tf32"), or "" (not a
    library kernel, or fp32 as far as its name says)."""
    if not LIBRARY_KERNEL.search(name):
        return ""
    return next((math for math, pat in KERNEL_MATH if pat.search(name)), "")


def kernel_evidence(names: Sequence[str], policy: str, excused_bf16: int = 0) -> str:
    """Why the library kernels a profile recorded (``names``) compute below ``policy``, or "". Judged
    only where the problem's own tensors are all fp32 (a 16-bit problem's library calls are 16-bit).

    ``excused_bf16``: how many bf16 launches the runtime's split-bf16 GEMM accounts for under a tf32
    claim (three bf16 products of split operands: 30-60x below TF32's error). Only bf16, never fp16
    (fp16 has TF32's mantissa: its error statistics cannot tell it apart), and a program computing in
    plain bf16 is caught by the error statistics, bf16 being tf32's lower policy."""
    claim = RANK.get(policy, 0)
    below: dict[str, list[str]] = {}
    spare = excused_bf16 if policy == "tf32" else 0
    for n in names:
        math = kernel_math(n)
        if math == "bf16" and spare > 0:
            spare -= 1
            continue
        if math and RANK[math] < claim:
            below.setdefault(math, []).append(n)
    if not below:
        return ""
    math = min(below, key=lambda m: RANK[m])
    shown = sorted(set(below[math]))
    return (f"{len(below[math])} library kernel launch(es) under a {policy} claim compute in {math}: "
            + ", ".join(n[:90] for n in shown[:3]) + (f" and {len(shown) - 3} more" if len(shown) > 3 else ""))


def math_summary(calls: Sequence[dict[str, Any]]) -> str:
    """The library's arithmetic as the runner saw it, for the report ("st_gemm: tf32 x12; st_conv: fp32 x3")."""
    parts = []
    for c in calls:
        if c.get("fn") in MATH_CALLS:
            parts.append(f"{c['fn']}: {ST_POLICY.get(int(c.get('policy', -1)), '?')} x{c.get('count', 1)}")
    return "; ".join(parts)


__all__ = ["LOWER", "RANK", "SPLIT_BF16_LAUNCHES", "PrecisionEvidence", "library_evidence", "kernel_math", "kernel_evidence",
           "math_summary"]
