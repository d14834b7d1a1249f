"""Rendering one task's body from its spec: one renderer per kind of spec.

Takes a :class:`~stitchcuda.plan.specs.Task` and its :class:`~.contract.TaskContract`; gives
the lines to put before the task's function (functors for elementwise expressions and
reduction hooks) and the lines of its body. Pointers are spelled by the contract's parameter
names; layouts, leading dims, hooks and precision all come from the spec — nothing is decided
here. Elementwise instructions are spelled by the op registry (:func:`render_instrs`).
"""

from __future__ import annotations

import math
import struct
from typing import Mapping, Sequence

from .. import ops
from ..dtypes import ctype as _ctype
from ..dtypes import st_enum as _st_enum
from ..layout import View
from ..plan import specs as S
from ..precision import get as get_policy
from .contract import TaskContract

_EPILOGUE = {"none": "ST_EPI_NONE", "bias": "ST_EPI_BIAS", "relu": "ST_EPI_RELU", "gelu": "ST_EPI_GELU",
             "bias_relu": "ST_EPI_BIAS_RELU", "bias_gelu": "ST_EPI_BIAS_GELU"}
_ROW_ENTRY = {"softmax": "launch_softmax", "log_softmax": "launch_log_softmax", "logsumexp": "launch_logsumexp",
              "sum": "launch_row_sum", "mean": "launch_row_mean", "max": "launch_row_max", "min": "launch_row_min"}
_AXIS_OP = {"sum": "Sum", "mean": "Mean", "max": "Max", "min": "Min"}
_ACTIVATION = {"none": "ST_ACT_NONE", "relu": "ST_ACT_RELU", "gelu": "ST_ACT_GELU_ERF", "gelu_tanh": "ST_ACT_GELU_TANH",
               "silu": "ST_ACT_SILU", "sigmoid": "ST_ACT_SIGMOID", "tanh": "ST_ACT_TANH"}
_MASK = {"none": "None", "bool": "Bool", "add_same": "AddSame", "add_f32": "AddF32"}


class CodeError(ValueError):
    """The plan holds something the coder cannot spell (a bug in the planner, or a mismatch)."""


# ---------------------------------------------------------------------- literals and expressions


def flit(x: float) -> str:
    """A float literal that reads back as the same float32 (PyTorch computes fp32 tensors'
    scalar operands in fp32 too)."""
    x = float(x)
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "-INFINITY"
    f = struct.unpack("f", struct.pack("f", x))[0]
    text = f"{f:.9g}"
    if "e" not in text and "." not in text and "inf" not in text:
        text += ".0"
    return text + "f"


def ilist(xs: Sequence[int]) -> str:
    return "{" + ", ".join(str(int(x)) for x in xs) + "}"


def render_instrs(instrs: Sequence[S.EwInstr], leaf: Mapping[str, str], indent: str = "    ") -> tuple[list[str], str]:
    """C++ statements for an expression (the registry's spelling of each instruction) and the
    name holding its value."""
    lines = []
    result = "0.f"
    for i, ins in enumerate(instrs):
        entry = ops.INSTRS.get(ins.op)
        if entry is None:
            raise CodeError(f"no rendering for elementwise op {ins.op!r}")
        args = []
        for a in ins.args:
            if a.startswith("a"):
                args.append(leaf[a])
            elif a.startswith("t"):
                args.append(a)
            elif a.startswith("c"):
                args.append(flit(ins.consts[int(a[1:])]))
            else:
                raise CodeError(f"bad operand {a!r}")
        lines.append(f"{indent}const float t{i} = {entry.c.format(*args)};")
        result = f"t{i}"
    if not instrs:
        result = leaf.get("a0", "0.f")
    return lines, result


def functor(name: str, instrs: Sequence[S.EwInstr], n_inputs: int) -> list[str]:
    leaf = {f"a{k}": f"a[{k}]" for k in range(max(n_inputs, 1))}
    body, result = render_instrs(instrs, leaf)
    return [f"struct {name} {{", "  __device__ float operator()(const float* a) const {"] + body + \
           [f"    return {result};", "  }", "};", ""]


def hook(name: str, instrs: Sequence[S.EwInstr]) -> list[str]:
    body, result = render_instrs(instrs, {"a0": "x"})
    return [f"struct {name} {{", "  __device__ float operator()(float x) const {"] + body + \
           [f"    return {result};", "  }", "};", ""]


def hooks(fn: str, prologue, epilogue) -> tuple[list[str], str]:
    """Functors for a reduction's hooks (stitch::Identity for an empty one) and the call's
    trailing arguments."""
    pre: list[str] = []
    names = []
    for suffix, instrs in (("pro", prologue), ("epi", epilogue)):
        if instrs:
            pre += hook(f"{fn}_{suffix}", instrs)
            names.append(f"{fn}_{suffix}{{}}")
        else:
            names.append("stitch::Identity{}")
    return pre, ", " + ", ".join(names)


# ---------------------------------------------------------------------- one task


class _Names:
    """Parameter names by spec field."""

    def __init__(self, c: TaskContract):
        self.by_field = {p.field: p.name for p in c.params}

    def __call__(self, field: str) -> str:
        return self.by_field[field]

    def opt(self, field: str, null: str = "nullptr") -> str:
        return self.by_field.get(field, null)


def render_task(t: S.Task, c: TaskContract) -> tuple[list[str], list[str]]:
    """(lines before the task's function, lines of its body)."""
    s = t.params
    n = _Names(c)
    fn = c.function
    if isinstance(s, S.GemmSpec):
        return [], gemm(s, n)
    if isinstance(s, S.EwSpec):
        return elementwise(t, s, n, fn)
    if isinstance(s, S.RowSpec):
        return row(t, s, n, fn)
    if isinstance(s, S.AxisSpec):
        return axis(t, s, n, fn)
    if isinstance(s, S.AttentionSpec):
        return [], attention(t, s, n)
    if isinstance(s, S.AttentionMaskBlocksSpec):
        return [], attention_mask_blocks(t, s, n)
    if isinstance(s, S.CopySpec):
        return [], copy(t, s, n)
    if isinstance(s, S.BnStatsSpec):
        return [], bn_stats(t, s, n)
    if isinstance(s, S.ConvSpec):
        return [], conv(s, n)
    tail = _TAIL.get(type(s))
    if tail is not None:
        header, fn_render = tail
        pre, body = fn_render(t, s, n, fn)
        return _include(header) + pre, body
    raise CodeError(f"task {t.name}: unknown spec {type(s).__name__}")


def gemm(g: S.GemmSpec, n: _Names) -> list[str]:
    L = ["  st_gemm_args g{};",
         f"  g.policy = {get_policy(g.policy).c_enum};",
         f"  g.epilogue = {_EPILOGUE[g.epilogue]};",
         f"  g.m = {g.m}; g.n = {g.n}; g.k = {g.k}; g.batch = {g.batch};",
         f"  g.a = {n('a')}; g.lda = {g.lda}; g.stride_a = {g.stride_a}; g.trans_a = {int(g.trans_a)}; "
         f"g.a_dtype = {_st_enum(g.a.dtype)};",
         f"  g.b = {n('b')}; g.ldb = {g.ldb}; g.stride_b = {g.stride_b}; g.trans_b = {int(g.trans_b)}; "
         f"g.b_dtype = {_st_enum(g.b.dtype)};"]
    if g.c is not None:
        L.append(f"  g.c = {n('c')}; g.ldc = {g.ldc}; g.stride_c = {g.stride_c};")
    L.append(f"  g.out = {n('out')}; g.ldo = {g.ldo}; g.stride_out = {g.stride_out}; "
             f"g.out_dtype = {_st_enum(g.out.dtype)};")
    if g.bias is not None:
        L.append(f"  g.bias = {n('bias')};")
    L.append(f"  g.alpha = {flit(g.alpha)}; g.beta = {flit(g.beta)};")
    if not g.chain:
        L.append("  return st_gemm(&g, stream);")
        return L
    chain = ", ".join(f"{{ST_EP_{e.kind}, {flit(e.a)}, {flit(e.b)}}}" for e in g.chain)
    L.append(f"  const st_ep_op ops[] = {{{chain}}};")
    L.append(f"  return st_gemm_epilogue(&g, ops, {len(g.chain)}, {n.opt('residual')}, {g.ldr}, stream);")
    return L


def conv(c: S.ConvSpec, n: _Names) -> list[str]:
    """st_conv: cuDNN's plan for this shape (built and timed on the first run, cached by the
    runtime's context), the activation fused where an engine takes it."""
    sp = len(c.in_size)

    def arr(field: str, vals: Sequence[int]) -> str:
        return " ".join(f"a.{field}[{j}] = {v};" for j, v in enumerate(vals))

    L = ["  st_conv_args a{};",
         f"  a.policy = {get_policy(c.policy).c_enum}; a.spatial_dims = {sp}; a.transposed = {int(c.transposed)}; "
         "a.channels_last = 0;",
         f"  a.batch = {c.batch}; a.in_channels = {c.in_channels}; a.out_channels = {c.out_channels}; "
         f"a.groups = {c.groups};",
         "  " + arr("in_size", c.in_size), "  " + arr("kernel_size", c.kernel), "  " + arr("stride", c.stride),
         "  " + arr("padding", c.padding), "  " + arr("dilation", c.dilation),
         "  " + arr("output_padding", c.output_padding),
         f"  a.x = {n('x')}; a.x_dtype = {_st_enum(c.x.dtype)};",
         f"  a.w = {n('w')}; a.w_dtype = {_st_enum(c.w.dtype)};"]
    if c.bias is not None:
        L.append(f"  a.bias = {n('bias')}; a.bias_dtype = {_st_enum(c.bias.dtype)};")
    else:
        L.append(f"  a.bias = nullptr; a.bias_dtype = {_st_enum(c.out.dtype)};")
    L += [f"  a.y = {n('out')}; a.y_dtype = {_st_enum(c.out.dtype)};",
          f"  a.activation = {_ACTIVATION[c.activation]};",
          "  return st_conv(&a, stream);"]
    return L


def elementwise(t: S.Task, e: S.EwSpec, n: _Names, fn: str) -> tuple[list[str], list[str]]:
    pre = functor(f"{fn}_fn", e.instrs, len(e.inputs))
    k = len(e.inputs)
    layout = (f"  const stitch::EwLayout<{k}> layout{{{len(e.shape)}, {ilist(e.shape)}, {ilist(e.out_strides)}, "
              f"{{{', '.join(ilist(s) for s in e.in_strides)}}}}};")
    args = ", ".join(n(f"inputs[{i}]") for i in range(k))
    body = [layout,
            f"  return cuda_check(stitch::launch_elementwise({fn}_fn{{}}, {n('out')}, layout, stream,",
            f"                                               {args}),",
            f'                    "{t.name}");']
    return pre, body


def row(t: S.Task, r: S.RowSpec, n: _Names, fn: str) -> tuple[list[str], list[str]]:
    pre: list[str] = []
    hk = ""
    if r.prologue or r.epilogue:
        pre, hk = hooks(fn, r.prologue, r.epilogue)
    x, y = n("x"), n("out")
    tin, tout = _ctype(r.x.dtype), _ctype(r.out.dtype)
    # With a workspace, the _ws entry points may split few, long rows over many blocks.
    ws, sfx = (f"{n('workspace')}, {r.workspace_floats}, ", "_ws") if r.workspace is not None else ("", "")
    if r.op == "layer_norm":
        tw = _ctype((r.weight or r.bias or r.x).dtype)
        call = (f"stitch::launch_layer_norm{sfx}<{tin}, {tout}, {tw}>({x}, {r.ldi}, {y}, {r.ldo}, "
                f"{n.opt('weight')}, {n.opt('bias')}, {r.rows}, {r.cols}, {flit(r.eps)}, {ws}stream{hk})")
    elif r.op == "rms_norm":
        tw = _ctype((r.weight or r.x).dtype)
        call = (f"stitch::launch_rms_norm{sfx}<{tin}, {tout}, {tw}>({x}, {r.ldi}, {y}, {r.ldo}, {n.opt('weight')}, "
                f"{r.rows}, {r.cols}, {flit(r.eps)}, {ws}stream{hk})")
    elif r.op == "var":
        call = (f"stitch::launch_row_var({x}, {r.ldi}, {y}, {r.ldo}, {r.rows}, {r.cols}, "
                f"{'true' if r.unbiased else 'false'}, stream{hk})")
    else:
        call = f"stitch::{_ROW_ENTRY[r.op]}({x}, {r.ldi}, {y}, {r.ldo}, {r.rows}, {r.cols}, stream{hk})"
    return pre, [f"  return cuda_check({call},", f'                    "{t.name}");']


def axis(t: S.Task, a: S.AxisSpec, n: _Names, fn: str) -> tuple[list[str], list[str]]:
    pre: list[str] = []
    hk = ""
    if a.prologue or a.epilogue:
        pre, hk = hooks(fn, a.prologue, a.epilogue)
    tin, tout = _ctype(a.x.dtype), _ctype(a.out.dtype)
    ws = f"{n('workspace')}, {a.workspace_floats}" if a.workspace is not None else "nullptr, 0"
    body = [f"  const stitch::AxisParams<{tin}, {tout}> ap{{{n('x')}, {a.outer}, {a.red}, {a.inner}, "
            f"{a.in_so}, {a.in_sr}, {a.in_si},",
            f"                                       {n('out')}, {a.out_so}, {a.out_si}, {ws}}};",
            f"  return cuda_check(stitch::launch_reduce_axis<stitch::AxisOp::{_AXIS_OP[a.op]}>(ap, stream{hk}),",
            f'                    "{t.name}");']
    return pre, body


def attention(t: S.Task, a: S.AttentionSpec, n: _Names) -> list[str]:
    ct = _ctype(a.q.dtype)
    L = [f"  stitch::AttnParams<{ct}> a{{}};",
         f"  a.q = {n('q')};",
         f"  a.k = {n('k')};",
         f"  a.v = {n('v')};",
         f"  a.o = {n('o')};"]
    for nm, v in (("q", a.q), ("k", a.k), ("v", a.v), ("o", a.o)):
        L.append("  " + " ".join(f"a.{nm}_stride[{i}] = {s};" for i, s in enumerate(v.strides)))
    L += [f"  a.B = {a.batch}; a.H = {a.heads}; a.Lq = {a.lq}; a.Lk = {a.lk}; a.heads_per_kv = {a.heads_per_kv};",
          f"  a.scale = {flit(a.scale)};",
          f"  a.causal = {'true' if a.causal else 'false'}; a.causal_offset = {a.causal_offset};",
          f"  a.mask_kind = stitch::AttnMask::{_MASK[a.mask_kind]};"]
    if a.mask is not None:
        L.append(f"  a.mask = {n('mask')};")
        L.append("  " + " ".join(f"a.mask_stride[{i}] = {s};" for i, s in enumerate(a.mask.strides)))
    if a.mask_blocks is not None:
        L.append(f"  a.mask_blocks = {n('mask_blocks')};  // skip the key tiles the mask hides")
        L.append("  " + " ".join(f"a.mask_blocks_stride[{i}] = {s};" for i, s in enumerate(a.mask_blocks.strides)))
    tf32 = ", /*allow_tf32=*/true" if a.tf32 else ""
    L += [f"  return cuda_check(stitch::launch_attention<{ct}, {a.head_dim}>(a, stream{tf32}), \"{t.name}\");"]
    return L


def attention_mask_blocks(t: S.Task, a: S.AttentionMaskBlocksSpec, n: _Names) -> list[str]:
    ct = _ctype(a.dtype)
    return [f"  stitch::AttnParams<{ct}> a{{}};",
            f"  a.B = {a.batch}; a.H = {a.heads}; a.Lq = {a.lq}; a.Lk = {a.lk};",
            f"  a.mask_kind = stitch::AttnMask::{_MASK[a.mask_kind]};",
            f"  a.mask = {n('mask')};",
            "  " + " ".join(f"a.mask_stride[{i}] = {s};" for i, s in enumerate(a.mask.strides)),
            "  " + " ".join(f"a.mask_blocks_stride[{i}] = {s};" for i, s in enumerate(a.blocks.strides)),
            f"  return cuda_check(stitch::launch_attention_mask_blocks<{ct}>(a, {n('blocks')}, stream),",
            f'                    "{t.name}");']


def copy(t: S.Task, c: S.CopySpec, n: _Names) -> list[str]:
    L = []
    for i, it in enumerate(c.items):
        L.append(f"  const stitch::EwLayout<1> l{i}{{{len(it.shape)}, {ilist(it.shape)}, {ilist(it.dst_strides)}, "
                 f"{{{ilist(it.src_strides)}}}}};")
        L.append(f"  ST_TRY(cuda_check(stitch::launch_strided_copy({n(f'items[{i}].src')}, {n(f'items[{i}].dst')}, "
                 f"l{i}, stream), \"{t.name}\"));")
    L.append("  return ST_OK;")
    return L


def bn_stats(t: S.Task, b: S.BnStatsSpec, n: _Names) -> list[str]:
    sc, sh = n("scale"), n("shift")
    tw = _ctype((b.weight or b.bias or b.running_mean or b.scale).dtype)
    wp = n.opt("weight", f"static_cast<const {tw}*>(nullptr)")
    bp = n.opt("bias", f"static_cast<const {tw}*>(nullptr)")
    blocks = (b.c + 255) // 256
    if b.mode == "running":
        return [f"  bn_running_kernel<<<{blocks}, 256, 0, stream>>>({n('running_mean')}, {n('running_var')}, "
                f"{wp}, {bp}, {b.c}, {flit(b.eps)}, {sc}, {sh});",
                f'  return cuda_check(cudaGetLastError(), "{t.name}");']
    rows = b.n * b.s
    per = -(-rows // b.splits)
    ws = n("workspace")
    if b.by_planes:
        first = [f"  const dim3 grid({b.c}, {b.splits});",
                 f"  bn_plane_partial_kernel<<<grid, 256, 0, stream>>>({n('x')}, {b.n}, {b.c}, {b.s}, {b.sn}, "
                 f"{b.sc}, {per}, {ws});"]
    else:
        first = [f"  const dim3 grid({(b.c + 31) // 32}, {b.splits});",
                 f"  bn_partial_kernel<<<grid, dim3(32, 8), 0, stream>>>({n('x')}, {b.n}, {b.c}, {b.s}, "
                 f"{b.sn}, {b.sc}, {b.ss}, {per}, {ws});"]
    return first + [
            f'  ST_TRY(cuda_check(cudaGetLastError(), "{t.name}"));',
            f"  bn_finish_kernel<<<{blocks}, 256, 0, stream>>>({ws}, {b.splits}, {b.c}, {wp}, {bp}, {flit(b.eps)}, "
            f"{sc}, {sh});",
            f'  return cuda_check(cudaGetLastError(), "{t.name}");']


# ---------------------------------------------------------------------- the tail kinds
# (group statistics, pooling, scans, arg reductions, gathers, iota: templates beyond the
# program's standard includes, so each task names the header it instantiates)


def _include(header: str) -> list[str]:
    return ["}  // namespace task", "", f'#include "stitch/{header}"  // the template of the task below', "",
            "namespace task {", ""]


def _call(t: S.Task, call: str) -> list[str]:
    return [f"  return cuda_check({call},", f'                    "{t.name}");']


def group_stats(t: S.Task, g: S.GroupStatsSpec, n: _Names, fn: str) -> tuple[list[str], list[str]]:
    tw = _ctype((g.weight or g.bias or g.scale).dtype)
    null = f"static_cast<const {tw}*>(nullptr)"
    call = (f"stitch::launch_group_stats<{_ctype(g.x.dtype)}, {tw}>({n('x')}, {g.ldi}, {g.rows}, {g.cols}, "
            f"{g.groups}, {g.cpg}, {n.opt('weight', null)}, {n.opt('bias', null)}, {flit(g.eps)}, {n('scale')}, "
            f"{n('shift')}, {n('workspace')}, {g.splits}, stream)")
    return [], _call(t, call)


def pool(t: S.Task, p: S.PoolSpec, n: _Names, fn: str) -> tuple[list[str], list[str]]:
    pre, hk = hooks(fn, p.prologue, p.epilogue) if (p.prologue or p.epilogue) else ([], "")
    mode = {"max": "Max", "avg": "Avg"}[p.mode]
    body = [f"  stitch::PoolParams<{_ctype(p.x.dtype)}, {_ctype(p.out.dtype)}> p{{}};",
            f"  p.in = {n('x')}; p.planes = {p.x.shape[0]};",
            "  " + " ".join(f"p.in_size[{j}] = {d};" for j, d in enumerate(p.x.shape[1:])),
            "  " + " ".join(f"p.in_stride[{j}] = {s_};" for j, s_ in enumerate(p.x.strides)),
            f"  p.out = {n('out')};",
            "  " + " ".join(f"p.out_size[{j}] = {d};" for j, d in enumerate(p.out.shape[1:])),
            "  " + " ".join(f"p.out_stride[{j}] = {s_};" for j, s_ in enumerate(p.out.strides))]
    for field, vals in (("kernel", p.kernel), ("stride", p.stride), ("pad", p.padding), ("dilation", p.dilation)):
        body.append("  " + " ".join(f"p.{field}[{j}] = {v};" for j, v in enumerate(vals)))
    body.append(f"  p.adaptive = {_b(p.adaptive)}; p.count_include_pad = {_b(p.count_include_pad)}; "
                f"p.divisor = {p.divisor};")
    return pre, body + _call(t, f"stitch::launch_pool<stitch::PoolMode::{mode}>(p, stream{hk})")


_SCAN_OP = {"sum": "Sum", "prod": "Prod", "max": "Max", "min": "Min", "logsumexp": "LogSumExp"}


def scan(t: S.Task, c: S.ScanSpec, n: _Names, fn: str) -> tuple[list[str], list[str]]:
    pre, hk = hooks(fn, c.prologue, c.epilogue) if (c.prologue or c.epilogue) else ([], "")
    body = [f"  const stitch::ScanParams<{_ctype(c.x.dtype)}, {_ctype(c.out.dtype)}> sp{{{n('x')}, {c.outer}, {c.n}, "
            f"{c.inner}, {c.in_so}, {c.in_sn}, {c.in_si},",
            f"      {n('out')}, {c.out_so}, {c.out_sn}, {c.out_si}, {_b(c.reverse)}}};"]
    return pre, body + _call(t, f"stitch::launch_scan<stitch::ScanOp::{_SCAN_OP[c.op]}>(sp, stream{hk})")


def arg(t: S.Task, a: S.ArgSpec, n: _Names, fn: str) -> tuple[list[str], list[str]]:
    pre: list[str] = []
    hk = ""
    if a.prologue:
        pre = hook(f"{fn}_pro", a.prologue)
        hk = f", {fn}_pro{{}}"
    body = [f"  const stitch::ArgParams<{_ctype(a.x.dtype)}> ap{{{n('x')}, {a.outer}, {a.red}, {a.inner}, {a.in_so}, "
            f"{a.in_sr}, {a.in_si}, {n('out')}, {a.out_so}, {a.out_si}}};"]
    op = {"max": "Max", "min": "Min"}[a.op]
    return pre, body + _call(t, f"stitch::launch_arg_reduce<stitch::ArgOp::{op}>(ap, stream{hk})")


def gather(t: S.Task, g: S.GatherSpec, n: _Names, fn: str) -> tuple[list[str], list[str]]:
    o = g.out
    body = [f"  stitch::GatherParams<{_ctype(g.x.dtype)}, {_ctype(o.dtype)}> g{{}};",
            f"  g.x = {n('x')}; g.out = {n('out')}; g.ndim = {o.ndim}; g.base = {g.base}; g.fill = {flit(g.fill)};"]
    for field, vals in (("shape", o.shape), ("out_stride", o.strides), ("coef", g.coef), ("lo", g.lo),
                        ("size", g.size)):
        if vals:
            body.append("  " + " ".join(f"g.{field}[{d}] = {v};" for d, v in enumerate(vals)))
    if g.nearest:
        body.append("  " + " ".join(f"g.nearest[{d}] = {flit(v)};" for d, v in enumerate(g.nearest)))
    body.append(f"  g.nidx = {len(g.inputs)};")
    for k, v in enumerate(g.inputs):
        body.append(f"  g.idx[{k}] = {n(f'inputs[{k}]')}; g.idx_coef[{k}] = {g.index_coef[k]}; "
                    f"g.idx_size[{k}] = {g.index_size[k]};")
        body.append("  " + " ".join(f"g.idx_stride[{k}][{d}] = {s_};" for d, s_ in enumerate(v.strides)))
    return [], body + _call(t, "stitch::launch_gather(g, stream)")


def iota(t: S.Task, i: S.IotaSpec, n: _Names, fn: str) -> tuple[list[str], list[str]]:
    size = i.out.shape[0] if i.out.ndim else 1
    stride = i.out.strides[0] if i.out.ndim else 1
    call = (f"stitch::launch_iota<{_ctype(i.out.dtype)}>({n('out')}, {size}, {stride}, {_dlit(i.start)}, "
            f"{_dlit(i.step)}, stream)")
    return [], _call(t, call)


def _b(x: bool) -> str:
    return "true" if x else "false"


def _dlit(x: float) -> str:
    """A double literal that reads back as the same double."""
    text = repr(float(x))
    return text if any(ch in text for ch in ".e") else text + ".0"


_RNN_MODE = {"lstm": "Lstm", "gru": "Gru", "rnn_tanh": "RnnTanh", "rnn_relu": "RnnRelu"}


def recurrent(t: S.Task, r: S.RecurrentSpec, n: _Names, fn: str) -> tuple[list[str], list[str]]:
    """recurrent.cuh: one cooperative launch walking every step of the layer (both directions);
    a tag type named after the task names the kernel in profiles."""

    def strides(field: str, v: View | None, dims: str) -> str:
        if v is None:
            return f"p.{field} = nullptr;"
        return f"p.{field} = {n(field)}; " + " ".join(f"p.{field}_s{c} = {s_};" for c, s_ in zip(dims, v.strides))

    body = [f"  stitch::RecurrentParams<{_ctype(r.gx.dtype)}> p{{}};",
            f"  p.steps = {r.steps}; p.batch = {r.batch}; p.hidden = {r.hidden}; p.directions = {r.directions};",
            "  " + strides("gx", r.gx, "dtb"),
            f"  p.w_hh[0] = {n('w_hh')}; p.w_hh[1] = {n.opt('w_hh_r')};",
            f"  p.b_hh[0] = {n.opt('b_hh')}; p.b_hh[1] = {n.opt('b_hh_r')};",
            "  " + strides("h0", r.h0, "dbh"), "  " + strides("c0", r.c0, "dbh"),
            "  " + strides("out", r.out, "tbh"), "  " + strides("hn", r.hn, "dbh"), "  " + strides("cn", r.cn, "dbh"),
            f"  p.state = {n('workspace')};"]
    pre = [f"struct {fn}_tag {{}};  // names the kernel after its task", ""]
    return pre, body + _call(t, f"stitch::launch_recurrent<stitch::RnnMode::{_RNN_MODE[r.mode]}, "
                                f"{_ctype(r.gx.dtype)}, {fn}_tag>(p, stream)")


_TAIL = {S.GroupStatsSpec: ("norm.cuh", group_stats), S.PoolSpec: ("pool.cuh", pool), S.ScanSpec: ("scan.cuh", scan),
         S.ArgSpec: ("scan.cuh", arg), S.GatherSpec: ("index.cuh", gather), S.IotaSpec: ("index.cuh", iota),
         S.RecurrentSpec: ("recurrent.cuh", recurrent)}


__all__ = ["CodeError", "flit", "ilist", "render_instrs", "functor", "hook", "hooks", "render_task"]
