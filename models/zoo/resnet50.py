"""ResNet-50 (bottleneck blocks 3-4-6-3), 16 images of 224x224.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode. The output is the pooled feature map.
"""

import torch
from transformers import ResNetConfig, ResNetModel


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = ResNetConfig(depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048], layer_type="bottleneck")
        self.net = ResNetModel(cfg).eval()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.net(pixel_values=pixel_values).pooler_output


batch_size = 16
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return []
