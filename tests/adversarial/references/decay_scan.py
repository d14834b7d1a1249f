"""Reference for the long-dependency programs (KernelBench format): the last state of a decaying scan.

h_t = 0.995 h_{t-1} + x_t over t = 0 .. 2047 from h = 0, returned at the end: y = sum_t 0.995^(2047-t) x_t,
x: [32, 2048, 64] (batch, step, feature), y: [32, 64]. An early step's weight in y is small (0.995^2047
is 3.5e-5) but not nothing: a program that sums the last 1536 steps only is off by about 4.5e-4 of
y's scale, inside a 1e-2 tolerance on every ordinary input, and wrong as soon as an early step is large.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, decay: float = 0.995):
        super().__init__()
        self.decay = decay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = x.shape[1]
        w = self.decay ** torch.arange(steps - 1, -1, -1, device=x.device, dtype=x.dtype)
        return torch.einsum("btf,t->bf", x, w)


def get_inputs():
    return [torch.randn(32, 2048, 64)]


def get_init_inputs():
    return [0.995]
