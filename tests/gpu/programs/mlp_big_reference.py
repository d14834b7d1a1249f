"""A GEMM-heavy reference for timing-stability tests: y = fc2(relu(fc1(x))), 4096 wide (~275 GFLOP)."""

import torch
import torch.nn as nn

N = 4096


class Model(nn.Module):
    def __init__(self, width: int = N):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def get_inputs():
    return [torch.randn(N, N)]


def get_init_inputs():
    return [N]
