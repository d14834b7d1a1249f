"""Reference for the degenerate controls (KernelBench format): outputs that no input moves.

y = x - x + 1 (ones), x: [64, 256], y: [64, 256]. Whatever the weights (there are none) and the inputs,
y is the same: a pass on it proves nothing, and the verdict must say so.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x + 1.0


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return []
