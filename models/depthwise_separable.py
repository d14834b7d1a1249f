"""A MobileNet-style depthwise-separable network.

stitchcuda's own example reference, in KernelBench format. A strided 3x3 stem, then blocks of a
depthwise 3x3 convolution (groups = channels) and a pointwise 1x1 convolution, each followed by
batch norm (batch statistics, as in KernelBench) and ReLU6; the second block halves the
resolution and the last one has an inverted-residual shortcut. Global average pooling and a
linear classifier finish it.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Separable(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.dw = nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False)
        self.bn1 = nn.BatchNorm2d(cin)
        self.pw = nn.Conv2d(cin, cout, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu6(self.bn1(self.dw(x)))
        return F.relu6(self.bn2(self.pw(x)))


class Model(nn.Module):
    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.b1 = Separable(channels, 2 * channels, 1)
        self.b2 = Separable(2 * channels, 4 * channels, 2)
        self.b3 = Separable(4 * channels, 4 * channels, 1)
        self.fc = nn.Linear(4 * channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, 3, size, size) -> logits (batch, num_classes)."""
        x = F.relu6(self.bn(self.stem(x)))
        x = self.b2(self.b1(x))
        x = x + self.b3(x)
        return self.fc(x.mean(dim=(2, 3)))


batch_size = 8
channels = 16
size = 64
num_classes = 10


def get_inputs():
    return [torch.randn(batch_size, 3, size, size)]


def get_init_inputs():
    return [channels, num_classes]
