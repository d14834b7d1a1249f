"""The static rules over program.cu: what can be seen in the source.

A program may compute its outputs only from its inputs and weights, on the stream it is handed,
with no help from PyTorch and no memory of earlier calls. Every rule below looks for one way of
breaking that which can be seen in the source. Rules match on a masked copy of the source
(:mod:`.cxx`): a comment or string that mentions ``torch`` or ``cudaStreamCreate`` is not code.

Each hit is a :class:`Finding` with a rule id from :data:`.rules.RULES`, a severity (``reject``: the
candidate is refused; ``warn``: reported and scored, not refused), ``file:line``, a message and
the offending line. What cannot be seen statically (a kernel that covers half the output,
writes its inputs, reads memory nobody wrote) is left to the dynamic checks on the GPU.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from ... import manifest as mf
from ...paths import INCLUDE_DIR
from . import cxx
from .decls import (aliases, analyse_decl, angle_close, declared_name, looks_like_function, plain_alias, prev_char,
                    statement_end, statements)
from .rules import ABI_SYMBOLS, Finding, Severity, make_finding


# ------------------------------------------------------------------ patterns

_FORBIDDEN_INCLUDE = re.compile(
    r"^(?:torch|ATen|aten|c10|caffe2|pybind11|nanobind|THC?|THCUNN|numpy)/|^(?:Python|torch|ATen|pybind11)\.h$",
    re.I)
_ALLOWED_LOCAL_INCLUDE = re.compile(r"^(?:stitchrt|stitch)/")
#: Headers whose only use in a program is walking what the process has loaded.
_LINK_MAP_INCLUDE = re.compile(r"^(?:link|elf|sys/auxv)\.h$")

_SYMBOL_RULES: list[tuple[str, re.Pattern[str], str]] = [
    ("torch-symbol", re.compile(r"(?<![\w:])(?:at|torch|c10|caffe2|pybind11|py|nb|THC)\s*::"),
     "uses the PyTorch / pybind11 namespace {m}"),
    ("torch-symbol", re.compile(r"\b(?:Py_\w+|Py[A-Z]\w*|TORCH_\w+|PYBIND11_\w+|AT_DISPATCH\w*|C10_\w+|THPVariable\w*)\b"),
     "uses the PyTorch / Python symbol {m}"),
    ("dynamic-loading", re.compile(r"\b(?:dlopen|dlmopen|dlsym|dlvsym|LoadLibrary\w*|GetProcAddress|cuModuleLoad\w*|"
                                   r"cudaLibraryLoad\w*|cuLibraryLoad\w*|nvrtc\w+|nvJitLink\w+)\b"),
     "loads code at run time ({m})"),
    ("subprocess", re.compile(r"(?<![\w.>])(?:system|popen|fork|vfork|execl|execlp|execle|execv|execvp|execvpe|"
                              r"posix_spawnp?)\s*\("),
     "starts a process ({m})"),
    ("file-io", re.compile(r"(?<![\w.>])(?:fopen|freopen|fdopen|mmap|open|openat|creat)\s*\(|"
                           r"\bstd\s*::\s*(?:i|o)?fstream\b|\bstd\s*::\s*filebuf\b|\bFILE\s*\*"),
     "reads or writes files ({m})"),
    ("reads-environment", re.compile(r"\b(?:getenv|secure_getenv|environ)\b"), "reads the environment ({m})"),
    ("own-stream", re.compile(r"\b(?:cudaStreamCreate\w*|cuStreamCreate\w*)\b"),
     "creates its own stream ({m}); run on the stream passed to st_program_run"),
    ("host-thread", re.compile(r"\bstd\s*::\s*(?:thread|jthread|async)\b|\bpthread_create\b|#\s*pragma\s+omp\b|"
                               r"\bomp_\w+\s*\("),
     "starts host threads ({m})"),
    ("host-callback", re.compile(r"\b(?:cudaLaunchHostFunc|cudaStreamAddCallback|cuLaunchHostFunc|cuStreamAddCallback)\b"),
     "enqueues a host callback ({m})"),
    ("own-event", re.compile(r"\b(?:cudaEventCreate\w*|cuEventCreate\w*|cudaEventRecord\w*|cuEventRecord\w*|"
                             r"cudaStreamWaitEvent|cuStreamWaitEvent|cudaEventSynchronize|cudaEventQuery)\b"),
     "uses CUDA events ({m}); the runtime owns timing and synchronisation"),
    ("foreign-stream", re.compile(r"\b(?:cudaStreamPerThread|cudaStreamLegacy|CU_STREAM_PER_THREAD|CU_STREAM_LEGACY|"
                                  r"CUDA_API_PER_THREAD_DEFAULT_STREAM)\b"),
     "uses {m} instead of the stream passed to st_program_run"),
    ("link-map", re.compile(r"\b(?:_r_debug|r_debug|link_map|dl_iterate_phdr|dl_phdr_info|_DYNAMIC|DT_DEBUG|"
                            r"_dl_find_object|getauxval|AT_BASE|AT_PHDR|AT_SYSINFO_EHDR|__libc_stack_end|__ehdr_start|"
                            r"__executable_start|_GLOBAL_OFFSET_TABLE_|ElfW|Elf(?:32|64)_(?:Dyn|Sym|Phdr|Ehdr|Shdr)|"
                            r"program_invocation_name)\b"),
     "reads the dynamic linker's list of loaded libraries or ELF structures ({m}): a way to the host process "
     "without importing it"),
]

_CONTAINER = re.compile(r"\b(?:std\s*::\s*)?(unordered_map|unordered_multimap|multimap|map|unordered_set|set|"
                        r"flat_map|flat_set)\s*<")
_POINTERISH_KEY = re.compile(r"\*|\b(?:u?intptr_t|ptrdiff_t|void)\b")

_NULL_STREAM = re.compile(r"^(?:0|0[lLuU]*|nullptr|NULL|cudaStreamLegacy|cudaStreamPerThread|CU_STREAM_LEGACY|"
                          r"CU_STREAM_PER_THREAD|\(\s*cudaStream_t\s*\)\s*0)$")

#: CUDA calls that take a stream, and which argument it is (the runtime's own are read from its headers:
#: :func:`runtime_stream_args`).
_CUDA_STREAM_ARG = {
    "cudaMemcpyAsync": 4, "cudaMemsetAsync": 3, "cudaMemcpy2DAsync": 7, "cudaMemset2DAsync": 5,
    "cudaLaunchKernel": 5, "cudaLaunchCooperativeKernel": 5, "cudaMallocAsync": 2, "cudaFreeAsync": 1,
    "cudaMemcpyToSymbolAsync": 5, "cudaMemcpyFromSymbolAsync": 5, "cudaGraphLaunch": 1,
    "cudaStreamBeginCapture": 0, "cudaStreamEndCapture": 0,
}

#: The runtime's entry points that take a stream, when its headers cannot be read.
_RUNTIME_STREAM_ARG = {
    "st_gemm": 1, "st_gemm_epilogue": 5, "st_epilogue_apply": 1, "st_memcpy_d2d": 3, "st_memset": 3,
    "st_copy_h2d": 3, "st_copy_d2h": 3, "st_arena_reserve": 0, "st_workspace_info": 0,
    "st_device_alloc": 1, "st_device_free": 1, "st_stream_synchronize": 0, "st_conv": 1, "st_graph_run": 1,
    "st_plan_cache_stats": 0, "st_plan_cache_clear": 0, "st_conv_plan_cache_stats": 0,
    "st_conv_plan_cache_clear": 0, "st_plan_cache_bounds": 0,
}


def runtime_stream_args(include: Path | None = None) -> dict[str, int]:
    """Every ``ST_API`` entry point of the runtime's headers (``stitchrt.h``, ``graph.h``,
    ``program.h``) with a ``void* stream`` parameter, and its position: a new entry point is
    covered the day it is declared."""
    folder = include if include is not None else INCLUDE_DIR / "stitchrt"
    out: dict[str, int] = {}
    for name in ("stitchrt.h", "graph.h", "program.h"):
        try:
            text = (folder / name).read_text(encoding="utf-8")
        except OSError:
            continue
        text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
        for m in re.finditer(r"\bST_API\b[^;{(]*?\b(st_\w+)\s*\(([^;]*?)\)\s*;", text, re.S):
            for k, p in enumerate(cxx.split_args(m.group(2))):
                if re.search(r"\bvoid\s*\*\s*stream\s*$", p.strip()):
                    out[m.group(1)] = k
    return out or dict(_RUNTIME_STREAM_ARG)


_STREAM_ARG = {**_CUDA_STREAM_ARG, **runtime_stream_args()}
#: Runtime entry points that take a body function, and which arguments are the body and its stream.
_BODY_ARG = {"st_graph_run": (4, 1)}
_MEMSET = ("cudaMemset", "cudaMemsetAsync", "cudaMemset2D", "cudaMemset2DAsync", "st_memset", "memset")
_COPY = ("cudaMemcpy", "cudaMemcpyAsync", "cudaMemcpy2D", "cudaMemcpy2DAsync", "st_memcpy_d2d", "st_copy_h2d",
         "memcpy", "cudaMemcpyFromSymbol", "cudaMemcpyFromSymbolAsync")
_SYNC_IN_RUN = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "st_stream_synchronize", "cudaMemcpy",
                "cudaMemset", "cudaMemcpy2D", "cudaThreadSynchronize")
_ALLOC_IN_RUN = ("cudaMalloc", "cudaMallocAsync", "cudaMallocManaged", "cudaMallocHost", "cudaHostAlloc",
                 "st_device_alloc", "st_host_alloc", "malloc", "calloc")

_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:0[xX][0-9a-fA-F]+|\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"
                     r"[fFlLuU]*(?![\w.])")
_WORD = re.compile(r"[A-Za-z_]\w*")
TABLE_REJECT_SIZE = 256  # numbers in one initializer: at or above, it is treated as an output table
TABLE_WARN_SIZE = 64
TABLE_OUTPUT_MATCH_MIN = 32  # a table exactly the size of an output is rejected from this size on
LARGE_STRING = 16384


class _SourceChecker:
    def __init__(self, source: str, file: str, manifest: mf.Manifest | None):
        self.src = source
        self.file = file
        self.manifest = manifest
        self.m = cxx.mask(source)
        self.scan = cxx.scan(self.m)
        self.out: list[Finding] = []
        self._seen: set[tuple[str, int, str]] = set()

    # -------------------------------------------------------------- helpers

    def add(self, rule: str, offset: int, message: str, severity: Severity | None = None) -> None:
        line = self.m.line_of(offset)
        key = (rule, line, message)
        if key in self._seen:
            return
        self._seen.add(key)
        self.out.append(make_finding(rule, self.file, line, message, self.m.line_text(line).strip()[:120], severity))

    def run(self) -> list[Finding]:
        self.includes()
        self.symbols()
        self.file_scope_state()
        self.static_locals()
        self.macros()
        self.pointer_caches()
        self.tables()
        self.strings()
        self.abi()
        self.run_body()
        self.helper_launches()
        self.out.sort(key=lambda f: (f.line, f.rule))
        return _cap_per_rule(self.out)

    # -------------------------------------------------------------- rules

    def includes(self) -> None:
        for m in re.finditer(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', self.m.no_comments, re.M):
            path = m.group(2).strip()
            if _FORBIDDEN_INCLUDE.search(path):
                self.add("torch-include", m.start(), f"includes <{path}>: a program runs on the stitchcuda "
                                                     "runtime alone, without PyTorch or Python")
            elif _LINK_MAP_INCLUDE.match(path):
                self.add("link-map", m.start(), f"includes <{path}>: the dynamic linker's structures, a way to the "
                                                "host process without importing it")
            elif m.group(1) == '"' and not _ALLOWED_LOCAL_INCLUDE.match(path):
                self.add("foreign-include", m.start(), f'includes "{path}", which does not travel with the program')
        # a header named through a macro (#define H <torch/extension.h> ... #include H)
        for m in re.finditer(r"^[ \t]*#[ \t]*(?!include)\w+[^\n]*?[<\"]((?:torch|ATen|c10|caffe2|pybind11)/[\w/.]+|"
                             r"Python\.h)", self.m.no_comments, re.M):
            self.add("torch-include", m.start(), f"names the header {m.group(1)} in a preprocessor directive")

    def symbols(self) -> None:
        code = self.m.code
        for rule, pat, msg in _SYMBOL_RULES:
            for m in pat.finditer(code):
                if code[m.start():m.start() + 1] == "#" and rule != "host-thread":
                    continue
                self.add(rule, m.start(), msg.format(m=" ".join(m.group(0).split()).rstrip("(").strip()))

    def file_scope_state(self) -> None:
        for d in self.scan.decls:
            verdict = analyse_decl(d.text, class_member=d.scope == "class")
            if verdict is None:
                continue
            rule, what = verdict
            name = declared_name(d.text)
            off = d.start + (len(d.text) - len(d.text.lstrip()))
            if rule == "host-state-global":
                self.add(rule, off, f"{what} {name!r} at {'static-member' if d.scope == 'class' else 'file'} "
                                    "scope outlives a call; keep per-instance state in st_program and "
                                    "intermediates in the stream arena")
            else:
                self.add(rule, off, f"{what} {name!r} is shared by every instance and outlives a call")

    def static_locals(self) -> None:
        code = self.m.code_no_pp
        for fn in self.scan.functions():
            parent = fn.parent
            nested = False
            while parent >= 0:
                if self.scan.blocks[parent].kind in ("function", "block"):
                    nested = True
                    break
                parent = self.scan.blocks[parent].parent
            if nested:
                continue
            for m in re.finditer(r"\b(static|thread_local)\b", code[fn.open + 1:fn.close]):
                at = fn.open + 1 + m.start()
                prev = prev_char(code, at)
                if prev and prev not in ";{}:" or (prev == ":" and code[:at].rstrip().endswith("::")):
                    continue
                end = statement_end(code, at)
                text = code[at:end]
                if re.match(r"(?:static|thread_local)\s+(?:__\w+__\s+)*[\w:<>,\s\*&]*\b\w+\s*\(", text) and \
                        "=" not in text.split("(")[0] and looks_like_function(text):
                    continue
                res = analyse_decl(text, class_member=False, local=True)
                if res is not None:
                    self.add("host-state-static-local", at,
                             f"static local {declared_name(text)!r} in {fn.name or 'a function'} is mutable and "
                             "outlives the call")

    def macros(self) -> None:
        for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[^\n]*(?:\\\n[^\n]*)*", self.m.code, re.M):
            body = m.group(0)
            if re.search(r"\b(?:static|thread_local)\b", body[body.find(m.group(1)) + len(m.group(1)):]):
                self.add("macro-hides-state", m.start(), f"macro {m.group(1)} expands to a static/thread_local "
                                                         "declaration, which the static rules cannot see through")

    def pointer_caches(self) -> None:
        code = self.m.code
        for m in _CONTAINER.finditer(code):
            open_at = m.end() - 1
            close = angle_close(code, open_at)
            args = cxx.split_args(code[open_at + 1:close])
            key = args[0] if args else ""
            if _POINTERISH_KEY.search(key):
                self.add("pointer-keyed-cache", m.start(),
                         f"std::{m.group(1)} keyed by {' '.join(key.split())}: results must not be looked up by "
                         "input or output address")

    def tables(self) -> None:
        code = self.m.code_no_pp
        sizes = {t.numel for t in self.manifest.outputs} if self.manifest else set()
        covered_until = -1
        for i, c in enumerate(code):
            if c != "{" or i < covered_until:
                continue
            prev = prev_char(code, i)
            if prev not in ("=", "]", ")") and not (prev.isalnum() or prev == "_"):
                continue
            close = cxx.matching(code, i, "{", "}")
            body = code[i + 1:close]
            if ";" in body:
                continue  # a block of statements, not an initializer
            nums = len(_NUMBER.findall(body))
            words = len([w for w in _WORD.findall(_NUMBER.sub(" ", body)) if w not in ("f", "F")])
            if nums < TABLE_WARN_SIZE or nums < 0.9 * (nums + words):
                continue
            covered_until = close
            if nums >= TABLE_REJECT_SIZE or (nums >= TABLE_OUTPUT_MATCH_MIN and nums in sizes):
                why = "the size of an output" if nums in sizes else f"at least {TABLE_REJECT_SIZE} values"
                self.add("hardcoded-output-table", i, f"initializer with {nums} numeric literals ({why}): "
                                                      "outputs must be computed, not stored")
            else:
                self.add("large-constant-table", i, f"initializer with {nums} numeric literals")

    def strings(self) -> None:
        for start, end in self.m.strings:
            if end - start < LARGE_STRING:
                continue
            text = self.src[start:end]
            body = re.sub(r'^(?:u8|[uUL])?R?"', "", text)
            body = re.sub(r'^[^(]{0,16}\((.*)\)[^)]{0,16}"$', r"\1", body, flags=re.S) if text[:1] != '"' else body
            try:
                json.loads(body.rstrip('"'))
                continue
            except ValueError:
                pass
            self.add("large-string-literal", start, f"string literal of {end - start} characters that is not JSON")

    def abi(self) -> None:
        for name in ABI_SYMBOLS:
            fn = self.scan.function(name)
            if fn is None:
                self.add("abi-exports", 0, f"{name} is not defined; every program exports the five "
                                           "st_program_* entry points of stitchrt/program.h")
                continue
            linkage = re.search(r'\bextern\s*"\s*"', fn.head) is not None
            parent = fn.parent
            while parent >= 0 and not linkage:
                b = self.scan.blocks[parent]
                linkage = b.kind == "extern"
                parent = b.parent
            if not linkage:
                self.add("abi-exports", fn.head_start + len(fn.head) - len(fn.head.lstrip()),
                         f"{name} lacks extern \"C\" linkage, so the loader cannot find it")

    # -------------------------------------------------------------- st_program_run

    def run_body(self) -> None:
        """The rules on the work of a call: st_program_run's body and, transitively, every function of
        the translation unit it calls, each with the names its parameters take on (an argument that
        mentions an input makes that parameter an input, and so on)."""
        fn = self.scan.function("st_program_run")
        if fn is None:
            return
        params = cxx.params_of(fn.head)
        if len(params) != 6:
            return
        p_prog, p_in, _, p_out, _, p_stream = params
        self._walk(fn, {"in": {p_in}, "out": {p_out}, "stream": {p_stream}, "prog": {p_prog}}, 0, set())

    def _walk(self, fn: cxx.Block, seeds: dict[str, set[str]], depth: int, seen: set) -> None:
        key = (fn.open, tuple(sorted((k, tuple(sorted(v))) for k, v in seeds.items())))
        if key in seen or depth > 8:
            return
        seen.add(key)
        code = self.m.code_no_pp
        a, b = fn.open + 1, fn.close
        streams = aliases(code[a:b], seeds["stream"]) if seeds["stream"] else set()
        ins = aliases(code[a:b], seeds["in"], plain_only=True) if seeds["in"] else set()
        outs = aliases(code[a:b], seeds["out"], plain_only=True) if seeds["out"] else set()
        where = "st_program_run" if depth == 0 else f"{fn.name} (called from st_program_run)"
        self._check_body(code, a, b, ins, outs, streams, where)
        prog = next(iter(seeds["prog"]), "")
        if depth == 0:
            self._output_only_memset(code, a, b, next(iter(seeds["out"])), outs)
        self._io_pointer_kept(code, a, b, prog, ins | outs)
        local = {f.name: f for f in self.scan.functions() if f.name and f.name not in ABI_SYMBOLS}
        if not local:
            return
        for call in cxx.find_calls(code, sorted(local), a, b):
            callee = local[call.name]
            if callee.open == fn.open:
                continue
            names = cxx.params_of(callee.head)
            new: dict[str, set[str]] = {"in": set(), "out": set(), "stream": set(), "prog": set()}
            for arg, param in zip(call.args, names):
                ids = cxx.identifiers(arg)
                for role, have in (("in", ins), ("out", outs), ("stream", streams), ("prog", seeds["prog"])):
                    if param and ids & have:
                        new[role].add(param)
            self._walk(callee, new, depth + 1, seen)
        # A body handed to the runtime's graph runner runs on the stream the runner got: walked with its
        # stream parameter as that stream (its inputs and outputs travel in a context the rules cannot follow).
        for call in cxx.find_calls(code, sorted(_BODY_ARG), a, b):
            body_at, stream_at = _BODY_ARG[call.name]
            if body_at >= len(call.args) or stream_at >= len(call.args):
                continue
            body = local.get(call.args[body_at].strip().lstrip("&").strip())
            if body is None or not cxx.identifiers(call.args[stream_at]) & streams:
                continue
            params = cxx.params_of(body.head)
            if len(params) > 1 and params[1]:
                self._walk(body, {"in": set(), "out": set(), "stream": {params[1]}, "prog": set()}, depth + 1, seen)

    def _check_body(self, code: str, a: int, b: int, ins: set[str], outs: set[str], streams: set[str],
                    where: str) -> None:
        file_names = {declared_name(d.text) for d in self.scan.decls if d.scope == "file"}

        def mentions(expr: str, names: set[str]) -> bool:
            return bool(cxx.identifiers(expr) & names)

        for ln in cxx.find_launches(code, a, b):
            stream = ln.config[3] if len(ln.config) >= 4 else ""
            self._check_stream(ln.start, f"launch of {ln.kernel}", stream, streams, where)
        for call in cxx.find_calls(code, list(_STREAM_ARG), a, b):
            k = _STREAM_ARG[call.name]
            stream = call.args[k] if k < len(call.args) else ""
            if call.name in ("st_stream_synchronize",):
                continue  # reported as host-sync-in-run
            self._check_stream(call.start, call.name, stream, streams, where)

        for call in cxx.find_calls(code, list(_MEMSET) + list(_COPY), a, b):
            dst = call.args[0] if call.args else ""
            if mentions(dst, ins):
                self.add("input-write", call.start, f"{call.name} in {where} writes into an input "
                                                    f"({' '.join(dst.split())}); inputs are read-only")
            if mentions(dst, outs) and call.name in _COPY:
                src = call.args[1] if len(call.args) > 1 else ""
                kinds = " ".join(call.args[3:])
                # cudaMemcpyDefault (and host memcpy) between device buffers is an ordinary copy; it is
                # a stored answer only when the source is data defined in the file
                h2d = call.name in ("st_copy_h2d", "cudaMemcpyFromSymbol", "cudaMemcpyFromSymbolAsync") or \
                    bool(re.search(r"\bcudaMemcpyHostToDevice\b", kinds)) or \
                    ((call.name == "memcpy" or re.search(r"\bcudaMemcpyDefault\b", kinds) is not None)
                     and mentions(src, file_names))
                if h2d:
                    self.add("const-copy-to-output", call.start,
                             f"{call.name} in {where} copies host or symbol data into an output; outputs must be "
                             "computed from the inputs on the device")
        for call in cxx.find_calls(code, ("cudaMemcpyToSymbol", "cudaMemcpyToSymbolAsync"), a, b):
            src = call.args[1] if len(call.args) > 1 else ""
            if mentions(src, outs):
                self.add("output-to-global", call.start, f"{call.name} in {where} saves an output into a device global")
            else:
                self.add("device-global-state", call.start, f"{call.name} in {where} writes a device global that "
                                                            "every instance shares")
        for call in cxx.find_calls(code, _SYNC_IN_RUN, a, b):
            self.add("host-sync-in-run", call.start, f"{call.name} in {where} blocks the host; the run must stay "
                                                     "asynchronous on the caller's stream")
        for call in cxx.find_calls(code, _ALLOC_IN_RUN, a, b):
            self.add("alloc-in-run", call.start, f"{call.name} in {where} on every call; take intermediates from "
                                                 "st_arena_reserve")

    def _io_pointer_kept(self, code: str, a: int, b: int, p_prog: str, io: set[str]) -> None:
        """``p->last_x = in[0].data`` or ``p->last_x == in[0].data``: an address remembered across
        calls. Legitimate for re-capturing a CUDA graph when buffers move; a cheat when it selects
        a stored result, which the no-output-reuse check decides."""
        if not p_prog:
            return
        member = re.escape(p_prog) + r"\s*(?:->|\.)\s*\w+"
        for at, stmt in statements(code, a, b):
            s = " ".join(stmt.split())
            for m in re.finditer(member + r"\s*(==|!=|=)\s*([^;=]*)", s):
                if cxx.identifiers(m.group(2)) & io and re.search(r"\.\s*data\b|\bdata\b", m.group(2)):
                    self.add("io-pointer-kept", at + len(stmt) - len(stmt.lstrip()),
                             "remembers an input/output address in the program state; a cache keyed by address "
                             "may hold work (a captured graph), never results")
                    break
            for m in re.finditer(r"([^;=!<>]*?)\s*(==|!=)\s*" + member, s):
                if cxx.identifiers(m.group(1)) & io:
                    self.add("io-pointer-kept", at + len(stmt) - len(stmt.lstrip()),
                             "compares an input/output address with one kept from an earlier call")
                    break

    def _check_stream(self, at: int, what: str, stream: str, streams: set[str], where: str = "st_program_run") -> None:
        s = " ".join(stream.split())
        bare = re.sub(r"^(?:\(\s*cudaStream_t\s*\)|static_cast\s*<\s*cudaStream_t\s*>|"
                      r"reinterpret_cast\s*<\s*cudaStream_t\s*>)\s*", "", s).strip()
        bare = bare[1:-1].strip() if bare.startswith("(") and bare.endswith(")") else bare
        if not s or _NULL_STREAM.match(bare):
            self.add("foreign-stream", at, f"{what} in {where} runs on the default stream, not the stream passed "
                                           "to run")
        elif not (cxx.identifiers(s) & streams):
            self.add("foreign-stream", at, f"{what} in {where} runs on {s}, not the stream passed to run")

    def _output_only_memset(self, code: str, a: int, b: int, p_out: str, outs: set[str]) -> None:
        """Outputs that st_program_run only memsets. By data flow, not by spelling: a memset counts
        against the outputs when its destination is one; whatever else in the same statement uses an
        output (``if (cudaMemsetAsync(scratch, ...) == cudaSuccess) kernel<<<...>>>(..., out)``)
        computes it."""
        memsets: list[int] = []
        computes = 0
        for stmt_start, stmt in statements(code, a, b):
            names = cxx.identifiers(stmt)
            if not names & outs:
                continue
            s = stmt.strip()
            if re.match(r"(?:return\s+|TRY\s*\(\s*|\w+\s*=\s*|if\s*\(.*?\)\s*)?(?:st_check_tensor)\s*\(", s) or \
                    "st_check_tensor" in s:
                continue
            if re.match(r"^(?:[\w:<>\s\*&]+?[\s\*&])?(\w+)\s*=\s*[^=]", s) and plain_alias(s, outs):
                continue
            if re.match(r"^(?:if\s*\()?\s*\(?\s*!?\s*" + re.escape(p_out) + r"\s*(?:==|!=)", s):
                continue
            rest, of_output = s, False
            for call in sorted(cxx.find_calls(s, _MEMSET), key=lambda c: -c.start):
                if call.args and cxx.identifiers(call.args[0]) & outs:
                    of_output = True
                rest = rest[:call.start] + " " + rest[call.end + 1:]
            if of_output:
                memsets.append(stmt_start + len(stmt) - len(stmt.lstrip()))
            if cxx.identifiers(rest) & outs:
                computes += 1
        if memsets and computes == 0:
            self.add("output-only-memset", memsets[0], "outputs are only memset in st_program_run and never "
                                                       "computed from the inputs")

    def helper_launches(self) -> None:
        code = self.m.code_no_pp
        for ln in cxx.find_launches(code):
            fn = self.scan.enclosing_function(ln.start)
            if fn is not None and fn.name in ("st_program_run", "st_program_create", "st_program_destroy"):
                continue
            stream = " ".join(ln.config[3].split()) if len(ln.config) >= 4 else ""
            if not stream or _NULL_STREAM.match(stream):
                self.add("default-stream-launch", ln.start,
                         f"launch of {ln.kernel} uses the default stream; pass the caller's stream down")


MAX_FINDINGS_PER_RULE = 5


def _cap_per_rule(findings: list[Finding]) -> list[Finding]:
    """Keep the first few findings of each rule; the last kept one says how many more there were."""
    by_rule: dict[str, list[Finding]] = {}
    for f in findings:
        by_rule.setdefault(f.rule, []).append(f)
    out = []
    for f in findings:
        group = by_rule[f.rule]
        k = group.index(f)
        if k < MAX_FINDINGS_PER_RULE - 1 or len(group) == MAX_FINDINGS_PER_RULE:
            out.append(f)
        elif k == MAX_FINDINGS_PER_RULE - 1:
            more = len(group) - k - 1
            out.append(dataclasses.replace(f, message=f"{f.message} (and {more} more like it)"))
    return out


def check_source(source: str, *, file: str = "program.cu", manifest: mf.Manifest | None = None) -> list[Finding]:
    """Static rules over one CUDA C++ source. ``manifest`` sharpens the output-table rule."""
    return _SourceChecker(source, file, manifest).run()


__all__ = ["check_source", "MAX_FINDINGS_PER_RULE"]
