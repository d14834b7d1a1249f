"""Reference for the tie programs (KernelBench format): y = argmax(x, dim=1), int64.

x: [128, 512]. PyTorch's argmax returns the first maximal element of a row: on random inputs no two
elements tie, so any tie rule is right there; on inputs with ties only the first-occurrence rule is.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmax(x, dim=1)


def get_inputs():
    return [torch.randn(128, 512)]


def get_init_inputs():
    return []
