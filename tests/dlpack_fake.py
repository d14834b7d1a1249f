"""A DLPack capsule over an arbitrary pointer, for tests of what the runtime refuses
(misaligned or bogus pointers that no framework would hand out)."""

from __future__ import annotations

import ctypes

_DTYPES = {"float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16), "float64": (2, 64), "int32": (0, 32)}
_DEVICES = {"cpu": 1, "cuda": 2}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_keep = []  # the structs must outlive the capsule; tests are short-lived, so keep them all

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def fake_dlpack(ptr: int, shape, dtype: str = "float32", device=("cuda", 0), strides=None):
    """A 'dltensor' capsule describing `shape` elements of `dtype` at address `ptr`."""
    n = len(shape)
    shp = (ctypes.c_int64 * n)(*shape)
    if strides is None:
        acc, st = 1, []
        for d in reversed(shape):
            st.append(acc)
            acc *= d
        strides = list(reversed(st))
    strd = (ctypes.c_int64 * n)(*strides)
    code, bits = _DTYPES[dtype]
    m = _DLManagedTensor()
    m.dl_tensor = _DLTensor(ptr, _DLDevice(_DEVICES[device[0]], device[1]), n, _DLDataType(code, bits, 1), shp, strd, 0)
    m.manager_ctx = None
    m.deleter = None
    _keep.append((m, shp, strd))
    return _new_capsule(ctypes.addressof(m), b"dltensor", None)
