"""A small vision transformer: a patch-embedding convolution, a class token, learned positions,
two pre-norm encoder layers and a classifier on the class token.

stitchcuda's own example reference, in KernelBench format. The patch embedding is a convolution
whose kernel and stride are the patch size (one GEMM-like convolution over the image); each
encoder layer is layer norm, multi-head self-attention (scaled_dot_product_attention over
heads) and a residual, then layer norm, an MLP with GELU and a residual.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp)
        self.fc2 = nn.Linear(mlp, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Model(nn.Module):
    def __init__(self, size: int, patch: int, dim: int, heads: int, mlp: int, layers: int, num_classes: int):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, dim) * 0.02)
        self.layers = nn.ModuleList([Layer(dim, heads, mlp) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        """img: (batch, 3, size, size) -> logits (batch, num_classes)."""
        x = self.embed(img).flatten(2).transpose(1, 2)              # (batch, patches, dim)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x[:, 0]))


batch_size = 8
size = 32
patch = 4
dim = 64
heads = 4
mlp = 128
layers = 2
num_classes = 10


def get_inputs():
    return [torch.randn(batch_size, 3, size, size)]


def get_init_inputs():
    return [size, patch, dim, heads, mlp, layers, num_classes]
