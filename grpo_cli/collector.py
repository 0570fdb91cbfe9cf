"""Python's cyclic garbage collector in a ``grpo-cli`` process: paused while the modules load,
then given back with everything the imports made frozen out of its reach.

Importing torch, pyarrow, polars and typer makes about a million objects that live as long as
the process, and the allocations trigger full collections as they go, each of which walks all
of them: on the bundled sample, a quarter of a second of a two-second run (1.78 s with the
collector off, 2.06 s with it on; five fresh processes each, 2 CPUs). The console script
pauses the collector at its first instant (:func:`pause_for_start_up`); an engine, once its
modules are loaded, calls :func:`resume`: ``gc.freeze`` moves every object alive into a
generation no collection visits, and the collector runs again for what the run allocates.

A program that uses the library is not touched: :func:`resume` does nothing unless the console
script paused the collector (standard library only).

>>> resume()  # nothing was paused: the collector is as the program left it
>>> gc.isenabled()
True
"""

from __future__ import annotations

import gc

_paused = False


def pause_for_start_up() -> None:
    """The console script's first step: no collection while the modules load."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """Where the start-up paused the collector: freeze what is alive now, and collect again."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()
