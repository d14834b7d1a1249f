"""ELECTRA-small discriminator encoder (12 layers, hidden 256, embeddings 128 projected up), 32 sequences of 128 tokens with padding.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode. Inputs are token ids and an attention mask whose rows end in padding of random
length; the output is the last hidden state.
"""

import torch
from transformers import ElectraConfig, ElectraModel


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = ElectraConfig(embedding_size=128, hidden_size=256, num_hidden_layers=12, num_attention_heads=4, intermediate_size=1024)
        self.net = ElectraModel(cfg).eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


batch_size = 32
seq_len = 128
vocab_size = 30522


def get_inputs():
    lengths = torch.randint(seq_len // 2, seq_len + 1, (batch_size, 1))
    mask = (torch.arange(seq_len)[None, :] < lengths).long()
    return [torch.randint(0, vocab_size, (batch_size, seq_len)), mask]


def get_init_inputs():
    return []
