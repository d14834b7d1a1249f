"""Reference for the degenerate-reference checks (KernelBench format): norms whose scale is drawn at 0.02.

As ``vanishing_bn.py``, but every batch norm's weight is drawn from N(0, 0.02^2), as one Hugging Face
config's initialiser draws it. Measuring the norms' statistics is not enough here: each block still
multiplies by 0.02, and only parameters drawn again at their layers' scale (a norm's scale around one)
make the output depend on the input.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, width: int = 64, depth: int = 24):
        super().__init__()
        layers = []
        for _ in range(depth):
            lin = nn.Linear(width, width)
            nn.init.normal_(lin.weight, std=0.02)
            nn.init.zeros_(lin.bias)
            bn = nn.BatchNorm1d(width)
            nn.init.normal_(bn.weight, std=0.02)
            layers += [lin, bn, nn.ReLU6()]
        self.body = nn.Sequential(*layers).eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return [64, 24]
