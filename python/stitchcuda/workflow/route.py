"""Routing: from the state to the next route (repair, optimize, replan, next, done).

* No candidate verified yet: *repair* the first one (it is wrong or does not build) until the
  proposers have nothing new, then *done*.
* A best exists: first *replan* without a target (whole-program constraints: exact rewrites, a
  narrower precision repair); then, task by task in the order of the profile's score (time x
  distance to the roofline), *optimize* the target (its strategies, a new body), *replan* it (a
  fusion boundary inside it), and *next* to the following task; *done* when the hot tasks are
  all tried. Whenever the best changes, what was exhausted is tried again from the new best.
"""

from __future__ import annotations

from typing import Sequence

from .state import Candidate, Route, State

#: How many of the hottest tasks the optimize route works through.
HOT_TASKS = 3


def hot_tasks(state: State, plan_estimate: Sequence = ()) -> list[str]:
    """The best's tasks by score (time x distance to roofline), highest first, at most HOT_TASKS.
    The profile's times when it attributed any kernel time to a task, else the plan's estimates."""
    best = state.best_candidate
    times = [t for t in (best.judgement.tasks if best is not None and best.judgement is not None else ()) if t.us > 0]
    if not times:
        times = [t for t in plan_estimate if t.us > 0]
    times.sort(key=lambda t: -t.score)
    return [t.task for t in times[:HOT_TASKS]]


def decide(state: State, hot: Sequence[str]) -> Route:
    base = state.base()
    if base is None:
        raise ValueError("decide: the run has no candidate yet")
    if state.best is None:
        if not state.is_exhausted("repair", None):
            why = base.judgement.summary if base.judgement is not None else "not judged"
            return Route("repair", None, f"nothing verified yet: {why}")
        return Route("done", None, "no candidate verified, and no proposer has another repair")
    if not state.is_exhausted("replan", None):
        return Route("replan", None, "the best verifies: whole-program constraints (exact rewrites, precision)")
    open_ = [t for t in hot if not (state.is_exhausted("optimize", t) and state.is_exhausted("replan", t))]
    tgt = state.target
    if tgt is None or tgt not in open_:
        if open_:
            return Route("next", open_[0], f"task {open_[0]} has the most time x distance to its roofline left")
        return Route("done", None, f"the {len(hot)} hottest task(s) have been tried every way the proposers know")
    if not state.is_exhausted("optimize", tgt):
        return Route("optimize", tgt, f"{tgt}: another body or strategy")
    return Route("replan", tgt, f"{tgt}: other fusion boundaries")


def precision_first(route: Route, base: Candidate | None) -> bool:
    """Whether a repair asks the precision proposer first: the wrong answer is one that PyTorch's own
    arithmetic at the policy misses too on the same inputs (the Verifier's note). Precision is then
    the likeliest mend; an exact rewrite mends it only where it removes a rounding product, and each
    one tried first costs a whole verification (tens of seconds for a deep net) of a loop's budget of
    minutes. The rewrites are still proposed afterwards, from the repaired best."""
    from ..verifier.run.session import policy_misses_too

    j = getattr(base, "judgement", None)
    return route.kind == "repair" and j is not None and j.kind == "wrong_answer" and policy_misses_too(j.policy_note)


__all__ = ["decide", "hot_tasks", "precision_first", "HOT_TASKS"]
