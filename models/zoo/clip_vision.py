"""CLIP's ViT-B/32 image encoder (quick-GELU), 32 images of 224x224.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode. The output is the pooled, normalised class token.
"""

import torch
from transformers import CLIPVisionConfig, CLIPVisionModel


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = CLIPVisionConfig(image_size=224, patch_size=32, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
        self.net = CLIPVisionModel(cfg).eval()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.net(pixel_values=pixel_values).pooler_output


batch_size = 32
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return []
