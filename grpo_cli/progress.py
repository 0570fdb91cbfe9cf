"""Progress bars on standard error (only on a terminal, never in CI or with --quiet)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class _RowsPerSecond(TextColumn):
    def __init__(self) -> None:
        super().__init__("")

    def render(self, task):  # type: ignore[no-untyped-def]
        from rich.text import Text

        speed = task.finished_speed or task.speed
        return Text(f"{speed / 1e6:.2f}M rows/s" if speed else "", style="cyan")


class RichProgress:
    """One bar per pass: rows done, throughput, time."""

    def __init__(self) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            _RowsPerSecond(),
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
