"""The child process that runs one candidate: ``python -m stitchcuda.verifier.run.worker FD``.

The job (a :class:`~.job.WorkerJob`, JSON on stdin) names the program library, the manifest, the
reference, the precision to judge at, the seeds and the options. Modes:

``verify``   setup (reference and its weights, program instance, stream) -> correctness (trials and
             dynamic checks) -> timing (program, its timed calls checked, and the four baselines, one
             process) -> the reference's torch.profiler top ops
``profile``  setup -> device ceilings (cached) -> CUPTI profile of the program

The worker reports over the pipe FD (:class:`~.isolate.Channel`): the phase it is in, and the
result so far after every phase. It says what went wrong and whose fault it was: ``input_error``
(the reference does not fit the manifest: the caller's), ``crash`` (the program failed, or a CUDA
fault surfaced: the candidate's), ``inconclusive`` (the Verifier itself could not go on, e.g. out
of memory while the program stayed under its cap: nobody's verdict), ``error`` (no usable device).
It leaves with ``os._exit`` so that a wrecked CUDA context cannot hang it in destructors. Anything
it cannot catch (a segfault, a hang) the parent sees.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any

from ... import serial as serde
from .child import Channel
from .job import JobError, WorkerJob


class CandidateFailure(RuntimeError):
    """The program's own call (or the wait for its stream) failed."""


class _Reporter:
    def __init__(self, channel: Channel):
        self.channel = channel
        self.result: dict[str, Any] = {"status": "running", "phases": {}}
        self._phase, self._t0 = "", time.monotonic()

    def phase(self, name: str) -> None:
        self._close()
        self._phase, self._t0 = name, time.monotonic()
        self.channel.send(phase=name)
        print(f"[worker] phase {name}", flush=True)

    def _close(self) -> None:
        if self._phase:
            self.result["phases"][self._phase] = round(time.monotonic() - self._t0, 4)

    def save(self, **items: Any) -> None:
        for k, v in items.items():
            self.result[k] = serde.to_jsonable(v)
        self.channel.send(result=self.result)

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


_CUDA_FAULT = ("illegal memory access", "illegal address", "misaligned address", "unspecified launch failure",
               "an illegal instruction", "cudaerrorillegal", "device-side assert", "launch failure")


def _is_cuda_fault(text: str) -> bool:
    low = text.lower()
    return any(s in low for s in _CUDA_FAULT)


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or "out of memory" in str(e).lower()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m stitchcuda.verifier.run.worker FD  (the job on stdin)", file=sys.stderr)
        return 2
    fd = int(argv[0])
    text = sys.stdin.read()
    try:
        job = WorkerJob.from_json(text)
    except JobError as e:
        Channel(fd).send(result={"status": "error", "error": str(e)})
        return 2
    rep = _Reporter(Channel(fd, job.token))
    rep.phase("setup")
    try:
        import torch
    except ImportError as e:
        rep.finish("error", 2, error=f"PyTorch is not importable: {e}")
    from .harness import ReferenceHarness
    from .reference import ProblemError

    if not torch.cuda.is_available():
        rep.finish("error", 2, error="no CUDA device is visible to the verification child (torch.cuda.is_available() "
                                     "is False)")
    dev = job.device
    torch.cuda.set_device(dev)
    if 0 < job.memory_fraction < 1:
        torch.cuda.set_per_process_memory_fraction(job.memory_fraction, dev)
    rep.save(device=torch.cuda.get_device_name(dev), torch_version=torch.__version__)
    manifest = job.manifest
    try:
        problem = ReferenceHarness(job.reference, manifest, f"cuda:{dev}", weights_seed=job.weights_seed)
    except ProblemError as e:
        rep.finish("input_error", 3, input_error={"file": e.file, "problem": e.problem})
    except Exception as e:  # noqa: BLE001 - the reference itself failed on the device
        rep.finish("input_error", 3, input_error={"file": job.reference.label, "problem": _message(e)})

    from stitchcuda import rt

    torch.cuda.synchronize(dev)
    free0, total = torch.cuda.mem_get_info(dev)
    reserved0 = torch.cuda.memory_reserved(dev)
    try:
        lib = rt.ProgramLibrary(job.library)
        instance = lib.create(problem.weights, device=dev)
    except Exception as e:  # noqa: BLE001 - create failed: the candidate's fault
        rep.finish("crash", 1, crash={"message": "program create failed: " + _message(e)})
    stream = torch.cuda.Stream(dev)
    from .runner import StreamRunner
    from .session import ReferenceMismatch

    runner = _Guarded(StreamRunner(instance, stream))

    def program_memory() -> int:
        torch.cuda.synchronize(dev)
        free, _ = torch.cuda.mem_get_info(dev)
        return max(0, (free0 - free) - (torch.cuda.memory_reserved(dev) - reserved0))

    cap = total // 2 if job.program_memory_cap is None else int(job.program_memory_cap)
    try:
        if job.mode == "profile":
            _profile(job, rep, runner, problem, stream, dev)
        else:
            _verify(job, rep, runner, problem, stream, dev, program_memory, cap)
    except ProblemError as e:
        rep.finish("input_error", 3, input_error={"file": e.file, "problem": e.problem})
    except ReferenceMismatch as e:
        rep.finish("input_error", 3, input_error={"file": job.reference.label, "problem": str(e)})
    except CandidateFailure as e:
        rep.finish("crash", 1, crash={"message": _message(e.__cause__ or e)})
    except Exception as e:  # noqa: BLE001 - whose fault: a CUDA fault is the program's, the rest the harness's
        msg = _message(e)
        if _is_cuda_fault(msg):
            rep.finish("crash", 1, crash={"message": msg})
        if _is_oom(e):
            used = _safe(program_memory)
            if cap and used is not None and used > cap:
                rep.finish("crash", 1, crash={"message": f"out of memory: the program holds {used / 2**30:.2f} GiB "
                                                         f"of device memory, over its cap of {cap / 2**30:.2f} GiB"})
            rep.finish("inconclusive", 4, inconclusive=f"the Verifier ran out of device memory ({type(e).__name__}) "
                                                       f"with the program under its cap: {str(e)[:300]}")
        rep.finish("inconclusive", 4, inconclusive=f"the Verifier failed ({type(e).__name__}: {str(e)[:300]})",
                   traceback=msg)
    rep.finish("done", 0)
    return 0


def _safe(fn):
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None


class _Guarded:
    """A runner whose program calls (and stream waits) raise :class:`CandidateFailure`."""

    def __init__(self, runner: Any):
        self._r = runner
        self.device = runner.device

    def __getattr__(self, name: str) -> Any:
        return getattr(self._r, name)

    def run(self, inputs, outputs) -> None:
        try:
            self._r.run(inputs, outputs)
        except Exception as e:  # noqa: BLE001
            raise CandidateFailure(f"the program's run failed: {type(e).__name__}: {e}") from e

    def sync(self) -> None:
        try:
            self._r.sync()
        except Exception as e:  # noqa: BLE001
            raise CandidateFailure(f"waiting for the program's stream failed: {type(e).__name__}: {e}") from e

    def bind(self, inputs, outputs):
        call = self._r.bind(inputs, outputs) if hasattr(self._r, "bind") else (lambda: self._r.run(inputs, outputs))

        def run() -> None:
            try:
                call()
            except Exception as e:  # noqa: BLE001
                raise CandidateFailure(f"the program's run failed: {type(e).__name__}: {e}") from e
        return run


def _verify(job: WorkerJob, rep, runner, problem, stream, dev, program_memory, cap) -> None:
    import torch

    from .compare import errors
    from .correctness import check_correctness
    from .session import empty_outputs, poison_
    from .inputs import Secret
    from ..report.records import MemoryUse

    rep.phase("correctness")
    res = check_correctness(runner, problem, precision=job.precision, trials=job.trials, seed=job.seed,
                            varied=job.varied, dynamic=job.dynamic)
    used = program_memory()
    memory = MemoryUse(program_bytes=used, torch_peak_bytes=int(torch.cuda.max_memory_allocated(dev)), cap_bytes=cap)
    rep.save(correctness=res, memory=memory, correctness_notes=list(res.notes) + list(problem.notes))
    if cap and used > cap:
        rep.finish("crash", 1, crash={"message": f"out of memory: the program allocated {used / 2**30:.2f} GiB of "
                                                 f"device memory, over its cap of {cap / 2**30:.2f} GiB"})
    if not job.time or not res.passed:
        return
    rep.phase("timing")
    from ..measure.timing import time_all
    from .timed_calls import TimedCalls

    secret = Secret(job.seed)
    tol = res.tolerance
    d = problem.draw(secret.seed_for("timing"))
    x = d.program
    y = empty_outputs(problem.output_specs, problem.device)
    torch.cuda.synchronize(dev)  # the draw ran on the default stream; the program runs on its own
    program = runner.bind(x, y)

    def judge(outputs, ref) -> tuple[bool, str]:
        for spec, o, r in zip(problem.output_specs, outputs, ref):
            e = errors(o, r, tol)
            if not e.passed:
                return False, (f"output {spec.name}: {e.n_bad} of {o.numel()} elements wrong (max |err| "
                               f"{e.max_abs:.3g}, expected {e.expected:.6g}, got {e.got:.6g})")
        return True, ""

    calls = TimedCalls(x, y, lambda xs: problem.forward(d, xs), judge, secret.rng("timed"), job.timing)

    def outputs_ok() -> bool:
        fresh = problem.draw(secret.seed_for("recheck"))
        ys = [poison_(torch.empty_like(t)) for t in y]
        torch.cuda.synchronize(dev)
        runner.run(fresh.program, ys)
        torch.cuda.synchronize(dev)
        ref = problem.forward(fresh)
        return all(errors(a, r, tol).passed for a, r in zip(ys, ref))

    table, details = time_all(program, problem.model, problem.model_args(d), precision=job.precision,
                              stream=stream, compile=job.compile, settings=job.timing, recheck_outputs=outputs_ok,
                              log=lambda s: print(f"[worker] {s}", flush=True), calls=calls)
    rep.save(timing={"table": table, "details": details})
    if job.reference_profile:
        rep.phase("reference_profile")
        from ...precision import fp32_exact
        from ..measure.cupti import profile_reference

        try:
            ops = profile_reference(problem.model, problem.model_args(d), context=fp32_exact)
            rep.save(reference_ops=ops)
        except Exception as e:  # noqa: BLE001 - the reference's profile is advice, not a verdict
            rep.save(reference_ops=[], reference_profile_error=f"{type(e).__name__}: {e}")


def _profile(job: WorkerJob, rep, runner, problem, stream, dev) -> None:
    import torch

    from ..measure.cupti import device_ceilings, profile_program
    from .inputs import Secret
    from .session import empty_outputs

    rep.phase("ceilings")
    try:
        ceilings = device_ceilings(dev)
    except Exception as e:  # noqa: BLE001
        ceilings = None
        rep.save(ceilings_error=f"{type(e).__name__}: {e}")
    rep.phase("profile")
    d = problem.draw(Secret(job.seed).seed_for("profile"))
    y = empty_outputs(problem.output_specs, problem.device)
    torch.cuda.synchronize(dev)
    run = runner.bind(d.program, y)
    records, details = profile_program(run, stream=stream, tasks=job.manifest.tasks, precision=job.precision,
                                       runs=job.profile_runs, ceilings=ceilings, workdir=os.getcwd(),
                                       prefer_cupti=job.cupti)
    rep.save(profile={"kernels": records, "details": details, "ceilings": ceilings})


if __name__ == "__main__":
    sys.exit(main())
