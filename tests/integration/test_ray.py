"""The Ray engine against the local engine, on one Ray instance for the whole session."""

from __future__ import annotations

import builtins
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_cli.errors import GrpoError
from grpo_cli.jobs import Ray, compute_dataset
from grpo_cli.options.advantage import AdvantageOptions, RewardSpec
from grpo_cli.options.config import ComputeConfig
from grpo_cli.run.plan import RunPlan
from tests.conftest import (
    PARITY_ESTIMATORS,
    PARITY_PRESETS,
    REWARD_SHAPINGS,
    bits,
    one_line_error,
    parity_case,
    rollout_cases,
    run_python,
    write_case,
)

if importlib.util.find_spec("ray") is None:  # not importorskip: Ray must not be imported yet
    pytest.skip("the ray extra is not installed", allow_module_level=True)

from grpo_cli.engines.ray import ray_session

FILES = 4
GROUPS = 2500
GROUP_SIZE = 8


@pytest.fixture(scope="session")
def ray_instance():
    with ray_session(None) as ray:
        yield ray


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """20,000 rows, 2,500 string uids, each group spread over several files."""
    rng = random.Random(42)
    folder = tmp_path_factory.mktemp("ray_shards")
    uids = [f"{rng.getrandbits(128):032x}" for _ in range(GROUPS)]
    rows = []
    for g, uid in enumerate(uids):
        kind = g % 5
        for i in range(GROUP_SIZE if g % 97 else 1):
            correct = 0 if kind == 0 else 1 if kind == 1 else int(rng.random() < 0.5)
            rows.append(
                {
                    "uid": uid,
                    "text": "x" * rng.randint(0, 30),
                    "correct": correct,
                    "reward": correct + rng.uniform(-0.3, 0.3),
                    "reward32": float(correct) + 0.25 * i,
                    "step": g % 3,
                    "length": rng.randint(1, 40),
                    "greedy": rng.uniform(0, 1),
                    "fmt": float(kind == 1 or rng.random() < 0.7),
                    # a reward function that returned None now and then (TRL sums with nansum)
                    "fmt_null": None if (g + i) % 7 == 0 else float(i % 3) / 2,
                }
            )
    rng.shuffle(rows)
    for i, row in enumerate(rows):
        row["row_id"] = i
    size = -(-len(rows) // FILES)
    for f in range(FILES):
        part = pa.Table.from_pylist(rows[f * size : (f + 1) * size])
        part = part.set_column(
            part.schema.get_field_index("reward32"), "reward32", part.column("reward32").cast(pa.float32())
        )
        pq.write_table(part, folder / f"part-{f}.parquet")
    return folder


def read_sorted(path: Path) -> pa.Table:
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    return pa.concat_tables([pq.read_table(f) for f in files]).sort_by("row_id")


def compare_summaries(local: dict[str, Any], ray: dict[str, Any]) -> None:
    for key in (
        "rows",
        "groups",
        "active_groups",
        "inactive_groups",
        "singleton_groups",
        "group_size",
        "inactive_by_value",
        "nan_rewards",
        "group_size_counts",
        "dropped",
        "warnings",
    ):
        assert local[key] == ray[key], key
    assert local.get("tolerance") == ray.get("tolerance")
    # named by their keys, which only the reducers hold (absent when every group has one size)
    assert local.get("off_size_groups") == ray.get("off_size_groups")
    for key in ("reward", "advantage", "by"):  # as JSON: -0.0 and 0.0 differ
        assert json.dumps(ray.get(key)) == json.dumps(local.get(key)), key
    assert local["group_mean_histogram"]["counts"] == ray["group_mean_histogram"]["counts"]
    assert local["reward_histogram"] == ray["reward_histogram"]


@pytest.mark.parametrize(
    ("reward", "options"),
    [
        ("reward", AdvantageOptions()),
        ("reward32", AdvantageOptions.resolve(preset="verl")),
        ("correct", AdvantageOptions.resolve(preset="nemo-rl")),
    ],
)
def test_ray_matches_local(ray_instance, sharded, tmp_path, reward, options):
    config = ComputeConfig(rewards=(RewardSpec(reward),), group_cols=("uid",), advantage=options)
    local = compute_dataset(sharded, tmp_path / "local.parquet", config)
    ray = compute_dataset(str(sharded), str(tmp_path / "ray_out"), config, engine=Ray(partitions=3))
    a = read_sorted(tmp_path / "local.parquet")
    b = read_sorted(tmp_path / "ray_out")
    singletons = len(range(0, GROUPS, 97))
    assert a.num_rows == b.num_rows == GROUPS * GROUP_SIZE - singletons * (GROUP_SIZE - 1)
    assert a.schema.equals(b.schema, check_metadata=False)
    for name in a.column_names:
        if name == "advantage":
            continue
        assert a.column(name).equals(b.column(name)), name
    assert np.array_equal(bits(a.column("advantage").to_numpy()), bits(b.column("advantage").to_numpy()))
    compare_summaries(local.to_dict(), ray.to_dict())
    assert ray.mode == "ray"
    assert not list(tmp_path.glob(".*"))  # no temporary output left behind


@pytest.mark.parametrize(
    ("rewards", "aggregation", "options", "columns"),
    [
        (
            ("reward",),
            None,
            AdvantageOptions.resolve(estimator="reinforce_plus_plus_baseline"),
            {"length_col": "length"},
        ),
        (("reward",), None, AdvantageOptions.resolve(estimator="reinforce_baseline"), {"batch_col": "step"}),
        (("correct",), None, AdvantageOptions.resolve(estimator="gpg"), {"batch_col": "step"}),
        (("reward",), None, AdvantageOptions.resolve(estimator="opo"), {"length_col": "length"}),
        (("reward",), None, AdvantageOptions.resolve(estimator="remax"), {"baseline_col": "greedy"}),
        (("reward",), None, AdvantageOptions.resolve(preset="roll", whiten="unbiased", clip=(-1.0, 1.0)), {}),
        (("reward",), None, AdvantageOptions.resolve(preset="areal"), {"length_col": "length"}),
        (
            ("reward",),
            None,
            AdvantageOptions.resolve(overlong=(6.0, 4.0), reward_bias=0.5, reward_clip=(-1.0, 1.0)),
            {"length_col": "length"},
        ),
        (("reward",), None, AdvantageOptions.resolve(preset="trl", scale="batch"), {"batch_col": "step"}),
        (
            ("correct", "fmt"),
            "normalize-then-sum",
            AdvantageOptions.resolve(preset="trl"),
            {"batch_col": "step"},
        ),
        (("correct", "fmt"), "normalize-then-sum", AdvantageOptions.resolve(preset="nemo-rl"), {}),
        (("correct", "fmt_null"), None, AdvantageOptions.resolve(preset="trl"), {}),
        (
            ("correct", "fmt_null"),
            "normalize-then-sum",
            AdvantageOptions.resolve(preset="trl"),
            {"batch_col": "step"},
        ),
    ],
)
def test_ray_matches_local_for_every_estimator(
    ray_instance, sharded, tmp_path, rewards, aggregation, options, columns
):
    config = ComputeConfig(
        rewards=tuple(RewardSpec(r, 0.5 if i else 1.0) for i, r in enumerate(rewards)),
        group_cols=("uid",),
        aggregation=aggregation or "sum-then-normalize",
        advantage=options,
        **columns,
    )
    local = compute_dataset(sharded, tmp_path / "local.parquet", config)
    ray = compute_dataset(str(sharded), str(tmp_path / "ray_out"), config, engine=Ray(partitions=3))
    left = read_sorted(tmp_path / "local.parquet").column("advantage").to_numpy()
    right = read_sorted(tmp_path / "ray_out").column("advantage").to_numpy()
    assert np.array_equal(bits(left), bits(right))
    assert local.to_dict()["options"]["estimator"] == ray.to_dict()["options"]["estimator"]


def test_ray_filters_and_cli(ray_instance, sharded, tmp_path, cli):
    out = tmp_path / "ray_cli"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = cli(
            "compute",
            sharded,
            "-o",
            out,
            "--engine",
            "ray",
            "-g",
            "uid",
            "-r",
            "correct",
            "--drop-inactive",
            "--summary-json",
            "-",
            "-q",
        )
    assert result.exit_code == 0, result.stderr
    # a warning from grpo-cli's own code would reach the user's terminal under -q
    assert [str(w.message) for w in caught if "grpo_cli" in w.filename] == []
    assert result.stdout.lstrip().startswith("{"), result.stdout
    summary = json.loads(result.stdout)
    assert summary["mode"] == "ray" and summary["options"]["engine"] == "ray"
    written = read_sorted(out)
    assert all(written.column("group_active").to_pylist())
    assert summary["dropped"]["rows"] == summary["rows"] - written.num_rows
    result = cli("compute", sharded, "-o", out, "--engine", "ray", "-g", "uid", "-q")
    assert result.exit_code == 2 and "not empty; pass --force" in result.stderr


def test_ray_reads_text_stored_as_string_views_as_the_local_engine_does(ray_instance, tmp_path, cli):
    """Parquet written from polars' newest Arrow export keeps string views in its Arrow schema;
    pyarrow 26 has no take or filter kernel for them."""
    import polars as pl

    rows = [
        {"uid": f"p{i // 4}", "step": f"s{i // 8}", "reward": float(i % 3 == 0 or i < 4)} for i in range(32)
    ]
    views = pl.DataFrame(rows).to_arrow(compat_level=pl.CompatLevel.newest())
    (tmp_path / "in").mkdir()
    pq.write_table(views, tmp_path / "in" / "part-0.parquet")
    assert pq.read_schema(tmp_path / "in" / "part-0.parquet").field("uid").type == pa.string_view()
    options = ["-g", "uid", "-r", "reward", "--batch-col", "step", "--drop-inactive", "-q"]
    local = cli("compute", tmp_path / "in", *options, "-o", tmp_path / "local.parquet")
    assert local.exit_code == 0, local.stderr
    ray = cli("compute", tmp_path / "in", *options, "--engine", "ray", "-o", tmp_path / "ray")
    assert ray.exit_code == 0, ray.stderr
    written = pa.concat_tables([pq.read_table(f) for f in sorted((tmp_path / "ray").glob("*.parquet"))])
    expected = pq.read_table(tmp_path / "local.parquet")
    assert expected.schema.field("uid").type == pa.string_view()
    assert written.schema.field("uid").type == pa.large_string()  # Ray cannot move views between tasks
    assert 0 < written.num_rows < len(rows)
    assert sorted(written.column("uid").to_pylist()) == sorted(expected.column("uid").to_pylist())
    assert sorted(written.column("advantage").to_pylist()) == sorted(expected.column("advantage").to_pylist())


def test_ray_option_errors(cli, sharded, tmp_path):
    result = cli("compute", sharded, "-o", tmp_path / "x", "--partitions", "3", "-g", "uid")
    assert result.exit_code == 2 and "need --engine ray" in result.stderr
    result = cli("compute", sharded, "-o", tmp_path / "x.parquet", "--engine", "ray", "-g", "uid")
    assert result.exit_code == 2 and "name a directory" in result.stderr
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text('{"uid": "a", "reward": 1.0}\n')
    cluster = ["--engine", "ray", "--ray-address", "127.0.0.1:1", "-g", "uid"]
    result = cli("compute", jsonl, "-o", tmp_path / "y", *cluster)
    assert result.exit_code == 2 and "a Ray cluster's workers read Parquet files" in result.stderr
    result = cli("compute", "-", "-o", tmp_path / "z", *cluster, input='{"uid": "a", "reward": 1.0}\n')
    assert result.exit_code == 2 and "a Ray cluster's workers read Parquet files" in result.stderr
    assert not (tmp_path / "y").exists() and not (tmp_path / "z").exists()


@pytest.mark.parametrize("rewrite", [False, True], ids=["splice", "rewrite"])
def test_an_output_short_of_rows_is_never_moved_into_place(
    ray_instance, sharded, tmp_path, monkeypatch, rewrite
):
    """A cluster's workers that write a local path on their own disks leave only some shards
    where the driver looks: the rows in the files' footers are counted before the commit. Here
    the files Ray wrote lose one shard (the splice: the first task's) or all but 100 rows."""
    from grpo_cli.engines import ray as ray_engine

    if rewrite:
        real_dataset = ray_engine.shipping._block_dataset
        monkeypatch.setattr(
            ray_engine.run, "_block_dataset", lambda *a, **k: real_dataset(*a, **k).limit(100)
        )
    else:
        real_map = ray_engine.shipping._map_blocks

        def lose_one(ray, parts, task, **job):
            tables = real_map(ray, parts, task, **job)
            sorted(Path(job["target"]).glob("*.parquet"))[0].unlink()
            return tables

        monkeypatch.setattr(ray_engine.run, "_map_blocks", lose_one)
    config = ComputeConfig(rewards=(RewardSpec("reward"),), group_cols=("uid",), rewrite=rewrite)
    with pytest.raises(GrpoError, match=r"the Ray workers' files hold [\d,]+ of the output's 19,\d{3} rows"):
        compute_dataset(str(sharded), str(tmp_path / "out"), config, engine=Ray(partitions=3))
    assert list(tmp_path.iterdir()) == []


def test_an_address_nothing_answers_at_is_one_line_at_once(sharded, tmp_path):
    """Ray retries a cluster address that nothing answers at for many minutes, printing a warning
    every few seconds (seen for over 5 minutes with 127.0.0.1:1): grpo-cli asks first, once. A
    whole process: this one holds a Ray instance, which a run joins whatever the address."""
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "grpo_cli", "compute", str(sharded), "-o", str(tmp_path / "out"),
               "-g", "uid", "--engine", "ray", "--ray-address", f"127.0.0.1:{port}"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: cannot join the Ray cluster at 127.0.0.1:{port} (Connection refused)"
    ]
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_the_reachability_probe_answers_for_host_and_port_only(monkeypatch):
    import socket

    from grpo_cli.engines.ray.session import _check_reachable

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        _check_reachable(f"127.0.0.1:{server.getsockname()[1]}")  # something answers: no error
    for left_to_ray in ("auto", "ray://127.0.0.1:1", "local"):
        _check_reachable(left_to_ray)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: (_ for _ in ()).throw(TimeoutError()))
    with pytest.raises(ConnectionError, match="nothing answered there within 10 s"):
        _check_reachable("10.255.255.1:6379")


def test_missing_ray_extra_says_how_to_install(monkeypatch, cli, sharded, tmp_path):
    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    import sys

    monkeypatch.setattr(builtins, "__import__", no_ray)
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    from grpo_cli.engines.ray import import_ray

    with pytest.raises(GrpoError, match=r"pip install 'grpo-cli\[ray\]'"):
        import_ray()


@pytest.mark.parametrize(
    ("column", "value", "options", "message"),
    [
        ("uid", None, [], "part-0.parquet, row 1: group key 'uid' is null"),
        ("uid", [float("nan")], [], "part-0.parquet, row 1: group key 'uid' holds a NaN"),
        ("step", float("nan"), ["--batch-col", "step"], "part-0.parquet, row 1: batch key 'step' is NaN"),
        (
            "step",
            2.0,
            ["--batch-col", "step"],
            "part-0.parquet, row 1: a group spans two values of --batch-col 'step' (1.0, then 2.0)",
        ),
        ("reward", None, [], "part-0.parquet, row 1: reward is null; 2 reward(s) in all"),
        ("reward", float("inf"), [], "part-0.parquet, row 1: reward is inf; 2 reward(s) in all"),
    ],
)
def test_ray_refuses_bad_keys_and_rewards_in_the_local_engines_words(
    ray_instance, cli, tmp_path, column, value, options, message
):
    """A key that cannot name a group, a group across two batches, a bad reward: bad input,
    not an internal error with Ray's tracebacks, and the same line, naming the same row, as
    the local engine's (Ray's blocks no longer know the rows' files)."""
    folder = tmp_path / "in"
    folder.mkdir()
    ok = [1.0] if column == "uid" and isinstance(value, list) else "p"
    for part in range(2):
        rows = [
            {"uid": ok if column == "uid" else "p", "step": 1.0, "reward": float(i % 2)} for i in range(6)
        ]
        rows[part + 1][column] = value
        pq.write_table(pa.Table.from_pylist(rows), folder / f"part-{part}.parquet")
    lines = []
    for engine in ("local", "ray"):
        out = tmp_path / f"out-{engine}"
        result = cli("compute", folder, "-o", out, "--engine", engine, "-g", "uid", "-q", *options)
        lines.append(one_line_error(result, 2, message))
        assert not out.exists()
    assert lines[0] == lines[1]


RAY_PARITY = [
    (estimator, preset, len(PARITY_PRESETS) * e + p)
    for e, estimator in enumerate(PARITY_ESTIMATORS)
    for p, preset in enumerate(PARITY_PRESETS)
]


@pytest.mark.parametrize(("estimator", "preset", "seed"), RAY_PARITY)
def test_ray_computes_each_estimator_as_the_local_engine_does(
    ray_instance, cli, tmp_path, estimator, preset, seed
):
    """The parity cases of test_parity.py (every estimator under every preset; explicit group IDs:
    Ray groups by key) through ``compute --engine ray``: the local engine's values and masks, bit
    for bit."""
    case = parity_case(3 * seed, estimator=estimator, preset=preset)  # seed % 3 == 0: explicit IDs
    assert case["layout"] == "ids"
    source = tmp_path / "in" / "part.parquet"
    source.parent.mkdir()
    table = case["table"]
    pq.write_table(table.append_column("row", pa.array(range(table.num_rows))), source)
    local = cli("compute", source, "-o", tmp_path / "local.parquet", "-r", "reward", "-q", *case["flags"])
    ray = cli(
        "compute",
        source.parent,
        "-o",
        tmp_path / "ray",
        "-r",
        "reward",
        "-q",
        "--engine",
        "ray",
        *case["flags"],
    )
    assert local.exit_code == ray.exit_code, (local.stderr, ray.stderr)
    if local.exit_code:
        assert len(ray.stderr.strip().splitlines()) == 1, ray.stderr
        return
    left = pq.read_table(tmp_path / "local.parquet").sort_by("row")
    right = pq.read_table(tmp_path / "ray").sort_by("row")
    assert right.column("group_active").equals(left.column("group_active"))
    a, b = left.column("advantage").to_numpy(), right.column("advantage").to_numpy()
    assert a.dtype == b.dtype
    assert np.array_equal(bits(a), bits(b))


BLOCKS_CASES = [
    (("reward",), None, AdvantageOptions(), {}),
    (("reward",), None, AdvantageOptions.resolve(preset="nemo-rl"), {}),
    (("reward",), None, AdvantageOptions.resolve(estimator="opo"), {"length_col": "length"}),
    (("reward",), None, AdvantageOptions.resolve(estimator="gpg"), {"batch_col": "step"}),
    (("reward",), None, AdvantageOptions.resolve(preset="areal"), {"length_col": "length"}),
    (("reward",), None, AdvantageOptions.resolve(estimator="reinforce_baseline"), {"batch_col": "step"}),
    (("correct", "fmt_null"), "normalize-then-sum", AdvantageOptions.resolve(preset="trl"), {}),
    # the best row of a group of 0/1 rewards is its first 1, often in a later block or file
    (("fmt",), None, AdvantageOptions.resolve(estimator="grpo_passk"), {}),
    # every reward of each group, gathered over 14 blocks and 4 files
    (("reward",), None, AdvantageOptions.resolve(estimator="pass_at_k", pass_k=3), {}),
    (("fmt",), None, AdvantageOptions.resolve(estimator="grpo_passk", scale="none"), {"batch_col": "step"}),
]


@pytest.mark.parametrize(("rewards", "aggregation", "options", "columns"), BLOCKS_CASES)
def test_ray_cuts_and_merges_the_statistics_blocks_as_the_local_engine_does(
    ray_instance, sharded, tmp_path, rewards, aggregation, options, columns, monkeypatch
):
    """Statistics blocks of 1,500 rows: 14 blocks, several across a file's end, every group over
    several of them. Each block is reduced on a worker and cut by key into 5 buckets; each bucket
    is merged in block order on a worker, which finishes its groups' outcome;
    so the advantages (float64 here), the masks and the summary are the local engine's bits; the
    Ray engine used to merge its hash partitions' statistics in its own order (up to 4.5e-13 relative)."""
    from grpo_cli.engines import ray as ray_engine

    monkeypatch.setattr(ray_engine.gather, "REDUCERS", 5)
    config = ComputeConfig(
        rewards=tuple(RewardSpec(r, 0.5 if i else 1.0) for i, r in enumerate(rewards)),
        group_cols=("uid",),
        aggregation=aggregation or "sum-then-normalize",
        advantage=options,
        stats_block_rows=1500,
        **columns,
    )
    local = compute_dataset(sharded, tmp_path / "local.parquet", config)
    ray = compute_dataset(str(sharded), str(tmp_path / "ray_out"), config, engine=Ray(partitions=3))
    left = read_sorted(tmp_path / "local.parquet")
    right = read_sorted(tmp_path / "ray_out")
    assert left.column("advantage").type == pa.float64()
    assert np.array_equal(
        bits(left.column("advantage").to_numpy()), bits(right.column("advantage").to_numpy())
    )
    assert left.column("group_active").equals(right.column("group_active"))
    compare_summaries(local.to_dict(), ray.to_dict())
    assert ray.to_dict()["options"]["statistics_blocks"] == 14


def merged_and_split_groups(folder: Path, *, seed: int) -> Path:
    """600 prompts of 8 rollouts, shuffled over 3 files: 30 drawn twice under one uid (16 rows),
    30 cut short (3 rows), rewards of three magnitudes, some NaN; the off-size and merged
    groups spread over the input, so the first of each in the run's order lie in many blocks."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(600):
        size = 16 if g % 20 == 7 else 3 if g % 20 == 13 else 8
        scale = (1.0, 1e-9, 3e8)[g % 3]
        correct = rng.integers(0, 2, size) if g % 4 else np.full(size, g % 8 == 0)
        rewards = (correct + rng.uniform(-0.2, 0.2, size) * (g % 5 != 0)) * scale
        rewards[rng.random(size) < 0.02] = np.nan
        key = int(rng.integers(0, 2**62)) if g == 0 else g * 7919 % 1000003
        rows += [(key, float(r), g % 3) for r in rewards]
    order = rng.permutation(len(rows))
    table = pa.table(
        {
            "uid": pa.array([rows[i][0] for i in order], pa.int64()),
            "reward": pa.array([rows[i][1] for i in order], pa.float64()),
            "length": pa.array(rng.integers(1, 500, len(rows))),
            "step": pa.array([rows[i][2] for i in order], pa.int64()),
            "row_id": pa.array(np.arange(len(rows))),
        }
    )
    folder.mkdir()
    third = table.num_rows // 3
    for f in range(3):
        pq.write_table(table.slice(f * third, third if f < 2 else None), folder / f"part-{f}.parquet")
    return folder


@pytest.mark.parametrize(
    "options",
    [
        {"advantage": AdvantageOptions(nan="ignore")},
        {"advantage": AdvantageOptions.resolve(preset="nemo-rl", nan="ignore"), "drop_inactive": True},
        {"advantage": AdvantageOptions(nan="ignore", inactive_tolerance=1e-3), "keep_mean_range": (0.1, 2.0)},
        {"advantage": AdvantageOptions.resolve(estimator="grpo_passk", nan="ignore")},
        # one batch without --batch-col: its whitening's moments merged from the blocks, GPG's
        # figures integer sums each worker rebuilds from the buckets
        {"advantage": AdvantageOptions.resolve(estimator="reinforce_plus_plus_baseline", nan="ignore")},
        {"advantage": AdvantageOptions.resolve(estimator="reinforce", nan="ignore"), "length_col": "length"},
        {"advantage": AdvantageOptions.resolve(estimator="gpg", nan="ignore")},
        # training batches: the workers number them alike; GPG's figures and the moments per batch
        {"advantage": AdvantageOptions.resolve(estimator="gpg", nan="ignore"), "batch_col": "step"},
        {
            "advantage": AdvantageOptions.resolve(estimator="reinforce_plus_plus_baseline", nan="ignore"),
            "batch_col": "step",
        },
        # --scale batch: each batch's std from the buckets' exact sums in two rounds
        {"advantage": AdvantageOptions.resolve(preset="trl", scale="batch", nan="ignore")},
        {"advantage": AdvantageOptions(scale="batch", std="sample", nan="ignore"), "batch_col": "step"},
        {
            "advantage": AdvantageOptions(scale="batch", nan="ignore"),
            "batch_col": "step",
            "rewards": (RewardSpec("reward"), RewardSpec("length")),
            "aggregation": "normalize-then-sum",
        },
        # pass_at_k: every row to its group's bucket, a table per group and reward for the workers
        {"advantage": AdvantageOptions.resolve(estimator="pass_at_k", pass_k=3, nan="ignore")},
        {
            "advantage": AdvantageOptions.resolve(estimator="pass_at_k", pass_k=2, nan="ignore"),
            "drop_inactive": True,
            "by_cols": ("step",),
        },
        # --by: the groups cut again by value, each value's figures from all its groups at once
        {"advantage": AdvantageOptions(nan="ignore"), "by_cols": ("step",)},
        {
            "advantage": AdvantageOptions(scale="batch", nan="ignore", inactive_tolerance=0.05),
            "batch_col": "step",
            "by_cols": ("step",),
        },
    ],
    ids=[
        "grpo",
        "nemo-rl-drop-inactive",
        "tolerance-keep-mean",
        "grpo_passk",
        "reinforce_plus_plus_baseline",
        "reinforce-length",
        "gpg",
        "gpg-batches",
        "reinforce_plus_plus_baseline-batches",
        "trl-scale-batch",
        "scale-batch-batches",
        "scale-batch-two-channels",
        "pass_at_k",
        "pass_at_k-drop-by",
        "by",
        "by-scale-batch-tolerance",
    ],
)
def test_ray_reducers_finish_the_summary_as_the_local_engine_does(
    ray_instance, tmp_path, monkeypatch, options
):
    """Where each group's outcome is its own, needs exact figures of its batch or its own rows
    (pass@k; no verifier or filter of the trainer), each reducer
    computes its bucket's outcome and both rounds of its findings, and the driver merges one
    report per bucket (--scale batch: each batch's std from the buckets in two rounds): blocks
    of 97 rows over 5 reducers give the local engine's advantages, masks and summary to the
    bit, the first off-size and merged groups in the run's order named by key, the dropped
    counts, and ``check``'s range from each bucket's extremes with the NaN rows' 0 in it."""
    from grpo_cli.engines import ray as ray_engine
    from grpo_cli.jobs import check_dataset
    from grpo_cli.options.checks import CheckBounds

    monkeypatch.setattr(ray_engine.gather, "REDUCERS", 5)
    folder = merged_and_split_groups(tmp_path / "in", seed=5)
    config = ComputeConfig(group_cols=("uid",), stats_block_rows=97, **options)
    local = compute_dataset(folder, tmp_path / "local", config).to_dict()
    ray = compute_dataset(str(folder), str(tmp_path / "ray_out"), config, engine=Ray(partitions=2)).to_dict()
    assert ray["options"]["statistics_blocks"] > 50
    compare_summaries(local, ray)
    assert local["nan_rewards"] > 0 and len(local["off_size_groups"]["examples"]) == 5
    assert "groups sharing a key were merged" in local["warnings"][0]
    left, right = read_sorted(tmp_path / "local"), read_sorted(tmp_path / "ray_out")
    assert left.num_rows == right.num_rows == local["rows"] - local["dropped"]["rows"]
    assert np.array_equal(
        bits(left.column("advantage").to_numpy()), bits(right.column("advantage").to_numpy())
    )
    assert left.column("group_active").equals(right.column("group_active"))
    bounds = CheckBounds(min_groups=1)
    local_check = check_dataset(folder, bounds, config).to_dict()
    ray_check = check_dataset(str(folder), bounds, config, engine=Ray(partitions=2)).to_dict()
    compare_summaries(local_check, ray_check)


def test_ray_checks_rewards_that_are_all_nan_as_the_local_engine_does(ray_instance, tmp_path, monkeypatch):
    """No group holds a scored reward: the advantages' range is every row's 0 on both engines,
    merged from buckets that each saw none."""
    from grpo_cli.engines import ray as ray_engine
    from grpo_cli.jobs import check_dataset
    from grpo_cli.options.checks import CheckBounds

    monkeypatch.setattr(ray_engine.gather, "REDUCERS", 3)
    folder = tmp_path / "in"
    folder.mkdir()
    table = pa.table({"uid": pa.array(np.arange(60) % 7), "reward": pa.array(np.full(60, np.nan))})
    pq.write_table(table, folder / "part-0.parquet")
    config = ComputeConfig(group_cols=("uid",), stats_block_rows=10, advantage=AdvantageOptions(nan="ignore"))
    local = check_dataset(folder, CheckBounds(), config).to_dict()
    ray = check_dataset(str(folder), CheckBounds(), config, engine=Ray()).to_dict()
    compare_summaries(local, ray)
    assert ray["advantage"] == {"min": 0.0, "max": 0.0}


def test_ray_divides_a_lone_outlier_by_its_others_spread_as_the_local_engine_does(
    ray_instance, tmp_path, monkeypatch
):
    """Leave-one-out under NeMo-RL's options, groups with a lone outlier spread over statistics
    blocks of 5 rows and 3 reducers: each block's statistics without its extremes merge as the
    local engine merges them, so a lone outlier's advantage (divided by its others' spread) is
    the local engine's bits, and the formula's value."""
    from grpo_cli.engines import ray as ray_engine

    monkeypatch.setattr(ray_engine.gather, "REDUCERS", 3)
    rng = np.random.default_rng(9)
    rows = []
    for g in range(40):
        values = [*(1.0 + rng.integers(0, 3, 7) * 1e-7).tolist(), float(rng.choice([100.0, -100.0, 1.0]))]
        rows += [(g, v) for v in values]
    order = rng.permutation(len(rows))
    table = pa.table(
        {
            "uid": pa.array([rows[i][0] for i in order], pa.int64()),
            "reward": pa.array([rows[i][1] for i in order], pa.float64()),
            "row_id": pa.array(np.arange(len(rows))),
        }
    )
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(table.slice(0, 150), folder / "part-0.parquet")
    pq.write_table(table.slice(150), folder / "part-1.parquet")
    config = ComputeConfig(
        group_cols=("uid",), advantage=AdvantageOptions.resolve(preset="nemo-rl"), stats_block_rows=5
    )
    compute_dataset(folder, tmp_path / "local", config)
    compute_dataset(str(folder), str(tmp_path / "ray_out"), config, engine=Ray(partitions=2))
    left, right = read_sorted(tmp_path / "local"), read_sorted(tmp_path / "ray_out")
    assert np.array_equal(
        bits(left.column("advantage").to_numpy()), bits(right.column("advantage").to_numpy())
    )
    advantages = left.column("advantage").to_numpy()
    assert np.abs(advantages).max() > 1e7  # an outlier over a spread of about 5e-8, + 1e-6


def test_ray_reads_a_uri_as_it_reads_a_folder(ray_instance, sharded, tmp_path):
    """An object-store input is listed and read through pyarrow's file systems (here file://):
    the same files in the same order as the local folder, so the same bits."""
    config = ComputeConfig(group_cols=("uid",), stats_block_rows=3000)
    compute_dataset(str(sharded), str(tmp_path / "folder"), config, engine=Ray())
    summary = compute_dataset(f"file://{sharded}", str(tmp_path / "uri"), config, engine=Ray())
    a, b = read_sorted(tmp_path / "folder"), read_sorted(tmp_path / "uri")
    assert np.array_equal(bits(a.column("advantage").to_numpy()), bits(b.column("advantage").to_numpy()))
    assert summary.to_dict()["input"]["shards"] == FILES


def test_ray_merges_files_of_different_column_types(ray_instance, tmp_path):
    """Keys int32 in one file and int64 in the next, rewards float32 then float64, within one
    statistics block and across two: the local engine's bits."""
    rng = np.random.default_rng(4)
    folder = tmp_path / "in"
    folder.mkdir()
    for part, (key_type, reward_type) in enumerate([(pa.int32(), pa.float32()), (pa.int64(), pa.float64())]):
        n = 600
        table = pa.table(
            {
                "group_id": pa.array(rng.integers(0, 50, n), key_type),
                "reward": pa.array(rng.normal(0, 1, n), reward_type),
                "row_id": np.arange(n) + part * n,
            }
        )
        pq.write_table(table, folder / f"part-{part}.parquet")
    for block_rows in (1 << 22, 450):
        config = ComputeConfig(stats_block_rows=block_rows)
        compute_dataset(folder, tmp_path / f"local-{block_rows}", config)
        compute_dataset(str(folder), str(tmp_path / f"ray-{block_rows}"), config, engine=Ray())
        left, right = (
            pa.concat_tables(
                [pq.read_table(f) for f in sorted(out.glob("*.parquet"))], promote_options="permissive"
            ).sort_by("row_id")
            for out in (tmp_path / f"local-{block_rows}", tmp_path / f"ray-{block_rows}")
        )
        assert left.schema.field("advantage").type == pa.float64()  # float32 advantages widened exactly
        a, b = left.column("advantage").to_numpy(), right.column("advantage").to_numpy()
        assert np.array_equal(bits(a), bits(b)), block_rows


def write_formats(folder: Path, table: pa.Table) -> dict[str, Path]:
    """``table`` as JSON lines, CSV, Arrow IPC and a JSON array, each split over two files."""
    import json

    import pyarrow.csv as pa_csv
    import pyarrow.feather as feather

    paths = {}
    half = table.num_rows // 2
    for fmt in ("jsonl", "csv", "arrow", "json"):
        target = folder / fmt
        target.mkdir()
        for index, part in enumerate((table.slice(0, half), table.slice(half))):
            path = target / f"part-{index}.{fmt}"
            rows = part.to_pylist()
            if fmt == "jsonl":
                path.write_text("".join(json.dumps(row) + "\n" for row in rows))
            elif fmt == "json":
                path.write_text(json.dumps(rows))
            elif fmt == "csv":
                pa_csv.write_csv(part, path)
            else:
                feather.write_feather(part, path, compression="uncompressed")
        paths[fmt] = target
    return paths


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "arrow", "json"])
def test_ray_reads_every_format_as_the_local_engine_does(ray_instance, sharded, tmp_path, fmt):
    """A text or Arrow input is read by the local engine's readers into private Parquet files
    that Ray's tasks read: the same rows, types, advantages (bit for bit) and summary."""
    table = pa.concat_tables([pq.read_table(f) for f in sorted(sharded.glob("*.parquet"))])
    table = table.select(["uid", "text", "correct", "reward", "step", "row_id"])
    folder = write_formats(tmp_path, table)[fmt]
    config = ComputeConfig(rewards=(RewardSpec("reward"),), group_cols=("uid",))
    local = compute_dataset(folder, tmp_path / "local.parquet", config)
    ray = compute_dataset(str(folder), str(tmp_path / "ray_out"), config, engine=Ray(partitions=3))
    a, b = read_sorted(tmp_path / "local.parquet"), read_sorted(tmp_path / "ray_out")
    assert a.num_rows == b.num_rows == table.num_rows
    assert a.schema.equals(b.schema, check_metadata=False), (a.schema, b.schema)
    for name in a.column_names:
        assert a.column(name).equals(b.column(name)), name
    assert np.array_equal(bits(a.column("advantage").to_numpy()), bits(b.column("advantage").to_numpy()))
    compare_summaries(local.to_dict(), ray.to_dict())
    assert ray.to_dict()["input"]["format"] == local.to_dict()["input"]["format"]
    assert not list(tmp_path.glob(".*"))


def test_ray_reads_a_shard_of_only_null_rewards_as_the_local_engine_does(ray_instance, tmp_path):
    """A JSON lines shard whose rewards are all null (typed ``null`` by the reader) beside one
    of numbers: with ``--nan ignore``, the local engine's rows, advantages and summary."""
    folder = tmp_path / "in"
    folder.mkdir()
    numbers = [{"uid": g, "reward": float(i % 2), "row_id": 2 * g + i} for g in range(3) for i in range(2)]
    nulls = [{"uid": 10 + g, "reward": None, "row_id": 6 + 2 * g + i} for g in range(2) for i in range(2)]
    for name, rows in (("a", numbers), ("b", nulls)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = ComputeConfig(group_cols=("uid",), advantage=AdvantageOptions(nan="ignore"))
    local = compute_dataset(folder, tmp_path / "local", config)
    ray = compute_dataset(str(folder), str(tmp_path / "ray_out"), config, engine=Ray())
    a, b = (
        pa.concat_tables(
            [pq.read_table(f) for f in sorted(out.glob("*.parquet"))], promote_options="permissive"
        ).sort_by("row_id")
        for out in (tmp_path / "local", tmp_path / "ray_out")
    )
    assert a.num_rows == b.num_rows == 10
    for name in ("advantage", "group_active"):
        assert a.column(name).equals(b.column(name)), name
    compare_summaries(local.to_dict(), ray.to_dict())
    assert (local.nan_rewards, local.active_groups) == (4, 3)


@pytest.mark.parametrize("trainer", ["verl", "roll", "trl", "nemo-rl"])
def test_ray_reads_a_trainers_dump_as_the_local_engine_does(ray_instance, tmp_path, cli, trainer):
    """A dump read on this machine (roll's and trl's groups are blocks of rows by position:
    --group-size), the same rows in the same order, bit for bit."""
    dump = Path(__file__).resolve().parents[2] / "sample_data" / "dumps" / trainer
    common = ["--from", trainer, "--summary-json", "-", "-q"]
    local = cli("compute", dump, "-o", tmp_path / "local.parquet", *common)
    ray = cli("compute", dump, "-o", tmp_path / "ray_out", "--engine", "ray", *common)
    assert local.exit_code == 0 and ray.exit_code == 0, ray.stderr
    a = pq.read_table(tmp_path / "local.parquet")
    b = pa.concat_tables([pq.read_table(f) for f in sorted((tmp_path / "ray_out").glob("*.parquet"))])
    assert a.equals(b)
    local_summary, ray_summary = json.loads(local.stdout), json.loads(ray.stdout)
    compare_summaries(local_summary, ray_summary)
    assert ray_summary["input"]["from"] == local_summary["input"]["from"]


@pytest.mark.parametrize(
    "options",
    [
        AdvantageOptions(),  # the range follows from each group's extremes: no advantage job
        AdvantageOptions.resolve(preset="roll", whiten="unbiased"),  # it does not: the rows' range
    ],
)
def test_ray_checks_as_the_local_engine_does(ray_instance, sharded, tmp_path, options):
    from grpo_cli.jobs import check_dataset
    from grpo_cli.options.checks import CheckBounds

    config = ComputeConfig(rewards=(RewardSpec("reward"),), group_cols=("uid",), advantage=options)
    bounds = CheckBounds(
        max_inactive_fraction=0.3, min_groups=10, min_active_groups=10**6, validate_pages=True
    )
    local = check_dataset(sharded, bounds, config)
    ray = check_dataset(str(sharded), bounds, config, engine=Ray(partitions=3))
    compare_summaries(local.to_dict(), ray.to_dict())
    assert ray.checks == local.checks and [c["passed"] for c in ray.checks] == [True, False, True, True]
    assert ray.output is None and not list(tmp_path.iterdir())


def test_ray_check_cli_and_what_it_refuses(ray_instance, sharded, tmp_path, cli):
    common = [sharded, "-g", "uid", "--engine", "ray", "--min-groups", "1"]
    result = cli("check", *common, "--summary-json", tmp_path / "s.json")
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "s.json").read_text())["options"]["engine"] == "ray"
    failed = cli("check", *common, "--max-inactive-fraction", "0.01")
    assert failed.exit_code == 1 and "FAIL" in failed.stderr
    # the report is drawn from the summary, the local engine's figures: the same page
    local_report, ray_report = tmp_path / "local.html", tmp_path / "ray.html"
    assert cli("check", *common, "--by", "step", "--report", ray_report).exit_code == 0
    assert (
        cli("check", *common[:3], "--min-groups", "1", "--by", "step", "--report", local_report).exit_code
        == 0
    )
    ray_page = ray_report.read_text()
    assert ray_page.startswith("<!DOCTYPE html>") and f"{GROUPS:,}" in ray_page
    assert ray_page == local_report.read_text()
    one_line_error(cli("check", sharded, "-g", "uid", "--partitions", "2"), 2, "need --engine ray")


@pytest.mark.parametrize(
    ("by", "batch_col"), [(("step",), None), (("step",), "step"), (("source", "step"), "step")]
)
def test_ray_reports_by_value_as_the_local_engine_does(ray_instance, sharded, tmp_path, by, batch_col):
    import pyarrow.compute as pc

    folder = tmp_path / "in"
    folder.mkdir()
    for file in sorted(sharded.glob("*.parquet")):  # a second column constant in each group
        table = pq.read_table(file)
        source = pc.utf8_slice_codeunits(table.column("uid"), 0, 1)
        pq.write_table(table.append_column("source", source), folder / file.name)
    config = ComputeConfig(
        rewards=(RewardSpec("reward"),), group_cols=("uid",), by_cols=by, batch_col=batch_col
    )
    local = compute_dataset(folder, tmp_path / "local.parquet", config).to_dict()
    ray = compute_dataset(str(folder), str(tmp_path / "ray_out"), config, engine=Ray(partitions=3)).to_dict()
    compare_summaries(local, ray)
    assert ray["by"] == local["by"] and set(ray["by"]) == set(by)


def test_ray_refuses_a_group_across_two_by_values_in_the_local_engines_words(ray_instance, tmp_path, cli):
    rows = [{"uid": f"g{i // 4}", "reward": float(i % 2), "step": 1} for i in range(40)]
    rows[22]["step"] = 2  # group g5 spans steps 1 and 2
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:20]), folder / "a.parquet")
    pq.write_table(pa.Table.from_pylist(rows[20:]), folder / "b.parquet")
    local = cli("compute", folder, "-g", "uid", "--by", "step", "-o", tmp_path / "local.parquet")
    ray = cli("compute", folder, "-g", "uid", "--by", "step", "-o", tmp_path / "ray", "--engine", "ray")
    line = one_line_error(local, 2, "spans two values of --by 'step'")
    assert one_line_error(ray, 2) == line
    assert not (tmp_path / "ray").exists()


def test_ray_refuses_groups_across_two_by_values_found_by_several_reducers(
    ray_instance, tmp_path, monkeypatch
):
    """Each group's four rows lie in four blocks of 8 rows; two groups span two --by values, each
    found by the reducer of its own bucket: the run fails in the local engine's words, writes
    nothing, and the clash the reducers report is one of the two."""
    from grpo_cli.engines import ray as ray_engine

    monkeypatch.setattr(ray_engine.gather, "REDUCERS", 4)
    rows = [{"uid": f"g{i % 200}", "reward": float(i % 3), "step": 1} for i in range(800)]
    rows[350]["step"] = 2
    rows[610]["step"] = 2
    source = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), source)
    config = ComputeConfig(group_cols=("uid",), by_cols=("step",), stats_block_rows=8)
    with pytest.raises(GrpoError) as local:
        compute_dataset(source, tmp_path / "local.parquet", config)
    with pytest.raises(GrpoError) as ray:
        compute_dataset(str(source), str(tmp_path / "ray"), config, engine=Ray())
    assert "row 610: a group spans two values of --by 'step'" in local.value.message
    assert ray.value.message == local.value.message
    assert not (tmp_path / "ray").exists()
    plan = RunPlan(config, device=torch.device("cpu"))
    blocks = ray_engine.statistics_blocks([ray_engine.InputFile(str(source), "in", 800, 0)], 8)
    with pytest.raises(ray_engine.RowsUnknown) as raw:
        ray_engine.gather._held_statistics(ray_instance, blocks, plan, None)
    assert re.search(r"group \{'uid': 'g(150|10)'\} spans two values of --by 'step'", raw.value.message)


@pytest.mark.parametrize(
    ("group_size", "block_rows", "preset"),
    [(8, None, None), (4, None, None), (3, 16, None), (6, 16, "nemo-rl")],
)
def test_ray_groups_by_position_as_the_local_engine_does(
    ray_instance, tmp_path, group_size, block_rows, preset
):
    """--group-size: rows are groups by their position in the whole input, across file ends
    (files of 30 rows: groups of 8 and of 4 straddle them), as the local engine forms them; and
    across the statistics blocks' edges where the group size does not divide the block (the
    local engine rounded its blocks down to whole groups, Ray cut them where IDs cut them)."""
    rng = np.random.default_rng(4)
    folder = tmp_path / "in"
    folder.mkdir()
    for index in range(4):
        rewards = (rng.random(30) < 0.5).astype(np.float64) + rng.random(30) * 0.1 * (index % 2)
        pq.write_table(pa.table({"row": np.arange(index * 30, (index + 1) * 30), "reward": rewards}),
                       folder / f"part-{index}.parquet")  # fmt: skip
    config = ComputeConfig(
        rewards=(RewardSpec("reward"),),
        group_cols=(),
        group_size=group_size,
        advantage=AdvantageOptions.resolve(preset=preset),
        **({"stats_block_rows": block_rows} if block_rows else {}),
    )
    local = compute_dataset(folder, tmp_path / "local", config)
    ray = compute_dataset(str(folder), str(tmp_path / "ray"), config, engine=Ray(partitions=3))
    a = pa.concat_tables([pq.read_table(f) for f in sorted((tmp_path / "local").glob("*.parquet"))]).sort_by(
        "row"
    )
    b = pa.concat_tables([pq.read_table(f) for f in sorted((tmp_path / "ray").glob("*.parquet"))]).sort_by(
        "row"
    )
    assert a.column_names == b.column_names == ["row", "reward", "advantage", "group_active"]
    assert a.equals(b)
    compare_summaries(local.to_dict(), ray.to_dict())
    provenance = [
        json.loads(pq.read_schema(f).metadata[b"grpo_cli"])["options"]
        for f in (
            sorted((tmp_path / "local").glob("*.parquet"))[0],
            sorted((tmp_path / "ray").glob("*.parquet"))[0],
        )
    ]
    assert provenance[0] == provenance[1] and provenance[0]["group_size"] == group_size


def test_ray_refuses_a_group_size_that_does_not_divide_the_rows(ray_instance, sharded, tmp_path, cli):
    result = cli("compute", sharded, "--group-size", "7", "-o", tmp_path / "o", "--engine", "ray")
    one_line_error(result, 2, "--group-size 7 does not divide the")
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_two_runs_in_one_process_each_start_their_own_instance(tmp_path):
    """A library user's second run (a second private instance in the process) timed out waiting
    for its GCS: Ray keeps the auth token's path from its first import. Each run's summary names
    its off-size group by its key, which the object store held: the summary used to be built
    after the instance stopped, and fetching the key then failed (owner unknown)."""

    source = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({"uid": [f"g{i // 4}" for i in range(42)], "reward": [float(i % 3) for i in range(42)]}),
        source,
    )
    code = (
        "from grpo_cli.options.config import ComputeConfig\n"
        "from grpo_cli.jobs import Ray, compute_dataset\n"
        "config = ComputeConfig(group_cols=('uid',))\n"
        "for i in range(2):\n"
        f"    out = {str(tmp_path)!r} + f'/out{{i}}'\n"
        f"    summary = compute_dataset({str(source)!r}, out, config, engine=Ray())\n"
        "    print(summary.rows, summary.to_dict()['off_size_groups']['examples'][0]['group'])\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["42", "g10", "42", "g10"]


@pytest.mark.parametrize("preset", [None, "verl"])
def test_ray_verifies_as_the_local_engine_does(ray_instance, tmp_path, monkeypatch, preset):
    """check --verify-advantage-col on Ray: each of 6 parts is compared on a worker, and what
    they saw is merged in input order. Constant groups' rows lie in several parts (shuffled over
    3 files), so whether their differing rows are one value (residue) or not (mismatch) is
    settled only after the merge: by a task per reducer's bucket, from every part's cut of its
    groups' state; examples are the first rows over
    all parts, named by key."""
    from grpo_cli.engines import ray as ray_engine
    from grpo_cli.jobs import check_dataset
    from grpo_cli.options.checks import CheckBounds
    from grpo_cli.options.config import VerifySpec

    monkeypatch.setattr(ray_engine.gather, "REDUCERS", 3)

    rng = np.random.default_rng(3)
    groups, size = 300, 8
    uid = np.repeat(np.arange(groups), size)
    reward = np.where(uid % 3 == 0, 0.7804687, rng.random(uid.size))
    order = rng.permutation(uid.size)
    table = pa.table({"uid": [f"u{g}" for g in uid[order]], "reward": reward[order]})
    folder = tmp_path / "in"
    folder.mkdir()
    options = AdvantageOptions.resolve(preset=preset) if preset else AdvantageOptions()
    config = ComputeConfig(rewards=(RewardSpec("reward"),), group_cols=("uid",), advantage=options)
    compute_dataset(_write(table, tmp_path / "whole.parquet"), tmp_path / "computed.parquet", config)
    computed = pq.read_table(tmp_path / "computed.parquet")
    given = computed.column("advantage").to_numpy().astype(np.float64).copy()
    ids = uid[order]
    rows = np.arange(uid.size)
    # constant groups, one small value each: residue (or mismatch without a preset)
    given[(ids % 6 == 0)] = 3e-4
    first_of_group = np.unique(ids, return_index=True)[1]
    given[first_of_group[(np.arange(groups) % 6 == 3)]] += 0.25  # one row off in other constant groups
    given[(ids % 3 != 0) & (rows % 37 == 0)] += 0.05  # scattered mismatches
    table = table.append_column("given", pa.array(given))
    for f in range(3):
        pq.write_table(table.slice(f * 800, 800), folder / f"part-{f}.parquet")
    config = ComputeConfig(
        rewards=(RewardSpec("reward"),),
        group_cols=("uid",),
        advantage=options,
        verify=VerifySpec(column="given"),
        stats_block_rows=300,  # 8 blocks: 3 buckets
    )
    bounds = CheckBounds()
    local = check_dataset(folder, bounds, config).to_dict()
    ray = check_dataset(str(folder), bounds, config, engine=Ray(partitions=5)).to_dict()
    assert ray["options"]["partitions"] == 6  # two parts a file
    verify = local["verify"]
    assert verify["mismatched"] > len(verify["examples"]) == VerifySpec(column="given").max_examples
    if preset:
        assert verify["residue"] > 0 and verify["residue_examples"]
    assert ray["verify"] == verify
    assert ray["advantage"] == local["advantage"]
    compare_summaries(local, ray)


def _write(table: pa.Table, path: Path) -> Path:
    pq.write_table(table, path)
    return path


def test_ray_splices_each_file_byte_for_byte_as_the_local_engine_does(ray_instance, sharded, tmp_path):
    """Each Ray task splices one input file (its bytes copied, the new columns appended as
    column chunks, the footer merged): the output files are the local engine's, byte for byte,
    under the same names; filtered rows are re-encoded, with the local engine's reason."""
    import filecmp

    config = ComputeConfig(rewards=(RewardSpec("reward"),), group_cols=("uid",), stats_block_rows=1500)
    local = compute_dataset(sharded, tmp_path / "local", config).to_dict()["output"]
    ray = compute_dataset(str(sharded), str(tmp_path / "ray"), config, engine=Ray(partitions=7)).to_dict()
    assert local["method"] == ray["output"]["method"] == "splice"
    assert ray["output"]["shards_by_method"] == {"splice": FILES}
    names = sorted(p.name for p in (tmp_path / "local").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "ray").iterdir()) and len(names) == FILES
    for name in names:
        assert filecmp.cmp(tmp_path / "local" / name, tmp_path / "ray" / name, shallow=False), name
    assert ray["advantage"] == compute_dataset(sharded, tmp_path / "again", config).to_dict()["advantage"]
    filtered = replace(config, drop_inactive=True)
    out = compute_dataset(str(sharded), str(tmp_path / "filtered"), filtered, engine=Ray()).to_dict()[
        "output"
    ]
    assert out["method"] == "rewrite" and "rows are filtered" in out["rewrite_reason"]


@pytest.mark.parametrize(
    ("name", "columns", "reward"),
    [
        ("dapo", {}, "reward32"),
        ("verl-v1", {"by_cols": ("step",)}, "correct"),
        ("trl", {"batch_col": "step"}, "fmt"),
        ("slime", {"batch_col": "step", "advantage": AdvantageOptions.resolve(nan="ignore")}, "fmt_null"),
        ("nemo-rl", {}, "reward"),
        ("trl-batch", {"batch_col": "step"}, "fmt"),
        ("slime-fallback", {"by_cols": ("step",)}, "reward"),
        ("trl-batch", {}, "reward"),  # the whole input one batch: every group in one task
        # the batches are --batch-col's, cut by its hash; --by only views the decisions
        ("slime-fallback", {"batch_col": "step", "by_cols": ("uid",)}, "reward"),
        # the rule sees the rewards before the clip, which makes many groups constant
        (
            "skyrl",
            {"advantage": AdvantageOptions.resolve(reward_clip=(-1.0, 0.2)), "filter_unshaped": True},
            "reward",
        ),
    ],
)
def test_ray_applies_a_trainers_filter_as_the_local_engine_does(
    ray_instance, sharded, tmp_path, monkeypatch, name, columns, reward
):
    """check --trainer-filter on Ray: every scored row, its reward in its own dtype, goes to its
    group's bucket; a rule on each group's own rows runs on the reducers, a whole-batch rule in
    a task per cut of the batches (each batch's groups in the run's order); the parts merge
    (examples the first flagged groups in the run's order). The local engine's trainer_filter
    object, examples named by key, figures per value."""
    from grpo_cli.engines import ray as ray_engine
    from grpo_cli.jobs import check_dataset
    from grpo_cli.options.checks import CheckBounds

    monkeypatch.setattr(ray_engine.gather, "REDUCERS", 3)

    config = ComputeConfig(
        rewards=(RewardSpec(reward),),
        group_cols=("uid",),
        trainer_filter=name,
        stats_block_rows=3000,
        **columns,
    )
    local = check_dataset(sharded, CheckBounds(), config).to_dict()
    ray = check_dataset(str(sharded), CheckBounds(), config, engine=Ray(partitions=5)).to_dict()
    assert local["trainer_filter"]["groups"] == GROUPS
    assert ray["trainer_filter"] == local["trainer_filter"]
    compare_summaries(local, ray)


def test_a_private_instance_writes_nothing_in_home_even_when_ray_was_imported_first(tmp_path):
    """Ray, imported by something else first (a user's program, pytest.importorskip), has read
    its auth settings already; without a token it then turns token auth on for a new local
    instance and writes one to ~/.ray/auth_token, outside anything grpo-cli was asked to write,
    and Ray clusters started later on the machine pick it up. Two private instances in a row."""
    import os

    code = (
        "import ray, ray.data\n"
        "from grpo_cli.engines.ray import ray_session\n"
        "for _ in range(2):\n"
        "    with ray_session(None, num_cpus=1) as r:\n"
        "        assert r.get(r.remote(lambda: 42).remote()) == 42\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(tmp_path)
    done = run_python(code, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (tmp_path / ".ray").exists(), sorted(p.name for p in (tmp_path / ".ray").iterdir())


def test_an_output_whose_every_row_is_filtered_out_keeps_its_schema_in_one_file(ray_instance, tmp_path):
    """Ray Data writes no file for no rows: the output is still one Parquet file of no rows with
    the local engine's columns and provenance, not an empty folder that no reader can open."""
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"uid": ["a", "a", "b", "b"], "reward": [1.0, 1.0, 0.0, 0.0]}), source)
    config = ComputeConfig(group_cols=("uid",), drop_inactive=True)
    local = compute_dataset(source, tmp_path / "local.parquet", config)
    ray = compute_dataset(str(source), str(tmp_path / "ray"), config, engine=Ray())
    (written,) = (tmp_path / "ray").glob("*.parquet")
    left, right = pq.read_table(tmp_path / "local.parquet"), pq.read_table(written)
    assert left.num_rows == right.num_rows == 0
    assert left.schema.equals(right.schema, check_metadata=False)
    assert json.loads(right.schema.metadata[b"grpo_cli"])["groups"] == 2
    assert ray.output is not None and ray.output["shards"] == 1 and ray.dropped == local.dropped
    assert local.advantage == ray.advantage == {"min": None, "max": None}


RAY_EXAMPLES = int(os.environ.get("GRPO_RAY_PROPERTY_EXAMPLES", "20"))  # more for a differential fuzz


@settings(
    max_examples=RAY_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    case=rollout_cases(),
    std=st.sampled_from(["population", "sample"]),
    scale=st.sampled_from(["group", "batch", "none"]),
    baseline=st.sampled_from(["mean", "leave-one-out"]),
    clip=st.sampled_from([None, (-1.0, 1.0)]),
    shaping=st.sampled_from(REWARD_SHAPINGS),
    tolerance=st.sampled_from([0.0, 0.3]),
    singleton=st.sampled_from(["zero", "raw"]),
    nan=st.sampled_from(["error", "ignore"]),
    stats_block_rows=st.sampled_from([3, 16, 1 << 22]),
    drop_inactive=st.booleans(),
    keep_mean_range=st.sampled_from([None, (0.2, 0.8)]),
    partitions=st.sampled_from([None, 1, 3]),
    group_size=st.sampled_from([None, 2, 3]),
)
def test_ray_writes_and_checks_what_the_local_engine_does_on_drawn_rollouts(
    ray_instance,
    tmp_path_factory,
    case,
    std,
    scale,
    baseline,
    clip,
    shaping,
    tolerance,
    singleton,
    nan,
    stats_block_rows,
    drop_inactive,
    keep_mean_range,
    partitions,
    group_size,
):
    """A differential run over drawn datasets (formats, key and reward types, bad rewards,
    statistics blocks cut anywhere) and options: ``compute`` writes the local engine's rows,
    columns and types, bit for bit, or fails as it does; its summary and ``check``'s are the
    local engine's; rows grouped by key, or by position (--group-size, the blocks cut anywhere).
    It found an output whose every row was filtered out written as no file at all, and a
    summary's zero range reported as -0.0 (a Parquet footer's minimum)."""
    from grpo_cli.jobs import check_dataset
    from grpo_cli.options.checks import CheckBounds

    tmp = tmp_path_factory.mktemp("drawn")
    source, _ = write_case(tmp, case)
    config = ComputeConfig(
        group_cols=() if group_size else ("uid",),
        group_size=group_size,
        advantage=AdvantageOptions(
            std=std,
            scale=scale,
            baseline=baseline,
            clip=clip,
            singleton=singleton,
            nan=nan,
            inactive_tolerance=tolerance,
            **shaping,
        ),
        stats_block_rows=stats_block_rows,
        drop_inactive=drop_inactive,
        keep_mean_range=keep_mean_range,
    )
    outcomes = []
    for run in (
        lambda: compute_dataset(source, tmp / "local.parquet", config),
        lambda: compute_dataset(str(source), str(tmp / "ray"), config, engine=Ray(partitions=partitions)),
    ):
        try:
            outcomes.append(run().to_dict())
        except GrpoError as error:
            outcomes.append(error)
    local, ray = outcomes
    assert isinstance(local, GrpoError) == isinstance(ray, GrpoError), (local, ray)
    if isinstance(local, GrpoError):
        assert not (tmp / "local.parquet").exists() and not (tmp / "ray").exists()
        return
    left = pq.read_table(tmp / "local.parquet")
    right = pa.concat_tables(
        [pq.read_table(f) for f in sorted((tmp / "ray").glob("*.parquet"))], promote_options="permissive"
    )
    assert left.schema.equals(right.schema, check_metadata=False)
    for name in left.column_names:
        a, b = left.column(name), right.column(name)
        if pa.types.is_floating(a.type):
            assert np.array_equal(bits(a.to_numpy()), bits(b.to_numpy())), name
        else:
            assert a.equals(b), name
    compare_summaries(local, ray)
    assert local["dropped"] == ray["dropped"]
    if not drop_inactive and keep_mean_range is None:
        checked_local = check_dataset(source, CheckBounds(), config).to_dict()
        checked_ray = check_dataset(
            str(source), CheckBounds(), config, engine=Ray(partitions=partitions)
        ).to_dict()
        compare_summaries(checked_local, checked_ray)
        assert checked_local["advantage"] == local["advantage"]


def test_ray_finds_groups_that_span_steps_as_the_local_engine_does(ray_instance, tmp_path):
    """The watched step column's lowest and highest value per group are pass-1 figures merged by
    min and max: the reducers find the groups across steps that the local engine finds."""
    from grpo_cli.jobs import check_dataset
    from grpo_cli.options.checks import CheckBounds

    rng = random.Random(5)
    rows = [
        {"step": s, "prompt": f"p{p}", "reward": float(rng.random() < 0.5)}
        for s in range(4)
        for p in range(30)
        for _ in range(4)
    ]
    rows += [{"step": 9, "prompt": f"q{p}", "reward": float(i % 2)} for p in range(10) for i in range(4)]
    rng.shuffle(rows)
    for i in range(3):
        pq.write_table(pa.Table.from_pylist(rows[i::3]), tmp_path / f"part-{i}.parquet")
    config = ComputeConfig(rewards=("reward",), group_cols=("prompt",), stats_block_rows=97)
    local = check_dataset(tmp_path, CheckBounds(sound_grouping=True), config).to_dict()
    ray = check_dataset(
        str(tmp_path), CheckBounds(sound_grouping=True), config, engine=Ray(partitions=3)
    ).to_dict()
    assert local["findings"][0]["groups"] == 30 and local["findings"][0]["kind"] == "groups_span_steps"
    assert ray["findings"] == local["findings"] and ray["checks"] == local["checks"]


def test_a_long_tmpdir_takes_a_short_root_for_rays_sockets_or_is_refused(monkeypatch, tmp_path):
    """A TMPDIR of 28 characters or more made every --engine ray run exit 70 (Ray's socket paths
    passed the 107 bytes a Unix socket path holds): /tmp is taken, or one line names the limit."""
    import tempfile

    from grpo_cli.engines import ray as ray_engine
    from grpo_cli.scratch import SOCKET_PATH_BYTES

    monkeypatch.setattr(tempfile, "gettempdir", lambda: "/t")
    assert ray_engine.session._short_temp_root() is None  # short enough: TMPDIR itself
    long = "/" + "a" * 40
    monkeypatch.setattr(tempfile, "gettempdir", lambda: long)
    assert ray_engine.session._short_temp_root() == "/tmp"
    assert len("/tmp") + ray_engine.session.RAY_SOCKET_TAIL <= SOCKET_PATH_BYTES
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(
        GrpoError, match=r"too long for Ray's socket paths \(107 bytes\) and /tmp is not writable"
    ):
        ray_engine.session._short_temp_root()


@pytest.mark.slow
def test_a_ray_run_under_a_long_tmpdir_runs(tmp_path):
    folder = tmp_path / ("x" * 60)  # a TMPDIR of about 110 characters
    folder.mkdir()
    sample = Path(__file__).resolve().parents[2] / "sample_data" / "rollouts.parquet"
    run = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "check", str(sample), "-r", "correct", "--engine", "ray", "-q"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(folder)},
    )
    assert run.returncode == 0, run.stderr


def _descendants_naming(root: str) -> list[str]:
    """The command lines of the processes still running that name ``root`` (a Ray instance's
    folder) or that Ray titled ``ray::`` and whose environment names it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if root in command and state != "Z":
            found.append(command[:120])
    return found


@pytest.mark.slow
@pytest.mark.parametrize("when", ["while Ray starts", "while the jobs run"])
def test_sigterm_under_ray_ends_the_run_as_an_interrupt_and_stops_what_it_started(tmp_path, when):
    """SIGTERM while Ray ran exited 15 with no message (ray.init's own handler), and in one of
    two runs left 7 Ray processes alive 3 s after the CLI exited. Exit 130, one line, and no
    process of the run's instance left once it has exited."""
    import tempfile
    import time

    root = tempfile.mkdtemp(prefix="grpo-t-", dir="/tmp")  # short: Ray's sockets live under it
    try:
        rng = np.random.default_rng(0)
        rows = 2_000_000
        path = tmp_path / "big.parquet"
        pq.write_table(
            pa.table(
                {"group_id": rng.permutation(rows) // 8, "reward": (rng.random(rows) < 0.5).astype(float)}
            ),
            path,
            row_group_size=100_000,
        )
        run = subprocess.Popen(
            [sys.executable, "-m", "grpo_cli", "check", str(path), "--engine", "ray", "-q"],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TMPDIR": root},
        )
        deadline = time.monotonic() + 120
        started = lambda: any("session_" in p.name for p in Path(root).glob("grpo-ray-*/*"))  # noqa: E731
        workers = lambda: any("raylet" in c for c in _descendants_naming(root))  # noqa: E731
        ready = started if when == "while Ray starts" else workers
        while not ready() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if when == "while the jobs run":
            time.sleep(1.0)
        run.send_signal(signal.SIGTERM)
        code = run.wait(timeout=120)
        assert run.stderr is not None
        assert code == 130, run.stderr.read()
        assert run.stderr.read().strip().endswith("error: interrupted; no output was written")
        time.sleep(3)
        assert _descendants_naming(root) == []
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
