"""Pass 1's group IDs spooled to a temporary file where the input is read twice, so that pass 2
need not match the keys again."""

from __future__ import annotations

import collections
import tempfile
from collections.abc import Callable
from typing import IO

import numpy as np


class _IdSpool:
    """Per-row group IDs from pass 1, kept for pass 2: in memory, or in a temporary file."""

    def __init__(self, *, on_disk: bool) -> None:
        self._chunks: list[np.ndarray] = []
        self._file: IO[bytes] | None = None
        if on_disk:
            # Owned by the spool and closed (so deleted) in close().
            self._file = tempfile.TemporaryFile(prefix="grpo-cli-ids-")  # noqa: SIM115

    def append(self, ids: np.ndarray) -> None:
        if self._file is not None:
            self._file.write(ids.astype(np.int64, copy=False).tobytes())
        else:
            self._chunks.append(ids)

    def reader(self) -> Callable[[int], np.ndarray]:
        if self._file is not None:
            file = self._file
            file.flush()
            file.seek(0)

            def take_from_file(n: int) -> np.ndarray:
                return np.frombuffer(file.read(n * 8), dtype=np.int64)

            return take_from_file
        chunks = collections.deque(self._chunks)

        def take_from_memory(n: int) -> np.ndarray:
            # pass 2's batches need not line up with pass 1's chunks: take across them
            parts = []
            while n and chunks:
                head = chunks.popleft()
                if head.size > n:
                    chunks.appendleft(head[n:])
                    head = head[:n]
                parts.append(head)
                n -= head.size
            if len(parts) == 1:
                return parts[0]
            return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

        return take_from_memory

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
