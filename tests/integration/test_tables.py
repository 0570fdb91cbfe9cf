"""The table API: add_advantages and summarize on every container, against the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import grpo_cli
from grpo_cli import GrpoError, add_advantages, summarize
from grpo_cli.jobs import compute_dataset
from grpo_cli.tables import UnsupportedContainer

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "rollouts.parquet"


@pytest.fixture(scope="module")
def cli_output(tmp_path_factory):
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    folder = tmp_path_factory.mktemp("cli")
    out, summary = folder / "out.parquet", folder / "summary.json"
    args = ["compute", str(SAMPLE), "-o", str(out), "-r", "correct", "--summary-json", str(summary), "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    return pq.read_table(out), json.loads(summary.read_text())


def as_container(kind: str, table: pa.Table):
    if kind == "pyarrow":
        return table
    if kind == "pyarrow-batch":
        return table.combine_chunks().to_batches()[0]
    if kind == "pyarrow-views":  # text as string views, as polars' newest Arrow export gives it
        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        views = frame.to_arrow(compat_level=pl.CompatLevel.newest())
        assert pa.string_view() in views.schema.types
        return views
    if kind == "polars":
        return pl.from_arrow(table)
    if kind == "polars-lazy":
        return pl.from_arrow(table).lazy()  # type: ignore[union-attr]
    if kind == "pandas":
        return table.to_pandas()
    datasets = pytest.importorskip("datasets")
    return datasets.Dataset(table)


def column(result, name: str) -> list[object]:
    if isinstance(result, pl.LazyFrame):
        result = result.collect()
    if isinstance(result, pa.Table | pa.RecordBatch):
        values: list[object] = result.column(name).to_pylist()
        return values
    return list(result[name])  # polars, pandas, datasets


KINDS = ["pyarrow", "pyarrow-batch", "pyarrow-views", "polars", "polars-lazy", "pandas", "datasets"]


@pytest.mark.parametrize("kind", KINDS)
def test_each_container_gets_the_cli_advantages(kind, cli_output):
    expected, _ = cli_output
    data = as_container(kind, pq.read_table(SAMPLE))
    result = add_advantages(data, reward_col="correct")
    assert type(result) is type(data)
    assert column(result, "advantage") == expected.column("advantage").to_pylist()
    assert column(result, "group_active") == expected.column("group_active").to_pylist()
    assert column(result, "completion") == expected.column("completion").to_pylist()


@pytest.mark.parametrize("kind", KINDS)
def test_each_container_filters_rows_like_the_cli(kind, tmp_path):
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    out = tmp_path / "o.parquet"
    args = ["compute", str(SAMPLE), "-o", str(out), "-r", "correct", "--drop-inactive", "--stats-cols", "-q"]
    assert CliRunner().invoke(app, args).exit_code == 0
    expected = pq.read_table(out)
    result = add_advantages(
        as_container(kind, pq.read_table(SAMPLE)), reward_col="correct", drop_inactive=True, stats_cols=True
    )
    for name in ("sample_index", "advantage", "advantage_group_std", "advantage_group_size"):
        assert column(result, name) == expected.column(name).to_pylist()


def test_a_lazy_frame_stays_lazy_until_collected():
    lazy = pl.scan_parquet(SAMPLE)
    result = add_advantages(lazy, reward_col="correct", estimator="rloo")
    assert isinstance(result, pl.LazyFrame)
    eager = add_advantages(pl.read_parquet(SAMPLE), reward_col="correct", estimator="rloo")
    assert result.collect_schema() == eager.schema  # known before anything is computed
    assert result.collect().equals(eager)


def test_pandas_keeps_its_index_and_the_input_is_not_changed():
    frame = pq.read_table(SAMPLE).to_pandas()
    frame.index = frame.index * 10 + 5
    before = frame.copy()
    result = add_advantages(frame, reward_col="correct", drop_inactive=True)
    pd.testing.assert_frame_equal(frame, before)
    assert set(result.index) <= set(frame.index) and len(result) < len(frame)
    assert (result["group_active"]).all()


def test_reward_weights_and_several_keys_match_the_cli(tmp_path):
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    out = tmp_path / "o.parquet"
    args = [
        str(SAMPLE),
        "-o",
        str(out),
        "-r",
        "correct:0.5",
        "-r",
        "reward:2",
        "-g",
        "group_id",
        "-g",
        "prompt",
    ]
    assert CliRunner().invoke(app, ["compute", *args, "-q"]).exit_code == 0
    result = add_advantages(
        pq.read_table(SAMPLE), reward_col={"correct": 0.5, "reward": 2}, group_col=["group_id", "prompt"]
    )
    assert result.column("advantage").equals(pq.read_table(out).column("advantage"))


def test_nested_fields_and_group_size():
    table = pa.table(
        {
            "reward": pa.array([{"score": s} for s in [1.0, 0.0, 1.0, 1.0]]),
            "meta": pa.array([{"prompt_id": p} for p in ["a", "a", "b", "b"]]),
        }
    )
    result = add_advantages(table, reward_col="reward.score", group_col="meta.prompt_id")
    assert result.column("group_active").to_pylist() == [True, True, False, False]
    by_size = add_advantages(table, reward_col="reward.score", group_size=2)
    assert by_size.column("advantage").equals(result.column("advantage"))


def test_a_preset_applies_as_on_the_cli():
    table = pa.table({"group_id": [0, 0, 0], "reward": [1.0, 0.0, 0.0]})
    trl = add_advantages(table, preset="trl").column("advantage").to_pylist()
    sample_std = np.std([1.0, 0.0, 0.0], ddof=1)
    assert trl[0] == pytest.approx((1 - 1 / 3) / (sample_std + 1e-4), rel=1e-12)


def test_summarize_has_the_summary_json_keys(cli_output):
    _, expected = cli_output
    summary = summarize(pq.read_table(SAMPLE), reward_col="correct")
    got = summary.to_dict()
    assert set(got) == set(expected)
    for key in ("rows", "groups", "active_groups", "inactive_by_value", "reward", "advantage"):
        assert got[key] == expected[key], key
    assert json.loads(summary.to_json())["groups"] == expected["groups"]


def test_errors_name_the_column_without_printing_the_data():
    table = pq.read_table(SAMPLE)
    with pytest.raises(GrpoError, match="no column 'score'") as error:
        add_advantages(table, reward_col="score")
    assert len(str(error.value)) < 400 and "completion" in str(error.value)  # names, not values
    with pytest.raises(GrpoError, match=r"no column 'meta\.prompt_id'"):
        add_advantages(table, reward_col="correct", group_col="meta.prompt_id")
    with pytest.raises(GrpoError, match="must be one of"):
        add_advantages(table, reward_col="correct", std="bessel")


@pytest.mark.parametrize(
    "data", [[{"reward": 1.0}], {"reward": [1.0]}, np.zeros(3)], ids=["list", "dict", "numpy"]
)
def test_an_unsupported_container_is_refused(data):
    with pytest.raises(UnsupportedContainer, match=r"expected a pyarrow\.Table") as error:
        add_advantages(data)
    assert isinstance(error.value, TypeError) and isinstance(error.value, GrpoError)


def test_a_dataset_dict_asks_for_a_split():
    datasets = pytest.importorskip("datasets")
    both = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"group_id": [0], "reward": [1.0]})})
    with pytest.raises(UnsupportedContainer, match=r"splits train\); pass one split"):
        add_advantages(both)


def test_an_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'stdev'"):
        add_advantages(pa.table({"group_id": [0], "reward": [1.0]}), stdev="sample")


@pytest.mark.parametrize("function", [add_advantages, summarize])
def test_the_signature_types_every_option_keyword(function):
    import inspect
    from typing import Literal, get_args

    from grpo_cli.options.catalog import keywords

    parameters = inspect.signature(function).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    offered = set(keywords()) - {"from_", "advantage_col", "active_col"}
    assert offered <= set(parameters)
    std = parameters["std"]
    assert std.default is None and get_args(std.annotation)[0] == Literal["population", "sample"]
    assert parameters["drop_inactive"].default is False
    assert "rewrite" not in parameters  # a CLI-only option is no keyword


def test_a_column_name_given_as_its_default_is_still_given():
    """A dump's own names apply where the caller names none; a name the caller gives is theirs,
    even when it is grpo-cli's default (TRL's dump holds its own ``advantage``)."""
    [completions] = sorted((SAMPLE.parent / "dumps" / "trl").rglob("*.parquet"))[:1]
    table = pq.read_table(completions)
    assert "advantage" in table.column_names
    assert add_advantages(table, from_="trl").column_names[-2:] == ["recomputed_advantage", "group_active"]
    with pytest.raises(
        GrpoError, match="already has a column 'advantage'; choose another name with advantage_col="
    ):
        add_advantages(table, from_="trl", advantage_col="advantage")
    assert summarize(table, from_="trl", reward_col="format_reward").to_dict()["options"]["reward_cols"] == [
        {"column": "format_reward", "weight": 1.0}
    ]


def test_the_file_jobs_refuse_a_table_in_one_line():
    with pytest.raises(TypeError, match="add_advantages takes tables in memory") as error:
        compute_dataset(pq.read_table(SAMPLE), None)  # type: ignore[arg-type]
    assert len(str(error.value)) < 200


def test_compute_config_takes_plain_names():
    config = grpo_cli.ComputeConfig(rewards=("correct",), group_cols="group_id")  # type: ignore[arg-type]
    assert [r.column for r in config.rewards] == ["correct"] and config.group_cols == ("group_id",)


def test_a_record_batch_with_every_group_dropped_is_an_empty_batch():
    """It raised IndexError (no batch to return)."""
    import grpo_cli

    batch = pa.record_batch({"group_id": [0, 0], "reward": [1.0, 1.0]})
    out = grpo_cli.add_advantages(batch, drop_inactive=True)
    assert isinstance(out, pa.RecordBatch)
    assert out.num_rows == 0 and out.schema.names == ["group_id", "reward", "advantage", "group_active"]


def test_a_lazy_frame_without_the_reward_column_is_refused_at_once():
    """It raised AttributeError while building the output schema."""
    import polars as pl

    import grpo_cli

    with pytest.raises(GrpoError, match="no column 'reward' \\(the columns are group_id, x\\)"):
        grpo_cli.add_advantages(pl.LazyFrame({"group_id": [0, 0], "x": [1.0, 1.0]}))
