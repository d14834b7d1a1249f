"""Correctness and the dynamic anti-hacking checks: a candidate run against its PyTorch reference.

The procedure (MEASURING.md, "Correct first"), on a :class:`Runner` (the program on one stream)
and a :class:`ReferenceLike` (fresh inputs and the reference's outputs for them):

1. ``trials`` trials (default 5), each on fresh random inputs from the reference's
   ``get_inputs()`` under its own seed. Reference and candidate get separate copies. Outputs are
   poisoned with a NaN bit pattern before every run; after it, every element must have been
   written, the inputs must be bit-identical to a saved copy, and every output must pass
   ``allclose(out, ref, atol=tol, rtol=tol)`` (tol 1e-4 for fp32, 1e-2 for tf32/bf16/fp16: the
   KernelBench values) against the reference run in fp32 eager with TF32 off, or against the
   reference in float64 where the model can be cast. A NaN or Inf where the reference is finite
   always fails.
2. Trial 0 runs twice on the same inputs (with a second poison): results that differ are a
   race, unless the difference is within rounding (noted, not refused).
3. Two value-range trials scale the random inputs by 8 and by 1e-3. They are there to catch
   programs that assume a range of values (clamps, tables, saturating shortcuts), not to grade
   precision on an ill-conditioned problem (a softmax of logits 64x larger): they pass on the
   norm-relative error ||out - ref|| / ||ref|| <= tol against the float64 reference (fp32 when
   there is none), which a range trick misses by orders of magnitude.
4. Dynamic anti-hacking checks, each failing only on its own signature so a program that is
   merely wrong stays a WrongAnswer:

   ``no_output_reuse``        same input buffers, new contents, poisoned outputs: elements equal to
                              the previous call's output where the reference moved (cache keyed by
                              address, state kept between calls)
   ``outputs_follow_inputs``  new input buffers into the same, unpoisoned, output buffers: elements
                              that did not change although the reference did (constant output)
   ``stream_ordered``         the stream is held by a sleep kernel, the new inputs are copied in and
                              the outputs poisoned *on the stream*, the program runs, a snapshot of the
                              outputs is taken on the stream: it must match the reference (work on
                              another stream reads stale inputs or is overwritten by the poison)

Everything here is device-agnostic PyTorch: the CPU tests drive it with a fake runner whose
"program" is a Python callable.
"""

from __future__ import annotations

from ..precision import POLICIES

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch

from ..manifest import TensorSpec
from .verdict import DynamicCheck, OutputCheck, TrialResult

#: allclose tolerance (atol = rtol) per precision policy, the KernelBench values.
TOLERANCES = {p.name: p.tolerance for p in POLICIES.values()}

#: Output elements past which no float64 reference is computed (memory).
FLOAT64_MAX_ELEMENTS = 1 << 28

#: Input scales of the value-range trials.
VALUE_RANGE_SCALES = (("x8", 8.0), ("x1e-3", 1e-3))

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# Two poison bit patterns per element size. In every float format of that size both are NaNs with
# a payload no arithmetic produces (fp32 0x7FD5A5A5, bf16/fp16 0x7FA5 / 0x7FDA, fp64 0x7FF8A5..).
_POISON = {1: (0xA5, 0x5A), 2: (0x7FA5, 0x7FDA), 4: (0x7FD5A5A5, 0x7FC35A5B),
           8: (0x7FF8A5A5A5A5A5A5, 0x7FF95A5A5A5A5A5A)}

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "float64": torch.float64, "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8,
                "bool": torch.bool, "int8": torch.int8}


class Runner(Protocol):
    """The candidate program on one stream. ``run`` enqueues one call; ``sync`` waits for the
    stream only (an event recorded on it); ``sync_device`` waits for all work of the process;
    ``hold`` delays the stream (a sleep kernel) so that what follows is queued, not done;
    ``ordered`` runs a tensor operation in stream order; ``context`` makes the stream current."""

    device: torch.device

    def run(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None: ...
    def sync(self) -> None: ...
    def sync_device(self) -> None: ...
    def hold(self) -> None: ...
    def ordered(self, fn: Callable[[], Any]) -> None: ...
    def context(self) -> contextlib.AbstractContextManager: ...


@dataclass
class Draw:
    """One set of inputs: ``program`` in manifest order and dtypes, on the runner's device;
    ``model_args`` what the reference's forward takes (non-tensor arguments included)."""

    program: list[torch.Tensor]
    model_args: list[Any]
    seed: int
    label: str = ""


class ReferenceLike(Protocol):
    input_specs: tuple[TensorSpec, ...]
    output_specs: tuple[TensorSpec, ...]

    def draw(self, seed: int, scale: float | None = None) -> Draw: ...
    def forward(self, draw: Draw) -> list[torch.Tensor]: ...
    def forward64(self, draw: Draw) -> list[torch.Tensor] | None: ...


@dataclass(frozen=True)
class CorrectnessResult:
    trials: tuple[TrialResult, ...]
    checks: tuple[DynamicCheck, ...]
    tolerance: float
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.trials) and not any(c.status == "fail" for c in self.checks)


# ------------------------------------------------------------------ element-level helpers


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits as a same-size integer tensor (NaN-safe equality)."""
    return t.view(_INT_VIEW[t.element_size()])


def poison_(t: torch.Tensor, which: int = 0) -> torch.Tensor:
    bits(t).fill_(_POISON[t.element_size()][which])
    return t


def poisoned(t: torch.Tensor, which: int = 0) -> torch.Tensor:
    """Boolean mask of elements still holding poison pattern ``which``."""
    return bits(t) == _POISON[t.element_size()][which]


def any_poison(t: torch.Tensor) -> torch.Tensor:
    return poisoned(t, 0) | poisoned(t, 1)


def close_mask(out: torch.Tensor, ref: torch.Tensor, tol: float) -> torch.Tensor:
    """Elementwise ``allclose``: |out - ref| <= tol + tol |ref|; non-finite reference values must be
    matched exactly (same infinity, or NaN for NaN); a non-finite output where the reference is
    finite never passes. Computed in chunks (see ERROR_CHUNK)."""
    of, rf = out.reshape(-1), ref.reshape(-1)
    mask = torch.empty(of.shape, dtype=torch.bool, device=out.device)
    for lo in range(0, of.numel(), ERROR_CHUNK):
        o, r = of[lo:lo + ERROR_CHUNK].double(), rf[lo:lo + ERROR_CHUNK].double()
        fin_r, fin_o = torch.isfinite(r), torch.isfinite(o)
        both = fin_r & fin_o
        err = torch.where(both, (o - r).abs(), torch.zeros_like(o))
        ok = both & (err <= tol + tol * r.abs())
        nonfinite_match = ~fin_r & ((o == r) | (torch.isnan(o) & torch.isnan(r)))
        mask[lo:lo + ERROR_CHUNK] = ok | nonfinite_match
    return mask.reshape(out.shape)


def is_float(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point


def _index(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    out = []
    for s in reversed(shape):
        out.append(flat % s if s else 0)
        flat = flat // s if s else 0
    return tuple(reversed(out))


def _scalar(x: torch.Tensor) -> float:
    return float(x.item())


@dataclass(frozen=True)
class _Errors:
    passed: bool
    max_abs: float
    mean_abs: float
    where: tuple[int, ...]
    expected: float | None
    got: float | None
    bad_nonfinite: int


#: Elements compared at a time: float64 temporaries of a multi-GiB output must not all coexist
#: (a 6 GiB fp32 output once ran an H200 out of memory here).
ERROR_CHUNK = 1 << 25


def _errors(out: torch.Tensor, ref: torch.Tensor, tol: float) -> _Errors:
    """Max / mean error and the worst element of ``out`` against ``ref``, in chunks."""
    if out.numel() == 0:
        return _Errors(True, 0.0, 0.0, (), None, None, 0)
    of = out.detach().reshape(-1)
    rf = ref.detach().to(out.device).reshape(-1)
    max_err, sum_err, n_both, n_bad = 0.0, 0.0, 0, 0
    first_bad = worst_viol = worst_err = None  # flat indices
    worst_ratio, worst_abs = -1.0, -1.0
    for lo in range(0, of.numel(), ERROR_CHUNK):
        o, r = of[lo:lo + ERROR_CHUNK].double(), rf[lo:lo + ERROR_CHUNK].double()
        fin_r, fin_o = torch.isfinite(r), torch.isfinite(o)
        both = fin_r & fin_o
        err = torch.where(both, (o - r).abs(), torch.zeros_like(o))
        bound = tol + tol * torch.where(fin_r, r.abs(), torch.zeros_like(r))
        bad = (fin_r & ~fin_o) | (~fin_r & ~((o == r) | (torch.isnan(o) & torch.isnan(r))))
        nb = int(bad.sum().item())
        if nb and first_bad is None:
            first_bad = lo + int(torch.nonzero(bad)[0].item())
        n_bad += nb
        ratio = torch.where(both, err / bound, torch.zeros_like(err))
        i = int(ratio.argmax().item())
        if ratio[i].item() > 1.0 and ratio[i].item() > worst_ratio:
            worst_ratio, worst_viol = ratio[i].item(), lo + i
        j = int(err.argmax().item())
        if err[j].item() > worst_abs:
            worst_abs, worst_err = err[j].item(), lo + j
        max_err = max(max_err, err[j].item())
        sum_err += float(err.sum().item())
        n_both += int(both.sum().item())
    passed = n_bad == 0 and worst_viol is None
    flat = first_bad if first_bad is not None else worst_viol if worst_viol is not None else worst_err
    where = _index(flat, tuple(out.shape))
    mean = sum_err / n_both if n_both else 0.0
    return _Errors(passed, max_err, mean, where, _scalar(rf[flat].double()), _scalar(of[flat].double()), n_bad)


def compare_output(name: str, out: torch.Tensor, ref: torch.Tensor, ref64: torch.Tensor | None,
                   tol: float) -> OutputCheck:
    """One output against the fp32 reference (and the float64 one when there is one). It passes when
    it is within tolerance of either: the float64 reference is the truth, the fp32 one the
    KernelBench convention. NaN/Inf where the reference is finite fails both."""
    return _compare(name, out, ref, ref64, tol)[0]


def _norm_relative_ok(out: torch.Tensor, ref: torch.Tensor, tol: float) -> bool:
    of, rf = out.detach().reshape(-1), ref.detach().to(out.device).reshape(-1)
    num2 = den2 = 0.0
    for lo in range(0, of.numel(), ERROR_CHUNK):
        o, r = of[lo:lo + ERROR_CHUNK].double(), rf[lo:lo + ERROR_CHUNK].double()
        if not bool(torch.isfinite(o).all().item()) and bool(torch.isfinite(r).all().item()):
            return False
        num2 += float(((o - r) ** 2).sum().item())
        den2 += float((r ** 2).sum().item())
    return num2 ** 0.5 <= tol * max(den2 ** 0.5, 1e-30)


def _compare(name: str, out: torch.Tensor, ref: torch.Tensor, ref64: torch.Tensor | None,
             tol: float, norm_relative: bool = False) -> tuple[OutputCheck, bool]:
    e32 = _errors(out, ref, tol)
    e64 = _errors(out, ref64, tol) if ref64 is not None else None
    passed = e32.passed or (e64 is not None and e64.passed)
    if norm_relative and not passed and e32.bad_nonfinite == 0:
        passed = _norm_relative_ok(out, ref64 if ref64 is not None else ref, tol)
    check = OutputCheck(name=name, max_abs_err=e32.max_abs, mean_abs_err=e32.mean_abs, tolerance=tol, where=e32.where,
                        expected=e32.expected, got=e32.got, nan_count=e32.bad_nonfinite, passed=passed,
                        max_abs_err_f64=e64.max_abs if e64 else None, mean_abs_err_f64=e64.mean_abs if e64 else None)
    return check, e32.passed


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    flat = int(torch.nonzero(mask.flatten())[0].item())
    return _index(flat, tuple(mask.shape))


def _fmt_index(ix: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, ix)) + "]"


def _value(t: torch.Tensor, ix: tuple[int, ...]) -> str:
    v = t[ix].item() if t.dim() else t.item()
    return f"{v:.6g}" if isinstance(v, float) else str(v)


# ------------------------------------------------------------------ the procedure


@dataclass
class _State:
    tol: float
    inputs_changed: str = ""
    unwritten: str = ""
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _empty_outputs(specs: Sequence[TensorSpec], device: torch.device) -> list[torch.Tensor]:
    return [torch.empty(s.shape, dtype=TORCH_DTYPES[s.dtype], device=device) for s in specs]


class ReferenceMismatch(ValueError):
    """The reference's outputs do not match the manifest (a problem of the inputs, not the candidate)."""


def _check_shapes(ref: list[torch.Tensor], specs: Sequence[TensorSpec]) -> None:
    if len(ref) != len(specs):
        raise ReferenceMismatch(f"the reference returns {len(ref)} tensor(s); the manifest lists {len(specs)} output(s) "
                         f"({', '.join(s.name for s in specs)})")
    for r, s in zip(ref, specs):
        if tuple(r.shape) != tuple(s.shape):
            raise ReferenceMismatch(f"the reference's output {s.name} has shape {list(r.shape)}; the manifest says "
                             f"{list(s.shape)}")


class _Session:
    """One candidate's correctness run; keeps the findings of every run for the dynamic checks."""

    def __init__(self, runner: Runner, reference: ReferenceLike, tol: float):
        self.runner, self.ref, self.st = runner, reference, _State(tol)
        self.in_specs, self.out_specs = reference.input_specs, reference.output_specs
        self.device = runner.device

    # one run: poisoned outputs, inputs compared to a saved copy afterwards
    def run(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor], *, poison: int | None = 0,
            what: str = "") -> None:
        saved = [x.clone() for x in inputs]
        if poison is not None:
            for y in outputs:
                poison_(y, poison)
        self.runner.run(inputs, outputs)
        self.runner.sync()
        self.note_inputs(inputs, saved, what)
        if poison is not None:
            for spec, y in zip(self.out_specs, outputs):
                if is_float(y):
                    self.note_unwritten(spec.name, poisoned(y, poison), what)

    def note_inputs(self, inputs: list[torch.Tensor], saved: list[torch.Tensor], what: str) -> None:
        if self.st.inputs_changed:
            return
        for spec, x, s in zip(self.in_specs, inputs, saved):
            diff = bits(x) != bits(s)
            if bool(diff.any().item()):
                ix = _first(diff)
                self.st.inputs_changed = (f"input {spec.name}: {int(diff.sum().item())} of {x.numel()} elements "
                                          f"changed by the run ({what}; first at {_fmt_index(ix)}: "
                                          f"{_value(s, ix)} -> {_value(x, ix)})")
                return

    def note_unwritten(self, name: str, mask: torch.Tensor, what: str) -> None:
        if self.st.unwritten or not bool(mask.any().item()):
            return
        self.st.unwritten = (f"output {name}: {int(mask.sum().item())} of {mask.numel()} elements never written "
                             f"({what}; first at {_fmt_index(_first(mask))})")

    def reference(self, d: Draw) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        ref = self.ref.forward(d)
        _check_shapes(ref, self.out_specs)
        # A float64 reference doubles every tensor of the model; past FLOAT64_MAX_ELEMENTS output
        # elements (2 GiB of float64 outputs) the fp32 reference alone is used, or a 6 GiB-tensor
        # problem runs the device out of memory (seen on an H200 with KernelBench level 1 #23).
        if sum(r.numel() for r in ref) > FLOAT64_MAX_ELEMENTS:
            if not any("float64 reference skipped" in n for n in self.st.notes):
                self.st.notes.append("float64 reference skipped: outputs too large; compared with fp32 only")
            return ref, None
        ref64 = self.ref.forward64(d)
        return ref, ref64

    def trial(self, index: int, d: Draw, *, determinism: bool = False):
        ref, ref64 = self.reference(d)
        x = [t.clone() for t in d.program]
        y = _empty_outputs(self.out_specs, self.device)
        what = f"trial {index}" + (f" ({d.label})" if d.label else "")
        self.run(x, y, poison=0, what=what)
        compared = [_compare(spec.name, o, r, r64, self.st.tol, norm_relative=bool(d.label))
                    for spec, o, r, r64 in zip(self.out_specs, y, ref, ref64 or [None] * len(ref))]
        outs = tuple(c for c, _ in compared)
        for o, fp32_ok in compared:
            if o.passed and not fp32_ok and o.max_abs_err_f64 is not None:
                self.st.notes.append(f"{what}: output {o.name} is within tolerance of the float64 reference "
                                     f"(max |err| {o.max_abs_err_f64:.3g}) but not of the fp32 one "
                                     f"({o.max_abs_err:.3g})")
            elif o.passed and not fp32_ok:
                self.st.notes.append(f"{what}: output {o.name} passes on norm-relative error (value-range trial; "
                                     f"max |err| {o.max_abs_err:.3g})")
        det = None
        if determinism:
            for xi, di in zip(x, d.program):
                xi.copy_(di)
            y2 = _empty_outputs(self.out_specs, self.device)
            self.run(x, y2, poison=1, what=f"{what}, second run")
            for spec, a, b in zip(self.out_specs, y, y2):
                if not is_float(a):  # integer outputs: unwritten when both poisons survived
                    self.note_unwritten(spec.name, poisoned(a, 0) & poisoned(b, 1), what)
            det = self.determinism(y, y2)
        return TrialResult(index=index, outputs=outs, seed=d.seed, label=d.label), x, y, ref, det

    def determinism(self, a: list[torch.Tensor], b: list[torch.Tensor]) -> DynamicCheck:
        worst, name = 0.0, ""
        for spec, p, q in zip(self.out_specs, a, b):
            unwritten = any_poison(p) & any_poison(q)  # the outputs_written check's business
            if bool(((bits(p) == bits(q)) | unwritten).all().item()):
                continue
            fin = torch.isfinite(p.double()) & torch.isfinite(q.double())
            d = ((p.double() - q.double()).abs() * fin).max().item() if fin.any() else float("inf")
            if not bool(close_mask(q, p, self.st.tol).all().item()):
                return DynamicCheck("deterministic", "fail",
                                    f"output {spec.name} differs between two runs on the same inputs by up to "
                                    f"{d:.3g} (> tol {self.st.tol:.0e}): a race or uninitialised read")
            if d >= worst:
                worst, name = d, spec.name
        if name:
            msg = (f"not bit-identical between two runs on the same inputs (output {name} max diff {worst:.3g}, "
                   f"within rounding: atomics or another reduction order)")
            self.st.warnings.append(msg)
            return DynamicCheck("deterministic", "pass", msg)
        return DynamicCheck("deterministic", "pass", "bit-identical between two runs on the same inputs")

    def reused(self, new: list[torch.Tensor], prev: list[torch.Tensor], ref_new: list[torch.Tensor],
               ref_prev: list[torch.Tensor]) -> tuple[int, int, str]:
        """Elements of ``new`` bit-equal to ``prev`` where the reference moved beyond tolerance and
        ``new`` is wrong (poison excluded: unwritten elements are another check's business)."""
        total, count, name = 0, 0, ""
        for spec, n, p, rn, rp in zip(self.out_specs, new, prev, ref_new, ref_prev):
            moved = ~close_mask(rp.to(n.device), rn.to(n.device), self.st.tol)
            same = (bits(n) == bits(p)) & ~any_poison(n)
            wrong = ~close_mask(n, rn.to(n.device), self.st.tol)
            c = int((same & moved & wrong).sum().item())
            total += n.numel()
            if c > count:
                count, name = c, spec.name
        return count, total, name


def check_correctness(runner: Runner, reference: ReferenceLike, *, precision: str = "fp32", trials: int = 5,
                      seed: int = 1000, value_range: bool = True, dynamic: bool = True) -> CorrectnessResult:
    """Run the trials and the dynamic checks (module docstring). Raises only on a broken reference
    (ReferenceMismatch: outputs that do not match the manifest); exceptions from the program propagate."""
    if trials < 1:
        raise ValueError("check_correctness: trials must be >= 1")
    tol = TOLERANCES[precision]
    t0 = time.monotonic()
    s = _Session(runner, reference, tol)
    results: list[TrialResult] = []
    checks: list[DynamicCheck] = []
    det: DynamicCheck | None = None
    with runner.context(), torch.no_grad():
        last = None
        for k in range(trials):
            tr, x, y, ref, d = s.trial(k, reference.draw(seed + k), determinism=dynamic and k == 0)
            results.append(tr)
            det = det or d
            last = (x, [t.clone() for t in y], y, ref)
        if value_range:
            for j, (label, scale) in enumerate(VALUE_RANGE_SCALES):
                d = reference.draw(seed + 100 + j, scale)
                d.label = label
                tr, *_ = s.trial(trials + j, d)
                results.append(tr)
        if dynamic:
            x_last, out_last, y_buf, ref_last = last
            checks += _dynamic_checks(s, x_last, out_last, y_buf, ref_last, seed)
    written = DynamicCheck("outputs_written", "fail" if s.st.unwritten else "pass",
                           s.st.unwritten or "every element of every poisoned output was written")
    unchanged = DynamicCheck("inputs_unchanged", "fail" if s.st.inputs_changed else "pass",
                             s.st.inputs_changed or "inputs bit-identical after every run")
    by_name = {c.name: c for c in checks}
    all_checks = [written, unchanged] + [by_name[n] for n in ("outputs_follow_inputs", "no_output_reuse") if n in by_name]
    if det is not None:
        all_checks.append(det)
    all_checks += [c for c in checks if c.name == "stream_ordered"]
    if not dynamic:
        all_checks = [written, unchanged]
    return CorrectnessResult(tuple(results), tuple(all_checks), tol, tuple(s.st.notes), tuple(s.st.warnings),
                             time.monotonic() - t0)


def _fresh_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy at an address no earlier buffer had: a view 256 bytes into a larger block (an
    allocator hands freed addresses back, and a cache keyed by address would hit)."""
    pad = max(1, 256 // t.element_size())
    block = torch.empty(t.numel() + pad, dtype=t.dtype, device=t.device)
    out = block[pad:].view(t.shape)
    out.copy_(t)
    return out


def _dynamic_checks(s: _Session, x_last: list[torch.Tensor], out_last: list[torch.Tensor],
                    y_buf: list[torch.Tensor], ref_last: list[torch.Tensor], seed: int) -> list[DynamicCheck]:
    runner, out_specs, tol = s.runner, s.out_specs, s.st.tol
    checks = []

    # no_output_reuse: the last trial's input buffers get new contents in place; outputs poisoned.
    db = s.ref.draw(seed + 200)
    ref_b, _ = s.reference(db)
    for xi, new in zip(x_last, db.program):
        xi.copy_(new)
    s.run(x_last, y_buf, poison=0, what="same input buffers, new contents")
    out_b = [t.clone() for t in y_buf]
    n, total, name = s.reused(out_b, out_last, ref_b, ref_last)
    checks.append(DynamicCheck("no_output_reuse", "fail" if n else "pass",
                               f"{n} of {total} output elements (output {name}) repeat the previous call's values "
                               "although the inputs changed (same input buffers, new contents)" if n else
                               "new contents in the same input buffers gave new outputs"))

    # outputs_follow_inputs: new input buffers, the same output buffers, not poisoned.
    dc = s.ref.draw(seed + 300)
    ref_c, _ = s.reference(dc)
    x_c = [_fresh_copy(t) for t in dc.program]
    s.run(x_c, y_buf, poison=None, what="new input buffers")
    out_c = [t.clone() for t in y_buf]
    n, total, name = s.reused(out_c, out_b, ref_c, ref_b)
    checks.append(DynamicCheck("outputs_follow_inputs", "fail" if n else "pass",
                               f"{n} of {total} output elements (output {name}) did not change when the inputs "
                               "did (a constant or cached output)" if n else "outputs changed with the inputs"))

    # stream_ordered: hold the stream, then (in stream order) new inputs, poisoned outputs, the
    # program, a snapshot. Work the program queued elsewhere runs early, on stale inputs, and the
    # poison lands after it.
    dd = s.ref.draw(seed + 400)
    ref_d, _ = s.reference(dd)
    snap = [torch.empty_like(t) for t in y_buf]
    new_inputs = [t.clone() for t in dd.program]
    runner.sync()

    def load():
        for xi, v in zip(x_c, new_inputs):
            xi.copy_(v)
        for yi in y_buf:
            poison_(yi, 0)

    def take():
        for si, yi in zip(snap, y_buf):
            si.copy_(yi)

    runner.hold()
    runner.ordered(load)
    runner.run(x_c, y_buf)
    runner.ordered(take)
    runner.sync()
    ok_snap = all(bool(close_mask(a, r.to(a.device), tol).all().item()) for a, r in zip(snap, ref_d))
    if ok_snap:
        checks.append(DynamicCheck("stream_ordered", "pass", "outputs complete when the stream's work completed"))
    else:
        runner.sync_device()
        for yi in y_buf:
            poison_(yi, 0)
        runner.sync_device()  # the poison must land before the program, wherever it runs
        runner.run(x_c, y_buf)
        runner.sync_device()
        ok_sync = all(bool(close_mask(a, r.to(a.device), tol).all().item()) for a, r in zip(y_buf, ref_d))
        if ok_sync:
            bad = sum(int((~close_mask(a, r.to(a.device), tol)).sum().item()) for a, r in zip(snap, ref_d))
            checks.append(DynamicCheck("stream_ordered", "fail",
                                       f"{bad} output elements were not final when the work queued on the given "
                                       "stream had completed (right only after a device-wide synchronise): work "
                                       "runs on another stream"))
        else:
            checks.append(DynamicCheck("stream_ordered", "pass", "inconclusive: the outputs are wrong even after a "
                                                                 "device-wide synchronise (see the trials)"))
    del out_specs
    return checks


# ------------------------------------------------------------------ a runner over the real program


class StreamRunner:
    """A compiled program instance (``stitchcuda._rt``) on one CUDA stream (GPU only)."""

    def __init__(self, instance: Any, stream: "torch.cuda.Stream", hold_cycles: int = 200_000_000):
        self.instance, self.stream = instance, stream
        self.device = stream.device
        self.hold_cycles = hold_cycles

    def context(self):
        return torch.cuda.stream(self.stream)

    def run(self, inputs, outputs) -> None:
        self.instance.run(list(inputs), list(outputs), stream=self.stream.cuda_stream)

    def bind(self, inputs, outputs):
        """A callable that runs on fixed tensors with no DLPack exchange per call, as a deployed
        program is called; for timing and profiling, where the per-call Python cost of
        resolving tensors would otherwise be timed as program time."""
        bound = self.instance.bind(list(inputs), list(outputs), stream=self.stream.cuda_stream)
        stream = self.stream.cuda_stream
        return lambda: bound(stream)

    def sync(self) -> None:
        ev = torch.cuda.Event()
        ev.record(self.stream)
        ev.synchronize()

    def sync_device(self) -> None:
        torch.cuda.synchronize(self.device)

    def hold(self) -> None:
        with torch.cuda.stream(self.stream):
            torch.cuda._sleep(self.hold_cycles)

    def ordered(self, fn) -> None:
        with torch.cuda.stream(self.stream):
            fn()


__all__ = ["ReferenceMismatch", "TOLERANCES", "VALUE_RANGE_SCALES", "Runner", "Draw", "ReferenceLike", "CorrectnessResult",
           "check_correctness", "compare_output", "close_mask", "bits", "poison_", "poisoned", "StreamRunner",
           "TORCH_DTYPES"]
