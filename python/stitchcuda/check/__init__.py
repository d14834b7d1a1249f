"""Checking one task alone: the plan interpreter and ``check_task``.

:mod:`.interp` runs a plan's task specs with PyTorch over byte buffers (the semantic model of a
plan: what each task must compute); :mod:`.task` checks one task's body — the template's, a
hand-written one, an LLM's — against it, compiled in the context of its program; :mod:`.harness`
checks every instruction of the op registry against its PyTorch reference, compiled for the host
and the device.
"""

from .task import TaskCheck, check_plan_semantics, check_task

__all__ = ["TaskCheck", "check_task", "check_plan_semantics"]
