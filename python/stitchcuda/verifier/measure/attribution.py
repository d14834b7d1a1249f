"""Which task each kernel of a profiled run belongs to, where no kernel name says it (pure
functions; :func:`stitchcuda.verifier.measure.cupti.attribute` uses them).

A kernel whose name holds a task's name is that task's (:func:`match_task`); where later tasks run
an earlier one's compiled kernels (the manifest's ``kernels_of``), each goes to the member of the
group whose turn it is (:func:`share_group_kernels`); the rest — library kernels, shared templates —
go by program order to the tasks between their named neighbours that claimed none
(:func:`place_unnamed`), by family where their count does not divide (:func:`align_kernels`).
"""

from __future__ import annotations

from typing import Sequence

from ...manifest import TaskRecord as Task

#: Strategies whose tasks are library calls (their kernels carry the library's names, not the task's).
RUNTIME_STRATEGIES = ("cublaslt_gemm", "epilogue_template", "cudnn_conv")


def match_task(kernel_name: str, tasks: Sequence[Task]) -> Task | None:
    """The task whose name appears in the kernel's name (case-insensitive; the longest wins)."""
    low = kernel_name.lower()
    hits = [t for t in tasks if t.name and t.name.lower() in low]
    return max(hits, key=lambda t: len(t.name)) if hits else None



def share_group_kernels(owner: list[str], tasks: Sequence[Task]) -> None:
    """Reassign in ``owner`` (one task name per kernel, in time order) the kernels named after a task
    that later tasks share (their ``kernels_of`` names it): a group's members launch the same kernels,
    so with k of them named in a run and m members, the j-th goes to member j // (k / m) in program
    order; where k is no multiple of m, each to the first member after the last owner placed."""
    groups: dict[str, list[str]] = {}
    for t in tasks:
        first = getattr(t, "kernels_of", "")
        if first:
            groups.setdefault(first, [first]).append(t.name)
    if not groups:
        return
    index = {t.name: i for i, t in enumerate(tasks)}
    for first, members in groups.items():
        at = [i for i, o in enumerate(owner) if o == first]
        if not at:
            continue
        if len(at) % len(members) == 0:
            per = len(at) // len(members)
            for j, i in enumerate(at):
                owner[i] = members[j // per]
            continue
        last = -1
        for i, o in enumerate(owner):
            if o == first:
                later = [m for m in members if index[m] > last]
                owner[i] = later[0] if later else members[-1]
            if owner[i]:
                last = index.get(owner[i], last)


def is_library_kernel(name: str) -> bool:
    """Whether a kernel is a library's (cuBLASLt, cuDNN): not one of the program's own templates
    (namespace ``stitch::``) or functions (``task::``)."""
    return "stitch::" not in name and "task::" not in name


def align_kernels(library: Sequence[bool], tasks: Sequence[Task]) -> tuple[list[int], int]:
    """Kernels (in time order, each a library's or not) given to ``tasks`` (in program order), each
    kernel to one task, in order: the assignment that gives most kernels a task of their family (a
    library kernel a library call's task, a template kernel a template's) and leaves fewest tasks
    without a kernel; (each kernel's task index, that score)."""
    n, m = len(library), len(tasks)
    runtime = [t.strategy in RUNTIME_STRATEGIES for t in tasks]
    neg = -(n + m + 1)
    # best[i][j]: the best score of kernels 0..i with kernel i on task j (tasks skipped before j count -1 each)
    best = [[neg] * m for _ in range(n)]
    back = [[-1] * m for _ in range(n)]
    for j in range(m):
        best[0][j] = int(library[0] == runtime[j]) - j
    for i in range(1, n):
        prev = best[i - 1]
        top, top_k = neg, -1  # max over k < j of prev[k] + k (from task k to j skips j - k - 1)
        for j in range(m):
            if j > 0 and prev[j - 1] + j - 1 > top:
                top, top_k = prev[j - 1] + j - 1, j - 1
            v, k = prev[j], j
            if top_k >= 0 and top - j + 1 > v:
                v, k = top - j + 1, top_k
            best[i][j], back[i][j] = v + int(library[i] == runtime[j]), k
    end = max(range(m), key=lambda j: (best[n - 1][j] - (m - 1 - j), j))
    score = best[n - 1][end] - (m - 1 - end)
    out = [end]
    for i in range(n - 1, 0, -1):
        out.append(back[i][out[-1]])
    return out[::-1], score


def _score(library: Sequence[bool], tasks: Sequence[Task], at: Sequence[int]) -> int:
    runtime = [t.strategy in RUNTIME_STRATEGIES for t in tasks]
    return sum(int(lib == runtime[j]) for lib, j in zip(library, at)) - (len(tasks) - len(set(at)))


def place_unnamed(owner: list[str], tasks: Sequence[Task], kernel_names: Sequence[str] | None = None) -> None:
    """Fill ``owner`` (one task name per kernel in time order, "" when unnamed) by program order.

    A run of unnamed kernels between two named ones goes to the tasks between those that claimed
    none: one task takes them all; as many kernels a task when they divide evenly; otherwise (or
    when the even split gives a library kernel to a template's task, or the other way round) by
    :func:`align_kernels` over the kernels' families (``kernel_names``). A squeeze-expand block's
    eight unnamed kernels over five tasks went one each to the first five, the last convolution's
    GEMM and the join's two copies to none."""
    index = {t.name: i for i, t in enumerate(tasks)}
    claimed = {o for o in owner if o}
    free = [i for i, t in enumerate(tasks) if t.name not in claimed and getattr(t, "phase", "run") == "run"]
    i = 0
    while i < len(owner):
        if owner[i]:
            i += 1
            continue
        j = i
        while j < len(owner) and not owner[j]:
            j += 1
        lo = index[owner[i - 1]] if i > 0 else -1
        hi = index[owner[j]] if j < len(owner) else len(tasks)
        between = [tasks[k].name for k in free if lo < k < hi]
        if not between:  # a library kernel of a task that also launched a named one (GEMM, then its epilogue)
            between = [tasks[k].name for k in (hi, lo) if 0 <= k < len(tasks)
                       and tasks[k].strategy in RUNTIME_STRATEGIES][:1]
        span = range(i, j)
        even = None
        if len(between) == 1 or (between and len(span) % len(between) == 0):
            per = len(span) // len(between)  # each task the same number of kernels (split-K, split rows)
            even = [n // per for n in range(len(span))]
        if len(between) > 1 and kernel_names is not None:
            library = [is_library_kernel(kernel_names[k]) for k in span]
            sub = [tasks[index[b]] for b in between]
            at, score = align_kernels(library, sub)
            if even is None or score > _score(library, sub, even):
                even = at
        if even is not None:
            for n, k in enumerate(span):
                owner[k] = between[even[n]]
        else:
            for name, k in zip(between, span):
                owner[k] = name
        i = j


__all__ = ["RUNTIME_STRATEGIES", "match_task", "share_group_kernels", "is_library_kernel", "align_kernels",
           "place_unnamed"]
