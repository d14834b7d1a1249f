"""A built program as a Python callable: ``Program.load(dir)(*tensors) -> outputs``.

:meth:`Program.load` reads a program folder (``manifest.json``, ``weights.safetensors``,
``program.cu``), takes the library from the folder's own ``program.so`` when its build record
matches the source, else from the build cache (:mod:`.build`, which compiles on a miss unless
``STITCHCUDA_NEVER_COMPILE=1``). Calling it runs the program on the GPU.

Tensors go in through DLPack: PyTorch, CuPy, ``stitchcuda.rt.DeviceTensor``, or NumPy
arrays (copied to the device first). With PyTorch inputs the outputs are PyTorch tensors on
the inputs' device and the run is on PyTorch's current stream; otherwise they are
``rt.DeviceTensor``. PyTorch is never imported here: a program runs with the runtime and
NumPy alone. Every input is checked against the manifest before the call (shape and dtype,
with a message naming the input and the expected spec); the program checks again.

A program keeps nothing between calls. Where the reference keeps state in a plain tensor
attribute (``self.hidden``, changed by each call), the program takes that state explicitly: the
attribute's value before the call is one more input and its value after the call one more output
(the manifest's ``state`` names them), and the caller feeds each call's state output to the next
call: ``y, h = prog(x, h)``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from . import build as _build
from . import manifest as mf
from . import _rt as rt
from .fsutil import atomic_write_text
# One definition for both ways of running a program: the runtime wheel's loader imports nothing
# of stitchcuda, so the error lives there and is raised here too.
from .loader import ProgramError, dynamic_shapes

BUILD_RECORD = "program.build.json"


def _dtype_name(x: Any) -> str | None:
    dt = getattr(x, "dtype", None)
    if dt is None:
        return None
    name = getattr(dt, "name", None)  # numpy
    text = str(dt)
    if name and not text.startswith("torch."):
        return {"bool_": "bool"}.get(name, name)
    return text.removeprefix("torch.")


def _is_torch(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _is_numpy(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "numpy"


def _spec(t: mf.TensorSpec, shape: Sequence[int] | None = None) -> str:
    return f"{t.dtype}[{', '.join(map(str, t.shape if shape is None else shape))}]"


class Program:
    """A loaded program: its manifest, weights and library; an instance per device on demand."""

    def __init__(self, root: Path, manifest: mf.Manifest, library_path: str, weights: list[Any]):
        self.root = Path(root)
        self.manifest = manifest
        self.library_path = library_path
        self.library = rt.ProgramLibrary(library_path)
        self._weights = weights
        self._instances: dict[int, Any] = {}
        self.tuned, self.tuning_note = 0, ""  # choices imported from the folder's tuning file (instance())
        self._dyn_shapes: dict[tuple, tuple[list, list]] = {}  # a dynamic program's shapes, by its inputs' shapes
        self.prepared_ms: float | None = None  # the preparing call's time (instance())

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, path: str | os.PathLike, *, arch: str | None = None, cache: str | os.PathLike | None = None,
             build: bool = True) -> "Program":
        """Open a program folder; ``arch`` defaults to the manifest's target.

        Raises :class:`~stitchcuda.manifest.ManifestError` for a broken folder and
        :class:`RuntimeError` (with nvcc's first error) when the library cannot be built.
        """
        prog = mf.load_program_dir(path, require_weights=True)
        m = prog.manifest
        source = prog.read_source()
        if not mf.same_hash(m.source_hash, mf.hash_source(source)):
            raise mf.ManifestError(prog.manifest_path, "source_hash does not match program.cu")
        arch = arch or m.arch
        library = _prebuilt(prog.root, m, arch)
        if library is None:
            if not build:
                raise RuntimeError(f"{prog.root}: no prebuilt {mf.LIBRARY_FILE} for {arch} and building is off")
            res = _build.build(source, arch=arch, cache=cache)
            if not res.ok:
                raise RuntimeError(f"{prog.root}: cannot build the program for {arch}: {res.message}")
            library = res.library
        weights = _read_weights(prog.weights, m) if m.weights else []
        return cls(prog.root, m, library, weights)

    # ------------------------------------------------------------------ running

    @property
    def inputs(self) -> tuple[mf.TensorSpec, ...]:
        return self.manifest.inputs

    @property
    def outputs(self) -> tuple[mf.TensorSpec, ...]:
        return self.manifest.outputs

    @property
    def state(self) -> tuple[mf.CarriedState, ...]:
        """The reference's state taken explicitly (module docstring): attribute, input, output."""
        return self.manifest.state

    def instance(self, device: int = 0, *, prepare: bool = True):
        """The program created on ``device`` (weights uploaded once, on first use). The folder's tuning
        file (:mod:`stitchcuda.tuning`), where it was made on this device, is imported first: the GEMM
        algorithms and convolution engines timed then are taken instead of timing them. Unless
        ``prepare=False`` the new instance is prepared (:meth:`prepare`), so that the first call costs
        what a later one does."""
        inst = self._instances.get(device)
        if inst is None:
            if not self._instances:
                from . import tuning

                rt.set_device(device)  # the file is judged against the device the program runs on
                self.tuned, self.tuning_note = tuning.load(self.root)
            inst = self.library.create(self._weights, device=device)
            self._instances[device] = inst
            if prepare:
                self.prepared_ms = self.prepare(device)
        return inst

    def prepare(self, device: int = 0) -> float:
        """One call on zeros on the default stream, its outputs dropped (a program keeps nothing between
        calls): the plans of its GEMMs and convolutions made (from the tuning file where it has them) and
        its kernels loaded before the caller's first call. Milliseconds it took."""
        import time

        import numpy as np

        inst = self.instance(device, prepare=False)
        t0 = time.perf_counter()
        rt.set_device(device)  # the buffers on the instance's device
        ins = [rt.DeviceTensor(list(s.shape), s.dtype) for s in self.inputs]
        zeros = np.zeros(max([t.nbytes for t in ins] + [1]), np.uint8)
        for t in ins:
            rt.h2d(t, zeros)
        outs = [rt.DeviceTensor(list(s.shape), s.dtype) for s in self.outputs]
        inst.run(ins, outs, stream=0)
        rt.synchronize(0)
        return (time.perf_counter() - t0) * 1e3

    def check_inputs(self, tensors: Sequence[Any]) -> None:
        """Raise ProgramError unless ``tensors`` match the manifest's inputs in number, shape
        and dtype (what cannot be read from an object is left to the program's own check)."""
        self._checked(tensors)

    def _checked(self, tensors: Sequence[Any]) -> list[tuple[int, ...]] | None:
        """:meth:`check_inputs`, giving the outputs' shapes for these inputs when it worked them out
        (a dynamic program: one reading of the sizes a call)."""
        specs = self.inputs
        if len(tensors) != len(specs):
            names = ", ".join(f"{s.name}: {_spec(s)}" for s in specs)
            raise ProgramError(f"{self.manifest.name}: expected {len(specs)} input(s) ({names}), got {len(tensors)}")
        want = [tuple(s.shape) for s in specs]
        dyn = self.manifest.dynamic
        out_shapes = None
        if dyn is not None and all(getattr(t, "shape", None) is not None for t in tensors):
            want, out_shapes = self._shapes_for(tensors)
        for i, (t, s, w) in enumerate(zip(tensors, specs, want)):
            shape = getattr(t, "shape", None)
            dtype = _dtype_name(t)
            if shape is not None and tuple(int(d) for d in shape) != w or \
                    dtype is not None and dtype != s.dtype:
                got = f"{dtype or '?'}[{', '.join(map(str, shape)) if shape is not None else '?'}]"
                raise ProgramError(f"{self.manifest.name}: input {i} '{s.name}': expected {_spec(s, w)}, got {got} "
                                   "(a program is specialised to the shapes it was built for"
                                   + (", but for its dynamic dimensions)" if dyn is not None else ")"))
        return out_shapes

    def output_shapes(self, tensors: Sequence[Any]) -> list[tuple[int, ...]]:
        """The outputs' shapes for these inputs (the manifest's, or over a dynamic program's dimensions)."""
        if self.manifest.dynamic is None:
            return [tuple(s.shape) for s in self.outputs]
        return self._shapes_for(tensors)[1]

    def _shapes_for(self, tensors: Sequence[Any]) -> tuple[list, list]:
        """A dynamic program's (input shapes, output shapes) for inputs of these shapes: worked out once a
        shape (a call's dispatch cost stays the static program's), a ProgramError naming the dimension
        where a guard does not hold."""
        key = tuple(tuple(int(d) for d in t.shape) for t in tensors)
        hit = self._dyn_shapes.get(key)
        if hit is None:  # the reading a program wheel's loader makes (one implementation)
            try:
                ins, outs = dynamic_shapes(self.manifest.dynamic.to_dict(), [s.name for s in self.inputs], key)
            except ValueError as e:
                raise ProgramError(f"{self.manifest.name}: {e}") from None
            hit = ([tuple(x) for x in ins], [tuple(x) for x in outs])
            if len(self._dyn_shapes) < 256:
                self._dyn_shapes[key] = hit
        return hit

    def __call__(self, *tensors: Any, out: Sequence[Any] | None = None, stream: int | None = None,
                 device: int | None = None):
        """Run on ``tensors`` (in manifest order); returns the output, or a tuple of them.

        ``out``: preallocated outputs (contiguous, on the device) to write into instead.
        ``stream``: a CUDA stream handle (default: PyTorch's current stream for PyTorch
        inputs, else the legacy default stream).
        """
        shapes = self._checked(tensors) or self.output_shapes(tensors)
        torch_in = any(_is_torch(t) for t in tensors)
        if torch_in:
            outs, stream, device, tensors = self._torch_io(tensors, out, stream, device, shapes)
        else:
            outs, tensors, device = self._rt_io(tensors, out, device, shapes)
            stream = 0 if stream is None else stream
        if out is not None:
            self._check_outputs(out, shapes)
        self.instance(device).run(list(tensors), list(outs), stream=int(stream))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _check_outputs(self, out: Sequence[Any], shapes: Sequence[tuple[int, ...]]) -> None:
        if len(out) != len(self.outputs):
            raise ProgramError(f"{self.manifest.name}: expected {len(self.outputs)} output buffer(s), got {len(out)}")
        for i, (t, s, w) in enumerate(zip(out, self.outputs, shapes)):
            shape, dtype = getattr(t, "shape", None), _dtype_name(t)
            if shape is not None and tuple(shape) != w or dtype is not None and dtype != s.dtype:
                raise ProgramError(f"{self.manifest.name}: output {i} '{s.name}': expected {_spec(s, w)}")

    def _torch_io(self, tensors, out, stream, device, shapes):
        torch = sys.modules["torch"]
        dev = next((t.device for t in tensors if _is_torch(t) and t.device.type == "cuda"), None)
        if dev is None:
            dev = torch.device("cuda", device or 0)
        ins = []
        for t in tensors:
            if not _is_torch(t):
                t = torch.from_dlpack(t) if hasattr(t, "__dlpack__") and not _is_numpy(t) else torch.as_tensor(t)
            ins.append(t.to(dev).contiguous())
        outs = list(out) if out is not None else [
            torch.empty(shape, dtype=getattr(torch, s.dtype), device=dev)
            for s, shape in zip(self.outputs, shapes)]
        if stream is None:
            stream = torch.cuda.current_stream(dev).cuda_stream
        return outs, stream, dev.index or 0, ins

    def _rt_io(self, tensors, out, device, shapes):
        device = rt.get_device() if device is None else device
        ins = []
        for t, s in zip(tensors, self.inputs):
            if _is_numpy(t):
                import numpy as np

                d = rt.DeviceTensor(list(t.shape), s.dtype)
                rt.h2d(d, np.ascontiguousarray(t))
                t = d
            ins.append(t)
        outs = list(out) if out is not None else [rt.DeviceTensor(list(shape), s.dtype)
                                                  for s, shape in zip(self.outputs, shapes)]
        return outs, ins, device

    def save_tuning(self) -> Path:
        """Write the choices this process timed (for this program's calls and any other) into the folder's
        tuning file, for the next process and the program's wheel."""
        from . import tuning

        return tuning.save(self.root)

    def close(self) -> None:
        for inst in self._instances.values():
            inst.close()
        self._instances.clear()

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}: {_spec(s)}" for s in self.inputs)
        outs = ", ".join(f"{s.name}: {_spec(s)}" for s in self.outputs)
        return f"Program({self.manifest.name}, {self.manifest.precision}, ({ins}) -> ({outs}))"


# ---------------------------------------------------------------------- helpers


def _prebuilt(root: Path, m: mf.Manifest, arch: str) -> str | None:
    """The folder's own program.so when its build record names this source, arch and runtime."""
    lib, rec = root / mf.LIBRARY_FILE, root / BUILD_RECORD
    if not lib.is_file() or not rec.is_file():
        return None
    try:
        record = json.loads(rec.read_text())
    except (OSError, ValueError):
        return None
    if record.get("source_hash") != m.source_hash or record.get("arch") != arch or \
            record.get("runtime") != rt.version():
        return None
    return str(lib)


def write_build_record(root: Path, m: mf.Manifest, result: _build.BuildResult) -> None:
    """Next to a program.so copied into its folder: what it was built from."""
    rec = {"source_hash": m.source_hash, "arch": result.arch, "runtime": rt.version(), "cache_key": result.key}
    atomic_write_text(Path(root) / BUILD_RECORD, json.dumps(rec, indent=1) + "\n")


def _read_weights(path: Path | None, m: mf.Manifest) -> list[Any]:
    """The weights in manifest order, as NumPy arrays (PyTorch tensors for bfloat16, which
    NumPy lacks; that needs PyTorch)."""
    if path is None:
        raise mf.ManifestError(m.name, "weights.safetensors is missing")
    if any(w.dtype == "bfloat16" for w in m.weights):
        try:
            from safetensors.torch import load_file
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise RuntimeError(f"{path}: bfloat16 weights need PyTorch to load") from e
        tensors = load_file(str(path))
    else:
        from safetensors.numpy import load_file

        tensors = load_file(str(path))
    return [tensors[w.name] for w in m.weights]


__all__ = ["Program", "ProgramError", "BUILD_RECORD", "write_build_record"]
