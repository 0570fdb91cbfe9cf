"""Where a run's time goes: wall seconds per stage, recorded only while someone asks.

``make bench`` (and anyone profiling a run) wraps the run in :func:`recording`; the engine
marks its stages with :func:`timed` and :func:`timed_items`, which cost one global read when
nothing records. Stages on the reader, writer and copier threads run beside the main
thread's, so the seconds of all stages can add up to more than the run's wall time.

>>> with recording() as clock:
...     with timed("pass 1: statistics"):
...         total = sum(range(1000))
...     items = list(timed_items("read", iter([1, 2, 3])))
>>> sorted(clock.seconds)
['pass 1: statistics', 'read']
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

STAGES = (
    ("read", "reader thread: decoding the input's batches"),
    ("rewards", "the reward columns as tensors, checked (nulls, NaN, integers past 2**53)"),
    ("key index", "group keys to dense group IDs"),
    ("pass 1: statistics", "per-group statistics and figures"),
    ("outcome", "normalisation and activity of every group"),
    ("pass 2: advantages", "each row's advantage"),
    ("group findings", "the summary's figures of the groups (on a thread of its own, beside pass 2)"),
    ("cast", "advantages to the output dtype, the new columns as Arrow arrays"),
    ("write", "writer thread: encoding and writing the output's columns (a splice's encoded beside it)"),
    ("copy", "copier thread: a spliced output's unchanged bytes"),
    ("commit", "waiting for the writer, fsync, moving the output into place"),
    ("summary", "the run's summary (the group findings included, where they ran on this thread)"),
)
"""Every stage a run records, in the order a run passes them, with what it covers."""


class StageClock:
    """Seconds per stage name, added from any thread."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds


_clock: StageClock | None = None


@contextlib.contextmanager
def recording() -> Iterator[StageClock]:
    """Record every stage of the runs inside the block (one at a time)."""
    global _clock
    previous, _clock = _clock, StageClock()
    try:
        yield _clock
    finally:
        _clock = previous


@contextlib.contextmanager
def timed(name: str) -> Iterator[None]:
    """Add the block's wall time to stage ``name`` (nothing when nothing records)."""
    clock = _clock
    if clock is None:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        clock.add(name, time.perf_counter() - start)


def timed_items(name: str, items: Iterator[T]) -> Iterator[T]:
    """``items``, the time each takes to produce added to stage ``name``."""
    if _clock is None:
        yield from items
        return
    while True:
        with timed(name):
            try:
                item = next(items)
            except StopIteration:
                return
        yield item
