"""The static rules on a program folder: program.cu (:mod:`.source`) and its manifest's provenance."""

from __future__ import annotations

import re
from pathlib import Path

from ... import manifest as mf
from .rules import Finding, StaticResult, make_finding
from .source import check_source


def check_program(path: str | Path, *, require_weights: bool = False) -> StaticResult:
    """Run every static rule on a program folder (program.cu + manifest.json).

    A folder that cannot be loaded (no program.cu, a manifest or weights file that does not
    validate) is itself a finding, ``manifest-invalid``, naming the file and the problem:
    failures are values, and a candidate with a broken manifest is simply rejected.
    """
    try:
        prog = mf.load_program_dir(path, require_weights=require_weights)
    except mf.ManifestError as e:
        return StaticResult((make_finding("manifest-invalid", Path(e.file).name, 0, e.problem),))
    source = prog.read_source()
    manifest_text = prog.manifest_path.read_text(encoding="utf-8")
    findings = list(check_source(source, file=mf.PROGRAM_SOURCE, manifest=prog.manifest))
    findings += check_manifest(prog.manifest, file=mf.MANIFEST_FILE, text=manifest_text, source=source)
    return StaticResult(tuple(findings))



def check_manifest(manifest: mf.Manifest, *, file: str = "manifest.json", text: str | None = None,
                   source: str | None = None) -> list[Finding]:
    """Provenance rules (and the source hash, when the source is given)."""
    out: list[Finding] = []

    def line_of(pattern: str) -> int:
        if not text:
            return 0
        m = re.search(pattern, text)
        return text.count("\n", 0, m.start()) + 1 if m else 0

    def excerpt(line: int) -> str:
        if not text or not line:
            return ""
        return text.splitlines()[line - 1].strip()[:120]

    if not manifest.reference_ops:
        ln = line_of(r'"reference_ops"')
        out.append(make_finding("provenance-empty", file, ln,
                            "reference_ops is empty: which reference ops the tasks cover cannot be checked",
                            excerpt(ln)))
    missing = manifest.uncovered_ops()
    for op in missing:
        ln = line_of(r'"node"\s*:\s*"' + re.escape(op.node) + '"')
        out.append(make_finding("provenance-coverage", file, ln,
                            f"reference op {op.node} ({op.op}) is covered by no task; every reference op "
                            "must be mapped to the task that computes it", excerpt(ln)))
    for task, node in manifest.unknown_covers():
        ln = line_of(r'"name"\s*:\s*"' + re.escape(task) + '"')
        out.append(make_finding("provenance-unknown-node", file, ln,
                            f"task {task} covers {node}, which is not among reference_ops", excerpt(ln)))
    if source is not None and not mf.same_hash(manifest.source_hash, mf.hash_source(source)):
        ln = line_of(r'"source_hash"')
        out.append(make_finding("manifest-hash", file, ln,
                            "source_hash does not match program.cu (edited after the manifest was written?)",
                            excerpt(ln)))
    return out



__all__ = ["check_program", "check_manifest"]
