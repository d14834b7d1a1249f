"""Rendering one task's body from its spec, by the task's kind.

Takes a :class:`~stitchcuda.plan.specs.Task` and its :class:`~.contract.TaskContract`; gives
the lines to put before the task's function (functors for elementwise expressions and reduction
hooks, a template's include) and the lines of its body, spelled by the kind's renderer
(:mod:`stitchcuda.kinds`). Pointers are spelled by the contract's parameter names; layouts,
leading dims, hooks and precision all come from the spec — nothing is decided here.
"""

from __future__ import annotations

from .. import kinds
from ..kinds.cxx import CodeError
from ..plan.specs import Task
from .contract import TaskContract


class Names:
    """A task's parameter names by spec field (what a kind's renderer spells pointers with)."""

    def __init__(self, c: TaskContract):
        self.by_field = {p.field: p.name for p in c.params}

    def __call__(self, field: str) -> str:
        return self.by_field[field]

    def opt(self, field: str, null: str = "nullptr") -> str:
        """The parameter of an optional field, or ``null`` when the spec has none."""
        return self.by_field.get(field, null)


def render_task(t: Task, c: TaskContract) -> tuple[list[str], list[str]]:
    """(lines before the task's function, lines of its body)."""
    try:
        kind = kinds.of_spec(t.params)
    except KeyError:
        raise CodeError(f"task {t.name}: unknown spec {type(t.params).__name__}") from None
    return kind.render(t, t.params, Names(c), c.function)


__all__ = ["CodeError", "Names", "render_task"]
