"""A bidirectional two-layer GRU over time-major sequences, pooled over time.

stitchcuda's own example reference, in KernelBench format. ``nn.GRU`` with the default
``batch_first=False`` and no initial state (zeros); returns the mean of the output sequence over
time and the final hidden state of every layer and direction.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, num_layers: int):
        super().__init__()
        self.gru = nn.GRU(input_size, hidden_size, num_layers, bidirectional=True)

    def forward(self, x: torch.Tensor):
        """x: (seq_len, batch, input_size) -> (batch, 2 * hidden_size), (2 * num_layers, batch, hidden_size)."""
        out, hn = self.gru(x)
        return out.mean(0), hn


seq_len = 64
batch_size = 8
input_size = 64
hidden_size = 256
num_layers = 2


def get_inputs():
    return [torch.randn(seq_len, batch_size, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers]
