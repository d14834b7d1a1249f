"""Reference for the degenerate-reference checks (KernelBench format): activations that vanish.

y = a stack of 24 blocks relu6(bn(linear(x))), x: [64, 64], every linear drawn at 0.02 as a Hugging
Face config's initialiser does, every batch norm in eval mode with its initial statistics (mean 0,
variance 1). Each block shrinks its input about tenfold, so after the stack y is the biases' alone, the
same for every input: a program returning that constant is right here and nowhere else. A model
trained (or its norms calibrated) keeps every block's output at unit scale.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, width: int = 64, depth: int = 24):
        super().__init__()
        layers = []
        for _ in range(depth):
            lin = nn.Linear(width, width)
            nn.init.normal_(lin.weight, std=0.02)
            nn.init.zeros_(lin.bias)
            layers += [lin, nn.BatchNorm1d(width), nn.ReLU6()]
        self.body = nn.Sequential(*layers).eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return [64, 24]
