"""torch's OpenMP threads sleep when idle once a grpo-cli command has run (grpo_cli.threads): they
no longer spin on the core that a run's reader and writer threads need."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "rollouts.parquet"

CHILD = """
import os, resource, sys, time
how = sys.argv[1]
if how == "cli":  # a whole command, as a user runs it
    from typer.testing import CliRunner
    from grpo_cli.cli import app
    result = CliRunner().invoke(app, ["check", sys.argv[2], "--reward-col", "correct", "--quiet"])
    assert result.exit_code in (0, 1), result.output
elif how == "call":
    from grpo_cli.threads import let_idle_threads_sleep
    assert let_idle_threads_sleep()
import torch

def cpu_of_other_threads():
    process, main = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_THREAD)
    return process.ru_utime + process.ru_stime - main.ru_utime - main.ru_stime

x = torch.ones(1 << 22)
x.add_(1)  # the worker threads start
before = cpu_of_other_threads()
for _ in range(20):  # a parallel operation, then the main thread idles 10 ms
    x.add_(1)
    time.sleep(0.01)
print(torch.get_num_threads(), os.environ.get("OMP_WAIT_POLICY"), cpu_of_other_threads() - before)
"""


def idle_cpu_seconds(how: str, env: dict[str, str]) -> tuple[int, str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, how, str(SAMPLE)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    threads, policy, seconds = done.stdout.split()
    return int(threads), policy, float(seconds)


@pytest.fixture
def plain_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.pop("OMP_NUM_THREADS", None)
    return env


def test_after_a_command_the_idle_openmp_threads_sleep_instead_of_spinning(plain_env):
    """Twenty operations 10 ms apart: by default the worker threads spin between them (165 ms
    of CPU on a 2-core AMD EPYC); after a grpo-cli command in the same process, and after
    let_idle_threads_sleep(), they sleep (about 10 ms: their share of the operations)."""
    threads, policy, spinning = idle_cpu_seconds("plain", plain_env)
    if threads < 2:
        pytest.skip("torch runs one thread here: no idle OpenMP thread")
    assert policy == "None"
    if spinning < 0.04:
        pytest.skip(f"OpenMP's idle threads do not spin here ({spinning * 1000:.0f} ms)")
    for how in ("cli", "call"):
        # a busy machine only adds CPU to the operations' share: the quietest of three tries
        # (threads that spin would spin in every one of them)
        tries = []
        for _ in range(3):
            _, policy, asleep = idle_cpu_seconds(how, plain_env)
            assert policy == "PASSIVE"
            tries.append(asleep)
            if asleep < spinning / 4:
                break
        assert min(tries) < spinning / 4, (how, tries, spinning)


def test_a_policy_the_user_set_is_kept(monkeypatch):
    from grpo_cli import threads

    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert threads.let_idle_threads_sleep() is False
    assert os.environ["OMP_WAIT_POLICY"] == "active"
    monkeypatch.setenv("OMP_WAIT_POLICY", " passive ")
    assert threads.let_idle_threads_sleep() is True


def test_nothing_is_set_once_torch_is_imported(monkeypatch):
    """OpenMP has read its settings by then: setting one would only mislead (and reach child
    processes the caller did not ask about)."""
    import torch  # noqa: F401

    from grpo_cli import threads

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert threads.let_idle_threads_sleep() is False
    assert "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.delitem(sys.modules, "torch")
    assert threads.let_idle_threads_sleep() is True
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
