"""Reference for the state programs (KernelBench format): state kept between calls in a plain tensor
attribute. Each call computes h' = tanh(x + h / 2) from the state h the previous call left in
``self.h``, replaces it with h' and returns y = 2 h'.

x, y, h: [256, 1024]; h starts at zero. A program takes h as the input ``state_h`` and hands h' back
as the output ``h_next`` (manifest ``state``).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.h = torch.zeros(256, 1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.h = torch.tanh(x + 0.5 * self.h)
        return 2 * self.h


def get_inputs():
    return [torch.randn(256, 1024)]


def get_init_inputs():
    return []
