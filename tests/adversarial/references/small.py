"""Reference for the small-output programs (KernelBench format): y = 1e-4 * sin(x).

x: [512, 1024], y the same: outputs of magnitude 1e-4, below a 1e-2 tolerance taken as absolute.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 1e-4 * torch.sin(x)


def get_inputs():
    return [torch.randn(512, 1024)]


def get_init_inputs():
    return []
