"""What a verification says, as data, and the files it writes. Pure Python: no GPU, no PyTorch.

=============  =====================================================================
``verdict``    typed verdicts (CompileError, WrongAnswer, Crash, Timeout, Rejected, Inconclusive,
               Passed), the nvcc diagnostic parser, ``build_result`` from parts
``records``    phase timings, timing method, per-task times, launch accounting, reference ops, memory
``profile``    kernel records, timings, ceilings, roofline classification
``rubric``     the four scored dimensions of every report
``feedback``   the short text (and one next step) for the Coder
``timeline``   the kernel timeline plot
``document``   report.json + report.md + timeline.png, written atomically, and read back
=============  =====================================================================
"""
