"""Correctness: a candidate program run against its PyTorch reference, trial by trial.

The procedure (MEASURING.md, "Correct first"), on a :class:`Runner` (the program on one stream)
and a :class:`ReferenceLike` (fresh inputs and the reference's outputs for them), every random
choice from the verification's :class:`~.inputs.Secret`:

1. ``trials`` plain trials (default 5) on fresh inputs from the reference's ``get_inputs()``.
   Outputs are filled with a NaN poison before every run; after it every element must have been
   written and the inputs must be unchanged (a keyed hash of their bits). Trial 0 runs twice
   (a race shows as a difference beyond rounding).
2. ``varied`` trials (default 4) on inputs of other distributions (:mod:`.inputs`: scaled,
   offset, heavy-tailed, sparse, structured), kinds and parameters drawn per verification.
3. The dynamic anti-hacking sequences of :mod:`.dynamic`: repeated calls on the same buffers with
   new contents, single-element sensitivity, stream order, the precision claim.

Every output is judged by :func:`.compare.errors`: KernelBench's ``allclose`` at the requested
policy's tolerance (:mod:`stitchcuda.precision`, never the manifest's), with the absolute tolerance
scaled down for outputs that live below 1, against the reference in fp32 eager (TF32 off). Only
where that fails is the reference computed in float64 (where a float64 copy fits) and the output
judged against it: float64 only where it pays. A varied trial on which the fp32 reference itself
misses the float64 one is ill-conditioned at those inputs and is judged on the norm-relative
error instead. NaN or Inf where the reference is finite never passes.

Ordering is a defence: the candidate always runs *before* the reference's outputs for the same
inputs exist in the process, so no program can copy them out of device memory. Each set of
inputs gets its reference computed once.

Everything here is device-agnostic PyTorch: the CPU tests drive it with a fake runner whose
"program" is a Python callable.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import torch

from ..manifest import TensorSpec
from ..precision import get as get_policy
from .compare import bits, errors, norm_relative, output_scale, torch_dtype
from .inputs import Secret, choose_variations, vary
from .memory import Budget, Stash, nbytes
from .verdict import DynamicCheck, OutputCheck, TrialResult

# Two poison bit patterns per element size. In every float format of that size both are NaNs with
# a payload no arithmetic produces (fp32 0x7FD5A5A5, bf16/fp16 0x7FA5 / 0x7FDA, fp64 0x7FF8A5..).
_POISON = {1: (0xA5, 0x5A), 2: (0x7FA5, 0x7FDA), 4: (0x7FD5A5A5, 0x7FC35A5B),
           8: (0x7FF8A5A5A5A5A5A5, 0x7FF95A5A5A5A5A5A)}

#: Default number of varied-distribution trials.
VARIED_TRIALS = 4

#: Inputs up to this many bytes are also kept as a copy, so a changed input can be located.
LOCATE_BYTES = 64 << 20

#: How much looser than the policy's tolerance a varied trial's last judge is (``_varied_slack``).
VARIED_SLACK = 10.0


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
    ``model_args`` what the reference's forward takes (non-tensor arguments included), the tensors
    at ``arg_index`` being replaced by whatever program inputs the reference is asked about."""

    program: list[torch.Tensor]
    model_args: list[Any]  # tensor positions (arg_index) hold None: the reference gets the inputs it is asked about
    seed: int
    label: str = ""
    arg_index: tuple[int, ...] = ()
    arg_dtypes: tuple[torch.dtype, ...] = ()  # the dtype the reference drew at each of arg_index


class ReferenceLike(Protocol):
    input_specs: tuple[TensorSpec, ...]
    output_specs: tuple[TensorSpec, ...]
    lifted_indices: tuple[int, ...]

    def draw(self, seed: int) -> Draw: ...
    def forward(self, draw: Draw, inputs: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]: ...
    def forward64(self, draw: Draw, inputs: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor] | None: ...
    def forward_at(self, policy: str, draw: Draw,
                   inputs: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor] | None: ...


@dataclass(frozen=True)
class CorrectnessResult:
    trials: tuple[TrialResult, ...]
    checks: tuple[DynamicCheck, ...]
    tolerance: float
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0
    calls: int = 0  # program calls made
    inconclusive: str = ""  # set when a check could not be judged for a reason not the candidate's

    @property
    def passed(self) -> bool:
        return (all(t.passed for t in self.trials) and not any(c.status == "fail" for c in self.checks)
                and not self.inconclusive)


class ReferenceMismatch(ValueError):
    """The reference's outputs do not match the manifest (a problem of the inputs, not the candidate)."""


# ------------------------------------------------------------------ element-level helpers


def poison_(t: torch.Tensor, which: int = 0) -> torch.Tensor:
    bits(t).fill_(_POISON[t.element_size()][which])
    return t


def poisoned(t: torch.Tensor, which: int = 0) -> torch.Tensor:
    """Boolean mask of elements still holding poison pattern ``which``."""
    return bits(t) == _POISON[t.element_size()][which]


def any_poison(t: torch.Tensor) -> torch.Tensor:
    return poisoned(t, 0) | poisoned(t, 1)


def is_float(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    flat = int(torch.nonzero(mask.reshape(-1))[0].item())
    out = []
    for s in reversed(tuple(mask.shape)):
        out.append(flat % s if s else 0)
        flat = flat // s if s else 0
    return tuple(reversed(out))


def count_where(fn: Callable[..., torch.Tensor], ts: Sequence[torch.Tensor]) -> tuple[int, tuple[int, ...]]:
    """``(count, index of the first)`` of the elements where ``fn(*chunks)`` holds over the tensors
    ``ts`` (one shape), walked in chunks: a multi-GiB output never has a full-size mask. The index is
    ``()`` when the count is 0; finding it costs a second pass only then."""
    from .compare import CHUNK, _index

    flats = [t.reshape(-1) for t in ts]
    n = flats[0].numel()
    total = torch.zeros((), dtype=torch.int64, device=flats[0].device)
    for lo in range(0, n, CHUNK):
        total += fn(*(f[lo:lo + CHUNK] for f in flats)).sum()
    count = int(total.item())
    if not count:
        return 0, ()
    for lo in range(0, n, CHUNK):
        hit = torch.nonzero(fn(*(f[lo:lo + CHUNK] for f in flats)).reshape(-1))
        if hit.numel():
            return count, _index(lo + int(hit[0, 0].item()), tuple(ts[0].shape))
    return count, ()


def all_finite(t: torch.Tensor) -> bool:
    return count_where(lambda c: ~torch.isfinite(c), [t])[0] == 0


def fmt_index(ix: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, ix)) + "]"


def empty_outputs(specs: Sequence[TensorSpec], device: torch.device) -> list[torch.Tensor]:
    return [torch.empty(s.shape, dtype=torch_dtype(s.dtype), device=device) for s in specs]


def fresh_copy(t: torch.Tensor, k: int = 0) -> torch.Tensor:
    """A copy at an address the previous call's buffer did not have: a view ``256 * (1 + k % 31)``
    bytes into a new block (an allocator hands freed blocks back, so without the offset the copy
    of call ``k`` would often sit where call ``k - 1``'s was, and a cache keyed by address would
    hit)."""
    pad = max(1, 256 * (1 + k % 31) // t.element_size())
    block = torch.empty(t.numel() + pad, dtype=t.dtype, device=t.device)
    out = block[pad:].view(t.shape)
    out.copy_(t)
    return out


def check_shapes(ref: list[torch.Tensor], specs: Sequence[TensorSpec]) -> None:
    if len(ref) != len(specs):
        raise ReferenceMismatch(f"the reference returns {len(ref)} tensor(s); the manifest lists {len(specs)} "
                                f"output(s) ({', '.join(s.name for s in specs)})")
    for r, s in zip(ref, specs):
        if tuple(r.shape) != tuple(s.shape):
            raise ReferenceMismatch(f"the reference's output {s.name} has shape {list(r.shape)}; the manifest says "
                                    f"{list(s.shape)}")


# ------------------------------------------------------------------ one session


@dataclass
class Judged:
    """A trial's verdict and what the dynamic checks need from it."""

    trial: TrialResult
    ref: list[torch.Tensor]
    bad: list[torch.Tensor | None]  # per output: mask of elements out of tolerance (None when it passed)


class Session:
    """One candidate's correctness run: every call, every failure of a dynamic check, the notes."""

    def __init__(self, runner: Runner, reference: ReferenceLike, policy: str, secret: Secret,
                 budget: Budget | None = None):
        self.runner, self.ref, self.secret = runner, reference, secret
        self.budget = budget or Budget(runner.device)
        self.policy = get_policy(policy).name
        self.tol = get_policy(policy).tolerance
        self.in_specs, self.out_specs = reference.input_specs, reference.output_specs
        self.device = runner.device
        self.lifted = tuple(getattr(reference, "lifted_indices", ()))
        self.key = secret.seed_for("fingerprint")
        self.calls = 0
        self.trials: list[TrialResult] = []
        self.failures: dict[str, str] = {}  # dynamic check -> first failure's detail
        self.left_at_fill: list[torch.Tensor | None] = []  # the last call's outputs, when the caller filled them
        self.passes: dict[str, str] = {}  # dynamic check -> what it established
        self.notes: list[str] = []
        self.warnings: list[str] = []
        self.inconclusive = ""
        self.plain_ok = True  # every plain trial passed: only then are later failures named as cheats
        self.plain_nonfinite = False  # the reference itself gives NaN/Inf on get_inputs()'s inputs

    # -------------------------------------------------------------- bookkeeping

    def fail(self, check: str, detail: str) -> None:
        self.failures.setdefault(check, detail)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def next_index(self) -> int:
        return len(self.trials)

    def stash(self, what: str, ts: Sequence[torch.Tensor]) -> Stash:
        """A copy of ``ts`` where the memory budget puts it (:mod:`.memory`)."""
        return Stash(self.budget.place(what, nbytes(ts))).save(ts)

    # -------------------------------------------------------------- one call

    def fill(self, outputs: Sequence[torch.Tensor], how: str, value: float = 0.0) -> None:
        """``poison0`` / ``poison1`` (NaN patterns), ``const`` (a finite value: a program that checks
        its outputs for poison cannot tell), ``keep`` (the previous call's outputs stay)."""
        for y in outputs:
            if how == "poison0":
                poison_(y, 0)
            elif how == "poison1":
                poison_(y, 1)
            elif how == "const":
                if is_float(y):
                    y.fill_(value)
                else:
                    poison_(y, 0)

    def run(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], *, fill: str, what: str,
            value: float = 0.0) -> None:
        """One program call: outputs filled, the program run and awaited, inputs checked unchanged,
        outputs checked written (when they were poisoned or filled)."""
        before = [_hash(t, self.key) for t in inputs]
        copies = [t.clone() if t.numel() * t.element_size() <= LOCATE_BYTES else None for t in inputs]
        self.fill(outputs, fill, value)
        self.runner.run(list(inputs), list(outputs))
        self.runner.sync()
        self.calls += 1
        for spec, t, h, c in zip(self.in_specs, inputs, before, copies):
            if _hash(t, self.key) != h:
                where = ""
                if c is not None:
                    diff = bits(t) != bits(c)
                    if bool(diff.any().item()):
                        ix = _first(diff)
                        where = (f": {int(diff.sum().item())} of {t.numel()} elements, first at {fmt_index(ix)} "
                                 f"({c[ix].item():.6g} -> {t[ix].item():.6g})")
                self.fail("inputs_unchanged", f"input {spec.name} changed by the run ({what}){where}")
                if c is not None:
                    t.copy_(c)  # the reference gets the inputs the program was given, not what it left
        self.left_at_fill = []
        if fill in ("poison0", "poison1", "const"):
            for spec, y in zip(self.out_specs, outputs):
                if fill == "const":
                    self.left_at_fill.append(y if is_float(y) else None)
                if fill == "const" and is_float(y):
                    # Judged after the call, against the reference (see left_unwritten): an honest
                    # output of hundreds of millions of elements equals any finite value somewhere.
                    continue
                which = 1 if fill == "poison1" else 0
                n, ix = count_where(lambda c, w=which: poisoned(c, w), [y])
                if n:
                    self.fail("outputs_written", f"output {spec.name}: {n} of {y.numel()} elements never written "
                                                 f"({what}; first at {fmt_index(ix)})")

    def left_unwritten(self, bad: Sequence[torch.Tensor | None], what: str, value: float) -> None:
        """After a call whose outputs the caller filled with ``value``: the elements still holding
        it where the reference differs (``bad``, from :meth:`judge`) were never written. (The
        outputs are the call's own: nothing touches them between the call and this check.)"""
        for spec, y, b in zip(self.out_specs, self.left_at_fill, bad):
            if b is None or y is None:
                continue
            n, ix = count_where(lambda c, m: (c == value) & m, [y, b.reshape(y.shape)])
            if n:
                self.fail("outputs_written", f"output {spec.name}: {n} of {y.numel()} elements "
                                             f"left at the value {value:.6g} the caller filled them with, where the "
                                             f"reference differs ({what}; first at {fmt_index(ix)})")
        self.left_at_fill = []

    # -------------------------------------------------------------- judging

    def reference(self, draw: Draw, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        ref = self.ref.forward(draw, list(inputs))
        check_shapes(ref, self.out_specs)
        return ref

    def judge(self, label: str, outputs: Sequence[torch.Tensor], draw: Draw, inputs: Sequence[torch.Tensor], *,
              varied: bool = False, distribution: bool = False, ref: list[torch.Tensor] | None = None,
              record: bool = True) -> Judged:
        """The outputs against the reference for ``inputs`` (computed now, after the call, unless
        given); appended to the trials when ``record``. ``varied``: inputs unlike get_inputs()'s (a
        varied distribution, a changed element), where :meth:`_ill_conditioned` may apply;
        ``distribution``: a varied *distribution* (not a changed element), where :meth:`_varied_slack`
        may apply too — a changed element's effect can be smaller than the slack."""
        ref = self.reference(draw, inputs) if ref is None else ref
        extra: dict[str, list[torch.Tensor] | None] = {}

        def lazy(what: str) -> list[torch.Tensor]:
            if what not in extra:
                if what == "f64":
                    extra[what] = self.ref.forward64(draw, list(inputs))
                else:
                    extra[what] = self.ref.forward_at(self.policy, draw, list(inputs))
            return extra[what] or []

        checks, bad = [], []
        for i, (spec, o, r) in enumerate(zip(self.out_specs, outputs, ref)):
            e = errors(o, r, self.tol)
            e64, how, passed = None, "elementwise", e.passed
            if not passed and is_float(o) and e.bad_nonfinite == 0:
                ref64 = lazy("f64")
                if i < len(ref64):
                    e64 = errors(o, ref64[i], self.tol, e.atol)
                    passed = e64.passed
                    how = "float64" if passed else how
                if not passed and varied:
                    at = lazy("at") if self.policy != "fp32" else []
                    passed, how = self._ill_conditioned(label, spec.name, o, r, ref64[i] if i < len(ref64) else None,
                                                        at[i] if i < len(at) else None, e.atol)
                if not passed and distribution:
                    passed, how = self._varied_slack(label, spec.name, o, ref64[i] if i < len(ref64) else r, how)
            if passed and how == "float64":
                self.note(f"{label or 'a trial'}: output {spec.name} is within tolerance of the float64 reference "
                          f"(max |err| {e64.max_abs:.3g}) but not of the fp32 one ({e.max_abs:.3g})")
            checks.append(OutputCheck(name=spec.name, max_abs_err=e.max_abs, mean_abs_err=e.mean_abs,
                                      tolerance=self.tol, where=e.where, expected=e.expected, got=e.got,
                                      nan_count=e.bad_nonfinite, passed=passed,
                                      max_abs_err_f64=e64.max_abs if e64 else None,
                                      mean_abs_err_f64=e64.mean_abs if e64 else None, atol=e.atol, judged=how))
            bad.append(None if passed else _bad_mask(o, r, self.tol, e.atol))
        tr = TrialResult(index=self.next_index(), outputs=tuple(checks), seed=draw.seed, label=label)
        if record:
            self.trials.append(tr)
        return Judged(tr, ref, bad)

    def _ill_conditioned(self, label: str, name: str, out: torch.Tensor, ref32: torch.Tensor,
                         ref64: torch.Tensor | None, at: torch.Tensor | None, atol: float) -> tuple[bool, str]:
        """An output failing elementwise on unusual inputs passes only where the policy itself could not
        do better: the reference computed at the policy (PyTorch with TF32 or autocast; at fp32 the fp32
        reference) misses the truth (float64) elementwise too. It is then judged on its norm-relative
        error: within the tolerance, or within 4x the error of the reference at the policy."""
        truth = ref64 if ref64 is not None else ref32
        at = at if at is not None else ref32
        if ref64 is None and at is ref32:
            rel = norm_relative(out, ref32)  # no float64 here: conditioning unknown, the norm is the judge
            self.note(f"{label}: output {name} judged on norm-relative error {rel:.2g} against the fp32 reference "
                      "(no float64 reference here)")
            return rel <= self.tol, "norm-relative"
        if errors(at, truth, self.tol, atol).passed:
            return False, "elementwise"
        rel, rel_at = norm_relative(out, truth), norm_relative(at, truth)
        self.note(f"{label}: output {name} judged on norm-relative error {rel:.2g} (the reference at {self.policy} "
                  f"itself misses the truth here, by {rel_at:.2g})")
        return rel <= max(self.tol, 4 * rel_at), "norm-relative"

    def _varied_slack(self, label: str, name: str, out: torch.Tensor, truth: torch.Tensor, how: str
                        ) -> tuple[bool, str]:
        """The last judge of a varied trial: the float64 truth, within ``VARIED_SLACK`` x the policy's
        tolerance, the absolute part scaled with the output's RMS when it is above 1.

        Varied inputs are there to catch programs that assume their inputs' distribution (errors of
        the output's own size); the plain trials judge accuracy at the policy's tolerance. On inputs
        of another scale or shape the rounding of a long reduction grows with its terms, not with
        its result (a ramp whose row sums cancel to ~1 from terms of size 2; inputs x100 under
        KernelBench's fixed ``atol``), so an honest program that reorders a sum can miss the plain
        bound there although no reference does better by more than luck. The slack is bounded:
        an error of 10x the tolerance still fails, and the note names the output."""
        scale = max(output_scale(truth), 1.0)
        tol = VARIED_SLACK * self.tol
        e = errors(out, truth, tol, tol * scale)
        if not e.passed:
            return False, how
        self.note(f"{label}: output {name} judged against float64 within {VARIED_SLACK:g} x tol "
                  f"(atol {tol * scale:.3g}): max |err| {e.max_abs:.3g}")
        return True, "varied-slack"

    def determinism(self, a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> DynamicCheck:
        worst, name = 0.0, ""
        for spec, p, q in zip(self.out_specs, a, b):
            # unwritten in both: the outputs_written check's business
            n, _ = count_where(lambda a, b: ~((bits(a) == bits(b)) | (any_poison(a) & any_poison(b))), [p, q])
            if not n:
                continue
            e = errors(q, p, self.tol)
            if not e.passed:
                return DynamicCheck("deterministic", "fail",
                                    f"output {spec.name} differs between two runs on the same inputs by up to "
                                    f"{e.max_abs:.3g} (> tol {self.tol:.0e}): a race or an uninitialised read")
            if e.max_abs >= worst:
                worst, name = e.max_abs, spec.name
        if name:
            msg = (f"not bit-identical between two runs on the same inputs (output {name} max diff {worst:.3g}, "
                   f"within rounding: atomics or another reduction order)")
            self.warnings.append(msg)
            return DynamicCheck("deterministic", "pass", msg)
        return DynamicCheck("deterministic", "pass", "bit-identical between two runs on the same inputs")


def _bad_mask(out: torch.Tensor, ref: torch.Tensor, tol: float, atol: float) -> torch.Tensor:
    from .compare import close_mask

    return ~close_mask(out, ref, tol, atol)


def _hash(t: torch.Tensor, key: int) -> int:
    from .compare import fingerprint

    return fingerprint(t, key) if t.numel() else 0


# ------------------------------------------------------------------ the procedure


@dataclass
class LastTrial:
    """What the sensitivity trials start from: the last plain trial's draw (its inputs are drawn
    again from its seed) and a copy of the program's outputs for it, kept where the memory budget
    says. The inputs and the reference's outputs are not kept: the varied trials and the repeated
    calls run in between, and a multi-GiB problem has no room for a second working set."""

    draw: Draw
    outputs: Stash


def check_correctness(runner: Runner, reference: ReferenceLike, *, precision: str = "fp32", trials: int = 5,
                      seed: int = 0, varied: int = VARIED_TRIALS, dynamic: bool = True,
                      budget: Budget | None = None) -> CorrectnessResult:
    """Run the trials and the dynamic checks (module docstring) at ``precision``'s tolerance, the
    Verifier's own copies placed by ``budget`` (default: from the device's free memory).
    Raises only on a broken reference (ReferenceMismatch: outputs that do not match the manifest);
    exceptions from the program propagate."""
    from . import dynamic as dyn

    if trials < 1:
        raise ValueError("check_correctness: trials must be >= 1")
    t0 = time.monotonic()
    secret = Secret(seed)
    s = Session(runner, reference, precision, secret, budget)
    extra: list[DynamicCheck] = []
    with runner.context(), torch.no_grad():
        last: LastTrial | None = None
        for k in range(trials):
            d = x = y = j = None  # noqa: F841 - the previous trial's tensors go before the next are drawn
            d = reference.draw(secret.seed_for(f"trial{k}"))
            x = _own(d, s.calls)
            y = empty_outputs(s.out_specs, s.device)
            s.run(x, y, fill=f"poison{k % 2}", what=f"trial {k}")
            y2 = None
            if dynamic and k == 0:
                y2 = empty_outputs(s.out_specs, s.device)
                s.run(x, y2, fill="poison1", what="trial 0, second run")
                extra.append(s.determinism(y, y2))
                del y2
            j = s.judge("", y, d, x)
            s.plain_nonfinite |= any(is_float(r) and not all_finite(r) for r in j.ref)
            if dynamic and k == 0:
                extra.append(dyn.precision_claim(s, d, x, y, j.ref))
            if dynamic and k == trials - 1:
                last = LastTrial(d, s.stash("sensitivity's starting outputs", y))
        d = x = y = j = None  # noqa: F841 - nothing of the plain trials stays on the device
        s.plain_ok = all(t.passed for t in s.trials) and not s.failures
        if varied > 0:
            _varied_trials(s, varied, s.plain_ok)
        if dynamic and last is not None:
            extra += dyn.dynamic_checks(s, last)
    for line in s.budget.notes:
        s.note(line)
    checks = _collect(s, extra, dynamic)
    return CorrectnessResult(tuple(s.trials), tuple(checks), s.tol, tuple(s.notes), tuple(s.warnings),
                             time.monotonic() - t0, s.calls, s.inconclusive)


def _own(d: Draw, k: int) -> list[torch.Tensor]:
    """The draw's inputs at addresses the previous call did not use (the draw gives its copies up)."""
    x = [fresh_copy(t, k) for t in d.program]
    d.program = []
    return x


def _varied_trials(s: Session, n: int, plain_ok: bool) -> None:
    ref = s.ref
    variations = choose_variations(s.secret.rng("varied"), n)
    failed: list[str] = []
    judged = 0
    for j, v in enumerate(variations):
        d = x = y = r = None  # noqa: F841 - the previous trial's tensors go before the next are drawn
        d = ref.draw(s.secret.seed_for(f"varied{j}"))
        gen = torch.Generator(device=s.device).manual_seed(s.secret.seed_for(f"varied{j}:gen"))
        x = [t if i in s.lifted else vary(t, v, gen) for i, t in enumerate(d.program)]
        if all(a is b for a, b in zip(x, d.program)):
            s.note("varied trials not applicable: no floating-point input")
            return
        d.program = x
        x = _own(d, s.calls)
        y = empty_outputs(s.out_specs, s.device)
        s.run(x, y, fill="poison0", what=f"varied trial ({v.label})")
        r = s.reference(d, x)
        if not s.plain_nonfinite and any(is_float(t) and not all_finite(t) for t in r):
            s.note(f"varied trial ({v.label}) skipped: the reference itself gives NaN or Inf on these inputs")
            continue
        if any(_beyond_range(t, spec.dtype) for t, spec in zip(r, s.out_specs)):
            s.note(f"varied trial ({v.label}) skipped: the reference's outputs exceed what the program's output dtype "
                   "can hold")
            continue
        jd = s.judge(v.label, y, d, x, varied=True, distribution=True, ref=r)
        judged += 1
        if not jd.trial.passed:
            failed.append(f"trial {jd.trial.index} ({v.label})")
    if failed and plain_ok:
        s.fail("varied_inputs", "right on get_inputs()'s distribution, wrong on " + ", ".join(failed) +
               ": the program assumes properties of its inputs")
    elif judged:
        s.passes["varied_inputs"] = f"{judged} varied trials: " + ", ".join(v.label for v in variations)
    else:
        s.note("no varied trial could be judged (the reference gives NaN or Inf on every variation)")


def _beyond_range(t: torch.Tensor, dtype: str) -> bool:
    """Whether finite values of ``t`` exceed the largest finite value of ``dtype`` (a float16 output
    cannot hold 1e5, whatever the program does)."""
    want = torch_dtype(dtype)
    if not (is_float(t) and want.is_floating_point) or torch.finfo(want).max >= torch.finfo(t.dtype).max:
        return False
    from .compare import max_finite_abs

    return max_finite_abs(t) > torch.finfo(want).max


def _collect(s: Session, extra: list[DynamicCheck], dynamic: bool) -> list[DynamicCheck]:
    """Every dynamic check once: failures first by name, then the passes and what each established."""
    out = [DynamicCheck("outputs_written", "fail" if "outputs_written" in s.failures else "pass",
                        s.failures.get("outputs_written", "every element of every output was written")),
           DynamicCheck("inputs_unchanged", "fail" if "inputs_unchanged" in s.failures else "pass",
                        s.failures.get("inputs_unchanged", "inputs bit-identical after every run"))]
    if not dynamic:
        return out
    names = ("no_output_reuse", "outputs_follow_inputs", "repeat_calls", "sensitivity", "varied_inputs")
    for name in names:
        if name in s.failures:
            out.append(DynamicCheck(name, "fail", s.failures[name]))
        elif name in s.passes:
            out.append(DynamicCheck(name, "pass", s.passes[name]))
    out += extra
    return out


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


__all__ = ["ReferenceMismatch", "VARIED_TRIALS", "Runner", "Draw", "ReferenceLike", "CorrectnessResult", "Session",
           "Judged", "LastTrial", "check_correctness", "count_where", "all_finite", "poison_", "poisoned", "any_poison", "empty_outputs", "fresh_copy",
           "StreamRunner"]
