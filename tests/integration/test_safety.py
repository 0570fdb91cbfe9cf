"""Issue #10: no run may lose a user's files, corrupt a group, or pass an empty dataset.

One test (or more) per reported case, plus their neighbours, and a property test that no
combination of input and output paths makes grpo-cli write inside or over an input.
"""

from __future__ import annotations

import decimal
import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_cli import jobs
from grpo_cli.engines import local as local_engine
from grpo_cli.inputs.protected import ProtectedInputs
from grpo_cli.options.advantage import RewardSpec
from grpo_cli.outputs.guard import WriteGuard
from tests.conftest import one_line_error, rollout_rows, run_python, write_jsonl, write_parquet

GRPO_CLI = [sys.executable, "-m", "grpo_cli"]


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (links not followed) with a digest of its bytes."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = Path(root) / name
            rel = str(path.relative_to(folder))
            found[rel] = "link" if path.is_symlink() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture
def shards(tmp_path):
    folder = tmp_path / "data" / "shards"
    folder.mkdir(parents=True)
    rows = rollout_rows(n_groups=8, seed=3)
    write_parquet(folder / "a.parquet", rows[:20])
    write_parquet(folder / "b.parquet", rows[20:])
    return folder


def run_cli(*args, env=None, **kwargs):
    return subprocess.run(
        [*GRPO_CLI, *map(str, args)], capture_output=True, text=True, env=env, timeout=120, **kwargs
    )


# --------------------------------------------------------------------------- data loss


@pytest.mark.parametrize(
    ("input_spec", "output"),
    [
        ("data/shards/*.parquet", "data"),  # contains the inputs (the reported case)
        ("data/shards", "data"),
        ("data/shards", "data/shards"),  # is the input directory
        ("data/shards", "data/shards/out"),  # inside the input directory
        ("data/shards", "data/shards/out.parquet"),
        ("data/shards/a.parquet", "data/shards/a.parquet"),  # is the input
        ("data/shards/*.parquet", "data/shards/b.parquet"),
        ("data/shards/a.parquet", "data/shards/../shards/a.parquet"),
    ],
)
@pytest.mark.parametrize("engine", ["local", "ray"])
def test_output_touching_an_input_is_refused_whatever_force_says(
    cli, tmp_path, shards, monkeypatch, input_spec, output, engine
):
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    result = cli("compute", input_spec, "-o", output, "--force", "--engine", engine)
    if engine == "ray" and output.endswith(".parquet"):
        one_line_error(result, 2, "writes a directory")
    else:
        one_line_error(result, 2, "refusing to write there")
    assert tree(tmp_path) == before


def test_output_through_a_symlink_to_the_input_is_refused(cli, tmp_path, shards):
    link = tmp_path / "alias"
    link.symlink_to(shards, target_is_directory=True)
    before = tree(tmp_path)
    one_line_error(cli("compute", shards, "-o", link, "--force"), 2, "refusing to write there")
    one_line_error(cli("compute", shards / "a.parquet", "-o", link / "a.parquet", "--force"), 2)
    hard = tmp_path / "hard.parquet"
    os.link(shards / "a.parquet", hard)
    one_line_error(cli("compute", shards / "a.parquet", "-o", hard, "--force"), 2, "overwrite the input")
    assert tree(tmp_path) == {**before, "hard.parquet": before["data/shards/a.parquet"]}


def test_force_replaces_only_grpo_clis_own_shards(cli, tmp_path, shards):
    out = tmp_path / "results"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "keep").mkdir()
    (out / "keep" / "x.parquet").write_bytes(b"x")
    result = cli("compute", shards, "-o", out, "--force")
    one_line_error(result, 2, "holds files grpo-cli did not write", "notes.txt")
    assert (out / "notes.txt").read_text() == "mine" and (out / "keep" / "x.parquet").exists()
    # a folder of someone else's Parquet files is theirs too
    (out / "notes.txt").unlink()
    (out / "keep" / "x.parquet").unlink()
    (out / "keep").rmdir()
    write_parquet(out / "a.parquet", rollout_rows(n_groups=2))
    one_line_error(cli("compute", shards, "-o", out, "--force"), 2, "a.parquet")
    (out / "a.parquet").unlink()
    assert cli("compute", shards, "-o", out).exit_code == 0  # an empty folder is fine
    assert cli("compute", shards, "-o", out).exit_code == 2  # now grpo-cli's: needs --force
    assert cli("compute", shards, "-o", out, "--force").exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == ["a.parquet", "b.parquet"]


@pytest.mark.parametrize("command", ["compute", "check"])
def test_summary_json_never_replaces_an_input_or_the_output(cli, tmp_path, shards, command):
    source = shards / "a.parquet"
    out = tmp_path / "out.parquet"
    before = tree(tmp_path)
    output_args = ["-o", out] if command == "compute" else []
    one_line_error(
        cli(command, source, *output_args, "--summary-json", source, "--force"), 2, "overwrite the input"
    )
    one_line_error(
        cli(command, shards, *output_args, "--summary-json", shards / "s.json"), 2, "inside the input"
    )
    assert tree(tmp_path) == before
    if command == "compute":
        one_line_error(
            cli(command, source, "-o", out, "--summary-json", out, "--force"), 2, "of the same run"
        )
        out_dir = tmp_path / "outdir"
        one_line_error(cli(command, source, "-o", out_dir, "--summary-json", out_dir / "s.json"), 2)
        assert tree(tmp_path) == before
    summary = tmp_path / "summary.json"
    summary.write_text("precious")
    one_line_error(cli(command, source, *output_args, "--summary-json", summary), 2, "pass --force")
    assert summary.read_text() == "precious"
    assert cli(command, source, *output_args, "--summary-json", summary, "--force").exit_code == 0
    assert json.loads(summary.read_text())["rows"] == 20


def test_a_second_run_on_the_same_output_is_refused(cli, tmp_path, shards):
    out = tmp_path / "out.parquet"
    with WriteGuard(ProtectedInputs()) as guard:  # another run holds the output
        guard.claim(out, directory=False, force=False)
        one_line_error(cli("compute", shards, "-o", out, "--force"), 2, "another grpo-cli run")
        one_line_error(cli("compute", shards, "-o", tmp_path / "o2.parquet", "--summary-json", out), 2)
    assert cli("compute", shards, "-o", out).exit_code == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # lock removed


def test_concurrent_processes_one_wins_the_other_is_refused(tmp_path, shards):
    out = tmp_path / "out.parquet"
    runs = [
        subprocess.Popen(
            [*GRPO_CLI, "compute", str(shards), "-o", str(out)], stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    codes = sorted(run.wait(timeout=120) for run in runs)
    errors = [run.stderr.read() for run in runs if run.stderr is not None]
    assert codes == [0, 2, 2], errors
    assert pq.read_table(out).num_rows == 33


def test_output_that_appears_during_the_run_is_kept(tmp_path, shards):
    out = tmp_path / "out.parquet"

    class Appear:
        def start(self, description, total_rows):
            if "pass 2" in description:
                out.write_text("someone else's")

        def advance(self, rows):
            pass

        def finish(self):
            pass

    with pytest.raises(ValueError, match="appeared while grpo-cli ran"):
        jobs.compute_dataset(shards, out, progress=Appear())
    assert out.read_text() == "someone else's"


# --------------------------------------------------------------------------- silently wrong results


@pytest.mark.parametrize(
    ("lines", "bad_line", "value"),
    [
        (['{"group_id": 18446744073709551615, "reward": 1.0}', '{"group_id": 1, "reward": 0.0}'], 1, None),
        (['{"group_id": 9223372036854775808, "reward": 1.0}'], 1, None),
        (
            [
                '{"group_id": 1, "reward": 1.0}',
                '{"group_id": 9007199254740993, "reward": 0.0}',
                '{"group_id": 1.5, "reward": 0.5}',
            ],
            2,
            "9007199254740993",
        ),
    ],
)
def test_jsonl_integers_beyond_float64_are_refused_naming_the_line(cli, tmp_path, lines, bad_line, value):
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    message = one_line_error(cli("compute", source, "-o", tmp_path / "o.parquet"), 2, f"line {bad_line}")
    assert "cannot be kept exactly" in message and (value is None or value in message)
    assert not (tmp_path / "o.parquet").exists()


def test_jsonl_integer_ids_that_float64_holds_exactly_are_fine(cli, tmp_path):
    rows = [{"group_id": 2**53 - i // 2, "reward": float(i % 2)} for i in range(8)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    assert cli("compute", source, "-o", tmp_path / "o.parquet").exit_code == 0
    table = pq.read_table(tmp_path / "o.parquet")
    assert table.schema.field("group_id").type == pa.int64()
    assert table.column("group_id").to_pylist() == [r["group_id"] for r in rows]


@pytest.fixture(params=["dict", "hashed"])
def key_path(request, monkeypatch):
    """Both ways of matching keys: a Python dict (small inputs) and hashing (large ones)."""
    monkeypatch.setattr(local_engine.engine, "SMALL_INPUT_ROWS", 10**9 if request.param == "dict" else -1)
    return request.param


def test_nan_keys_are_refused_at_every_size(cli, tmp_path, key_path):
    source = write_parquet(
        tmp_path / "in.parquet",
        [{"group_id": float("nan") if i % 3 == 0 else 1.0, "reward": float(i % 2)} for i in range(12)],
    )
    one_line_error(cli("compute", source, "-o", tmp_path / "o.parquet"), 2, "row 0", "is NaN")


def test_list_keys_holding_a_nan_are_refused_at_every_size(cli, tmp_path, key_path):
    """Python's NaN never equals itself: matched in a dict, each such row was a group of its own."""
    output = tmp_path / "o.parquet"
    prompts = [[{"role": "user", "weight": 1.0}], [{"role": "user", "weight": float("nan")}]]
    source = write_parquet(
        tmp_path / "in.parquet", [{"prompt": prompts[i // 4 % 2], "reward": float(i % 2)} for i in range(12)]
    )
    line = one_line_error(cli("compute", source, "-o", output, "--group-col", "prompt"), 2, "row 4")
    assert line.endswith(
        "key 'prompt' holds a NaN (4 NaN-holding key(s) in this chunk); NaN-holding keys cannot be grouped"
    )
    assert not output.exists()


@pytest.mark.parametrize(
    "make",
    [
        lambda i: pa.array([i // 2], pa.time64("ns")),
        lambda i: pa.array([i // 2], pa.timestamp("ns")),
        lambda i: pa.array([i // 2], pa.duration("ns")),
    ],
    ids=["time64", "timestamp", "duration"],
)
def test_keys_one_nanosecond_apart_are_distinct_groups_at_every_size(cli, tmp_path, key_path, make):
    table = pa.table(
        {
            "group_id": pa.concat_arrays([make(i) for i in range(8)]),
            "reward": pa.array([0.0, 1.0] * 4),
        }
    )
    pq.write_table(table, tmp_path / "in.parquet")
    result = cli(
        "compute", tmp_path / "in.parquet", "-o", tmp_path / "o.parquet", "--summary-json", "-", "-q"
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["groups"] == 4
    written = pq.read_table(tmp_path / "o.parquet")
    assert written.column("group_id").equals(table.column("group_id"))


def test_negative_zero_and_zero_keys_are_one_group_at_every_size(cli, tmp_path, key_path):
    source = write_parquet(
        tmp_path / "in.parquet", [{"group_id": [0.0, -0.0][i % 2], "reward": float(i)} for i in range(4)]
    )
    result = cli("compute", source, "-o", tmp_path / "o.parquet", "--summary-json", "-", "-q")
    assert json.loads(result.stdout)["groups"] == 1


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ([1, 1, 2, 2], ["01", "1", "2", "2"]),
        ([1, 1, 2, 2], [1.0, 1.0, 2.0, 2.0]),
        (["a", "a", "b", "b"], [b"a", b"a", b"b", b"b"]),
    ],
)
def test_shards_with_key_columns_of_different_types_are_refused(cli, tmp_path, first, second):
    folder = tmp_path / "mixed"
    folder.mkdir()
    write_parquet(folder / "a.parquet", [{"group_id": k, "reward": float(i)} for i, k in enumerate(first)])
    write_parquet(folder / "b.parquet", [{"group_id": k, "reward": float(i)} for i, k in enumerate(second)])
    message = one_line_error(cli("compute", folder, "-o", tmp_path / "out"), 2, "a.parquet", "b.parquet")
    assert "group column 'group_id'" in message
    assert not (tmp_path / "out").exists()


def test_shards_with_int32_and_int64_keys_are_one_kind(cli, tmp_path):
    folder = tmp_path / "ints"
    folder.mkdir()
    for name, dtype in (("a", pa.int32()), ("b", pa.int64())):
        pq.write_table(
            pa.table({"group_id": pa.array([1, 1, 2, 2], dtype), "reward": [0.0, 1.0, 0.0, 1.0]}),
            folder / f"{name}.parquet",
        )
    result = cli("compute", folder, "-o", tmp_path / "out", "--summary-json", "-", "-q")
    assert result.exit_code == 0 and json.loads(result.stdout)["groups"] == 2


def test_a_literal_path_with_glob_characters_is_read_as_that_file(cli, tmp_path):
    rows = rollout_rows(n_groups=3)
    write_parquet(tmp_path / "run[1].parquet", rows)
    write_parquet(tmp_path / "run1.parquet", rollout_rows(n_groups=5))  # what the pattern matches
    result = cli("compute", tmp_path / "run[1].parquet", "-o", tmp_path / "o.parquet", "--summary-json", "-")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["rows"] == len(rows)


def test_a_folder_with_data_in_subfolders_is_refused_not_half_read(cli, tmp_path):
    folder = tmp_path / "ds"
    (folder / "year=2024").mkdir(parents=True)
    write_parquet(folder / "a.parquet", rollout_rows(n_groups=2, seed=1))
    write_parquet(folder / "year=2024" / "b.parquet", rollout_rows(n_groups=2, seed=2))
    one_line_error(cli("compute", folder, "-o", tmp_path / "o.parquet"), 2, "subfolders", "year=2024", "**")
    result = cli("compute", f"{folder}/**/*.parquet", "-o", tmp_path / "all", "--summary-json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["input"]["shards"] == 2


def test_a_data_file_of_another_format_is_refused_not_skipped(cli, tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    write_parquet(folder / "a.parquet", rollout_rows(n_groups=2))
    (folder / "b.tsv").write_text("group_id\treward\n1\t0\n")
    (folder / "README.md").write_text("notes")  # not data: ignored
    one_line_error(cli("compute", folder, "-o", tmp_path / "o.parquet"), 2, "b.tsv")
    (folder / "b.tsv").unlink()
    (folder / "b.csv").write_text("group_id,reward\n1,0\n")  # read, but not beside Parquet shards
    one_line_error(cli("compute", folder, "-o", tmp_path / "o.parquet"), 2, "csv (b.csv, ...)", "parquet")
    one_line_error(cli("compute", f"{folder}/*", "-o", tmp_path / "o.parquet"), 2, "b.csv")


def test_check_fails_on_an_empty_input_and_missing_columns_stay_exit_2(cli, tmp_path):
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist(rollout_rows()).slice(0, 0), empty)
    result = cli("check", empty, "--min-group-size", "2", "--summary-json", "-")
    assert result.exit_code == 1
    checks = json.loads(result.stdout)["checks"]
    assert checks[0] == {
        "name": "rows",
        "value": 0,
        "op": ">=",
        "bound": 1,
        "passed": False,
        "value_text": "0",
        "bound_text": ">= 1",
    }
    assert cli("check", empty).exit_code == 1  # no check asked: still not a pass
    one_line_error(cli("check", empty, "-r", "missing"), 2, "no column 'missing'")
    assert cli("check", "-", "--min-groups", "0", input="").exit_code == 1
    (tmp_path / "empty.jsonl").write_text("")
    assert cli("check", tmp_path / "empty.jsonl").exit_code == 1


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"group_id": "\xff\xfe", "reward": 1.0}', "invalid UTF-8"),
        (b'{"group_id": "\\ud800", "reward": 1}', "surrogate"),
    ],
)
def test_jsonl_with_invalid_unicode_is_refused_naming_the_line(cli, tmp_path, line, reason):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"group_id": "a", "reward": 1.0}\n' + line + b"\n")
    one_line_error(cli("compute", source, "-o", tmp_path / "o.parquet"), 2, "line 2", reason)
    assert not (tmp_path / "o.parquet").exists()


def test_huge_and_tiny_rewards_end_to_end(cli, tmp_path):
    rows = [
        {"group_id": g, "reward": r}
        for g, group in enumerate([[1e300, 3e300], [1e-300, 3e-300]])
        for r in group
    ]
    source = write_parquet(tmp_path / "in.parquet", rows)
    assert cli("compute", source, "-o", tmp_path / "o.parquet").exit_code == 0
    advantages = pq.read_table(tmp_path / "o.parquet").column("advantage").to_pylist()
    assert advantages[:2] == pytest.approx([-1.0, 1.0], rel=1e-12)
    assert advantages[2:] == pytest.approx([-1e-294, 1e-294], rel=1e-12, abs=0)


# --------------------------------------------------------------------------- exit codes and the disk


def test_every_path_is_checked_before_any_work(cli, tmp_path, shards):
    out = tmp_path / "out.parquet"
    result = cli("compute", shards, "-o", out, "--summary-json", tmp_path / "no" / "such" / "s.json")
    one_line_error(result, 2, "does not exist")
    assert not out.exists()


def test_a_summary_failing_after_the_commit_says_the_output_was_written(cli, tmp_path, shards, monkeypatch):
    from grpo_cli.errors import GrpoError

    def disk_full(*args, **kwargs):
        raise GrpoError("s.json: cannot write the summary (No space left on device)")

    monkeypatch.setattr(jobs, "write_text", disk_full)
    out = tmp_path / "out.parquet"
    message = one_line_error(cli("compute", shards, "-o", out, "--summary-json", tmp_path / "s.json"), 3)
    assert "was written" in message and "No space left" in message
    assert pq.read_table(out).num_rows == 33


def test_an_interrupt_after_the_commit_does_not_claim_nothing_was_written(cli, tmp_path, shards, monkeypatch):
    from grpo_cli import cli as cli_module

    def stalled(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_module, "_report", stalled)
    out = tmp_path / "out.parquet"
    message = one_line_error(cli("compute", shards, "-o", out), 130)
    assert "after the output" in message and "was written" in message
    assert out.exists()


def test_closed_stdout_with_summary_to_stdout_is_refused_before_any_work(tmp_path, shards):
    out = tmp_path / "out.parquet"
    result = subprocess.run(
        f"{sys.executable} -m grpo_cli compute {shards} -o {out} --summary-json - >&-",
        shell=True,
        capture_output=False,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "standard output is closed" in result.stderr
    assert not out.exists()


def test_a_closed_pipe_on_stdout_ends_quietly(tmp_path, shards):
    out = tmp_path / "out.parquet"
    result = subprocess.run(
        f"set -o pipefail; {sys.executable} -m grpo_cli compute {shards} -o {out} --summary-json - -q"
        " | head -c 0",
        shell=True,
        executable="/bin/bash",
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    assert result.returncode == 141 and result.stderr == ""
    assert out.exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_stdin_is_spooled_leaves_nothing(tmp_path, signum):
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    run = subprocess.Popen(
        [*GRPO_CLI, "compute", "-", "-o", str(tmp_path / "o.parquet")],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert run.stdin is not None
    run.stdin.write(b'{"group_id": 1, "reward": 1.0}\n' * 1000)
    run.stdin.flush()
    deadline = time.monotonic() + 60
    while not list(temp.glob("grpo-cli-spool-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(temp.glob("grpo-cli-spool-*")), "the spool never appeared"
    run.send_signal(signum)
    assert run.wait(timeout=60) == 130
    assert list(temp.iterdir()) == []
    assert not (tmp_path / "o.parquet").exists()


def test_stale_temporaries_of_killed_runs_are_cleaned_up(cli, tmp_path, shards):
    out = tmp_path / "out"
    out.mkdir()
    stale_tmp = tmp_path / ".out.0123456789ab.tmp"
    stale_tmp.mkdir()
    (stale_tmp / "a.parquet").write_bytes(b"partial")
    stale_lock = tmp_path / ".out.grpo-cli.lock"
    stale_lock.write_bytes(b"")
    dead_pid = 2**22 + 12345
    temp = Path(os.environ.get("TMPDIR", "/tmp"))
    stale_spool = temp / f"grpo-cli-spool-{dead_pid}-0123456789ab"
    stale_spool.write_bytes(b"{}")
    unrelated = tmp_path / ".out.notes.tmp"
    unrelated.write_text("not ours")
    assert cli("compute", "-", "-o", out, input=(shards / "a.parquet").read_bytes()).exit_code == 0
    assert not stale_tmp.exists() and not stale_lock.exists() and not stale_spool.exists()
    assert unrelated.read_text() == "not ours"


def test_a_directory_moved_aside_by_a_killed_force_run_is_put_back(cli, tmp_path, shards):
    out = tmp_path / "out"
    assert cli("compute", shards, "-o", out).exit_code == 0
    original = tree(out)
    aside = tmp_path / ".out.0123456789ab.old"
    out.rename(aside)  # as left by a run killed between its two renames
    result = cli("compute", shards, "-o", out)
    one_line_error(result, 2, "pass --force")  # the old output is back, so it needs --force
    assert tree(out) == original and not aside.exists()


def test_a_killed_run_leaves_no_temporary_behind(tmp_path, shards):
    rows = rollout_rows(n_groups=4000, seed=5)
    big = write_parquet(tmp_path / "big.parquet", rows * 5)
    out = tmp_path / "out.parquet"
    run = subprocess.Popen(
        [*GRPO_CLI, "compute", str(big), "-o", str(out), "--batch-rows", "1000", "--memory-limit-mb", "0"],
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".out.parquet.*.tmp")) and time.monotonic() < deadline:
        if run.poll() is not None:
            pytest.skip("the run ended before it could be interrupted")
        time.sleep(0.01)
    run.send_signal(signal.SIGHUP)
    assert run.wait(timeout=60) == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.parquet", "data"]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (lambda data: gzip.compress(data)[:-20], "gzip"),  # truncated
        (lambda data: data, "gzip"),  # not gzip at all
        (lambda data: gzip.compress(data) + b"trailing garbage", "gzip"),
    ],
    ids=["truncated", "not-gzip", "trailing-garbage"],
)
def test_broken_gzip_is_one_line_exit_2(cli, tmp_path, content, fragment):
    data = "".join(json.dumps(r) + "\n" for r in rollout_rows()).encode()
    source = tmp_path / "in.jsonl.gz"
    source.write_bytes(content(data))
    one_line_error(cli("compute", source, "-o", tmp_path / "o.parquet"), 2, fragment)
    assert not (tmp_path / "o.parquet").exists()


def test_a_pipe_path_is_read_once_like_stdin(tmp_path):
    jsonl = write_jsonl(tmp_path / "in.jsonl", rollout_rows())
    parquet = write_parquet(tmp_path / "in.parquet", rollout_rows())
    for source in (jsonl, parquet):
        out = tmp_path / f"o-{source.suffix[1:]}.parquet"
        result = subprocess.run(
            f"{sys.executable} -m grpo_cli compute <(cat {source}) -o {out} -q",
            shell=True,
            executable="/bin/bash",
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert pq.read_table(out).num_rows == 49


def test_parquet_on_stdin_is_recognised(cli, tmp_path):
    parquet = write_parquet(tmp_path / "in.parquet", rollout_rows())
    result = cli("compute", "-", "-o", tmp_path / "o.parquet", input=parquet.read_bytes())
    assert result.exit_code == 0, result.stderr
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 49


def test_duplicate_reward_columns_are_one_line(cli, tmp_path, parquet_file):
    one_line_error(
        cli("compute", parquet_file, "-o", tmp_path / "o.parquet", "-r", "reward", "-r", "reward"), 2
    )
    one_line_error(cli("check", parquet_file, "-r", "correct", "-r", "correct:2"), 2, "names a column twice")


@pytest.mark.parametrize("dtype", [pa.int64(), pa.uint64()])
def test_integer_rewards_beyond_2_53_are_refused_naming_the_row(cli, tmp_path, dtype):
    values = [0, 1, 2**53 + 1, 3]
    pq.write_table(
        pa.table({"group_id": [1, 1, 2, 2], "reward": pa.array(values, dtype)}), tmp_path / "in.parquet"
    )
    one_line_error(
        cli("compute", tmp_path / "in.parquet", "-o", tmp_path / "o.parquet"), 2, "row 2", str(2**53 + 1)
    )


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    import resource

    rows = rollout_rows(n_groups=300, seed=1)
    source = write_parquet(tmp_path / "in.parquet", rows)

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    out = tmp_path / "out.parquet"
    result = subprocess.run(
        [*GRPO_CLI, "compute", str(source), "-o", str(out)],
        capture_output=True,
        text=True,
        preexec_fn=small_files,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write the output" in lines[0] and "nothing was written" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]


SLOW_FINDINGS = """
import resource, signal, sys, time, torch
import grpo_cli.engines.local as local
from grpo_cli.cli import main

def slow_findings(*args, **kwargs):  # still inside torch when the write fails and the run ends
    x = torch.ones(1 << 20)
    end = time.monotonic() + 2
    while time.monotonic() < end:
        x = x * 1.0
    raise AssertionError("a failed run does not use its findings")

local.group_findings = slow_findings
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
sys.argv = ["grpo-cli", "compute", sys.argv[1], "-o", sys.argv[2]]
main()
"""


def test_a_failed_run_ends_in_its_line_while_the_summarys_thread_still_computes(tmp_path):
    """The summary's group figures run on a thread beside pass 2: a run that fails meanwhile (a
    full disk) waits for it before it ends, since a thread left inside torch at exit aborts the
    process after the error's line ("terminate called without an active exception", exit -6)."""
    source = write_parquet(tmp_path / "in.parquet", rollout_rows(n_groups=300, seed=1))
    result = run_python(SLOW_FINDINGS, source, tmp_path / "out.parquet", timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write the output" in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]


def test_jsonl_field_first_seen_after_the_first_block_is_read(cli, tmp_path, monkeypatch):
    from grpo_cli.inputs import readers

    monkeypatch.setattr(readers.text, "JSONL_BLOCK_BYTES", 4096)
    rows = rollout_rows(n_groups=60, shuffle=False)
    rows[-1]["late"] = "here"
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    result = cli("compute", source, "-o", tmp_path / "o.parquet")
    assert result.exit_code == 0, result.stderr
    late = pq.read_table(tmp_path / "o.parquet").column("late").to_pylist()
    assert late[-1] == "here" and late[:-1] == [None] * (len(rows) - 1)


def test_decimal_rewards_are_accepted(cli, tmp_path):
    rows = rollout_rows()
    table = pa.table(
        {
            "group_id": [r["group_id"] for r in rows],
            "reward": pa.array([decimal.Decimal(str(r["reward"])) for r in rows], pa.decimal128(12, 5)),
            "as_float": [r["reward"] for r in rows],
        }
    )
    pq.write_table(table, tmp_path / "in.parquet")
    assert cli("compute", tmp_path / "in.parquet", "-o", tmp_path / "a.parquet").exit_code == 0
    assert (
        cli("compute", tmp_path / "in.parquet", "-o", tmp_path / "b.parquet", "-r", "as_float").exit_code == 0
    )
    a = pq.read_table(tmp_path / "a.parquet").column("advantage")
    assert a.type == pa.float64()
    b = pq.read_table(tmp_path / "b.parquet").column("advantage")
    assert a.to_pylist() == pytest.approx(b.to_pylist(), rel=1e-14, abs=1e-14)


@pytest.mark.parametrize(
    "args",
    [
        ["--group-size", "0"],
        ["--epsilon", "abc"],
        ["--batch-rows", "0"],
        ["--input-format", "orc"],
        ["--std", "biased"],
        ["--no-such-option"],
    ],
)
def test_usage_errors_are_one_line_exit_2(cli, tmp_path, parquet_file, args):
    one_line_error(cli("compute", parquet_file, "-o", tmp_path / "o.parquet", *args), 2, "--help")
    one_line_error(cli("compute", parquet_file), 2, "Missing option '--output'")


def test_usage_errors_are_one_line_in_a_real_process(tmp_path, parquet_file):
    result = run_cli("compute", parquet_file, "--group-size", "0", "-o", tmp_path / "o.parquet")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("output", ["out.csv", "out.json", "out.csv.gz", "out.feather"])
def test_output_names_grpo_cli_cannot_honour_are_refused(cli, tmp_path, parquet_file, monkeypatch, output):
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    one_line_error(cli("compute", parquet_file, "-o", output), 2, "Parquet or JSON lines")
    one_line_error(cli("compute", parquet_file, "-o", output, "--engine", "ray"), 2, "Parquet")
    assert tree(tmp_path) == before


@pytest.mark.parametrize("output", ["-", "out.jsonl", "out.jsonl.gz"])
def test_the_ray_engine_refuses_json_lines_output(cli, tmp_path, parquet_file, monkeypatch, output):
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    one_line_error(cli("compute", parquet_file, "-o", output, "--engine", "ray"), 2, "directory")
    assert tree(tmp_path) == before


# --------------------------------------------------------------------------- the property


PATHS = [
    "data",
    "data/a.parquet",
    "data/new.parquet",
    "data/sub",
    "data/./a.parquet",
    "link",
    "link/a.parquet",
    "link/out",
    ".",
    "..",
    "out",
    "out.parquet",
    "other.parquet",
    "data/../other.parquet",
    "s.json",
]
INPUTS = {
    "data": ["work/data/a.parquet", "work/data/b.parquet"],
    "data/a.parquet": ["work/data/a.parquet"],
    "data/*.parquet": ["work/data/a.parquet", "work/data/b.parquet"],
    "link": ["work/data/a.parquet", "work/data/b.parquet"],
    "link/b.parquet": ["work/data/b.parquet"],
    "other.parquet": ["work/other.parquet"],
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    input_spec=st.sampled_from(sorted(INPUTS)),
    output=st.sampled_from(PATHS),
    summary=st.none() | st.sampled_from(PATHS),
    force=st.booleans(),
    engine=st.sampled_from(["local", "local", "local", "ray"]),
)
def test_no_paths_make_grpo_cli_write_inside_or_over_an_input(
    cli, tmp_path_factory, input_spec, output, summary, force, engine
):
    root = tmp_path_factory.mktemp("property")
    work = root / "work"
    (work / "data").mkdir(parents=True)
    write_parquet(work / "data" / "a.parquet", rollout_rows(n_groups=3, seed=1))
    write_parquet(work / "data" / "b.parquet", rollout_rows(n_groups=3, seed=2))
    write_parquet(work / "other.parquet", rollout_rows(n_groups=3, seed=4))
    (work / "link").symlink_to(work / "data", target_is_directory=True)
    before = tree(root)
    cwd = os.getcwd()
    os.chdir(work)
    try:
        args = ["compute", input_spec, "-o", output, "--engine", engine]
        args += ["--force"] if force else []
        args += ["--summary-json", summary] if summary else []
        if engine == "ray" and not os.path.exists(output):
            args = ["compute", input_spec, "-o", output, "--engine", "local", *args[6:]]  # keep it quick
        result = cli(*args)
    finally:
        os.chdir(cwd)
    after = tree(root)
    for name in INPUTS[input_spec]:
        assert after.get(name) == before[name], (name, args, result.exit_code, result.stderr)
    if input_spec in ("data", "link"):  # nothing new inside an input directory either
        assert {n for n in after if n.startswith("work/data/")} == {
            n for n in before if n.startswith("work/data/")
        }
    allowed = {os.path.realpath(work / output)} | ({os.path.realpath(work / summary)} if summary else set())
    for name, digest in after.items():
        if before.get(name) == digest:
            continue
        real = os.path.realpath(root / name)
        assert any(real == a or real.startswith(a + os.sep) for a in allowed), (name, args, result.stderr)
    if result.exit_code == 0:
        assert not any(Path(name).name.startswith(".") for name in after)  # no temporaries left
    assert result.exit_code in (0, 2), result.stderr


def test_ray_session_folder_stays_short_under_a_long_tmpdir(monkeypatch, tmp_path):
    """Ray's socket paths must fit in 107 bytes; a long TMPDIR would break them."""
    from grpo_cli.engines import ray as engine_ray

    long = tmp_path / ("x" * 90)
    long.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(long))
    assert engine_ray.session._short_temp_root() == "/tmp"
    monkeypatch.setattr("tempfile.tempdir", "/tmp")
    assert engine_ray.session._short_temp_root() is None


def test_outputs_carry_the_provenance_entry_and_read_back_with_polars(cli, tmp_path, shards):
    """The footer entry that tells grpo-cli's shards from the user's files; polars reads it all."""
    import polars as pl

    for out in (tmp_path / "one.parquet", tmp_path / "dir"):
        assert cli("compute", shards, "-o", out, "-r", "correct").exit_code == 0
        for file in [out] if out.is_file() else sorted(out.iterdir()):
            record = json.loads(pq.read_metadata(file).metadata[b"grpo_cli"])
            assert record["options"]["reward_cols"] == [{"column": "correct", "weight": 1.0}]
            assert record["inputs"] == [str(shards / "a.parquet"), str(shards / "b.parquet")]
            assert pl.read_parquet(file).to_dicts() == pq.read_table(file).to_pylist()


def test_decimal_rewards_convert_with_correct_rounding():
    """Each decimal reward becomes the float64 nearest to it, as Python's float() gives."""
    from grpo_cli.inputs.sources import Shard
    from grpo_cli.run.reward_columns import RewardReader

    texts = [f"{(i * 7919 % 400000 - 200000) / 100000:.5f}" for i in range(2000)]
    array = pa.array([decimal.Decimal(t) for t in texts], pa.decimal128(12, 5))
    batch = pa.RecordBatch.from_arrays([array], names=["reward"])
    shard = Shard(Path("x.parquet"), "x.parquet", "parquet", 0)
    reader = RewardReader([RewardSpec("reward")], batch.schema, shard, per_column=False)
    assert reader.read(batch).combined.tolist() == [float(t) for t in texts]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["compute", "{src}", "-o", "-", "-q"], 3, "standard output: cannot write the rows (No space left"),
        (
            ["check", "{src}", "--summary-json", "-", "-q"],
            2,
            "--summary-json -: cannot write to standard output",
        ),
        (
            ["compute", "{src}", "-o", "{out}", "--summary-json", "-", "-q"],
            3,
            "(No space left on device); the output was written",
        ),
    ],
)
def test_a_full_standard_output_is_one_line(tmp_path, args, code, fragment):
    """Each was an internal error (exit 70)."""
    source = write_parquet(tmp_path / "in.parquet", rollout_rows())
    argv = [a.format(src=source, out=tmp_path / "o.parquet") for a in args]
    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            [sys.executable, "-m", "grpo_cli", *argv],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert done.returncode == code, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and fragment in done.stderr


def _corrupt_arrow(tmp_path):
    import struct

    import pyarrow.feather as feather

    table = pa.table(
        {"group_id": [0, 0, 1, 1], "reward": [1.0, 0.0, 1.0, 1.0], "text": ["aaaa", "bbbb", "cccc", "dddd"]}
    )
    good = tmp_path / "good.arrow"
    feather.write_feather(table, good, compression="uncompressed")
    data = bytearray(good.read_bytes())
    at = data.find(struct.pack("<5i", 0, 4, 8, 12, 16))  # the text column's offsets
    data[at + 8 : at + 12] = struct.pack("<i", 1 << 30)
    bad = tmp_path / "bad.arrow"
    bad.write_bytes(bytes(data))
    return bad


@pytest.mark.parametrize("command", ["compute", "check"])
def test_a_corrupt_offset_in_an_arrow_file_is_one_line_not_a_bus_error(tmp_path, command):
    """The file is memory-mapped: one bad string offset ended the process with SIGBUS,
    leaving a temporary and a lock file beside the output."""
    bad = _corrupt_arrow(tmp_path)
    out = tmp_path / "out" / "o.parquet"
    out.parent.mkdir()
    args = [command, str(bad)] + (["-o", str(out)] if command == "compute" else [])
    done = subprocess.run(
        [sys.executable, "-m", "grpo_cli", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert "bad.arrow: corrupt Arrow data" in done.stderr and "Offset invariant failure" in done.stderr
    assert list(out.parent.iterdir()) == []


def test_json_lines_too_deep_for_pyarrows_parser_are_refused_first(tmp_path):
    """20,000 levels overflowed the stack of pyarrow's JSON parser: a segfault, files left behind."""
    source = tmp_path / "deep.jsonl"
    source.write_text(
        '{"group_id":1,"reward":0.0}\n{"group_id":1,"reward":1.0,"x":' + "[" * 20000 + "]" * 20000 + "}\n"
    )
    out = tmp_path / "out" / "o.parquet"
    out.parent.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "compute", str(source), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip()
        == f"error: {source}, line 2: a value nests 20,001 levels deep; grpo-cli reads at most 64"
    )
    assert list(out.parent.iterdir()) == []


def test_brackets_inside_json_strings_are_not_nesting(cli, tmp_path):
    source = tmp_path / "b.jsonl"
    source.write_text(
        '{"group_id":1,"reward":1.0,"t":"' + "[{" * 500 + '"}\n{"group_id":1,"reward":0.0,"t":"\\\\\\"[["}\n'
    )
    result = cli("compute", source, "-o", tmp_path / "o.parquet", "-q")
    assert result.exit_code == 0, result.stderr
