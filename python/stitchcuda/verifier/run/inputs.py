"""The Verifier's inputs: secret randomness, varied distributions, single-element changes.

A program must not be able to tell which trial it is in or what the next one will be. Every
random choice of a verification comes from one :class:`Secret` drawn fresh for it (the seed is
written to the report only after the run): the seeds of the trials, the distributions of the
varied trials and their parameters, the elements the sensitivity trials change, the timed calls
that are checked.

Varied distributions (:data:`KINDS`) transform the floating-point inputs drawn by the reference's
``get_inputs()``: a program that is right on that distribution only by assuming it (a softmax
without the max subtraction, a table valid on [-4, 4], a statistic estimated from a sample) is
wrong on these. Integer and boolean inputs, and random draws lifted out of the reference's
forward, are left as drawn (they are indices, masks or draws with a meaning).
"""

from __future__ import annotations

import math
import random
import secrets
from dataclasses import dataclass
from typing import Sequence

import torch

#: The distribution families of the varied trials.
KINDS = ("scaled_up", "scaled_down", "offset", "heavy_tailed", "sparse", "structured")


def fresh_seed() -> int:
    """A seed nobody can predict (62 bits from the operating system)."""
    return secrets.randbits(62)


class Secret:
    """Every random choice of one verification, from one seed (module docstring)."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._rng = random.Random(self.seed)

    def seed_for(self, what: str) -> int:
        """A sub-seed for ``what`` (a torch seed: < 2**63), the same for the same seed and name."""
        return random.Random(f"{self.seed}:{what}").getrandbits(62)

    def rng(self, what: str) -> random.Random:
        return random.Random(f"{self.seed}:{what}:rng")

    def choice(self, seq: Sequence):
        return self._rng.choice(list(seq))


@dataclass(frozen=True)
class Variation:
    """One varied distribution: a kind of :data:`KINDS` and its parameters."""

    kind: str
    a: float = 0.0
    b: float = 0.0
    sub: str = ""

    @property
    def label(self) -> str:
        if self.kind in ("scaled_up", "scaled_down"):
            return f"{self.kind} x{self.a:.3g}"
        if self.kind == "offset":
            return f"offset {self.a:+.3g} sd"
        if self.kind == "heavy_tailed":
            return f"heavy_tailed (lognormal sigma {self.a:.2g})"
        if self.kind == "sparse":
            return f"sparse ({self.a:.0%} zeros)"
        return f"structured ({self.sub})"


def choose_variations(rng: random.Random, n: int) -> list[Variation]:
    """``n`` variations of distinct kinds (kinds repeat only past len(KINDS)), parameters drawn. The
    first is always ``scaled_up`` (x24 to x160: magnitudes a program tuned to get_inputs() never
    sees, e.g. logits past exp's range without the max subtraction); the others are drawn."""
    rest = [k for k in KINDS if k != "scaled_up"]
    rng.shuffle(rest)
    kinds = ["scaled_up"] + rest
    out = []
    for k in range(n):
        kind = kinds[k % len(kinds)]
        if kind == "scaled_up":
            out.append(Variation(kind, math.exp(rng.uniform(math.log(24.0), math.log(160.0)))))
        elif kind == "scaled_down":
            out.append(Variation(kind, math.exp(rng.uniform(math.log(1e-3), math.log(0.1)))))
        elif kind == "offset":
            out.append(Variation(kind, rng.choice((-1, 1)) * rng.uniform(5.0, 50.0)))
        elif kind == "heavy_tailed":
            out.append(Variation(kind, rng.uniform(1.0, 2.0)))
        elif kind == "sparse":
            out.append(Variation(kind, rng.uniform(0.5, 0.95)))
        else:
            out.append(Variation(kind, sub=rng.choice(("sorted", "repeated_rows", "ramp", "blocks"))))
    return out


def _stats(x: torch.Tensor) -> tuple[float, float]:
    xf = x.float()
    std, mean = torch.std_mean(xf) if xf.numel() > 1 else (torch.zeros(()), xf.reshape(-1)[0])
    m, s = float(mean.item()), float(std.item())
    if not math.isfinite(s):
        s = 0.0
    return m, (s if s > 0 else max(abs(m), 1.0))


#: Elements transformed at a time: the temporaries of a multi-GiB input stay small.
CHUNK = 1 << 25

#: Past this many elements a "sorted" structured input becomes a ramp (a sort's indices would take
#: twice the input's memory again).
SORT_MAX = 1 << 24


def vary(x: torch.Tensor, v: Variation, gen: torch.Generator) -> torch.Tensor:
    """``x`` (a floating input) drawn from variation ``v`` instead; same shape, dtype and device, a new
    tensor. ``gen`` is a generator on ``x``'s device. Transformed in chunks (one copy of ``x`` in all)."""
    if not x.dtype.is_floating_point or x.numel() == 0:
        return x
    y = x.float().clone() if x.dtype != torch.float32 else x.clone()
    mean, sd = _stats(y)
    if v.kind in ("scaled_up", "scaled_down"):
        y.mul_(v.a)
    elif v.kind == "offset":
        y.add_(v.a * max(sd, 1e-3))
    elif v.kind in ("heavy_tailed", "sparse"):
        flat = y.view(-1)
        for lo in range(0, flat.numel(), CHUNK):
            seg = flat[lo:lo + CHUNK]
            if v.kind == "heavy_tailed":
                seg.mul_(torch.randn(seg.shape, generator=gen, device=y.device).mul_(v.a).exp_())
            else:
                seg.mul_(torch.rand(seg.shape, generator=gen, device=y.device) >= v.a)
    else:
        _structured(y, v.sub, gen, mean, sd)
    return y.to(x.dtype) if x.dtype != torch.float32 else y


def _structured(y: torch.Tensor, sub: str, gen: torch.Generator, mean: float, sd: float) -> None:
    """In place: ``sorted`` (monotone along the last axis), ``repeated_rows`` (every row the first),
    ``blocks`` (piecewise constant in blocks of 16 along the last axis) or ``ramp``; small noise on all
    (no two elements equal: no ties for an argmax to break differently)."""
    if y.dim() == 0:
        return
    last = y.shape[-1]
    rows = y.view(-1, last)
    if sub == "sorted" and y.numel() > SORT_MAX:
        sub = "ramp"
    first = rows[0].clone()
    ramp = torch.linspace(-2.0, 2.0, last, device=y.device) * sd + mean
    step = max(1, CHUNK // max(last, 1))
    for lo in range(0, rows.shape[0], step):
        seg = rows[lo:lo + step]
        noise = torch.randn(seg.shape, generator=gen, device=y.device).mul_(0.01 * sd)
        if sub == "sorted":
            seg.copy_(torch.sort(seg, dim=-1).values + noise.abs().cumsum(-1) * 1e-3)
        elif sub == "repeated_rows" and rows.shape[0] > 1:
            seg.copy_(first.expand_as(seg) + noise)
        elif sub == "blocks":
            idx = (torch.arange(last, device=y.device) // 16) * 16
            seg.copy_(seg.index_select(-1, idx) + noise)
        else:
            seg.copy_(ramp.expand_as(seg) + noise)


# ------------------------------------------------------------------ single-element changes


@dataclass(frozen=True)
class Change:
    """A sensitivity trial's change: ``inputs[tensor].flat[index] += delta``; ``where`` says why there."""

    tensor: int
    index: int
    delta: float
    where: str = ""

    def scaled(self, factor: float) -> "Change":
        return Change(self.tensor, self.index, self.delta * factor, self.where)

    def describe(self, names: Sequence[str], shapes: Sequence[Sequence[int]]) -> str:
        tail = f" ({self.where})" if self.where else ""
        return f"{names[self.tensor]}{list(_unflat(self.index, shapes[self.tensor]))} += {self.delta:.3g}{tail}"


def _unflat(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    out = []
    for s in reversed(list(shape)):
        out.append(flat % s if s else 0)
        flat = flat // s if s else 0
    return tuple(reversed(out))


def choose_change(rng: random.Random, inputs: Sequence[torch.Tensor], eligible: Sequence[int]) -> Change | None:
    """A random element of a random eligible (floating, non-empty) input, anywhere in it, with a
    change of 4 standard deviations of that input (a new outlier), random sign."""
    cands = [i for i in eligible if inputs[i].dtype.is_floating_point and inputs[i].numel()]
    if not cands:
        return None
    t = rng.choice(cands)
    index = rng.randrange(inputs[t].numel())
    _, sd = _stats(inputs[t])
    return Change(t, index, rng.choice((-1.0, 1.0)) * 4.0 * sd)


def apply_change(inputs: Sequence[torch.Tensor], c: Change) -> None:
    """In place, on the tensor's device (a single-element write)."""
    flat = inputs[c.tensor].view(-1)
    flat[c.index] = flat[c.index] + c.delta


def edge_changes(rng: random.Random, inputs: Sequence[torch.Tensor], eligible: Sequence[int],
                 max_axes: int = 3, far: bool = True) -> list[Change]:
    """Changes where a shortcut would not look: the start of each axis of one floating input (up to
    ``max_axes``, the longest first: the first step of a sequence, the start of a scan) and the far
    end of one (the last element a reduction reaches), other coordinates random; 4 standard
    deviations, random sign, grown by the caller until the reference moves (a recurrence that
    contracts what it carries forgets an ordinary change). One element each: a change of a whole
    step would scale up the rounding of every sum it enters, which no tolerance allows for."""
    cands = [i for i in eligible if inputs[i].dtype.is_floating_point and inputs[i].numel() > 1]
    if not cands:
        return []
    t = rng.choice(cands)
    shape = tuple(inputs[t].shape)
    axes = sorted((a for a in range(len(shape)) if shape[a] >= 4), key=lambda a: (-shape[a], a))[:max_axes]
    if not axes:
        return []
    _, sd = _stats(inputs[t])
    ends = [(a, 0, f"the start of axis {a}") for a in axes]
    if far:
        last = rng.choice(axes)
        ends.append((last, shape[last] - 1, f"the far end of axis {last}"))
    out = []
    for axis, pos, where in ends:
        coord = [rng.randrange(n) if n else 0 for n in shape]
        coord[axis] = pos
        flat = 0
        for c, n in zip(coord, shape):
            flat = flat * n + c
        out.append(Change(t, flat, rng.choice((-1.0, 1.0)) * 4.0 * sd, where))
    return out


def swap_elements(t: torch.Tensor, rng: random.Random, pairs: int = 2) -> None:
    """Exchange the values of ``pairs`` random pairs of elements in place: the contents change
    while every value stays one the distribution produced (indices stay in range)."""
    n = t.numel()
    if n < 2:
        return
    idx = [rng.randrange(n) for _ in range(2 * pairs)]
    a = torch.tensor(idx[0::2], device=t.device)
    b = torch.tensor(idx[1::2], device=t.device)
    flat = t.view(-1)
    va, vb = flat[a].clone(), flat[b].clone()
    flat[a] = vb
    flat[b] = va


def tie_inputs(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``x`` (a floating input) with every value one of five small integers (-2 .. 2, exact in every
    dtype): ties everywhere, in every row, for an argmax, a sort or a top-k to break by its rule. A
    new tensor; other inputs are returned as they are."""
    if not x.dtype.is_floating_point or x.numel() == 0:
        return x
    return torch.randint(-2, 3, tuple(x.shape), generator=gen, device=x.device).to(x.dtype)


__all__ = ["KINDS", "fresh_seed", "Secret", "Variation", "choose_variations", "vary", "Change", "choose_change",
           "apply_change", "edge_changes", "swap_elements", "tie_inputs"]
