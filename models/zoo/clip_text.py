"""CLIP's text encoder (12 layers, hidden 512, causal mask), 64 prompts of 77 tokens.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode. The input is token ids; the output is the last hidden state.
"""

import torch
from transformers import CLIPTextConfig, CLIPTextModel


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = CLIPTextConfig(hidden_size=512, num_hidden_layers=12, num_attention_heads=8, intermediate_size=2048,
                             max_position_embeddings=77, vocab_size=49408)
        self.net = CLIPTextModel(cfg).eval()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids).last_hidden_state


batch_size = 64
seq_len = 77


def get_inputs():
    return [torch.randint(0, 49408, (batch_size, seq_len))]


def get_init_inputs():
    return []
