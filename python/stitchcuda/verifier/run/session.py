"""One candidate's correctness run: every call, its poisoned outputs and checked inputs, every judgement.

A :class:`Session` makes the program calls of :mod:`.correctness` and :mod:`.dynamic` and keeps what
they established: the trials, the first failure of each dynamic check, the notes. Every output is
judged by :func:`.compare.errors`: KernelBench's ``allclose`` at the requested policy's tolerance
(:mod:`stitchcuda.precision`, never the manifest's), with the absolute tolerance scaled down for
outputs that live below 1, against the reference in fp32 eager (TF32 off). Only where that fails is
the reference computed in float64 (where a float64 copy fits) and the output judged against it:
float64 only where it pays. A varied trial on which the fp32 reference itself misses the float64 one
is ill-conditioned at those inputs and is judged on the norm-relative error instead; so is a plain
trial on which the fp32 reference misses the float64 one (ill-conditioned beyond fp32). NaN or Inf
where the reference is finite never passes.

Also here: what a runner and a reference must offer (:class:`Runner`, :class:`ReferenceLike`), a
set of inputs (:class:`Draw`), and the element-level helpers (poison patterns, chunked counts).
Device-agnostic PyTorch: the CPU tests drive it with a fake runner whose "program" is a Python
callable.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import torch

from ...manifest import TensorSpec
from ...precision import get as get_policy
from ..report.verdict import DynamicCheck, OutputCheck, TrialResult
from .compare import bits, errors, judge_output, norm_relative, output_scale, torch_dtype
from .copies import CopyBudget, Stash, nbytes
from .guards import GuardedBuffers
from .inputs import Secret

# Two poison bit patterns per element size. In every float format of that size both are NaNs with
# a payload no arithmetic produces (fp32 0x7FD5A5A5, bf16/fp16 0x7FA5 / 0x7FDA, fp64 0x7FF8A5..).
_POISON = {1: (0xA5, 0x5A), 2: (0x7FA5, 0x7FDA), 4: (0x7FD5A5A5, 0x7FC35A5B),
           8: (0x7FF8A5A5A5A5A5A5, 0x7FF95A5A5A5A5A5A)}


#: Inputs up to this many bytes are also kept as a copy, so a changed input can be located.
LOCATE_BYTES = 64 << 20

#: A problem whose inputs and outputs hold more than this is "large" (Session.large).
LARGE_BYTES = 4 << 30

#: How much looser than the policy's tolerance a varied trial's last judge is (``_varied_slack``).
VARIED_SLACK = 10.0

#: How the note on PyTorch's own arithmetic at a reduced policy names it (``_compare_policy``): the
#: loop keeps that note with a wrong answer's judgement, and a suite's report shows it beside a repair.
POLICY_NOTE = "PyTorch's own"
#: What that note says where PyTorch at the policy misses the tolerance on the same inputs too.
ALSO_OVER = "also over the tolerance"


def policy_misses_too(note: str) -> bool:
    """Whether ``note`` is that note saying PyTorch at the policy misses the tolerance too: the
    policy itself cannot meet it there (the loop repairs precision first; ``verify`` says so)."""
    return POLICY_NOTE in note and ALSO_OVER in note



class Runner(Protocol):
    """The candidate program on one stream. ``run`` enqueues one call; ``sync`` waits for the
    stream only (an event recorded on it); ``sync_device`` waits for all work of the process;
    ``hold`` delays the stream (a sleep kernel) so that what follows is queued, not done;
    ``ordered`` runs a tensor operation in stream order; ``context`` makes the stream current.

    What a runner may offer besides, each check using it only where it is there (the native runner
    and the stream runner offer all): ``run(..., pressure=True)`` where ``pressure_ok`` (a busy
    kernel on another stream meanwhile), ``ordered_run`` (the stream-order sequence in one go), ``capture`` / ``replay`` /
    ``drop_capture`` (a call captured from the stream into a graph), ``repeat(inputs, outputs, k)``
    and ``memory()`` (a :class:`~..measure.memory.MemoryReading`), ``library_calls()`` (the runtime
    calls the program made)."""

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
    def forward_at(self, policy: str, draw: Draw, inputs: Sequence[torch.Tensor] | None = None,
                   *, emulated: str = "") -> list[torch.Tensor] | None: ...




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


def same_wrong_answer(first: Sequence[torch.Tensor], again: Sequence[torch.Tensor], tol: float) -> bool:
    """Whether a call run ``again`` with the same inputs in fresh buffers (outputs poisoned) wrote every
    output and gave the ``first`` call's answer, within ``tol``: then a wrong answer is the draw's, not
    the buffers' (the repeated calls' and the timed calls' rule, :mod:`.dynamic`, :mod:`.timed_calls`)."""
    return not any(bool(any_poison(o).any()) for o in again) and \
        all(errors(a, b, tol).passed for a, b in zip(first, again))


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
                 budget: CopyBudget | None = None, buffers: GuardedBuffers | None = None,
                 weights: Sequence[torch.Tensor] = ()):
        self.runner, self.ref, self.secret = runner, reference, secret
        self.budget = budget or CopyBudget(runner.device)
        #: Where every tensor handed to the program lives: between guard zones (:mod:`.guards`).
        self.buffers = buffers if buffers is not None else GuardedBuffers(runner.device, secret.seed_for("guards"))
        self.weights = list(weights)  # what the program's create() got: never to change
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
        self.degenerate = ""  # why the reference's outputs prove nothing (see .parameters)
        self.first_refs: list[torch.Tensor] | None = None  # the first trial's outputs while degenerate
        self._policy_compared: set[str] = set()  # outputs whose failure was set beside PyTorch's at the policy
        #: Inputs and outputs of several GiB: the extra checks that cost a reference each are thinned out
        #: (LARGE_BYTES), so that the correctness phase of the largest problems stays within its 30 s.
        self.large = sum(t.nbytes for t in (*self.in_specs, *self.out_specs)) > LARGE_BYTES
        self._weight_hashes = [_hash(w, self.key) for w in self.weights]

    # -------------------------------------------------------------- bookkeeping

    def fail(self, check: str, detail: str) -> None:
        self.failures.setdefault(check, detail)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def next_index(self) -> int:
        return len(self.trials)

    def stash(self, what: str, ts: Sequence[torch.Tensor]) -> Stash:
        """A copy of ``ts`` where the memory budget puts it (:mod:`.copies`)."""
        return Stash(self.budget.place(what, nbytes(ts))).save(ts)

    # -------------------------------------------------------------- the program's buffers

    def new_outputs(self) -> list[torch.Tensor]:
        """Output buffers for one call (contents undefined), guarded, at addresses of their own."""
        return [self.buffers.empty(s.shape, torch_dtype(s.dtype), self.calls + k, f"output {s.name}")
                for k, s in enumerate(self.out_specs)]

    def own(self, ts: Sequence[torch.Tensor], what: str = "input") -> list[torch.Tensor]:
        """Guarded copies of ``ts`` (inputs in manifest order) at addresses the previous call did not use."""
        names = [s.name for s in self.in_specs]
        return [self.buffers.copy(t, self.calls + k, f"{what} {names[k] if k < len(names) else k}")
                for k, t in enumerate(ts)]

    def own_draw(self, d: Draw) -> list[torch.Tensor]:
        """The draw's inputs in guarded buffers of their own; the draw gives its copies up."""
        x = self.own(d.program)
        d.program = []
        return x

    def like(self, t: torch.Tensor, label: str = "") -> torch.Tensor:
        return self.buffers.like(t, self.calls, label)

    def check_guards(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], what: str) -> None:
        named = [(f"input {s.name}", t) for s, t in zip(self.in_specs, inputs)]
        named += [(f"output {s.name}", t) for s, t in zip(self.out_specs, outputs)]
        bad = self.buffers.check(named)
        if bad:
            self.fail("memory_bounds", f"{what}: " + "; ".join(bad) + ": the program wrote outside the buffers it "
                                       "was given (an allocation's slack is not the program's)")

    def check_weights(self, what: str) -> None:
        """The weights create() got, bit for bit (a keyed hash), and their guards."""
        for k, (w, h) in enumerate(zip(self.weights, self._weight_hashes)):
            if _hash(w, self.key) != h:
                self.fail("weights_unchanged", f"weight {k} changed ({what}): the program writes into its weights")
        bad = self.buffers.check([(f"weight {k}", w) for k, w in enumerate(self.weights)])
        bad += self.buffers.check()  # every other live buffer's guards too
        if bad:
            self.fail("memory_bounds", f"{what}: " + "; ".join(bad[:3]) + ": the program wrote outside the buffers "
                                       "it was given")

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
            value: float = 0.0, pressure: bool = False) -> None:
        """One program call: outputs filled, the program run and awaited (``pressure``: with a busy
        kernel on another stream meanwhile, where the runner can), guards checked, inputs checked
        unchanged, outputs checked written (when they were poisoned or filled)."""
        before = [_hash(t, self.key) for t in inputs]
        copies = [t.clone() if t.numel() * t.element_size() <= LOCATE_BYTES else None for t in inputs]
        self.fill(outputs, fill, value)
        if pressure and getattr(self.runner, "pressure_ok", False):
            self.runner.run(list(inputs), list(outputs), pressure=True)
        else:
            self.runner.run(list(inputs), list(outputs))
        self.runner.sync()
        self.calls += 1
        self.check_guards(inputs, outputs, what)
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
                elif what == "emulated":
                    extra[what] = self.ref.forward_at(self.policy, draw, list(inputs), emulated="round")
                else:
                    extra[what] = self.ref.forward_at(self.policy, draw, list(inputs))
            return extra[what] or []

        def nth(what: str, i: int) -> torch.Tensor | None:
            got = lazy(what)
            return got[i] if i < len(got) else None

        checks, bad = [], []
        for i, (spec, o, r) in enumerate(zip(self.out_specs, outputs, ref)):
            j = judge_output(o, r, self.tol, lambda i=i: nth("f64", i))
            e, e64, own, passed, how = j.e, j.e64, j.own, j.passed, j.how
            if how == "fp32-own":
                self.note(f"{label or 'a trial'}: output {spec.name} {e64.worst_ratio:.2g}x the bound from float64, "
                          f"the fp32 reference {own.worst_ratio:.2g}x: judged at fp32's own accuracy")
            if not passed and is_float(o) and e.bad_nonfinite == 0:
                # a plain trial in norm only where fp32 itself misses the truth (ill-conditioned beyond fp32); one
                # that fp32 meets and the policy does not (a deep net at TF32) stays elementwise: precision answers it
                if varied or (own is not None and not own.passed):
                    reduced = self.policy != "fp32"
                    passed, how = self._ill_conditioned(label, spec.name, o, r, j.ref64,
                                                        nth("at", i) if reduced else None, e.atol,
                                                        nth("emulated", i) if reduced else None)
                if not passed and distribution:
                    passed, how = self._varied_slack(label, spec.name, o, r if j.ref64 is None else j.ref64, how)
            if not passed and is_float(o) and self.policy != "fp32" and spec.name not in self._policy_compared:
                self._compare_policy(label, spec.name, e, lazy, i, r)
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

    def _compare_policy(self, label: str, name: str, e, lazy, i: int, ref32: torch.Tensor) -> None:
        """Once per output that fails under a reduced-precision policy, a note on what PyTorch itself
        gets at that policy on the same inputs (its own TF32 / autocast), judged the same way: a
        program worse than PyTorch at the policy is the program's fault; where PyTorch misses too,
        the fix is precision (the loop's repair), not the arithmetic. Notes only: the verdict stands."""
        self._policy_compared.add(name)
        at = lazy("at")
        if i >= len(at) or at[i] is None:
            return
        e_at = errors(at[i], ref32, self.tol, e.atol)
        emu = lazy("emulated")  # the policy's arithmetic whichever engine runs: PyTorch's may not use TF32
        e_emu = errors(emu[i], ref32, self.tol, e.atol) if i < len(emu) and emu[i] is not None else None
        self.note(f"{label or 'a trial'}: output {name} at {self.policy}: the program's max |err| {e.max_abs:.3g}; "
                  f"{POLICY_NOTE} {self.policy} on the same inputs {e_at.max_abs:.3g} "
                  f"({ALSO_OVER if not e_at.passed else 'within the tolerance'})"
                  + (f"; {self.policy} arithmetic (operands rounded to it) {e_emu.max_abs:.3g}" if e_emu else ""))

    def _ill_conditioned(self, label: str, name: str, out: torch.Tensor, ref32: torch.Tensor,
                         ref64: torch.Tensor | None, at: torch.Tensor | None, atol: float,
                         emulated: torch.Tensor | None = None) -> tuple[bool, str]:
        """An output failing elementwise on unusual inputs passes only where the policy itself could not
        do better: the reference computed at the policy (PyTorch with TF32 or autocast; at fp32 the fp32
        reference) misses the truth (float64) elementwise too, or, under tf32, the policy's own
        arithmetic does (``emulated``: the reference with TF32-rounded operands, the same whichever
        engine PyTorch picks; PyTorch's TF32 flags allow TF32, they do not make cuDNN use it). It is
        then judged on its norm-relative error: within the tolerance, or within 4x the error of the
        reference that misses most."""
        truth = ref64 if ref64 is not None else ref32
        at = at if at is not None else ref32
        if ref64 is None and at is ref32 and emulated is None:
            rel = norm_relative(out, ref32)  # no float64 here: conditioning unknown, the norm is the judge
            self.note(f"{label}: output {name} judged on norm-relative error {rel:.2g} against the fp32 reference "
                      "(no float64 reference here)")
            return rel <= self.tol, "norm-relative"
        yardsticks = [(f"the reference at {self.policy}", at)]
        if emulated is not None:
            yardsticks.append((f"{self.policy} arithmetic (operands rounded to it)", emulated))
        missing = [(what, norm_relative(t, truth)) for what, t in yardsticks if not errors(t, truth, self.tol, atol).passed]
        if not missing:
            return False, "elementwise"
        what, rel_at = max(missing, key=lambda m: m[1])
        rel = norm_relative(out, truth)
        self.note(f"{label}: output {name} judged on norm-relative error {rel:.2g} ({what} itself misses the truth "
                  f"here, by {rel_at:.2g})")
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

    def determinism(self, a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], label: str = "") -> DynamicCheck:
        """Two runs' outputs on the same inputs: beyond the tolerance apart is a race (or a read of
        memory nobody wrote); within it, a note (atomics, another reduction order)."""
        worst, name = 0.0, ""
        on = f" ({label})" if label else ""
        for spec, p, q in zip(self.out_specs, a, b):
            # unwritten in both: the outputs_written check's business
            n, _ = count_where(lambda a, b: ~((bits(a) == bits(b)) | (any_poison(a) & any_poison(b))), [p, q])
            if not n:
                continue
            e = errors(q, p, self.tol)
            if not e.passed:
                return DynamicCheck("deterministic", "fail",
                                    f"output {spec.name} differs between two runs on the same inputs{on} by up to "
                                    f"{e.max_abs:.3g} (> tol {self.tol:.0e}): a race or an uninitialised read")
            if e.max_abs >= worst:
                worst, name = e.max_abs, spec.name
        if name:
            return DynamicCheck("deterministic", "pass",
                                f"not bit-identical between two runs on the same inputs{on} (output {name} max diff "
                                f"{worst:.3g}, within rounding: atomics or another reduction order)")
        return DynamicCheck("deterministic", "pass", f"bit-identical between two runs on the same inputs{on}")


def one_determinism(s: "Session", checks: Sequence[DynamicCheck]) -> DynamicCheck:
    """The runs of several trials as one ``deterministic`` check: the first failure, else the first
    difference within rounding (a warning), else bit-identical everywhere."""
    for c in checks:
        if c.status == "fail":
            return c
    for c in checks:
        if c.detail.startswith("not bit-identical"):
            s.warnings.append(c.detail)
            return c
    return DynamicCheck("deterministic", "pass", f"bit-identical between two runs on the same inputs, in "
                                                 f"{len(checks)} trial(s), the second under launch pressure")


@dataclass
class LastTrial:
    """What the sensitivity trials start from: the last plain trial's draw (its inputs are drawn
    again from its seed) and a copy of the program's outputs for it, kept where the memory budget
    says. The inputs and the reference's outputs are not kept: the varied trials and the repeated
    calls run in between, and a multi-GiB problem has no room for a second working set."""

    draw: Draw
    outputs: Stash


def _bad_mask(out: torch.Tensor, ref: torch.Tensor, tol: float, atol: float) -> torch.Tensor:
    from .compare import close_mask

    return ~close_mask(out, ref, tol, atol)


def _hash(t: torch.Tensor, key: int) -> int:
    from .compare import fingerprint

    return fingerprint(t, key) if t.numel() else 0


__all__ = ["LOCATE_BYTES", "LARGE_BYTES", "VARIED_SLACK", "POLICY_NOTE", "ALSO_OVER", "policy_misses_too", "Runner", "Draw", "ReferenceLike", "ReferenceMismatch", "Session",
           "Judged", "LastTrial", "one_determinism", "poison_", "poisoned", "any_poison", "is_float", "count_where", "all_finite", "fmt_index",
           "empty_outputs", "fresh_copy", "check_shapes"]
