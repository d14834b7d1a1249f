"""Reference for the input-range programs (KernelBench format): y = softmax(x, dim=-1).

x: [512, 1024] standard normal, y the same.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(512, 1024)]


def get_init_inputs():
    return []
