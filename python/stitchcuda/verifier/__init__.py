"""The Verifier: proves a candidate program correct, catches cheating, times and profiles it.

This package holds the parts that need no GPU, each usable alone:

=============  =====================================================================
``static``     the static anti-hacking rules over program.cu + manifest (``check_program``)
``verdict``    typed verdicts (CompileError, WrongAnswer, Crash, Timeout, Rejected, Passed),
               the nvcc diagnostic parser, ``build_result`` from parts
``rubric``     the four scored dimensions of every report
``profile``    kernel records, timings, ceilings, roofline classification
``feedback``   the short text (and one next step) for the Coder
``report``     report.json + report.md + timeline.png, written atomically
=============  =====================================================================

The GPU half (build, run trials in a child process, dynamic checks, CUDA-event timing, CUPTI)
fills these same dataclasses.
"""

from __future__ import annotations

from .feedback import Feedback, NextStep, make_feedback, next_step
from .profile import (H100_SXM, H200, Ceilings, KernelRecord, KernelSummary, ProfileSummary, Timing, TimingTable,
                      summarise)
from .report import ReportFiles, VerificationReport, load_report, render_markdown, write_report
from .rubric import (AntiHacking, CudaEngineering, OperatorCoverage, Rubric, SkillCompliance, build_rubric,
                     detect_techniques, score_anti_hacking, score_cuda_engineering, score_operator_coverage,
                     score_skill_compliance)
from .static import RULES, Finding, Rule, StaticResult, check_manifest, check_program, check_source
from .verdict import (DYNAMIC_CHECKS, CompileError, Crash, Diagnostic, DynamicCheck, OutputCheck, Passed, Rejected,
                      Timeout, TrialResult, VerificationResult, Verdict, WrongAnswer, build_result, classify_crash,
                      parse_nvcc_output)

__all__ = [
    # static
    "RULES", "Rule", "Finding", "StaticResult", "check_program", "check_source", "check_manifest",
    # verdicts
    "Diagnostic", "parse_nvcc_output", "CompileError", "WrongAnswer", "Crash", "classify_crash", "Timeout",
    "Rejected", "Passed", "Verdict", "DYNAMIC_CHECKS", "DynamicCheck", "OutputCheck", "TrialResult",
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
    "VerificationReport", "ReportFiles", "write_report", "load_report", "render_markdown",
]
