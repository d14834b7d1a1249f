"""EfficientNet-B0 (squeeze-excitation, SiLU), 16 images of 224x224.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode. The output is the pooled feature map.
"""

import torch
from transformers import EfficientNetConfig, EfficientNetModel


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = EfficientNetConfig(width_coefficient=1.0, depth_coefficient=1.0, image_size=224, dropout_rate=0.2, hidden_dim=1280)
        self.net = EfficientNetModel(cfg).eval()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.net(pixel_values=pixel_values).pooler_output


batch_size = 16
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return []
