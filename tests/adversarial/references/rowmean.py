"""Reference for the reduction programs (KernelBench format): y = mean(x, dim=1).

x: [256, 16384] uniform in [0, 1) (get_inputs draws torch.rand), y: [256].
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


def get_inputs():
    return [torch.rand(256, 16384)]


def get_init_inputs():
    return []
