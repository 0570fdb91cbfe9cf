"""Each command's rich help, as a user sees it at 100 columns, against a reviewed snapshot.

Help is rendered in a fresh interpreter that must not import torch or pyarrow (``--help``
answers at once). After a deliberate change to the CLI, rewrite the snapshots with
``make snapshots`` and review the diff.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SNAPSHOTS = Path(__file__).resolve().parents[1] / "snapshots"
COMMANDS = ["", "compute", "check", "inspect"]

RENDER = (
    "import sys, runpy\n"
    "sys.argv = ['grpo-cli', *sys.argv[1:], '--help']\n"
    "try:\n"
    "    runpy.run_module('grpo_cli', run_name='__main__')\n"
    "except SystemExit as exit:\n"
    "    assert exit.code in (0, None), exit.code\n"
    "heavy = sorted(m for m in ('torch', 'pyarrow', 'polars') if m in sys.modules)\n"
    "assert not heavy, f'help imported {heavy}'\n"
)


def render_help(command: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_CLI_")}
    env.update(COLUMNS="100", LINES="50", NO_COLOR="1", TERM="dumb")
    args = [command] if command else []
    done = subprocess.run(
        [sys.executable, "-c", RENDER, *args], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return "\n".join(line.rstrip() for line in done.stdout.splitlines()) + "\n"


@pytest.mark.parametrize("command", COMMANDS, ids=[c or "grpo-cli" for c in COMMANDS])
def test_help_matches_its_snapshot(command: str) -> None:
    snapshot = SNAPSHOTS / f"help-{command or 'grpo-cli'}.txt"
    text = render_help(command)
    if os.environ.get("UPDATE_SNAPSHOTS"):
        snapshot.write_text(text)
    assert snapshot.exists(), f"no snapshot {snapshot.name}: run make snapshots"
    assert text == snapshot.read_text(), f"{snapshot.name} differs from the help: review, then make snapshots"


@pytest.mark.parametrize("command", COMMANDS, ids=[c or "grpo-cli" for c in COMMANDS])
def test_help_fits_in_100_columns(command: str) -> None:
    too_wide = [line for line in render_help(command).splitlines() if len(line) > 100]
    assert not too_wide, too_wide
