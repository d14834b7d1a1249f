"""The one error hierarchy: what stitchcuda raises on purpose, and what it means for the caller.

::

    StitchError                      every error stitchcuda raises on purpose
    ├── ArgumentError                bad input: an argument, a reference, a program folder, a suite,
    │                                a budget, a model file (the command exits 2)
    ├── MachineError                 this machine cannot do it: no PyTorch, no nvcc, a missing extra,
    │                                no server at an LLM address (exit 3)
    ├── NoDeviceError                no CUDA device (the runtime's; exit 3)
    ├── OutOfMemoryError             a device allocation failed (the runtime's; exit 3)
    └── CudaError, CublasError, CudnnError, NotSupportedError   the runtime's, with the call site

The runtime's classes come from ``stitchcuda._rt`` (the binding raises them); the Python layers
derive their own from these, so ``except stitchcuda.ArgumentError`` catches every input error,
whichever stage found it (``BuildInputError``, ``CaptureError``, ``PlanError``,
``ManifestError``, ``ProblemError``, ``SuiteError``, ``WheelError``, ``RunError``, a budget that
does not parse). ``ArgumentError`` is also a ``ValueError``, so older ``except ValueError``
callers still catch them. The command maps each to its exit code in
:mod:`stitchcuda.ship.errors` (README, "The command").
"""

from __future__ import annotations

from ._rt import (ArgumentError, CublasError, CudaError, CudnnError, NoDeviceError, NotSupportedError,
                  OutOfMemoryError, StitchError)


class MachineError(StitchError):
    """This machine cannot do what was asked (a missing package or tool, no server); one line with the fix."""


__all__ = ["StitchError", "ArgumentError", "MachineError", "NoDeviceError", "OutOfMemoryError", "CudaError",
           "CublasError", "CudnnError", "NotSupportedError"]
