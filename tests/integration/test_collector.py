"""The console script pauses Python's garbage collector while its modules load and the engine
resumes it, with what the imports made frozen out of its reach; a library user's process is
left as it was."""

from __future__ import annotations

import gc
import json
from pathlib import Path

from tests.conftest import run_python

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_data" / "rollouts.parquet"

CHILD = """
import gc, json, sys
import grpo_cli.engines.local.engine as engine

seen = {}
plain = engine.LocalEngine.run

def run(self, output):
    seen["paused_until_the_run"] = not gc.isenabled()
    summary = plain(self, output)
    seen["collecting_in_the_run"] = gc.isenabled()
    seen["frozen"] = gc.get_freeze_count()
    return summary

engine.LocalEngine.run = run
import atexit
atexit.register(lambda: sys.stderr.write(json.dumps(seen) + "\\n"))
sys.argv = ["grpo-cli", "compute", sys.argv[1], "-o", sys.argv[2], "--force", "--quiet"]
from grpo_cli.__main__ import main
main()
"""


def test_the_console_script_collects_again_once_the_engine_runs(tmp_path: Path) -> None:
    done = run_python(CHILD, SAMPLE, tmp_path / "out.parquet", timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stderr.strip().splitlines()[-1])
    assert seen["paused_until_the_run"] and seen["collecting_in_the_run"]
    assert seen["frozen"] > 100_000  # torch's, pyarrow's and polars' objects, out of its reach


def test_the_library_leaves_the_collector_as_the_program_set_it(tmp_path: Path) -> None:
    from grpo_cli.jobs import compute_dataset

    frozen = gc.get_freeze_count()
    compute_dataset(SAMPLE, tmp_path / "out.parquet")
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    gc.disable()
    try:
        compute_dataset(SAMPLE, tmp_path / "again.parquet", force=True)
        assert not gc.isenabled() and gc.get_freeze_count() == frozen
    finally:
        gc.enable()
