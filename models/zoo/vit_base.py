"""ViT-B/16 (12 layers, hidden 768), 16 images of 224x224.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode. The output is the last hidden state (the class token and the 196 patches).
"""

import torch
from transformers import ViTConfig, ViTModel


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = ViTConfig(image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
        self.net = ViTModel(cfg).eval()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.net(pixel_values=pixel_values).last_hidden_state


batch_size = 16
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return []
