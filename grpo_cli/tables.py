"""The table API: GRPO advantages added to the table you already hold.

:func:`add_advantages` takes a ``pyarrow.Table`` (or ``RecordBatch``), a
``polars.DataFrame`` or ``LazyFrame``, a ``pandas.DataFrame`` or a ``datasets.Dataset``
and returns the same kind of object with the advantage and activity columns appended
(rows kept in order; filtered when ``drop_inactive`` or ``keep_mean_range`` asks). It
runs the CLI's engine in memory: same options, same exactness, same errors
(:class:`~grpo_cli.errors.GrpoError`, a ``ValueError``, naming the column, never
printing the data). :func:`summarize` returns the run summary instead. polars, pandas
and datasets are imported only when such an object is passed.

>>> import pyarrow as pa
>>> table = pa.table({"group_id": [0, 0, 1, 1], "reward": [1.0, 0.0, 1.0, 1.0]})
>>> add_advantages(table).to_pydict()["advantage"]
[0.999998000004, -0.999998000004, 0.0, 0.0]
>>> summarize(table).to_dict()["active_groups"]
1
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from inspect import Parameter, signature
from typing import Any

import numpy as np
import pyarrow as pa

from grpo_cli.arrow.columns import take_rows
from grpo_cli.choices import Preset
from grpo_cli.errors import GrpoError
from grpo_cli.jobs import check_table, compute_table, summarize_table
from grpo_cli.options.advantage import RewardSpec
from grpo_cli.options.catalog import OPTIONS, keyword_named, keywords
from grpo_cli.options.config import ComputeConfig, resolve_config
from grpo_cli.results.summary import RunSummary
from grpo_cli.run.plan import RunPlan

ROW_INDEX = "__grpo_cli_row__"  # carried through a filtering run to tell which rows were kept
CONTAINERS = (
    "a pyarrow.Table or RecordBatch, polars.DataFrame or LazyFrame, pandas.DataFrame or datasets.Dataset"
)


class UnsupportedContainer(GrpoError, TypeError):
    """``data`` is not a kind of table grpo-cli can add columns to."""


def add_advantages(
    data: Any,
    *,
    reward_col: str | Sequence[str] | Mapping[str, float] | None = None,
    group_col: str | Sequence[str] | None = None,
    group_size: int | None = None,
    preset: Preset | None = None,
    advantage_col: str | None = None,
    active_col: str | None = None,
    whiten: bool | str = False,
    **options: Any,
) -> Any:
    """``data`` with the advantage and group-activity columns appended; the same kind of object.

    ``reward_col``: a column (``"reward"`` when not given), several (summed), or
    ``{column: weight}``; a struct field is addressed with dots (``"reward.score"``).
    ``group_col``: one key column (``"group_id"`` when not given) or several; a list or struct
    column (chat messages) is grouped on its exact value. ``group_size=N`` takes consecutive
    runs of N rows as groups instead. ``advantage_col`` and ``active_col`` name the new columns
    (``"advantage"``, ``"group_active"``). Every other CLI option is a keyword of the same name,
    typed in this function's signature (``estimator="rloo"``, ``std="sample"``,
    ``drop_inactive=True``, ``keep_mean_range=(0.1, 0.9)``, ``stats_cols=True``, ...); ``None``,
    a keyword's default, means not given: the preset's or the option's default applies.
    The advantage column is float64, or float32/float16 for rewards of that type.

    A ``polars.LazyFrame`` stays lazy: the columns are computed when it is collected
    (on the whole frame at once, since a group's statistics need all its rows).
    """
    with _in_keyword_words():
        trainer = options.pop("from_", None)
        if trainer is not None:
            kind, table = _to_arrow(data.collect() if _kind(data) == "polars-lazy" else data)
            table, implied = _dump_view(trainer, table, group_size)
            if advantage_col is not None:
                implied.pop("advantage_col", None)
            config = _config(
                reward_col, group_col, group_size, preset, advantage_col, active_col, whiten, options, implied
            )
            rebuilt = _rebuild(
                kind, _to_polars(data) if kind == "polars" else data, *_new_columns(table, config)
            )
            return rebuilt.lazy() if _kind(data) == "polars-lazy" else rebuilt
        config = _config(
            reward_col, group_col, group_size, preset, advantage_col, active_col, whiten, options
        )
        if _kind(data) == "polars-lazy":
            return _lazy(data, config)
        kind, table = _to_arrow(data, reads=config.input_columns)
        return _rebuild(kind, data, *_new_columns(table, config))


def summarize(
    data: Any,
    *,
    reward_col: str | Sequence[str] | Mapping[str, float] | None = None,
    group_col: str | Sequence[str] | None = None,
    group_size: int | None = None,
    preset: Preset | None = None,
    whiten: bool | str = False,
    **options: Any,
) -> RunSummary:
    """The run summary of ``data`` (a ``LazyFrame`` is collected): what ``--summary-json``
    writes, as a :class:`~grpo_cli.results.summary.RunSummary` (``.to_dict()``, ``.to_json()``).

    Takes the options of :func:`add_advantages`.
    """
    with _in_keyword_words():
        trainer = options.pop("from_", None)
        if _kind(data) == "polars-lazy":
            data = data.collect()
        if trainer is None:
            config = _config(reward_col, group_col, group_size, preset, None, None, whiten, options)
            return summarize_table(_to_arrow(data, reads=config.input_columns)[1], config)
        table, implied = _dump_view(trainer, _to_arrow(data)[1], group_size)
        config = _config(reward_col, group_col, group_size, preset, None, None, whiten, options, implied)
        return summarize_table(table, config)


_NAMED = frozenset(
    {"reward_col", "group_col", "group_size", "preset", "advantage_col", "active_col", "whiten", "from_"}
)
"""The keywords the table API names in its own signatures (their types differ from the CLI's)."""


def _typed_keywords(func: Callable[..., Any]) -> None:
    """``func`` whose signature lists every option keyword of the catalogue in place of its
    ``**options``, typed and defaulting to "not given", as ``help()`` and editors read it."""
    parameters = [p for p in signature(func).parameters.values() if p.kind is not Parameter.VAR_KEYWORD]
    parameters += [
        Parameter(name, Parameter.KEYWORD_ONLY, default=OPTIONS[name].default, annotation=OPTIONS[name].kind)
        for name in keywords()
        if name not in _NAMED
    ]
    func.__signature__ = signature(func).replace(parameters=parameters)  # type: ignore[attr-defined]


_typed_keywords(add_advantages)
_typed_keywords(summarize)


@contextlib.contextmanager
def _in_keyword_words() -> Iterator[None]:
    """Errors name the keyword the caller wrote (``advantage_col=``), not the CLI's flag."""
    try:
        yield
    except GrpoError as exc:
        if not exc.options:
            raise
        raise exc.worded(keyword_named) from None


# --------------------------------------------------------------------------- options


def _dump_view(trainer: str, table: pa.Table, group_size: int | None) -> tuple[pa.Table, dict[str, Any]]:
    from grpo_cli.trainers.dumps import of_table

    return of_table(trainer, table, group_size=group_size)


def _to_polars(data: Any) -> Any:
    return data.collect() if _kind(data) == "polars-lazy" else data


def _config(
    reward_col: str | Sequence[str] | Mapping[str, float] | None,
    group_col: str | Sequence[str] | None,
    group_size: int | None,
    preset: Preset | None,
    advantage_col: str | None,
    active_col: str | None,
    whiten: bool | str,
    options: dict[str, Any],
    dump: dict[str, Any] | None = None,
) -> ComputeConfig:
    others = [name for name in keywords() if name not in _NAMED]
    unknown = sorted(set(options) - set(others))
    if unknown:
        raise TypeError(
            f"unexpected keyword argument {unknown[0]!r}; the options are {', '.join(sorted(others))}"
        )
    return resolve_config(
        {
            **options,
            "reward_col": None if reward_col is None else _reward_specs(reward_col),
            "group_col": group_col,
            "group_size": group_size,
            "preset": preset,
            "advantage_col": advantage_col,
            "active_col": active_col,
            "whiten": whiten,
        },
        dump=dump,
    )


def _reward_specs(reward_col: str | Sequence[str] | Mapping[str, float]) -> tuple[RewardSpec, ...]:
    if isinstance(reward_col, str):
        return (RewardSpec(reward_col),)
    if isinstance(reward_col, Mapping):
        specs = []
        for name, weight in reward_col.items():
            if not isinstance(weight, int | float) or not math.isfinite(weight):
                raise GrpoError(f"reward_col {name!r}: the weight must be a finite number, got {weight!r}")
            specs.append(RewardSpec(name, float(weight)))
        return tuple(specs)
    return tuple(RewardSpec(name) for name in reward_col)


# --------------------------------------------------------------------------- containers


def _new_columns(table: pa.Table, config: ComputeConfig) -> tuple[dict[str, pa.Array], pa.Array | None]:
    """The new columns of the rows kept, and which rows those are (``None``: all)."""
    filtering = config.drop_inactive or config.keep_mean_range is not None
    if filtering:
        if ROW_INDEX in table.column_names:
            raise GrpoError(f"the table has a column {ROW_INDEX!r}, which grpo-cli uses itself")
        table = table.append_column(ROW_INDEX, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    result = compute_table(table, config)
    kept = result.column(ROW_INDEX).combine_chunks() if filtering else None
    return {name: result.column(name).combine_chunks() for name in config.new_columns}, kept


def _kind(data: Any) -> str:
    """Which container ``data`` is, told by its type's module (nothing optional is imported)."""
    if isinstance(data, pa.Table):
        return "arrow"
    if isinstance(data, pa.RecordBatch):
        return "arrow-batch"
    module, name = type(data).__module__.split(".")[0], type(data).__name__
    kinds = {
        ("polars", "DataFrame"): "polars",
        ("polars", "LazyFrame"): "polars-lazy",
        ("pandas", "DataFrame"): "pandas",
        ("datasets", "Dataset"): "datasets",
    }
    kind = kinds.get((module, name))
    if kind is None:
        if (module, name) == ("datasets", "DatasetDict"):
            splits = ", ".join(data)
            raise UnsupportedContainer(
                f"a datasets.DatasetDict (splits {splits}); pass one split, e.g. data['train']"
            )
        raise UnsupportedContainer(f"expected {CONTAINERS}; got a {type(data).__module__}.{name}")
    return kind


def _to_arrow(data: Any, *, reads: Sequence[str] | None = None) -> tuple[str, pa.Table]:
    """``data`` as an Arrow table. A pandas frame whose columns do not all convert (an object
    column of mixed values, complex numbers) is converted in the columns the run ``reads``
    alone (top-level names; a struct field's column whole), the others standing as null
    columns of their names: a column the computation never uses cannot refuse it, and the
    frame returned keeps it as it was."""
    kind = _kind(data)
    if kind == "arrow":
        return kind, data
    if kind == "arrow-batch":
        return kind, pa.Table.from_batches([data])
    if kind == "polars":
        return kind, data.to_arrow()
    if kind == "pandas":
        try:
            return kind, pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            if reads is None:
                message = str(exc).splitlines()[0][:200]
                raise GrpoError(f"the pandas DataFrame cannot be read as Arrow columns ({message})") from None
        # a dotted name is a column of that name or a field of one named by a prefix of it
        prefixes = {
            ".".join(column.split(".")[:n]) for column in reads for n in range(1, column.count(".") + 2)
        }
        read = {name for name in data.columns if str(name) in prefixes}
        columns = {}
        for name in data.columns:
            if name not in read:
                columns[str(name)] = pa.nulls(len(data))  # not read: its name alone, for the checks
                continue
            try:
                columns[str(name)] = pa.Array.from_pandas(data[name])
            except (pa.ArrowException, TypeError, ValueError) as exc:
                message = str(exc).splitlines()[0][:200]
                raise GrpoError(
                    f"the pandas DataFrame's column {name!r} cannot be read as Arrow ({message})"
                ) from None
        return kind, pa.table(columns)
    return kind, data.with_format("arrow")[:]  # datasets: its Arrow table, in the dataset's row order


def _rebuild(kind: str, data: Any, new: dict[str, pa.Array], kept: pa.Array | None) -> Any:
    if kind in ("arrow", "arrow-batch"):
        table = data if kind == "arrow" else pa.Table.from_batches([data])
        if kept is not None:
            table = take_rows(table, kept)
        for name, column in new.items():
            table = table.append_column(name, column)
        if kind == "arrow":
            return table
        batches = table.combine_chunks().to_batches()
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)
    if kind == "polars":
        import polars as pl

        frame = data if kept is None else data[kept.to_numpy()]
        return frame.with_columns([pl.Series(name, column) for name, column in new.items()])
    if kind == "pandas":
        frame = data.copy() if kept is None else data.iloc[kept.to_numpy()].copy()
        for name, column in new.items():
            frame[name] = column.to_numpy(zero_copy_only=False)
        return frame
    dataset = data if kept is None else data.select(kept.to_numpy())
    for name, column in new.items():
        dataset = dataset.add_column(name, column.to_numpy(zero_copy_only=False))
    return dataset


def _lazy(frame: Any, config: ComputeConfig) -> Any:
    """The LazyFrame with the columns appended when it is collected."""
    import polars as pl

    empty = frame.clear().collect().to_arrow()
    check_table(empty, config)  # its columns are checked now, not when it is collected
    out_schema = RunPlan(config).output_schema(empty.schema, b"")
    schema = pl.from_arrow(out_schema.empty_table()).schema  # type: ignore[union-attr]

    def compute(collected: pl.DataFrame) -> pl.DataFrame:
        rebuilt: pl.DataFrame = _rebuild("polars", collected, *_new_columns(collected.to_arrow(), config))
        return rebuilt

    return frame.map_batches(compute, schema=schema, streamable=False)
