"""Where the correctness phase's time goes: the program's calls, each kind of reference computation
(fp32, float64, at the policy, the policy emulated), drawing inputs, and the procedure's own stages
(:data:`STAGES`: judging outputs, the precision claim's statistics, the weights' checks, the varied
trials, the dynamic checks), each without the calls and references timed inside it; the rest is
what no part names (poisoning and copying buffers between them).

The correctness phase is most of a verification (an H200 sweep of all.jsonl: 2,744 of 3,577 s) and
most of an optimisation run's time is verification; what to make faster is read from these figures.
:class:`Clock` wraps the runner and the reference the procedure is given (every other attribute
passes through), and waits for the device at each boundary so that work is counted where it runs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Callable

PROGRAM = "program calls"
INPUTS = "drawing inputs"
REST = "checks, copies and comparisons"
#: The correctness procedure's stages, each timed as its own part (correctness.py).
JUDGING, DETERMINISM, CLAIM, WEIGHTS, VARIED, DYNAMIC = (
    "judging outputs", "determinism comparisons", "precision claim statistics", "weights unchanged checks",
    "varied trials' checks", "dynamic checks' own work")
STAGES = (JUDGING, DETERMINISM, CLAIM, WEIGHTS, VARIED, DYNAMIC)


class Clock:
    """Seconds by part; ``timed`` runs one call as a part, the device awaited before and after. A
    part timed inside another is its own: the outer part keeps only the time outside it (a check's
    own comparisons, without the program calls and references it makes)."""

    def __init__(self, sync: Callable[[], None] = lambda: None):
        self.sync = sync
        self.seconds: dict[str, float] = defaultdict(float)
        self.t0 = time.monotonic()
        self._inner: list[float] = []  # per open part, the seconds of the parts timed inside it

    def timed(self, part: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.sync()
        t = time.monotonic()
        self._inner.append(0.0)
        try:
            return fn(*args, **kwargs)
        finally:
            self.sync()
            dt = time.monotonic() - t
            self.seconds[part] += dt - self._inner.pop()
            if self._inner:
                self._inner[-1] += dt

    def parts(self) -> tuple[tuple[str, float], ...]:
        """Each part's seconds, largest first, and the rest of the time since the clock started."""
        rest = time.monotonic() - self.t0 - sum(self.seconds.values())
        out = sorted(((k, round(v, 3)) for k, v in self.seconds.items()), key=lambda kv: -kv[1])
        return tuple(out) + ((REST, round(max(rest, 0.0), 3)),)


class TimedRunner:
    """The runner, its calls and waits counted as the program's time."""

    def __init__(self, runner: Any, clock: Clock):
        self._runner, self._clock = runner, clock

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._runner, name)
        if name in ("run", "repeat", "sync"):
            return lambda *a, **k: self._clock.timed(PROGRAM, attr, *a, **k)
        return attr


class TimedReference:
    """The reference, each computation counted by kind."""

    def __init__(self, ref: Any, clock: Clock):
        self._ref, self._clock = ref, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ref, name)

    def draw(self, seed: int):
        return self._clock.timed(INPUTS, self._ref.draw, seed)

    def forward(self, draw, inputs=None):
        return self._clock.timed("reference (fp32)", self._ref.forward, draw, inputs)

    def forward64(self, draw, inputs=None):
        return self._clock.timed("reference in float64", self._ref.forward64, draw, inputs)

    def forward_at(self, policy: str, draw, inputs=None, *, emulated: str = ""):
        if emulated == "truncate":
            part = f"reference, {policy} truncated"
        elif emulated:
            part = f"reference, {policy} emulated"
        else:
            part = f"reference at {policy} (PyTorch's own)"
        return self._clock.timed(part, self._ref.forward_at, policy, draw, inputs, emulated=emulated)
