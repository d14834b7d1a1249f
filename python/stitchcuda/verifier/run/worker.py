"""The child process that runs one candidate: ``python -m stitchcuda.verifier.run.worker FD``.

The job (a :class:`~.job.WorkerJob`, JSON on stdin) names the program library, the manifest, the
reference, the precision to judge at, the seeds, the native runner and the options. Modes:

``verify``   setup (reference and its weights, the program instance: in the native runner, a
             process with no interpreter and no PyTorch, where the machine allows; :mod:`.instance`)
             -> correctness (trials and dynamic checks) -> sanitizer (compute-sanitizer on one small
             trial) -> timing (program, its timed calls checked, its event time against the host
             clock, and the four baselines) -> the reference's torch.profiler top ops
``profile``  setup (in this process: CUPTI records this process's kernels) -> device ceilings
             (cached) -> CUPTI profile of the program

The worker reports over the pipe FD (:class:`~.child.Channel`): the phase it is in, and the
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
from .instance import CandidateFailure, CreateFailed, Guarded
from .job import JobError, WorkerJob

_Guarded = Guarded  # the tests' name for it


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

    from .inputs import Secret
    from .instance import start
    from .session import ReferenceMismatch

    stream = torch.cuda.Stream(dev)
    runner_exe, why = _runner(job)
    try:
        inst = start(job, problem, dev, stream, Secret(job.seed).seed_for("guards"), runner_exe, why)
    except CreateFailed as e:
        rep.finish("crash", 1, crash={"message": _message(e.__cause__ or e) if e.__cause__ else str(e)})
    rep.save(isolation=inst.isolation)
    runner = inst.runner
    program_memory = inst.memory
    _, total = torch.cuda.mem_get_info(dev)
    cap = total // 2 if job.program_memory_cap is None else int(job.program_memory_cap)
    try:
        if job.mode == "profile":
            _profile(job, rep, runner, problem, stream, dev)
        else:
            _verify(job, rep, runner, problem, stream, dev, program_memory, cap, inst)
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


def _runner(job: WorkerJob) -> tuple[str, str]:
    """(the native runner's executable, "") or ("", why the program runs in this process)."""
    if job.mode == "profile":
        return "", "a profile: CUPTI records the kernels of the process it runs in"
    if not job.isolate:
        return "", "isolation turned off"
    from .native import RunnerUnavailable, runner_binary

    try:
        return str(runner_binary()), ""
    except RunnerUnavailable as e:
        return "", str(e).splitlines()[0][:300]


def _verify(job: WorkerJob, rep, runner, problem, stream, dev, program_memory, cap, inst=None) -> None:
    import torch

    from ..report.records import MemoryUse
    from .correctness import check_correctness

    rep.phase("correctness")
    buffers = inst.buffers if inst is not None else None
    weights = inst.weights if inst is not None else ()
    res = check_correctness(runner, problem, precision=job.precision, trials=job.trials, seed=job.seed,
                            varied=job.varied, dynamic=job.dynamic, buffers=buffers, weights=weights,
                            degenerate=getattr(problem, "degenerate", ""))
    used = program_memory()
    memory = MemoryUse(program_bytes=used, torch_peak_bytes=int(torch.cuda.max_memory_allocated(dev)), cap_bytes=cap)
    rep.save(correctness=res, memory=memory, correctness_notes=list(res.notes) + list(problem.notes))
    if cap and used > cap:
        rep.finish("crash", 1, crash={"message": f"out of memory: the program allocated {used / 2**30:.2f} GiB of "
                                                 f"device memory, over its cap of {cap / 2**30:.2f} GiB"})
    if not res.passed:
        return
    extra = []
    if job.sanitizer and inst is not None and inst.runner_exe:
        rep.phase("sanitizer")
        check = _sanitize(job, problem, dev, inst.runner_exe)
        if check is not None:
            extra.append(check)
            rep.save(extra_checks=extra)
            if check.status == "fail":
                return
    if not job.time:
        return
    rep.phase("timing")
    checks, wrong = _time(job, rep, runner, problem, stream, dev, res.tolerance, inst)
    extra += checks
    if wrong:  # timed calls wrong with their inputs in fresh buffers too: wrong answers on those draws (.timed_calls)
        import dataclasses

        n = len(res.trials)
        res = dataclasses.replace(res, trials=res.trials + tuple(dataclasses.replace(t, index=n + i)
                                                                 for i, t in enumerate(wrong)),
                                  notes=res.notes + (f"{len(wrong)} checked timed call(s) wrong, and wrong again with "
                                                     "the same inputs in fresh buffers: a wrong answer on that draw, "
                                                     "kept among the trials",))
        rep.save(correctness=res, correctness_notes=list(res.notes) + list(problem.notes))
    rep.save(extra_checks=extra)
    if job.reference_profile:
        rep.phase("reference_profile")
        from ...precision import fp32_exact
        from ..measure.cupti import profile_reference
        from .inputs import Secret

        d = problem.draw(Secret(job.seed).seed_for("timing"))
        try:
            ops = profile_reference(problem.model, problem.model_args(d), context=fp32_exact)
            rep.save(reference_ops=ops)
        except Exception as e:  # noqa: BLE001 - the reference's profile is advice, not a verdict
            rep.save(reference_ops=[], reference_profile_error=f"{type(e).__name__}: {e}")


def _time(job: WorkerJob, rep, runner, problem, stream, dev, tol: float, inst) -> tuple[list, list]:
    """The timing phase: the program where it runs (its calls checked), the baselines here; returns
    the checks of what the runtime was asked during it (the native runner's log), and a failed trial
    for each checked call wrong with its inputs in fresh buffers too (:mod:`.timed_calls`)."""
    import torch

    from ..measure.timing import time_all
    from ..report.verdict import DynamicCheck
    from .inputs import Secret
    from .instance import RemoteClock
    from .precision_claim import library_evidence
    from .session import poison_, same_wrong_answer
    from .stream_checks import runtime_stream
    from .timed_calls import TimedCalls, output_judge

    secret = Secret(job.seed)
    buffers = inst.buffers if inst is not None else None
    d = problem.draw(secret.seed_for("timing"))
    x = [buffers.copy(t, k, "timed input") for k, t in enumerate(d.program)] if buffers is not None else d.program
    y = [buffers.empty(s.shape, _dtype(s.dtype), k, "timed output") for k, s in enumerate(problem.output_specs)] \
        if buffers is not None else \
        [torch.empty(s.shape, dtype=_dtype(s.dtype), device=problem.device) for s in problem.output_specs]
    torch.cuda.synchronize(dev)  # the draw ran on the default stream; the program runs on its own
    if inst is not None and inst.remote is not None:
        program = RemoteClock(runner, x, y)
    else:
        program = runner.bind(x, y)

    def in_fresh_buffers(draw, inputs) -> tuple[list, list, list]:  # one call: (inputs, outputs, reference)
        xs = [buffers.copy(t, k) for k, t in enumerate(inputs)] if buffers is not None else [t.clone() for t in inputs]
        ys = [poison_(buffers.like(t) if buffers is not None else torch.empty_like(t)) for t in y]
        torch.cuda.synchronize(dev)
        runner.run(xs, ys)
        runner.sync()
        torch.cuda.synchronize(dev)
        return xs, ys, problem.forward(draw, xs)

    wrong: list = []

    def again(call: int, inputs, outputs) -> bool:  # the draw's fault: the same wrong answer, every output written
        xs, ys, ref = in_fresh_buffers(d, inputs)
        right, trial = _judged_trial(problem.output_specs, tol, ys, ref, lambda: problem.forward64(d, xs),
                                     f"timed call {call}, again in fresh buffers", d.seed)
        if right or not same_wrong_answer(outputs, ys, tol):
            return False
        wrong.append(trial)
        return True

    judge = output_judge(problem.output_specs, tol, lambda: problem.forward64(d, x))
    calls = TimedCalls(x, y, lambda xs: problem.forward(d, xs), judge, secret.rng("timed"), job.timing, again=again)

    def outputs_ok() -> bool:
        fresh = problem.draw(secret.seed_for("recheck"))
        xs, ys, ref = in_fresh_buffers(fresh, fresh.program)
        return output_judge(problem.output_specs, tol, lambda: problem.forward64(fresh, xs))(ys, ref)[0]

    table, details = time_all(program, problem.model, problem.model_args(d), precision=job.precision,
                              stream=stream, compile=job.compile, autotune=job.autotune, settings=job.timing,
                              recheck_outputs=outputs_ok,
                              log=lambda s: print(f"[worker] {s}", flush=True), calls=calls)
    rep.save(timing={"table": table, "details": details})
    if hasattr(runner, "tuning"):  # the choices the timed calls' plans made: the folder's tuning file
        try:
            rep.save(tuning=runner.tuning())
        except Exception as e:  # noqa: BLE001 - an optimisation for the next process, never a verdict
            print(f"[worker] tuning choices not read: {type(e).__name__}: {e}", flush=True)
    checks = []
    if buffers is not None:
        bad = buffers.check()
        if bad:
            checks.append(DynamicCheck("memory_bounds", "fail", "during the timed calls: " + "; ".join(bad[:3])))
    if hasattr(runner, "library_calls"):
        log = runner.library_calls()
        below = library_evidence(log.get("calls", []), job.precision)
        if below:
            checks.append(DynamicCheck("precision_claim", "fail", f"during the timed calls: {below}"))
        foreign = runtime_stream(log, "during the timed calls")
        if foreign is not None:
            checks.append(foreign)
    return checks, wrong


def _judged_trial(specs, tol: float, outputs, ref, truth, label: str, seed) -> tuple[bool, Any]:
    """``outputs`` against ``ref`` as a checked timed call is judged (:func:`.timed_calls.judge_outputs`,
    float64 from ``truth()`` only where needed), output by output: (all right, the TrialResult)."""
    from ..report.verdict import OutputCheck, TrialResult
    from .timed_calls import judge_outputs

    checks = []
    for spec, j in zip(specs, judge_outputs(tol, outputs, ref, truth)):
        e, e64 = j.e, j.e64
        checks.append(OutputCheck(name=spec.name, max_abs_err=e.max_abs, mean_abs_err=e.mean_abs, tolerance=tol,
                                  where=e.where, expected=e.expected, got=e.got, nan_count=e.bad_nonfinite,
                                  passed=j.passed, max_abs_err_f64=e64.max_abs if e64 else None,
                                  mean_abs_err_f64=e64.mean_abs if e64 else None, atol=e.atol, judged=j.how))
    trial = TrialResult(index=0, outputs=tuple(checks), seed=seed, label=label)
    return trial.passed, trial


def _dtype(name: str):
    from .compare import torch_dtype

    return torch_dtype(name)


def _sanitize(job: WorkerJob, problem, dev, runner_exe: str):
    """compute-sanitizer's tools on one small trial in the native runner (:mod:`.sanitizer`)."""
    from ..report.verdict import DynamicCheck
    from .inputs import Secret
    from .sanitizer import MAX_BYTES, TOOLS, find_sanitizer, run_tool, sanitizer_check

    tool = find_sanitizer()
    if tool is None:
        return DynamicCheck("sanitizer", "pass", "not run: compute-sanitizer is not installed here")
    import torch

    d = problem.draw(Secret(job.seed).seed_for("sanitizer"))
    outs = [torch.zeros(s.shape, dtype=_dtype(s.dtype)) for s in problem.output_specs]
    tensors = [("weight", w) for w in problem.weights] + [("input", t) for t in d.program] + \
        [("output", o) for o in outs]
    size = sum(t.numel() * t.element_size() for _, t in tensors)
    if size > MAX_BYTES:
        return DynamicCheck("sanitizer", "pass", f"not run: the trial holds {size / 2**20:.0f} MiB, over the "
                                                 f"{MAX_BYTES >> 20} MiB a sanitizer trial may")
    reports = [run_tool(tool, name, runner_exe, job.library, dev, tensors, len(problem.weights), len(d.program))
               for name in TOOLS]
    return sanitizer_check(reports)


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
    logged = hasattr(runner, "library_calls")
    if logged:
        runner.library_calls()  # the log restarts here: the calls of the profiled runs (and their warm-up)
    records, details = profile_program(run, stream=stream, tasks=job.manifest.tasks, precision=job.precision,
                                       runs=job.profile_runs, ceilings=ceilings, workdir=os.getcwd(),
                                       prefer_cupti=job.cupti)
    # the split-bf16 GEMM's calls: the bf16 kernels they launch are no evidence against a tf32 claim
    split_bf16 = sum(int(c.get("count", 1)) for c in runner.library_calls().get("calls", [])
                     if c.get("fn") == "st_gemm_split_bf16") if logged else 0
    rep.save(profile={"kernels": records, "details": details, "ceilings": ceilings, "split_bf16_calls": split_bf16})


if __name__ == "__main__":
    sys.exit(main())
