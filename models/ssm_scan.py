"""A state-space-style sequence block: a selective scan written with cumulative sums.

stitchcuda's own example reference, in KernelBench format. Per head, a decaying linear recurrence
h_t = exp(dt_t * A) h_{t-1} + dt_t B_t x_t, y_t = C_t . h_t, computed the way structured
state-space models compute it in parallel (as in Mamba-2's chunk): the cumulative sum of the
log-decays gives every pair's decay exp(cs_i - cs_j), masked to the causal triangle built from
``arange``, then two batched products. A gate, a cumulative mean over the sequence (a second
scan) and an RMS norm finish the block.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim: int, heads: int, state: int):
        super().__init__()
        self.heads, self.state = heads, state
        self.in_proj = nn.Linear(dim, 2 * dim + 2 * state + heads)
        self.a_log = nn.Parameter(torch.log(torch.linspace(1.0, 8.0, heads)))
        self.norm_weight = nn.Parameter(torch.ones(dim))
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, seq_len, dim) -> (batch, seq_len, dim)."""
        b, t, d = x.shape
        h, n = self.heads, self.state
        xs, gate, bm, cm, dt = self.in_proj(x).split([d, d, n, n, h], dim=-1)
        dt = torch.log1p(torch.exp(dt))                        # softplus: (b, t, h)
        da = (dt * -torch.exp(self.a_log)).transpose(1, 2)     # (b, h, t): log-decay per step
        cs = torch.cumsum(da, dim=-1)
        seg = cs.unsqueeze(-1) - cs.unsqueeze(-2)              # (b, h, t, t): cs_i - cs_j
        i = torch.arange(t, device=x.device)
        causal = i.unsqueeze(-1) >= i.unsqueeze(0)
        decay = torch.exp(seg.masked_fill(~causal, float("-inf")))
        scores = (cm @ bm.transpose(1, 2)).unsqueeze(1) * decay  # (b, h, t, t)
        xh = (xs.view(b, t, h, d // h) * dt.unsqueeze(-1)).transpose(1, 2)  # (b, h, t, d/h)
        y = (scores @ xh).transpose(1, 2).reshape(b, t, d)
        y = y * gate * torch.sigmoid(gate)  # SiLU gate
        y = y + torch.cumsum(y, dim=1) / torch.arange(1, t + 1, device=x.device).view(1, t, 1)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5) * self.norm_weight
        return self.out_proj(y)


batch_size = 4
seq_len = 64
dim = 128
heads = 4
state = 16


def get_inputs():
    return [torch.randn(batch_size, seq_len, dim)]


def get_init_inputs():
    return [dim, heads, state]
