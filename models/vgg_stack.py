"""A VGG-style stack: pairs of 3x3 convolutions with ReLU, each pair followed by max pooling.

stitchcuda's own example reference, in KernelBench format. Three stages (the channel count
doubling at each), then a two-layer classifier over the flattened feature map.
"""

import torch
import torch.nn as nn


def stage(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2, 2))


class Model(nn.Module):
    def __init__(self, channels: int, size: int, hidden: int, num_classes: int):
        super().__init__()
        self.features = nn.Sequential(stage(3, channels), stage(channels, 2 * channels),
                                      stage(2 * channels, 4 * channels))
        self.classifier = nn.Sequential(nn.Linear(4 * channels * (size // 8) ** 2, hidden), nn.ReLU(inplace=True),
                                        nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, 3, size, size) -> logits (batch, num_classes)."""
        return self.classifier(torch.flatten(self.features(x), 1))


batch_size = 8
channels = 16
size = 32
hidden = 128
num_classes = 10


def get_inputs():
    return [torch.randn(batch_size, 3, size, size)]


def get_init_inputs():
    return [channels, size, hidden, num_classes]
