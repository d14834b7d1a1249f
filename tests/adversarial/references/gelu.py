"""Reference for the input-range programs (KernelBench format): y = gelu(x), the erf form.

x: [1024, 1024] standard normal, y the same.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


def get_inputs():
    return [torch.randn(1024, 1024)]


def get_init_inputs():
    return []
