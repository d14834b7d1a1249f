"""The plan interpreter: every task spec executed over byte buffers on the CPU, as the GPU would.

Takes a :class:`~stitchcuda.plan.specs.Plan`, weights and inputs (PyTorch tensors); gives the
outputs — and, task by task, the state of every buffer (:meth:`Simulator.steps`), which is what
:func:`stitchcuda.check.check_task` compares one task's body against. The planner decides
layouts, leading dims, batch strides, fusion, epilogue order, in-place writes and arena offsets;
the Coder only spells them; this module runs the specs with PyTorch (math in float64, results
stored in each buffer's storage dtype) over one byte array per buffer — the arena is *one* byte
array, so two intermediates whose lifetimes the planner wrongly overlapped corrupt each other
here too. Outputs are poisoned with NaN and the arena filled with garbage before every run, so
reading what was not written in this run shows up.

It mirrors the semantics the templates and the runtime document (stitchrt.h, reduce.cuh,
elementwise.cuh, attention.cuh); elementwise instructions and GEMM epilogue ops are evaluated by
the op registry's PyTorch references (:mod:`stitchcuda.ops`). It is a model of the plan, not of
the kernels: the kernels are checked against it.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch

from .. import ops
from .. import plan as P
from ..layout import View

TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "bool": torch.bool,
         "uint8": torch.uint8, "int8": torch.int8, "int32": torch.int32, "int64": torch.int64, "float64": torch.float64}
F64 = torch.float64


class Memory:
    """One byte array per buffer (the arena one array for all of its buffers), on ``device``."""

    def __init__(self, plan: P.Plan, device: str = "cpu"):
        self.plan = plan
        self.device = torch.device(device)
        self.bufs: dict[str, torch.Tensor] = {}
        self.arena = torch.zeros(max(plan.arena_bytes, 1), dtype=torch.uint8, device=self.device)
        for b in plan.buffers:
            if b.kind == "arena":
                assert b.offset % P.ARENA_ALIGN == 0, f"{b.name} misaligned"
                assert b.offset + b.nbytes <= plan.arena_bytes, f"{b.name} outside the arena"
                self.bufs[b.name] = self.arena[b.offset:b.offset + b.nbytes]
            else:
                self.bufs[b.name] = torch.zeros(max(b.nbytes, 1), dtype=torch.uint8, device=self.device)

    def clone(self) -> "Memory":
        """An independent copy of every buffer (the arena stays one byte array)."""
        m = Memory.__new__(Memory)
        m.plan = self.plan
        m.device = self.device
        m.arena = self.arena.clone()
        m.bufs = {}
        for b in self.plan.buffers:
            m.bufs[b.name] = m.arena[b.offset:b.offset + b.nbytes] if b.kind == "arena" else self.bufs[b.name].clone()
        return m

    def typed(self, name: str, dtype: str) -> torch.Tensor:
        raw = self.bufs[name]
        size = torch.empty((), dtype=TORCH[dtype]).element_size()
        n = raw.numel() // size * size
        return raw[:n].view(TORCH[dtype])

    def view(self, v: View, shape: Sequence[int] | None = None, strides: Sequence[int] | None = None,
             offset: int = 0) -> torch.Tensor:
        flat = self.typed(v.buffer, v.dtype)
        shape = v.shape if shape is None else tuple(shape)
        strides = v.strides if strides is None else tuple(strides)
        if math.prod(shape) == 0:
            return torch.empty(shape, dtype=flat.dtype, device=flat.device)
        last = v.offset + offset + sum((d - 1) * s for d, s in zip(shape, strides))
        assert 0 <= v.offset + offset and last < flat.numel(), f"view {v.describe()} {shape}/{strides} out of bounds"
        return torch.as_strided(flat, shape, strides, flat.storage_offset() + v.offset + offset)

    def read(self, v: View, shape=None, strides=None, offset: int = 0) -> torch.Tensor:
        return self.view(v, shape, strides, offset).to(F64)

    def write(self, v: View, value: torch.Tensor, shape=None, strides=None, offset: int = 0) -> None:
        dst = self.view(v, shape, strides, offset)
        value = value.expand(dst.shape)
        if dst.dtype == torch.bool:
            value = value != 0
        elif not dst.dtype.is_floating_point:
            value = torch.trunc(value)
        dst.copy_(value.to(dst.dtype))


# ---------------------------------------------------------------------- expressions


def _c(x: float) -> torch.Tensor:
    return torch.tensor(float(x), dtype=F64)


def eval_instrs(instrs: Sequence[P.EwInstr], leaves: Sequence[torch.Tensor]) -> torch.Tensor:
    """An elementwise expression over float64 leaves, each instruction by its registry reference."""
    vals: list[torch.Tensor] = []

    def arg(a: str, ins: P.EwInstr) -> torch.Tensor:
        if a.startswith("a"):
            return leaves[int(a[1:])]
        if a.startswith("t"):
            return vals[int(a[1:])]
        return _c(ins.consts[int(a[1:])])

    for ins in instrs:
        vals.append(ops.instr(ins.op).ref(*[arg(a, ins) for a in ins.args]))
    return vals[-1] if vals else leaves[0]


def hook(instrs: Sequence[P.EwInstr], x: torch.Tensor) -> torch.Tensor:
    return eval_instrs(instrs, [x]) if instrs else x


# ---------------------------------------------------------------------- tasks


def run_task(mem: Memory, t: P.Task) -> None:
    s = t.params
    if isinstance(s, P.GemmSpec):
        _gemm(mem, s)
    elif isinstance(s, P.EwSpec):
        leaves = [mem.read(v, s.shape, st) for v, st in zip(s.inputs, s.in_strides)]
        mem.write(s.out, eval_instrs(s.instrs, leaves), s.shape, s.out_strides)
    elif isinstance(s, P.RowSpec):
        _row(mem, s)
    elif isinstance(s, P.AxisSpec):
        assert s.outer * s.inner <= 0 or s.red >= 1, "reduce.cuh: launch_reduce_axis refuses red < 1"
        x = hook(s.prologue, mem.read(s.x, (s.outer, s.red, s.inner), (s.in_so, s.in_sr, s.in_si)))
        r = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}[s.op](x, 1)
        mem.write(s.out, hook(s.epilogue, r), (s.outer, s.inner), (s.out_so, s.out_si))
    elif isinstance(s, P.AttentionSpec):
        _attention(mem, s)
    elif isinstance(s, P.AttentionMaskBlocksSpec):
        _attention_mask_blocks(mem, s)
    elif isinstance(s, P.CopySpec):
        for it in s.items:
            mem.write(it.dst, mem.read(it.src, it.shape, it.src_strides), it.shape, it.dst_strides)
    elif isinstance(s, P.BnStatsSpec):
        _bn(mem, s)
    elif isinstance(s, P.GroupStatsSpec):
        _group_stats(mem, s)
    elif isinstance(s, P.PoolSpec):
        _pool(mem, s)
    elif isinstance(s, P.ScanSpec):
        _scan(mem, s)
    elif isinstance(s, P.ArgSpec):
        _arg(mem, s)
    elif isinstance(s, P.GatherSpec):
        _gather(mem, s)
    elif isinstance(s, P.ConvSpec):
        _conv(mem, s)
    elif isinstance(s, P.RecurrentSpec):
        _recurrent(mem, s)
    elif isinstance(s, P.IotaSpec):
        n = s.out.shape[0] if s.out.ndim else 1
        mem.write(s.out, s.start + torch.arange(n, dtype=F64, device=mem.device) * s.step)
    else:
        raise AssertionError(type(s))


def _gemm(mem: Memory, g: P.GemmSpec) -> None:
    b = g.batch
    a = mem.read(g.a, (b, g.m, g.k), (g.stride_a, 1, g.lda) if g.trans_a else (g.stride_a, g.lda, 1))
    bm = mem.read(g.b, (b, g.k, g.n), (g.stride_b, 1, g.ldb) if g.trans_b else (g.stride_b, g.ldb, 1))
    acc = g.alpha * torch.bmm(a, bm)
    if g.beta != 0.0:
        acc = acc + g.beta * mem.read(g.c, (b, g.m, g.n), (g.stride_c, g.ldc, 1))
    if "bias" in g.epilogue:
        acc = acc + mem.read(g.bias, (g.n,), (1,))
    if g.epilogue.endswith("relu"):
        acc = torch.clamp_min(acc, 0)
    elif g.epilogue.endswith("gelu"):
        acc = torch.nn.functional.gelu(acc, approximate="tanh")
    out_strides = (g.stride_out, g.ldo, 1)
    mem.write(g.out, acc, (b, g.m, g.n), out_strides)
    if g.chain:
        assert b == 1 or g.stride_out == g.m * g.ldo, "batched epilogue over a non-dense batch"
        rows = g.m * b
        x = mem.read(g.out, (rows, g.n), (g.ldo, 1))
        ctx = {}
        if g.residual is not None:
            ctx["residual"] = mem.read(g.residual, (rows, g.n), (g.ldr, 1))
        if g.bias is not None:
            ctx["bias"] = mem.read(g.bias, (g.n,), (1,))
        for e in g.chain:
            x = ops.EPILOGUES[e.kind].ref(x, e.a, e.b, ctx)
        mem.write(g.out, x, (rows, g.n), (g.ldo, 1))


def _recurrent(mem: Memory, s: P.RecurrentSpec) -> None:
    """One layer of a recurrence in float64 (recurrent.cuh): every step of every direction, the
    state carried unrounded (the kernel keeps it in fp32), the sequence and final state stored."""
    from ..recurrent import cell

    D, T, B, H = s.directions, s.steps, s.batch, s.hidden
    assert s.gx.strides[-1] == 1 and s.w_hh.is_contiguous(), "recurrent.cuh: gx rows and W_hh dense"
    gx = mem.read(s.gx)
    for d in range(D):
        w = mem.read(s.w_hh if d == 0 else s.w_hh_r)
        bv = s.b_hh if d == 0 else s.b_hh_r
        b = mem.read(bv) if bv is not None else torch.zeros((), dtype=F64, device=mem.device)
        h = mem.read(s.h0)[d] if s.h0 is not None else torch.zeros((B, H), dtype=F64, device=mem.device)
        c = (mem.read(s.c0)[d] if s.c0 is not None else torch.zeros_like(h)) if s.mode == "lstm" else None
        out = mem.view(s.out)
        for step in range(T):
            t = T - 1 - step if d == 1 else step
            h, c = cell(s.mode, gx[d, t], h @ w.T + b, h, c)
            out[t, :, d * H:(d + 1) * H].copy_(h.to(out.dtype))
        if s.hn is not None:
            mem.write(s.hn, h, shape=(B, H), strides=s.hn.strides[1:], offset=d * s.hn.strides[0])
        if s.cn is not None:
            mem.write(s.cn, c, shape=(B, H), strides=s.cn.strides[1:], offset=d * s.cn.strides[0])


_CONV_ACT = {"none": lambda x: x, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
             "silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
             "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}


def _conv(mem: Memory, c: P.ConvSpec) -> None:
    """PyTorch's convolution in float64 (stitchrt.h: st_conv)."""
    F = torch.nn.functional
    sp = len(c.in_size)
    assert c.x.is_contiguous() and c.w.is_contiguous() and c.out.is_contiguous(), "st_conv takes dense operands"
    assert c.x.dtype == c.w.dtype == c.out.dtype, "st_conv: one storage type"
    x, w = mem.read(c.x), mem.read(c.w)
    b = mem.read(c.bias) if c.bias is not None else None
    if c.transposed:
        fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[sp - 1]
        y = fn(x, w, b, stride=c.stride, padding=c.padding, output_padding=c.output_padding, groups=c.groups,
               dilation=c.dilation)
    else:
        fn = (F.conv1d, F.conv2d, F.conv3d)[sp - 1]
        y = fn(x, w, b, stride=c.stride, padding=c.padding, dilation=c.dilation, groups=c.groups)
    assert tuple(y.shape) == c.out.shape, (tuple(y.shape), c.out.shape)
    mem.write(c.out, _CONV_ACT[c.activation](y))


def _row(mem: Memory, r: P.RowSpec) -> None:
    assert r.rows <= 0 or r.cols >= 1, "reduce.cuh: launch_row_reduce refuses cols < 1"
    x = hook(r.prologue, mem.read(r.x, (r.rows, r.cols), (r.ldi, 1)))
    op = r.op
    if op in ("softmax", "log_softmax", "layer_norm", "rms_norm"):
        if op == "softmax":
            y = torch.softmax(x, -1)
        elif op == "log_softmax":
            y = torch.log_softmax(x, -1)
        elif op == "layer_norm":
            mean = x.mean(-1, keepdim=True)
            var = ((x - mean) ** 2).mean(-1, keepdim=True)
            y = (x - mean) * torch.rsqrt(var + r.eps)
            if r.weight is not None:
                y = y * mem.read(r.weight, (r.cols,), (1,))
            if r.bias is not None:
                y = y + mem.read(r.bias, (r.cols,), (1,))
        else:
            y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + r.eps)
            if r.weight is not None:
                y = y * mem.read(r.weight, (r.cols,), (1,))
        mem.write(r.out, hook(r.epilogue, y), (r.rows, r.cols), (r.ldo, 1))
        return
    y = {"sum": lambda: x.sum(-1), "mean": lambda: x.mean(-1), "max": lambda: x.amax(-1), "min": lambda: x.amin(-1),
         "logsumexp": lambda: torch.logsumexp(x, -1),
         "var": lambda: x.var(-1, correction=1 if r.unbiased else 0)}[op]()
    mem.write(r.out, hook(r.epilogue, y), (r.rows,), (r.ldo,))


def _mask_cells(m: torch.Tensor, kind: str) -> torch.Tensor:
    """attention.cuh's mask summary of a [b, h, lq, lk] mask (float64 values): per 64 x 32 cell,
    bit 0 some element attends, bit 1 some element is masked."""
    vis, masked = (m != 0, m == 0) if kind == "bool" else (m != -math.inf, m != 0)
    cq, ck = P.ATTENTION_MASK_CELL
    lq, lk = m.shape[-2:]
    nq, nk = -(-lq // cq), -(-lk // ck)

    def cells(x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.pad(x.to(torch.uint8), (0, nk * ck - lk, 0, nq * cq - lq))
        return x.reshape(*x.shape[:2], nq, cq, nk, ck).amax(dim=(3, 5))

    return cells(vis) | (cells(masked) << 1)


def _attention_mask_blocks(mem: Memory, s: P.AttentionMaskBlocksSpec) -> None:
    # One summary per batch / head the mask does not broadcast over (zero strides in blocks).
    nb = s.batch if s.blocks.strides[0] else 1
    nh = s.heads if s.blocks.strides[1] else 1
    m = mem.read(s.mask)[:nb, :nh]
    shape = (nb, nh) + s.blocks.shape[2:]
    mem.write(s.blocks, _mask_cells(m, s.mask_kind).to(F64), shape, s.blocks.strides)


def _attention(mem: Memory, a: P.AttentionSpec) -> None:
    q, k, v = mem.read(a.q), mem.read(a.k), mem.read(a.v)
    if a.heads_per_kv > 1:
        k = k.repeat_interleave(a.heads_per_kv, 1)
        v = v.repeat_interleave(a.heads_per_kv, 1)
    s = q @ k.transpose(-1, -2) * a.scale  # float64: TF32 (a.tf32) rounding is the kernel's business
    if a.causal:
        i = torch.arange(a.lq, device=s.device)[:, None]
        j = torch.arange(a.lk, device=s.device)[None, :]
        s = s.masked_fill(j > i + a.causal_offset, -math.inf)
    if a.mask is not None:
        m = mem.read(a.mask)
        use = torch.ones_like(s, dtype=torch.bool)
        if a.mask_blocks is not None:
            # As the kernels read the summary: keys of cells without bit 0 are skipped, and the
            # mask is read only in cells with bit 1 (a wrong summary shows up in the result).
            cq, ck = P.ATTENTION_MASK_CELL
            cells = mem.read(a.mask_blocks).to(torch.int64)
            cells = cells.repeat_interleave(cq, 2).repeat_interleave(ck, 3)[..., : a.lq, : a.lk]
            s = s.masked_fill((cells & 1) == 0, -math.inf)
            use = (cells & 2) != 0
        if a.mask_kind == "bool":
            s = s.masked_fill(use & (m == 0), -math.inf)
        else:
            s = s + torch.where(use, m, torch.zeros((), dtype=F64, device=s.device))
    p = torch.softmax(s, -1)
    p = torch.nan_to_num(p, nan=0.0)  # a row with no visible key gives 0 (attention.cuh)
    mem.write(a.o, p @ v)


def _bn(mem: Memory, b: P.BnStatsSpec) -> None:
    if b.mode == "batch":
        x = mem.read(b.x, (b.n, b.c, b.s), (b.sn, b.sc, b.ss))
        mean = x.mean((0, 2))
        var = ((x - mean[None, :, None]) ** 2).mean((0, 2))
    else:
        mean = mem.read(b.running_mean, (b.c,), (1,))
        var = mem.read(b.running_var, (b.c,), (1,))
    w = mem.read(b.weight, (b.c,), (1,)) if b.weight is not None else torch.ones(b.c, dtype=F64, device=mem.device)
    bias = mem.read(b.bias, (b.c,), (1,)) if b.bias is not None else torch.zeros(b.c, dtype=F64, device=mem.device)
    scale = w * torch.rsqrt(var + b.eps)
    mem.write(b.scale, scale, (b.c,), (1,))
    mem.write(b.shift, bias - mean * scale, (b.c,), (1,))


def _group_stats(mem: Memory, g: P.GroupStatsSpec) -> None:
    assert g.rows <= 0 or g.cols >= 1, "norm.cuh: launch_group_stats refuses cols < 1"
    x = mem.read(g.x, (g.rows, g.cols), (g.ldi, 1))
    mean = x.mean(1)
    var = ((x - mean[:, None]) ** 2).mean(1)
    rstd = torch.rsqrt(var + g.eps)
    c = g.groups * g.cpg
    ch = (torch.arange(g.rows, device=mem.device) % g.groups)[:, None] * g.cpg + \
        torch.arange(g.cpg, device=mem.device)[None, :]
    w = mem.read(g.weight, (c,), (1,))[ch] if g.weight is not None else torch.ones_like(ch, dtype=F64)
    b = mem.read(g.bias, (c,), (1,))[ch] if g.bias is not None else torch.zeros_like(ch, dtype=F64)
    scale = w * rstd[:, None]
    n = g.rows * g.cpg
    mem.write(g.scale, scale.reshape(-1), (n,), (1,))
    mem.write(g.shift, (b - mean[:, None] * scale).reshape(-1), (n,), (1,))


def _pool(mem: Memory, p: P.PoolSpec) -> None:
    assert all(n >= 1 for n in p.x.shape[1:]), "pool.cuh: launch_pool refuses an input extent < 1"
    assert p.adaptive or all(min(k, s, d) >= 1 for k, s, d in zip(p.kernel, p.stride, p.dilation)), \
        "pool.cuh: launch_pool refuses a kernel, stride or dilation < 1"
    x = hook(p.prologue, mem.read(p.x))  # [planes, d, h, w]
    osh = p.out.shape[1:]
    ish = x.shape[1:]
    out = torch.empty((x.shape[0],) + tuple(osh), dtype=F64, device=mem.device)
    for idx in _indices(osh):
        sl, count, padded = [], 1, 1
        for j, i in enumerate(idx):
            if p.adaptive:
                lo, hi = (i * ish[j]) // osh[j], -(-((i + 1) * ish[j]) // osh[j])
                sl.append(slice(lo, hi))
                count *= hi - lo
                padded *= hi - lo
                continue
            k, st, pad, dil = p.kernel[j], p.stride[j], p.padding[j], p.dilation[j]
            start = i * st - pad
            taps = [start + t * dil for t in range(k)]
            valid = [t for t in taps if 0 <= t < ish[j]]
            sl.append(valid)
            count *= len(valid)
            padded *= min(start + (k - 1) * dil + 1, ish[j] + pad) - start  # avg: window clipped to padding
        win = x
        for j, s_ in enumerate(sl):
            win = win[(slice(None),) * (j + 1) + (s_ if isinstance(s_, slice) else torch.tensor(s_, dtype=torch.long),)]
        win = win.reshape(x.shape[0], -1)
        if p.mode == "max":
            v = win.amax(1) if win.shape[1] else torch.full((x.shape[0],), -math.inf, dtype=F64)
            v = torch.where(torch.isnan(win).any(1), torch.full_like(v, math.nan), v)
        else:
            div = p.divisor or (padded if p.count_include_pad and not p.adaptive else count)
            v = win.sum(1) / div
        out[(slice(None),) + tuple(idx)] = v
    mem.write(p.out, hook(p.epilogue, out))


def _indices(shape):
    import itertools

    return itertools.product(*[range(d) for d in shape])


def _scan(mem: Memory, s: P.ScanSpec) -> None:
    x = hook(s.prologue, mem.read(s.x, (s.outer, s.n, s.inner), (s.in_so, s.in_sn, s.in_si)))
    if s.reverse:
        x = x.flip(1)
    y = {"sum": lambda: x.cumsum(1), "prod": lambda: x.cumprod(1), "max": lambda: x.cummax(1).values,
         "min": lambda: x.cummin(1).values, "logsumexp": lambda: x.logcumsumexp(1)}[s.op]()
    if s.reverse:
        y = y.flip(1)
    mem.write(s.out, hook(s.epilogue, y), (s.outer, s.n, s.inner), (s.out_so, s.out_sn, s.out_si))


def _arg(mem: Memory, a: P.ArgSpec) -> None:
    assert a.outer * a.inner <= 0 or a.red >= 1, "scan.cuh: launch_arg_reduce refuses red < 1"
    x = hook(a.prologue, mem.read(a.x, (a.outer, a.red, a.inner), (a.in_so, a.in_sr, a.in_si)))
    # The first extreme (torch.argmax's documented choice), NaN counting as the extreme.
    key = torch.where(torch.isnan(x), torch.full_like(x, math.inf), x if a.op == "max" else -x)
    best = key.amax(1, keepdim=True)
    hit = (key == best).to(torch.int64)
    first = hit.argmax(1)  # the first index where the maximum is reached
    mem.write(a.out, first.to(F64), (a.outer, a.inner), (a.out_so, a.out_si))


def _gather(mem: Memory, g: P.GatherSpec) -> None:
    shape = g.out.shape
    grids = torch.meshgrid(*[torch.arange(d, device=mem.device) for d in shape], indexing="ij") if shape else []
    off = torch.full(shape, g.base, dtype=torch.int64, device=mem.device)
    valid = torch.ones(shape, dtype=torch.bool, device=mem.device)
    for d, p_ in enumerate(grids):
        if g.nearest and g.nearest[d] > 0:
            scale = torch.tensor(g.nearest[d], dtype=torch.float32)
            src = torch.clamp_max(torch.floor(p_.to(torch.float32) * scale).to(torch.int64), g.size[d] - 1)
        else:
            src = p_ - g.lo[d]
        valid &= (src >= 0) & (src < g.size[d])
        off += src * g.coef[d]
    for v, c, n in zip(g.inputs, g.index_coef, g.index_size):
        i = mem.view(v).to(torch.int64)
        off += torch.where(i < 0, i + n, i) * c
    flat = mem.typed(g.x.buffer, g.x.dtype)
    xo = g.x.offset
    vals = flat[(xo + torch.where(valid, off, torch.zeros_like(off))).reshape(-1)].to(F64).reshape(shape)
    mem.write(g.out, torch.where(valid, vals, torch.full_like(vals, g.fill)))


# ---------------------------------------------------------------------- whole programs


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal element for element, NaN equal to NaN (an input holding NaN is unchanged too)."""
    return a.shape == b.shape and bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _put(mem: Memory, name: str, value: torch.Tensor, dtype: str) -> None:
    flat = mem.typed(name, dtype)
    flat[: value.numel()].copy_(value.reshape(-1).to(flat.dtype))


class Simulator:
    """A program instance on the CPU: ``create(weights)`` then ``run(inputs) -> outputs``."""

    def __init__(self, plan: P.Plan, device: str = "cpu"):
        self.plan = plan
        self.mem = Memory(plan, device)

    def create(self, weights: Mapping[str, torch.Tensor]) -> None:
        for b in self.plan.buffers:
            if b.kind == "weight":
                _put(self.mem, b.name, weights[b.source].detach().to(F64 if b.dtype.startswith(("float", "bfloat"))
                                                                     else weights[b.source].dtype), b.dtype)
        for t in self.plan.create_tasks:
            run_task(self.mem, t)

    def run(self, inputs: Sequence[torch.Tensor], garbage: float = float("nan")) -> list[torch.Tensor]:
        plan = self.plan
        self.mem.arena.fill_(0xFF)  # NaN in every float type
        for b in plan.buffers:
            if b.kind == "input":
                _put(self.mem, b.name, inputs[b.index], b.dtype)
            elif b.kind == "output":
                self.mem.bufs[b.name].fill_(0xFF)
        before = [x.clone() for x in inputs]
        for t in plan.run_tasks:
            run_task(self.mem, t)
        for b in plan.buffers:
            if b.kind == "input":
                now = self.mem.typed(b.name, b.dtype)[: math.prod(b.shape)].reshape(b.shape)
                assert _same(now.to(inputs[b.index].dtype), before[b.index]), f"input {b.source} was written"
        outs = []
        for o in plan.outputs:
            b = next(x for x in plan.buffers if x.kind == "output" and x.source == o.tensor and
                     x.index == plan.outputs.index(o))
            outs.append(self.mem.typed(b.name, b.dtype)[: math.prod(b.shape)].reshape(b.shape).clone())
        return outs


    def around(self, task: str, inputs: Sequence[torch.Tensor], weights: Mapping[str, torch.Tensor] | None = None
               ) -> tuple[Memory, Memory]:
        """The memory just before and just after task ``task``. A run-phase task runs on
        ``inputs`` after the program was created; a create-phase one needs ``weights`` (the
        program is created again, up to it)."""
        plan = self.plan
        t = plan.task(task)
        if t.phase == "create":
            if weights is None:
                raise ValueError(f"task {task} runs at create: give the weights")
            for b in plan.buffers:
                if b.kind == "weight":
                    _put(self.mem, b.name, weights[b.source].detach().to(
                        F64 if b.dtype.startswith(("float", "bfloat")) else weights[b.source].dtype), b.dtype)
            todo = plan.create_tasks
        else:
            self.mem.arena.fill_(0xFF)
            for b in plan.buffers:
                if b.kind == "input":
                    _put(self.mem, b.name, inputs[b.index], b.dtype)
                elif b.kind == "output":
                    self.mem.bufs[b.name].fill_(0xFF)
            todo = plan.run_tasks
        for r in todo:
            if r.name == task:
                before = self.mem.clone()
                run_task(self.mem, r)
                return before, self.mem.clone()
            run_task(self.mem, r)
        raise AssertionError(f"task {task} not found in its phase")


def simulate(plan: P.Plan, weights: Mapping[str, torch.Tensor], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    sim = Simulator(plan)
    sim.create(weights)
    sim.run(inputs)
    return sim.run(inputs)  # twice: the second run must not depend on the first


__all__ = ["Simulator", "simulate", "eval_instrs", "run_task", "Memory", "TORCH", "F64"]
