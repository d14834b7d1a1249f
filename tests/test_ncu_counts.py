"""benchmarks/ncu_counts.py's CPU half: reading ncu's CSV and giving its kernels to the plan's tasks
(the profiling itself needs a GPU and ncu; the script is run there)."""

from __future__ import annotations

import torch
import torch.nn as nn

from stitchcuda import frontend, ops
from stitchcuda import plan as P
from tests.bench_script import load
from tests.test_coverage_cases import Fn

ncu = load("ncu_counts")

CSV = '''==PROF== Connected to process 1234
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes_read.sum","dram__bytes_write.sum","sm__sass_thread_inst_executed_op_fadd_pred_on.sum","sm__sass_thread_inst_executed_op_ffma_pred_on.sum","sm__sass_thread_inst_executed_op_fmul_pred_on.sum"
"","","","","","","","","","","","byte","byte","inst","inst","inst"
"0","1234","python","h","sm90_xmma_fprop_implicit_gemm_f32f32","1","7","(128, 1, 1)","(40, 1, 1)","0","9.0","1,000,000","250,000","100","1,000","10"
"1","1234","python","h","void stitch::elementwise_kernel<{T1}>(...)","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","4000","2000","0","0","500"
"2","1234","python","h","task_{T1}_kernel(float*)","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","4096","2048","5","0","0"
==PROF== Disconnected from process 1234
'''


def test_csv_rows_and_flops():
    ks = ncu.parse_csv(CSV.replace("{T1}", "x"))
    assert [k.name[:10] for k in ks] == ["sm90_xmma_", "void stitc", "task_x_ker"]
    assert ks[0].flops == 100 + 10 + 2 * 1000 and ks[0].dram_bytes == 1_250_000
    assert ks[2].flops == 5 and ks[2].dram_bytes == 6144


def test_kernels_go_to_their_tasks():
    """A library kernel takes the task between the named ones (program order); the report flags a
    count off by more than the tolerance."""
    torch.manual_seed(0)
    model = Fn(lambda s, x: torch.relu(s.c(x)) * 2 + torch.sigmoid(x).sum(), c=nn.Conv2d(3, 3, 3, padding=1))
    x = torch.randn(2, 3, 8, 8)
    plan = P.plan(frontend.capture(model, [x], "ncu", supported_ops=ops.supported()).graph, "fp32")
    names = [t.name for t in plan.tasks if t.phase == "run"]
    conv = next(t.name for t in plan.tasks if isinstance(t.params, P.ConvSpec))
    named = next(n for n in names if n != conv)
    kernels = ncu.parse_csv(CSV.replace("{T1}", named))
    rows = ncu.compare("p", kernels, plan.tasks, ncu.task_kinds(plan))
    by = {r.task: r for r in rows}
    assert by[conv].kernels == 1 and by[conv].ncu_flops == 2110, "the cuDNN kernel before the first named one"
    assert by[named].kernels == 2
    assert by[conv].kind == "Conv"
    text = ncu.markdown(rows, 2.0)
    assert f"`{conv}`" in text and "outside a factor of 2" in text
