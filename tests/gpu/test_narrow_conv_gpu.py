"""The narrow convolution kernel (templates/stitch/narrow_conv.cuh) on the GPU: the coverage cases
whose convolutions it can take, built with the conv strategy ``narrow`` on each (as the loop asks for
it), at fp32 (split TF32, 1e-4) and tf32 (1e-2), three fresh draws each against PyTorch in float64
(tests/gpu/test_coverage_gpu.py's harness: outputs poisoned with NaN first).

Run: ``pytest -m gpu tests/gpu/test_narrow_conv_gpu.py``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stitchcuda import frontend, ops  # noqa: E402
from stitchcuda import plan as P  # noqa: E402
from stitchcuda.kinds.narrow_conv import NarrowConvSpec  # noqa: E402
from stitchcuda.pipeline import build_program  # noqa: E402
from tests.gpu.test_coverage_gpu import _arch, _check, _redraw  # noqa: E402
from tests.test_coverage_cases import CASES  # noqa: E402
from tests.test_narrow_conv import narrow_everywhere  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("exact_fp32")]

TOL = {"fp32": 1e-4, "tf32": 1e-2}
#: coverage cases with convolutions the kernel takes: tiles cut by the edges, filter chunks, a strided
#: RGB stem, a dilated 16-channel one, a channels-last input, batch statistics and a join after it
NAMES = ["narrow_conv_hardswish_chunks", "narrow_conv_stem_7x7_stride2", "narrow_conv_dilated_16ch",
         "narrow_conv_channels_last_region", "conv_mish_batchnorm", "conv_into_cat"]


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("name", NAMES)
def test_narrow_convolution_on_gpu(name, policy, tmp_path):
    from stitchcuda.program import Program

    model, inputs = CASES[name][1]()
    graph = frontend.capture(model, inputs, name, supported_ops=ops.supported()).graph
    constraints = narrow_everywhere(graph)
    assert any(isinstance(t.params, NarrowConvSpec) for t in P.plan(graph, policy, constraints=constraints).tasks)
    draw = _redraw(inputs)
    outcome = build_program(model, example_inputs=draw(0), name=name, precision=policy, out=tmp_path / name,
                            arch=_arch(), quiet=True, constraints=constraints)
    assert outcome.ok, outcome.build.message if outcome.build else "not built"
    prog = Program.load(tmp_path / name)
    model64 = model.to("cuda", torch.float64)
    for trial in range(3):
        args = [a.cuda() for a in draw(1000 + trial)]
        outs = [torch.full(s.shape, float("nan"), dtype=getattr(torch, s.dtype), device="cuda") for s in prog.outputs]
        prog(*args, out=outs)
        torch.cuda.synchronize()
        with torch.no_grad():
            want = model64(*[a.double() for a in args])
        want = list(want) if isinstance(want, (tuple, list)) else [want]
        for i, (o, r) in enumerate(zip(outs, want)):
            _check(o, r, TOL[policy], f"{name} {policy} trial {trial} output {i}")
    prog.close()
