"""A normalisation- and pooling-heavy feature block (no convolutions), with an embedding head.

stitchcuda's own example reference, in KernelBench format. Feature maps go through group norm
and SiLU, max pooling with padding, instance norm, average pooling, a layer norm over the
channel and spatial dims, then global average and max pooling into a feature vector that is
projected and L2-normalised; beside it, the strongest channel response at each position.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, channels: int, groups: int, size: int, embed: int):
        super().__init__()
        self.gn = nn.GroupNorm(groups, channels)
        self.inorm = nn.InstanceNorm2d(channels, affine=True)
        self.ln = nn.LayerNorm([channels, size // 4, size // 4])
        self.proj = nn.Linear(2 * channels, embed)

    def forward(self, x: torch.Tensor):
        """x: (batch, channels, size, size) -> (embedding (batch, embed), strongest channel
        response per position (batch, size/4, size/4))."""
        h = self.gn(x)
        h = h * torch.sigmoid(h)  # SiLU
        h = F.max_pool2d(h, kernel_size=3, stride=2, padding=1)
        h = self.inorm(h)
        h = F.avg_pool2d(h, kernel_size=2)
        h = self.ln(h)
        feats = torch.cat([F.adaptive_avg_pool2d(h, 1).flatten(1), F.adaptive_max_pool2d(h, 1).flatten(1)], dim=1)
        z = self.proj(feats)
        return F.normalize(z, dim=-1), h.amax(dim=1)


batch_size = 8
channels = 32
groups = 8
size = 32
embed = 64


def get_inputs():
    return [torch.randn(batch_size, channels, size, size)]


def get_init_inputs():
    return [channels, groups, size, embed]
