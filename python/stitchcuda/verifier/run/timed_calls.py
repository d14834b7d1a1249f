"""The timed calls' check: every timed call looks the same to the program, and a random, unannounced
sample of them, spread over the whole timed phase and the last call included, is judged
(:mod:`..measure.timing` runs the loop, this decides what happens between calls).

Before every call, outside the timed region, two pairs of elements of a random input exchange their
values and the outputs are refilled (a NaN poison or a finite value, at random); after the sampled
calls the outputs are compared with the reference's for the inputs as they were. A program that is
correct when checked and idle when timed (it counts calls, notices the same buffers or the same
contents as the last call, or replays a captured graph that does less) is caught in the act: the
``timed_calls`` dynamic check.

Which calls are judged: how many calls a timed phase makes depends on the program's speed (at least
``min_trials``, for at least ``min_seconds``), so the sample is drawn per stretch of calls that
doubles: three random calls among the first eight, then two random calls in each of [8, 16), [16, 32),
[32, 64), ... — a program honest for its first hundreds (or thousands) of calls is judged after
them too — and the last call of the phase, which no program can tell from the others (the phase
ends on a clock). At most ``max_checks`` calls are judged in all, the last always.

How a checked call is judged (:func:`judge_outputs`): as the plain trials are (:mod:`.session`),
elementwise at the policy's tolerance against the fp32 reference, then against float64, then within
twice the fp32 reference's own distance from float64 where that comes near the bound
(:func:`.compare.within_fp32_own`); where the fp32 reference itself misses float64 (ill-conditioned
beyond fp32), on the norm-relative error, within the tolerance (the trials allow up to 4x PyTorch's
own at the policy: no such reference here).

A checked call that is wrong is run once more with the same inputs in fresh buffers, outputs
poisoned (``again``). Where that call writes every output, is wrong too, and gives the timed call's
answer (within the tolerance), the draw is at fault, whichever buffers hold it — a program whose
error sits at the tolerance (TF32 through a deep net, or fp32 through fifty layers, beside fp32's
own) misses on some draws — and it is a wrong answer on that draw, kept as a trial, which the loop's
precision repair answers, not a cheat (the rule of the repeated calls', :mod:`.dynamic`). Otherwise
(right there, outputs left unwritten, another answer) the timed call did less than the program does:
the check fails.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from ..measure.timing import LoopSettings
from ..report.records import TimedCallCheck
from .compare import OutputJudgement, judge_output, norm_relative


def judge_outputs(tol: float, outputs: list[Any], ref: list[Any],
                  truth: Callable[[], list[Any] | None]) -> list[OutputJudgement]:
    """Each output of a checked call judged (module docstring): :func:`.compare.judge_output`, then,
    where the fp32 reference itself misses float64, the norm-relative error within ``tol``.
    ``truth()`` gives the float64 reference for the inputs as they are (None where none fits), asked
    for once at most, and only when an output fails against the fp32 one."""
    got: dict[str, list[Any]] = {}

    def nth(i: int) -> Any:
        if "all" not in got:
            got["all"] = truth() or []
        return got["all"][i] if i < len(got["all"]) else None

    out = []
    for i, (o, r) in enumerate(zip(outputs, ref)):
        j = judge_output(o, r, tol, lambda i=i: nth(i))
        if not j.passed and j.own is not None and not j.own.passed and norm_relative(o, j.ref64) <= tol:
            j = replace(j, passed=True, how="norm-relative")  # ill-conditioned beyond fp32: judged in norm
        out.append(j)
    return out


def output_judge(specs, tol: float, truth: Callable[[], list[Any] | None]
                 ) -> Callable[[list[Any], list[Any]], tuple[bool, str]]:
    """The checked calls' judge, ``judge(outputs, ref) -> (passed, detail)``: :func:`judge_outputs`,
    the first output it fails named."""

    def judge(outputs, ref) -> tuple[bool, str]:
        for spec, o, j in zip(specs, outputs, judge_outputs(tol, outputs, ref, truth)):
            if not j.passed:
                e = j.e
                return False, (f"output {spec.name}: {e.n_bad} of {o.numel()} elements wrong (max |err| "
                               f"{e.max_abs:.3g}, expected {e.expected:.6g}, got {e.got:.6g})")
        return True, ""

    return judge


class TimedCalls:
    """The timed calls' check (module docstring), device-agnostic: ``inputs``/``outputs`` are the
    tensors the timed program is bound to, ``reference(inputs)`` the reference's outputs for them,
    ``judge(outputs, ref) -> (passed, detail)`` the comparison at the policy's tolerance."""

    def __init__(self, inputs: list[Any], outputs: list[Any], reference: Callable[[list[Any]], list[Any]],
                 judge: Callable[[list[Any], list[Any]], tuple[bool, str]], rng: Any,
                 settings: LoopSettings = LoopSettings(), max_checks: int = 40,
                 again: Callable[[int, list[Any], list[Any]], bool] | None = None):
        from .session import poison_

        self.inputs, self.outputs = list(inputs), outputs
        self.swappable = [t for t in inputs if t.numel() > 1]
        self.reference, self.judge, self.rng = reference, judge, rng
        self.max_checks = max_checks
        self.again = again  # again(call, inputs, outputs): the draw's fault? (module docstring)
        self.calls = self.checked = 0
        self.last_checked = -1
        self.failures: list[str] = []
        self.wrong: list[str] = []  # checked calls wrong in fresh buffers too: the draw's (module docstring)
        self._poison = poison_
        self._plan: dict[int, set[int]] = {}

    # -------------------------------------------------------------- which calls

    @staticmethod
    def stretch(k: int) -> tuple[int, int, int]:
        """(stretch index, first call, end) of timed call ``k`` (0-based): [0, 8), [8, 16), [16, 32), ..."""
        if k < 8:
            return 0, 0, 8
        j = k.bit_length() - 3  # k in [8 * 2^(j-1), 8 * 2^j)
        lo = 1 << (j + 2)
        return j, lo, lo << 1

    def due(self, k: int) -> bool:
        j, lo, hi = self.stretch(k)
        if j not in self._plan:
            n = 3 if j == 0 else 2
            self._plan[j] = set(self.rng.sample(range(lo, hi), n))
        return k in self._plan[j]

    # -------------------------------------------------------------- the hooks

    def before(self) -> None:
        from .inputs import swap_elements

        if self.swappable:
            swap_elements(self.rng.choice(self.swappable), self.rng)
        how = self.rng.random()
        for y in self.outputs:
            if how < 0.5 or not y.dtype.is_floating_point:
                self._poison(y, 0 if how < 0.25 else 1)
            else:
                y.fill_(self.rng.uniform(-2.0, 2.0))
        self.calls += 1

    def after(self, k: int) -> None:
        if self.due(k) and self.checked < self.max_checks - 1:  # one check is kept for the last call
            self._check(k)
        self._last = k

    def finish(self) -> None:
        """After the loop's last call: that call is judged (unless it just was)."""
        k = getattr(self, "_last", -1)
        if k >= 0 and self.last_checked != k:
            self._check(k)

    def _check(self, k: int) -> None:
        self.checked += 1
        self.last_checked = k
        ok, detail = self.judge(self.outputs, self.reference(self.inputs))
        if ok:
            return
        if self.again is not None and self.again(k + 1, self.inputs, self.outputs):
            self.wrong.append(f"timed call {k + 1}: {detail}")
        else:
            self.failures.append(f"timed call {k + 1}: {detail}")

    def result(self) -> TimedCallCheck:
        return TimedCallCheck(calls=self.calls, checked=self.checked, failed=len(self.failures),
                              detail="; ".join(self.failures[:3]), last_checked=self.last_checked + 1,
                              wrong=len(self.wrong), wrong_detail="; ".join(self.wrong[:3]))


__all__ = ["TimedCalls", "output_judge"]
