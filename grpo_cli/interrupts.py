"""Stop signals (Ctrl-C's SIGINT, SIGTERM, SIGHUP) as a run sees them (standard library only).

The CLI's handler records the signal (:func:`request`), then raises ``KeyboardInterrupt``.
A signal handler runs between any two bytecodes of the main thread, inside an at-fork
callback or a finaliser too, where Python prints "Exception ignored" and goes on: the run
then went on to the end and exited 0 (seen with Ray, which forks as it starts). The record
stays, and the run's safe points (each batch of a pass, the output's commit, a Ray instance
started) raise it again with :func:`raise_if_requested`.

>>> clear(); raise_if_requested()  # nothing asked for: nothing raised
>>> request(15)
>>> try:
...     raise_if_requested()
... except KeyboardInterrupt:
...     print("stopped")
stopped
>>> clear()
"""

from __future__ import annotations

_requested: int | None = None


def request(signum: int) -> None:
    """Record that the run was asked to stop by ``signum``."""
    global _requested
    _requested = signum


def clear() -> None:
    """Forget any stop asked for before this run (a library caller's earlier one)."""
    global _requested
    _requested = None


def raise_if_requested() -> None:
    """Raise ``KeyboardInterrupt`` where a stop was asked for, even if the handler's own was lost."""
    if _requested is not None:
        raise KeyboardInterrupt
