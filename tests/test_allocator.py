"""glibc's malloc keeps large freed blocks for reuse once reuse_freed_memory() is called (the CLI
calls it): a torch temporary of a chunk's size then faults in its pages once, not at every use."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import resource, torch
from grpo_cli.allocator import reuse_freed_memory

x = torch.ones(10_000_000, dtype=torch.float64)  # 80 MB, as a chunk's float64 temporaries are

def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        y = x * 2.0
        del y
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

plain = faults()
applied = reuse_freed_memory()
print(applied, plain, faults())
"""


def test_large_temporaries_are_reused_instead_of_faulted_in_afresh():
    import pytest

    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    applied, plain, reused = done.stdout.split()
    if applied != "True":
        pytest.skip("not glibc: malloc has no such settings here")
    pages = 80_000_000 // 4096
    assert int(plain) > 5 * pages  # each of the 10 temporaries mapped and faulted in afresh
    assert int(reused) < 2 * pages  # the first one's pages, then the same block again
