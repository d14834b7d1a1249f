"""The run stage: the candidate built and run, against its reference, in a child process.

=================  ==================================================================
``build``          the candidate and the honest baseline through the build cache
``reference``      which reference, found and checked against the manifest on the CPU
``harness``        the reference on the device: the Verifier's own weights, fresh inputs, its outputs
``inputs``         the secret seed, varied distributions, single-element changes
``compare``        outputs against the reference, on the device, in chunks, scale-aware tolerance
``copies``         where the Verifier keeps its own copies (device, host, nowhere)
``session``        one candidate's calls and judgements; runner and reference protocols
``correctness``    the trials (device-agnostic)
``dynamic``        the dynamic anti-hacking checks (repeated calls, sensitivity, stream order, precision)
``timed_calls``    what happens between timed calls: inputs changed, outputs refilled, a sample judged
``runner``         the real program on one CUDA stream
``child``          child processes: clean environment, empty folder, report pipe, phase limits
``job``            the child's typed job (JSON over stdin, validated)
``worker``         the child (``python -m stitchcuda.verifier.run.worker FD``)
=================  ==================================================================

Layering: ``run`` uses ``measure``, ``report`` and ``static``; nothing below imports it.
"""
