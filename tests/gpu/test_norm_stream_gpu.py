"""The streamed group norm (templates/stitch/norm_stream.cuh) on the GPU, with its epilogue, against
PyTorch in float64 (fp32 programs, 1e-4; outputs poisoned with NaN first, three fresh draws): rows
of one tile and of many, rows whose channels do not split into 16-byte packs (one element a pack),
and a 128 MB tensor (many rows in flight: the lag between a row's statistics and its output, and
the waits on it).

Run: ``pytest -m gpu tests/gpu/test_norm_stream_gpu.py``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stitchcuda import frontend, ops  # noqa: E402
from stitchcuda import plan as P  # noqa: E402
from stitchcuda.kinds.norm_stream import NormStreamSpec  # noqa: E402
from stitchcuda.pipeline import build_program  # noqa: E402
from tests.gpu.test_coverage_gpu import _arch, _check  # noqa: E402
from tests.test_norm_stream import GnAct, _constraints  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("exact_fp32")]

CASES = {  # (channels, groups, affine, input shape, strategy: the kernel runs only under "stream")
    "one-tile": (12, 4, True, (3, 12, 9, 10), "stream"),
    "many-tiles": (32, 8, True, (8, 32, 64, 64), "stream"),
    "odd-rows-no-packs": (6, 3, True, (4, 6, 33, 31), "stream"),
    "no-affine-64MB": (64, 8, False, (16, 64, 128, 128), "stream"),
    "128MB": (64, 8, True, (32, 64, 128, 128), "stream"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_streamed_group_norm_on_gpu(name, tmp_path):
    from stitchcuda.program import Program

    channels, groups, affine, shape, option = CASES[name]
    torch.manual_seed(0)
    model = GnAct(channels, groups, affine)
    x0 = torch.randn(*shape)
    graph = frontend.capture(model, [x0], name, supported_ops=ops.supported()).graph
    constraints = _constraints(graph, option)
    assert any(isinstance(t.params, NormStreamSpec) for t in P.plan(graph, "fp32", constraints=constraints).tasks)
    outcome = build_program(model, example_inputs=[x0], name=name, precision="fp32", out=tmp_path / name,
                            arch=_arch(), quiet=True, constraints=constraints)
    assert outcome.ok, outcome.build.message if outcome.build else "not built"
    prog = Program.load(tmp_path / name)
    model64 = model.to("cuda", torch.float64)
    for trial in range(3):
        g = torch.Generator().manual_seed(1000 + trial)
        x = (torch.randn(*shape, generator=g) * (1 + trial) + trial).cuda()
        out = torch.full(shape, float("nan"), device="cuda")
        prog(x, out=[out])
        torch.cuda.synchronize()
        with torch.no_grad():
            want = model64(x.double())
        _check(out, want, 1e-4, f"{name} trial {trial}")
    prog.close()
