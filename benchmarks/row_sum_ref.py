"""A plain row sum over long rows, for bench_optimize.py's replayed LLM body (one task)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=1)


def get_inputs():
    return [torch.randn(4096, 8192)]


def get_init_inputs():
    return []
