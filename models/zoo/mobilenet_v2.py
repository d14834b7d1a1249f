"""MobileNet V2 (width 1.0), 32 images of 224x224.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode. The output is the pooled feature map.
"""

import torch
from transformers import MobileNetV2Config, MobileNetV2Model


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = MobileNetV2Config(depth_multiplier=1.0, image_size=224)
        self.net = MobileNetV2Model(cfg).eval()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.net(pixel_values=pixel_values).pooler_output


batch_size = 32
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return []
