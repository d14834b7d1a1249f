"""RegNetY-400MF (squeeze-excitation, groups of 8 channels), 32 images of 224x224.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode. The output is the pooled feature map.
"""

import torch
from transformers import RegNetConfig, RegNetModel


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = RegNetConfig(embedding_size=32, hidden_sizes=[48, 104, 208, 440], depths=[1, 3, 6, 6], groups_width=8, layer_type="y")
        self.net = RegNetModel(cfg).eval()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.net(pixel_values=pixel_values).pooler_output


batch_size = 32
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return []
