"""A Llama-style decoder (8 layers, hidden 1024, 16 query heads over 4 key-value heads, RoPE, RMSNorm, SwiGLU), 4 sequences of 1024 tokens.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode, without a KV cache: one causal forward pass over full sequences of token ids, the
output the last hidden state.
"""

import torch
from transformers import LlamaConfig, LlamaModel


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
        self.net = LlamaModel(cfg).eval()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids, use_cache=False).last_hidden_state


batch_size = 4
seq_len = 1024
vocab_size = 32000


def get_inputs():
    return [torch.randint(0, vocab_size, (batch_size, seq_len))]


def get_init_inputs():
    return []
