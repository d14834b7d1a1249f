"""A stacked, bidirectional LSTM encoder over batch-first sequences, with a linear head.

stitchcuda's own example reference, in KernelBench format. Three LSTM layers, both directions,
``batch_first=True``, an explicit initial state; returns the head applied to every step, the final
hidden state h_n and the final cell state c_n (so all three results of the layer are checked).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, num_layers: int, classes: int):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden_size, classes)

    def forward(self, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor):
        """x: (batch, seq_len, input_size); h0, c0: (2 * num_layers, batch, hidden_size)."""
        out, (hn, cn) = self.lstm(x, (h0, c0))
        return self.head(out), hn, cn


batch_size = 16
seq_len = 64
input_size = 128
hidden_size = 256
num_layers = 3
classes = 32


def get_inputs():
    return [torch.randn(batch_size, seq_len, input_size), torch.randn(2 * num_layers, batch_size, hidden_size),
            torch.randn(2 * num_layers, batch_size, hidden_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers, classes]
