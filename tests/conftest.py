"""Shared fixtures: small rollout datasets written as Parquet and JSONL, and a CLI runner."""

from __future__ import annotations

import hashlib
import json
import math
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from grpo_cli.choices import Estimator, Preset, choices_of
from grpo_cli.cli import app


def rollout_rows(
    n_groups: int = 12,
    group_size: int = 4,
    *,
    seed: int = 0,
    key: str = "uid",
    shuffle: bool = True,
    singletons: int = 1,
) -> list[dict[str, Any]]:
    """Rows with a text column, a binary and a continuous reward; some constant groups."""
    rng = random.Random(seed)
    rows = []
    for g in range(n_groups + singletons):
        size = 1 if g >= n_groups else group_size
        kind = g % 4  # 0: all wrong, 1: all right, 2-3: mixed
        group_key: Any = {"uid": f"{rng.getrandbits(64):016x}", "int": 1000 + 7 * g, "small": g}[key]
        for i in range(size):
            correct = 0 if kind == 0 else 1 if kind == 1 else int(rng.random() < 0.5)
            rows.append(
                {
                    "group_id": group_key,
                    "step": g % 3,
                    "text": f"completion {g}-{i} " + "x" * rng.randint(0, 20),
                    "correct": correct,
                    "reward": round(correct + rng.uniform(-0.2, 0.2), 5),
                }
            )
    if shuffle:
        rng.shuffle(rows)
    return rows


def digest(path: Path) -> str:
    """The SHA-256 of a file's bytes: that an input was not touched, that two outputs are equal."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_one_line_error(result: Result, *fragments: str) -> None:
    """Exit 2 and one ``error:`` line on standard error holding each fragment, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.stdout)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def one_line_error(result: Result, code: int = 2, *fragments: str) -> str:
    """Exit ``code`` and one ``error:`` line holding each fragment; the line."""
    assert result.exit_code == code, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def run_python(
    script: str, *args: object, timeout: float = 300, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """``script`` run by this interpreter in a process of its own (``python -c script args``),
    its output captured as text; ``kwargs`` go to :func:`subprocess.run` (``env``, ``cwd``, ``check``)."""
    return subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def write_parquet(path: Path, rows: Sequence[dict[str, Any]], **kwargs: Any) -> Path:
    pq.write_table(pa.Table.from_pylist(list(rows)), path, **kwargs)
    return path


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def rows() -> list[dict[str, Any]]:
    return rollout_rows()


@pytest.fixture
def parquet_file(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    return write_parquet(tmp_path / "rollouts.parquet", rows)


@pytest.fixture
def jsonl_file(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    return write_jsonl(tmp_path / "rollouts.jsonl", rows)


@pytest.fixture
def cli() -> Callable[..., Result]:
    runner = CliRunner()

    def invoke(*args: str | Path, input: str | bytes | None = None) -> Result:
        return runner.invoke(app, [str(a) for a in args], input=input)

    return invoke


# --------------------------------------------------------------------------- entry-point parity

PARITY_ESTIMATORS = choices_of(Estimator)
PARITY_PRESETS = (None, *choices_of(Preset))


def parity_case(seed: int, *, estimator: str, preset: str | None) -> dict[str, Any]:
    """Random rollouts for one estimator and preset, as every entry point takes them.

    The seed draws the size, the dtype, the layout (explicit IDs, consecutive blocks of
    ``group_size``, or 2-D rows), singletons and constant groups, NaN rewards (when the preset
    or a coin ignores them), training batches and the reader's record batch size. Returns the
    ``table`` (columns reward, group_id, and length, baseline, batch where used), the tensor
    API's ``tensor_args``, and the options of each API (``keywords``, ``flags``).
    """
    import torch

    from grpo_cli.options.advantage import PRESETS

    rng = np.random.default_rng(seed)
    layout = ("ids", "size", "2d")[seed % 3]
    dtype = (np.float64, np.float32)[(seed // 3) % 2]
    size = int(rng.integers(2, 6))
    groups = int(rng.integers(3, 12))
    if layout == "ids":
        sizes = rng.integers(1, 7, groups)
        ids = np.repeat(rng.permutation(groups), sizes)
        ids = ids[rng.permutation(ids.size)]
    else:
        ids = np.repeat(np.arange(groups), size)
    n = ids.size
    kind = rng.integers(0, 4, groups)  # 0: constant group, 1: binary, 2: continuous, 3: a few values
    values = np.where(
        kind[ids] == 0,
        0.5,
        np.where(
            kind[ids] == 1,
            rng.integers(0, 2, n),
            np.where(kind[ids] == 2, rng.normal(0, 1, n), rng.integers(0, 3, n) / 4),
        ),
    ).astype(dtype)
    settings = dict(PRESETS[preset].settings) if preset else {}
    nan = settings.get("nan", "error")
    if nan == "error" and rng.random() < 0.3:
        nan = "ignore"
    if nan == "ignore":
        values[rng.random(n) < 0.1] = np.nan
    batches = int(rng.integers(1, 4))
    keywords: dict[str, Any] = {"estimator": estimator, "preset": preset, "nan": nan}
    flags = ["--estimator", estimator, "--nan", nan] + (["--preset", preset] if preset else [])
    columns: dict[str, Any] = {"reward": values, "group_id": ids.astype(np.int64)}
    tensor_extra: dict[str, Any] = {}
    whitens = estimator in ("reinforce_plus_plus_baseline", "reinforce_baseline", "reinforce")
    if estimator == "opo" or (whitens and seed % 2):
        columns["length"] = rng.integers(1, 50, n).astype(np.int64)
        keywords["length_col"], tensor_extra["lengths"] = "length", torch.from_numpy(columns["length"])
        flags += ["--length-col", "length"]
    if estimator == "pass_at_k":
        k = int(rng.integers(1, 5))
        keywords["pass_k"] = k
        flags += ["--pass-k", str(k)]
    if estimator == "remax":
        columns["baseline"] = (rng.integers(0, 3, n) / 2).astype(dtype)
        keywords["baseline_col"], tensor_extra["baselines"] = (
            "baseline",
            torch.from_numpy(columns["baseline"]),
        )
        flags += ["--baseline-col", "baseline"]
    if batches > 1 and (whitens or estimator == "gpg" or seed % 4 == 0):
        columns["batch"] = (ids % batches).astype(np.int64)
        keywords["batch_col"], tensor_extra["batch_ids"] = "batch", torch.from_numpy(columns["batch"])
        flags += ["--batch-col", "batch"]
        if estimator in ("grpo", "dr_grpo") and seed % 8 == 0:
            keywords["scale"] = "batch"
            flags += ["--scale", "batch"]
    batch_rows = int(rng.integers(1, n + 1)) if seed % 2 else None
    rewards = torch.from_numpy(values)
    tensor_args: dict[str, Any] = {"group_ids": torch.from_numpy(ids.astype(np.int64))}
    if layout == "size":
        tensor_args = {"group_size": size}
        keywords["group_size"] = size
        flags += ["--group-size", str(size)]
    else:
        flags += ["-g", "group_id"]
    if layout == "2d":
        rewards = rewards.view(groups, size)
        tensor_args = {}
        tensor_extra = {name: value.view(groups, size) for name, value in tensor_extra.items()}
    if batch_rows is not None:
        keywords["batch_rows"] = batch_rows
        flags += ["--batch-rows", str(batch_rows)]
    return {
        "table": pa.table(columns),
        "rewards": rewards,
        "row_ids": ids,
        "tensor_args": {
            **tensor_args,
            **tensor_extra,
            **{k: v for k, v in keywords.items() if k in ("estimator", "preset", "nan", "scale", "pass_k")},
        },
        "keywords": keywords,
        "flags": flags,
        "layout": layout,
    }


def bits(values: Any) -> Any:
    """Float values as their bit patterns (``-0.0`` and ``+0.0`` differ, NaNs compare)."""

    array = np.asarray(values)
    return array.view({8: np.uint64, 4: np.uint32, 2: np.uint16}[array.dtype.itemsize])


# --------------------------------------------------------------------------- outputs read back


def assert_same_rows(a: Path, b: Path) -> None:
    """The same rows and columns, read back by pyarrow, polars and duckdb."""
    import duckdb
    import polars as pl

    left, right = pq.read_table(a), pq.read_table(b)
    assert left.equals(right), (left.schema, right.schema)
    assert pl.read_parquet(a).equals(pl.read_parquet(b))
    query = "SELECT * FROM read_parquet('{}') ORDER BY ALL"
    assert duckdb.execute(query.format(a)).fetchall() == duckdb.execute(query.format(b)).fetchall()


# --------------------------------------------------------------------------- drawn rollout datasets

KEY_TYPES = {
    "int64": pa.int64(),
    "int32": pa.int32(),
    "uint64": pa.uint64(),
    "string": pa.string(),
    "large_string": pa.large_string(),
    "dictionary": pa.string(),
}
REWARD_TYPES = {"float32": pa.float32(), "float64": pa.float64(), "int8": pa.int8(), "bool": pa.bool_()}
TEXT_FORMATS = ("jsonl", "csv")  # carry plain keys only: no dictionary, no uint64 past int64


def _case_key(kind: str, group: int) -> Any:
    if kind in ("int64", "int32"):
        return group * 7 - 20
    if kind == "uint64":
        return (1 << 63) + group
    return f"prompt-{group:04d}"


@st.composite
def rollout_cases(draw: st.DrawFn) -> dict[str, Any]:
    """A small rollout dataset, drawn: up to 30 groups of 1 to 6 rows, sorted or shuffled; the
    key's type, the reward's type and its bad values (null, NaN, infinity); the format (a
    Parquet file with small row groups, a folder of two Parquet shards cut anywhere, JSON lines,
    CSV). :func:`write_case` writes it."""
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=30))
    rows_of = [g for g, size in enumerate(sizes) for _ in range(size)]
    layout = draw(st.sampled_from(["sorted", "shuffled"]))
    if layout == "shuffled":
        rows_of = draw(st.permutations(rows_of))
    key_kind = draw(st.sampled_from(sorted(KEY_TYPES)))
    reward_kind = draw(st.sampled_from(sorted(REWARD_TYPES)))
    if reward_kind in ("float32", "float64"):
        value = st.sampled_from([0.0, 1.0, 0.5, -2.25]) | st.floats(-1e3, 1e3, width=32)
        bad = st.sampled_from([None, math.nan, math.inf])
    elif reward_kind == "int8":
        value, bad = st.integers(-5, 5), st.just(None)
    else:
        value, bad = st.booleans(), st.just(None)
    with_bad = draw(st.booleans())
    values = [draw(bad if with_bad and draw(st.integers(0, 9)) == 0 else value) for _ in rows_of]
    fmt = draw(st.sampled_from(["parquet", "shards", "jsonl", "csv"]))
    if fmt in TEXT_FORMATS and key_kind in ("dictionary", "uint64", "large_string"):
        fmt = "parquet"
    return {
        "rows_of": rows_of,
        "key_kind": key_kind,
        "reward_kind": reward_kind,
        "values": values,
        "format": fmt,
        "row_group_size": draw(st.sampled_from([3, 17, 1 << 20])),
        "cut": draw(st.floats(0, 1)),
    }


def write_case(tmp: Path, case: dict[str, Any]) -> tuple[Path, pa.Table]:
    """A :func:`rollout_cases` dataset written under ``tmp`` (columns uid, reward, and row, the
    row's place as ``r<i>``): its path and the table written."""
    keys = pa.array([_case_key(case["key_kind"], g) for g in case["rows_of"]], KEY_TYPES[case["key_kind"]])
    if case["key_kind"] == "dictionary":
        keys = keys.dictionary_encode()
    table = pa.table(
        {
            "uid": keys,
            "reward": pa.array(case["values"], REWARD_TYPES[case["reward_kind"]], from_pandas=False),
            "row": pa.array([f"r{i}" for i in range(len(case["rows_of"]))]),
        }
    )
    fmt = case["format"]
    if fmt == "parquet":
        path = tmp / "in.parquet"
        pq.write_table(table, path, row_group_size=case["row_group_size"])
    elif fmt == "shards":
        path = tmp / "in"
        path.mkdir()
        cut = int(case["cut"] * table.num_rows)
        for index, (start, stop) in enumerate(((0, cut), (cut, table.num_rows))):
            pq.write_table(table.slice(start, stop - start), path / f"part-{index}.parquet")
    elif fmt == "jsonl":
        path = tmp / "in.jsonl"
        lines = []
        for row in table.to_pylist():
            reward = row["reward"]
            if isinstance(reward, float) and not math.isfinite(reward):
                reward = None  # JSON holds no NaN nor infinity
            lines.append(json.dumps({**row, "reward": reward}) + "\n")
        path.write_text("".join(lines))
    else:
        path = tmp / "in.csv"
        pa_csv.write_csv(table, path)
    return path, table


REWARD_SHAPINGS = [
    {},
    {"reward_bias": 0.5, "reward_scale": 2.0},
    {"reward_bias": -1.0, "reward_scale": 0.25, "reward_clip": (-1.0, 1.0)},
    {"reward_clip": (0.0, 0.5)},
]


# --------------------------------------------------------------------------- the summary's schema

SUMMARY_SCHEMA = Path(__file__).resolve().parents[1] / "grpo_cli" / "results" / "summary.schema.json"
VALIDATED_SUMMARIES = [0]


@pytest.fixture(autouse=True, scope="session")
def _every_summary_meets_its_schema() -> Any:
    """Every summary a test makes in this process (``RunSummary.to_dict``: the CLI's
    ``--summary-json``, the jobs' results) is validated against the published JSON Schema, in
    its JSON form (NaN as null); one that does not fits fails the test that made it, as does one
    that holds an option marker of :func:`grpo_cli.errors.mention`, which only errors word."""
    import jsonschema

    from grpo_cli.results import summary as summary_module

    validator = jsonschema.Draft202012Validator(json.loads(SUMMARY_SCHEMA.read_text()))
    made = summary_module.RunSummary.to_dict

    def to_dict(self: Any) -> dict[str, Any]:
        out = made(self)
        errors = sorted(
            validator.iter_errors(summary_module._finite_or_none(out)), key=lambda e: list(e.path)
        )
        if errors:
            where = "/".join(str(part) for part in errors[0].path) or "(top)"
            raise AssertionError(f"the summary does not meet its schema at {where}: {errors[0].message}")
        if "\x1f" in json.dumps(out):
            raise AssertionError("the summary holds an option marker (errors.mention) meant for an error")
        VALIDATED_SUMMARIES[0] += 1
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(summary_module.RunSummary, "to_dict", to_dict)
        yield


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if VALIDATED_SUMMARIES[0]:
        terminalreporter.write_line(
            f"{VALIDATED_SUMMARIES[0]} run summaries were validated against {SUMMARY_SCHEMA.name}"
        )


def with_advantage_changed(source: Path, changed: Path, *, row: int, by: float) -> Path:
    """A copy of a grpo-cli output, its provenance kept, with one row's advantage moved ``by``."""
    table = pq.read_table(source)
    advantages = table.column("advantage").to_pylist()
    advantages[row] += by
    pq.write_table(
        table.set_column(
            table.schema.get_field_index("advantage"), "advantage", pa.array(advantages)
        ).replace_schema_metadata(table.schema.metadata),
        changed,
    )
    return changed
