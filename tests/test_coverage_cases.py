"""Shared by the coverage tests (it holds no tests): small references for the coverage families
(convolutions, pooling, norms, scans, arg reductions, gathers, the pointwise long tail) for the CPU tests (plan
interpreter), the nvcc sample and the GPU tests; and small sizes of the KernelBench problems these
families opened (read at run time from ../shared/kernelbench/all.jsonl; their module-level sizes
replaced: the real ones run to gigabytes)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.dev_problems import ALL_SET  # STITCHCUDA_SHARED honoured (a copy carried to a GPU machine)

REPO = Path(__file__).resolve().parents[1]


class Fn(nn.Module):
    """A module around a function (and the modules it holds), for one-line references."""

    def __init__(self, f: Callable[..., Any], **modules: nn.Module):
        super().__init__()
        self.f = f
        for k, m in modules.items():
            self.add_module(k, m)

    def forward(self, *args):
        return self.f(self, *args)


def _x(*shape: int, seed: int = 0, lo: float | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + sum(shape))
    t = torch.randn(*shape, generator=g)
    return t.abs() + lo if lo is not None else t


def _i(high: int, *shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed + high))


def _assign(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x[:, 2:5] = y          # slice_scatter
    x[1] = 0.5             # select_scatter (of a fill)
    return x + 1


def _seeded(build: Callable[[], tuple[nn.Module, list]]) -> Callable[[], tuple[nn.Module, list]]:
    """The builder with the same initial weights in every build."""

    def run():
        with torch.random.fork_rng():
            torch.manual_seed(7)
            return build()
    return run


class _RelativeBias(nn.Module):
    """A weight gathered by a constant index, then pointwise (Swin's relative position bias): all
    from weights, but the gather runs on every call, so what reads it must too."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(7, 3))
        self.register_buffer("index", torch.randint(0, 7, (4, 4)))
        self.proj = nn.Linear(3, 3)

    def forward(self, x):
        bias = self.proj(self.table)[self.index.view(-1)].view(4, 4, 3).permute(2, 0, 1).contiguous()
        return x @ (16 * torch.sigmoid(bias))


class _DenseBlock(nn.Module):
    """DenseNet's block: each layer reads the join of every earlier feature map (one growing list
    joined again and again: the joins share one buffer, each part written once)."""

    def __init__(self, c: int = 4, growth: int = 3, layers: int = 3):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.BatchNorm2d(c + i * growth), nn.ReLU(),
                                                  nn.Conv2d(c + i * growth, growth, 3, padding=1))
                                    for i in range(layers))

    def forward(self, x):
        features = [x]
        for layer in self.layers:
            features.append(layer(torch.cat(features, 1)))
        return torch.cat(features, 1)


def _prefix_joins(s, x):
    a, b, c = torch.tanh(x), x * 2, torch.sigmoid(x)
    return torch.cat([a, b, c], 1), torch.cat([a, b], 1) + 1  # the shorter join after the longer


def _two_convs(s, x):
    return torch.cat([s.a(x), s.b(x)], 1)  # each convolution's result in a slot of the concatenation


#: name -> (family, builder of (module, inputs)). Builders, so every test gets fresh objects.
CASES: dict[str, tuple[str, Callable[[], tuple[nn.Module, list]]]] = {
    # pooling (1-3 d, padding, dilation, ceil mode, adaptive, global) with hooks around it
    "maxpool1d": ("pool", lambda: (Fn(lambda s, x: F.max_pool1d(x, 3, 2, 1)), [_x(2, 3, 17)])),
    "maxpool1d_dilated": ("pool", lambda: (Fn(lambda s, x: F.max_pool1d(x, 4, 1, 2, dilation=3)), [_x(2, 3, 17)])),
    "maxpool2d_ceil": ("pool", lambda: (Fn(lambda s, x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True)), [_x(2, 6, 9, 10)])),
    "maxpool3d_dilated": ("pool", lambda: (Fn(lambda s, x: F.max_pool3d(x, 3, 2, 1, dilation=2)), [_x(2, 3, 5, 8, 9)])),
    "avgpool1d": ("pool", lambda: (Fn(lambda s, x: F.avg_pool1d(x, 4, 2, 2)), [_x(2, 3, 17)])),
    "avgpool2d_ceil": ("pool", lambda: (Fn(lambda s, x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True)), [_x(2, 6, 9, 10)])),
    "avgpool2d_no_pad_count": ("pool", lambda: (Fn(lambda s, x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)),
                                                [_x(2, 6, 9, 10)])),
    "avgpool2d_divisor": ("pool", lambda: (Fn(lambda s, x: F.avg_pool2d(x, 3, 2, 1, divisor_override=5)),
                                           [_x(2, 6, 9, 10)])),
    "avgpool3d": ("pool", lambda: (Fn(lambda s, x: F.avg_pool3d(x, 2, 2, 1)), [_x(2, 3, 5, 8, 9)])),
    "adaptive_avg2d": ("pool", lambda: (Fn(lambda s, x: F.adaptive_avg_pool2d(x, (3, 4))), [_x(2, 6, 9, 10)])),
    "adaptive_max2d": ("pool", lambda: (Fn(lambda s, x: F.adaptive_max_pool2d(x, 3)), [_x(2, 6, 9, 10)])),
    "adaptive_avg1d": ("pool", lambda: (Fn(lambda s, x: F.adaptive_avg_pool1d(x, 5)), [_x(2, 3, 17)])),
    "adaptive_avg3d": ("pool", lambda: (Fn(lambda s, x: F.adaptive_avg_pool3d(x, (2, 3, 3))), [_x(2, 3, 5, 8, 9)])),
    "global_avg": ("pool", lambda: (Fn(lambda s, x: F.adaptive_avg_pool2d(x, 1).flatten(1)), [_x(2, 6, 9, 10)])),
    # 2-d windows take pool.cuh's tiled path: outputs spanning several tiles with edge tiles in both
    # dims (64 x 32 outputs a tile), stride 2 with ceil mode, dilation with hooks around the pool
    "pool_tiles_max": ("pool", lambda: (Fn(lambda s, x: F.max_pool2d(x, 4, 1, 1)), [_x(2, 3, 70, 133)])),
    "pool_tiles_avg": ("pool", lambda: (Fn(lambda s, x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True,
                                                                     count_include_pad=False)), [_x(2, 3, 67, 131)])),
    "pool_tiles_dilated": ("pool", lambda: (Fn(lambda s, x: torch.relu(F.max_pool2d(torch.sigmoid(x), 3, 1, 1,
                                                                                    dilation=2)) * 3),
                                            [_x(1, 4, 45, 90)])),
    # a window too large for a tile: the rows path (as 3-d windows)
    "maxpool2d_wide_window": ("pool", lambda: (Fn(lambda s, x: F.max_pool2d(x, 40)), [_x(1, 2, 80, 81)])),
    # overlapping windows (stride 1), row counts not a multiple of four (the tiled path's edges; the
    # rows path, which 3-d and over-wide windows take, walks four output rows a thread)
    "maxpool2d_overlap": ("pool", lambda: (Fn(lambda s, x: F.max_pool2d(x, 4, 1, 1)), [_x(2, 3, 10, 9)])),
    "maxpool2d_dilated_stride1": ("pool", lambda: (Fn(lambda s, x: F.max_pool2d(x, 3, 1, 1, dilation=2)),
                                                   [_x(2, 3, 11, 7)])),
    "avgpool2d_overlap_pad": ("pool", lambda: (Fn(lambda s, x: F.avg_pool2d(x, 4, 1, 2)), [_x(2, 3, 9, 10)])),
    "pool_hooks": ("pool", lambda: (Fn(lambda s, x: torch.relu(F.max_pool2d(torch.tanh(x), 2)) * 2), [_x(2, 6, 9, 10)])),
    "pool_permuted": ("pool", lambda: (Fn(lambda s, x: F.avg_pool2d(x.permute(0, 3, 1, 2), 2)), [_x(2, 8, 6, 5)])),
    # norms
    "groupnorm": ("norm", lambda: (Fn(lambda s, x: s.gn(x), gn=nn.GroupNorm(3, 6)), [_x(2, 6, 9, 10)])),
    "groupnorm_2d_swish": ("norm", lambda: (Fn(lambda s, x: (lambda y: torch.sigmoid(y) * y)(s.gn(x)),
                                               gn=nn.GroupNorm(4, 16)), [_x(5, 16)])),
    # a GEMM's output in groups of 32 channels (rows of 32 elements: 16-byte packs, eight lanes a
    # row; the second pass a thread per channel), and groups of 6 (rows not whole packs)
    "groupnorm_2d_packed": ("norm", lambda: (Fn(lambda s, x: torch.sigmoid(s.gn(s.lin(x))), lin=nn.Linear(24, 128),
                                                gn=nn.GroupNorm(4, 128)), [_x(7, 24)])),
    "groupnorm_2d_odd": ("norm", lambda: (Fn(lambda s, x: s.gn(x), gn=nn.GroupNorm(3, 18)), [_x(5, 18)])),
    "groupnorm_long_rows": ("norm", lambda: (Fn(lambda s, x: s.gn(x), gn=nn.GroupNorm(2, 4)), [_x(2, 4, 70, 80)])),
    "instancenorm": ("norm", lambda: (Fn(lambda s, x: F.instance_norm(x)), [_x(2, 6, 9, 10)])),
    "instancenorm_affine": ("norm", lambda: (Fn(lambda s, x: s.n(x), n=nn.InstanceNorm2d(6, affine=True)),
                                             [_x(2, 6, 9, 10)])),
    "instancenorm1d": ("norm", lambda: (Fn(lambda s, x: s.n(x), n=nn.InstanceNorm1d(3)), [_x(2, 3, 17)])),
    "batchnorm_no_stats": ("norm", lambda: (Fn(lambda s, x: s.n(x), n=nn.BatchNorm2d(6, track_running_stats=False)),
                                            [_x(2, 6, 9, 10)])),
    "layernorm_2_dims": ("norm", lambda: (Fn(lambda s, x: F.layer_norm(x, (9, 10))), [_x(2, 6, 9, 10)])),
    "normalize": ("norm", lambda: (Fn(lambda s, x: F.normalize(x, dim=1)), [_x(5, 16)])),
    "frobenius": ("norm", lambda: (Fn(lambda s, x: x / torch.norm(x, p="fro")), [_x(2, 6, 9, 10)])),
    "norm_1_inf": ("norm", lambda: (Fn(lambda s, x: x.norm(p=1, dim=1) + x.norm(p=float("inf"), dim=1)), [_x(5, 16)])),
    "norm_3_middle": ("norm", lambda: (Fn(lambda s, x: torch.linalg.vector_norm(x, 3, dim=(0, 2))),
                                       [_x(2, 6, 9, 10)])),
    "whole_tensor_sum": ("norm", lambda: (Fn(lambda s, x: x.sum() + x.mean() + x.amax()), [_x(300, 300)])),
    # scans
    "cumsum": ("scan", lambda: (Fn(lambda s, x: torch.cumsum(x, 1)), [_x(5, 600)])),
    "cumsum_middle": ("scan", lambda: (Fn(lambda s, x: torch.cumsum(x, 1)), [_x(2, 6, 9, 10)])),
    "cumprod": ("scan", lambda: (Fn(lambda s, x: torch.cumprod(x * 0.3 + 1, 1)), [_x(5, 16)])),
    "cumsum_reverse": ("scan", lambda: (Fn(lambda s, x: torch.cumsum(x.flip(1), 1).flip(1)), [_x(5, 16)])),
    "cumsum_exclusive": ("scan", lambda: (Fn(lambda s, x: torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)),
                                                                      torch.cumsum(x.narrow(1, 0, 15), 1)), 1)),
                                         [_x(5, 16)])),
    "cumsum_masked": ("scan", lambda: (Fn(lambda s, x, m: torch.cumsum(x * m, 1)), [_x(5, 16), _x(5, 16) > 0])),
    "logcumsumexp": ("scan", lambda: (Fn(lambda s, x: torch.logcumsumexp(x, 1)), [_x(5, 16)])),
    "cummax": ("scan", lambda: (Fn(lambda s, x: torch.cummax(x, 1).values), [_x(5, 16)])),
    "cumsum_int": ("scan", lambda: (Fn(lambda s, i: torch.cumsum(i, 1)), [_i(9, 5, 16)])),
    # rows of >= 4096: scan.cuh's tiled path (aligned rows; a partial last tile), and an odd row
    # length that is not 16-byte aligned (the two-pass path)
    "cumsum_long": ("scan", lambda: (Fn(lambda s, x: torch.cumsum(x * torch.sigmoid(x), 1) * 0.5), [_x(3, 9000)])),
    "cumsum_long_odd": ("scan", lambda: (Fn(lambda s, x: torch.cumsum(x, 1)), [_x(3, 4101)])),
    "cummax_long": ("scan", lambda: (Fn(lambda s, x: torch.cummax(x, 1).values), [_x(2, 9000)])),
    "logcumsumexp_long": ("scan", lambda: (Fn(lambda s, x: torch.logcumsumexp(x, 1)), [_x(2, 8192)])),
    "cumsum_int_long": ("scan", lambda: (Fn(lambda s, i: torch.cumsum(i, 1)), [_i(9, 2, 5000)])),
    # arg reductions and max / min over a dim
    "argmax_middle": ("arg", lambda: (Fn(lambda s, x: x.argmax(1)), [_x(2, 6, 9, 10)])),
    "argmin_keepdim": ("arg", lambda: (Fn(lambda s, x: x.argmin(2, keepdim=True)), [_x(2, 6, 9, 10)])),
    "argmax_last": ("arg", lambda: (Fn(lambda s, x: x.argmax(-1)), [_x(7, 300)])),
    "argmax_all": ("arg", lambda: (Fn(lambda s, x: x.argmax()), [_x(2, 6, 9, 10)])),
    "max_dim_values": ("arg", lambda: (Fn(lambda s, x: x.max(1)[0]), [_x(2, 6, 9, 10)])),
    "max_dim_both": ("arg", lambda: (Fn(lambda s, x: tuple(x.max(-1))), [_x(2, 6, 9, 10)])),
    "min_dim_keepdim": ("arg", lambda: (Fn(lambda s, x: torch.min(x, 1, keepdim=True)[0] + 1), [_x(5, 16)])),
    "max_min_all": ("arg", lambda: (Fn(lambda s, x: x.max() + x.min()), [_x(5, 16)])),
    # gathers, padding, flips, repeats, arange
    "gather": ("gather", lambda: (Fn(lambda s, x, i: torch.gather(x, 1, i)), [_x(5, 16), _i(16, 5, 7)])),
    "index_select": ("gather", lambda: (Fn(lambda s, x, i: torch.index_select(x, 1, i)), [_x(5, 16), _i(16, 7)])),
    "index_rows": ("gather", lambda: (Fn(lambda s, x, i: x[i]), [_x(5, 16), _i(5, 7)])),
    "index_middle": ("gather", lambda: (Fn(lambda s, x, i: x[:, i]), [_x(2, 6, 9, 10), _i(6, 4)])),
    "index_split_dims": ("gather", lambda: (Fn(lambda s, x, i, j: x[i, :, j]), [_x(2, 6, 9, 10), _i(2, 4), _i(9, 4)])),
    # attention the fused template does not take (head dim 8), a query row that sees no key: zeros
    "attention_masked_rows": ("attention", lambda: (Fn(lambda s, q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.arange(4)[:, None] > torch.arange(5)[None, :])), [_x(2, 2, 4, 8), _x(2, 2, 5, 8, seed=1),
                                                                                 _x(2, 2, 5, 8, seed=2)])),
    "embedding": ("gather", lambda: (Fn(lambda s, i: s.e(i) * 2, e=nn.Embedding(10, 6)), [_i(10, 3, 5)])),
    "flip": ("gather", lambda: (Fn(lambda s, x: x.flip((0, 2))), [_x(2, 6, 9, 10)])),
    "roll": ("gather", lambda: (Fn(lambda s, x: torch.roll(x, 3, 1)), [_x(5, 16)])),
    # rolls over two and three dims (Swin's shifted windows): chained index_selects, one gather;
    # channels innermost (whole 16-byte vectors on the GPU) and not
    "roll_2d": ("gather", lambda: (Fn(lambda s, x: torch.roll(x, (-3, 2), (1, 2))), [_x(2, 7, 9, 8)])),
    "roll_3d_odd": ("gather", lambda: (Fn(lambda s, x: torch.roll(x, (1, -2, 4), (0, 2, 3)) * 2), [_x(3, 2, 5, 7)])),
    # chains that do not compose: the same dim twice; a middle result read by the caller too
    "index_select_same_dim": ("gather", lambda: (Fn(lambda s, x, i, j: x.index_select(1, i).index_select(1, j)),
                                                 [_x(4, 16), _i(16, 7), _i(7, 5, seed=1)])),
    "roll_middle_read": ("gather", lambda: (Fn(lambda s, x: (lambda y: (torch.roll(y, 1, 2), y))(torch.roll(x, 2, 1))),
                                            [_x(2, 5, 6)])),
    "pad_constant": ("gather", lambda: (Fn(lambda s, x: F.pad(x, (1, 2, 0, -1), value=0.5)), [_x(2, 6, 9, 10)])),
    "pad_reflect": ("gather", lambda: (Fn(lambda s, x: F.pad(x, (1, 2, 1, 1), mode="reflect")), [_x(2, 6, 9, 10)])),
    "pad_replicate": ("gather", lambda: (Fn(lambda s, x: F.pad(x, (1, 2, 1, 1), mode="replicate")), [_x(2, 6, 9, 10)])),
    "repeat": ("gather", lambda: (Fn(lambda s, x: x.repeat(2, 1, 1, 2)), [_x(2, 3, 17)])),
    # linear interpolations: one gather blending its taps; bicubic: PyTorch's decomposition (gathers
    # of computed indices and arithmetic)
    "upsample_bilinear": ("gather", lambda: (Fn(lambda s, x: F.interpolate(x, scale_factor=1.5, mode="bilinear")),
                                             [_x(2, 3, 6, 7)])),
    "upsample_linear_trilinear": ("gather", lambda: (Fn(lambda s, x, v: (
        F.interpolate(x, size=11, mode="linear", align_corners=True),
        F.interpolate(v, scale_factor=(0.5, 2.0, 1.7), mode="trilinear"))), [_x(2, 3, 6), _x(2, 3, 4, 5, 6)])),
    # a decode head's shape: channels-last features (a linear layer's output permuted), each
    # upsampled straight into its slot of a join along channels that a convolution reads
    "upsample_bilinear_into_cat": ("gather", lambda: (Fn(lambda s, a, b: s.fuse(torch.cat([
        F.interpolate(s.pa(a).permute(0, 3, 1, 2), size=(8, 8), mode="bilinear", align_corners=False),
        F.interpolate(s.pb(b).permute(0, 3, 1, 2), size=(8, 8), mode="bilinear", align_corners=True)], dim=1)),
        pa=nn.Linear(6, 16), pb=nn.Linear(6, 16), fuse=nn.Conv2d(32, 8, 1)), [_x(2, 8, 8, 6), _x(2, 3, 3, 6, seed=1)])),
    "upsample_bicubic_corners": ("gather", lambda: (Fn(lambda s, x: F.interpolate(
        x, size=(9, 4), mode="bicubic", align_corners=True)), [_x(2, 3, 6, 7)])),
    "upsample_nearest": ("gather", lambda: (Fn(lambda s, x: F.interpolate(x, scale_factor=2)), [_x(2, 6, 9, 10)])),
    "upsample_nearest_size": ("gather", lambda: (Fn(lambda s, x: F.interpolate(x, size=(13, 7))), [_x(2, 6, 9, 10)])),
    "tril_triu": ("gather", lambda: (Fn(lambda s, x: torch.tril(x) + torch.triu(x, 1)), [_x(5, 16)])),
    "arange": ("gather", lambda: (Fn(lambda s, x: x + torch.arange(16)), [_x(5, 16)])),
    "unfold_diagonal": ("gather", lambda: (Fn(lambda s, x: x.unfold(1, 4, 2).sum(-1) + torch.diagonal(x).sum()),
                                           [_x(5, 16)])),
    "cross_entropy": ("gather", lambda: (Fn(lambda s, x, t: F.cross_entropy(x, t)), [_x(5, 16), _i(16, 5)])),
    # the pointwise long tail
    "selu": ("pointwise", lambda: (Fn(lambda s, x: torch.selu(x)), [_x(5, 16)])),
    "nan_checks": ("pointwise", lambda: (Fn(lambda s, x: torch.isnan(x.log()).float() + torch.isinf(1 / (x * 0)).float()
                                              + torch.nan_to_num(x.log())), [_x(5, 16)])),
    "trig_and_logs": ("pointwise", lambda: (Fn(lambda s, x: torch.tan(x) + torch.asin(x.clamp(-1, 1)) + torch.sinh(x)
                                                 + torch.cosh(x) + torch.log2(x.abs() + 1) + torch.log10(x.abs() + 1)
                                                 + torch.exp2(x) + torch.erfc(x)), [_x(5, 16)])),
    "remainders": ("pointwise", lambda: (Fn(lambda s, x: torch.remainder(x, 0.7) + torch.fmod(x, -0.7)
                                              + torch.atan2(x, x + 1) + torch.hypot(x, x + 1)
                                              + torch.copysign(x, -x)), [_x(5, 16)])),
    "integer_bits": ("pointwise", lambda: (Fn(lambda s, i: ((i & 3) | (i ^ 5)) + (~i) + i % 3), [_i(64, 5, 16)])),
    "losses": ("pointwise", lambda: (Fn(lambda s, x: F.kl_div(x, x.abs(), reduction="batchmean")
                                          + F.cosine_similarity(x, x * 0.5 + 1).sum()
                                          + F.triplet_margin_loss(x, x + 1, x - 1)
                                          + F.hinge_embedding_loss(x, x.sign())), [_x(5, 16)])),
    "weights_gathered_then_pointwise": ("gather", _seeded(lambda: (_RelativeBias(), [_x(2, 3, 4, 4)]))),
    "slice_assign": ("gather", lambda: (Fn(lambda s, x, y: _assign(x * 2, y)), [_x(5, 16), _x(5, 3)])),
    "any_all_var": ("norm", lambda: (Fn(lambda s, x: ((x > 1).any(1), (x > -2).all(), torch.var(x, 1, unbiased=False),
                                                     x.std(0))), [_x(5, 16)])),
    "counts": ("pointwise", lambda: (Fn(lambda s, x: (x > 0).sum(1) + (x > 0.5).sum()), [_x(5, 16)])),
    # convolutions (cuDNN): 1-3 d, transposed, grouped, depthwise, stride / padding / dilation,
    # no bias, fused activations, operands in other layouts, results written into a slot
    "conv2d_relu": ("conv", _seeded(lambda: (Fn(lambda s, x: F.relu(s.c(x)), c=nn.Conv2d(3, 8, 3, padding=1)),
                                             [_x(2, 3, 9, 10)]))),
    # ReLU6 (nn.ReLU6, hardtanh(0, 6): the MobileNets' activation) fused as a clipped ReLU; another
    # hardtanh stays apart
    "conv2d_relu6": ("conv", _seeded(lambda: (
        Fn(lambda s, x: (nn.ReLU6()(s.c(x)), F.hardtanh(s.d(x), 0.0, 5.0)), c=nn.Conv2d(3, 8, 3, padding=1),
           d=nn.Conv2d(3, 4, 1)), [_x(2, 3, 9, 9, lo=None) * 4]))),
    "conv2d_strided_dilated": ("conv", _seeded(lambda: (
        Fn(lambda s, x: s.c(x), c=nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(2, 1), bias=False)),
        [_x(2, 4, 11, 9)]))),
    "conv2d_grouped_gelu": ("conv", _seeded(lambda: (Fn(lambda s, x: F.gelu(s.c(x)), c=nn.Conv2d(8, 12, 3, groups=4)),
                                                     [_x(2, 8, 7, 7)]))),
    "depthwise_separable_swish": ("conv", _seeded(lambda: (
        Fn(lambda s, x: (lambda y: y * torch.sigmoid(y))(s.pw(s.dw(x))), dw=nn.Conv2d(8, 8, 3, padding=1, groups=8),
           pw=nn.Conv2d(8, 16, 1)), [_x(2, 8, 10, 10)]))),
    # depthwise.cuh's rows path (channels-first: fp32) with stride, dilation and padding, and a
    # filter wider than its eight taps a row
    "depthwise_strided_dilated": ("conv", _seeded(lambda: (
        Fn(lambda s, x: s.c(x), c=nn.Conv2d(8, 8, 3, stride=2, padding=2, dilation=2, groups=8)), [_x(2, 8, 13, 11)]))),
    # its tiled path (square 3 / 5 / 7 filters): outputs over several 64 x 32 tiles with edges, stride 2
    # with a 5x5 filter and an activation after it; a 3x5 filter stays on the rows path
    "depthwise_tiles_3x3": ("conv", _seeded(lambda: (
        Fn(lambda s, x: F.relu(s.c(x)), c=nn.Conv2d(4, 4, 3, padding=1, groups=4)), [_x(1, 4, 70, 133)]))),
    "depthwise_tiles_5x5_s2": ("conv", _seeded(lambda: (
        Fn(lambda s, x: s.c(x), c=nn.Conv2d(6, 6, 5, stride=2, padding=2, groups=6)), [_x(2, 6, 75, 140)]))),
    # planes under one tile: half a tile or more stays tiled, staging only the rows and columns its
    # outputs read (20 x 70: 20 of 32 rows, a partial second column tile; 7x7 on 40 x 40: 40 of 64
    # columns); a 14 x 14 plane takes the rows path
    "depthwise_tile_short_3x3": ("conv", _seeded(lambda: (
        Fn(lambda s, x: F.relu6(s.c(x)), c=nn.Conv2d(4, 4, 3, padding=1, groups=4)), [_x(2, 4, 20, 70)]))),
    "depthwise_tile_narrow_7x7": ("conv", _seeded(lambda: (
        Fn(lambda s, x: s.c(x), c=nn.Conv2d(3, 3, 7, padding=3, groups=3)), [_x(2, 3, 40, 40)]))),
    "depthwise_small_plane_s2": ("conv", _seeded(lambda: (
        Fn(lambda s, x: s.c(x), c=nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16)), [_x(2, 16, 28, 28)]))),
    "depthwise_rows_3x5": ("conv", _seeded(lambda: (
        Fn(lambda s, x: s.c(x), c=nn.Conv2d(4, 4, (3, 5), padding=(1, 2), groups=4)), [_x(2, 4, 9, 12)]))),
    # TensorFlow's "same" padding as Hugging Face's MobileNets write it: F.pad (asymmetric, zeros)
    # before a padding-free depthwise convolution, folded into it; on both of its paths (a 1x1
    # convolution's channels-last output, and channels-first data on the tiled path), the second
    # with the convolution's own padding on top
    "depthwise_same_pad": ("conv", _seeded(lambda: (
        Fn(lambda s, x: (F.hardtanh(s.dw(F.pad(s.pw(x), (0, 1, 0, 1))), 0.0, 6.0),
                         s.dw2(F.pad(x, (2, 1, 1, 2)))),
           pw=nn.Conv2d(4, 8, 1), dw=nn.Conv2d(8, 8, 3, stride=2, groups=8),
           dw2=nn.Conv2d(4, 4, 3, padding=1, groups=4)), [_x(2, 4, 12, 10)]))),
    # the channels-last kernel (after a 1x1 convolution, channels-last under tf32) with a sliding
    # window of stride 2 (5x5 and 3x3), and stride 2 with dilation (any stride); odd widths leave a
    # partial group of four output columns
    "depthwise_nhwc_stride2": ("conv", _seeded(lambda: (
        Fn(lambda s, x: (lambda y: (F.relu6(s.dw5(y)), s.dw3(y), s.dwd(y)))(s.pw(x)), pw=nn.Conv2d(4, 8, 1),
           dw5=nn.Conv2d(8, 8, 5, stride=2, padding=2, groups=8), dw3=nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8),
           dwd=nn.Conv2d(8, 8, 3, stride=2, padding=2, dilation=2, groups=8)), [_x(2, 4, 13, 19)]))),
    "depthwise_wide": ("conv", _seeded(lambda: (
        Fn(lambda s, x: s.c(x), c=nn.Conv2d(4, 4, (2, 9), padding=(1, 4), groups=4, bias=False)), [_x(2, 4, 7, 30)]))),
    "conv1d_tanh_gelu_tanh": ("conv", _seeded(lambda: (
        Fn(lambda s, x: F.gelu(torch.tanh(s.c(x)), approximate="tanh"), c=nn.Conv1d(4, 6, 5, stride=2, padding=2)),
        [_x(3, 4, 33)]))),
    "conv3d_sigmoid": ("conv", _seeded(lambda: (Fn(lambda s, x: torch.sigmoid(s.c(x)), c=nn.Conv3d(2, 4, 3, padding=1)),
                                                [_x(2, 2, 5, 6, 7)]))),
    "conv_transpose2d": ("conv", _seeded(lambda: (
        Fn(lambda s, x: s.c(x), c=nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1)),
        [_x(2, 6, 5, 6)]))),
    "conv_transpose1d_grouped": ("conv", _seeded(lambda: (
        Fn(lambda s, x: F.relu(s.c(x)), c=nn.ConvTranspose1d(4, 6, 4, stride=3, groups=2, dilation=2)),
        [_x(2, 4, 9)]))),
    "conv_transpose3d": ("conv", _seeded(lambda: (
        Fn(lambda s, x: s.c(x) * 2.0, c=nn.ConvTranspose3d(4, 2, (2, 3, 3), stride=(1, 2, 2), bias=False)),
        [_x(1, 4, 3, 4, 5)]))),
    "conv_permuted_input": ("conv", _seeded(lambda: (
        Fn(lambda s, x: s.c(x.permute(0, 3, 1, 2)), c=nn.Conv2d(5, 3, 3)), [_x(2, 8, 7, 5)]))),
    "conv_into_cat": ("conv", _seeded(lambda: (Fn(_two_convs, a=nn.Conv2d(3, 4, 3, padding=1),
                                                  b=nn.Conv2d(3, 2, 1)), [_x(2, 3, 6, 6)]))),
    "conv_bn_relu": ("conv", _seeded(lambda: (
        Fn(lambda s, x: F.relu(s.bn(s.c(x))), c=nn.Conv2d(3, 8, 3, padding=1, bias=False), bn=nn.BatchNorm2d(8)),
        [_x(4, 3, 8, 8)]))),
    "conv_output_and_activation": ("conv", _seeded(lambda: (
        Fn(lambda s, x: (lambda y: (y, F.relu(y), y.mean()))(s.c(x)), c=nn.Conv2d(3, 4, 3)), [_x(2, 3, 6, 6)]))),
    # joins of a growing list (the front of each the earlier join), and two independent joins
    # of which one is the front of the other, computed in the other order
    "dense_block_joins": ("conv", _seeded(lambda: (_DenseBlock(), [_x(2, 4, 6, 7)]))),
    "prefix_joins": ("pointwise", lambda: (Fn(_prefix_joins), [_x(2, 3, 5)])),
    # a transposed convolution's bias handed to the clamp after it (rewrite conv_bias_into_elementwise)
    "conv_transpose_bias_clamp": ("conv", _seeded(lambda: (
        Fn(lambda s, x: torch.clamp(s.c(x), -0.2, 0.3) * 2.0, c=nn.ConvTranspose2d(5, 8, 3, stride=2, padding=1,
                                                                                  output_padding=1)),
        [_x(2, 5, 6, 7)]))),
    # group norm reading a channels-last convolution's result in place (tensor cores), with a
    # weight, a bias and an activation after; several splits of each sample's positions
    "conv_groupnorm_channels_last": ("conv", _seeded(lambda: (
        Fn(lambda s, x: torch.sigmoid(s.gn(s.c(x))), c=nn.Conv2d(3, 12, 3), gn=nn.GroupNorm(3, 12)),
        [_x(3, 3, 40, 37)]))),
    # training-mode batch norm after an activation: the statistics recompute it as their prologue
    # hook, the affine too (channels-last lanes under tensor cores, a block per channel at fp32)
    "conv_mish_batchnorm": ("conv", _seeded(lambda: (
        Fn(lambda s, x: s.bn((lambda y: y * torch.tanh(F.softplus(y)))(s.c(x))), c=nn.Conv2d(3, 12, 3),
           bn=nn.BatchNorm2d(12)), [_x(3, 3, 40, 37)]))),
    # the same with 10 channels: no 16-byte lanes (one channel a lane), a ReLU with a scale as hook
    "conv_relu_batchnorm_odd": ("conv", _seeded(lambda: (
        Fn(lambda s, x: s.bn(torch.relu(s.c(x)) * 0.5), c=nn.Conv2d(3, 10, 3), bn=nn.BatchNorm2d(10)),
        [_x(2, 3, 33, 30)]))),
    # means over a channels-last tensor's positions (a global average pool, kept dims and not;
    # an amax over two of three positions) read it in place as [samples, positions, channels]
    "conv_spatial_means_channels_last": ("conv", _seeded(lambda: (
        Fn(lambda s, x: (lambda y: (y.mean((2, 3)), y.mean((2, 3), keepdim=True) * 2, torch.relu(y).sum((2, 3))))(
            s.c(x)), c=nn.Conv2d(3, 12, 3)), [_x(3, 3, 11, 10)]))),
    "conv3d_amax_channels_last": ("conv", _seeded(lambda: (
        Fn(lambda s, x: s.c(x).amax((3, 4)), c=nn.Conv3d(2, 8, 2)), [_x(2, 2, 4, 5, 6)]))),
    # pooling inside a channels-last region (tensor cores): four channels a thread (8 channels)
    # and one (6), max with ceil mode then average
    # convolutions over few input channels (kinds/narrow_conv.py's kernel under tf32 where the result
    # is returned, cuDNN's elsewhere; tests/gpu/test_narrow_conv_gpu.py runs each on the kernel): tiles
    # cut by the edges, filter chunks (70 channels), a strided RGB stem, a dilated 16-channel one, and
    # one reading a wide convolution's result channels-last (under tensor cores)
    "narrow_conv_hardswish_chunks": ("conv", _seeded(lambda: (
        Fn(lambda s, x: F.hardswish(torch.relu(s.c(x))), c=nn.Conv2d(8, 70, 3, padding=1)), [_x(2, 8, 37, 41)]))),
    "narrow_conv_stem_7x7_stride2": ("conv", _seeded(lambda: (
        Fn(lambda s, x: torch.relu(s.c(x)), c=nn.Conv2d(3, 20, 7, stride=2, padding=3, bias=False)),
        [_x(2, 3, 45, 50)]))),
    "narrow_conv_dilated_16ch": ("conv", _seeded(lambda: (
        Fn(lambda s, x: s.c(x) * 0.5, c=nn.Conv2d(16, 9, 3, padding=2, dilation=2)), [_x(2, 16, 23, 18)]))),
    "narrow_conv_channels_last_region": ("conv", _seeded(lambda: (
        Fn(lambda s, x: torch.sigmoid(s.b(torch.relu(s.a(x)))), a=nn.Conv2d(24, 16, 1), b=nn.Conv2d(16, 32, 3, padding=1)),
        [_x(2, 24, 21, 19)]))),
    "conv_pools_channels_last": ("conv", _seeded(lambda: (
        Fn(lambda s, x: (F.avg_pool2d(F.max_pool2d(F.relu(s.a(x)), 3, 2, ceil_mode=True), 2),
                         F.max_pool2d(s.b(x), 2)), a=nn.Conv2d(3, 8, 3), b=nn.Conv2d(3, 6, 3)), [_x(2, 3, 12, 11)]))),
}

FAMILIES = sorted({f for f, _ in CASES.values()})


# ---------------------------------------------------------------------- KernelBench problems


@functools.lru_cache(maxsize=None)
def all_rows() -> dict[tuple[int, int], dict]:
    if not ALL_SET.is_file():
        return {}
    return {(r["level"], r["problem_id"]): r for r in map(json.loads, ALL_SET.read_text().splitlines())}


#: Small sizes of the problems the coverage families opened (name = value in their source).
SMALL: dict[tuple[int, int], dict[str, str]] = {
    (1, 14): dict(N="24"), (1, 15): dict(M="24"), (1, 27): dict(batch_size="4", dim="33"),
    (1, 34): dict(batch_size="2", features="3", dim1="9", dim2="10"),
    (1, 35): dict(batch_size="2", features="8", num_groups="4", dim1="9", dim2="10"),
    (1, 37): dict(batch_size="2", features="3", dim1="9", dim2="10"), (1, 39): dict(batch_size="4", dim="33"),
    (1, 41): dict(batch_size="2", features="3", sequence_length="40"),
    (1, 42): dict(batch_size="2", channels="3", height="12", width="11"),
    (1, 43): dict(batch_size="2", channels="2", dim1="12", dim2="11", dim3="10"),
    (1, 44): dict(batch_size="2", in_channels="3", input_length="40"),
    (1, 45): dict(batch_size="2", channels="3", height="24", width="23"),
    (1, 46): dict(batch_size="2", channels="2", depth="8", height="9", width="10"),
    (1, 49): dict(batch_size="2", dim1="9", dim2="10"), (1, 51): dict(batch_size="2", dim1="9", dim2="10"),
    (1, 52): dict(batch_size="2", dim1="9", dim2="10"), (1, 53): dict(batch_size="2", dim1="9", dim2="10"),
    (1, 89): dict(batch_size="4", input_shape="(300,)"), (1, 90): dict(batch_size="4", input_shape="(30,)"),
    (1, 91): dict(batch_size="4", input_shape="(300,)"), (1, 92): dict(batch_size="4", input_shape="(300,)"),
    (1, 93): dict(batch_size="4", input_shape="(300,)"),
    (1, 95): dict(batch_size="8", num_classes="10"), (1, 98): dict(batch_size="8", input_shape="(10,)"),
    (1, 99): dict(batch_size="8", input_shape="(10,)"),
    (2, 18): dict(batch_size="8", in_features="16", out_features="24"),
    (2, 28): dict(batch_size="8", in_features="16", out_features="24"),
    (2, 30): dict(batch_size="8", in_features="16", out_features="24", num_groups="4"),
    (2, 33): dict(batch_size="8", in_features="16", out_features="24"),
    (2, 37): dict(batch_size="8", in_features="16", out_features="24", num_groups="4"),
    (2, 39): dict(batch_size="8", in_features="16", out_features="24"),
    (2, 55): dict(batch_size="8", in_features="16", out_features="24"),
    (2, 62): dict(batch_size="8", input_size="16", hidden_size="24", num_groups="4"),
    (2, 75): dict(batch_size="8", in_features="16", out_features="24", num_groups="4"),
    (2, 80): dict(batch_size="8", in_features="16", out_features="24"),
    (2, 88): dict(batch_size="8", in_features="16", out_features="24", num_groups="4"),
    (2, 94): dict(batch_size="8", in_features="16", out_features="24", num_groups="4"),
    (2, 98): dict(batch_size="8", in_features="16", out_features="32", pool_kernel_size="4"),
    (3, 47): dict(batch_size="2", num_features="10", num_clusters="4", feature_size="12"),
    # convolutions (cuDNN) and what follows them
    (1, 60): dict(batch_size="2", in_channels="3", out_channels="4", width="10", height="9", depth="8"),
    (1, 64): dict(batch_size="2", in_channels="4", out_channels="6", length="33"),
    (1, 75): dict(batch_size="2", in_channels="8", out_channels="8", height="9", width="11"),
    (1, 87): dict(batch_size="2", in_channels="6", out_channels="5", width="7", height="6"),
    (2, 2): dict(batch_size="2", in_channels="4", out_channels="4", height="width = 9"),
    (2, 21): dict(batch_size="2", in_channels="3", out_channels="8", height="width = 10", num_groups="4"),
    (2, 52): dict(batch_size="4", in_channels="3", out_channels="6", **{"height, width": "9, 10"}),
    (2, 89): dict(batch_size="2", in_channels="3", out_channels="4", **{"depth, height, width": "4, 6, 6"}),
    # Recurrent layers (those taking their initial state as inputs; 35 and 36 draw it in forward).
    (3, 37): dict(batch_size="3", sequence_length="7", input_size="8", hidden_size="16", num_layers="2",
                  output_size="4"),
    (3, 38): dict(batch_size="3", sequence_length="7", input_size="8", hidden_size="16", num_layers="2",
                  output_size="4"),
    (3, 40): dict(batch_size="3", seq_len="7", input_size="8", hidden_size="16", num_layers="2"),
    (3, 41): dict(batch_size="3", seq_len="7", input_size="8", hidden_size="16", num_layers="2"),
    (3, 42): dict(batch_size="3", seq_len="7", input_size="8", hidden_size="16", num_layers="2"),
}


def shrink(source: str, sizes: dict[str, str]) -> str:
    for name, value in sizes.items():
        source, n = re.subn(rf"^{name}\s*=.*$", f"{name} = {value}", source, flags=re.M)
        assert n == 1, f"{name} not assigned once in the source"
    return source


def problem_reference(key: tuple[int, int], small: bool = True):
    from stitchcuda import frontend

    row = all_rows()[key]
    source = shrink(row["source"], SMALL[key]) if small else row["source"]
    return frontend.load_reference(source, name=row["name"] + ("_small" if small else ""))


def problem_id(key: tuple[int, int]) -> str:
    return f"L{key[0]}-{key[1]}"
