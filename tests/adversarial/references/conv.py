"""Reference for the convolution programs (KernelBench format): y = conv2d(x, W) + b.

x: [4, 3, 16, 16], conv: 3 -> 8 channels, 3x3, padding 1, bias; y: [4, 8, 16, 16]. cuDNN through the
runtime's st_conv, fp32 (no TF32: the reference computes convolutions with TF32 off too).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels: int = 3, out_channels: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(4, 3, 16, 16)]


def get_init_inputs():
    return [3, 8]
