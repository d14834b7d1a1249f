"""A Qwen2-style decoder (8 layers, hidden 896, 14 query heads over 2 key-value heads, biased q/k/v), 8 sequences of 512 tokens.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode, without a KV cache: one causal forward pass over full sequences of token ids, the
output the last hidden state.
"""

import torch
from transformers import Qwen2Config, Qwen2Model


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=8, num_attention_heads=14, num_key_value_heads=2, vocab_size=32000, max_position_embeddings=2048)
        self.net = Qwen2Model(cfg).eval()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids, use_cache=False).last_hidden_state


batch_size = 8
seq_len = 512
vocab_size = 32000


def get_inputs():
    return [torch.randint(0, vocab_size, (batch_size, seq_len))]


def get_init_inputs():
    return []
