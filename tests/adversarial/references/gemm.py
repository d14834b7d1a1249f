"""Reference for the precision programs (KernelBench format): y = x @ W^T, no bias.

x: [256, 1024], W (proj.weight): [512, 1024], y: [256, 512]. Large enough a K that TF32 and bf16
arithmetic leave different error statistics, small enough to verify in seconds.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features: int = 1024, out_features: int = 512):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def get_inputs():
    return [torch.randn(256, 1024)]


def get_init_inputs():
    return [1024, 512]
