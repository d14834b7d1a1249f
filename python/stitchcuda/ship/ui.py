"""What a command shows a person: steps with a spinner and their time, tables, one-line errors.

Three modes: normal (progress and tables; on a terminal the current step spins with its elapsed
time, elsewhere each step is one line when it ends), ``quiet`` (results and errors only) and
``json`` (stdout carries exactly one JSON object, the result; progress is silent; errors still
go to stderr as one line). Progress and errors go to stderr, results to stdout, so
``stitchcuda build ... > plan.txt`` keeps only the plan.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any, Iterator, Sequence


class UI:
    def __init__(self, *, quiet: bool = False, json_mode: bool = False):
        self.quiet = quiet or json_mode
        self.json = json_mode

    # rich consoles follow sys.stdout / sys.stderr as they are at each call (tests redirect them)
    def _console(self, err: bool):
        from rich.console import Console

        return Console(file=sys.stderr if err else sys.stdout, highlight=False, soft_wrap=not err)

    def line(self, text: str = "", *, style: str | None = None) -> None:
        """A result line (stdout), not shown in json mode."""
        if not self.json:
            self._console(False).print(text, style=style, markup=False)

    def info(self, text: str) -> None:
        """Progress text (stderr), not shown when quiet."""
        if not self.quiet:
            self._console(True).print(text, style="dim", markup=False)

    def warn(self, text: str) -> None:
        """A warning (stderr, one line): shown even when quiet, as errors are."""
        print(f"stitchcuda: warning: {text}", file=sys.stderr, flush=True)

    def error(self, text: str) -> None:
        print(f"stitchcuda: error: {text}", file=sys.stderr, flush=True)

    def result(self, data: dict[str, Any]) -> None:
        """The one JSON object of json mode."""
        if self.json:
            sys.stdout.write(json.dumps(data, indent=1, default=str) + "\n")
            sys.stdout.flush()

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator["Steps"]:
        """Run a block of named steps: ``with ui.step("build") as s: s("capture"); ...``.

        Each step is shown while it runs and reported with its seconds when the next one starts.
        """
        steps = Steps(self, what)
        try:
            yield steps
        except BaseException:
            steps.close(ok=False)
            raise
        steps.close()

    @contextlib.contextmanager
    def live(self) -> Iterator[Any]:
        """A status line for what is going on inside a long item, on a terminal only: ``show(text)``
        replaces it, ``show(None)`` clears it. Piped or quiet, it shows nothing (the item's own
        result line is what a log wants)."""
        console = self._console(True)
        if self.quiet or not console.is_terminal:
            yield lambda text: None
            return
        status = console.status("")
        started = [False]

        def show(text: str | None) -> None:
            if text is None:
                if started[0]:
                    status.stop()
                    started[0] = False
                return
            status.update(text)
            if not started[0]:
                status.start()
                started[0] = True

        try:
            yield show
        finally:
            show(None)

    def table(self, title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]],
              *, justify: Sequence[str] | None = None) -> None:
        if self.json:
            return
        from rich.table import Table

        t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False, header_style="bold")
        for i, c in enumerate(columns):
            t.add_column(c, justify=(justify[i] if justify else "left"), overflow="fold")
        for r in rows:
            t.add_row(*("" if v is None else str(v) for v in r))
        self._console(False).print(t)


class Steps:
    """The current step of a command, shown live on a terminal and as a line when it ends."""

    def __init__(self, ui: UI, what: str):
        self.ui, self.what = ui, what
        self.name: str | None = None
        self.t0 = 0.0
        self.seconds: dict[str, float] = {}
        self._status = None
        console = ui._console(True)
        if not ui.quiet and console.is_terminal:
            self._status = console.status("")
            self._status.start()

    def __call__(self, name: str) -> None:
        self._end()
        self.name, self.t0 = name, time.monotonic()
        if self._status is not None:
            self._status.update(f"{self.what}: {name} ...")

    def _end(self, ok: bool = True) -> None:
        if self.name is None:
            return
        dt = time.monotonic() - self.t0
        self.seconds[self.name] = self.seconds.get(self.name, 0.0) + dt
        if ok and not self.ui.quiet:
            self.ui._console(True).print(f"  {self.what}: {self.name} {dt:.1f} s", style="dim", markup=False)
        self.name = None

    def close(self, ok: bool = True) -> None:
        self._end(ok)
        if self._status is not None:
            self._status.stop()


__all__ = ["UI", "Steps"]
