"""Pass 6, *lower*: protos become tasks — specs over concrete layouts of concrete buffers.

Takes the :class:`~.fused.Fused` protos in the order *schedule* chose, the *place* targets and
the buffer table; gives :class:`Lowered`: the tasks (each with its kind's spec:
:mod:`stitchcuda.kinds`), uniquely named, and per task name the tensors it touched (for
*schedule*'s covering). Each proto is lowered by its kind (:func:`stitchcuda.kinds.lowering`),
through the helpers of :class:`Lowerer`: a layout op's result is its input's layout transformed
(:mod:`stitchcuda.layout`), or — when strides cannot express it — the layout of a contiguous
copy made by a copy task placed before the reader; a task writes its placement target when its
kernel can write that layout, else over an input that dies with it (in place), else a fresh
buffer.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from .. import kinds
from .. import layout as L
from .. import ops
from ..ir import Node
from ..kinds import AnyProto
from ..kinds.copy import CopySpec, copy_item
from ..layout import View
from ..ops import EwInstr
from ..precision import get as get_policy
from .buffers import Alloc, Tensors, ident
from .fused import Fused
from .place import Targets
from .schedule import last_reads
from .specs import PlanError, Task

A = ops.A


@dataclass(frozen=True)
class Lowered:
    """What *lower* gives: the tasks in run order, uniquely named; per task name the tensors it
    touched (what *schedule*'s covering reads); the ``cat`` nodes whose parts were all written in
    place, with their parts."""

    tasks: tuple[Task, ...]
    touched: Mapping[str, frozenset[str]]
    cats_in_place: tuple[tuple[str, tuple[str, ...]], ...]


class Lowerer:
    """The helpers a kind's lowering works through (``lw`` in :mod:`stitchcuda.kinds`), and the
    tasks it has made so far; :meth:`emit` lowers one proto, :meth:`result` ends the pass."""

    def __init__(self, fused: Fused, alloc: Alloc, tensors: Tensors, targets: Targets,
                 last_read: dict[str, float]):
        self.f = fused
        self.ix = fused.index
        self.alloc = alloc
        self.buffers = alloc.buffers
        self.tensors = tensors
        self.materialized = tensors.materialized
        self.target = targets.view
        self.target_from = targets.came_from
        self.last_read = last_read
        self.policy = get_policy(fused.policy)
        self.storage = self.policy.storage
        self.views: dict[str, View] = {}
        self.tasks: list[Task] = []
        self.copies: dict[str, str] = {}  # view-failed tensor -> its contiguous copy
        # (tensor, view, dtype, order, phase) -> a copy read-only readers share (copy_contiguous's shared)
        self.shared_copies: dict[tuple, str] = {}
        self.touched: list[set[str]] = []  # per task of self.tasks, the tensors it touches
        self.cats_in_place: list[tuple[str, list[str]]] = []  # (cat node, parts) written in their slots
        self.joined: dict[str, list[View]] = {}  # tensor -> the join slots an earlier cat copied it into
        self.inplace_used: set[str] = set()
        self.rank = 0

    # ------------------------------------------------------------------ small helpers

    def spec(self, t: str):
        return self.alloc.spec(t)

    def shape(self, t: str) -> tuple[int, ...]:
        return self.alloc.spec(t).shape

    def storage_of(self, dtype: str) -> str:
        return self.policy.storage_of(dtype)

    def tensor_storage(self, t: str) -> str:
        return "float32" if t in self.f.keep_f32 else self.storage_of(self.spec(t).dtype)

    def fail(self, node: Node, why: str) -> PlanError:
        return PlanError(self.ix.name, [(node.op, node.name, node.source, why)])

    def lower_ew(self, node: Node, operands: dict[str, str], base: int) -> list[EwInstr] | None:
        return ops.lower(node, operands, lambda i: self.spec(node.inputs[i]).dtype, self.ix.args, base)

    def hook(self, names: Sequence[str]) -> tuple[EwInstr, ...]:
        """The instructions of a reduction's prologue / epilogue hook (nodes in run order, the last
        one's result the hook's), on input ``a0``: the one tensor the nodes read that none of them
        makes (see ``Claims.hooks``)."""
        instrs: list[EwInstr] = []
        refs: dict[str, str] = {}
        for nm in names:
            nd = self.ix.nodes[nm]
            new = self.lower_ew(nd, {t: refs.get(t, "a0") for t in nd.inputs}, len(instrs))
            if new is None:
                raise self.fail(nd, "no elementwise translation")
            instrs.extend(new)
            refs[nd.outputs[0].name] = f"t{len(instrs) - 1}"
        return tuple(instrs)

    # ------------------------------------------------------------------ views

    def read(self, t: str, pre: list[Task], phase: str) -> View:
        """The layout of tensor ``t``: materialised tensors have one; a layout op's result is
        its input's layout transformed, or — when strides cannot express it — that of a
        contiguous copy of the input made by a task appended to ``pre``."""
        if t in self.views:
            return self.views[t]
        n = self.ix.producer.get(t)
        if n is None or ops.kind(n.op) != "view":
            raise AssertionError(f"tensor {t} is used before a task produced it")
        x = n.inputs[0]
        vx = self.read(x, pre, phase)
        v = self._forward(n, t, vx)
        if v is None:
            c = self.copies.get(x)
            if c is None:
                c = self.copy_contiguous(x, vx, pre, phase, why=f"{n.name} needs {x} contiguous")
                self.copies[x] = c
            v = self._forward(n, t, self.views[c])
            assert v is not None, f"{n.op} of a contiguous tensor must be a view"
        self.views[t] = v
        return v

    def _forward(self, n: Node, t: str, vx: View) -> View | None:
        op = n.op
        ys = self.shape(t)
        if op in ops.TRANSPARENT:
            return vx
        if op in ops.RESHAPES:
            return L.reshape(vx, ys)
        if op == A + "permute.default":
            return L.permute(vx, n.attr("dims"))
        if op == A + "transpose.int":
            return L.transpose(vx, int(n.attr("dim0")), int(n.attr("dim1")))
        if op == A + "t.default":
            return L.transpose(vx, 0, 1) if vx.ndim == 2 else vx
        if op == A + "unsqueeze.default":
            return L.unsqueeze(vx, int(n.attr("dim")))
        if op in (A + "squeeze.dims", A + "squeeze.dim", A + "squeeze.default"):
            dims = n.attr("dim")
            dims = None if dims is None else ([dims] if isinstance(dims, int) else list(dims))
            v = L.squeeze(vx, dims)
            return v if v.shape == ys else L.reshape(vx, ys)
        if op == A + "slice.Tensor":
            return L.slice_(vx, int(n.attr("dim", 0)), n.attr("start"), n.attr("end"), int(n.attr("step", 1) or 1))
        if op == A + "select.int":
            return L.select(vx, int(n.attr("dim")), int(n.attr("index")))
        if op == A + "expand.default":
            return L.expand(vx, n.attr("size"))
        if op in (A + "split_with_sizes.default", A + "split.Tensor"):
            dim = L.norm_dim(int(n.attr("dim", 0) or 0), vx.ndim)
            idx = [o.name for o in n.outputs].index(t)
            if op == A + "split.Tensor":
                size = int(n.attr("split_size"))
                start = idx * size
                end = min(start + size, vx.shape[dim])
            else:
                sizes = n.attr("split_sizes")
                start = sum(sizes[:idx])
                end = start + sizes[idx]
            return L.slice_(vx, dim, start, end)
        if op == A + "unfold.default":  # windows of `size` every `step` along dim, as a last dim
            d = L.norm_dim(int(n.attr("dimension")), vx.ndim) if vx.ndim else 0
            size, step = int(n.attr("size")), int(n.attr("step"))
            sh, st = list(vx.shape), list(vx.strides)
            if not vx.ndim:
                return dataclasses.replace(vx, shape=(size,), strides=(0,))
            count = (sh[d] - size) // step + 1
            return dataclasses.replace(vx, shape=tuple(sh[:d] + [count] + sh[d + 1:] + [size]),
                                       strides=tuple(st[:d] + [st[d] * step] + st[d + 1:] + [st[d]]))
        if op == A + "diagonal.default":
            off = int(n.attr("offset", 0) or 0)
            d1 = L.norm_dim(int(n.attr("dim1", 0)), vx.ndim)
            d2 = L.norm_dim(int(n.attr("dim2", 1)), vx.ndim)
            keep = [d for d in range(vx.ndim) if d not in (d1, d2)]
            start = off * vx.strides[d2] if off >= 0 else -off * vx.strides[d1]
            return dataclasses.replace(vx, offset=vx.offset + (start if ys[-1] else 0),
                                       shape=tuple(vx.shape[d] for d in keep) + (ys[-1],),
                                       strides=tuple(vx.strides[d] for d in keep) + (vx.strides[d1] + vx.strides[d2],))
        raise AssertionError(f"not a layout op: {op}")

    def channel_vector(self, t: str | None, c: int, pre: list[Task], phase: str) -> View | None:
        """Tensor ``t`` (None: none) read as a contiguous vector of ``c`` elements, through a copy
        when its layout is not one (per-channel weights, biases and running statistics)."""
        if not t:
            return None
        v = self.read(t, pre, phase)
        v1 = L.reshape(v, (c,))
        if v1 is None or (c > 1 and v1.strides[0] != 1):
            cc = self.copy_contiguous(t, v, pre, phase, why="per-channel vector must be contiguous")
            v1 = L.reshape(self.views[cc], (c,))
        return v1

    def copy_contiguous(self, x: str, vx: View, pre: list[Task], phase: str, *, why: str,
                        dtype: str | None = None, shape_view: View | None = None,
                        order: Sequence[int] | None = None, shared: bool = False) -> str:
        """Append a copy of ``vx`` (or ``shape_view``, a view to materialise as is) into a
        fresh dense buffer (contiguous, or laid out in ``order``); return the new tensor's name.
        ``shared``: the caller only reads the copy, and so may a later reader asking for the same
        one (the same view of ``x`` in the same dtype, order and phase): it gets this copy, made
        once (three convolutions of one channels-first input converted it three times)."""
        src = shape_view or vx
        dtype = dtype or src.dtype
        key = (x, src, dtype, None if order is None else tuple(order), phase)
        if shared and key in self.shared_copies:
            return self.shared_copies[key]
        name = self.alloc.add_tensor(f"{x}_c", src.shape, dtype)
        dst = self.alloc.fresh(name, dtype, src.shape, phase, order)
        self.views[name] = dst
        verb = "cast" if dtype != src.dtype else "copy"
        pre.append(self.copy_task(f"{verb}_{ident(x)}", [], src, dst, phase, note=why))
        if shared:
            self.shared_copies[key] = name
        return name

    def shared_copy(self, x: str, vx: View, dtype: str, order: Sequence[int] | None, phase: str) -> View | None:
        """The view of a shared copy of ``vx`` (of ``x``) already made in ``dtype`` and ``order``
        (:meth:`copy_contiguous`), or None: a reader that works in either layout reads that one."""
        name = self.shared_copies.get((x, vx, dtype, None if order is None else tuple(order), phase))
        return None if name is None else self.views[name]

    def task(self, name: str, covers: Sequence[str], inputs: Sequence[str], outputs: Sequence[str], spec: Any, *,
             phase: str = "run", note: str = "") -> Task:
        """A task of ``spec``'s kind (its strategy is the kind's)."""
        return Task(name, kinds.of_spec(spec).strategy, tuple(covers), tuple(inputs), tuple(outputs), spec,
                    phase=phase, note=note)

    def copy_task(self, name: str, covers: list[str], src: View, dst: View, phase: str, note: str = "") -> Task:
        spec = CopySpec("copy", (copy_item(src, dst),))
        return self.task(name, covers, (src.buffer,), (dst.buffer,), spec, phase=phase, note=note)

    def fresh_rows(self, tensor: str, dtype: str, shape: Sequence[int], phase: str,
                   order: Sequence[int] | None = None) -> View:
        """A fresh buffer for a synthetic tensor (rows written before a copy back, a workspace),
        contiguous or dense in ``order``."""
        tmp = self.alloc.add_tensor(tensor, shape, dtype)
        v = self.alloc.fresh(tmp, dtype, shape, phase, order)
        self.views[tmp] = v
        return v

    # ------------------------------------------------------------------ outputs of a task

    def out_view(self, pr: AnyProto, t: str, accept: Callable[[View], bool], inplace: Sequence[str] = (),
                 order: Sequence[int] | None = None) -> View:
        """The layout a proto writes ``t`` in: its placement target when ``accept`` takes it,
        else the buffer of an input (``inplace`` candidates) that no later task reads, dense in
        ``order``, else a fresh dense buffer (contiguous, or in ``order``)."""
        if t in self.views:
            return self.views[t]
        tv = self.target.get(t)
        reuse = None
        if pr.phase == "run" and not (tv is not None and accept(tv)):
            want = self.tensor_storage(t)
            for x in inplace:
                vx = self.views.get(x)
                if vx is None or x not in self.materialized or x in self.inplace_used or \
                        self.last_read.get(x, math.inf) != self.rank:
                    continue
                b = self.buffers[vx.buffer]
                if b.kind == "arena" and vx.offset == 0 and L.is_dense_in(vx, order) and \
                        vx.numel == math.prod(b.shape) and vx.shape == self.spec(t).shape and vx.dtype == want:
                    reuse = vx
                    self.inplace_used.add(x)
                    break
        if reuse is not None:
            v = reuse
        elif tv is not None and pr.phase == "run" and accept(tv):
            v = tv
        else:
            v = self.alloc.fresh(t, self.tensor_storage(t), self.spec(t).shape, pr.phase, order)
        self.views[t] = v
        return v

    def add(self, pr: AnyProto, name: str, spec: Any, reads: Iterable[View | None], writes: Iterable[View | None],
            touched: Iterable[str] = (), covers: Sequence[str] | None = None, note: str = "") -> None:
        """A task of ``pr`` computing ``spec`` (reading and writing those views); ``touched``: the
        graph tensors it reads or writes, which *schedule* follows back through layout ops."""
        reads = [v for v in reads if v is not None]
        writes = [v for v in writes if v is not None]
        covers = self.ix.expand(list(pr.nodes) if covers is None else list(covers))
        t = self.task(name, tuple(dict.fromkeys(covers)), tuple(dict.fromkeys(v.buffer for v in reads)),
                      tuple(dict.fromkeys(v.buffer for v in writes)), spec, phase=pr.phase, note=note)
        tt = set(touched)
        for x in list(tt):
            tt.update(self.tensors.chain(x))
            y = x
            while y in self.target_from:
                y = self.target_from[y]
                tt.add(y)
        self.append(t, tt)

    def append(self, task: Task, touched: Iterable[str] = ()) -> None:
        """Add a task as it is (a copy after a kernel that wrote a fresh buffer)."""
        self.tasks.append(task)
        self.touched.append(set(touched))

    # ------------------------------------------------------------------ driving

    def emit(self, idx: int, rank: int) -> None:
        """Lower proto ``idx`` (the ``rank``-th to run) by its kind: the copies it needs first,
        then its own tasks."""
        self.rank = rank
        pr = self.f.protos[idx]
        pre: list[Task] = []
        before = len(self.tasks)
        kinds.lowering(pr)(self, pr, pre)
        new, new_touched = self.tasks[before:], self.touched[before:]
        del self.tasks[before:], self.touched[before:]
        for t in pre:
            self.append(t if t.covers else dataclasses.replace(t, covers=tuple(self.ix.expand(pr.nodes))))
        self.tasks.extend(new)
        self.touched.extend(new_touched)

    def output_copies(self) -> None:
        """A copy task for every graph output its producer could not write in place."""
        g = self.ix.g
        for i, t in enumerate(g.outputs):
            dst = L.contiguous(f"out{i}", g.spec(t).shape, g.spec(t).dtype)
            pre: list[Task] = []
            src = self.read(t, pre, "run")
            for c in pre:  # (each with its touched set: result() pairs the two lists)
                self.append(c)
            if src.buffer == dst.buffer and src.offset == 0 and L.same_strides(src.shape, src.strides, dst.strides):
                continue
            task = self.copy_task(f"output_{ident(t)}", [], src, dst, "run", note=f"output {i}")
            self.append(task, self.tensors.chain(t))

    def result(self) -> Lowered:
        """The pass's result: the tasks named uniquely (a repeated name gets ``_1``, ``_2``, ... in
        run order), the tensors each touched by its name."""
        assert len(self.tasks) == len(self.touched), "every task is added with its touched set"
        seen: dict[str, int] = {}
        tasks, touched = [], {}
        for t, tt in zip(self.tasks, self.touched):
            base = ident(t.name) or "task"
            name = base
            while name in seen:
                seen[base] += 1
                name = f"{base}_{seen[base]}"
            seen.setdefault(name, 0)
            tasks.append(dataclasses.replace(t, name=name))
            touched[name] = frozenset(tt)
        return Lowered(tuple(tasks), touched, tuple((c, tuple(p)) for c, p in self.cats_in_place))


def lower(fused: Fused, alloc: Alloc, tensors: Tensors, targets: Targets, order: Sequence[int],
          views: Mapping[str, View]) -> Lowered:
    """Lower every proto of ``fused`` in ``order`` (see the module docstring); ``views``: the
    layouts of the program's inputs and weights."""
    lw = Lowerer(fused, alloc, tensors, targets, last_reads(fused, tensors, list(order)))
    lw.views.update(views)
    for rank, idx in enumerate(order):
        lw.emit(idx, rank)
    lw.output_copies()
    return lw.result()


__all__ = ["Lowerer", "Lowered", "lower"]
