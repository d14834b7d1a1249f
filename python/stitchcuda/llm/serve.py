"""llama-cpp-python's OpenAI-compatible server, with models loaded as stitchcuda's in-process client
loads them (the command: ``python -m stitchcuda.ship.serve --model MODEL.gguf --n_ctx 4096 --port 8080``).

Every argument is the server's own (``python -m llama_cpp.server --help``). The one difference is
:func:`~stitchcuda.llm.client.safe_cpu_buffers`: on CPUs with AMX, llama.cpp's weight repacking crashes
the process on its first completion (llama.cpp issue 20824), and llama-cpp-python's server offers no
switch for it. Needs ``pip install 'llama-cpp-python[server]'``.
"""

from __future__ import annotations

import runpy
import sys

from ..errors import MachineError


def serve(argv: list[str]) -> None:
    """Run the server with ``argv`` until it ends. :class:`MachineError`, naming the module, when
    llama-cpp-python, its server extra or anything those import is missing."""
    from .client import import_llama_cpp, safe_cpu_buffers

    import_llama_cpp()  # LLMUnavailable (a MachineError), with the install command
    try:
        import llama_cpp.llama_cpp as low
        import uvicorn  # noqa: F401 - the server extra, asked for before anything starts
        import llama_cpp.server.app  # noqa: F401 - fastapi and what it imports (a module it lacks, named)
    except ImportError as e:
        raise MachineError(f"the server needs {e.name}, which is not installed: pip install "
                           f"'llama-cpp-python[server]' (if {e.name} is still missing, install the package that "
                           "provides it)") from None
    sys.argv = ["llama_cpp.server", *argv]
    with safe_cpu_buffers(low):
        runpy.run_module("llama_cpp.server", run_name="__main__")
