"""One step of an Elman RNN cell whose hidden state lives in a plain tensor attribute.

stitchcuda's own example of a reference that keeps state between calls, in KernelBench format
(``Model``, ``get_inputs``, ``get_init_inputs``): each call reads the hidden state the previous
call left in ``self.hidden``, replaces it with the new one and returns a projection of it. The
program built from it takes the hidden state before the call as an explicit input
(``state_hidden``) and returns the state after the call as an extra output: the caller carries it
from one call to the next. Unlike KernelBench's 3:33 (whose forward overwrites the state with an
input first), every output here depends on the state passed in.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, output_size: int):
        super().__init__()
        self.hidden = torch.zeros(batch_size, hidden_size)  # state: not a parameter, not a buffer
        self.x2h = nn.Linear(input_size, hidden_size)
        self.h2h = nn.Linear(hidden_size, hidden_size, bias=False)
        self.h2o = nn.Linear(hidden_size, output_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, input_size) -> (batch, output_size); self.hidden: (batch, hidden_size), replaced."""
        self.hidden = torch.tanh(self.x2h(x) + self.h2h(self.hidden))
        return self.h2o(self.hidden)


batch_size = 64
input_size = 256
hidden_size = 512
output_size = 128


def get_inputs():
    return [torch.rand(batch_size, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, output_size]
