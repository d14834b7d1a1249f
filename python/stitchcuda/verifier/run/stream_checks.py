"""The caller's stream: the program's work is on it, ordered by it, and survives its capture.

``stream_ordered``  the stream is held by a sleep kernel, new inputs are copied in (and, in the
                    Verifier's process, the outputs poisoned) *on the stream*, the program runs, a
                    snapshot is taken on the stream: it must match the reference (work on another
                    stream reads stale inputs or is overwritten by the poison)
``runtime_stream``  every runtime entry point the program called during a run (``st_gemm``,
                    ``st_conv``, ``st_graph_run``, every ``st_*`` with a stream) got the run's stream:
                    the native runner sees each call before the runtime does
``stream_capture``  one call captured from the caller's stream into a CUDA graph (the caller
                    captures, as a serving framework does), new contents loaded into the same
                    buffers, the graph replayed: right (a program that does less, or nothing, when
                    it sees its stream captured is wrong here)
"""

from __future__ import annotations

from typing import Any


from ..report.verdict import DynamicCheck
from .compare import close_mask
from .session import Session, poison_


def stream_ordered(s: Session) -> DynamicCheck:
    runner, tol = s.runner, s.tol
    d = s.ref.draw(s.secret.seed_for("stream"))
    new_inputs = s.own(d.program, "new input")
    d.program = []
    x = [s.like(t, "input") for t in new_inputs]
    for t in x:  # stale contents until the held stream copies the new ones in
        t.zero_()
    y = s.new_outputs()
    snap = [s.like(t, "snapshot") for t in y]
    runner.sync_device()
    if hasattr(runner, "ordered_run"):
        for yi in y:
            poison_(yi, 0)
        runner.ordered_run(x, y, new_inputs, snap)
    else:
        def load():
            for xi, v in zip(x, new_inputs):
                xi.copy_(v)
            for yi in y:
                poison_(yi, 0)

        def take():
            for si, yi in zip(snap, y):
                si.copy_(yi)

        runner.hold()
        runner.ordered(load)
        runner.run(x, y)
        runner.ordered(take)
        runner.sync()
    s.calls += 1
    s.check_guards(x, y, "stream order")
    ref = s.reference(d, new_inputs)
    if all(bool(close_mask(a, r, tol).all().item()) for a, r in zip(snap, ref)):
        return DynamicCheck("stream_ordered", "pass", "outputs complete when the stream's work completed")
    runner.sync_device()
    for yi in y:
        poison_(yi, 0)
    runner.sync_device()  # the poison must land before the program, wherever it runs
    runner.run(x, y)
    runner.sync_device()
    s.calls += 1
    if all(bool(close_mask(a, r, tol).all().item()) for a, r in zip(y, ref)):
        bad = sum(int((~close_mask(a, r, tol)).sum().item()) for a, r in zip(snap, ref))
        return DynamicCheck("stream_ordered", "fail",
                            f"{bad} output elements were not final when the work queued on the given stream had "
                            "completed (right only after a device-wide synchronise): work runs on another stream")
    return DynamicCheck("stream_ordered", "pass", "inconclusive: the outputs are wrong even after a device-wide "
                                                  "synchronise (see the trials)")


def runtime_stream(log: dict[str, Any], what: str) -> DynamicCheck | None:
    """From the native runner's log of runtime calls (``foreign_stream``, ``foreign_first``)."""
    n = int(log.get("foreign_stream", 0) or 0)
    if n:
        return DynamicCheck("runtime_stream", "fail", f"{n} runtime call(s) {what} on a stream other than the run's "
                                                      f"(first: {log.get('foreign_first', '?')}): work hidden from "
                                                      "the caller's stream")
    return None


def stream_capture(s: Session) -> DynamicCheck | None:
    """The ``stream_capture`` check (module docstring); None where the runner cannot capture."""
    runner = s.runner
    if not hasattr(runner, "capture"):
        return None
    d = s.ref.draw(s.secret.seed_for("capture"))
    x = s.own_draw(d)
    y = s.new_outputs()
    for t in y:
        poison_(t, 0)
    try:
        runner.capture(x, y)
    except Exception as e:  # noqa: BLE001 - a program that cannot be captured is not a cheat: said, not judged
        s.warnings.append(f"stream capture: the program could not run while its stream was captured ({e})"[:400])
        return DynamicCheck("stream_capture", "pass", "not judged: the program cannot run under stream capture")
    s.calls += 1
    try:
        label = "captured call, replayed on new contents in the same buffers"
        d = s.ref.draw(s.secret.seed_for("capture:2"))  # the capture ran nothing: new contents, then one replay
        for buf, v in zip(x, d.program):
            buf.copy_(v)
        d.program = []
        for t in y:
            poison_(t, 1)
        try:
            runner.replay()
        except Exception as e:  # noqa: BLE001 - a graph that cannot be replayed (an allocation in it) is said
            s.warnings.append(f"stream capture: the captured call could not be replayed ({e})"[:400])
            return DynamicCheck("stream_capture", "pass", "not judged: the captured call cannot be replayed")
        s.calls += 1
        s.check_guards(x, y, label)
        jd = s.judge(label, y, d, x, record=False)
        if not jd.trial.passed:
            bad = next(o for o in jd.trial.outputs if not o.passed)
            how = f"{bad.nan_count} elements never written" if bad.nan_count else f"max |err| {bad.max_abs_err:.3g}"
            if s.plain_ok:
                return DynamicCheck("stream_capture", "fail", f"{label}: output {bad.name} wrong ({how}), though "
                                                              "right when its stream is not captured")
            return DynamicCheck("stream_capture", "pass", f"not judged: wrong on fresh buffers too ({label})")
    finally:
        runner.drop_capture()
    return DynamicCheck("stream_capture", "pass", "a call captured from the caller's stream was right when replayed "
                                                  "on new contents")


__all__ = ["stream_ordered", "runtime_stream", "stream_capture"]
