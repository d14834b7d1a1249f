"""State a reference keeps in plain tensor attributes, as explicit program inputs and outputs.

Some references keep state between calls in a tensor held as a plain attribute (not a parameter
or buffer) that ``forward`` reassigns (``self.hidden = tanh(...)``) or changes in place
(``self.hidden.copy_(h0)``); ``torch.export`` refuses the latter and silently bakes the former
in as a constant. :func:`~stitchcuda.frontend.capture` finds such attributes
(:func:`plain_tensor_attributes`, before and after a trial export) and, when asked to lift them
(``state="lift"``), exports ``forward`` with each attribute's value before the call as an extra
input and its value after the call as an extra output: a program computes one call of the
reference given the state, and hands the next state back (:class:`StateIO` says which input and
output hold which attribute). The model's attributes are restored afterwards, whatever
``forward`` assigned.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch
from torch import nn


@dataclass(frozen=True)
class StateIO:
    """One lifted attribute: ``attribute`` (path from the model, ``"hidden"``, ``"cell.h"``), the
    graph input holding its value before the call and the graph output holding it after, and
    where the reference changes it."""

    attribute: str
    input: str
    output: str
    where: str = ""


Attr = tuple[nn.Module, str, str]  # (owner module, owner's path, attribute name)


def plain_tensor_attributes(model: nn.Module) -> dict[Attr, Any]:
    """Tensors held as plain attributes (not parameters or buffers), by (module, path, key)."""
    found = {}
    for path, module in model.named_modules():
        for key, value in vars(module).items():
            if isinstance(value, torch.Tensor):
                found[(module, path, key)] = value
    return found


def attribute_path(attr: Attr) -> str:
    return f"{attr[1]}.{attr[2]}" if attr[1] else attr[2]


def restore_attributes(before: Mapping[Attr, Any]) -> list[str]:
    """Put back every plain tensor attribute forward replaced; return their paths."""
    changed = []
    for (module, path, key), value in before.items():
        if vars(module).get(key) is not value:
            vars(module)[key] = value
            changed.append(f"{path}.{key}" if path else key)
    return changed


def find_attributes(model: nn.Module, names: Sequence[str]) -> list[Attr]:
    """The plain tensor attributes named by ``names`` (paths as export and the checks above
    spell them: ``hidden``, ``cell.h``, or a bare attribute name), in the order given."""
    attrs = plain_tensor_attributes(model)
    out: list[Attr] = []
    for name in names:
        hit = next((a for a in attrs if attribute_path(a) == name), None) or \
            next((a for a in attrs if a[2] == name.split(".")[-1]), None)
        if hit is not None and hit not in out:
            out.append(hit)
    return out


@contextlib.contextmanager
def lifted(model: nn.Module, attrs: Sequence[Attr], n_inputs: int) -> Iterator[None]:
    """Within the block ``model(*inputs, *state)`` sets each attribute in ``attrs`` to its state
    argument, runs the reference's forward on ``inputs`` and returns ``(*outputs, *new_state)``.
    The attributes and ``forward`` are put back on exit."""
    before = plain_tensor_attributes(model)
    original = model.forward

    def forward(*args: Any) -> tuple[Any, ...]:
        user, state = args[:n_inputs], args[n_inputs:]
        for (module, _, key), value in zip(attrs, state):
            vars(module)[key] = value
        out = original(*user)
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        return outs + tuple(vars(module)[key] for module, _, key in attrs)

    # A signature with one named parameter per argument, so export names the graph's inputs:
    # the reference's own names for its arguments, state_<attribute> for the state.
    try:
        own = [q.name for q in inspect.signature(original).parameters.values()
               if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        own = []
    names = own[:n_inputs] if len(own) >= n_inputs else [f"arg{i}" for i in range(n_inputs)]
    params = [inspect.Parameter(nm, inspect.Parameter.POSITIONAL_OR_KEYWORD) for nm in names]
    params += [inspect.Parameter(state_input_name(a), inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in attrs]
    forward.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    model.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        del model.forward
        restore_attributes(before)


def state_input_name(attr: Attr) -> str:
    return "state_" + re.sub(r"\W", "_", attribute_path(attr))


def changed_by_forward(model: nn.Module, inputs: Sequence[Any]) -> list[str]:
    """The plain tensor attributes one call of forward replaces or changes in place, found by
    running it on fake tensors (no data touched); the attributes are put back afterwards."""
    before = plain_tensor_attributes(model)
    versions = {a: v._version for a, v in before.items()}
    try:
        with torch.no_grad(), torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True):
            model(*inputs)
        after = plain_tensor_attributes(model)
        return [attribute_path(a) for a, v in before.items() if after.get(a) is not v or v._version != versions[a]]
    except Exception:  # noqa: BLE001 - a best effort: the attribute export refused is known anyway
        return []
    finally:
        restore_attributes(before)


def count_outputs(model: nn.Module, inputs: Sequence[Any]) -> int:
    """How many tensors forward returns (run on fake tensors: no data touched), the model's
    attributes put back afterwards."""
    before = plain_tensor_attributes(model)
    try:
        with torch.no_grad(), torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True):
            out = model(*inputs)
    finally:
        restore_attributes(before)
    return len(out) if isinstance(out, (tuple, list)) else 1


def describe(model: nn.Module, attrs: Sequence[Attr], graph: Any, n_outputs: int) -> tuple[StateIO, ...]:
    """The :class:`StateIO` of each lifted attribute of a graph exported under :func:`lifted`:
    its input is named after it, its output follows the reference's ``n_outputs`` outputs."""
    names = {s.name for s in graph.inputs}
    out = []
    for i, a in enumerate(attrs):
        nm = state_input_name(a)
        out.append(StateIO(attribute_path(a), nm if nm in names else graph.inputs[-len(attrs) + i].name,
                           graph.outputs[n_outputs + i],
                           attribute_location(model, attribute_path(a), "tensor attribute", mutation=True)))
    return tuple(out)


def attribute_location(model: nn.Module, path: str, kind: str, mutation: bool = False) -> str:
    """Where the reference uses ``model.<path>``: the first line of the owner's source that
    calls (or, for ``mutation``, assigns or mutates in place) ``self.<attr>``, preferring
    ``forward``; falls back to the bare module path when no source is available."""
    parts = path.split(".")
    owners = [model]
    for part in parts[:-1]:
        owners.append(getattr(owners[-1], part))
    label = f"model.{path} ({kind})"
    for depth in reversed(range(len(parts))):
        owner, attr = owners[depth], re.escape(parts[depth])
        if type(owner).__module__.startswith("torch."):
            continue  # containers such as nn.Sequential: look in the user's class above
        if mutation:
            patterns = [rf"self\.{attr}\s*=[^=]", rf"self\.{attr}\.\w+_\("]
        else:
            patterns = [rf"self\.{attr}\s*\(", rf"self\.{attr}\s*=[^=]"]
        for scope in (getattr(type(owner), "forward", None), type(owner)):
            try:
                lines, start = inspect.getsourcelines(scope)
                filename = inspect.getsourcefile(scope) or "?"
            except (OSError, TypeError):
                continue
            for i, text in enumerate(lines):
                if any(re.search(pattern, text) for pattern in patterns):
                    short = filename if filename.startswith("<") else Path(filename).name
                    return f"{label}, {short} line {start + i}: {text.strip()}"
    return label


__all__ = ["StateIO", "plain_tensor_attributes", "restore_attributes", "find_attributes", "lifted",
           "state_input_name", "attribute_location", "attribute_path", "changed_by_forward", "count_outputs",
           "describe"]
