"""Swin-T (windows of 7, depths 2-2-6-2, 96 channels), 16 images of 224x224.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode. The output is the last hidden state.
"""

import torch
from transformers import SwinConfig, SwinModel


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = SwinConfig(image_size=224, patch_size=4, embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], window_size=7)
        self.net = SwinModel(cfg).eval()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.net(pixel_values=pixel_values).last_hidden_state


batch_size = 16
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return []
