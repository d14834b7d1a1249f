"""The plan interpreter lives in the package now (:mod:`stitchcuda.check.interp`); tests import it here."""

from stitchcuda.check.interp import Memory, Simulator, eval_instrs, run_task, simulate  # noqa: F401
