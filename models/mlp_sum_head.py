"""A two-layer MLP whose head sums a wide projection: ``sum(gelu(x·W1ᵀ)·W2ᵀ, dim=-1)``.

stitchcuda's own precision-sensitive reference, in KernelBench format. Only the last GEMM is
sensitive: its 8,192 outputs per row are summed, and TF32's rounding survives the sum where
the values cancel. The first GEMM is fine at tf32, so a precision repair should raise
only the last task to fp32 (or push the sum into the weights: an exact rewrite) and keep the
first on TF32 tensor cores.
"""

import torch
import torch.nn as nn


#: Policies at which one attempt (`stitchcuda build`) misses the tolerance: the loop must repair them.
PRECISION_SENSITIVE = ("tf32", "bf16", "fp16")

class Model(nn.Module):
    def __init__(self, in_features: int, hidden: int, wide: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, wide)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, in_features) -> (batch,)."""
        h = torch.nn.functional.gelu(self.fc1(x))
        return torch.sum(self.fc2(h), dim=-1)


batch_size = 512
in_features = 1024
hidden = 2048
wide = 8192


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, hidden, wide]
