"""A UNet for segmentation (four levels, 32-256 channels, batch norm, transposed-convolution
upsampling, skip connections joined by concatenation), 8 images of 256x256, 2 classes.

A model of the zoo, written out (the architecture of Ronneberger et al. as segmentation code
deploys it; no library ships it), with random weights, in eval mode.
"""

import torch
import torch.nn as nn


def double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, channels: int, classes: int, widths: tuple[int, ...] = (32, 64, 128, 256)):
        super().__init__()
        self.down = nn.ModuleList()
        cin = channels
        for wdt in widths:
            self.down.append(double_conv(cin, wdt))
            cin = wdt
        self.bottom = double_conv(widths[-1], 2 * widths[-1])
        self.up = nn.ModuleList()
        self.merge = nn.ModuleList()
        cin = 2 * widths[-1]
        for wdt in reversed(widths):
            self.up.append(nn.ConvTranspose2d(cin, wdt, 2, stride=2))
            self.merge.append(double_conv(2 * wdt, wdt))
            cin = wdt
        self.head = nn.Conv2d(widths[0], classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = nn.functional.max_pool2d(x, 2)
        x = self.bottom(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips)):
            x = merge(torch.cat([skip, up(x)], 1))
        return self.head(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = UNet(3, 2).eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


batch_size = 8
image_size = 256


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return []
