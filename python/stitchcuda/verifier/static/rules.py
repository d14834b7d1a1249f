"""The static rules' vocabulary: every rule id with its severity, a finding, a program's findings.

The rules themselves read the source (:mod:`.source`), the manifest (:mod:`.program`) and the built
library (:mod:`.sandbox`); each reports a :class:`Finding` with a rule id from :data:`RULES`, a
severity (``reject``: the candidate is refused; ``warn``: reported and scored, not refused),
``file:line``, a message and the offending line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Severity = Literal["reject", "warn"]

@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    summary: str


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
    file: str
    line: int
    message: str
    excerpt: str = ""

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.location}: [{self.severity} {self.rule}] {self.message}"


_RULES = [
    # --- PyTorch and friends
    Rule("torch-include", "reject", "includes a PyTorch, ATen, c10, pybind11 or Python header"),
    Rule("torch-symbol", "reject", "uses a PyTorch, ATen, c10, pybind11 or Python C-API symbol"),
    Rule("dynamic-loading", "reject", "loads code at run time (dlopen, dlsym, cuModuleLoad, NVRTC)"),
    Rule("subprocess", "reject", "starts a process (system, popen, fork, exec)"),
    Rule("file-io", "reject", "reads or writes files (fopen, fstream, open, mmap)"),
    Rule("link-map", "reject", "walks the dynamic linker's list of loaded libraries or ELF structures (_r_debug, "
                               "dl_iterate_phdr, link_map, _DYNAMIC, getauxval): a way to the host process"),
    Rule("reads-environment", "warn", "reads environment variables (behaviour could depend on who runs it)"),
    # --- state that outlives a call
    Rule("host-state-global", "reject",
         "mutable host variable at file, namespace or static-member scope (state outliving a call)"),
    Rule("host-state-static-local", "reject", "mutable static or thread_local local variable"),
    Rule("pointer-keyed-cache", "reject", "container keyed by a pointer (a cache keyed by input or output address)"),
    Rule("io-pointer-kept", "warn",
         "st_program_run keeps or compares an input/output address across calls (a cache keyed by address)"),
    Rule("device-global-state", "warn",
         "mutable __device__ / __constant__ global or cudaMemcpyToSymbol in run (shared by every instance)"),
    Rule("macro-hides-state", "warn", "a macro expands to a static or thread_local declaration"),
    # --- streams, threads, events
    Rule("own-stream", "reject", "creates its own CUDA stream"),
    Rule("host-thread", "reject", "starts host threads (std::thread, std::async, pthread_create, OpenMP)"),
    Rule("host-callback", "reject", "enqueues host callbacks (cudaLaunchHostFunc, cudaStreamAddCallback)"),
    Rule("own-event", "reject", "creates, records or waits on CUDA events (the runtime owns timing and sync)"),
    Rule("foreign-stream", "reject",
         "works on a stream other than the one passed to st_program_run (default, legacy, per-thread)"),
    Rule("default-stream-launch", "warn", "a helper launches on the default stream"),
    Rule("host-sync-in-run", "warn", "st_program_run blocks the host (device/stream synchronise, synchronous copy)"),
    Rule("alloc-in-run", "warn", "st_program_run allocates memory on every call (use the stream arena)"),
    # --- hard-coded outputs
    Rule("hardcoded-output-table", "reject", "numeric table large enough (or shaped) to be an output"),
    Rule("large-constant-table", "warn", "large numeric table in the source"),
    Rule("large-string-literal", "warn", "very large string literal that is not JSON (could encode data)"),
    Rule("const-copy-to-output", "reject", "copies host or symbol data into an output"),
    Rule("output-only-memset", "reject", "outputs are only memset, never computed"),
    Rule("output-to-global", "reject", "copies an output into a device global (keeps results across calls)"),
    Rule("input-write", "reject", "memsets or copies into an input (inputs are read-only)"),
    Rule("foreign-include", "warn", "includes a local file that does not travel with the program"),
    # --- ABI and manifest
    Rule("manifest-invalid", "reject", "the program folder or its manifest cannot be read or is invalid"),
    Rule("abi-exports", "reject", "a program ABI symbol is missing or lacks extern \"C\" linkage"),
    Rule("provenance-coverage", "reject", "a reference op is covered by no task in the manifest"),
    Rule("provenance-unknown-node", "warn", "a task covers a node that is not among reference_ops"),
    Rule("provenance-empty", "warn", "the manifest lists no reference_ops (coverage cannot be checked)"),
    Rule("manifest-hash", "warn", "the manifest's source_hash does not match program.cu"),
    # --- the built library (stitchcuda.verifier.sandbox): what it imports, not how the source spells it
    Rule("sandbox-host-symbol", "reject",
         "imports a symbol no linked library provides (resolved from the host process: Python, PyTorch)"),
    Rule("sandbox-dynamic-loading", "reject", "the program's code calls dlopen / dlsym or loads code at run time"),
    Rule("sandbox-link-map", "reject",
         "the program's code reads the dynamic linker's state or ELF structures (_r_debug, dl_iterate_phdr, "
         "_DYNAMIC, __ehdr_start, getauxval)"),
    Rule("sandbox-driver-entry-point", "reject",
         "the program's code looks up driver entry points (cuGetProcAddress, cudaGetDriverEntryPoint)"),
    Rule("sandbox-file-access", "reject", "the program's code opens, reads or writes files or descriptors"),
    Rule("sandbox-environment", "reject", "the program's code reads or changes the environment"),
    Rule("sandbox-thread", "reject", "the program's code starts threads or processes, or enqueues host callbacks"),
    Rule("sandbox-system", "reject", "the program makes raw system calls, or uses sockets, IPC or process control"),
    Rule("sandbox-unchecked", "warn", "a check of the built library could not run (a tool is missing)"),
]

#: Every rule the static checker can report, by id.
RULES: dict[str, Rule] = {r.id: r for r in _RULES}

ABI_SYMBOLS = ("st_program_abi_version", "st_program_manifest", "st_program_create",
               "st_program_run", "st_program_destroy")


@dataclass(frozen=True)
class StaticResult:
    """All findings for one program; ``rejected`` when any has severity reject."""

    findings: tuple[Finding, ...]

    @property
    def rejected(self) -> bool:
        return any(f.severity == "reject" for f in self.findings)

    @property
    def rejections(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "reject")

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "warn")

    def rule_ids(self, severity: Severity | None = None) -> set[str]:
        return {f.rule for f in self.findings if severity is None or f.severity == severity}

    def to_dict(self) -> dict:
        return {"rejected": self.rejected, "findings": [f.to_dict() for f in self.findings]}




def make_finding(rule: str, file: str, line: int, message: str, excerpt: str = "",
                 severity: Severity | None = None) -> Finding:
    """A finding of ``rule`` with the rule's own severity (unless given)."""
    return Finding(rule, severity or RULES[rule].severity, file, line, message, excerpt)


__all__ = ["Rule", "RULES", "Finding", "StaticResult", "Severity", "ABI_SYMBOLS", "make_finding"]
