"""A program that is a Python function, for the Verifier's CPU tests (``check_correctness`` with no
GPU): it runs at once, on a well-ordered "stream", and writes what the function returns.

``FunctionRunner(fn)``: one input, one output (``y = fn(x)``); ``FunctionRunner(fn, every=True)``:
all inputs in, all outputs out (``fn(*inputs) -> sequence``), as a stateful program hands its state
back.
"""

from __future__ import annotations

import contextlib

import torch


class FunctionRunner:
    device = torch.device("cpu")

    def __init__(self, fn, every: bool = False):
        self.fn = fn
        self.every = every

    def context(self):
        return contextlib.nullcontext()

    def run(self, inputs, outputs):
        if self.every:
            for o, v in zip(outputs, self.fn(*inputs)):
                o.copy_(v)
        else:
            outputs[0].copy_(self.fn(inputs[0]))

    def sync(self):
        pass

    sync_device = hold = sync

    def ordered(self, fn):
        fn()
