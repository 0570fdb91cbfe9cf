"""OpenMP's idle threads asleep between torch operations, not spinning on a core a run needs.

torch's CPU operations run on OpenMP (GNU libgomp in the Linux wheels). After each parallel
operation, libgomp's worker threads spin, waiting for the next one, before they sleep: about
8 ms a time measured on a 2-core AMD EPYC (20 operations 10 ms apart cost the worker 165 ms of
CPU). A run's reader and writer threads need that core, and a run makes thousands of such
operations, so a file-to-file job was 12% slower than with the threads asleep, while the kernel
alone, which keeps every core busy, ran as fast either way. What it costs: each parallel
operation wakes the sleeping workers (about 80 us here), so a long row of small operations is
slower; the kernel takes its groups 2**20 at a time, not in smaller chunks, for that reason.

:func:`let_idle_threads_sleep` sets ``OMP_WAIT_POLICY=PASSIVE``, which libgomp reads once, when
torch loads it: so it works only before ``import torch``. ``grpo-cli`` calls it when a command
runs, before its work imports torch, and the Ray engine's private instance starts its workers
with :data:`IDLE_THREADS_ENV`. A setting the user made is kept. A program that uses the library
sets the variable in its environment itself.

>>> isinstance(let_idle_threads_sleep(), bool)
True
"""

from __future__ import annotations

import os
import sys

WAIT_POLICY = "OMP_WAIT_POLICY"
IDLE_THREADS_ENV = {WAIT_POLICY: "PASSIVE"}
"""The environment that puts OpenMP's idle threads to sleep at once (read when OpenMP loads)."""


def let_idle_threads_sleep() -> bool:
    """Set :data:`IDLE_THREADS_ENV` unless the environment sets the policy already, and torch is
    not imported yet; whether the environment asks for sleeping threads (where torch was
    imported first, OpenMP read it then)."""
    if "torch" not in sys.modules:
        os.environ.setdefault(WAIT_POLICY, IDLE_THREADS_ENV[WAIT_POLICY])
    return os.environ.get(WAIT_POLICY, "").strip().upper() == "PASSIVE"
