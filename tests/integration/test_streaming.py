"""Sharded inputs, directory outputs, streaming vs in-memory, and interrupted runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.jobs import compute_dataset
from grpo_cli.options.advantage import AdvantageOptions, RewardSpec
from grpo_cli.options.config import ComputeConfig
from tests.conftest import rollout_rows, with_advantage_changed, write_jsonl, write_parquet

SMALL = ComputeConfig(batch_rows=7, stats_block_rows=11)  # many batches and statistics blocks


def shard_rows(rows, n_shards):
    """Contiguous slices of a shuffled row list: groups span shards."""
    size = -(-len(rows) // n_shards)
    return [rows[i * size : (i + 1) * size] for i in range(n_shards)]


@pytest.fixture
def big_rows():
    return rollout_rows(n_groups=60, group_size=8, seed=9, singletons=3)


@pytest.fixture
def sharded_dir(tmp_path, big_rows):
    folder = tmp_path / "shards"
    folder.mkdir()
    for i, part in enumerate(shard_rows(big_rows, 4)):
        write_parquet(folder / f"part-{i:05d}.parquet", part, row_group_size=9)
    return folder


def read_column(path: Path, column: str = "advantage") -> list[object]:
    if path.is_dir():
        return [v for f in sorted(path.iterdir()) for v in pq.read_table(f).column(column).to_pylist()]
    values: list[object] = pq.read_table(path).column(column).to_pylist()
    return values


def test_shards_equal_one_concatenated_file(tmp_path, big_rows, sharded_dir):
    whole = write_parquet(tmp_path / "whole.parquet", big_rows)
    compute_dataset(whole, tmp_path / "whole_out.parquet", SMALL)
    compute_dataset(sharded_dir, tmp_path / "sharded_out.parquet", SMALL)
    assert read_column(tmp_path / "whole_out.parquet") == read_column(tmp_path / "sharded_out.parquet")
    # groups really span shards
    first = {r["group_id"] for r in shard_rows(big_rows, 4)[0]}
    second = {r["group_id"] for r in shard_rows(big_rows, 4)[1]}
    assert first & second


def test_glob_input(tmp_path, sharded_dir):
    compute_dataset(sharded_dir, tmp_path / "a.parquet", SMALL)
    summary = compute_dataset(f"{sharded_dir}/part-*.parquet", tmp_path / "b.parquet", SMALL)
    assert summary.input["shards"] == 4
    assert read_column(tmp_path / "a.parquet") == read_column(tmp_path / "b.parquet")


def test_directory_output_mirrors_shard_names(tmp_path, sharded_dir):
    out = tmp_path / "out"
    summary = compute_dataset(sharded_dir, out, SMALL)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in sharded_dir.iterdir())
    for shard in sharded_dir.iterdir():
        source = pq.read_table(shard)
        written = pq.read_table(out / shard.name)
        assert written.num_rows == source.num_rows
        assert written.select(source.column_names).equals(source)
    assert summary.output is not None
    assert summary.output == {
        "path": str(out),
        "shards": 4,
        "bytes": summary.output["bytes"],
        "method": "splice",
        "shards_by_method": {"splice": 4},
        "format": "parquet",
    }
    compute_dataset(sharded_dir, tmp_path / "single.parquet", SMALL)
    assert read_column(out) == read_column(tmp_path / "single.parquet")


def test_directory_output_needs_force_when_not_empty(tmp_path, sharded_dir):
    out = tmp_path / "out"
    compute_dataset(sharded_dir, out, SMALL)
    with pytest.raises(ValueError, match="not empty; pass --force"):
        compute_dataset(sharded_dir, out, SMALL)
    # --force replaces grpo-cli's own shards, a stale one of an earlier run included ...
    (out / next(out.iterdir()).name).rename(out / "stale.parquet")
    compute_dataset(sharded_dir, out, SMALL, force=True)
    assert "stale.parquet" not in {p.name for p in out.iterdir()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    # ... and nothing else: a file grpo-cli did not write makes the folder the user's
    (out / "notes.parquet").write_bytes(b"mine")
    with pytest.raises(ValueError, match=r"holds files grpo-cli did not write \(notes.parquet\)"):
        compute_dataset(sharded_dir, out, SMALL, force=True)
    assert (out / "notes.parquet").read_bytes() == b"mine"


@pytest.mark.parametrize(
    "options",
    [
        AdvantageOptions(),
        AdvantageOptions(std="sample", scale="batch"),
        AdvantageOptions(baseline="leave-one-out", std="sample", epsilon_mode="add-if-nonzero"),
        AdvantageOptions(singleton="raw", std="sample"),
    ],
)
@pytest.mark.parametrize("reward", ["reward", "correct"])
def test_streaming_and_in_memory_are_bitwise_identical(tmp_path, sharded_dir, options, reward):
    config = replace(SMALL, advantage=options, rewards=(RewardSpec(reward),))
    streamed = compute_dataset(sharded_dir, tmp_path / "s.parquet", replace(config, memory_budget_bytes=0))
    in_memory = compute_dataset(sharded_dir, tmp_path / "m.parquet", replace(config, batch_rows=1 << 16))
    assert streamed.mode == "streaming" and in_memory.mode == "in-memory"
    a = pq.read_table(tmp_path / "s.parquet")
    b = pq.read_table(tmp_path / "m.parquet")
    assert a.equals(b)  # bitwise: same values, same bits
    sa, sb = streamed.to_dict(), in_memory.to_dict()
    for key in (
        "rows",
        "groups",
        "active_groups",
        "reward",
        "advantage",
        "inactive_by_value",
        "group_mean_histogram",
        "reward_histogram",
    ):
        assert sa[key] == sb[key], key


def test_statistics_blocks_do_not_change_results_beyond_rounding(tmp_path, sharded_dir):
    compute_dataset(sharded_dir, tmp_path / "a.parquet", replace(SMALL, stats_block_rows=5))
    compute_dataset(sharded_dir, tmp_path / "b.parquet", replace(SMALL, stats_block_rows=1 << 22))
    assert read_column(tmp_path / "a.parquet") == pytest.approx(
        read_column(tmp_path / "b.parquet"), abs=1e-12
    )


def test_jsonl_shards_stream(tmp_path, big_rows):
    folder = tmp_path / "jsonl"
    folder.mkdir()
    for i, part in enumerate(shard_rows(big_rows, 3)):
        write_jsonl(folder / f"part-{i}.jsonl", part)
    whole = write_parquet(tmp_path / "whole.parquet", big_rows)
    compute_dataset(whole, tmp_path / "a.parquet", SMALL)
    summary = compute_dataset(folder, tmp_path / "jout", replace(SMALL, memory_budget_bytes=0))
    assert summary.mode == "streaming"
    assert sorted(p.name for p in (tmp_path / "jout").iterdir()) == [
        "part-0.parquet",
        "part-1.parquet",
        "part-2.parquet",
    ]
    assert read_column(tmp_path / "jout") == read_column(tmp_path / "a.parquet")


class InterruptAfter:
    """A progress reporter that raises KeyboardInterrupt part-way through pass 2."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.seen = 0
        self.in_pass_two = False

    def start(self, description, total_rows):
        self.in_pass_two = description.startswith("pass 2")

    def advance(self, rows):
        if self.in_pass_two:
            self.seen += rows
            if self.seen >= self.rows:
                raise KeyboardInterrupt

    def finish(self):
        pass


@pytest.mark.parametrize("output_name", ["out.parquet", "outdir"])
@pytest.mark.parametrize("budget", [0, 1 << 30])
def test_interrupted_run_leaves_nothing(tmp_path, sharded_dir, output_name, budget):
    out = tmp_path / output_name
    before = {p.name: p.read_bytes() for p in sharded_dir.iterdir()}
    with pytest.raises(KeyboardInterrupt):
        compute_dataset(
            sharded_dir, out, replace(SMALL, memory_budget_bytes=budget), progress=InterruptAfter(200)
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"]
    assert {p.name: p.read_bytes() for p in sharded_dir.iterdir()} == before


def test_interrupted_force_run_keeps_the_old_output(tmp_path, sharded_dir):
    out = tmp_path / "outdir"
    compute_dataset(sharded_dir, out, SMALL)
    old = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(KeyboardInterrupt):
        compute_dataset(sharded_dir, out, SMALL, force=True, progress=InterruptAfter(100))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outdir", "shards"]


def test_mismatched_shard_schemas_need_directory_output(tmp_path, big_rows):
    folder = tmp_path / "mixed"
    folder.mkdir()
    a, b = shard_rows(big_rows, 2)
    write_parquet(folder / "a.parquet", a)
    write_parquet(folder / "b.parquet", [dict(r, extra=1) for r in b])
    with pytest.raises(ValueError, match="columns differ from those of"):
        compute_dataset(folder, tmp_path / "one.parquet", SMALL)
    assert not (tmp_path / "one.parquet").exists()
    compute_dataset(folder, tmp_path / "dir", SMALL)
    assert pq.read_table(tmp_path / "dir" / "b.parquet").column_names[-3:] == [
        "extra",
        "advantage",
        "group_active",
    ]


def test_summary_reports_shards_bytes_and_time(tmp_path, sharded_dir):
    summary = compute_dataset(sharded_dir, tmp_path / "o", SMALL).to_dict()
    assert summary["input"]["shards"] == 4
    assert summary["input"]["bytes"] == sum(p.stat().st_size for p in sharded_dir.iterdir())
    assert summary["output"]["bytes"] == sum(p.stat().st_size for p in (tmp_path / "o").iterdir())
    assert summary["elapsed_seconds"] >= 0


def test_dictionary_encoded_keys(tmp_path, big_rows):
    table = pa.Table.from_pylist(big_rows)
    index = table.schema.get_field_index("group_id")
    table = table.set_column(index, "group_id", table.column("group_id").dictionary_encode())
    source = tmp_path / "dict.parquet"
    pq.write_table(table, source)
    plain = write_parquet(tmp_path / "plain.parquet", big_rows)
    compute_dataset(source, tmp_path / "a.parquet", SMALL)
    compute_dataset(plain, tmp_path / "b.parquet", SMALL)
    assert read_column(tmp_path / "a.parquet") == read_column(tmp_path / "b.parquet")


def test_jsonl_column_that_changes_type_after_the_first_block(tmp_path, monkeypatch):
    # pyarrow infers JSONL types from the first block: 0/1 rewards first, 0.5 later.
    from grpo_cli.inputs import readers

    monkeypatch.setattr(readers.text, "JSONL_BLOCK_BYTES", 2048)
    rows = [{"group_id": f"g{i // 4}", "reward": i % 2} for i in range(400)]
    rows += [{"group_id": f"h{i // 4}", "reward": (i % 3) * 0.5} for i in range(400)]
    source = write_jsonl(tmp_path / "drift.jsonl", rows)
    summary = compute_dataset(source, tmp_path / "out.parquet", replace(SMALL, memory_budget_bytes=0))
    written = pq.read_table(tmp_path / "out.parquet")
    assert written.schema.field("reward").type == pa.float64()
    assert written.column("reward").to_pylist() == [float(r["reward"]) for r in rows]
    assert summary.rows == 800 and summary.groups == 200
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drift.jsonl", "out.parquet"]


def test_jsonl_column_with_incompatible_types_is_one_error(cli, tmp_path, monkeypatch):
    from grpo_cli.inputs import readers

    monkeypatch.setattr(readers.text, "JSONL_BLOCK_BYTES", 1024)
    rows = [{"group_id": f"g{i // 4}", "reward": 1.0} for i in range(300)]
    rows += [{"group_id": 7, "reward": 1.0} for _ in range(300)]
    source = write_jsonl(tmp_path / "bad.jsonl", rows)
    result = cli("compute", source, "-o", tmp_path / "o.parquet")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize(
    "options",
    [
        ["--truncated-col", "finish", "--stop-properly", "0"],
        ["--length-col", "length", "--overlong", "40", "10"],
        ["--estimator", "remax", "--baseline-col", "greedy"],
        ["--batch-col", "step", "--by", "source", "--scale", "batch"],
    ],
    ids=["truncated", "overlong", "baseline", "batch and by"],
)
def test_pass_2_reads_again_each_column_it_needs_in_memory_as_streaming(cli, tmp_path, options):
    """In memory, pass 1 keeps for pass 2 only the columns it reads again (the group keys and the
    per-group columns are left behind): each per-row column a reward or estimator reads in pass 2
    is kept, and the spliced output is the streaming run's, bit for bit."""
    rows = [
        {
            "uid": f"p{(i * 7) % 23}",  # groups spread over the file
            "reward": float((i * 5) % 3) / 2,
            "length": 20 + (i * 13) % 31,
            "finish": "length" if i % 6 == 0 else "stop",
            "greedy": float(i % 2) / 4,
            "step": (i * 7) % 23 // 8,  # one step per group
            "source": "math" if (i * 7) % 23 % 2 else "code",
        }
        for i in range(23 * 6)
    ]
    source = tmp_path / "in.parquet"
    write_parquet(source, rows, row_group_size=20)
    runs = {}
    for mode, limit in (("in-memory", "1024"), ("streaming", "0")):
        out = tmp_path / f"{mode}.parquet"
        result = cli(
            "compute", source, "-o", out, "-g", "uid", *options, "--memory-limit-mb", limit,
            "--batch-rows", "16", "--summary-json", "-", "-q",
        )  # fmt: skip
        assert result.exit_code == 0, result.stderr
        summary = json.loads(result.stdout)
        assert (summary["mode"], summary["output"]["method"]) == (mode, "splice")
        runs[mode] = pq.read_table(out)
    assert runs["in-memory"].equals(runs["streaming"])


@pytest.mark.parametrize(
    "config",
    [
        SMALL,
        replace(SMALL, drop_inactive=True, stats_cols=True),
        replace(SMALL, advantage=AdvantageOptions(std="sample", scale="batch")),
    ],
    ids=["spliced", "dropped and re-encoded", "batch scale"],
)
def test_pass_2_in_slices_of_a_few_rows_writes_what_whole_batches_write(
    tmp_path, sharded_dir, monkeypatch, config
):
    """Pass 2 computes a batch's advantages a slice at a time on the CPU: slices of 5 rows in
    batches of 64 give the output, the advantage range and the active groups of whole batches."""
    from grpo_cli.engines.local import engine

    config = replace(config, batch_rows=64)
    whole = compute_dataset(sharded_dir, tmp_path / "whole.parquet", config)
    monkeypatch.setattr(engine, "CPU_SLICE_ROWS", 5)
    sliced = compute_dataset(sharded_dir, tmp_path / "sliced.parquet", config)
    assert pq.read_table(tmp_path / "sliced.parquet").equals(pq.read_table(tmp_path / "whole.parquet"))
    assert sliced.to_dict()["advantage"] == whole.to_dict()["advantage"]
    assert sliced.to_dict()["active_groups"] == whole.to_dict()["active_groups"]


def test_verify_in_slices_of_a_few_rows_names_the_row_that_differs(tmp_path, sharded_dir, monkeypatch):
    """``check --verify`` compares pass 2's advantages a slice at a time too: the one row moved
    is found and named by its row in the file, whichever slice holds it."""
    from grpo_cli.engines.local import engine
    from grpo_cli.jobs import check_dataset
    from grpo_cli.options.checks import CheckBounds

    out = tmp_path / "out.parquet"
    compute_dataset(sharded_dir, out, SMALL)
    changed = with_advantage_changed(out, tmp_path / "changed.parquet", row=37, by=0.5)
    monkeypatch.setattr(engine, "CPU_SLICE_ROWS", 5)
    verified = check_dataset(changed, CheckBounds(), verify=True).to_dict()["verify"]
    assert (verified["compared"], verified["mismatched"]) == (pq.read_metadata(out).num_rows, 1)
    assert verified["examples"][0]["row"] == 37
