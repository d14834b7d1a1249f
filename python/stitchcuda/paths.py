"""Where the installed package keeps its parts; imports nothing native.

The runtime headers and templates a program compiles against (``include/``), the runtime
library it links (``lib/``), the example program, and the per-user cache folder.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The package's version (``stitchcuda.__version__``).
VERSION = "0.1.0"
PACKAGE_DIR = Path(__file__).resolve().parent
INCLUDE_DIR = PACKAGE_DIR / "include"
LIB_DIR = PACKAGE_DIR / "lib"
EXAMPLES_DIR = PACKAGE_DIR / "examples"


def cache_dir() -> Path:
    """``$STITCHCUDA_CACHE``, else ``~/.cache/stitchcuda`` (build entries, measured ceilings)."""
    env = os.environ.get("STITCHCUDA_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "stitchcuda"


def version() -> str:
    return VERSION


__all__ = ["VERSION", "PACKAGE_DIR", "INCLUDE_DIR", "LIB_DIR", "EXAMPLES_DIR", "cache_dir", "version"]
