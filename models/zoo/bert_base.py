"""BERT-base encoder (12 layers, hidden 768, 12 heads), 8 sequences of 128 tokens with padding.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode. Inputs are token ids and an attention mask whose rows end in padding of random
length; the output is the last hidden state.
"""

import torch
from transformers import BertConfig, BertModel


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
        self.net = BertModel(cfg, add_pooling_layer=False).eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


batch_size = 8
seq_len = 128
vocab_size = 30522


def get_inputs():
    lengths = torch.randint(seq_len // 2, seq_len + 1, (batch_size, 1))
    mask = (torch.arange(seq_len)[None, :] < lengths).long()
    return [torch.randint(0, vocab_size, (batch_size, seq_len)), mask]


def get_init_inputs():
    return []
