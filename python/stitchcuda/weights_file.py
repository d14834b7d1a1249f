"""The weights file of a program folder: safetensors, read and written without the package.

Layout: an 8-byte little-endian header length N, N bytes of JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then the data.
Every problem raises :class:`WeightsFileError`, whose message names the file and the problem.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from . import dtypes as _dtypes
from .errors import ArgumentError
from .fsutil import atomic_write_bytes

#: safetensors dtype codes of the dtypes a program may hold.
SAFETENSORS_DTYPES = _dtypes.FROM_SAFETENSORS


class WeightsFileError(ArgumentError):
    """A weights file that cannot be used; the message names the file and the problem."""

    def __init__(self, file: str | Path, problem: str):
        self.file = str(file)
        self.problem = problem
        super().__init__(f"{self.file}: {problem}")


@dataclass(frozen=True)
class StoredTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offsets: tuple[int, int]


def read_safetensors_header(path: str | Path) -> dict[str, StoredTensor]:
    """Parse a safetensors header (no data is read) and check its offsets against the file.

    Layout: 8-byte little-endian header length N, N bytes of JSON
    ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, data.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise WeightsFileError(path, "not a safetensors file (shorter than its 8-byte header length)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100 * 1024 * 1024:
                raise WeightsFileError(path, f"not a safetensors file (header length {n} exceeds the file)")
            raw = f.read(n)
    except FileNotFoundError:
        raise WeightsFileError(path, "file not found") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightsFileError(path, f"corrupt safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise WeightsFileError(path, "corrupt safetensors header (not a JSON object)")
    data_size = size - 8 - n
    out: dict[str, StoredTensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            code, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise WeightsFileError(path, f"tensor {name!r}: header entry lacks dtype, shape or data_offsets") from None
        if code not in SAFETENSORS_DTYPES:
            raise WeightsFileError(path, f"tensor {name!r}: dtype {code!r} is not one stitchcuda supports")
        dtype = SAFETENSORS_DTYPES[code]
        if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
            raise WeightsFileError(path, f"tensor {name!r}: bad shape {_show(shape)}")
        want = math.prod(shape) * _dtypes.ABI_SIZES[dtype]
        if not (0 <= begin <= end <= data_size) or end - begin != want:
            raise WeightsFileError(path, f"tensor {name!r}: data_offsets [{begin}, {end}] do not hold "
                                      f"{want} bytes inside the {data_size}-byte data section")
        out[name] = StoredTensor(name, dtype, tuple(shape), (begin, end))
    return out


def write_safetensors(path: str | Path, tensors: Mapping[str, tuple[str, tuple[int, ...], bytes]]) -> Path:
    """Write ``{name: (dtype, shape, raw little-endian bytes)}`` as safetensors (atomically).

    Dependency-free, for tests and for stages that hold raw buffers; the frontend may use the
    safetensors package instead; the format is the same.
    """
    codes = {v: k for k, v in SAFETENSORS_DTYPES.items()}
    header: dict[str, Any] = {}
    blobs, offset = [], 0
    for name, (dtype, shape, data) in tensors.items():
        want = math.prod(shape) * _dtypes.ABI_SIZES[dtype]
        if len(data) != want:
            raise ValueError(f"{name}: {len(data)} bytes for {dtype}{list(shape)} (want {want})")
        header[name] = {"dtype": codes[dtype], "shape": list(shape), "data_offsets": [offset, offset + want]}
        blobs.append(data)
        offset += want
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return atomic_write_bytes(path, struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def _show(v: Any) -> str:
    s = json.dumps(v)
    return s if len(s) <= 60 else s[:57] + "..."
