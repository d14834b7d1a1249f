"""The run's final report: the best candidate, per task where its code came from and what each
attempt scored, the precision repair's findings, and the LLM's share (``report.md``)."""

from __future__ import annotations



from .proposers import responsible
from .state import State


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def render(state: State, llm_usage: dict | None = None) -> str:
    best, root = state.best_candidate, state.root_candidate
    lines = [f"# optimize {state.reference} ({state.precision})", "",
             f"Run `{state.run_id}`: {len(state.candidates)} candidate(s), {state.spent.wall_s:.0f} s wall, "
             f"{state.spent.gpu_s:.0f} s judging. Ended: {state.finished or 'interrupted'}.", ""]
    if root is not None and root.judgement is not None:
        lines.append(f"- `build` (the first candidate, {root.id}): {root.judgement.summary}"
                     + (f", {_ms(root.ms)} ms" if root.ms is not None else ""))
    for cid, why in state.set_aside:
        lines.append(f"- set aside: {cid} passed the search's trials but failed its final verification ({why})")
    if best is None:
        lines.append("- **no candidate verified**: there is no program to ship from this run."
                     if not state.set_aside else
                     "- **no candidate passed its final verification**: there is no program to ship from this run.")
    else:
        gain = f" ({root.ms / best.ms:.2f}x over `build`)" if root is not None and root.ok and root.ms and best.ms else ""
        lines.append(f"- best: {best.id} by {best.proposer} ({best.description}): {_ms(best.ms)} ms{gain}")
        if state.final is not None:
            f = state.final
            base = dict(f.baselines)
            ratios = ", ".join(f"{k} {v / f.ms:.2f}x" for k, v in base.items() if f.ms)
            lines.append(f"- final verification (all trials and baselines): {f.summary}"
                         + (f"; {_ms(f.ms)} ms; speedup vs {ratios}" if ratios else ""))
    kept, why = responsible(state)
    if kept:
        lines.append(f"- precision repair: only {', '.join(kept)} raised to fp32" + (f" ({why})" if why else ""))
    if llm_usage:
        lines.append(f"- LLM: {llm_usage.get('calls', 0)} call(s) ({llm_usage.get('cached', 0)} from the cache), "
                     f"{llm_usage.get('prompt_tokens', 0)} prompt + {llm_usage.get('completion_tokens', 0)} "
                     f"completion tokens, {llm_usage.get('wall_s', 0.0):.1f} s")
    if best is not None and best.origins:
        n_llm = sum(1 for o in best.origins.values() if o == "llm")
        lines.append(f"- the LLM wrote {n_llm} of the best program's {len(best.origins)} task(s)")
        lines += ["", "## Tasks of the best program", "", "| task | code from | attempts on it |", "|---|---|---|"]
        for task, origin in best.origins.items():
            tries = [c for c in state.candidates if c.target == task or task in c.overrides]
            scored = "; ".join(f"{c.id} {c.proposer}: {c.judgement.kind if c.judgement else '?'}"
                               + (f" {_ms(c.ms)} ms" if c.ms is not None else "") for c in tries) or "-"
            lines.append(f"| {task} | {origin} | {scored} |")
    lines += ["", "## Candidates", "", "| id | route | proposer | what | verdict | ms | best |", "|---|---|---|---|---|---|---|"]
    for c in state.candidates:
        j = c.judgement
        lines.append(f"| {c.id} | {c.route}{' ' + c.target if c.target else ''} | {c.proposer} | {c.description} | "
                     f"{(j.summary if j else 'in flight').replace('|', '/')} | {_ms(c.ms)} | {'**yes**' if c.id == state.best else ''} |")
    return "\n".join(lines) + "\n"


def proposer_wins(state: State) -> list[str]:
    """The proposers of the chain of bests (each best that replaced another), in order."""
    wins, best = [], None
    for c in state.candidates:
        if c.ok and c.ms is not None and (best is None or c.ms < best.ms * (1.0 - state.min_gain)):
            best = c
            wins.append(c.proposer)
    return wins


__all__ = ["render", "proposer_wins"]
