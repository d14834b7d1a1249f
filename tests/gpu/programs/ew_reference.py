"""A memory-bound elementwise chain for profiling tests: y = tanh(2 relu(x) + 1) + x on 8192x8192."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(x)
        b = a * 2.0 + 1.0
        c = torch.tanh(b)
        return c + x


def get_inputs():
    return [torch.randn(8192, 8192)]


def get_init_inputs():
    return []
