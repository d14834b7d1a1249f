"""``python -m stitchcuda.ship.serve --model MODEL.gguf --n_ctx 4096 --port 8080``: a local
OpenAI-compatible LLM server for ``--llm http://127.0.0.1:8080/v1`` (:mod:`stitchcuda.llm.serve`);
a refusal is one line with the README's exit code."""

from __future__ import annotations

import sys

from . import errors


def main(argv: list[str] | None = None) -> int:
    from ..llm.serve import serve

    try:
        serve(sys.argv[1:] if argv is None else argv)
    except Exception as e:  # noqa: BLE001 - one line and its exit code, as every command's
        f = errors.explain(e)
        print(f"stitchcuda: error: {f.message}", file=sys.stderr)
        return f.code
    return errors.OK


if __name__ == "__main__":
    sys.exit(main())
