"""``stitchcuda wheel``: a built program becomes a wheel that installs and imports with no PyTorch.

On the CPU: the wheels' contents and metadata (py3-none, the runtime pinned exactly, no PyTorch
anywhere), the program library's run path rewritten to the runtime wheel's folder, the weights
read back by the runtime's loader, and — the acceptance case — both wheels installed by pip into a
fresh virtual environment without PyTorch (and, where this machine has one, of another Python
version than the one that built them), imported, and ``load()`` ending in the clear no-GPU error.

On a GPU (``-m gpu``): the wheel's program, run by that torch-less environment on NumPy inputs,
matches the reference's output computed by PyTorch in this process; PyTorch tensors go through
DLPack zero-copy in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from stitchcuda import cli
from stitchcuda import manifest as mf
from stitchcuda.ship import errors, wheel
from stitchcuda.loader import read_weights

REPO = Path(__file__).resolve().parents[1]
MLP = REPO / "models" / "mlp.py"


@pytest.fixture(scope="module")
def built(tmp_path_factory, nvcc):
    """Building models/mlp.py and its wheels for sm_90 and sm_80 (about 30 s)."""
    import stitchcuda

    root = tmp_path_factory.mktemp("wheel")
    mp = pytest.MonkeyPatch()
    mp.setenv("STITCHCUDA_CACHE", str(root / "cache"))
    try:
        arch = _gpu_arch() or "sm_90"
        o = stitchcuda.build_program(MLP, out=root / "mlp", arch=arch, quiet=True)
        assert o.ok
        archs = list(dict.fromkeys([arch, "sm_90", "sm_80"]))
        if stitchcuda.has_gpu():   # a wheel holds a verified program; without a GPU, one packed --unverified
            from stitchcuda.verifier.verification import VerifyOptions, verify_program

            assert verify_program(root / "mlp", None, VerifyOptions(time=False, profile=False, compile=False)).result.ok
        w = wheel.make_wheels(root / "mlp", archs=archs, out=root / "dist", unverified=not stitchcuda.has_gpu())
    finally:
        mp.undo()
    return root, w


def _gpu_arch() -> str | None:
    import stitchcuda

    if not stitchcuda.has_gpu():
        return None
    major, minor = stitchcuda.rt.device_info(0)["compute_capability"]
    return f"sm_{major}{minor}"


def _zip(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist()}


def test_wheel_contents_and_metadata(built):
    root, w = built
    assert w.name == "mlp" and w.program.name == "mlp-0.1.0-py3-none-" + wheel.platform_tag() + ".whl"
    assert w.runtime.name.startswith("stitchcuda_runtime-0.1.0+rt") and "-py3-none-" in w.runtime.name
    prog, rt = _zip(w.program), _zip(w.runtime)
    for archive in (prog, rt):  # RECORD lists every file with its hash
        record = next(v for k, v in archive.items() if k.endswith("RECORD")).decode().splitlines()
        listed = {ln.split(",")[0]: ln.split(",")[1] for ln in record}
        assert set(listed) == set(archive)
        for name, data in archive.items():
            if not name.endswith("RECORD"):
                assert listed[name] == wheel._record_hash(data), name
    assert {"mlp/__init__.py", "mlp/manifest.json", "mlp/weights.safetensors", "mlp/sm_90/program.so",
            "mlp/sm_80/program.so"} <= set(prog)
    meta = prog["mlp-0.1.0.dist-info/METADATA"].decode()
    rt_version = w.runtime.name.split("-")[1]
    assert f"Requires-Dist: stitchcuda-runtime=={rt_version}" in meta
    rt_meta = next(v for k, v in rt.items() if k.endswith("METADATA")).decode()
    assert "Requires-Dist: numpy" in rt_meta and "Requires-Dist: nvidia-cublas>=13.0,<14" in rt_meta
    assert "Requires-Dist: nvidia-cudnn-cu13>=9.0,<10" in rt_meta  # the runtime links cuDNN (convolutions)
    requires = [ln for ln in (meta + rt_meta).splitlines() if ln.startswith("Requires-Dist")]
    assert len(requires) == 4 and not any("torch" in ln.lower() for ln in requires)
    assert "Tag: py3-none-" in prog["mlp-0.1.0.dist-info/WHEEL"].decode()
    assert set(rt) >= {"stitchrt/__init__.py", "stitchrt/lib/libstitchrt.so"}
    # the program finds the runtime beside it, not in the install that built it
    for arch in ("sm_90", "sm_80"):
        assert wheel.elf_runpath(prog[f"mlp/{arch}/program.so"])[1] == wheel.RPATH


def test_loader_reads_the_weights(built):
    from safetensors.numpy import load_file

    root, _ = built
    m = mf.Manifest.load(root / "mlp")
    specs = [w.to_dict() for w in m.weights]
    mapping, found = read_weights(root / "mlp" / mf.WEIGHTS_FILE, specs)
    want = load_file(str(root / "mlp" / mf.WEIGHTS_FILE))
    for off, spec in found:
        got = np.frombuffer(mapping, dtype=spec["dtype"], count=int(np.prod(spec["shape"])), offset=off)
        assert np.array_equal(got.reshape(spec["shape"]), want[spec["name"]])
        del got


def _other_python() -> str:
    """A Python 3 of another minor version when the machine has one (the wheel is py3-none)."""
    for minor in (13, 12, 10, 14):
        if minor == sys.version_info.minor:
            continue
        for exe in (shutil.which(f"python3.{minor}"), f"/usr/bin/python3.{minor}"):
            if exe and Path(exe).is_file():
                r = subprocess.run([exe, "-c", "import venv, sys; print(sys.version_info[1])"], capture_output=True,
                                   text=True)
                if r.returncode == 0 and r.stdout.strip() == str(minor):
                    return exe
    return sys.executable


def torchless_venv(root: Path, wheels: list[Path], python: str, with_numpy: bool) -> Path:
    """A fresh venv with ``wheels`` installed by pip and no PyTorch. The runtime's dependencies
    come from this environment by a .pth file (NVIDIA's cuBLAS wheel is 600 MB; NumPy only when
    the venv's Python is this one's), never PyTorch."""
    venv = root / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                        *map(str, wheels)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    deps = root / "deps"
    deps.mkdir()
    import nvidia

    here = Path(nvidia.__path__[0]).parent
    names = ["nvidia"] + (["numpy", "numpy.libs"] if with_numpy else [])
    for n in names:
        if (here / n).exists():
            (deps / n).symlink_to(here / n)
    (site / "deps.pth").write_text(str(deps) + "\n")
    return py


def test_installs_without_pytorch_and_says_there_is_no_gpu(built, tmp_path):
    if _gpu_arch() is not None:
        pytest.skip("this machine has a GPU: the no-GPU error cannot be shown here")
    _, w = built
    py = torchless_venv(tmp_path, [w.program, w.runtime], _other_python(), with_numpy=False)
    code = ("import sys, mlp, stitchrt\n"
            "try:\n    import torch\nexcept ImportError:\n    print('no torch')\n"
            "print(sys.version_info[:2])\n"
            "try:\n    mlp.load()\nexcept stitchrt.NoCudaDeviceError as e:\n    print('NoCudaDeviceError:', e)\n")
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=120, env={
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "no torch"
    assert lines[2].startswith("NoCudaDeviceError: mlp: no CUDA device here") and "NVIDIA GPU" in lines[2]


def test_cli_wheel_refuses_bad_input(built, tmp_path, capfd):
    root, _ = built
    for args, expect in ((["--name", "numpy"], "taken by another package"), (["--name", "9lives"], "not a Python"),
                         (["--arch", "90"], "sm_XY form")):
        capfd.readouterr()
        rc = cli.main(["wheel", str(root / "mlp"), "--out", str(tmp_path / "d"), "-q", *args])
        err = capfd.readouterr().err
        assert rc == errors.BAD_INPUT and expect in err and len(err.strip().splitlines()) == 1, err
    rc = cli.main(["wheel", str(tmp_path), "-q"])
    assert rc == errors.BAD_INPUT and "manifest.json: file not found: not a program folder" in capfd.readouterr().err
    assert not (tmp_path / "d").exists()


def test_package_names():
    assert wheel.package_name("23_Softmax") == "p23_softmax"
    assert wheel.package_name("gpt-block") == "gpt_block"


# ---------------------------------------------------------------------- on the GPU


@pytest.mark.gpu
def test_wheel_program_matches_the_reference(built, tmp_path):
    """The wheel's program in a torch-less venv, on NumPy inputs, against PyTorch's output here."""
    import torch

    from stitchcuda import frontend

    root, w = built
    ref = frontend.load_reference(root / "mlp" / "reference.py")
    torch.manual_seed(0)
    model = ref.Model(*ref.get_init_inputs())
    x = torch.randn(*mf.Manifest.load(root / "mlp").inputs[0].shape)
    np.save(tmp_path / "x.npy", x.numpy())
    py = torchless_venv(tmp_path, [w.program, w.runtime], sys.executable, with_numpy=True)
    code = ("import numpy as np, mlp\n"
            f"x = np.load({str(tmp_path / 'x.npy')!r})\n"
            "m = mlp.load()\n"
            f"np.save({str(tmp_path / 'y.npy')!r}, m(x))\n"
            "try:\n    import torch\n    print('torch present')\nexcept ImportError:\n    print('no torch')\n")
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "no torch"
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
    got = np.load(tmp_path / "y.npy")
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-4 * (1 + np.abs(want).max())
    # PyTorch tensors through DLPack, in this process: same numbers, a CUDA tensor back
    sys.path.insert(0, str(next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))))
    try:
        import mlp

        y = mlp.load()(x.cuda())
        assert isinstance(y, torch.Tensor) and y.is_cuda
        assert np.abs(y.cpu().numpy() - got).max() <= 1e-5 * (1 + np.abs(want).max())
    finally:
        sys.path.pop(0)
    json.dumps(str(w))  # the paths are plain strings for the report


def test_loading_prepares_a_program_with_one_call_on_zeros(monkeypatch):
    """PackagedProgram.prepare through a recording stand-in for the runtime and the program's library:
    one zeroed device buffer per input and output, one run of the program on them on the default
    stream, everything freed after (the GPU tests run the real thing)."""
    import ctypes

    from stitchcuda import loader

    calls: list[tuple] = []

    class Runtime:
        def st_device_alloc(self, nbytes, stream, out):
            calls.append(("alloc", nbytes))
            ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = 4096 * len(calls)
            return 0

        def st_memset(self, ptr, value, nbytes, stream):
            calls.append(("memset", ptr, value, nbytes))
            return 0

        def st_stream_synchronize(self, stream):
            calls.append(("sync",))
            return 0

        def st_device_free(self, ptr, stream):
            calls.append(("free", ptr))
            return 0

    class Library:
        def st_program_run(self, handle, ins, n_in, outs, n_out, stream):
            calls.append(("run", [ins[i].data for i in range(n_in)], [outs[i].data for i in range(n_out)],
                          stream.value))
            return 0

    monkeypatch.setattr(loader, "runtime", lambda: Runtime())
    prog = object.__new__(loader.PackagedProgram)
    prog.name, prog.device, prog._handle, prog.library = "p", 0, 1, Library()
    prog.inputs = [{"name": "x", "dtype": "float32", "shape": [4, 8]}, {"name": "i", "dtype": "int64", "shape": [4]}]
    prog.outputs = [{"name": "y", "dtype": "bfloat16", "shape": [4, 3]}]
    assert prog.prepare() >= 0
    allocs = [c for c in calls if c[0] == "alloc"]
    assert [c[1] for c in allocs] == [128, 32, 24]
    memsets = [c for c in calls if c[0] == "memset"]
    assert [(c[2], c[3]) for c in memsets] == [(0, 128), (0, 32), (0, 24)]
    run = next(c for c in calls if c[0] == "run")
    ptrs = [c[1] for c in memsets]
    assert run[1] == ptrs[:2] and run[2] == ptrs[2:] and not run[3]
    assert sorted(c[1] for c in calls if c[0] == "free") == sorted(ptrs)
    assert calls.index(run) < min(calls.index(c) for c in calls if c[0] == "free")
    prog._handle = None  # nothing to destroy
