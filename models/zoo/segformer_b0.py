"""SegFormer-B0 semantic segmentation (hierarchical encoder, all-MLP decoder, 19 classes), 8 images of 512x512.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode. The output is the per-class logits at a quarter of the resolution.
"""

import torch
from transformers import SegformerConfig, SegformerForSemanticSegmentation


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = SegformerConfig(num_labels=19, hidden_sizes=[32, 64, 160, 256], decoder_hidden_size=256, depths=[2, 2, 2, 2])
        self.net = SegformerForSemanticSegmentation(cfg).eval()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.net(pixel_values=pixel_values).logits


batch_size = 8
image_size = 512


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return []
