"""Progress bars: on screen at once, moving with the rows actually done, clean after Ctrl-C."""

from __future__ import annotations

import io
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

import grpo_cli.engines.local as local_engine
from grpo_cli.arrow.keys import EncodedKeys, GroupKeyIndex
from grpo_cli.jobs import compute_dataset
from grpo_cli.options.config import ComputeConfig
from grpo_cli.run import progress as progress_module
from grpo_cli.run.progress import RichProgress


def _rollouts(path: Path, rows: int, *, group_size: int = 8) -> Path:
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(rows // group_size), group_size)
    rng.shuffle(groups)
    table = pa.table({"uid": pa.array([f"u{g}" for g in groups]), "reward": rng.random(rows)})
    pq.write_table(table, path, row_group_size=rows // 8)
    return path


class _Recorder:
    """Records every advance beside how many keys had been matched by then."""

    def __init__(self, matched: list[int]) -> None:
        self.matched = matched
        self.passes: list[tuple[str, int | None, list[tuple[int, int]]]] = []

    def start(self, description: str, total_rows: int | None) -> None:
        self.passes.append((description, total_rows, []))

    def advance(self, rows: int) -> None:
        self.passes[-1][2].append((rows, sum(self.matched)))

    def finish(self) -> None:
        pass


@pytest.mark.parametrize("in_memory", [True, False], ids=["in-memory", "streaming"])
def test_pass_one_advances_only_over_rows_whose_keys_are_matched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_memory: bool
) -> None:
    source = _rollouts(tmp_path / "in.parquet", 600_000)
    matched: list[int] = []
    encode = GroupKeyIndex.encode_runs

    def counting_encode(self: GroupKeyIndex, arrays: list[pa.ChunkedArray]) -> EncodedKeys:
        encoded = encode(self, arrays)
        matched.append(len(encoded.ids))
        return encoded

    monkeypatch.setattr(GroupKeyIndex, "encode_runs", counting_encode)
    recorder = _Recorder(matched)
    budget = 1 << 34 if in_memory else 1 << 20
    config = ComputeConfig(group_cols=("uid",), memory_budget_bytes=budget, batch_rows=50_000)
    compute_dataset(source, tmp_path / "out.parquet", config, progress=recorder)

    description, total, advances = recorder.passes[0]
    assert description == "pass 1/2: statistics" and total == 600_000
    done = 0
    for rows, matched_by_then in advances:
        done += rows
        assert done <= matched_by_then, "the bar ran ahead of the key matching"
    assert done == 600_000
    assert len(advances) >= 3, f"pass 1 moved in {len(advances)} steps: it must move with the data"
    assert max(rows for rows, _ in advances) <= local_engine.statistics.KEY_CHUNK_ROWS
    assert sum(rows for rows, _ in recorder.passes[1][2]) == 600_000


def test_bars_are_drawn_at_once_with_thousands_separators() -> None:
    screen = io.StringIO()
    bars = RichProgress(console=Console(file=screen, force_terminal=True, width=120))
    assert "starting" in screen.getvalue(), "nothing on screen before the first pass"
    bars.start("pass 1/2: statistics", 3_000_000)
    bars.advance(2_060_000)
    bars.finish()
    bars.close()
    final = screen.getvalue()
    assert "2,060,000/3,000,000" in final
    last_frame = final.rsplit("\x1b[2K", 1)[-1]
    assert "starting" not in last_frame


def test_a_run_with_no_pass_leaves_no_starting_line() -> None:
    screen = io.StringIO()
    bars = RichProgress(console=Console(file=screen, force_terminal=True, width=120))
    bars.close()
    assert "starting" not in screen.getvalue().rsplit("\x1b[2K", 1)[-1]


def test_typed_keys_are_not_echoed_while_bars_are_live(monkeypatch: pytest.MonkeyPatch) -> None:
    """An echoed ^C after a full-width line shifts the display: the line is then drawn twice."""
    controller, terminal = pty.openpty()
    with os.fdopen(terminal, "r") as tty_in:
        monkeypatch.setattr(sys, "stdin", tty_in)
        before = termios.tcgetattr(terminal)[3]
        assert before & termios.ECHO
        bars = RichProgress(console=Console(file=io.StringIO()))
        live = termios.tcgetattr(terminal)[3]
        assert not live & termios.ECHO and not live & termios.ECHOCTL
        bars.close()
        assert termios.tcgetattr(terminal)[3] == before
    os.close(controller)


def test_the_terminal_is_restored_even_when_stopping_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    controller, terminal = pty.openpty()
    with os.fdopen(terminal, "r") as tty_in:
        monkeypatch.setattr(sys, "stdin", tty_in)
        before = termios.tcgetattr(terminal)[3]
        bars = RichProgress(console=Console(file=io.StringIO()))

        def broken_stop() -> None:
            raise OSError("display gone")

        monkeypatch.setattr(bars._progress, "stop", broken_stop)
        with pytest.raises(OSError, match="display gone"):
            bars.close()
        assert termios.tcgetattr(terminal)[3] == before
    os.close(controller)


def _read_until(fd: int, needle: bytes, deadline: float) -> bytes:
    seen = b""
    while needle not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
    return seen


def test_bars_start_before_torch_is_imported(tmp_path: Path) -> None:
    """The first line goes up before the slow imports, so the screen is never blank at start."""
    source = _rollouts(tmp_path / "in.parquet", 800)
    probe = (
        "import sys\n"
        "import grpo_cli.cli as cli\n"
        "made = cli._progress_bars\n"
        "def probe(quiet):\n"
        "    print('torch loaded when bars were made:', 'torch' in sys.modules, file=sys.__stdout__)\n"
        "    return made(quiet)\n"
        "cli._progress_bars = probe\n"
        "sys.argv = ['grpo-cli', 'compute', sys.argv[1], '-o', sys.argv[2], '-g', 'uid']\n"
        "cli.main()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(source), str(tmp_path / "out.parquet")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CI": ""},
    )
    assert result.returncode == 0, result.stderr
    assert "torch loaded when bars were made: False" in result.stdout


SLOW_BATCHES = """
import sys, time
from grpo_cli.inputs import readers
batches = readers.parquet.ParquetReader.batches
def slow(self, *args):
    for batch in batches(self, *args):
        time.sleep(0.01)  # the run outlasts the signal however loaded the machine: no race with it
        yield batch
readers.parquet.ParquetReader.batches = slow
from grpo_cli.__main__ import main
sys.argv[0] = "grpo-cli"
main()
"""


@pytest.mark.skipif(not hasattr(signal, "SIGINT"), reason="needs POSIX signals")
def test_ctrl_c_under_a_terminal_stops_cleanly_and_restores_echo(tmp_path: Path) -> None:
    source = _rollouts(tmp_path / "in.parquet", 400_000)
    controller, terminal = pty.openpty()
    env = {**os.environ, "CI": "", "COLUMNS": "100"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SLOW_BATCHES,
            "compute",
            str(source),
            "-o",
            str(tmp_path / "out.parquet"),
            "-g",
            "uid",
            "--batch-rows",
            "1000",
        ],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=env,
        start_new_session=True,
    )
    try:
        seen = _read_until(controller, b"pass 1/2", time.monotonic() + 120)
        assert b"pass 1/2" in seen, seen[-400:]
        assert process.poll() is None  # still running: the signal lands in pass 1
        process.send_signal(signal.SIGINT)
        seen += _read_until(controller, b"interrupted", time.monotonic() + 60)
        assert process.wait(timeout=60) == 130
    finally:
        if process.poll() is None:
            process.kill()
    assert b"no output was written" in seen
    assert termios.tcgetattr(terminal)[3] & termios.ECHO, "echo was left off after Ctrl-C"
    assert not (tmp_path / "out.parquet").exists()
    os.close(controller)
    os.close(terminal)


def test_no_progress_is_silent() -> None:
    quiet = progress_module.NoProgress()
    quiet.start("pass", 3)
    quiet.advance(3)
    quiet.finish()


@pytest.mark.parametrize(("output", "bars"), [("-", False), ("out.jsonl", True)])
def test_no_bars_over_rows_written_to_the_same_terminal(tmp_path: Path, output: str, bars: bool) -> None:
    """``-o -`` to a terminal: the rows go to the screen the bars would draw on, so none are
    drawn; to a file under the same terminal, the bars are drawn."""
    source = _rollouts(tmp_path / "in.parquet", 800)
    seen = tmp_path / "bars.txt"
    probe = (
        "import sys\n"
        "import grpo_cli.cli as cli\n"
        "made = cli._progress_bars\n"
        "def probe(quiet):\n"
        f"    open({str(seen)!r}, 'w').write(str(not quiet))\n"
        "    return made(quiet)\n"
        "cli._progress_bars = probe\n"
        "sys.argv = ['grpo-cli', 'compute', sys.argv[1], '-o', sys.argv[2], '-g', 'uid']\n"
        "cli.main()\n"
    )
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", probe, str(source), output],
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
            cwd=tmp_path,
            env={**os.environ, "CI": "", "COLUMNS": "100"},
        )
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:
            _read_until(controller, b"\x00", time.monotonic() + 0.5)  # drain the screen while it runs
        assert process.wait(timeout=10) == 0
    finally:
        os.close(controller)
        os.close(terminal)
    assert seen.read_text() == str(bars)
