"""What a built program may call: its imports judged on the library, not on spellings in the source.

A program runs inside the Verifier's child process, next to the Python interpreter, PyTorch and
the harness. It must compute with the runtime and CUDA alone. Spellings in program.cu prove
little (``CAT(dl, sym)`` is ``dlsym``), so the rules here read what the linker and the built
library say:

1. **Nothing from the host process.** The library is linked with ``-z defs``: every symbol must
   come from a library it links (libstitchrt, the CUDA runtime, libc, libstdc++). A reference to
   ``PyRun_SimpleString`` or to a libtorch function fails the link, and is reported as that, not
   as a compile error. Weak undefined symbols (which ``-z defs`` lets through and the loader would
   resolve from the process) are refused beyond those of an honest program.
2. **No forbidden call from the program's own code.** The CUDA runtime is linked statically and
   itself imports ``dlopen``, ``getenv``, ``fopen``, ``pthread_create`` ...; so the link traces
   (``--trace-symbol``) every forbidden name of :data:`DENY`, and the linker names the object file
   that references it. A reference from the program's object is refused, whoever else uses it.
3. **No new import beyond an honest baseline.** The library's undefined dynamic symbols are
   compared with those of an honest program built the same way (the example program the package
   ships); what is new and falls in a forbidden family (:data:`FAMILIES`: file streams, threads,
   ``std::filesystem`` ...) is refused, anything else new is listed in the report.
4. **No raw system calls.** Functions containing ``syscall`` / ``sysenter`` / ``int $0x80``
   instructions (``objdump -d``) that the honest baseline does not have are refused.

Every refusal is a :class:`~.rules.Finding` with a ``sandbox-*`` rule, naming the symbol and the
family (``dynamic loading``, ``dynamic linker`` — the list of loaded libraries a program could walk
to the interpreter without importing anything: ``_r_debug``, ``dl_iterate_phdr``, its own
``_DYNAMIC`` or ``__ehdr_start``, ``getauxval`` —, ``driver entry point``, ``file access``,
``environment``, ``threads``, ``system``, ``host process``). The native runner (:mod:`..run.native`)
is the root of this class: a program run there finds no interpreter to reach.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ...linking import BY_NAME as _BY_NAME
from ...linking import DENY, LINK_FLAGS
from .rules import Finding, make_finding

#: Families by pattern, for imports an honest program does not have (C++ library names included).
FAMILIES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("host process", "sandbox-host-symbol", re.compile(r"^_?Py|^_ZN(?:K)?\d*(?:at|c10|torch|pybind11)\d|THP")),
    ("file access", "sandbox-file-access",
     re.compile(r"basic_(?:i|o)?fstream|basic_filebuf|filesystem|^(?:f|fd|re)?open|^(?:__)?[fl]?stat(?:at|x)?(?:64)?$"
                r"|^__[fl]?xstat|readdir|readlink")),
    ("threads", "sandbox-thread", re.compile(r"^_ZNSt6thread|std::thread|^pthread_create|^thrd_|^clone|fork|^exec"
                                             r"|^system$|^popen|posix_spawn|HostFunc|StreamAddCallback")),
    ("dynamic linker", "sandbox-link-map", re.compile(r"^_?r_debug$|^_dl_|auxval|^__libc_stack_end$|^dl_iterate_phdr$")),
    ("dynamic loading", "sandbox-dynamic-loading", re.compile(r"^dl|ModuleLoad|LibraryLoad|^nvrtc|^nvJitLink")),
    ("driver entry point", "sandbox-driver-entry-point", re.compile(r"GetProcAddress|DriverEntryPoint|ExportTable")),
    ("environment", "sandbox-environment", re.compile(r"env$|^_*environ$")),
    ("system", "sandbox-system", re.compile(r"^syscall$|ptrace|prctl|process_vm|^socket|^connect$|^shm|Ipc")),
)

#: Weak undefined symbols any shared library has (crt and libgcc's hooks).
_WEAK_OK = {"__gmon_start__", "_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable", "__cxa_finalize"}


def family_of(symbol: str) -> tuple[str, str] | None:
    """(family, rule id) of a forbidden symbol, or None."""
    base = symbol.split("@")[0]
    if base in _BY_NAME:
        return _BY_NAME[base]
    for family, rule, pat in FAMILIES:
        if pat.search(base):
            return family, rule
    return None


# ------------------------------------------------------------------ reading what the linker said

_TRACE = re.compile(r"^(?:\S*ld(?:\.\w+)?: )?(?P<file>\S+): reference to (?P<sym>\S+)\s*$")
_UNDEF = re.compile(r"undefined reference to [`'‘](?P<sym>[^'’`]+)['’`]")


def _own_object(path: str) -> bool:
    """The program's object file: a plain ``.o`` (not an archive member, not the C runtime's crt*.o)."""
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".o") and "(" not in path and not name.startswith("crt")


def traced_references(link_output: str) -> dict[str, list[str]]:
    """``--trace-symbol`` lines: symbol -> the files that reference it."""
    out: dict[str, list[str]] = {}
    for line in link_output.splitlines():
        m = _TRACE.match(line.strip())
        if m:
            out.setdefault(m["sym"], []).append(m["file"])
    return out


def undefined_at_link(link_output: str) -> list[str]:
    """Symbols ``-z defs`` refused (``undefined reference to `X'``), in order, once each."""
    seen: list[str] = []
    for m in _UNDEF.finditer(link_output):
        if m["sym"] not in seen:
            seen.append(m["sym"])
    return seen


def link_refused_only_imports(link_output: str) -> bool:
    """Whether a failed build failed only because ``-z defs`` refused symbols (no compile error)."""
    if not undefined_at_link(link_output):
        return False
    for line in link_output.splitlines():
        if "error" not in line.lower() or _UNDEF.search(line) or re.search(r"ld returned \d+ exit status", line):
            continue
        return False
    return True


# ------------------------------------------------------------------ reading the library


@dataclass(frozen=True)
class Import:
    name: str
    weak: bool


def dynamic_imports(path: str | Path) -> tuple[Import, ...]:
    """The undefined symbols of an ELF64 shared library's ``.dynsym`` (what the loader resolves)."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{path}: not an ELF64 file")
    endian = "<" if data[5] == 1 else ">"
    shoff, = struct.unpack_from(endian + "Q", data, 0x28)
    shentsize, shnum = struct.unpack_from(endian + "HH", data, 0x3A)
    sections = [struct.unpack_from(endian + "IIQQQQIIQQ", data, shoff + k * shentsize) for k in range(shnum)]
    out = []
    for sh in sections:
        if sh[1] != 11:  # SHT_DYNSYM
            continue
        off, size, link, entsize = sh[4], sh[5], sh[6], sh[9] or 24
        stroff = sections[link][4]
        for k in range(1, size // entsize):
            name_off, info, _, shndx, _, _ = struct.unpack_from(endian + "IBBHQQ", data, off + k * entsize)
            if shndx != 0:
                continue
            end = data.index(b"\0", stroff + name_off)
            name = data[stroff + name_off:end].decode("utf-8", "replace")
            if name:
                out.append(Import(name, (info >> 4) == 2))
    return tuple(out)


def syscall_functions(path: str | Path) -> set[str] | None:
    """Functions of the library holding a raw system-call instruction; None without objdump."""
    tool = shutil.which("objdump")
    if tool is None:
        return None
    try:
        r = subprocess.run([tool, "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True,
                           timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    found, current = set(), ""
    for line in r.stdout.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if m:
            current = m.group(1)
            continue
        if re.search(r"\t(?:syscall|sysenter)\b|\tint\s+\$0x80\b", line):
            found.add(current)
    return found


# ------------------------------------------------------------------ the judgement


@dataclass(frozen=True)
class Baseline:
    """What an honest program built the same way imports and holds."""

    imports: frozenset[str]
    weak: frozenset[str]
    syscall_functions: frozenset[str] | None


def baseline_of(library: str | Path) -> Baseline:
    imps = dynamic_imports(library)
    sc = syscall_functions(library)
    return Baseline(frozenset(i.name for i in imps), frozenset(i.name for i in imps if i.weak),
                    frozenset(sc) if sc is not None else None)


@dataclass(frozen=True)
class SandboxResult:
    findings: tuple[Finding, ...]
    new_imports: tuple[str, ...] = ()  # beyond the baseline and not forbidden: listed, allowed
    notes: tuple[str, ...] = ()


def _find(rule: str, message: str) -> Finding:
    return make_finding(rule, "program.so", 0, message)


def refused_link(link_output: str) -> SandboxResult:
    """The findings of a link that ``-z defs`` refused."""
    out = []
    for sym in undefined_at_link(link_output):
        fam = family_of(sym)
        what = f"{fam[0]}: " if fam and fam[0] != "host process" else ""
        out.append(_find("sandbox-host-symbol", f"imports {sym}, which no library a program links provides: "
                                                f"{what}it would be resolved from the host process (Python, "
                                                "PyTorch) at load time"))
    return SandboxResult(tuple(out))


def check_library(library: str | Path, link_output: str, baseline: Baseline) -> SandboxResult:
    """The rules of the module docstring on a built library and its link's output."""
    findings: list[Finding] = []
    notes: list[str] = []
    for sym, files in sorted(traced_references(link_output).items()):
        own = [f for f in files if _own_object(f)]
        fam = _BY_NAME.get(sym)
        if own and fam:
            findings.append(_find(fam[1], f"the program's code references {sym} ({fam[0]})"))
    imps = dynamic_imports(library)
    new = []
    for imp in imps:
        if imp.weak and imp.name not in baseline.weak and imp.name not in _WEAK_OK:
            findings.append(_find("sandbox-host-symbol", f"weak import {imp.name}: left for the loader to resolve from "
                                                         "the host process (Python, PyTorch)"))
            continue
        if imp.name in baseline.imports:
            continue
        fam = family_of(imp.name)
        if fam is not None:
            findings.append(_find(fam[1], f"imports {imp.name} ({fam[0]}), which an honest program does not"))
        else:
            new.append(imp.name)
    sc = syscall_functions(library)
    if sc is None or baseline.syscall_functions is None:
        notes.append("raw system-call instructions not checked (objdump not found)")
        findings.append(make_finding("sandbox-unchecked", "program.so", 0,
                                 "raw system-call instructions were not checked: objdump is not installed"))
    else:
        for fn in sorted(sc - baseline.syscall_functions):
            findings.append(_find("sandbox-system", f"function {fn} makes a raw system call (syscall instruction)"))
    seen: set[tuple[str, str]] = set()
    unique = []
    for f in findings:
        if (f.rule, f.message) not in seen:
            seen.add((f.rule, f.message))
            unique.append(f)
    return SandboxResult(tuple(unique), tuple(new), tuple(notes))


__all__ = ["DENY", "FAMILIES", "LINK_FLAGS", "family_of", "traced_references", "undefined_at_link",
           "link_refused_only_imports", "Import", "dynamic_imports", "syscall_functions", "Baseline", "baseline_of",
           "SandboxResult", "refused_link", "check_library"]
