"""stitchrt: run a stitchcuda program with the runtime alone (no PyTorch, no stitchcuda).

This file is the ``stitchrt`` package of the ``stitchcuda-runtime`` wheel that
``stitchcuda wheel`` writes, verbatim; it must import nothing from stitchcuda. It speaks the
program ABI (``runtime/include/stitchrt/program.h``) through ctypes, so one wheel serves every
Python 3 version::

    import stitchrt
    prog = stitchrt.load_program("site-packages/mymodel")   # a program wheel's package folder
    y = prog(x)       # x: NumPy (copied to the GPU and back), CuPy or PyTorch (zero-copy, DLPack)

Outputs are of the inputs' kind: NumPy in, NumPy out; CuPy or PyTorch in, CuPy or PyTorch
tensors out, on the inputs' device, written on that framework's current stream. Every input is
checked against the manifest (count, shape, dtype) with a message naming it; a program built over
dynamic dimensions (the manifest's ``dynamic`` block) takes every shape in its ranges, its outputs
shaped by the same block, and refuses others in one line naming the dimension. No GPU, a GPU of an
architecture the wheel was not built for, or a missing cuBLASLt each raise one clear error.
NumPy is imported only when a NumPy array or the weights need it.

A program keeps nothing between calls: where its reference keeps state in a tensor attribute
(an RNN's hidden state), the state before the call is one more input and the state after it one
more output (``manifest.json``'s ``state`` names them), and the caller carries it from call to
call: ``y, h = prog(x, h)``. That is also why loading can prepare a program: one call on zeros
(:meth:`PackagedProgram.prepare`, unless ``prepare=False``) makes its plans and loads its kernels, so
the caller's first call is as fast as a later one.

Its errors are :class:`RuntimeCallError` (a runtime call failed), :class:`NoCudaDeviceError` (no
usable GPU) and :class:`ProgramError` (a call that does not match the manifest). The last is
also ``stitchcuda.program``'s (one definition, imported there); the first two are this package's
counterparts of the binding's ``RuntimeCallError`` and ``NoCudaDeviceError``, named apart because a wheel
user may have both installed.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import mmap
import os
import struct
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIBRARY = HERE / "lib" / "libstitchrt.so"
ABI_VERSION = 1
_MAX_DIMS = 8
_NO_DEVICE = 4


class RuntimeCallError(RuntimeError):
    """A runtime call failed; the message is the runtime's (it names the call site)."""


class NoCudaDeviceError(RuntimeCallError):
    """No usable CUDA device (no GPU, no driver, or CUDA_VISIBLE_DEVICES hides them)."""


class ProgramError(ValueError):
    """A call that does not match the program's manifest; the message says which tensor and why."""


# dtype name -> (st_dtype, element bytes, NumPy name or None, DLPack (code, bits))
DTYPES = {
    "float32": (0, 4, "float32", (2, 32)), "float16": (1, 2, "float16", (2, 16)),
    "bfloat16": (2, 2, None, (4, 16)), "float64": (3, 8, "float64", (2, 64)),
    "int32": (4, 4, "int32", (0, 32)), "int64": (5, 8, "int64", (0, 64)),
    "uint8": (6, 1, "uint8", (1, 8)), "bool": (7, 1, "bool", (6, 8)), "int8": (8, 1, "int8", (0, 8)),
}
_FROM_DLPACK = {v[3]: k for k, v in DTYPES.items()}
_SAFETENSORS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I32": "int32",
                "I64": "int64", "U8": "uint8", "BOOL": "bool", "I8": "int8"}


class StTensor(ctypes.Structure):
    """``st_tensor`` of program.h."""

    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * _MAX_DIMS), ("strides", ctypes.c_int64 * _MAX_DIMS),
                ("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_KDL_CPU, _KDL_CUDA = 1, 2


# ---------------------------------------------------------------------- the runtime library

_RT = None


def _preload_nvidia() -> None:
    """cuBLASLt and cuDNN from NVIDIA's wheels (``nvidia-cublas``, ``nvidia-cudnn-cu13``), wherever
    those are installed: the runtime links both."""
    try:
        import nvidia
    except ImportError:
        return
    for rel in ("cu13/lib/libcublasLt.so.13", "cudnn/lib/libcudnn.so.9"):
        for base in nvidia.__path__:
            lib = Path(base) / rel
            if lib.is_file():
                try:
                    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
                    break
                except OSError:
                    continue


def runtime() -> ctypes.CDLL:
    """libstitchrt, loaded once with global symbols so every program binds to this copy."""
    global _RT
    if _RT is not None:
        return _RT
    _preload_nvidia()
    try:
        lib = ctypes.CDLL(str(LIBRARY), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        hint = "pip install 'nvidia-cublas>=13,<14'" if "cublas" in str(e) else \
            "pip install 'nvidia-cudnn-cu13>=9,<10'" if "cudnn" in str(e) else "reinstall stitchcuda-runtime"
        raise RuntimeCallError(f"cannot load the stitchcuda runtime {LIBRARY} ({e}); {hint}") from None
    lib.st_last_error.restype = ctypes.c_char_p
    lib.st_status_name.restype = ctypes.c_char_p
    for fn in ("st_device_alloc", "st_device_free", "st_copy_h2d", "st_copy_d2h", "st_memset", "st_stream_synchronize"):
        getattr(lib, fn).restype = ctypes.c_int
    lib.st_device_alloc.argtypes = [ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.st_device_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.st_copy_h2d.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.st_copy_d2h.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.st_memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
    lib.st_stream_synchronize.argtypes = [ctypes.c_void_p]
    _RT = lib
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        rt = runtime()
        msg = (rt.st_last_error() or b"").decode(errors="replace")
        raise (NoCudaDeviceError if status == _NO_DEVICE else RuntimeCallError)(f"{what}: {msg or rt.st_status_name(status)}")


def device_count() -> int:
    """CUDA devices usable here (0 without a GPU or a driver)."""
    n = ctypes.c_int(0)
    status = runtime().st_device_count(ctypes.byref(n))
    if status == _NO_DEVICE:
        return 0
    _check(status, "st_device_count")
    return n.value


def device_arch(device: int) -> str:
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    sms, l2, mem = ctypes.c_int(0), ctypes.c_size_t(0), ctypes.c_size_t(0)
    _check(runtime().st_device_info(device, ctypes.byref(major), ctypes.byref(minor), ctypes.byref(sms),
                                    ctypes.byref(l2), ctypes.byref(mem)), "st_device_info")
    return f"sm_{major.value}{minor.value}"


# ---------------------------------------------------------------------- tuning files
# The runtime's choices by measurement carried between processes (stitchrt/tuning.h): the file's
# format lives here, where a wheel's loader reads it without stitchcuda; stitchcuda.tuning writes it.

TUNING_FILE = "tuning.txt"
TUNING_HEAD = "# stitchcuda tuning file (stitchrt/tuning.h): the runtime's choices by measurement"
TUNING_IDENTITY = "# identity: "


def _text_of(fn, what: str) -> str:
    n = ctypes.c_size_t(0)
    _check(fn(None, ctypes.c_size_t(0), ctypes.byref(n)), what)
    buf = ctypes.create_string_buffer(n.value + 1)
    _check(fn(buf, ctypes.c_size_t(n.value + 1), ctypes.byref(n)), what)
    return buf.value.decode("utf-8", "replace")


def identity_line(device_part: str, library: Path = LIBRARY) -> str:
    """Where a tuning file's choices hold: the runtime's ``st_tuning_identity`` (device, cuBLASLt, cuDNN,
    workspace) and this build of the runtime (its library's hash)."""
    return f"{device_part}; runtime rt{hashlib.sha256(Path(library).read_bytes()).hexdigest()[:12]}"


def tuning_identity() -> str:
    return identity_line(_text_of(runtime().st_tuning_identity, "st_tuning_identity"))


def parse_tuning(text: str, ident: str) -> tuple[str, str]:
    """(the choice lines to import, "") when ``text`` is a tuning file made where ``ident`` holds, else
    ("", why not)."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != TUNING_HEAD:
        return "", "not a stitchcuda tuning file"
    theirs = next((ln[len(TUNING_IDENTITY):].strip() for ln in lines[1:] if ln.startswith(TUNING_IDENTITY)), None)
    if theirs is None:
        return "", "the tuning file says nothing of where it was made"
    if theirs != ident:
        return "", f"the tuning file was made on another machine or runtime ({theirs}; here: {ident})"
    return "".join(ln + "\n" for ln in lines[1:] if ln.strip() and not ln.startswith("#")), ""


def take_tuning(folder: Path, identity, take) -> tuple[int, str]:
    """``take(choices)`` (an import into the runtime; returns how many) of ``folder``'s tuning file when
    it was made where ``identity()`` holds: (choices taken, why none were, or ""). Never raises: a
    tuning file is an optimisation, not a reason for a program to fail."""
    path = Path(folder) / TUNING_FILE
    if not path.is_file():
        return 0, ""
    try:
        choices, why = parse_tuning(path.read_text(encoding="utf-8", errors="replace"), identity())
        if why:
            return 0, f"{path}: {why}: ignored, each new shape is timed"
        return int(take(choices)), ""
    except Exception as e:  # noqa: BLE001
        return 0, f"{path}: not read ({type(e).__name__}: {e})"


def import_tuning(folder: Path) -> tuple[int, str]:
    """``folder``'s tuning file into the runtime, through ctypes (a wheel's loader)."""
    def take(choices: str) -> int:
        taken = ctypes.c_size_t(0)
        _check(runtime().st_tuning_import(choices.encode(), ctypes.byref(taken)), "st_tuning_import")
        return taken.value

    return take_tuning(folder, tuning_identity, take)


# ---------------------------------------------------------------------- weights


def read_weights(path: Path, specs: list[dict]) -> tuple[object, list[tuple[int, dict]]]:
    """Map a safetensors file and find each weight of the manifest in it: (the mapping, [(offset
    into the mapping, spec)]). Raw bytes suffice (bfloat16 needs no NumPy type)."""
    f = open(path, "rb")
    data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if os.path.getsize(path) else b""
    f.close()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(bytes(data[8:8 + n]))
    found = []
    for spec in specs:
        entry = header.get(spec["name"])
        if entry is None or _SAFETENSORS.get(entry["dtype"]) != spec["dtype"] or entry["shape"] != spec["shape"]:
            raise ProgramError(f"{path}: weight {spec['name']!r} is missing or differs from the manifest")
        found.append((8 + n + entry["data_offsets"][0], spec))
    return data, found


def _descriptor(ptr: int, dtype: str, shape, strides=None, device: int = 0, host: bool = False) -> StTensor:
    t = StTensor()
    t.data, t.dtype, t.ndim = ptr, DTYPES[dtype][0], len(shape)
    t.device_type, t.device_id = (1 if host else 2), device
    stride = 1
    dense = []
    for d in reversed(list(shape)):
        dense.insert(0, stride)
        stride *= int(d)
    for i, d in enumerate(shape):
        t.shape[i] = int(d)
        t.strides[i] = int(strides[i]) if strides is not None else dense[i]
    return t


# ---------------------------------------------------------------------- DLPack


def dlpack_view(x) -> tuple[object, dict]:
    """(capsule, {data, device_type, device_id, dtype, shape, strides}) of a DLPack producer.

    The capsule is not consumed: it is kept alive while the pointer is used and its own
    destructor releases the producer's tensor afterwards."""
    capsule = x.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    dl = _DLTensor.from_address(get(capsule, b"dltensor"))
    shape = [dl.shape[i] for i in range(dl.ndim)]
    strides = [dl.strides[i] for i in range(dl.ndim)] if dl.strides else None
    dtype = _FROM_DLPACK.get((dl.dtype.code, dl.dtype.bits))
    return capsule, {"data": (dl.data or 0) + dl.byte_offset, "device_type": dl.device.device_type,
                     "device_id": dl.device.device_id, "dtype": dtype, "shape": shape, "strides": strides}


def _framework(x) -> str:
    top = type(x).__module__.split(".")[0]
    return top if top in ("torch", "cupy", "numpy") else "other"


# ---------------------------------------------------------------------- dynamic dimensions


def dim_value(expr, values) -> int:
    """One dimension of a dynamic program's shape (the manifest's ``dynamic`` block) at the sizes
    ``values``: an integer, or an expression of the sizes with integers, ``+ - * /`` and parentheses
    (``4*batch*seq + 2``), evaluated exactly; ``/`` must divide (the program's guards make it so)."""
    if isinstance(expr, int):
        return expr
    import ast
    from fractions import Fraction

    def ev(n) -> Fraction:
        if isinstance(n, ast.Constant) and isinstance(n.value, int) and not isinstance(n.value, bool):
            return Fraction(n.value)
        if isinstance(n, ast.Name) and n.id in values:
            return Fraction(values[n.id])
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            a, b = ev(n.left), ev(n.right)
            return a / b if isinstance(n.op, ast.Div) else a + b if isinstance(n.op, ast.Add) else \
                a - b if isinstance(n.op, ast.Sub) else a * b
        raise ValueError(f"not a dimension expression: {expr!r}")

    v = ev(ast.parse(str(expr), mode="eval").body)
    if v.denominator != 1:
        raise ValueError(f"{expr} is not a whole number at " + ", ".join(f"{k}={x}" for k, x in values.items()))
    return int(v)


def dynamic_sizes(dims, names, shapes) -> dict:
    """The sizes of a dynamic program's dimensions (``dims``: the manifest's ``dynamic.dims``) read from
    the shapes of inputs named ``names``; ValueError of one line naming the input, the dimension and
    the size where a guard does not hold (its range, a multiple it needs, two inputs that disagree)."""
    at = {n: i for i, n in enumerate(names)}
    out = {}
    for d in dims:
        name, first = d["name"], None
        for inp, axis in d["places"]:
            shape = shapes[at[inp]]
            if axis >= len(shape):
                raise ValueError(f"input '{inp}' has {len(shape)} dimension(s); dimension {axis} is {name}")
            v = int(shape[axis])
            if first is not None and v != first[2]:
                raise ValueError(f"{name}: input '{first[0]}' dimension {first[1]} is {first[2]} but input '{inp}' "
                                 f"dimension {axis} is {v} (both are {name})")
            first = first or (inp, axis, v)
        inp, axis, v = first
        if not d["min"] <= v <= d["max"]:
            raise ValueError(f"input '{inp}' dimension {axis} ({name}) is {v}: this program serves {name} "
                             f"{d['min']}..{d['max']}")
        q = d.get("multiple_of", 1)
        if v % q:
            raise ValueError(f"input '{inp}' dimension {axis} ({name}) is {v}: this program needs {name} a multiple "
                             f"of {q}")
        out[name] = v
    return out


def dynamic_shapes(dynamic, names, shapes) -> tuple[list, list]:
    """A dynamic program's (input shapes, output shapes) for inputs of these shapes (``dynamic``: the
    manifest's block as JSON; ``names``: its inputs'); ValueError of one line where a guard fails."""
    values = dynamic_sizes(dynamic["dims"], names, shapes)
    return ([[dim_value(x, values) for x in sh] for sh in dynamic["inputs"]],
            [[dim_value(x, values) for x in sh] for sh in dynamic["outputs"]])


# ---------------------------------------------------------------------- the program


class PackagedProgram:
    """A program wheel's program on one device: ``prog(*inputs) -> output or tuple of outputs``."""

    def __init__(self, package: Path, *, device: int | None = None, prepare: bool = True):
        package = Path(package)
        self.manifest = json.loads((package / "manifest.json").read_text())
        self.name = self.manifest["name"]
        self.inputs, self.outputs = self.manifest["inputs"], self.manifest["outputs"]
        self.dynamic = self.manifest.get("dynamic")  # dimensions served over a range (their largest above)
        self._shapes: dict = {}
        if device_count() == 0:
            raise NoCudaDeviceError(f"{self.name}: no CUDA device here: the program runs on an NVIDIA GPU with a CUDA 13 "
                                "driver (R580 or newer); check nvidia-smi and CUDA_VISIBLE_DEVICES")
        cur = ctypes.c_int(0)
        _check(runtime().st_get_device(ctypes.byref(cur)), "st_get_device")
        self.device = cur.value if device is None else int(device)
        arch = device_arch(self.device)
        built = sorted(p.name for p in package.glob("sm_*") if (p / "program.so").is_file())
        if arch not in built:
            raise RuntimeCallError(f"{self.name}: built for {', '.join(built) or 'no architecture'}, this GPU is {arch}: "
                              f"make the wheel again with `stitchcuda wheel ... --arch {arch}`")
        # the choices timed where the wheel was made, before the first call (tuning files, above), judged
        # against the device the program runs on
        _check(runtime().st_set_device(self.device), "st_set_device")
        self.tuned, self.tuning_note = import_tuning(package)
        self.library = ctypes.CDLL(str(package / arch / "program.so"))
        lib = self.library
        lib.st_program_create.restype = lib.st_program_run.restype = ctypes.c_int
        lib.st_program_create.argtypes = [ctypes.POINTER(StTensor), ctypes.c_int32, ctypes.c_int32,
                                          ctypes.POINTER(ctypes.c_void_p)]
        lib.st_program_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(StTensor), ctypes.c_int32,
                                       ctypes.POINTER(StTensor), ctypes.c_int32, ctypes.c_void_p]
        lib.st_program_destroy.argtypes = [ctypes.c_void_p]
        if lib.st_program_abi_version() != ABI_VERSION:
            raise RuntimeCallError(f"{self.name}: program ABI {lib.st_program_abi_version()}, runtime {ABI_VERSION}")
        specs = self.manifest.get("weights", [])
        mapping, found = read_weights(package / "weights.safetensors", specs) if specs else (None, [])
        view = ctypes.c_char.from_buffer(mapping) if found else None  # a private, copy-on-write mapping
        base = ctypes.addressof(view) if found else 0
        ws = (StTensor * max(len(found), 1))(*[_descriptor(base + off, s["dtype"], s["shape"], host=True)
                                               for off, s in found])
        handle = ctypes.c_void_p()
        try:
            _check(lib.st_program_create(ws, len(found), self.device, ctypes.byref(handle)), f"{self.name}: create")
            _check(runtime().st_stream_synchronize(None), "st_stream_synchronize")  # weights copied: unmap them
        finally:
            del view, ws
            if mapping is not None:
                mapping.close()
        self._handle = handle
        self.prepared_ms = self.prepare() if prepare else None

    def prepare(self) -> float:
        """One call on zeros on the default stream, its outputs dropped (a program keeps nothing between
        calls): the plans of its GEMMs and convolutions made, from the tuning file where it has them, and
        the kernels loaded, so that the caller's first call costs what a later one does. Milliseconds."""
        rt = runtime()
        t0 = time.perf_counter()
        buffers, descs = [], []
        try:
            for s in [*self.inputs, *self.outputs]:
                nbytes = max(DTYPES[s["dtype"]][1] * math.prod(s["shape"]), 1)
                p = ctypes.c_void_p()
                _check(rt.st_device_alloc(nbytes, None, ctypes.byref(p)), "st_device_alloc")
                buffers.append(p.value)
                _check(rt.st_memset(p.value, 0, nbytes, None), "st_memset")
                descs.append(_descriptor(p.value, s["dtype"], s["shape"], device=self.device))
            self._launch(descs[:len(self.inputs)], descs[len(self.inputs):], None)
            _check(rt.st_stream_synchronize(None), "st_stream_synchronize")
        finally:
            for p in buffers:
                rt.st_device_free(p, None)
            rt.st_stream_synchronize(None)
        return (time.perf_counter() - t0) * 1e3

    def __call__(self, *xs, stream: int | None = None):
        if len(xs) != len(self.inputs):
            names = ", ".join(f"{s['name']}: {s['dtype']}{s['shape']}" for s in self.inputs)
            raise ProgramError(f"{self.name}: expected {len(self.inputs)} input(s) ({names}), got {len(xs)}")
        kinds = {_framework(x) for x in xs}
        on_device = [k for k in ("torch", "cupy") if k in kinds]
        if on_device and all(self._is_cuda(x) for x in xs if _framework(x) != "numpy"):
            return self._run_device(xs, on_device[0], stream)
        return self._run_host(xs, "torch" if "torch" in kinds else "numpy")

    def shapes_for(self, shapes) -> tuple[list, list]:
        """(input shapes, output shapes) for inputs of these shapes: the manifest's, or over a dynamic
        program's dimensions (worked out once a shape; a ProgramError naming the dimension where a
        guard does not hold)."""
        if not self.dynamic:
            return [list(s["shape"]) for s in self.inputs], [list(s["shape"]) for s in self.outputs]
        key = tuple(tuple(int(d) for d in x) for x in shapes)
        hit = self._shapes.get(key)
        if hit is None:
            if len(key) != len(self.inputs):
                return [list(s["shape"]) for s in self.inputs], [list(s["shape"]) for s in self.outputs]
            try:
                hit = dynamic_shapes(self.dynamic, [s["name"] for s in self.inputs], key)
            except ValueError as e:
                raise ProgramError(f"{self.name}: {e}") from None
            if len(self._shapes) < 256:
                self._shapes[key] = hit
        return hit

    def _check_spec(self, i: int, dtype: str | None, shape, want=None) -> None:
        s = self.inputs[i]
        want = list(s["shape"]) if want is None else list(want)
        if dtype != s["dtype"] or list(shape) != want:
            raise ProgramError(f"{self.name}: input {i} '{s['name']}': expected {s['dtype']}{want}, got "
                               f"{dtype}{list(shape)} (a program is specialised to the shapes it was built for"
                               + (", but for its dynamic dimensions)" if self.dynamic else ")"))

    @staticmethod
    def _is_cuda(x) -> bool:
        dev = getattr(x, "device", None)
        return getattr(dev, "type", None) == "cuda" or _framework(x) == "cupy"

    def _run_device(self, xs, kind: str, stream: int | None):
        fw = sys.modules[kind]
        want_in, want_out = self.shapes_for([tuple(x.shape) for x in xs])
        keep, ins = [], []
        for i, x in enumerate(xs):
            if _framework(x) == "numpy" or not self._is_cuda(x):
                x = fw.asarray(x) if kind == "cupy" else fw.as_tensor(x).cuda(self.device)
            capsule, v = dlpack_view(x)
            self._check_spec(i, v["dtype"], v["shape"], want_in[i])
            keep += [x, capsule]
            ins.append(_descriptor(v["data"], v["dtype"], v["shape"], v["strides"], v["device_id"]))
        if kind == "torch":
            dev = fw.device("cuda", self.device)
            outs = [fw.empty(sh, dtype=getattr(fw, s["dtype"]), device=dev) for s, sh in zip(self.outputs, want_out)]
            stream = fw.cuda.current_stream(dev).cuda_stream if stream is None else stream
        else:
            with fw.cuda.Device(self.device):
                outs = [fw.empty(sh, dtype=s["dtype"]) for s, sh in zip(self.outputs, want_out)]
            stream = fw.cuda.get_current_stream().ptr if stream is None else stream
        descs = []
        for o, s, sh in zip(outs, self.outputs, want_out):
            capsule, v = dlpack_view(o)
            keep.append(capsule)
            descs.append(_descriptor(v["data"], s["dtype"], sh, v["strides"], v["device_id"]))
        self._launch(ins, descs, stream)
        del keep
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _run_host(self, xs, kind: str):
        import numpy as np

        rt = runtime()
        arrays = []
        for x in xs:
            arrays.append(np.ascontiguousarray(x.cpu().numpy() if _framework(x) == "torch" else x))
        want_in, want_out = self.shapes_for([a.shape for a in arrays])
        for i, a in enumerate(arrays):
            self._check_spec(i, a.dtype.name if a.dtype.name != "bool_" else "bool", a.shape, want_in[i])
        buffers = []
        try:
            def alloc(nbytes: int) -> int:
                p = ctypes.c_void_p()
                _check(rt.st_device_alloc(max(nbytes, 1), None, ctypes.byref(p)), "st_device_alloc")
                buffers.append(p.value)
                return p.value

            ins = []
            for a, s, sh in zip(arrays, self.inputs, want_in):
                ptr = alloc(a.nbytes)
                _check(rt.st_copy_h2d(ptr, a.ctypes.data, a.nbytes, None), "st_copy_h2d")
                ins.append(_descriptor(ptr, s["dtype"], sh, device=self.device))
            outs = [np.empty(sh, dtype=DTYPES[s["dtype"]][2] or "uint16") for s, sh in zip(self.outputs, want_out)]
            descs = [_descriptor(alloc(o.nbytes), s["dtype"], sh, device=self.device)
                     for o, s, sh in zip(outs, self.outputs, want_out)]
            self._launch(ins, descs, None)
            for o, d in zip(outs, descs):
                _check(rt.st_copy_d2h(o.ctypes.data, d.data, o.nbytes, None), "st_copy_d2h")
            _check(rt.st_stream_synchronize(None), "st_stream_synchronize")
        finally:
            for p in buffers:
                rt.st_device_free(p, None)
            rt.st_stream_synchronize(None)
        if kind == "torch":
            outs = [sys.modules["torch"].from_numpy(o) for o in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _launch(self, ins, outs, stream) -> None:
        a = (StTensor * max(len(ins), 1))(*ins)
        b = (StTensor * max(len(outs), 1))(*outs)
        _check(self.library.st_program_run(self._handle, a, len(ins), b, len(outs), ctypes.c_void_p(stream or 0)),
               f"{self.name}: run")

    def close(self) -> None:
        if getattr(self, "_handle", None):
            self.library.st_program_destroy(self._handle)
            self._handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        ins = ", ".join(f"{s['name']}: {s['dtype']}{s['shape']}" for s in self.inputs)
        outs = ", ".join(f"{s['name']}: {s['dtype']}{s['shape']}" for s in self.outputs)
        return f"<stitchcuda program {self.name} ({self.manifest.get('precision')}): ({ins}) -> ({outs})>"


def load_program(package: str | os.PathLike, *, device: int | None = None, prepare: bool = True) -> PackagedProgram:
    """The program of a program wheel's package folder, created on ``device`` (default: current) and, unless
    ``prepare=False``, prepared for its first call (:meth:`PackagedProgram.prepare`)."""
    return PackagedProgram(Path(package), device=device, prepare=prepare)


__all__ = ["PackagedProgram", "load_program", "device_count", "device_arch", "read_weights", "dlpack_view", "runtime",
           "TUNING_FILE", "TUNING_HEAD", "TUNING_IDENTITY", "identity_line", "tuning_identity", "parse_tuning",
           "take_tuning", "import_tuning",
           "RuntimeCallError", "NoCudaDeviceError", "ProgramError", "DTYPES", "StTensor"]
