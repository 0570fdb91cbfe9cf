"""What every reader shares: the protocol, rows named by their index, read errors, batches
checked as read, and reading ahead on a second thread."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Generator, Iterator
from typing import Any, Protocol, TypeVar

import pyarrow as pa

from grpo_cli.errors import GrpoError, first_line
from grpo_cli.inputs.sources import Shard
from grpo_cli.stages import timed_items


class FormatReader(Protocol):
    """What grpo-cli asks of a format: each method takes the shard it reads."""

    def schema(self, shard: Shard) -> pa.Schema:
        """The columns (text formats: as inferred from the first block)."""

    def provenance(self, shard: Shard) -> dict[str, Any] | None:
        """grpo-cli's provenance entry, where the format can hold one."""

    def memory_bytes(self, shard: Shard) -> int:
        """Roughly how much memory the shard takes once decoded."""

    def rows(self, shard: Shard) -> int | None:
        """The row count, where the file says so cheaply."""

    def batches(self, shard: Shard, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """Record batches of about ``batch_rows`` rows (text formats: one block each)."""

    def where(self, shard: Shard, row: int) -> str:
        """Where the 0-based data ``row`` is, as error messages name it."""


class _Rows:
    """Rows named by their index, no provenance: the base of every reader but the text ones' ``where``."""

    def provenance(self, shard: Shard) -> dict[str, Any] | None:
        return None

    def rows(self, shard: Shard) -> int | None:
        return None

    def where(self, shard: Shard, row: int) -> str:
        return f"{shard.display}, row {row}"


_Item = TypeVar("_Item")


def read_ahead(items: Iterator[_Item], *, depth: int = 1) -> Generator[_Item, None, None]:
    """``items``, produced on a second thread up to ``depth`` items ahead of the consumer.

    Decoding the next batch (pyarrow releases the GIL) overlaps the consumer's work on
    this one. The producer's exception is raised to the consumer where the item would
    have come; a consumer that stops early stops the producer, which closes ``items``.
    The consumer waits for the producer's current item, at most
    :data:`PRODUCER_GRACE_SECONDS` where the run was stopped by Ctrl-C or SIGTERM (it ends on
    time, whatever one item costs): the producer, a daemon thread, stops at its next item.

    >>> list(read_ahead(iter(range(5))))
    [0, 1, 2, 3, 4]
    """
    slots: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(entry: tuple[bool, Any]) -> bool:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                slots.put(entry, timeout=0.05)
                return True
        return False

    def produce() -> None:
        try:
            for item in timed_items("read", items):
                if not offer((False, item)):
                    return
            offer((True, None))
        except BaseException as exc:  # raised again on the consumer's thread
            offer((True, exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="grpo-cli-reader", daemon=True)
    thread.start()
    interrupted = False
    try:
        while True:
            finished, value = slots.get()
            if finished:
                if value is not None:
                    raise value
                return
            yield value
    except (KeyboardInterrupt, SystemExit):
        interrupted = True
        raise
    finally:
        stop.set()
        # Stopped by Ctrl-C or SIGTERM: end on time, the daemon stops at its next item.
        # Otherwise wait for it: a library caller running jobs in a loop keeps no thread.
        thread.join(PRODUCER_GRACE_SECONDS if interrupted else None)


PRODUCER_GRACE_SECONDS = 1.0


def _checked(shard: Shard, batches: Iterator[pa.RecordBatch], what: str) -> Iterator[pa.RecordBatch]:
    """``batches``, a decoding error becoming one line naming the shard."""
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as exc:
            raise read_error(shard.display, exc, f"corrupt {what} data") from None
        try:
            # memory-mapped bytes from another writer: a bad offset would be read as an address
            batch.validate(full=True)
        except (pa.ArrowException, ValueError) as exc:
            raise GrpoError(f"{shard.display}: corrupt {what} data ({first_line(exc)})") from None
        yield batch


def read_error(display: str, exc: BaseException, what: str) -> GrpoError:
    """A read error of the file shown as ``display``, as one line; an encrypted file says so,
    whichever part of it failed."""
    text = first_line(exc)
    if "crypt" in text.lower():
        return GrpoError(
            f"{display}: an encrypted Parquet file; grpo-cli reads no encrypted data (decrypt it first)"
        )
    return GrpoError(f"{display}: {what} ({text})")
