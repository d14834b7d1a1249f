"""The static stage: what is judged before the candidate runs.

=============  =====================================================================
``rules``      every rule id and its severity; a finding; a program's findings
``source``     the rules over program.cu (``check_source``), standing on ``cxx`` and ``decls``,
               the just-enough C++ reading
``program``    a program folder: the source rules and the manifest's provenance (``check_program``)
``sandbox``    the built library: ``-z defs``, traced forbidden names, imports against an honest
               baseline, raw system calls
=============  =====================================================================
"""

from __future__ import annotations

from .program import check_manifest, check_program
from .rules import ABI_SYMBOLS, RULES, Finding, Rule, Severity, StaticResult, make_finding
from .source import check_source

__all__ = ["RULES", "Rule", "Finding", "StaticResult", "Severity", "ABI_SYMBOLS", "make_finding", "check_program",
           "check_source", "check_manifest"]
