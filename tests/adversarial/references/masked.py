"""Reference with a non-persistent buffer (KernelBench format): y = x @ mask^T, mask lower-triangular.

mask is registered with persistent=False, as a causal mask is: it is not in state_dict(), yet it is
a weight of any program for this reference. x: [128, 256], mask: [256, 256], y: [128, 256] (running
sums of each row of x).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n: int = 256):
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(n, n)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.mask.T


def get_inputs():
    return [torch.randn(128, 256)]


def get_init_inputs():
    return [256]
