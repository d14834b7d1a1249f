"""Reference for the adversarial programs (KernelBench format): y = relu(x @ W^T + b)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features: int = 256, out_features: int = 128):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return [256, 128]
