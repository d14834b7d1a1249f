"""The reference's parameters, drawn away from their initial values; and references that prove nothing.

A model's initial parameters are often trivial: a norm's ones and zeros, a zero bias, a head
initialised to zeros. A program that skips such a parameter (adds no bias, scales by one) is right on
them and wrong on any trained model, so the Verifier never judges at the initial values: every
floating parameter and buffer is drawn away from its own (:func:`vary_parameters`), and the same
values go to the reference and to the program. What keeps its meaning is left alone: integer and
boolean tensors, and floating buffers whose every value is an integer (a causal mask, an index
table); a tensor of one sign keeps its sign (a variance, a scale under a logarithm).

A reference whose outputs do not depend on its inputs (:func:`independent_of_inputs`) passes any
program that returns its constant answer: a pass on it proves nothing. Two causes are common in
models built from a config with random weights, and each has its remedy:

* activations that vanish through the layers: an eval-mode batch norm keeps its initial statistics
  (mean 0, variance 1) while the convolutions before it are drawn at 0.02, so after fifty layers
  every activation is below float32's range and the output is the biases' alone.
  :func:`calibrate_norms` measures each such norm's statistics on drawn inputs, as training would
  have; the parameters stay as they are;
* a layer initialised to zeros (a head, a norm's scale drawn at 0.02): :func:`redraw_parameters`
  replaces every floating parameter by fresh values of the layer's scale, a norm's scale around one.

Where neither helps (outputs that are identically constant), the verdict says the pass is
degenerate.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch


def _tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor, bool]]:
    """(name, tensor, is a parameter) of every parameter and buffer, each storage once."""
    out, seen = [], set()
    for name, t in model.named_parameters(remove_duplicate=False):
        if t.data_ptr() not in seen or t.numel() == 0:
            seen.add(t.data_ptr())
            out.append((name, t, True))
    for name, t in model.named_buffers(remove_duplicate=False):
        if t.data_ptr() not in seen or t.numel() == 0:
            seen.add(t.data_ptr())
            out.append((name, t, False))
    return out


def structural(t: torch.Tensor) -> bool:
    """A buffer whose values mean something as they are: not floating, or every value an integer."""
    if not t.is_floating_point():
        return True
    finite = torch.isfinite(t)
    return bool((~finite | (t == torch.round(t))).all().item())


def vary_parameters(model: torch.nn.Module, seed: int) -> list[str]:
    """Every floating parameter and non-structural floating buffer of ``model`` drawn away from its
    value, in place (module docstring); returns what was left alone, for the notes.

    A tensor with spread: ``a * t + N(0, (std / 4)^2)``, ``a`` in [0.75, 1.25]; a constant one (a norm's
    ones, a zero bias): ``c * exp(N(0, 1/16))`` around a non-zero ``c``, ``N(0, 0.1^2)`` around zero; a
    tensor of one sign keeps it (the multiplicative form, ``t * exp(N(0, 1/16))``)."""
    kept = []
    for name, t, is_param in _tensors(model):
        if t.numel() == 0:
            continue
        if not is_param and structural(t):
            if t.is_floating_point():
                kept.append(name)
            continue
        if not t.is_floating_point():
            continue
        gen = torch.Generator(device=t.device).manual_seed((seed * 1_000_003 + _stable_hash(name)) % (1 << 62))
        with torch.no_grad():
            x = t.detach().double()
            noise = torch.randn(t.shape, generator=gen, device=t.device, dtype=torch.float64)
            std = float(x.std().item()) if x.numel() > 1 else 0.0
            lo, hi = float(x.min().item()), float(x.max().item())
            if not (math.isfinite(lo) and math.isfinite(hi)):
                continue
            if std == 0.0 and lo == 0.0:
                new = noise * 0.1
            elif lo >= 0.0 or hi <= 0.0:
                new = x * torch.exp(noise * 0.25)
                if std == 0.0:  # a constant: its own value, spread
                    new = x.abs().clamp_min(1e-30) * torch.exp(noise * 0.25) * (1.0 if hi > 0.0 else -1.0)
            else:
                a = 0.75 + 0.5 * float(torch.rand((), generator=gen, device=t.device).item())
                new = a * x + noise * (std / 4)
            t.copy_(new.to(t.dtype))
    return kept


def is_norm(module: torch.nn.Module) -> bool:
    """A normalisation layer (PyTorch's batch / instance / layer / group / RMS norms, or any module
    whose class is named for one, as Hugging Face's ``LlamaRMSNorm``): its ``weight`` is a scale
    around one, its ``bias`` a shift around zero."""
    from torch.nn.modules.batchnorm import _NormBase

    named = "norm" in type(module).__name__.lower()
    return named or isinstance(module, (_NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm))


def redraw_parameters(model: torch.nn.Module, seed: int) -> None:
    """Every floating parameter replaced by values of its layer's scale, whatever its initialisation
    (zeros included), in place; buffers are left as they are. A norm's scale is drawn as
    ``exp(N(0, 1/16))`` (around one, positive), its shift as ``N(0, 0.1^2)``; every other parameter as
    ``N(0, 1 / fan_in)``."""
    scales, shifts = set(), set()
    for module in model.modules():
        if is_norm(module):
            for attr, into in (("weight", scales), ("bias", shifts)):
                t = getattr(module, attr, None)
                if isinstance(t, torch.Tensor):
                    into.add(t.data_ptr())
    for name, t, is_param in _tensors(model):
        if not is_param or not t.is_floating_point() or t.numel() == 0:
            continue
        gen = torch.Generator(device=t.device).manual_seed((seed * 7_000_003 + _stable_hash(name)) % (1 << 62))
        noise = torch.randn(t.shape, generator=gen, device=t.device)
        if t.data_ptr() in scales:
            new = torch.exp(noise * 0.25)
        elif t.data_ptr() in shifts:
            new = noise * 0.1
        else:
            fan_in = t.numel() // t.shape[0] if t.dim() > 1 else t.numel()
            new = noise / math.sqrt(max(fan_in, 1))
        with torch.no_grad():
            t.copy_(new.to(t.dtype))


def calibrate_norms(model: torch.nn.Module, run: Callable[[], Any], passes: int = 2) -> int:
    """Every eval-mode batch norm that keeps running statistics gets them measured: reset, then
    averaged over ``passes`` calls of ``run`` (a forward on drawn inputs) with those norms in
    training mode, as training would have left them; the norms are back in eval mode after, with
    their momentum. Returns how many norms were calibrated (0: none, ``run`` not called). Norms in
    training mode are left alone: they use their batch's statistics anyway."""
    from torch.nn.modules.batchnorm import _BatchNorm

    norms = [m for m in model.modules() if isinstance(m, _BatchNorm) and not m.training
             and m.track_running_stats and m.running_mean is not None]
    if not norms:
        return 0
    momenta = [m.momentum for m in norms]
    try:
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the passes
            m.train()
        for _ in range(passes):
            run()
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
            m.eval()
    return len(norms)


def _stable_hash(name: str) -> int:
    h = 1469598103934665603
    for c in name.encode():
        h = ((h ^ c) * 1099511628211) % (1 << 64)
    return h


def independent_of_inputs(outputs: Sequence[Sequence[Any]], tol: float,
                          close: Callable[[Any, Any, float], bool]) -> str:
    """Why the reference's outputs for several sets of inputs (``outputs[k]``: the outputs of set
    ``k``) prove nothing, or "": every floating output of every set within ``tol`` of the first set's
    (``close(a, b, tol)``), so the first set's outputs, returned as a constant, would pass them all."""
    if len(outputs) < 2:
        return ""
    floats = [i for i, o in enumerate(outputs[0]) if getattr(o, "is_floating_point", lambda: False)()]
    if not floats:
        return ""
    for later in outputs[1:]:
        for i in floats:
            if not close(later[i], outputs[0][i], tol):
                return ""
    return (f"the reference's outputs for {len(outputs)} different sets of inputs are all within tolerance of each "
            "other: a constant answer passes")


__all__ = ["vary_parameters", "redraw_parameters", "calibrate_norms", "is_norm", "structural", "independent_of_inputs"]
