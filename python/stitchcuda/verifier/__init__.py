"""The Verifier: proves a candidate program correct, catches cheating, times and profiles it.

Entry point: ``verify(program_dir, reference, precision=...)`` (:mod:`.verification`, imported
lazily: it needs PyTorch). The code is cut by stage, each a subpackage that imports only the ones
listed before it (``tests/test_verifier_layout.py`` reads every import to keep it so):

================  ======================================================================
``static``        what is judged before anything runs: the rules over program.cu and the manifest,
                  the built library's imports (``sandbox``)
``report``        what a verification says, as data (verdicts, records, kernel records), and the
                  files it writes (report.json, report.md, timeline.png); rubric and feedback
``measure``       timing (CUDA events, L2 flush, baselines) and the CUPTI profile (GPU)
``run``           the candidate built and run in a child process against its reference: trials,
                  dynamic checks, timed-call checks, the reference harness, the child and its job
``verification``  ``verify`` / ``verify_program`` / ``profile_program_dir``: the stages in order
================  ======================================================================

``static`` and ``report`` need no GPU and no PyTorch; ``serde`` is the project's codec under its
old name.
"""

from __future__ import annotations

from .report.document import VerificationReport, VerificationReportFiles, load_report, render_markdown, write_report
from .report.feedback import Feedback, NextStep, make_feedback, next_step
from .report.profile import (H100_SXM, H200, Ceilings, KernelRecord, KernelSummary, ProfileSummary, Timing,
                             TimingTable, summarise)
from .report.rubric import (AntiHacking, CudaEngineering, OperatorCoverage, Rubric, SkillCompliance, build_rubric,
                            detect_techniques, score_anti_hacking, score_cuda_engineering, score_operator_coverage,
                            score_skill_compliance)
from .report.verdict import (DYNAMIC_CHECKS, CompileError, Crash, Diagnostic, DynamicCheck, Inconclusive, OutputCheck,
                             Passed, Rejected, Timeout, TrialResult, VerificationResult, Verdict, WrongAnswer,
                             build_result, classify_crash, parse_nvcc_output)
from .static import RULES, Finding, Rule, StaticResult, check_manifest, check_program, check_source

#: The report files' old name (a ``ReportFiles`` lives in ``stitchcuda.ship`` too).
ReportFiles = VerificationReportFiles

#: Names that need PyTorch (or the run stage): imported on first use.
_LAZY = {"verify": "verification", "verify_program": "verification", "VerifyOptions": "verification",
         "Verification": "verification", "profile_program_dir": "verification",
         "VerifyEnvironmentError": "verification", "ProblemError": "run.reference", "Limits": "run.child",
         "LoopSettings": "measure.timing"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    # end to end (lazy)
    "verify", "verify_program", "VerifyOptions", "Verification", "profile_program_dir", "VerifyEnvironmentError",
    "ProblemError", "Limits", "LoopSettings",
    # static
    "RULES", "Rule", "Finding", "StaticResult", "check_program", "check_source", "check_manifest",
    # verdicts
    "Diagnostic", "parse_nvcc_output", "CompileError", "WrongAnswer", "Crash", "classify_crash", "Timeout",
    "Rejected", "Inconclusive", "Passed", "Verdict", "DYNAMIC_CHECKS", "DynamicCheck", "OutputCheck", "TrialResult",
    "VerificationResult", "build_result",
    # measurements
    "KernelRecord", "Timing", "TimingTable", "Ceilings", "H100_SXM", "H200", "KernelSummary", "ProfileSummary",
    "summarise",
    # rubric
    "AntiHacking", "CudaEngineering", "OperatorCoverage", "SkillCompliance", "Rubric", "build_rubric",
    "detect_techniques", "score_anti_hacking", "score_cuda_engineering", "score_operator_coverage",
    "score_skill_compliance",
    # feedback and report
    "NextStep", "Feedback", "make_feedback", "next_step",
    "VerificationReport", "VerificationReportFiles", "ReportFiles", "write_report", "load_report", "render_markdown",
]
