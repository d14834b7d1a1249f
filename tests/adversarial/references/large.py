"""Reference for the large honest program (KernelBench format): an RMS norm over rows, no weight.

x: [32768, 16384] (2 GiB of fp32), y the same: y = x * rsqrt(mean(x^2, -1) + 1e-6).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)


def get_inputs():
    return [torch.randn(32768, 16384)]


def get_init_inputs():
    return []
