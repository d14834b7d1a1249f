"""Zoo models through capture, plan, code and nvcc: run by tests/test_zoo.py as a background command.

    python tests/zoo_check.py OUT.json POLICY CACHE_DIR MODEL.py [MODEL.py ...]

Writes one record per model to OUT.json: the stage reached (``coded`` without nvcc, ``compiled``,
or the stage that failed: ``capture``, ``plan``, ``code``, ``compile``), the error's text, the task
count and kinds, and seconds per stage.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


#: nvcc with the device code unoptimised: the check is that every model's program compiles and
#: assembles (templates instantiated, ptxas's resource limits met); optimising the device code
#: about doubled the zoo's time in the test command (on 2 cores, BERT-base 13.2 s at -O3 and 8.9 s so,
#: MobileNetV2 156 s and 79 s) and proves no more.
CHECK_FLAGS = ("-Xcicc", "-O0", "-Xptxas", "-O0")


def check(path: Path, policy: str, cache: Path) -> dict:
    from stitchcuda import build as B
    from stitchcuda import code as C
    from stitchcuda import plan as P
    from stitchcuda.pipeline import capture_problem
    from stitchcuda.toolchain import find_nvcc

    rec: dict = {"model": path.stem, "policy": policy, "error": ""}
    t0 = time.monotonic()
    stage = "capture"
    try:
        cap = capture_problem(str(path), precision=policy, name=path.stem, weights=False, compiling=False)
        stage = "plan"
        plan = P.plan(cap.graph, policy)
        stage = "code"
        source = C.code(plan, cap.graph, None, arch="sm_90").program_cu
    except Exception as e:  # noqa: BLE001 - the record names the stage and the error
        rec.update(stage=stage, error=f"{type(e).__name__}: {e}")
        return rec
    rec.update(tasks=len(plan.tasks), kinds=sorted({type(t.params).__name__.removesuffix("Spec") for t in plan.tasks}),
               plan_s=round(time.monotonic() - t0, 1))
    if find_nvcc() is None:
        rec.update(stage="coded")
        return rec
    t1 = time.monotonic()
    r = B.build(source, arch="sm_90", cache=cache, flags=CHECK_FLAGS)
    rec.update(stage="compiled" if r.ok else "compile", build_s=round(time.monotonic() - t1, 1))
    if not r.ok:
        rec["error"] = (r.compile.output if r.compile else r.message)[-3000:]
    return rec


def main(argv: list[str]) -> int:
    out, policy, cache, *models = argv
    records = [check(Path(m), policy, Path(cache)) for m in models]
    Path(out).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
