"""A recurrence written by hand: an Elman cell applied in a Python loop over time.

stitchcuda's own example reference, in KernelBench format. No recurrent module: forward walks the
steps itself (``h = tanh(x_t W_x + h W_h + b)``), so capture unrolls the loop into one set of nodes
per step, planned like any other graph.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.x_proj = nn.Linear(input_size, hidden_size)
        self.h_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.out = nn.Linear(hidden_size, input_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, seq_len, input_size) -> (batch, input_size), from the last hidden state."""
        h = x.new_zeros(x.shape[0], self.h_proj.in_features)
        for t in range(x.shape[1]):
            h = torch.tanh(self.x_proj(x[:, t]) + self.h_proj(h))
        return self.out(h)


batch_size = 8
seq_len = 16
input_size = 32
hidden_size = 64


def get_inputs():
    return [torch.randn(batch_size, seq_len, input_size)]


def get_init_inputs():
    return [input_size, hidden_size]
