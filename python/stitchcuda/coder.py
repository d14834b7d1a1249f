"""Code: a Plan in, a readable CUDA C++ program out — the deterministic Coder.

``code(plan, graph, weights)`` renders every task of the plan from the templates in
``templates/stitch`` and the runtime's C ABI, and returns a :class:`ProgramSource`: the
source of ``program.cu``, its :class:`~stitchcuda.manifest.Manifest` and the weights in
manifest order. Nothing is decided here that the plan has not decided: layouts, leading
dims, fusion and precision all come from the plan's task specs; the coder only spells them.

What a generated program looks like, top to bottom:

* a header comment naming the generator, the reference, the policy and the task table;
* includes of the runtime header and of only the templates the tasks use;
* the embedded manifest (the ABI's ``st_program_manifest``) and the sizes of things;
* ``struct st_program``: per-instance state — device weights (converted to the policy's
  storage type once, at create), create-time constants, and the CUDA-graph cache;
* one function per task, named after the task, with a comment naming the reference nodes it
  covers; elementwise tasks and reduction hooks get a small generated functor each;
* ``run_tasks`` calling the run-phase tasks in order on the caller's stream;
* the five ``extern "C"`` entry points: create checks every weight descriptor, uploads and
  converts weights and runs the create-phase tasks; run checks every input and output
  descriptor against its spec (``st_check_tensor``: the message names the tensor and the
  expected dtype and shape), reserves the arena and runs the tasks — eagerly, or through a
  captured CUDA graph (see ``run_graph`` in the generated source for the policy).

CUDA graphs: a run is captured the second time the program sees the same (stream, input,
output and arena addresses) and replayed from then on; the first sighting runs eagerly, so
that cuBLASLt plans are built and autotuned and the arena is sized outside of capture. A
change of any address starts a new entry (four are kept per instance). The legacy default
stream (which cannot be captured) and a stream the caller is already capturing run eagerly.
Copying inputs into arena-resident staging buffers instead would cost a full pass over every
input and output on each run; keying by address costs nothing per replay.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from . import manifest as mf
from . import planner as P
from .dtypes import DTYPES
from .precision import POLICIES
from .ir import Graph
from .layout import View

GENERATOR = "stitchcuda.coder (deterministic templates)"

_CTYPE = {d.name: d.ctype for d in DTYPES.values() if d.ctype}
_STDTYPE = {d.name: d.st_enum for d in DTYPES.values() if d.st_enum}
_POLICY = {p.name: p.c_enum for p in POLICIES.values()}
_EPILOGUE = {"none": "ST_EPI_NONE", "bias": "ST_EPI_BIAS", "relu": "ST_EPI_RELU", "gelu": "ST_EPI_GELU",
             "bias_relu": "ST_EPI_BIAS_RELU", "bias_gelu": "ST_EPI_BIAS_GELU"}
_POLICY_TEXT = {p.name: p.text for p in POLICIES.values()}
_ROW_ENTRY = {"softmax": "launch_softmax", "log_softmax": "launch_log_softmax", "logsumexp": "launch_logsumexp",
              "sum": "launch_row_sum", "mean": "launch_row_mean", "max": "launch_row_max", "min": "launch_row_min"}
_AXIS_OP = {"sum": "Sum", "mean": "Mean", "max": "Max", "min": "Min"}
_MASK = {"none": "None", "bool": "Bool", "add_same": "AddSame", "add_f32": "AddF32"}
GRAPH_SLOTS = 4


@dataclass(frozen=True)
class ProgramSource:
    """What the Coder hands on: program.cu, its manifest, and the weights (name -> array, in
    manifest order, as the caller gave them: conversion to the policy's storage type happens
    on the device at create time)."""

    program_cu: str
    manifest: mf.Manifest
    weights: Mapping[str, Any] = field(default_factory=dict)


class CodeError(ValueError):
    """The plan holds something the coder cannot spell (a bug in the planner, or a mismatch)."""


def code(plan: P.Plan, graph: Graph, weights: Mapping[str, Any] | None = None, *,
         reference: mf.ReferenceSource | None = None, arch: str = "sm_90") -> ProgramSource:
    """Render ``plan`` (made from ``graph``) as a program; ``weights`` maps every graph weight
    name to its array (any object; only presence is checked; None skips the check).

    The manifest records ``arch`` (the target the program is built for), the reference
    (default: ``<graph name>.py``), inputs, outputs, weights, lifted random inputs, the tasks
    with their FLOPs and bytes, and every reference node with its cost-model numbers.
    """
    if plan.name != graph.name:
        raise CodeError(f"plan {plan.name!r} was not made from graph {graph.name!r}")
    ordered: dict[str, Any] = {}
    if weights is not None:
        missing = [w.name for w in plan.weights if w.name not in weights]
        if missing:
            raise CodeError(f"weights missing for {', '.join(missing)}")
        ordered = {w.name: weights[w.name] for w in plan.weights}
    source = _Writer(plan, graph).render()
    manifest = mf.Manifest(
        name=plan.name,
        precision=plan.policy,
        arch=arch,
        source_hash=mf.hash_source(source),
        reference=reference or mf.ReferenceSource(path=f"{graph.name}.py"),
        inputs=tuple(mf.TensorSpec(s.name, s.dtype, s.shape) for s in plan.inputs),
        outputs=tuple(mf.TensorSpec(s.name, s.dtype, s.shape) for s in plan.outputs),
        weights=tuple(mf.TensorSpec(s.name, s.dtype, s.shape) for s in plan.weights),
        lifted_random=tuple(mf.LiftedRandom(input=r.input, op=r.op, distribution=r.distribution, params=r.params,
                                            shape=r.shape, dtype=r.dtype, source=r.source)
                            for r in graph.lifted_random),
        tasks=plan.manifest_tasks(),
        reference_ops=plan.reference_ops(),
    )
    return ProgramSource(source, manifest, ordered)


# ====================================================================== literals


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


def _ilist(xs: Sequence[int]) -> str:
    return "{" + ", ".join(str(int(x)) for x in xs) + "}"


def _cname(name: str) -> str:
    s = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return s if s and not s[0].isdigit() else "_" + s


_EXPR = {
    "copy": "{0}", "neg": "-{0}", "rsqrt": "rsqrtf({0})", "sqrt": "sqrtf({0})", "exp": "expf({0})", "log": "logf({0})",
    "tanh": "tanhf({0})", "relu": "fmaxf({0}, 0.f)", "sigmoid": "1.f / (1.f + expf(-{0}))",
    "silu": "{0} / (1.f + expf(-{0}))", "abs": "fabsf({0})", "reciprocal": "1.f / {0}", "erf": "erff({0})",
    "sin": "sinf({0})", "cos": "cosf({0})", "log1p": "log1pf({0})", "expm1": "expm1f({0})", "floor": "floorf({0})",
    "ceil": "ceilf({0})", "round": "rintf({0})", "sign": "float(({0} > 0.f) - ({0} < 0.f))", "trunc": "truncf({0})",
    "square": "{0} * {0}", "cube": "{0} * {0} * {0}",
    "gelu_erf": "0.5f * {0} * (1.f + erff({0} * 0.707106781f))",
    "gelu_tanh": "0.5f * {0} * (1.f + tanhf(0.797884561f * ({0} + 0.044715f * {0} * {0} * {0})))",
    "hardswish": "{0} * fminf(fmaxf({0} + 3.f, 0.f), 6.f) * (1.f / 6.f)",
    "hardsigmoid": "fminf(fmaxf({0} + 3.f, 0.f), 6.f) * (1.f / 6.f)", "relu6": "fminf(fmaxf({0}, 0.f), 6.f)",
    "mish": "{0} * tanhf({0} > 20.f ? {0} : log1pf(expf({0})))",
    "not": "({0} != 0.f ? 0.f : 1.f)", "to_bool": "({0} != 0.f ? 1.f : 0.f)",
    "to_half": "__half2float(__float2half_rn({0}))", "to_bf16": "__bfloat162float(__float2bfloat16_rn({0}))",
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}", "pow": "powf({0}, {1})",
    "max": "fmaxf({0}, {1})", "min": "fminf({0}, {1})", "eq": "({0} == {1} ? 1.f : 0.f)",
    "ne": "({0} != {1} ? 1.f : 0.f)", "lt": "({0} < {1} ? 1.f : 0.f)", "le": "({0} <= {1} ? 1.f : 0.f)",
    "gt": "({0} > {1} ? 1.f : 0.f)", "ge": "({0} >= {1} ? 1.f : 0.f)",
    "and": "({0} != 0.f && {1} != 0.f ? 1.f : 0.f)", "or": "({0} != 0.f || {1} != 0.f ? 1.f : 0.f)",
    "leaky_relu": "({0} > 0.f ? {0} : {0} * {1})", "elu": "({0} > 0.f ? {0} : {1} * expm1f({0}))",
    "softplus": "({0} * {1} > {2} ? {0} : log1pf(expf({0} * {1})) / {1})",
    "clamp": "fminf(fmaxf({0}, {1}), {2})", "where": "({0} != 0.f ? {1} : {2})", "const": "{0}",
    "div_trunc": "truncf({0} / {1})", "div_floor": "floorf({0} / {1})",
}


def render_instrs(instrs: Sequence[P.EwInstr], leaf: Mapping[str, str], indent: str = "    ") -> tuple[list[str], str]:
    """C++ statements for an expression and the name holding its value."""
    lines = []
    result = "0.f"
    for i, ins in enumerate(instrs):
        if ins.op not in _EXPR:
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
        expr = _EXPR[ins.op].format(*args)
        lines.append(f"{indent}const float t{i} = {expr};")
        result = f"t{i}"
    if not instrs:
        result = leaf.get("a0", "0.f")
    return lines, result


# ====================================================================== the writer


class _Writer:
    def __init__(self, plan: P.Plan, graph: Graph):
        self.plan = plan
        self.graph = graph
        self.buffers = {b.name: b for b in plan.buffers}
        self.n_in = len(plan.inputs)
        self.n_out = len(plan.outputs)
        self.n_w = len(plan.weights)
        self.consts = [b for b in plan.buffers if b.kind == "const"]
        kinds = {type(t.params).__name__ for t in plan.tasks}
        self.uses = kinds
        self.fn_names: dict[str, str] = {}
        for t in plan.tasks:
            self.fn_names[t.name] = _cname(t.name)

    # ------------------------------------------------------------------ pointers

    def ptr(self, v: View, write: bool = False, phase: str = "run") -> str:
        b = self.buffers[v.buffer]
        ct = _CTYPE[v.dtype]
        off = v.offset * v.itemsize
        fn = "at_mut" if write else "at"
        if b.kind == "input":
            if write:
                raise CodeError(f"a task writes input {b.source}")
            base = f"io.in[{b.index}]"
        elif b.kind == "output":
            base = f"io.out[{b.index}]"
        elif b.kind == "weight":
            if write:
                raise CodeError(f"a task writes weight {b.source}")
            base = f"p->w[{b.index}]"
        elif b.kind == "const":
            base = f"p->c[{b.index}]"
        else:
            base = "io.arena"
            off += b.offset
        return f"{fn}<{ct}>({base}, {off})"

    # ------------------------------------------------------------------ render

    def render(self) -> str:
        plan = self.plan
        out: list[str] = []
        out += self.header()
        out += self.includes()
        out += self.constants()
        out += self.state()
        out += self.helpers()
        for t in plan.tasks:
            out += self.task(t)
        out += self.runners()
        out += self.entry_points()
        return "\n".join(out).rstrip() + "\n"

    def header(self) -> list[str]:
        plan = self.plan
        lines = [
            f"// program.cu — {plan.name}: generated by {GENERATOR}. Do not edit by hand;",
            "// regenerate with `stitchcuda build`.",
            "//",
            f"// Precision policy: {_POLICY_TEXT[plan.policy]}.",
            "// Inputs:  " + ", ".join(f"{s.name} {s.dtype}{list(s.shape)}" for s in plan.inputs),
            "// Outputs: " + ", ".join(f"{s.name} {s.dtype}{list(s.shape)}" for s in plan.outputs),
            f"// Arena: {plan.arena_bytes} bytes of intermediates per run (offsets by liveness).",
            f"// CUDA graph: {'captured on the second run with the same stream and buffers, then replayed' if plan.cuda_graph else 'no (too few launches to gain)'}.",
            "//",
            "// Tasks, in order (create: once, when the program is created):",
        ]
        w = max((len(t.name) for t in plan.tasks), default=4)
        for i, t in enumerate(plan.tasks, 1):
            phase = " [create]" if t.phase == "create" else ""
            lines.append(f"//  {i:2d}. {t.name.ljust(w)}  {t.strategy:<19s} covers {', '.join(t.covers)}{phase}")
        lines.append("")
        return lines

    def includes(self) -> list[str]:
        u = self.uses
        lines = ["#include <cuda_runtime.h>", "", "#include <cmath>", "#include <cstdint>", "#include <cstdio>",
                 "#include <new>"]
        if self.plan.cuda_graph:
            lines.insert(5, "#include <mutex>")
        lines += ["", '#include "stitchrt/program.h"']
        need_ew = bool(u & {"EwSpec", "CopySpec"}) or any(b.source_dtype for b in self.plan.buffers)
        if need_ew:
            lines.append('#include "stitch/elementwise.cuh"')
        if u & {"RowSpec", "AxisSpec"}:
            lines.append('#include "stitch/reduce.cuh"')
        if u & {"AttentionSpec", "AttentionMaskBlocksSpec"}:
            lines.append('#include "stitch/attention.cuh"')
        if not need_ew and not (u & {"RowSpec", "AxisSpec", "AttentionSpec", "AttentionMaskBlocksSpec"}):
            lines.append('#include "stitch/numeric.cuh"')
        lines.append("")
        return lines

    def constants(self) -> list[str]:
        plan = self.plan
        embedded = {
            "name": plan.name,
            "abi_version": mf.ABI_VERSION,
            "precision": plan.policy,
            "inputs": [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in plan.inputs],
            "outputs": [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in plan.outputs],
            "weights": [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in plan.weights],
        }
        text = _compact_json(embedded)
        if ")json" in text:
            raise CodeError("manifest text contains the raw-string delimiter")
        lines = ["namespace {", "",
                 "// What st_program_manifest returns: the program's interface (manifest.json has the rest).",
                 f'constexpr char kManifest[] = R"json({text})json";', "",
                 f"constexpr int kNumInputs = {self.n_in};",
                 f"constexpr int kNumOutputs = {self.n_out};",
                 f"constexpr int kNumWeights = {self.n_w};",
                 f"constexpr int kNumConsts = {len(self.consts)};",
                 f"constexpr size_t kArenaBytes = {plan.arena_bytes};", ""]
        lines += [
            "// Device addresses of one run: the caller's inputs and outputs and the stream's arena.",
            "struct Io {",
            "  const void* in[kNumInputs > 0 ? kNumInputs : 1];",
            "  void* out[kNumOutputs > 0 ? kNumOutputs : 1];",
            "  char* arena;",
            "};", ""]
        if plan.cuda_graph:
            lines += [
                "constexpr int kGraphKeys = kNumInputs + kNumOutputs + 1;",
                f"constexpr int kGraphSlots = {GRAPH_SLOTS};", "",
                "// One captured run: which stream and device addresses it was captured with. The key is",
                "// addresses only; a graph holds the work of a run, never its results.",
                "struct GraphSlot {",
                "  cudaStream_t stream;",
                "  const void* key[kGraphKeys];",
                "  cudaGraphExec_t exec;  // null: seen once and run eagerly, not captured yet",
                "  uint64_t last_use;",
                "  bool used;",
                "};", ""]
        lines += ["}  // namespace", ""]
        return lines

    def state(self) -> list[str]:
        lines = ["// Per-instance state: weights and create-time constants on the device"
                 + (", and the CUDA graphs captured from its runs." if self.plan.cuda_graph else "."),
                 "struct st_program {",
                 "  int device;",
                 "  void* w[kNumWeights > 0 ? kNumWeights : 1];",
                 "  void* c[kNumConsts > 0 ? kNumConsts : 1];"]
        if self.plan.cuda_graph:
            lines += ["  GraphSlot graphs[kGraphSlots];",
                      "  uint64_t tick;",
                      "  bool graphs_off;  // a capture failed: run eagerly from then on",
                      "  std::mutex mu;"]
        lines += ["};", ""]
        return lines

    def helpers(self) -> list[str]:
        lines = [
            "namespace {", "",
            "#define ST_TRY(expr)              \\",
            "  do {                            \\",
            "    const st_status s_ = (expr);  \\",
            "    if (s_ != ST_OK) return s_;   \\",
            "  } while (0)", "",
            "template <class T>",
            "const T* at(const void* base, size_t byte_offset) {",
            "  return reinterpret_cast<const T*>(static_cast<const char*>(base) + byte_offset);",
            "}",
            "template <class T>",
            "T* at_mut(void* base, size_t byte_offset) {",
            "  return reinterpret_cast<T*>(static_cast<char*>(base) + byte_offset);",
            "}", "",
            "st_status fail(st_status status, const char* message) {",
            "  st_set_error(status, message);",
            "  return status;",
            "}", "",
            "// A CUDA error of a task's launch as a status, the message naming the task.",
            "st_status cuda_check(cudaError_t e, const char* task) {",
            "  if (e == cudaSuccess) return ST_OK;",
            "  char msg[256];",
            f'  std::snprintf(msg, sizeof msg, "{self.plan.name}: task %s: %s (%s)", task, cudaGetErrorName(e), cudaGetErrorString(e));',
            "  return fail(ST_ERR_CUDA, msg);",
            "}", ""]
        if "BnStatsSpec" in self.uses:
            lines += _BN_KERNELS
        lines += ["}  // namespace", ""]
        return lines

    # ------------------------------------------------------------------ tasks

    def task(self, t: P.Task) -> list[str]:
        fn = self.fn_names[t.name]
        spec = t.params
        head = [f"// Task {t.name} ({t.strategy}{', at create' if t.phase == 'create' else ''}): "
                f"covers {', '.join(t.covers) if t.covers else '(layout only)'}."]
        if t.note:
            head.append(f"// {t.note[0].upper() + t.note[1:]}.")
        sig = f"st_status {fn}(st_program* p, const Io& io, cudaStream_t stream) {{"
        if isinstance(spec, P.GemmSpec):
            body = self.gemm(t, spec)
            return ["namespace {", ""] + head + [sig] + body + ["}", "", "}  // namespace", ""]
        if isinstance(spec, P.EwSpec):
            pre, body = self.elementwise(t, spec)
        elif isinstance(spec, P.RowSpec):
            pre, body = self.row(t, spec)
        elif isinstance(spec, P.AxisSpec):
            pre, body = self.axis(t, spec)
        elif isinstance(spec, P.AttentionSpec):
            pre, body = [], self.attention(t, spec)
        elif isinstance(spec, P.AttentionMaskBlocksSpec):
            pre, body = [], self.attention_mask_blocks(t, spec)
        elif isinstance(spec, P.CopySpec):
            pre, body = [], self.copy(t, spec)
        elif isinstance(spec, P.BnStatsSpec):
            pre, body = [], self.bn_stats(t, spec)
        else:
            raise CodeError(f"task {t.name}: unknown spec {type(spec).__name__}")
        return ["namespace {", ""] + head + pre + [sig] + body + ["}", "", "}  // namespace", ""]

    def gemm(self, t: P.Task, g: P.GemmSpec) -> list[str]:
        dt = _STDTYPE[g.out.dtype]
        L = ["  st_gemm_args g{};",
             f"  g.policy = {_POLICY[g.policy]};",
             f"  g.epilogue = {_EPILOGUE[g.epilogue]};",
             f"  g.m = {g.m}; g.n = {g.n}; g.k = {g.k}; g.batch = {g.batch};",
             f"  g.a = {self.ptr(g.a)}; g.lda = {g.lda}; g.stride_a = {g.stride_a}; g.trans_a = {int(g.trans_a)}; g.a_dtype = {_STDTYPE[g.a.dtype]};",
             f"  g.b = {self.ptr(g.b)}; g.ldb = {g.ldb}; g.stride_b = {g.stride_b}; g.trans_b = {int(g.trans_b)}; g.b_dtype = {_STDTYPE[g.b.dtype]};"]
        if g.c is not None:
            L.append(f"  g.c = {self.ptr(g.c)}; g.ldc = {g.ldc}; g.stride_c = {g.stride_c};")
        L.append(f"  g.out = {self.ptr(g.out, write=True)}; g.ldo = {g.ldo}; g.stride_out = {g.stride_out}; g.out_dtype = {dt};")
        if g.bias is not None:
            L.append(f"  g.bias = {self.ptr(g.bias)};")
        L.append(f"  g.alpha = {flit(g.alpha)}; g.beta = {flit(g.beta)};")
        if not g.chain:
            L.append("  return st_gemm(&g, stream);")
            return L
        ops = ", ".join(f"{{ST_EP_{e.kind}, {flit(e.a)}, {flit(e.b)}}}" for e in g.chain)
        L.append(f"  const st_ep_op ops[] = {{{ops}}};")
        res = self.ptr(g.residual) if g.residual is not None else "nullptr"
        L.append(f"  return st_gemm_epilogue(&g, ops, {len(g.chain)}, {res}, {g.ldr}, stream);")
        return L

    def functor(self, name: str, instrs: Sequence[P.EwInstr], n_inputs: int) -> list[str]:
        leaf = {f"a{k}": f"a[{k}]" for k in range(max(n_inputs, 1))}
        body, result = render_instrs(instrs, leaf)
        return [f"struct {name} {{",
                "  __device__ float operator()(const float* a) const {"] + \
               body + [f"    return {result};", "  }", "};", ""]

    def hook(self, name: str, instrs: Sequence[P.EwInstr]) -> list[str]:
        body, result = render_instrs(instrs, {"a0": "x"})
        return [f"struct {name} {{",
                "  __device__ float operator()(float x) const {"] + \
               body + [f"    return {result};", "  }", "};", ""]

    def hooks(self, fn: str, prologue, epilogue) -> tuple[list[str], str]:
        """Functors for a reduction's hooks (stitch::Identity for an empty one) and the call's
        trailing arguments."""
        pre: list[str] = []
        names = []
        for suffix, instrs in (("pro", prologue), ("epi", epilogue)):
            if instrs:
                pre += self.hook(f"{fn}_{suffix}", instrs)
                names.append(f"{fn}_{suffix}{{}}")
            else:
                names.append("stitch::Identity{}")
        return pre, ", " + ", ".join(names)

    def elementwise(self, t: P.Task, e: P.EwSpec) -> tuple[list[str], list[str]]:
        fn = self.fn_names[t.name]
        pre = self.functor(f"{fn}_fn", e.instrs, len(e.inputs))
        n = len(e.inputs)
        layout = (f"  const stitch::EwLayout<{n}> layout{{{len(e.shape)}, {_ilist(e.shape)}, {_ilist(e.out_strides)}, "
                  f"{{{', '.join(_ilist(s) for s in e.in_strides)}}}}};")
        args = ", ".join(self.ptr(v) for v in e.inputs)
        body = [layout,
                f"  return cuda_check(stitch::launch_elementwise({fn}_fn{{}}, {self.ptr(e.out, write=True)}, layout, stream,",
                f"                                               {args}),",
                f'                    "{t.name}");']
        return pre, body

    def row(self, t: P.Task, r: P.RowSpec) -> tuple[list[str], list[str]]:
        fn = self.fn_names[t.name]
        pre: list[str] = []
        hooks = ""
        if r.prologue or r.epilogue:
            pre, hooks = self.hooks(fn, r.prologue, r.epilogue)
        x, y = self.ptr(r.x), self.ptr(r.out, write=True)
        tin, tout = _CTYPE[r.x.dtype], _CTYPE[r.out.dtype]
        if r.op == "layer_norm":
            tw = _CTYPE[(r.weight or r.bias or r.x).dtype]
            wp = self.ptr(r.weight) if r.weight is not None else "nullptr"
            bp = self.ptr(r.bias) if r.bias is not None else "nullptr"
            call = (f"stitch::launch_layer_norm<{tin}, {tout}, {tw}>({x}, {r.ldi}, {y}, {r.ldo}, {wp}, {bp}, "
                    f"{r.rows}, {r.cols}, {flit(r.eps)}, stream{hooks})")
        elif r.op == "rms_norm":
            tw = _CTYPE[(r.weight or r.x).dtype]
            wp = self.ptr(r.weight) if r.weight is not None else "nullptr"
            call = (f"stitch::launch_rms_norm<{tin}, {tout}, {tw}>({x}, {r.ldi}, {y}, {r.ldo}, {wp}, "
                    f"{r.rows}, {r.cols}, {flit(r.eps)}, stream{hooks})")
        elif r.op == "var":
            call = (f"stitch::launch_row_var({x}, {r.ldi}, {y}, {r.ldo}, {r.rows}, {r.cols}, "
                    f"{'true' if r.unbiased else 'false'}, stream{hooks})")
        else:
            call = f"stitch::{_ROW_ENTRY[r.op]}({x}, {r.ldi}, {y}, {r.ldo}, {r.rows}, {r.cols}, stream{hooks})"
        body = [f"  return cuda_check({call},", f'                    "{t.name}");']
        return pre, body

    def axis(self, t: P.Task, a: P.AxisSpec) -> tuple[list[str], list[str]]:
        fn = self.fn_names[t.name]
        pre: list[str] = []
        hooks = ""
        if a.prologue or a.epilogue:
            pre, hooks = self.hooks(fn, a.prologue, a.epilogue)
        tin, tout = _CTYPE[a.x.dtype], _CTYPE[a.out.dtype]
        ws = f"{self.ptr(a.workspace, write=True)}, {a.workspace_floats}" if a.workspace is not None else "nullptr, 0"
        body = [f"  const stitch::AxisParams<{tin}, {tout}> ap{{{self.ptr(a.x)}, {a.outer}, {a.red}, {a.inner}, "
                f"{a.in_so}, {a.in_sr}, {a.in_si},",
                f"                                       {self.ptr(a.out, write=True)}, {a.out_so}, {a.out_si}, {ws}}};",
                f"  return cuda_check(stitch::launch_reduce_axis<stitch::AxisOp::{_AXIS_OP[a.op]}>(ap, stream{hooks}),",
                f'                    "{t.name}");']
        return pre, body

    def attention(self, t: P.Task, a: P.AttentionSpec) -> list[str]:
        ct = _CTYPE[a.q.dtype]
        L = [f"  stitch::AttnParams<{ct}> a{{}};",
             f"  a.q = {self.ptr(a.q)};",
             f"  a.k = {self.ptr(a.k)};",
             f"  a.v = {self.ptr(a.v)};",
             f"  a.o = {self.ptr(a.o, write=True)};"]
        for nm, v in (("q", a.q), ("k", a.k), ("v", a.v), ("o", a.o)):
            L.append("  " + " ".join(f"a.{nm}_stride[{i}] = {s};" for i, s in enumerate(v.strides)))
        L += [f"  a.B = {a.batch}; a.H = {a.heads}; a.Lq = {a.lq}; a.Lk = {a.lk}; a.heads_per_kv = {a.heads_per_kv};",
              f"  a.scale = {flit(a.scale)};",
              f"  a.causal = {'true' if a.causal else 'false'}; a.causal_offset = {a.causal_offset};",
              f"  a.mask_kind = stitch::AttnMask::{_MASK[a.mask_kind]};"]
        if a.mask is not None:
            L.append(f"  a.mask = {self.ptr(a.mask)};")
            L.append("  " + " ".join(f"a.mask_stride[{i}] = {s};" for i, s in enumerate(a.mask.strides)))
        if a.mask_blocks is not None:
            L.append(f"  a.mask_blocks = {self.ptr(a.mask_blocks)};  // skip the key tiles the mask hides")
            L.append("  " + " ".join(f"a.mask_blocks_stride[{i}] = {s};" for i, s in enumerate(a.mask_blocks.strides)))
        tf32 = ", /*allow_tf32=*/true" if a.tf32 else ""
        L += [f"  return cuda_check(stitch::launch_attention<{ct}, {a.head_dim}>(a, stream{tf32}), \"{t.name}\");"]
        return L

    def attention_mask_blocks(self, t: P.Task, a: P.AttentionMaskBlocksSpec) -> list[str]:
        ct = _CTYPE[a.dtype]
        L = [f"  stitch::AttnParams<{ct}> a{{}};",
             f"  a.B = {a.batch}; a.H = {a.heads}; a.Lq = {a.lq}; a.Lk = {a.lk};",
             f"  a.mask_kind = stitch::AttnMask::{_MASK[a.mask_kind]};",
             f"  a.mask = {self.ptr(a.mask)};",
             "  " + " ".join(f"a.mask_stride[{i}] = {s};" for i, s in enumerate(a.mask.strides)),
             "  " + " ".join(f"a.mask_blocks_stride[{i}] = {s};" for i, s in enumerate(a.blocks.strides)),
             f"  return cuda_check(stitch::launch_attention_mask_blocks<{ct}>(a, {self.ptr(a.blocks, write=True)}, stream),",
             f'                    "{t.name}");']
        return L

    def copy(self, t: P.Task, c: P.CopySpec) -> list[str]:
        L = []
        for i, it in enumerate(c.items):
            L.append(f"  const stitch::EwLayout<1> l{i}{{{len(it.shape)}, {_ilist(it.shape)}, {_ilist(it.dst_strides)}, "
                     f"{{{_ilist(it.src_strides)}}}}};")
            L.append(f"  ST_TRY(cuda_check(stitch::launch_strided_copy({self.ptr(it.src)}, "
                     f"{self.ptr(it.dst, write=True)}, l{i}, stream), \"{t.name}\"));")
        L.append("  return ST_OK;")
        return L

    def bn_stats(self, t: P.Task, b: P.BnStatsSpec) -> list[str]:
        sc, sh = self.ptr(b.scale, write=True), self.ptr(b.shift, write=True)
        tw = _CTYPE[(b.weight or b.bias or b.running_mean or b.scale).dtype]
        wp = self.ptr(b.weight) if b.weight is not None else f"static_cast<const {tw}*>(nullptr)"
        bp = self.ptr(b.bias) if b.bias is not None else f"static_cast<const {tw}*>(nullptr)"
        blocks = (b.c + 255) // 256
        if b.mode == "running":
            return [f"  bn_running_kernel<<<{blocks}, 256, 0, stream>>>({self.ptr(b.running_mean)}, {self.ptr(b.running_var)}, "
                    f"{wp}, {bp}, {b.c}, {flit(b.eps)}, {sc}, {sh});",
                    f'  return cuda_check(cudaGetLastError(), "{t.name}");']
        rows = b.n * b.s
        per = -(-rows // b.splits)
        ws = self.ptr(b.workspace, write=True)
        return [f"  const dim3 grid({(b.c + 31) // 32}, {b.splits});",
                f"  bn_partial_kernel<<<grid, dim3(32, 8), 0, stream>>>({self.ptr(b.x)}, {b.n}, {b.c}, {b.s}, "
                f"{b.sn}, {b.sc}, {b.ss}, {per}, {ws});",
                f'  ST_TRY(cuda_check(cudaGetLastError(), "{t.name}"));',
                f"  bn_finish_kernel<<<{blocks}, 256, 0, stream>>>({ws}, {b.splits}, {b.c}, {wp}, {bp}, {flit(b.eps)}, "
                f"{sc}, {sh});",
                f'  return cuda_check(cudaGetLastError(), "{t.name}");']

    # ------------------------------------------------------------------ runners and the ABI

    def runners(self) -> list[str]:
        plan = self.plan
        lines = ["namespace {", "",
                 "// Every run-phase task, in order, on the caller's stream.",
                 "st_status run_tasks(st_program* p, const Io& io, cudaStream_t stream) {"]
        for t in plan.run_tasks:
            lines.append(f"  ST_TRY({self.fn_names[t.name]}(p, io, stream));")
        lines += ["  return ST_OK;", "}", ""]
        lines += ["// The create-phase tasks: computed once from the weights, on the legacy default stream.",
                  "st_status create_tasks(st_program* p) {",
                  "  const Io io{};",
                  "  const cudaStream_t stream = nullptr;"]
        for t in plan.create_tasks:
            lines.append(f"  ST_TRY({self.fn_names[t.name]}(p, io, stream));")
        lines += ["  (void)io;", "  (void)stream;", "  return ST_OK;", "}", ""]
        if plan.cuda_graph:
            lines += _GRAPH_RUNNER
        lines += self.weight_upload()
        lines += ["}  // namespace", ""]
        return lines

    def weight_upload(self) -> list[str]:
        plan = self.plan
        lines = ["// Frees everything an instance holds (weights, constants, graphs) and the instance.",
                 "void release(st_program* p) {"]
        if plan.cuda_graph:
            lines += ["  for (GraphSlot& g : p->graphs)",
                      "    if (g.exec) cudaGraphExecDestroy(g.exec);"]
        lines += ["  for (void* w : p->w) if (w) st_device_free(w, nullptr);",
                  "  for (void* c : p->c) if (c) st_device_free(c, nullptr);",
                  "  st_stream_synchronize(nullptr);",
                  "  delete p;", "}", "",
                  "// A weight to the device, converted to the policy's storage type where it differs.",
                  "st_status upload(const st_tensor& t, size_t bytes, void** dst) {",
                  "  if (bytes == 0) return ST_OK;",
                  "  ST_TRY(st_device_alloc(bytes, nullptr, dst));",
                  "  if (t.device_type == ST_DEVICE_HOST) return st_copy_h2d(*dst, t.data, bytes, nullptr);",
                  "  return st_memcpy_d2d(*dst, t.data, bytes, nullptr);",
                  "}", ""]
        conv = [b for b in plan.buffers if b.kind == "weight" and b.source_dtype]
        if conv:
            lines += ["template <class Tin, class Tout>",
                      "st_status upload_converted(const st_tensor& t, int64_t n, void** dst) {",
                      "  void* tmp = nullptr;",
                      "  ST_TRY(upload(t, n * sizeof(Tin), &tmp));",
                      "  st_status s = st_device_alloc(n * sizeof(Tout), nullptr, dst);",
                      "  if (s == ST_OK) {",
                      "    const stitch::EwLayout<1> l{1, {n}, {1}, {{1}}};",
                      "    s = cuda_check(stitch::launch_strided_copy(static_cast<const Tin*>(tmp), static_cast<Tout*>(*dst), l,",
                      "                                               cudaStream_t(nullptr)), \"weight conversion\");",
                      "  }",
                      "  st_device_free(tmp, nullptr);",
                      "  return s;",
                      "}", ""]
        lines += ["st_status upload_weights(st_program* p, const st_tensor* w) {"]
        for b in plan.buffers:
            if b.kind != "weight":
                continue
            n = math.prod(b.shape)
            if b.source_dtype:
                lines.append(f"  ST_TRY((upload_converted<{_CTYPE[b.source_dtype]}, {_CTYPE[b.dtype]}>(w[{b.index}], {n}, &p->w[{b.index}])));"
                             f"  // {b.source}")
            else:
                lines.append(f"  ST_TRY(upload(w[{b.index}], {b.nbytes}, &p->w[{b.index}]));  // {b.source}")
        lines += ["  (void)p;", "  (void)w;", "  return ST_OK;", "}", "",
                  "st_status alloc_consts(st_program* p) {"]
        for b in self.consts:
            lines.append(f"  ST_TRY(st_device_alloc({max(b.nbytes, 1)}, nullptr, &p->c[{b.index}]));  // {b.source}")
        lines += ["  (void)p;", "  return ST_OK;", "}", ""]
        return lines

    def check_lines(self, specs: Sequence[P.IOSpec], arr: str, what: str, device: str, prefix: str) -> list[str]:
        lines = []
        for i, s in enumerate(specs):
            shape = _ilist(s.shape) if s.shape else "{1}"
            desc = _cstr(f"{what} {i} '{s.name}' ({s.dtype}[{', '.join(map(str, s.shape))}])")
            lines.append(f"  const int64_t {prefix}{i}[] = {shape};")
            lines.append(f'  ST_TRY(st_check_tensor(&{arr}[{i}], "{desc}", {_STDTYPE[s.dtype]}, {len(s.shape)}, '
                         f"{prefix}{i}, 1, {device}));")
        return lines

    def entry_points(self) -> list[str]:
        plan = self.plan
        name = plan.name
        wnames = ", ".join(w.name for w in plan.weights) or "none"
        inames = ", ".join(s.name for s in plan.inputs) or "none"
        onames = ", ".join(s.name for s in plan.outputs)
        lines = ['extern "C" {', "",
                 "ST_API int st_program_abi_version(void) { return ST_PROGRAM_ABI_VERSION; }",
                 "ST_API const char* st_program_manifest(void) { return kManifest; }", "",
                 "ST_API st_status st_program_create(const st_tensor* weights, int32_t n_weights, int32_t device, "
                 "st_program** out) {",
                 f'  if (!out) return fail(ST_ERR_INVALID_ARGUMENT, "{name}: create: out is null");',
                 "  *out = nullptr;",
                 "  if (n_weights != kNumWeights || (kNumWeights > 0 && !weights))",
                 f'    return fail(ST_ERR_INVALID_ARGUMENT, "{name}: create: expected {self.n_w} weight(s) in manifest '
                 f'order ({_cstr(wnames)})");']
        for i, s in enumerate(plan.weights):
            shape = _ilist(s.shape) if s.shape else "{1}"
            desc = f"weight {i} '{s.name}' ({s.dtype}[{', '.join(map(str, s.shape))}])"
            lines.append(f"  const int64_t sw{i}[] = {shape};")
            lines.append(f'  ST_TRY(st_check_tensor(&weights[{i}], "{_cstr(desc)}", {_STDTYPE[s.dtype]}, {len(s.shape)}, '
                         f"sw{i}, 1, weights[{i}].device_type));")
        lines += ["  ST_TRY(st_set_device(device));",
                  "  st_program* p = new (std::nothrow) st_program();",
                  f'  if (!p) return fail(ST_ERR_OUT_OF_MEMORY, "{name}: create: out of host memory");',
                  "  p->device = device;",
                  "  st_status s = upload_weights(p, weights);",
                  "  if (s == ST_OK) s = alloc_consts(p);",
                  "  if (s == ST_OK) s = create_tasks(p);",
                  "  if (s == ST_OK) s = st_stream_synchronize(nullptr);",
                  "  if (s != ST_OK) {",
                  "    release(p);",
                  "    return s;",
                  "  }",
                  "  *out = p;",
                  "  return ST_OK;",
                  "}", "",
                  "ST_API st_status st_program_run(st_program* p, const st_tensor* in, int32_t n_in, const st_tensor* out,",
                  "                                int32_t n_out, void* stream) {",
                  f'  if (!p) return fail(ST_ERR_INVALID_ARGUMENT, "{name}: run: program is null");',
                  "  if (n_in != kNumInputs || n_out != kNumOutputs || (kNumInputs > 0 && !in) || !out)",
                  f'    return fail(ST_ERR_INVALID_ARGUMENT, "{name}: run: expected {self.n_in} input(s) ({_cstr(inames)}) '
                  f'and {self.n_out} output(s) ({_cstr(onames)})");']
        lines += self.check_lines(plan.inputs, "in", "input", "ST_DEVICE_CUDA", "si")
        lines += self.check_lines(plan.outputs, "out", "output", "ST_DEVICE_CUDA", "so")
        lines += ["  Io io{};"]
        for i in range(self.n_in):
            lines.append(f"  io.in[{i}] = in[{i}].data;")
        for i in range(self.n_out):
            lines.append(f"  io.out[{i}] = out[{i}].data;")
        lines += ["  const int device = p->device;",
                  "  for (int i = 0; i < kNumInputs + kNumOutputs; ++i) {",
                  "    const st_tensor& t = i < kNumInputs ? in[i] : out[i - kNumInputs];",
                  "    if (t.device_id != device)",
                  f'      return fail(ST_ERR_INVALID_ARGUMENT, "{name}: run: a tensor is on another device than the program");',
                  "  }"]
        if plan.arena_bytes:
            lines += ["  void* arena = nullptr;",
                      "  ST_TRY(st_arena_reserve(stream, kArenaBytes, &arena));",
                      "  io.arena = static_cast<char*>(arena);"]
        else:
            lines += ["  io.arena = nullptr;"]
        if plan.cuda_graph:
            lines += ["  return run_graph(p, io, static_cast<cudaStream_t>(stream));"]
        else:
            lines += ["  return run_tasks(p, io, static_cast<cudaStream_t>(stream));"]
        lines += ["}", "",
                  "ST_API void st_program_destroy(st_program* p) {",
                  "  if (!p) return;",
                  "  st_set_device(p->device);",
                  "  release(p);",
                  "}", "",
                  '}  // extern "C"']
        return lines


def _compact_json(d: Mapping[str, Any]) -> str:
    """JSON with one line per scalar field and per tensor."""
    lines = ["{"]
    items = list(d.items())
    for i, (k, v) in enumerate(items):
        end = "," if i < len(items) - 1 else ""
        if isinstance(v, list):
            if not v:
                lines.append(f"  {json.dumps(k)}: []{end}")
                continue
            lines.append(f"  {json.dumps(k)}: [")
            for j, x in enumerate(v):
                lines.append("    " + json.dumps(x) + ("," if j < len(v) - 1 else ""))
            lines.append(f"  ]{end}")
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(v)}{end}")
    lines.append("}")
    return "\n".join(lines)


def _cstr(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


_GRAPH_RUNNER = """\
// Runs through a CUDA graph where one can be captured. The first run with a given stream and
// set of addresses is eager (it builds and autotunes the GEMM plans and sizes the arena, which
// capture cannot); the second is captured and launched; later ones replay the graph. The
// legacy default stream cannot be captured, and a stream the caller is capturing already takes
// our kernels into its own graph: both run eagerly. A failed capture turns graphs off for the
// instance and runs eagerly.
st_status run_graph(st_program* p, const Io& io, cudaStream_t stream) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (stream == nullptr || p->graphs_off || cudaStreamIsCapturing(stream, &capturing) != cudaSuccess ||
      capturing != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return run_tasks(p, io, stream);
  }
  const void* key[kGraphKeys];
  for (int i = 0; i < kNumInputs; ++i) key[i] = io.in[i];
  for (int i = 0; i < kNumOutputs; ++i) key[kNumInputs + i] = io.out[i];
  key[kGraphKeys - 1] = io.arena;
  std::lock_guard<std::mutex> lock(p->mu);
  GraphSlot* slot = nullptr;
  for (GraphSlot& g : p->graphs) {
    bool same = g.used && g.stream == stream;
    for (int i = 0; same && i < kGraphKeys; ++i) same = g.key[i] == key[i];
    if (same) slot = &g;
  }
  if (slot && slot->exec) {
    slot->last_use = ++p->tick;
    return cuda_check(cudaGraphLaunch(slot->exec, stream), "graph replay");
  }
  if (!slot) {
    // First sighting: remember the addresses in the least recently used slot and run eagerly.
    slot = &p->graphs[0];
    for (GraphSlot& g : p->graphs)
      if (!g.used || g.last_use < slot->last_use) slot = &g;
    if (slot->exec) cudaGraphExecDestroy(slot->exec);
    slot->exec = nullptr;
    slot->used = true;
    slot->stream = stream;
    for (int i = 0; i < kGraphKeys; ++i) slot->key[i] = key[i];
    slot->last_use = ++p->tick;
    return run_tasks(p, io, stream);
  }
  slot->last_use = ++p->tick;
  cudaGraph_t graph = nullptr;
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    p->graphs_off = true;
    return run_tasks(p, io, stream);
  }
  const st_status s = run_tasks(p, io, stream);
  const cudaError_t e = cudaStreamEndCapture(stream, &graph);
  if (s != ST_OK || e != cudaSuccess ||
      cudaGraphInstantiate(&slot->exec, graph, 0) != cudaSuccess) {
    // Nothing ran during the capture: run the tasks for real, eagerly from now on.
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    slot->exec = nullptr;
    p->graphs_off = true;
    return run_tasks(p, io, stream);
  }
  cudaGraphDestroy(graph);
  return cuda_check(cudaGraphLaunch(slot->exec, stream), "graph launch");
}
""".splitlines() + [""]


_BN_KERNELS = """\
// Batch statistics, pass 1: x viewed as [n, c, s]; block (32, 8) covers 32 channels (lanes
// along c) of one slice of the n * s reduced rows; each thread keeps a Welford state, the 8
// row lanes are merged (Chan et al.) and the slice's (count, mean, m2) per channel written to
// part[(slice * c + channel) * 3].
template <class T>
__global__ void __launch_bounds__(256) bn_partial_kernel(const T* x, int64_t n, int64_t c, int64_t s, int64_t sn,
                                                         int64_t sc, int64_t ss, int64_t rows_per_split,
                                                         float* part) {
  __shared__ float sh[3][8][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t ch = int64_t(blockIdx.x) * 32 + tx;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_split;
  const int64_t r1 = r0 + rows_per_split < n * s ? r0 + rows_per_split : n * s;
  float cnt = 0.f, mean = 0.f, m2 = 0.f;
  if (ch < c) {
    for (int64_t r = r0 + ty; r < r1; r += 8) {
      const int64_t i = s == 1 ? r : r / s;
      const int64_t j = r - i * s;
      const float v = stitch::to_float(x[i * sn + ch * sc + j * ss]);
      cnt += 1.f;
      const float d = v - mean;
      mean += d / cnt;
      m2 += d * (v - mean);
    }
  }
  sh[0][ty][tx] = cnt;
  sh[1][ty][tx] = mean;
  sh[2][ty][tx] = m2;
  __syncthreads();
  if (ty == 0 && ch < c) {
    for (int k = 1; k < 8; ++k) {
      const float nb = sh[0][k][tx];
      if (nb == 0.f) continue;
      const float nt = cnt + nb;
      const float d = sh[1][k][tx] - mean;
      mean += d * (nb / nt);
      m2 += sh[2][k][tx] + d * d * cnt * (nb / nt);
      cnt = nt;
    }
    float* o = part + (int64_t(blockIdx.y) * c + ch) * 3;
    o[0] = cnt;
    o[1] = mean;
    o[2] = m2;
  }
}

// Batch statistics, pass 2: merge the slices per channel; scale = weight * rsqrt(var + eps)
// with the biased variance (what batch norm normalises with), shift = bias - mean * scale.
template <class TW>
__global__ void bn_finish_kernel(const float* part, int64_t splits, int64_t c, const TW* weight, const TW* bias,
                                 float eps, float* scale, float* shift) {
  const int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  float cnt = 0.f, mean = 0.f, m2 = 0.f;
  for (int64_t k = 0; k < splits; ++k) {
    const float* q = part + (k * c + ch) * 3;
    const float nb = q[0];
    if (nb == 0.f) continue;
    const float nt = cnt + nb;
    const float d = q[1] - mean;
    mean += d * (nb / nt);
    m2 += q[2] + d * d * cnt * (nb / nt);
    cnt = nt;
  }
  const float a = (weight ? stitch::to_float(weight[ch]) : 1.f) * rsqrtf(m2 / cnt + eps);
  scale[ch] = a;
  shift[ch] = (bias ? stitch::to_float(bias[ch]) : 0.f) - mean * a;
}

// Eval-mode batch norm: the same scale and shift from the running statistics.
template <class TW>
__global__ void bn_running_kernel(const TW* mean, const TW* var, const TW* weight, const TW* bias, int64_t c,
                                  float eps, float* scale, float* shift) {
  const int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  const float a = (weight ? stitch::to_float(weight[ch]) : 1.f) * rsqrtf(stitch::to_float(var[ch]) + eps);
  scale[ch] = a;
  shift[ch] = (bias ? stitch::to_float(bias[ch]) : 0.f) - stitch::to_float(mean[ch]) * a;
}
""".splitlines() + [""]


__all__ = ["GENERATOR", "ProgramSource", "CodeError", "code", "flit", "render_instrs"]
