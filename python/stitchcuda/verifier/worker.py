"""The child process that runs one candidate: ``python -m stitchcuda.verifier.worker JOB.json``.

The job (written by :mod:`.run`) names the program library, its manifest, the reference, the
weights file and the options. Modes:

``verify``   setup (reference, weights, program instance, stream) -> correctness (trials and dynamic
             checks) -> timing (program and the four baselines, one process) -> the reference's
             torch.profiler top ops
``profile``  setup -> device ceilings (cached) -> CUPTI profile of the program

The worker reports through ``progress.json`` (the phase it is in) and ``result.json`` (rewritten
after every phase, atomically), both beside the job file. It catches what it can and says what it
was (``input_error``: the reference or weights do not fit the manifest; ``crash``: the program
failed; ``error``: no usable device), then leaves with ``os._exit`` so that a wrecked CUDA context
cannot hang it in destructors. Anything it cannot catch (a segfault, a hang) the parent sees.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .. import manifest as mf
from . import serde
from .isolate import PROGRESS_FILE, RESULT_FILE, write_json


class _Reporter:
    def __init__(self, folder: Path):
        self.folder = folder
        self.result: dict[str, Any] = {"status": "running", "phases": {}}
        self._phase, self._t0 = "", time.monotonic()

    def phase(self, name: str) -> None:
        self._close()
        self._phase, self._t0 = name, time.monotonic()
        write_json(self.folder / PROGRESS_FILE, {"phase": name, "pid": os.getpid()})
        print(f"[worker] phase {name}", flush=True)

    def _close(self) -> None:
        if self._phase:
            self.result["phases"][self._phase] = round(time.monotonic() - self._t0, 4)

    def save(self, **items: Any) -> None:
        for k, v in items.items():
            self.result[k] = serde.to_jsonable(v)
        write_json(self.folder / RESULT_FILE, self.result)

    def finish(self, status: str, code: int, **items: Any) -> None:
        self._close()
        self.result["status"] = status
        self.save(**items)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _message(e: BaseException) -> str:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    return f"{type(e).__name__}: {e}\n" + "".join(tb[-6:])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m stitchcuda.verifier.worker JOB.json", file=sys.stderr)
        return 2
    job_path = Path(argv[0]).resolve()
    job = json.loads(job_path.read_text())
    rep = _Reporter(job_path.parent)
    rep.phase("setup")
    try:
        import torch
    except ImportError as e:
        rep.finish("error", 2, error=f"PyTorch is not importable: {e}")
    from .problem import Problem, ProblemError, ReferenceSpec

    if not torch.cuda.is_available():
        rep.finish("error", 2, error="no CUDA device is visible to the verification child (torch.cuda.is_available() "
                                     "is False)")
    dev = int(job.get("device", 0))
    torch.cuda.set_device(dev)
    frac = float(job.get("memory_fraction", 0) or 0)
    if 0 < frac < 1:
        torch.cuda.set_per_process_memory_fraction(frac, dev)
    rep.save(device=torch.cuda.get_device_name(dev), torch_version=torch.__version__)
    manifest = mf.Manifest.load(job["manifest"])
    try:
        problem = Problem(ReferenceSpec.from_dict(job["reference"]), manifest, f"cuda:{dev}",
                          weights_file=job.get("weights_file"), weights_seed=int(job.get("weights_seed", 0)),
                          manifest_file=job["manifest"])
    except ProblemError as e:
        rep.finish("input_error", 3, input_error={"file": e.file, "problem": e.problem})
    except Exception as e:  # noqa: BLE001 - the reference itself failed on the device
        rep.finish("input_error", 3, input_error={"file": job["reference"]["label"], "problem": _message(e)})

    import stitchcuda
    from stitchcuda import rt

    torch.cuda.synchronize(dev)
    free0, total = torch.cuda.mem_get_info(dev)
    reserved0 = torch.cuda.memory_reserved(dev)
    try:
        lib = rt.ProgramLibrary(job["library"])
        instance = lib.create(problem.weights, device=dev)
    except Exception as e:  # noqa: BLE001 - create failed: the candidate's fault
        rep.finish("crash", 1, crash={"message": "program create failed: " + _message(e)})
    stream = torch.cuda.Stream(dev)
    from .correctness import ReferenceMismatch, StreamRunner

    runner = StreamRunner(instance, stream)
    precision = manifest.precision
    del stitchcuda

    def program_memory() -> int:
        torch.cuda.synchronize(dev)
        free, _ = torch.cuda.mem_get_info(dev)
        return max(0, (free0 - free) - (torch.cuda.memory_reserved(dev) - reserved0))

    cap_opt = job.get("program_memory_cap")
    cap = total // 2 if cap_opt is None else int(cap_opt)
    try:
        if job.get("mode", "verify") == "profile":
            _profile(job, rep, runner, problem, manifest, stream, dev, precision)
        else:
            _verify(job, rep, runner, problem, manifest, stream, dev, precision, program_memory, cap)
    except ProblemError as e:
        rep.finish("input_error", 3, input_error={"file": e.file, "problem": e.problem})
    except ReferenceMismatch as e:
        rep.finish("input_error", 3, input_error={"file": job["reference"]["label"], "problem": str(e)})
    except Exception as e:  # noqa: BLE001 - the program failed while running
        rep.finish("crash", 1, crash={"message": _message(e)})
    rep.finish("done", 0)
    return 0


def _verify(job, rep, runner, problem, manifest, stream, dev, precision, program_memory, cap) -> None:
    import torch

    from .correctness import check_correctness, close_mask, poison_
    from .records import MemoryUse

    rep.phase("correctness")
    res = check_correctness(runner, problem, precision=precision, trials=int(job.get("trials", 5)),
                            seed=int(job.get("seed", 1000)), dynamic=bool(job.get("dynamic", True)))
    used = program_memory()
    memory = MemoryUse(program_bytes=used, torch_peak_bytes=int(torch.cuda.max_memory_allocated(dev)), cap_bytes=cap)
    rep.save(correctness=res, memory=memory, correctness_notes=list(res.notes) + list(problem.notes))
    if cap and used > cap:
        rep.finish("crash", 1, crash={"message": f"out of memory: the program allocated {used / 2**30:.2f} GiB of "
                                                 f"device memory, over its cap of {cap / 2**30:.2f} GiB"})
    if not job.get("time", True) or not res.passed:
        return
    rep.phase("timing")
    from .timing import LoopSettings, time_all

    d = problem.draw(int(job.get("seed", 1000)) + 500)
    x = [t.clone() for t in d.program]
    y = [torch.empty(s.shape, dtype=_dt(s.dtype), device=problem.device) for s in manifest.outputs]
    torch.cuda.synchronize(dev)  # the copies above ran on the default stream; the program runs on its own

    program = runner.bind(x, y) if hasattr(runner, "bind") else (lambda: runner.run(x, y))

    def outputs_ok() -> bool:
        fresh = problem.draw(int(job.get("seed", 1000)) + 900)
        ref = problem.forward(fresh)
        xs = [t.clone() for t in fresh.program]
        ys = [poison_(torch.empty_like(t)) for t in y]
        torch.cuda.synchronize(dev)
        runner.run(xs, ys)
        torch.cuda.synchronize(dev)
        return all(bool(close_mask(a, r, res.tolerance).all().item()) for a, r in zip(ys, ref))

    settings = LoopSettings(**job.get("timing_settings", {}))
    table, details = time_all(program, problem.model, d.model_args, precision=precision, stream=stream,
                              compile=bool(job.get("compile", True)), settings=settings, recheck_outputs=outputs_ok,
                              log=lambda s: print(f"[worker] {s}", flush=True))
    rep.save(timing={"table": table, "details": details})
    if job.get("reference_profile", True):
        rep.phase("reference_profile")
        from .cupti_profile import profile_reference
        from .problem import fp32_exact

        try:
            ops = profile_reference(problem.model, d.model_args, context=fp32_exact)
            rep.save(reference_ops=ops)
        except Exception as e:  # noqa: BLE001 - the reference's profile is advice, not a verdict
            rep.save(reference_ops=[], reference_profile_error=f"{type(e).__name__}: {e}")


def _profile(job, rep, runner, problem, manifest, stream, dev, precision) -> None:
    import torch

    from .cupti_profile import device_ceilings, profile_program

    rep.phase("ceilings")
    try:
        ceilings = device_ceilings(dev)
    except Exception as e:  # noqa: BLE001
        ceilings = None
        rep.save(ceilings_error=f"{type(e).__name__}: {e}")
    rep.phase("profile")
    d = problem.draw(int(job.get("seed", 1000)) + 600)
    x = [t.clone() for t in d.program]
    y = [torch.empty(s.shape, dtype=_dt(s.dtype), device=problem.device) for s in manifest.outputs]
    torch.cuda.synchronize(dev)
    run = runner.bind(x, y) if hasattr(runner, "bind") else (lambda: runner.run(x, y))
    records, details = profile_program(run, stream=stream, tasks=manifest.tasks,
                                       precision=precision, runs=int(job.get("profile_runs", 20)), ceilings=ceilings,
                                       workdir=os.getcwd(),
                                       prefer_cupti=bool(job.get("cupti", True)))
    rep.save(profile={"kernels": records, "details": details, "ceilings": ceilings})


def _dt(name: str):
    from .correctness import TORCH_DTYPES

    return TORCH_DTYPES[name]


if __name__ == "__main__":
    sys.exit(main())
