"""Two ResNet basic blocks (the second one downsampling) with a classifier head.

stitchcuda's own example reference, in KernelBench format. Each block is conv3x3 -> batch norm
-> ReLU -> conv3x3 -> batch norm, plus the shortcut (identity, or a strided 1x1 convolution and
batch norm where the block halves the resolution), then ReLU. As in KernelBench, the model is
not put in eval mode: batch norm uses the batch's statistics. Global average pooling and a
linear layer finish it.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class Model(nn.Module):
    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.block1 = BasicBlock(channels, channels, 1)
        self.block2 = BasicBlock(channels, 2 * channels, 2)
        self.fc = nn.Linear(2 * channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, 3, size, size) -> logits (batch, num_classes)."""
        x = F.relu(self.stem(x))
        x = self.block2(self.block1(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


batch_size = 8
channels = 32
size = 32
num_classes = 10


def get_inputs():
    return [torch.randn(batch_size, 3, size, size)]


def get_init_inputs():
    return [channels, num_classes]
