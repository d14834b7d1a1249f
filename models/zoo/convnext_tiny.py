"""ConvNeXt-T (depths 3-3-9-3, widths 96-768), 16 images of 224x224.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode. The output is the pooled, normalised feature.
"""

import torch
from transformers import ConvNextConfig, ConvNextModel


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = ConvNextConfig(depths=[3, 3, 9, 3], hidden_sizes=[96, 192, 384, 768])
        self.net = ConvNextModel(cfg).eval()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.net(pixel_values=pixel_values).pooler_output


batch_size = 16
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return []
