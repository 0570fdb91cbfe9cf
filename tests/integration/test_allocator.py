"""glibc's malloc keeps large freed blocks for reuse once reuse_freed_memory() is called (the CLI
calls it): a torch temporary of a chunk's size then comes from malloc's heap, not from a fresh
mapping that faults in every page at every use."""

from __future__ import annotations

from tests.conftest import run_python

CHILD = """
import ctypes, torch
from grpo_cli.allocator import reuse_freed_memory

class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2 (2.33 and later)
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
x = torch.ones(10_000_000, dtype=torch.float64)  # 80 MB, as a chunk's float64 temporaries are

def mapped_for_a_temporary():
    before = mallinfo2().hblkhd  # bytes in blocks malloc mapped on their own
    y = x * 2.0
    mapped = mallinfo2().hblkhd - before
    del y
    return mapped

plain = mapped_for_a_temporary()
applied = reuse_freed_memory()
print(applied, plain, mapped_for_a_temporary(), mapped_for_a_temporary())
"""


def test_large_temporaries_come_from_the_heap_once_freed_blocks_are_kept():
    """Deterministic where page-fault counts are not (this VM's host reclaims idle pages, so a
    kept block may fault again): an 80 MB temporary is a block of its own, mapped afresh and
    unmapped when freed, until reuse_freed_memory(); then malloc serves it from its heap."""
    import os

    import pytest

    # glibc's defaults: a Ray session open in this process (a module's fixture) sets its workers' ones
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = run_python(CHILD, timeout=120, env=env)
    if "mallinfo2" in done.stderr:
        pytest.skip("not glibc 2.33 or later: no mallinfo2 to read malloc's state")
    assert done.returncode == 0, done.stderr
    applied, plain, first, second = done.stdout.split()
    if applied != "True":
        pytest.skip("not glibc: malloc has no such settings here")
    assert int(plain) >= 80_000_000  # mapped on its own by default
    assert int(first) == int(second) == 0  # from the heap, the second time from the first's block


def test_the_ray_engines_private_workers_start_as_the_cli_runs():
    """The private Ray instance starts its workers with glibc's malloc settings and OpenMP's wait
    policy in their environment (both are read when a process starts), and this process's
    environment is left as it was."""
    import os

    import pytest

    pytest.importorskip("ray")
    from grpo_cli.allocator import MALLOC_ENV
    from grpo_cli.engines.ray import WORKER_ENV, ray_session
    from grpo_cli.threads import IDLE_THREADS_ENV

    assert WORKER_ENV == {**MALLOC_ENV, **IDLE_THREADS_ENV}
    before = {name: os.environ.get(name) for name in WORKER_ENV}

    def settings() -> dict[str, str | None]:
        import os

        return {name: os.environ.get(name) for name in WORKER_ENV}

    with ray_session(None, num_cpus=1) as ray:
        seen = ray.get(ray.remote(settings).remote())
    assert seen == WORKER_ENV
    assert {name: os.environ.get(name) for name in WORKER_ENV} == before
