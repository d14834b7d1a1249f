"""A 3-layer MLP with ReLU: Linear -> ReLU -> Linear -> ReLU -> Linear.

stitchcuda's own example reference, in KernelBench format (``Model``, ``get_inputs``,
``get_init_inputs``). The GEMMs dominate; each bias + ReLU is an epilogue candidate.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, hidden_features)
        self.fc3 = nn.Linear(hidden_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, in_features) -> (batch, out_features)."""
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


batch_size = 256
in_features = 512
hidden_features = 1024
out_features = 256


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, hidden_features, out_features]
