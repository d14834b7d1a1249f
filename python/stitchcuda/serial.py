"""JSON for the project's frozen dataclasses, both ways: the one codec every stage uses.

``to_jsonable`` turns a dataclass tree into plain JSON values: tuples become lists, non-finite
floats become the strings ``"nan"``, ``"inf"``, ``"-inf"`` (so the output is strict JSON), and a
class that declares a tag (``JSON_TAG = ("kind", "gemm")``, or the Verifier's ``VERDICT``) writes
it. ``from_jsonable(cls, data)`` rebuilds the tree from the type hints, choosing among the members
of a union by their tags, so a plan, a report or a job written by one process is read back by
another exactly.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing
from typing import Any, Union

_VERDICT = "verdict"


def _tag(cls: Any) -> tuple[str, str] | None:
    tag = getattr(cls, "JSON_TAG", None)
    if tag:
        return tag
    v = getattr(cls, "VERDICT", None)
    return (_VERDICT, v) if v else None


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        tag = _tag(type(obj))
        if tag:
            out[tag[0]] = tag[1]
        for f in dataclasses.fields(obj):
            out[f.name] = to_jsonable(getattr(obj, f.name))
        return out
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if hasattr(obj, "__fspath__"):
        return str(obj)
    return obj


def from_jsonable(tp: Any, data: Any) -> Any:
    """Rebuild a value of type ``tp`` (a dataclass, container or union of them) from JSON data."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return data
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        if isinstance(data, dict):
            for a in args:
                tag = _tag(a)
                if tag and data.get(tag[0]) == tag[1]:
                    return from_jsonable(a, data)
        for a in args:
            if a is type(None):
                continue
            try:
                return from_jsonable(a, data)
            except (TypeError, ValueError, KeyError):
                continue
        raise ValueError(f"cannot read {data!r} as {tp}")
    if origin is typing.Literal:
        if data not in args:
            raise ValueError(f"{data!r} is not one of {args}")
        return data
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_jsonable(args[0], v) for v in data)
        return tuple(from_jsonable(a, v) for a, v in zip(args, data))
    if origin is list:
        return [from_jsonable(args[0], v) for v in data]
    if origin is dict:
        return {k: from_jsonable(args[1], v) for k, v in data.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise TypeError(f"expected an object for {tp.__name__}, got {type(data).__name__}")
        tag = _tag(tp)
        if tag and data.get(tag[0], tag[1]) != tag[1]:
            raise ValueError(f"{data.get(tag[0])!r} is not a {tag[1]}")
        hints = typing.get_type_hints(tp, vars(sys.modules[tp.__module__]))
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in data:
                kwargs[f.name] = from_jsonable(hints[f.name], data[f.name])
        return tp(**kwargs)
    if tp is float:
        if isinstance(data, str):
            return float(data)
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise TypeError(f"expected a number, got {data!r}")
        return float(data)
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise TypeError(f"expected an integer, got {data!r}")
        return data
    if tp is str:
        if not isinstance(data, str):
            raise TypeError(f"expected a string, got {data!r}")
        return data
    if tp is bool:
        if not isinstance(data, bool):
            raise TypeError(f"expected a boolean, got {data!r}")
        return data
    if tp is type(None):
        if data is not None:
            raise TypeError(f"expected null, got {data!r}")
        return None
    return data


__all__ = ["to_jsonable", "from_jsonable"]
