"""Progress reporting: the protocol the engines report to, and rich bars on standard error.

The CLI draws bars only on a terminal, never in CI or with ``--quiet``; library callers
pass any object with these three methods, or nothing.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol


class Progress(Protocol):
    """What an engine reports while it runs: one task per pass, rows as they are done."""

    def start(self, description: str, total_rows: int | None) -> None: ...
    def advance(self, rows: int) -> None: ...
    def finish(self) -> None: ...


class NoProgress:
    """Reports nothing."""

    def start(self, description: str, total_rows: int | None) -> None:
        pass

    def advance(self, rows: int) -> None:
        pass

    def finish(self) -> None:
        pass


class _QuietTerminal:
    """Turns off the echo of typed keys on a terminal while bars are live.

    An echoed ``^C`` after a full-width line wraps the cursor to a new line, and the live
    display, which redraws by moving the cursor up, then draws its first line twice.
    """

    def __init__(self) -> None:
        self._saved: list[Any] | None = None
        try:
            import termios

            if sys.stdin.isatty():
                fd = sys.stdin.fileno()
                self._saved = termios.tcgetattr(fd)
                quiet = termios.tcgetattr(fd)
                quiet[3] &= ~(termios.ECHO | termios.ECHOCTL)
                termios.tcsetattr(fd, termios.TCSANOW, quiet)
        except (ImportError, OSError, ValueError):  # no termios (Windows), or no real terminal
            self._saved = None

    def restore(self) -> None:
        if self._saved is not None:
            import termios

            termios.tcsetattr(sys.stdin.fileno(), termios.TCSANOW, self._saved)
            self._saved = None


class RichProgress:
    """One rich bar per pass on standard error: rows done (of all), throughput, time.

    A "starting" line with a spinner is drawn as soon as the object is made, before the
    slow imports and footer reads, and replaced by the first pass's bar.
    """

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            ProgressColumn,
            SpinnerColumn,
            TaskID,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichBars
        from rich.table import Column
        from rich.text import Text

        class RowsDone(ProgressColumn):
            def render(self, task: Any) -> Text:
                if task.fields.get("waiting"):
                    return Text("")
                done = int(task.completed)
                total = "?" if task.total is None else f"{int(task.total):,}"
                return Text(f"{done:,}/{total}", style="green")

        class RowsPerSecond(ProgressColumn):
            def render(self, task: Any) -> Text:
                speed = task.finished_speed or task.speed
                return Text(f"{speed / 1e6:.2f}M rows/s" if speed else "", style="cyan")

        self._progress = RichBars(
            SpinnerColumn(finished_text=" "),
            TextColumn("{task.description}"),
            BarColumn(),
            RowsDone(table_column=Column(no_wrap=True)),
            RowsPerSecond(table_column=Column(no_wrap=True)),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console or Console(stderr=True),
            transient=False,
        )
        self._terminal = _QuietTerminal()
        self._task: TaskID | None = None
        self._progress.start()
        self._starting: TaskID | None = self._progress.add_task("starting", total=None, waiting=True)
        self._progress.refresh()

    def start(self, description: str, total_rows: int | None) -> None:
        if self._starting is not None:
            self._progress.remove_task(self._starting)
            self._starting = None
        self._task = self._progress.add_task(description, total=total_rows)
        self._progress.refresh()

    def advance(self, rows: int) -> None:
        if self._task is not None:
            self._progress.advance(self._task, rows)

    def finish(self) -> None:
        if self._task is not None:
            task = next(t for t in self._progress.tasks if t.id == self._task)
            if task.total is None:
                self._progress.update(self._task, total=task.completed)
            self._progress.stop_task(self._task)
            self._progress.refresh()

    def close(self) -> None:
        """Stop drawing: bars stay as they stand, the "starting" line goes, the terminal is restored."""
        try:
            if self._starting is not None:
                self._progress.remove_task(self._starting)
                self._starting = None
            self._progress.stop()
        finally:
            self._terminal.restore()
