"""A small 3d encoder-decoder over volumes (a U-Net-like shape without the skip concatenation
in the middle, with one at the top).

stitchcuda's own example reference, in KernelBench format. Encoder: a 3x3x3 convolution with
group norm and SiLU, a strided 3x3x3 convolution with GELU, then 3d max pooling. Decoder: two
transposed 3d convolutions (stride 2) with ReLU back to the input resolution, the encoder's first
feature map concatenated on the channel dim, and a 1x1x1 convolution with a sigmoid.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels: int, channels: int, out_channels: int, groups: int):
        super().__init__()
        self.enc1 = nn.Conv3d(in_channels, channels, 3, padding=1)
        self.gn = nn.GroupNorm(groups, channels)
        self.enc2 = nn.Conv3d(channels, 2 * channels, 3, stride=2, padding=1)
        self.up1 = nn.ConvTranspose3d(2 * channels, 2 * channels, 2, stride=2)
        self.up2 = nn.ConvTranspose3d(2 * channels, channels, 3, stride=2, padding=1, output_padding=1)
        self.head = nn.Conv3d(2 * channels, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, in_channels, d, h, w) with d, h, w divisible by 4 -> (batch, out_channels, d, h, w)."""
        e1 = self.gn(self.enc1(x))
        e1 = e1 * torch.sigmoid(e1)  # SiLU
        e2 = F.gelu(self.enc2(e1))
        z = F.max_pool3d(e2, 2)
        u = F.relu(self.up1(z))
        u = F.relu(self.up2(u))
        return torch.sigmoid(self.head(torch.cat([u, e1], dim=1)))


batch_size = 2
in_channels = 2
channels = 8
out_channels = 3
groups = 4
depth = 16
height = 16
width = 16


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, channels, out_channels, groups]
