"""The worker child's job: a frozen dataclass, sent as JSON over the child's stdin, validated on load.

The parent (:mod:`.run`) decides everything the child does: which library, the manifest (parsed
by the parent; the child reads nothing from the program folder), the reference, the precision to
judge at, the seeds, the options. Nothing of it is in a file the candidate could read: the child
runs in an empty working directory, reads its job from a pipe and answers over another
(:mod:`.isolate`); ``token`` marks its messages, so a line the candidate writes to that pipe is
not taken for one.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from ... import manifest as mf
from ...precision import NAMES
from .reference import ReferenceSpec
from ..measure.timing import LoopSettings

Mode = Literal["verify", "profile"]


class JobError(ValueError):
    """A job that does not validate (a bug of the parent, never of the candidate)."""


@dataclass(frozen=True)
class WorkerJob:
    mode: Mode
    library: str
    manifest: mf.Manifest
    reference: ReferenceSpec
    precision: str
    seed: int
    weights_seed: int
    token: str
    trials: int = 5
    varied: int = 4
    time: bool = True
    compile: bool = True
    autotune: bool = False  # torch.compile(mode="max-autotune") at the policy, a fifth baseline
    dynamic: bool = True
    reference_profile: bool = True
    memory_fraction: float = 0.9
    program_memory_cap: int | None = None
    timing: LoopSettings = field(default_factory=LoopSettings)
    profile_runs: int = 20
    device: int = 0
    cupti: bool = True
    isolate: bool = True  # run the program in the native runner (no Python, no PyTorch in its process)
    sanitizer: bool = True  # compute-sanitizer on one small trial (in the native runner)

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["manifest"] = self.manifest.to_dict()
        d["reference"] = self.reference.to_dict()
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> "WorkerJob":
        """Parse and validate; raises :class:`JobError` naming the field."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise JobError(f"job: not valid JSON ({e.msg})") from None
        if not isinstance(data, dict):
            raise JobError("job: expected an object")
        known = {f.name for f in dataclasses.fields(cls)}
        extra = set(data) - known
        if extra:
            raise JobError(f"job: unknown field(s) {', '.join(sorted(extra))}")
        missing = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING} - set(data)
        if missing:
            raise JobError(f"job: missing field(s) {', '.join(sorted(missing))}")
        kw: dict[str, Any] = dict(data)
        try:
            kw["manifest"] = mf.Manifest.from_dict(data["manifest"], "job.manifest")
        except mf.ManifestError as e:
            raise JobError(f"job: {e}") from None
        ref = data["reference"]
        if not isinstance(ref, dict) or not isinstance(ref.get("label"), str) or not isinstance(ref.get("name"), str):
            raise JobError("job.reference: expected {label, name, path | source}")
        kw["reference"] = ReferenceSpec.from_dict(ref)
        if "timing" in data:
            t = data["timing"]
            if not isinstance(t, dict) or set(t) - {f.name for f in dataclasses.fields(LoopSettings)}:
                raise JobError("job.timing: expected the fields of LoopSettings")
            kw["timing"] = LoopSettings(**t)
        job = cls(**kw)
        job.validate()
        return job

    def validate(self) -> None:
        def want(name: str, ok: bool, what: str) -> None:
            if not ok:
                raise JobError(f"job.{name}: expected {what}, got {getattr(self, name)!r}")

        want("mode", self.mode in ("verify", "profile"), "verify or profile")
        want("library", isinstance(self.library, str) and bool(self.library), "a path")
        want("precision", self.precision in NAMES, "one of " + ", ".join(NAMES))
        for name in ("seed", "weights_seed", "trials", "varied", "profile_runs", "device"):
            v = getattr(self, name)
            want(name, isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a non-negative integer")
        want("trials", self.trials >= 1, "at least 1")
        want("token", isinstance(self.token, str) and len(self.token) >= 16, "a token of 16+ characters")
        for name in ("time", "compile", "autotune", "dynamic", "reference_profile", "cupti", "isolate", "sanitizer"):
            want(name, isinstance(getattr(self, name), bool), "true or false")
        want("memory_fraction", isinstance(self.memory_fraction, (int, float)) and 0 <= self.memory_fraction <= 1,
             "a fraction in [0, 1]")
        cap = self.program_memory_cap
        want("program_memory_cap", cap is None or (isinstance(cap, int) and cap >= 0), "null or bytes")


__all__ = ["WorkerJob", "JobError", "Mode"]
