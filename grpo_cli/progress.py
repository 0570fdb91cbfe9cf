"""Progress reporting: the protocol the engines report to, and rich bars on standard error.

The CLI draws bars only on a terminal, never in CI or with ``--quiet``; library callers
pass any object with these three methods, or nothing.
"""

from __future__ import annotations

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


class RichProgress:
    """One rich bar per pass on standard error: rows done, throughput, time."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TaskID,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichBars
        from rich.text import Text

        class RowsPerSecond(TextColumn):
            def __init__(self) -> None:
                super().__init__("")

            def render(self, task: Any) -> Text:
                speed = task.finished_speed or task.speed
                return Text(f"{speed / 1e6:.2f}M rows/s" if speed else "", style="cyan")

        self._progress = RichBars(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            RowsPerSecond(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task: TaskID | None = None

    def start(self, description: str, total_rows: int | None) -> None:
        if self._task is None:
            self._progress.start()
        self._task = self._progress.add_task(description, total=total_rows)

    def advance(self, rows: int) -> None:
        if self._task is not None:
            self._progress.advance(self._task, rows)

    def finish(self) -> None:
        if self._task is not None:
            self._progress.stop_task(self._task)
            task = self._progress.tasks[-1]
            if task.total is None:
                self._progress.update(self._task, total=task.completed)

    def close(self) -> None:
        self._progress.stop()
