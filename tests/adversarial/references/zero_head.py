"""Reference for the degenerate-reference programs (KernelBench format): a head initialised to zeros.

y = head(relu(fc(x))), x: [64, 256], fc: 256 -> 128, head: 128 -> 16 with weight and bias zeroed at
construction (as a residual branch's last layer often is). At its initialisation y is 0 for every input:
a program that returns zeros is right there, and nowhere else.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features: int = 256, hidden: int = 128, out_features: int = 16):
        super().__init__()
        self.fc = nn.Linear(in_features, hidden)
        self.head = nn.Linear(hidden, out_features)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc(x)))


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return [256, 128, 16]
