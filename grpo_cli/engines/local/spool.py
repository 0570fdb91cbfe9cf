"""Pass 1's group IDs kept for pass 2 (in memory, or in a temporary file where the input is read
twice), so that pass 2 need not match the keys again.

Each chunk of IDs is kept packed, in the smaller of two forms: its runs (each ID once, with
where its run ends: the rows of a group are consecutive in sorted or grouped input, so a chunk
of 2M rows in groups of 8 keeps 250k runs) or its IDs in the narrowest integer type that holds
them. Ten million rows' IDs took 80 MB as int64, the run's largest block of memory after the
input itself; packed as runs (1.25M groups of 8: an int32 ID and an int64 end each) they take
15 MB, otherwise 40 MB. Pass 2 takes them back as int64, a batch at a time.

>>> spool = _IdSpool(on_disk=False)
>>> spool.append(np.array([0, 0, 0, 1, 1, 2], dtype=np.int64))
>>> spool.append(np.array([2, 7, 3], dtype=np.int64))
>>> take = spool.reader()
>>> take(4).tolist(), take(4).tolist(), take(4).tolist()
([0, 0, 0, 1], [1, 2, 2, 7], [3])
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

import numpy as np

MIN_MEAN_RUN = 4
"""Runs are kept where a chunk's runs average at least this many rows: each run costs an ID and
an end, against one narrow ID per row."""


@dataclass(frozen=True)
class _PackedIds:
    """One chunk's IDs: ``values`` (one per run where ``ends`` is set, else one per row) and
    ``ends`` (int64, each run's end row within the chunk, increasing; ``None``: no runs)."""

    values: np.ndarray
    ends: np.ndarray | None

    @property
    def rows(self) -> int:
        if self.ends is None:
            return int(self.values.size)
        return int(self.ends[-1]) if self.ends.size else 0

    @classmethod
    def of(cls, ids: np.ndarray, runs: tuple[np.ndarray, np.ndarray] | None = None) -> _PackedIds:
        """``ids`` (non-negative integers) packed in the smaller form; ``runs``, where the key
        index found them (each run's ID and first row), spare finding them again."""
        if ids.size < 2:
            return cls(_narrow(ids), None)
        values, starts = runs if runs is not None else _runs_of(ids)
        if starts.size > ids.size // MIN_MEAN_RUN:
            return cls(_narrow(ids), None)
        return cls(_narrow(values), np.append(starts[1:], ids.size))

    def take(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start`` to ``stop - 1`` as int64."""
        if self.ends is None:
            return self.values[start:stop].astype(np.int64)
        first, last = np.searchsorted(self.ends, [start, stop - 1], side="right")
        ends = self.ends[first : last + 1].clip(max=stop)
        lengths = np.diff(ends, prepend=start)
        return np.repeat(self.values[first : last + 1].astype(np.int64), lengths)

    def write(self, file: IO[bytes]) -> None:
        ends = np.zeros(0, np.int64) if self.ends is None else self.ends
        header = np.array([self.values.size, self.values.dtype.itemsize, ends.size, self.ends is not None])
        file.write(header.astype(np.int64).tobytes())
        file.write(self.values.tobytes())
        file.write(ends.tobytes())

    @classmethod
    def read(cls, file: IO[bytes]) -> _PackedIds | None:
        """The next chunk :meth:`write` wrote, or ``None`` at the end of the file."""
        header = file.read(4 * 8)
        if not header:
            return None
        count, itemsize, ends_count, has_runs = np.frombuffer(header, dtype=np.int64).tolist()
        dtype = np.int32 if itemsize == 4 else np.int64
        values = np.frombuffer(file.read(count * itemsize), dtype=dtype)
        ends = np.frombuffer(file.read(ends_count * 8), dtype=np.int64)
        return cls(values, ends if has_runs else None)


def _runs_of(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each run of one ID in ``ids`` (two or more): its ID and its first row."""
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    return ids[starts], starts


def _narrow(ids: np.ndarray) -> np.ndarray:
    """``ids`` (non-negative) as int32 where they fit."""
    return ids.astype(np.int32) if ids.size and int(ids.max()) <= np.iinfo(np.int32).max else ids


class _IdSpool:
    """Per-row group IDs from pass 1, kept packed for pass 2: in memory, or in a temporary file."""

    def __init__(self, *, on_disk: bool) -> None:
        self._chunks: list[_PackedIds] = []
        self._file: IO[bytes] | None = None
        if on_disk:
            # Owned by the spool and closed (so deleted) in close().
            self._file = tempfile.TemporaryFile(prefix="grpo-cli-ids-")  # noqa: SIM115

    def append(self, ids: np.ndarray, runs: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Keep one chunk of IDs (a non-negative integer array), after those kept before;
        ``runs``: the runs of one ID they come in, where known (each run's ID and first row)."""
        packed = _PackedIds.of(ids, runs)
        if self._file is not None:
            packed.write(self._file)
        else:
            self._chunks.append(packed)

    def reader(self) -> Callable[[int], np.ndarray]:
        """A function that takes the next ``n`` rows' IDs (int64) on each call, from the first row
        on: pass 2's batches need not line up with pass 1's chunks. Each call of ``reader`` starts
        from the first row again."""
        chunks = self._chunks_from_start()
        current: _PackedIds | None = None
        offset = 0

        def take(n: int) -> np.ndarray:
            nonlocal current, offset
            parts = []
            while n:
                if current is None or offset == current.rows:
                    current, offset = next(chunks, None), 0
                    if current is None:
                        break
                    continue
                stop = min(current.rows, offset + n)
                parts.append(current.take(offset, stop))
                n -= stop - offset
                offset = stop
            if len(parts) == 1:
                return parts[0]
            return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

        return take

    def _chunks_from_start(self) -> Iterator[_PackedIds]:
        if self._file is None:
            return iter(self._chunks)
        file = self._file
        file.flush()
        file.seek(0)
        return iter(lambda: _PackedIds.read(file), None)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
