"""Reference for the parameter programs (KernelBench format): y = LayerNorm(x), affine.

x: [256, 1024], the norm's weight [1024] and bias [1024] start as ones and zeros (PyTorch's own
initialisation), y: [256, 1024].
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int = 1024):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(256, 1024)]


def get_init_inputs():
    return [1024]
