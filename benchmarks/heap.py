"""Where a run's memory is: ``grpo-cli`` run as usual, its memory figures printed as it exits.

    python benchmarks/heap.py compute data.parquet -o out.parquet -g group_id --force -q

prints, on standard error, after the command's own output::

    heap 422 MiB  arrow peak 79 MiB  VmHWM 746 MiB

- ``heap``: what glibc's malloc took from the system during the run (its heap and the blocks it
  mapped on their own), torch's and numpy's arrays included. ``grpo-cli`` has malloc keep the
  blocks it frees (:mod:`grpo_cli.allocator`), so this final size is the run's peak.
- ``arrow peak``: the most Arrow's own allocator (mimalloc) held at once: the columns read and
  the output's arrays.
- ``VmHWM``: the process's peak resident memory, as ``/usr/bin/time`` reports it.

The figures come from the process itself, so they do not depend on how the machine reclaims
memory from other processes, as minor-fault counts do. Compare two versions by running each in
turn from a directory of their own (``PYTHONPATH=<checkout> python benchmarks/heap.py ...``: a
script's folder goes first on ``sys.path``, where ``python -m grpo_cli`` would put the current
directory first).
"""

from __future__ import annotations

import atexit
import ctypes
import sys


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc 2.33 and later)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _heap_bytes() -> int:
    """Bytes glibc's malloc holds from the system: its heaps and its blocks mapped on their own."""
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return int(info.arena + info.hblkhd)


def _peak_resident_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def main() -> None:
    at_start = _heap_bytes()

    def report() -> None:
        import pyarrow as pa

        heap = (_heap_bytes() - at_start) >> 20
        arrow = pa.default_memory_pool().max_memory() >> 20
        print(
            f"heap {heap} MiB  arrow peak {arrow} MiB  VmHWM {_peak_resident_kib() >> 10} MiB",
            file=sys.stderr,
        )

    atexit.register(report)  # the CLI runs the exit functions before its os._exit
    from grpo_cli.__main__ import main as grpo_cli

    sys.argv = ["grpo-cli", *sys.argv[1:]]
    grpo_cli()


if __name__ == "__main__":
    main()
