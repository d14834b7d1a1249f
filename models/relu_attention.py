"""Attention with ReLU in place of softmax and no normalisation: ``relu(q·kᵀ·s)·v``.

stitchcuda's own precision-sensitive reference, in KernelBench format. Softmax keeps every row of
weights summing to one; ReLU does not, so each output is a sum of 1,024 unnormalised products
of TF32-rounded scores with ``v`` and its rounding errors add up past 1e-2 where the terms cancel.
The loop fixes it by computing the two GEMMs in fp32 (the elementwise work stays as it is).
"""

import math

import torch
import torch.nn as nn


#: Policies at which one attempt (`stitchcuda build`) misses the tolerance: the loop must repair them.
PRECISION_SENSITIVE = ("tf32", "bf16", "fp16")

class Model(nn.Module):
    def __init__(self, head_dim: int):
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v: (batch, heads, seq, head_dim) -> (batch, heads, seq, head_dim)."""
        w = torch.relu(torch.matmul(q, k.transpose(-2, -1)) * self.scale)
        return torch.matmul(w, v)


batch_size = 8
heads = 16
seq_len = 1024
head_dim = 64


def get_inputs():
    shape = (batch_size, heads, seq_len, head_dim)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return [head_dim]
