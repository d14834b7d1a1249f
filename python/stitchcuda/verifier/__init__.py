"""The Verifier: proves a candidate program correct, catches cheating, times and profiles it.

Entry point: ``verify(program_dir, reference, precision=...)`` (:mod:`.run`, imported lazily: it needs
PyTorch).

The parts that need no GPU, each usable alone:

=============  =====================================================================
``static``     the static anti-hacking rules over program.cu + manifest (``check_program``);
               ``cxx`` and ``decls`` are the just-enough C++ reading they stand on
``verdict``    typed verdicts (CompileError, WrongAnswer, Crash, Timeout, Rejected, Inconclusive,
               Passed), the nvcc diagnostic parser, ``build_result`` from parts
``sandbox``    what the built library may call: ``-z defs``, traced forbidden names, imports against
               an honest baseline, raw system calls
``rubric``     the four scored dimensions of every report
``profile``    kernel records, timings, ceilings, roofline classification
``feedback``   the short text (and one next step) for the Coder
``report``     report.json + report.md + timeline.png, written atomically
``records``    phase timings, timing method, per-task times, launch accounting, reference ops
=============  =====================================================================

The GPU half, filling the same dataclasses:

=================  ==================================================================
``problem``        the reference: loading, the Verifier's own weights, fresh inputs, its outputs
``compare``        outputs against the reference, on the device, in chunks, scale-aware tolerance
``inputs``         the secret seed, varied distributions, single-element changes
``correctness``    trials and poisoning (device-agnostic)
``dynamic``        the dynamic anti-hacking checks (repeated calls, sensitivity, stream order, precision)
``timing``         CUDA events on one stream, L2 flush, baselines, the >10x re-check
``cupti_profile``  CUPTI activity records -> tasks, roofline, gaps, launch accounting
``isolate``        child processes: clean environment, empty folder, report pipe, phase limits
``job``            the child's typed job (JSON over stdin, validated)
``worker``         the child (``python -m stitchcuda.verifier.worker FD``)
``run``            ``verify`` / ``verify_program`` / ``profile_program_dir``
=================  ==================================================================
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
from .verdict import (DYNAMIC_CHECKS, CompileError, Crash, Diagnostic, DynamicCheck, Inconclusive, OutputCheck, Passed,
                      Rejected, Timeout, TrialResult, VerificationResult, Verdict, WrongAnswer, build_result,
                      classify_crash, parse_nvcc_output)

_LAZY = {"verify": "run", "verify_program": "run", "VerifyOptions": "run", "Verification": "run",
         "profile_program_dir": "run", "VerifyEnvironmentError": "run", "ProblemError": "problem"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    # end to end (lazy)
    "verify", "verify_program", "VerifyOptions", "Verification", "profile_program_dir", "VerifyEnvironmentError",
    "ProblemError",
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
    "VerificationReport", "ReportFiles", "write_report", "load_report", "render_markdown",
]
