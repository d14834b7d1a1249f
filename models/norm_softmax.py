"""A normalisation- and softmax-heavy classifier head.

stitchcuda's own example reference, in KernelBench format. Row-wise work throughout:
an RMSNorm written out (``x * rsqrt(mean(x^2) + eps) * w``), a LayerNorm over the
residual sum, a projection to class logits, then softmax, log-softmax, the entropy of the
distribution, a numerically stable logsumexp written out by hand next to
``torch.logsumexp``, and the variance of the normalised features.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


class Model(nn.Module):
    def __init__(self, dim: int, num_classes: int, temperature: float):
        super().__init__()
        self.rms = RMSNorm(dim)
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        self.temperature = temperature

    def forward(self, x: torch.Tensor):
        """x: (batch, seq_len, dim) -> (log-probabilities (batch, seq_len, num_classes),
        statistics (batch, seq_len, 4): entropy, logsumexp by hand, torch.logsumexp, variance)."""
        h = self.ln(x + self.rms(x))
        logits = self.head(h) / self.temperature
        log_probs = F.log_softmax(logits, dim=-1)
        probs = torch.softmax(logits, dim=-1)
        entropy = -(probs * log_probs).sum(dim=-1)
        row_max = logits.amax(dim=-1, keepdim=True)
        lse = (row_max + torch.log(torch.exp(logits - row_max).sum(dim=-1, keepdim=True))).squeeze(-1)
        lse_torch = torch.logsumexp(logits, dim=-1)
        variance = torch.var(h, dim=-1)
        return log_probs, torch.stack([entropy, lse, lse_torch, variance], dim=-1)


batch_size = 8
seq_len = 64
dim = 512
num_classes = 1000
temperature = 2.0


def get_inputs():
    return [torch.rand(batch_size, seq_len, dim)]


def get_init_inputs():
    return [dim, num_classes, temperature]
