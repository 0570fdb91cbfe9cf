"""Shared fixtures: small rollout datasets written as Parquet and JSONL, and a CLI runner."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner, Result

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
