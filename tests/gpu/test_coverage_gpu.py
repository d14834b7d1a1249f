"""The coverage families on the GPU: programs built by ``stitchcuda.pipeline.build_program`` and
run by ``stitchcuda.program.Program``, against PyTorch in float64, at fp32 (1e-4) and tf32 (1e-2).

* every small reference of tests/test_coverage_cases.py (pooling 1-3 d with padding, dilation,
  ceil mode, adaptive and global; group / instance / layer / vector norms; scans forward, reverse,
  exclusive, masked, integer; arg reductions and max / min over a dim; gathers, padding, flips,
  repeats, nearest upsampling, arange; the pointwise long tail);
* the small versions of the KernelBench problems these families opened, and one problem per new
  task kind at its real size (gigabytes: the large-shape paths of each template);
* three runs per program with fresh inputs, outputs poisoned with NaN first; integer outputs
  (arg reductions, counts) must be equal, floats within ``tol + tol * |ref|``, NaN only where
  the reference has NaN.

Run: ``pytest -m gpu tests/gpu/test_coverage_gpu.py``.
"""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from stitchcuda.pipeline import build_program  # noqa: E402
from stitchcuda.program import Program  # noqa: E402
from tests.test_coverage_cases import CASES, SMALL, all_rows, problem_id, problem_reference  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("exact_fp32")]

TOL = {"fp32": 1e-4, "tf32": 1e-2}
#: One problem per new task kind, at the size KernelBench gives it.
FULL = [(1, 35), (1, 34), (1, 42), (1, 43), (1, 45), (1, 89), (1, 91), (1, 92), (1, 51), (1, 53), (1, 95), (1, 14),
        (2, 30), (2, 98)]


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _check(out: torch.Tensor, ref: torch.Tensor, tol: float, what: str) -> None:
    assert tuple(out.shape) == tuple(ref.shape), what
    if not ref.is_floating_point():
        assert torch.equal(out.to(ref.dtype), ref), f"{what}: integer / boolean result differs"
        return
    flat_o, flat_r = out.reshape(-1), ref.reshape(-1)
    chunk = 1 << 27  # compared in float64 a piece at a time: a 7.5 GB output would need 30 GB at once
    for i in range(0, flat_o.numel(), chunk):
        o, r = flat_o[i:i + chunk].double(), flat_r[i:i + chunk].double()
        assert not (torch.isnan(o) & ~torch.isnan(r)).any(), f"{what}: NaN where the reference has none (unwritten?)"
        excess = ((o - r).abs() - (tol + tol * r.abs())).nan_to_num(nan=0.0).max().item()
        assert excess <= 0, f"{what}: error over tolerance {tol} (max excess {excess:.3e}, elements {i}...)"


def _run(model: torch.nn.Module, draw, policy: str, name: str, tmp_path, trials: int = 3) -> None:
    """Build ``model`` (its example inputs: ``draw(0)``), load it, run ``trials`` fresh draws."""
    example = draw(0)
    outcome = build_program(model, example_inputs=example, name=name, precision=policy, out=tmp_path / name,
                            arch=_arch(), quiet=True)
    assert outcome.ok, outcome.build.message if outcome.build else "not built"
    prog = Program.load(tmp_path / name)
    model64 = model.to("cuda", torch.float64)
    for trial in range(trials):
        args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in draw(1000 + trial)]
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        outs = [torch.full(s.shape, float("nan") if getattr(torch, s.dtype).is_floating_point else 0,
                           dtype=getattr(torch, s.dtype), device="cuda") for s in prog.outputs]
        prog(*tensors, out=outs)
        torch.cuda.synchronize()
        with torch.no_grad():
            want = _as_list(model64(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                                      for a in args]))
        assert len(outs) == len(want)
        for i, (o, r) in enumerate(zip(outs, want)):
            _check(o, r, TOL[policy], f"{name} {policy} trial {trial} output {i}")
        del outs, want, args
        gc.collect()
        torch.cuda.empty_cache()
    prog.close()


def _redraw(inputs: list):
    """Fresh inputs like ``inputs`` (same shapes, dtypes, value ranges) for trial ``seed``."""
    def draw(seed: int) -> list:
        if seed == 0:
            return inputs
        g = torch.Generator().manual_seed(seed)
        out = []
        for x in inputs:
            if x.dtype == torch.bool:
                out.append(torch.rand(x.shape, generator=g) > 0.5)
            elif not x.is_floating_point():
                out.append(torch.randint(int(x.min()), int(x.max()) + 1, x.shape, generator=g, dtype=x.dtype))
            elif bool((x >= 0).all()):
                out.append(torch.rand(x.shape, generator=g) * float(x.max()) + float(x.min()))
            else:
                out.append(torch.randn(x.shape, generator=g))
        return out

    return draw


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_case_on_gpu(name, policy, tmp_path):
    model, inputs = CASES[name][1]()
    _run(model, _redraw(inputs), policy, f"{name}_{policy}", tmp_path)


def _kernelbench(key, small: bool, policy: str, tmp_path) -> None:
    if key not in all_rows():
        pytest.skip("KernelBench all.jsonl not present beside the checkout")
    ref = problem_reference(key, small=small)
    torch.manual_seed(0)
    model = ref.Model(*ref.get_init_inputs())

    def draw(seed: int) -> list:
        torch.manual_seed(seed)
        return list(ref.get_inputs())

    _run(model, draw, policy, f"{ref.name}_{policy}".replace("-", "_"), tmp_path, trials=2 if not small else 3)


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("key", sorted(SMALL), ids=[problem_id(k) for k in sorted(SMALL)])
def test_small_problem_on_gpu(key, policy, tmp_path):
    _kernelbench(key, True, policy, tmp_path)


@pytest.mark.parametrize("key", FULL, ids=[problem_id(k) for k in FULL])
def test_full_size_problem_on_gpu(key, tmp_path):
    _kernelbench(key, False, "fp32", tmp_path)
