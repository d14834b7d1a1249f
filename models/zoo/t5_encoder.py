"""T5-small's encoder (6 layers, d_model 512, relative position buckets, RMS norm), 16 sequences of 256 tokens with padding.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode. Inputs are token ids and an attention mask whose rows end in padding of random
length; the output is the last hidden state.
"""

import torch
from transformers import T5Config, T5EncoderModel


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = T5Config(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8)
        self.net = T5EncoderModel(cfg).eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


batch_size = 16
seq_len = 256
vocab_size = 32128


def get_inputs():
    lengths = torch.randint(seq_len // 2, seq_len + 1, (batch_size, 1))
    mask = (torch.arange(seq_len)[None, :] < lengths).long()
    return [torch.randint(0, vocab_size, (batch_size, seq_len)), mask]


def get_init_inputs():
    return []
