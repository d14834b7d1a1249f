"""Whisper-base's audio encoder (two 1-d convolutions, 6 layers, d_model 512), 8 clips of 30 s.

A model of the zoo: built from its Hugging Face config with random weights (nothing downloaded),
in eval mode. The input is a batch of 80-bin log-mel spectrograms of 3,000 frames; the output is
the encoder's last hidden state (1,500 positions).
"""

import torch
from transformers import WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperEncoder


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = WhisperConfig(d_model=512, encoder_layers=6, encoder_attention_heads=8, encoder_ffn_dim=2048,
                            num_mel_bins=80, max_source_positions=1500)
        self.net = WhisperEncoder(cfg).eval()

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.net(input_features).last_hidden_state


batch_size = 8


def get_inputs():
    return [torch.randn(batch_size, 80, 3000)]


def get_init_inputs():
    return []
