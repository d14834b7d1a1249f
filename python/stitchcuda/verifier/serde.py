"""The Verifier's JSON: the project's one codec (:mod:`stitchcuda.serial`), under its old name."""

from ..serial import from_jsonable, to_jsonable

__all__ = ["to_jsonable", "from_jsonable"]
