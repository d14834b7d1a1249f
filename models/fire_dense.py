"""A SqueezeNet fire module, then a DenseNet-style block: convolution outputs joined along channels.

stitchcuda's own example reference, in KernelBench format. The fire module squeezes the input
with a 1x1 convolution, expands it with a 1x1 and a 3x3 convolution side by side and joins the
two along channels; each dense layer (batch norm -> ReLU -> 3x3 convolution) appends its
`growth` new channels to everything before it. As in KernelBench, the model is not put in eval
mode: batch norm uses the batch's statistics.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels: int, squeeze: int, expand: int, growth: int, layers: int):
        super().__init__()
        self.squeeze = nn.Conv2d(in_channels, squeeze, 1)
        self.expand1x1 = nn.Conv2d(squeeze, expand, 1)
        self.expand3x3 = nn.Conv2d(squeeze, expand, 3, padding=1)
        width = 2 * expand
        self.dense = nn.ModuleList()
        for i in range(layers):
            c = width + i * growth
            self.dense.append(nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, growth, 3, padding=1, bias=False)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, in_channels, size, size) -> (batch, 2 expand + layers growth, size, size)."""
        s = F.relu(self.squeeze(x))
        x = torch.cat([F.relu(self.expand1x1(s)), F.relu(self.expand3x3(s))], 1)
        for layer in self.dense:
            x = torch.cat([x, layer(x)], 1)
        return x


batch_size = 8
in_channels = 16
squeeze = 8
expand = 16
growth = 8
layers = 3
size = 32


def get_inputs():
    return [torch.randn(batch_size, in_channels, size, size)]


def get_init_inputs():
    return [in_channels, squeeze, expand, growth, layers]
