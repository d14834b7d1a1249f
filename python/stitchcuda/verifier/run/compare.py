"""Comparing a candidate's outputs with the reference's: on the device, in chunks, in float64.

Every function here walks its tensors in chunks of :data:`CHUNK` elements and converts one chunk
at a time to float64, so a multi-GiB output never has a float64 twin (a 6 GiB fp32 output once ran
an H200 out of memory when it did), and per-chunk results stay on the device until the end (one
synchronisation per comparison, not one per chunk).

The tolerance of a policy (:mod:`stitchcuda.precision`) is KernelBench's ``allclose`` with
``atol = rtol = tol``, with one change: an output whose typical magnitude (RMS of the reference)
is below 1 is judged relative to that magnitude, ``atol = tol * rms`` (:func:`atol_for`). With
the plain ``atol`` an output that lives below the tolerance (values around 1e-4 under a 1e-2
policy) would be passed by zeros or by any constant; outputs of magnitude 1 and above are judged
exactly as before.
"""

from __future__ import annotations

from ...dtypes import torch_dtype  # noqa: F401  (re-exported: the one dtype table)

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

#: Elements per chunk (float64 temporaries of 256 MiB each).
CHUNK = 1 << 25

#: Below this RMS an output is treated as identically zero (atol = tol * SCALE_FLOOR).
SCALE_FLOOR = 1e-30

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits as a same-size integer tensor (NaN-safe equality)."""
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    return t.view(_INT_VIEW[t.element_size()])


def _chunks(n: int):
    for lo in range(0, n, CHUNK):
        yield lo, min(n, lo + CHUNK)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1)


def output_scale(ref: torch.Tensor) -> float:
    """RMS of the finite elements of ``ref`` (0.0 when there are none)."""
    rf = _flat(ref)
    if rf.numel() == 0:
        return 0.0
    acc = torch.zeros((), dtype=torch.float64, device=rf.device)
    cnt = torch.zeros((), dtype=torch.int64, device=rf.device)
    for lo, hi in _chunks(rf.numel()):
        r = rf[lo:hi].double()
        fin = torch.isfinite(r)
        acc += torch.where(fin, r * r, torch.zeros_like(r)).sum()
        cnt += fin.sum()
    n = int(cnt.item())
    return (float(acc.item()) / n) ** 0.5 if n else 0.0


def atol_for(tol: float, scale: float) -> float:
    """The absolute tolerance for an output of RMS ``scale`` (module docstring)."""
    return tol * min(1.0, max(scale, SCALE_FLOOR))


#: Where fp32 itself comes near the bound, an output is held to fp32's own accuracy: its worst distance
#: from float64 (in bounds) within this multiple of the fp32 reference's (:func:`within_fp32_own`).
FP32_OWN_SLACK = 2.0


def within_fp32_own(out64: "Errors", ref32_64: "Errors") -> bool:
    """Whether an output that misses the bound against float64 (``out64``) is as close to the truth as
    fp32 arithmetic gets there: all finite, and its worst distance within :data:`FP32_OWN_SLACK` x
    the fp32 reference's own (``ref32_64``, the fp32 reference against float64, itself inside the
    bound). Where the fp32 reference itself misses float64 elementwise, the problem is ill-conditioned
    beyond the arithmetic it uses (sums whose terms cancel to a millionth of their size): no fp32
    program can be held to the elementwise bound there, and the Verifier's judges (the trials', the
    timed calls') take the norm-relative error instead. A deep net at fp32 whose reference comes
    to 0.8 of the bound from the truth leaves an equally accurate program a coin's chance of crossing
    it (resnet50 at fp32: the program's mean error against float64 8.72e-4, PyTorch's 8.60e-4, one
    element of 32,768 at 1.3x the bound on one draw). Where fp32 is far inside the bound (every
    well-conditioned problem, and every problem under a 1e-2 policy) twice its distance is still
    inside it: nothing more passes."""
    return out64.bad_nonfinite == 0 and ref32_64.passed and out64.worst_ratio <= FP32_OWN_SLACK * ref32_64.worst_ratio


@dataclass(frozen=True)
class OutputJudgement:
    """One output as every judge of the Verifier starts judging it (:func:`judge_output`)."""

    passed: bool
    how: str  # "elementwise", "float64" or "fp32-own" (a judge past this chain names its own: "norm-relative")
    e: "Errors"  # against the fp32 reference
    e64: "Errors | None" = None  # against float64, where it was asked for
    own: "Errors | None" = None  # the fp32 reference against float64, where it was asked for
    ref64: torch.Tensor | None = None


def judge_output(out: torch.Tensor, ref: torch.Tensor, tol: float,
                 truth: Callable[[], torch.Tensor | None]) -> OutputJudgement:
    """The chain every judge of an output starts with (the trials' :meth:`.session.Session.judge`, the
    timed calls' :func:`.timed_calls.judge_outputs`): elementwise at ``tol`` against the fp32 reference;
    a finite floating output that misses it, against float64 (``truth()``, asked for only then; None
    where none fits); one that misses that too, within fp32's own accuracy (:func:`within_fp32_own`).
    Where the fp32 reference itself misses float64 (``own`` not passed), each judge decides on the
    norm-relative error by its own rule."""
    e = errors(out, ref, tol)
    if e.passed or not out.dtype.is_floating_point or e.bad_nonfinite:
        return OutputJudgement(e.passed, "elementwise", e)
    ref64 = truth()
    if ref64 is None:
        return OutputJudgement(False, "elementwise", e)
    e64 = errors(out, ref64, tol, e.atol)
    if e64.passed:
        return OutputJudgement(True, "float64", e, e64, None, ref64)
    own = errors(ref, ref64, tol, e.atol)  # the fp32 reference's own distance from the truth: only now
    ok = within_fp32_own(e64, own)
    return OutputJudgement(ok, "fp32-own" if ok else "elementwise", e, e64, own, ref64)


def bound(ref_abs, tol: float, atol: float):
    """The Verifier's bound on an element's error, ``atol + tol |ref|`` (numbers or tensors): the
    one formula every judge of an error uses (this module, the judgement's ratio, the TF32 model)."""
    return atol + tol * ref_abs


@dataclass(frozen=True)
class Errors:
    """One output against one reference: the verdict of ``|out - ref| <= atol + tol |ref|`` over every
    element, with the worst element (the first non-finite mismatch, else the worst violation, else
    the largest error)."""

    passed: bool
    max_abs: float
    mean_abs: float
    where: tuple[int, ...]
    expected: float | None
    got: float | None
    bad_nonfinite: int  # NaN/Inf where the reference is finite, or a non-finite reference not matched
    n_bad: int  # elements out of tolerance (non-finite mismatches included)
    atol: float
    worst_ratio: float = 0.0  # the largest |out - ref| / (atol + tol |ref|) over the finite elements


def _index(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    out = []
    for s in reversed(shape):
        out.append(flat % s if s else 0)
        flat = flat // s if s else 0
    return tuple(reversed(out))


def errors(out: torch.Tensor, ref: torch.Tensor, tol: float, atol: float | None = None) -> Errors:
    """Elementwise allclose of ``out`` against ``ref`` (``atol`` defaults to :func:`atol_for` of the
    reference's scale). Non-finite reference values must be matched exactly (the same infinity, NaN
    for NaN); a non-finite output where the reference is finite never passes."""
    if out.numel() == 0:
        return Errors(True, 0.0, 0.0, (), None, None, 0, 0, tol)
    ref = ref.to(out.device)
    if atol is None:
        atol = atol_for(tol, output_scale(ref))
    of, rf = _flat(out), _flat(ref)
    dev = of.device
    n_chunks = (of.numel() + CHUNK - 1) // CHUNK
    max_err = torch.zeros(n_chunks, dtype=torch.float64, device=dev)
    arg_err = torch.zeros(n_chunks, dtype=torch.int64, device=dev)
    max_ratio = torch.zeros(n_chunks, dtype=torch.float64, device=dev)
    arg_ratio = torch.zeros(n_chunks, dtype=torch.int64, device=dev)
    first_nf = torch.full((n_chunks,), -1, dtype=torch.int64, device=dev)
    sum_err = torch.zeros((), dtype=torch.float64, device=dev)
    n_fin = torch.zeros((), dtype=torch.int64, device=dev)
    n_nf = torch.zeros((), dtype=torch.int64, device=dev)
    n_bad = torch.zeros((), dtype=torch.int64, device=dev)
    for k, (lo, hi) in enumerate(_chunks(of.numel())):
        o, r = of[lo:hi].double(), rf[lo:hi].double()
        fin_r, fin_o = torch.isfinite(r), torch.isfinite(o)
        both = fin_r & fin_o
        err = torch.where(both, (o - r).abs(), torch.zeros_like(o))
        lim = bound(torch.where(fin_r, r.abs(), torch.zeros_like(r)), tol, atol)
        nonfinite_bad = (fin_r & ~fin_o) | (~fin_r & ~((o == r) | (torch.isnan(o) & torch.isnan(r))))
        ratio = err / lim
        n_bad += (both & (err > lim)).sum() + nonfinite_bad.sum()
        n_nf += nonfinite_bad.sum()
        hit = torch.nonzero(nonfinite_bad)
        if hit.numel():  # rare: only a failing output pays this synchronisation
            first_nf[k] = lo + hit[0, 0]
        m, i = err.max(0)
        max_err[k], arg_err[k] = m, lo + i
        m, i = ratio.max(0)
        max_ratio[k], arg_ratio[k] = m, lo + i
        sum_err += err.sum()
        n_fin += both.sum()
    stats = torch.stack([max_err.max(), sum_err, n_fin.double(), n_nf.double(), n_bad.double()]).tolist()
    worst_err, total_err, count, nonfinite, bad = stats
    nf = [int(v) for v in first_nf.tolist() if v >= 0]
    k_ratio = int(max_ratio.argmax().item())
    if nf:
        flat = nf[0]
    elif max_ratio[k_ratio].item() > 1.0:
        flat = int(arg_ratio[k_ratio].item())
    else:
        flat = int(arg_err[int(max_err.argmax().item())].item())
    return Errors(passed=bad == 0, max_abs=worst_err, mean_abs=total_err / count if count else 0.0,
                  where=_index(flat, tuple(out.shape)), expected=float(rf[flat].double().item()),
                  got=float(of[flat].double().item()), bad_nonfinite=int(nonfinite), n_bad=int(bad), atol=atol,
                  worst_ratio=float(max_ratio[k_ratio].item()))


def close_mask(out: torch.Tensor, ref: torch.Tensor, tol: float, atol: float | None = None) -> torch.Tensor:
    """Boolean mask of the elements of ``out`` within tolerance of ``ref`` (as :func:`errors` judges)."""
    ref = ref.to(out.device)
    if atol is None:
        atol = atol_for(tol, output_scale(ref))
    of, rf = _flat(out), _flat(ref)
    mask = torch.empty(of.shape, dtype=torch.bool, device=of.device)
    for lo, hi in _chunks(of.numel()):
        o, r = of[lo:hi].double(), rf[lo:hi].double()
        fin_r, fin_o = torch.isfinite(r), torch.isfinite(o)
        ok = fin_r & fin_o & ((o - r).abs() <= bound(r.abs(), tol, atol))
        mask[lo:hi] = ok | (~fin_r & ((o == r) | (torch.isnan(o) & torch.isnan(r))))
    return mask.reshape(out.shape)


def norm_relative(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` over the finite reference elements; inf when the output is
    non-finite where the reference is finite."""
    of, rf = _flat(out), _flat(ref.to(out.device))
    num = torch.zeros((), dtype=torch.float64, device=of.device)
    den = torch.zeros((), dtype=torch.float64, device=of.device)
    bad = torch.zeros((), dtype=torch.int64, device=of.device)
    for lo, hi in _chunks(of.numel()):
        o, r = of[lo:hi].double(), rf[lo:hi].double()
        fin_r = torch.isfinite(r)
        bad += (fin_r & ~torch.isfinite(o)).sum()
        d = torch.where(fin_r, o - r, torch.zeros_like(o))
        num += torch.where(torch.isfinite(d), d * d, torch.zeros_like(d)).sum()
        den += torch.where(fin_r, r * r, torch.zeros_like(r)).sum()
    num_, den_, bad_ = torch.stack([num, den, bad.double()]).tolist()
    if bad_:
        return float("inf")
    return num_ ** 0.5 / max(den_ ** 0.5, 1e-300)


def mean_abs(t: torch.Tensor) -> float:
    """Mean ``|x|`` over the finite elements of ``t``."""
    tf = _flat(t)
    acc = torch.zeros((), dtype=torch.float64, device=tf.device)
    cnt = torch.zeros((), dtype=torch.int64, device=tf.device)
    for lo, hi in _chunks(tf.numel()):
        c = tf[lo:hi].double()
        fin = torch.isfinite(c)
        acc += torch.where(fin, c.abs(), torch.zeros_like(c)).sum()
        cnt += fin.sum()
    a, n = torch.stack([acc, cnt.double()]).tolist()
    return a / n if n else 0.0


def mean_abs_error(out: torch.Tensor, truth: torch.Tensor) -> float:
    """Mean ``|out - truth|`` over the elements where both are finite."""
    of, tf = _flat(out), _flat(truth.to(out.device))
    acc = torch.zeros((), dtype=torch.float64, device=of.device)
    cnt = torch.zeros((), dtype=torch.int64, device=of.device)
    for lo, hi in _chunks(of.numel()):
        o, t = of[lo:hi].double(), tf[lo:hi].double()
        both = torch.isfinite(o) & torch.isfinite(t)
        acc += torch.where(both, (o - t).abs(), torch.zeros_like(o)).sum()
        cnt += both.sum()
    a, c = torch.stack([acc, cnt.double()]).tolist()
    return a / c if c else 0.0


def max_finite_abs(t: torch.Tensor) -> float:
    """The largest ``|x|`` over the finite elements of ``t`` (0.0 when there are none)."""
    tf = _flat(t)
    best = torch.zeros((), dtype=torch.float64, device=tf.device)
    for lo, hi in _chunks(tf.numel()):
        c = tf[lo:hi].double().abs()
        best = torch.maximum(best, torch.where(torch.isfinite(c), c, torch.zeros_like(c)).max())
    return float(best.item()) if tf.numel() else 0.0


def same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Boolean mask: elements of ``a`` bit-identical to those of ``b``."""
    return bits(a) == bits(b)


def fingerprint(t: torch.Tensor, key: int) -> int:
    """A keyed hash of the tensor's bits: ``sum((b_i + k1) * (i * k2 + k3)) mod 2**64``. The key is
    secret to the Verifier, so a program cannot change its inputs in a way that keeps the hash."""
    k1, k2, k3 = (key & 0xFFFF) | 1, ((key >> 16) & 0xFFFFFF) | 1, (key >> 40) & 0xFFFFFF
    b = _flat(bits(t))
    acc = torch.zeros((), dtype=torch.int64, device=b.device)
    for lo, hi in _chunks(b.numel()):
        v = b[lo:hi].to(torch.int64) + k1
        idx = torch.arange(lo, hi, dtype=torch.int64, device=b.device) * k2 + k3
        acc += (v * idx).sum()  # int64 arithmetic wraps: a hash, not a sum
    return int(acc.item())


__all__ = ["CHUNK", "SCALE_FLOOR", "torch_dtype", "bits", "output_scale", "atol_for", "Errors", "errors", "close_mask",
           "OutputJudgement", "judge_output", "within_fp32_own", "norm_relative", "mean_abs", "mean_abs_error",
           "max_finite_abs", "same_bits", "fingerprint"]
