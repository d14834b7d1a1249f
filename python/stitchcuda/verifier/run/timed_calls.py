"""The timed calls' check: every timed call looks the same to the program, and a random, unannounced
sample of them is judged (:mod:`..measure.timing` runs the loop, this decides what happens between
calls).

Before every call, outside the timed region, two pairs of elements of a random input exchange their
values and the outputs are refilled (a NaN poison or a finite value, at random); after the sampled
calls the outputs are compared with the reference's for the inputs as they were. A program that is
correct when checked and idle when timed (it counts calls, notices the same buffers or the same
contents as the last call, or replays a captured graph that does less) is caught in the act: the
``timed_calls`` dynamic check.
"""

from __future__ import annotations

from typing import Any, Callable

from ..measure.timing import LoopSettings
from ..report.records import TimedCallCheck


class TimedCalls:
    """The timed calls' check (module docstring), device-agnostic: ``inputs``/``outputs`` are the
    tensors the timed program is bound to, ``reference(inputs)`` the reference's outputs for them,
    ``judge(outputs, ref) -> (passed, detail)`` the comparison at the policy's tolerance."""

    def __init__(self, inputs: list[Any], outputs: list[Any], reference: Callable[[list[Any]], list[Any]],
                 judge: Callable[[list[Any], list[Any]], tuple[bool, str]], rng: Any, settings: LoopSettings,
                 max_checks: int = 12):
        from .session import poison_

        self.inputs, self.outputs = list(inputs), outputs
        self.swappable = [t for t in inputs if t.numel() > 1]
        self.reference, self.judge, self.rng = reference, judge, rng
        n = max(3, settings.min_trials // 10)
        self.sample = set(rng.sample(range(settings.min_trials), min(n, settings.min_trials)))
        self.max_checks = max_checks
        self.calls = self.checked = 0
        self.failures: list[str] = []
        self._poison = poison_

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
        due = k in self.sample or (k >= max(self.sample, default=0) and self.rng.random() < 0.05)
        if not due or self.checked >= self.max_checks:
            return
        self.checked += 1
        ok, detail = self.judge(self.outputs, self.reference(self.inputs))
        if not ok:
            self.failures.append(f"timed call {k + 1}: {detail}")

    def result(self) -> TimedCallCheck:
        return TimedCallCheck(calls=self.calls, checked=self.checked, failed=len(self.failures),
                              detail="; ".join(self.failures[:3]))


__all__ = ["TimedCalls"]
