"""A linear layer whose whole 8,192-wide output row is summed: ``sum(x·Wᵀ + b, dim=1)``.

stitchcuda's own precision-sensitive reference, in KernelBench format. Under ``tf32`` the GEMM's
rounding errors (about 1e-3 relative per product) do not cancel in the sum the way the values do:
the row sums are small next to the terms they add up, so the result misses 1e-2. Two exact fixes
the optimisation loop can find: compute that GEMM in fp32, or reduce the weight first
(``sum(x·Wᵀ + b, 1) = x·(ΣW) + Σb``: a matrix-vector product, less work and better conditioned).
"""

import torch
import torch.nn as nn


#: Policies at which one attempt (`stitchcuda build`) misses the tolerance: the loop must repair them.
PRECISION_SENSITIVE = ("tf32", "bf16", "fp16")

class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, in_features) -> (batch, 1)."""
        return torch.sum(self.linear(x), dim=1, keepdim=True)


batch_size = 1024
in_features = 4096
out_features = 8192


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
