"""GPT-2 small (12 layers, hidden 768, learned positions), 8 sequences of 512 tokens.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode, without a KV cache: one causal forward pass over full sequences of token ids, the
output the last hidden state.
"""

import torch
from transformers import GPT2Config, GPT2Model


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = GPT2Config(n_embd=768, n_layer=12, n_head=12, n_positions=1024)
        self.net = GPT2Model(cfg).eval()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids, use_cache=False).last_hidden_state


batch_size = 8
seq_len = 512
vocab_size = 50257


def get_inputs():
    return [torch.randint(0, vocab_size, (batch_size, seq_len))]


def get_init_inputs():
    return []
