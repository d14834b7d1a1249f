"""One dtype table: size, C type, runtime enum, safetensors code, and whether it crosses the ABI.

Names are PyTorch's without ``torch.`` (``"float32"``, ``"bool"``). The IR knows every dtype
below; the program ABI (``st_dtype`` in ``stitchrt.h``, checked by a test) and the weights file
carry those with ``abi`` set; generated code has a C type for those with ``ctype``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str
    size: int
    floating: bool
    ctype: str = ""          #: C++ type in generated code ("" where programs cannot hold it)
    st_enum: str = ""        #: the runtime's st_dtype name ("" where the ABI has none)
    st_value: int = -1
    safetensors: str = ""    #: safetensors' dtype code

    @property
    def abi(self) -> bool:
        """Whether a tensor of this dtype can cross the program ABI."""
        return bool(self.st_enum)


_TABLE = (
    DType("float32", 4, True, "float", "ST_FLOAT32", 0, "F32"),
    DType("float16", 2, True, "__half", "ST_FLOAT16", 1, "F16"),
    DType("bfloat16", 2, True, "__nv_bfloat16", "ST_BFLOAT16", 2, "BF16"),
    DType("float64", 8, True, "double", "ST_FLOAT64", 3, "F64"),
    DType("int32", 4, False, "int32_t", "ST_INT32", 4, "I32"),
    DType("int64", 8, False, "int64_t", "ST_INT64", 5, "I64"),
    DType("uint8", 1, False, "uint8_t", "ST_UINT8", 6, "U8"),
    DType("bool", 1, False, "bool", "ST_BOOL", 7, "BOOL"),
    DType("int8", 1, False, "int8_t", "ST_INT8", 8, "I8"),
    DType("int16", 2, False),
    DType("float8_e4m3fn", 1, True),
    DType("float8_e5m2", 1, True),
    DType("complex64", 8, True),
    DType("complex128", 16, True),
)

DTYPES: dict[str, DType] = {d.name: d for d in _TABLE}
#: Bytes per element of every dtype the IR knows.
SIZES: dict[str, int] = {d.name: d.size for d in _TABLE}
#: The dtypes that cross the program ABI (and the weights file), with their sizes.
ABI_SIZES: dict[str, int] = {d.name: d.size for d in _TABLE if d.abi}
#: safetensors code -> dtype name, for the ABI dtypes.
FROM_SAFETENSORS: dict[str, str] = {d.safetensors: d.name for d in _TABLE if d.abi}
#: The floating dtypes programs compute in (fp32 math, this storage).
COMPUTE_FLOATS = ("float32", "float16", "bfloat16")


def get(name: str) -> DType:
    d = DTYPES.get(name)
    if d is None:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return d


def ctype(name: str) -> str:
    """The C++ type generated code uses for ``name``; ValueError where programs cannot hold it."""
    c = get(name).ctype
    if not c:
        raise ValueError(f"generated programs cannot hold {name} tensors")
    return c


def torch_dtype(name: str):
    """The PyTorch dtype of ``name`` (imports PyTorch)."""
    import torch

    get(name)
    return getattr(torch, name)


def st_enum(name: str) -> str:
    e = get(name).st_enum
    if not e:
        raise ValueError(f"{name} tensors cannot cross the program ABI")
    return e


__all__ = ["DType", "DTYPES", "SIZES", "ABI_SIZES", "FROM_SAFETENSORS", "COMPUTE_FLOATS", "get", "ctype", "st_enum",
           "torch_dtype"]
