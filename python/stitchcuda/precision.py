"""Precision policies: one table that says what each policy means, for every stage.

A policy is chosen per program (and may be raised per task by the loop's precision repair):

============  =========  ==============  ============  =========  ===============================
policy        storage    GEMM compute    tensor cores  tolerance  PyTorch baseline at the policy
============  =========  ==============  ============  =========  ===============================
``fp32``      float32    fp32 (exact)    no            1e-4       TF32 off (matmul and cuDNN)
``tf32``      float32    TF32            yes           1e-2       TF32 on (matmul and cuDNN)
``bf16``      bfloat16   fp32 accumulate yes           1e-2       autocast to bfloat16
``fp16``      float16    fp32 accumulate yes           1e-2       autocast to float16
============  =========  ==============  ============  =========  ===============================

Storage applies to float32 tensors of the reference; other dtypes keep their own. Elementwise
and reduction math is fp32 under every policy. The tolerance is KernelBench's allclose
``atol = rtol``. The C enum ``st_policy`` (``stitchrt.h``) is checked against this table by a test.

The planner, the Coder, the Verifier and the binding read these objects; nothing else spells out
what ``"tf32"`` means: which is stricter (``rank``: fp32 first), which policy a claim is checked
against (``lower``: a tf32 claim must beat bf16's error statistics), and which task strategies a
policy rounds (``rounds``: under tf32 only matrix work; under 16-bit storage every stored result).
``baseline()`` is PyTorch *allowed* the policy (what the speed baselines run); ``emulated()`` is the
policy's arithmetic itself, whichever engine runs (the Verifier's yardstick for inputs on which
even that arithmetic misses the truth).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class Policy:
    """What one precision policy means (see the module docstring's table)."""

    name: str
    storage: str          #: dtype that float32 tensors are stored in
    tf32: bool            #: float32 GEMMs and attention on TF32 tensor cores
    tensor_cores: bool    #: matrix work may use tensor cores at all
    tolerance: float      #: allclose atol = rtol the Verifier judges at
    c_enum: str           #: the runtime's st_policy name
    c_value: int          #: ... and its value
    text: str             #: one line for reports and generated headers
    rank: int = 0         #: precision order: 0 the strictest (fp32), higher rounds more
    lower: str | None = None                  #: the next-lower policy a claim of this one is checked against
    rounds: tuple[str, ...] = ()              #: task strategies whose arithmetic this policy rounds

    def __str__(self) -> str:
        return self.name

    def storage_of(self, dtype: str) -> str:
        """The dtype a reference tensor of ``dtype`` is stored in under this policy."""
        return self.storage if dtype == "float32" else dtype

    @property
    def sixteen_bit(self) -> bool:
        return self.storage != "float32"

    @property
    def exact(self) -> bool:
        """fp32 math end to end: no TF32, no 16-bit storage."""
        return not self.tensor_cores

    @contextlib.contextmanager
    def baseline(self) -> Iterator[None]:
        """PyTorch allowed this policy's precision: TF32 flags for tf32, autocast for bf16 / fp16,
        TF32 off for fp32 (as the reference is computed). Needs PyTorch."""
        import torch

        b = torch.backends
        old = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, torch.get_float32_matmul_precision())
        b.cuda.matmul.allow_tf32 = self.tf32
        b.cudnn.allow_tf32 = self.tf32
        torch.set_float32_matmul_precision("high" if self.tf32 else "highest")
        try:
            if self.sixteen_bit:
                dtype = torch.bfloat16 if self.storage == "bfloat16" else torch.float16
                with torch.autocast(device_type="cuda", dtype=dtype):
                    yield
            else:
                yield
        finally:
            b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 = old[0], old[1]
            torch.set_float32_matmul_precision(old[2])

    @contextlib.contextmanager
    def emulated(self, how: str = "round") -> Iterator[None]:
        """PyTorch computing as this policy's arithmetic does on whichever engine runs it. Under tf32
        the float32 operands of every matrix product and convolution are rounded to TF32 (10 mantissa
        bits, to nearest) and the products taken in fp32: what a TF32 tensor core multiplies, with no
        engine choice in it. baseline() cannot promise that: cuDNN may run a TF32-allowed convolution
        without TF32 (bit-identical to fp32 on 2:73's shape), and then PyTorch "at tf32" shows none of
        TF32's error. ``how`` (one of ``EMULATIONS``): ``"round"`` as above; ``"truncate"``: the
        operands truncated instead, as an engine that hands the tensor cores fp32 values unconverted
        has them (an error that is a bias, not noise: where outputs average many products it
        survives, 100x the rounded operands' on a group norm's mean).
        Other policies: as baseline() (autocast already rounds the operands itself). Runs on any
        device. Needs PyTorch."""
        if how not in EMULATIONS:
            raise ValueError(f"emulated(how={how!r}): one of {', '.join(EMULATIONS)}")
        if not self.tf32:
            with self.baseline():
                yield
            return
        with get("fp32").baseline(), _tf32_products(truncate=how == "truncate"):
            yield


#: How Policy.emulated() hands a product its operands: rounded to the policy's format (to nearest,
#: as cuBLAS and cuDNN convert them) or truncated (an engine giving the tensor cores fp32 bits as they
#: are). The one spelling of that choice, down to the Verifier's reference protocol
#: (``forward_at(emulated=...)``, where "" is PyTorch's own arithmetic at the policy).
EMULATIONS = ("round", "truncate")

#: strategies whose products run on tensor cores when the policy allows them (cuBLASLt, cuDNN, the
#: attention, convolution and recurrent templates): what tf32 rounds, and what precision repair may raise
_MATRIX = ("cublaslt_gemm", "attention_template", "cudnn_conv", "conv_template", "recurrent_template")
_STORED = _MATRIX + ("reduction_template", "custom_kernel", "elementwise_kernel")

FP32 = Policy("fp32", "float32", tf32=False, tensor_cores=False, tolerance=1e-4, c_enum="ST_POLICY_FP32", c_value=0,
              text="fp32 (fp32 math, no TF32 rounding)", rank=0, lower="tf32")
TF32 = Policy("tf32", "float32", tf32=True, tensor_cores=True, tolerance=1e-2, c_enum="ST_POLICY_TF32", c_value=1,
              text="tf32 (fp32 storage, TF32 tensor-core GEMMs)", rank=1, lower="bf16", rounds=_MATRIX)
BF16 = Policy("bf16", "bfloat16", tf32=False, tensor_cores=True, tolerance=1e-2, c_enum="ST_POLICY_BF16", c_value=2,
              text="bf16 (bfloat16 storage, fp32 accumulation)", rank=2, rounds=_STORED)
FP16 = Policy("fp16", "float16", tf32=False, tensor_cores=True, tolerance=1e-2, c_enum="ST_POLICY_FP16", c_value=3,
              text="fp16 (float16 storage, fp32 accumulation)", rank=3, rounds=_STORED)

POLICIES: dict[str, Policy] = {p.name: p for p in (FP32, TF32, BF16, FP16)}
NAMES: tuple[str, ...] = tuple(POLICIES)


def get(policy: "str | Policy") -> Policy:
    """The :class:`Policy` named ``policy`` (a Policy is returned as is); ArgumentError (a
    ValueError) names the choices."""
    if isinstance(policy, Policy):
        return policy
    p = POLICIES.get(str(policy))
    if p is None:
        from .errors import ArgumentError

        raise ArgumentError(f"unknown precision policy {policy!r}; expected one of {', '.join(NAMES)}")
    return p


def stricter(a: "str | Policy", b: "str | Policy") -> Policy:
    """The stricter of two policies (the one that rounds less: fp32 over tf32 over bf16 over fp16)."""
    pa, pb = get(a), get(b)
    return pa if pa.rank <= pb.rank else pb


def fp32_exact() -> contextlib.AbstractContextManager[None]:
    """PyTorch's fp32 without TF32 (matmul and cuDNN): how references are computed."""
    return FP32.baseline()


#: The ATen ops whose float32 operands a TF32 tensor core rounds (their positions in the call); what
#: they compute from the rounded operands is fp32. Composite ops (linear, matmul, conv2d, einsum)
#: reach these. Not rounded: matrix-vector products (no tensor cores). PyTorch's fused attention
#: (whichever backend scaled_dot_product_attention picks) has its query, key and value rounded: the
#: operands of its two products under TF32 (the probabilities, P in P·V, stay fp32 — a TF32
#: attention rounds them too, an error of the same size as V's). Without them the emulation of an
#: attention was fp32-grade (PyTorch's memory-efficient attention splits each fp32 operand into two
#: TF32 parts on sm_80 and later, CUTLASS's OpMultiplyAddFastF32; its math path is fp32), and a TF32
#: attention on inputs where TF32 itself cannot do better (logits of order 1e4: 1:97's inputs
#: scaled x89) had no yardstick to be judged against.
_ATTENTION_QKV = (0, 1, 2)
_TF32_OPERANDS = {"mm": (0, 1), "addmm": (1, 2), "bmm": (0, 1), "baddbmm": (1, 2), "addbmm": (1, 2),
                  "convolution": (0, 1), "_convolution": (0, 1),
                  **{op: _ATTENTION_QKV for op in (
                      "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                      "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                      "_scaled_dot_product_attention_math", "_scaled_dot_product_fused_attention_overrideable",
                      "_efficient_attention_forward", "_flash_attention_forward")}}


def round_tf32(t, truncate: bool = False):
    """``t`` (float32) rounded to TF32's 10 mantissa bits, to nearest, ties away from zero (as
    ``cvt.rna.tf32.f32``), or with ``truncate`` toward zero (the low 13 bits dropped: what a tensor
    core makes of fp32 registers given to it unconverted); non-finite values unchanged. A new
    tensor. (The plan interpreter keeps its own, ties to even on float64 values:
    ``check.interp.round_tf32``.)"""
    import torch

    bits = t.contiguous().view(torch.int32)
    r = ((bits if truncate else bits + 0x1000) & ~0x1FFF).view(torch.float32).view(t.shape)
    return torch.where(torch.isfinite(t), r, t)


def _tf32_products(truncate: bool = False):
    """A dispatch mode rounding the operands of the products in ``_TF32_OPERANDS`` (Policy.emulated),
    to nearest or (``truncate``) toward zero."""
    from torch.utils._python_dispatch import TorchDispatchMode
    import torch

    class TF32Products(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            where = _TF32_OPERANDS.get(func.overloadpacket.__name__)
            if where:
                args = list(args)
                for k in where:
                    a = args[k] if k < len(args) else None
                    if isinstance(a, torch.Tensor) and a.dtype == torch.float32:
                        args[k] = round_tf32(a, truncate)
            return func(*args, **(kwargs or {}))

    return TF32Products()


__all__ = ["Policy", "POLICIES", "NAMES", "FP32", "TF32", "BF16", "FP16", "EMULATIONS", "get", "stricter",
           "fp32_exact", "round_tf32"]
