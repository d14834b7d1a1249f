"""The measure stage: how fast the candidate is, and where its time goes (GPU).

=============  =====================================================================
``timing``     CUDA events on one stream, L2 flush, the four PyTorch baselines, the >10x re-check
``cupti``      CUPTI activity records -> tasks, roofline, gaps, launch accounting; the reference's
               top ops
=============  =====================================================================

Measurements land in the dataclasses of :mod:`..report` (``records``, ``profile``).
"""
