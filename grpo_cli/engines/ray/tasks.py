"""Pass 2 on the workers, one task per block: a batch's moments, the advantages, --verify's
comparisons, a splice's new column chunks, a trainer filter's rows, a group's rewards."""

from __future__ import annotations

import pickle
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from grpo_cli.arrow.keys import GroupKeyIndex, as_tensor
from grpo_cli.engines.ray.blocks import FilePart, _read_block
from grpo_cli.engines.ray.fields import (
    _CPU,
    BLOCK_FIELD,
    ERROR_FIELD,
    ROW_GROUP_FIELD,
    _refusal,
    _report_of,
    _report_table,
)
from grpo_cli.engines.ray.inputs import InputFile, RayInputs, _open_file, is_remote, side_by_side_requests
from grpo_cli.engines.ray.merge import _in_bucket_order, _key_index, _KeyTable, _outcome_of
from grpo_cli.engines.ray.reducers import _state_of_buckets
from grpo_cli.engines.ray.session import import_ray
from grpo_cli.errors import GrpoError, first_line, mention
from grpo_cli.file_names import PROVENANCE_KEY
from grpo_cli.kernel import (
    weighted_moments,
)
from grpo_cli.options.config import ComputeConfig
from grpo_cli.outputs.output import (
    output_name_of,
    splice_refusal,
)
from grpo_cli.outputs.splice import SplicedFile, SpliceRefused, read_footer
from grpo_cli.results.verify import Verifier, settled, split_by_groups
from grpo_cli.run.outcome import GroupOutcome
from grpo_cli.run.plan import RunPlan
from grpo_cli.run.reward_columns import new_column_arrays
from grpo_cli.run.rewards import RewardBatch
from grpo_cli.stores import CopiedPrefix, check_scheme, local_path, store_output

_WORKER_CACHE: dict[str, Any] = {}


def _worker_state(
    payload: Any, token: str, config: ComputeConfig
) -> tuple[RunPlan, GroupKeyIndex, GroupOutcome]:
    """The plan, key index and outcome, built once per worker process and run."""
    cached = _WORKER_CACHE.get(token)
    if cached is None:
        _WORKER_CACHE.clear()
        if not isinstance(payload, dict):
            payload = import_ray().get(payload)
        plan = RunPlan(config, device=_CPU)
        figures, key_tables, sizes = payload["buckets"]  # every bucket's groups end to end
        outcome = _outcome_of(plan, _in_bucket_order(plan, figures, sizes), payload["batch_stds"])
        if payload["group_row_states"] is not None:
            state = _state_of_buckets(plan, payload["group_row_states"], sizes)
            outcome = replace(outcome, estimator_state=state)
        if payload["transform"] is not None:
            outcome = replace(outcome, transform=payload["transform"])
        cached = (plan, _key_index(key_tables, config.group_cols), outcome)
        _WORKER_CACHE[token] = cached
    return cached


def _group_ids(batch: pa.RecordBatch, config: ComputeConfig, index: GroupKeyIndex) -> np.ndarray:
    """The run's group IDs of a batch's rows: their keys' positions in the buckets laid end to
    end (every key was seen by the statistics job)."""
    positions: np.ndarray = (
        index.encode([batch.column(c) for c in config.group_cols])
        if batch.num_rows
        else np.empty(0, np.int64)
    )
    if positions.size and int(positions.max()) >= len(index):
        raise RuntimeError("a group key appeared in pass 2 that pass 1 did not see")
    return positions


def block_moments(
    batch: pa.Table,
    blocks: list[list[FilePart]],
    payload: Any,
    token: str,
    config: ComputeConfig,
    group_size: int | None = None,
) -> pa.Table:
    """One statistics block's weighted moments of the advantages per training batch (for a
    whitening), over its rows in input order as the local engine's moments pass cuts them."""
    (index,) = batch.column("block").to_pylist()
    plan, keys, outcome = _worker_state(payload, token, config)
    assert outcome.batches is not None
    values, weights, batch_ids, valid = [], [], [], []
    try:
        for part, record in _read_block(blocks[index], plan.input_columns, group_size):
            reader = plan.reward_reader(record.schema, part.file.shard())
            ids = as_tensor(_group_ids(record, config, keys))
            rewards, result, in_batch = plan.row_advantages(
                record,
                reader,
                ids,
                outcome,
                active_device=outcome.active,
                first_row=part.start,
                global_row=part.file.offset + part.start,
            )
            values.append(result)
            if config.length_col is not None:
                weights.append(reader.lengths(record, config.length_col, part.start))
            assert in_batch is not None  # a moments pass reads each row's batch
            batch_ids.append(in_batch)
            valid.append(rewards.scored())
    except GrpoError as error:
        return _refusal(error.template)
    # the tensors the local engine's WeightedMomentsAccumulator hands weighted_moments for a block
    x = torch.cat(values).to(torch.float64)
    w = torch.cat(weights).to(torch.float64) if weights else torch.ones_like(x)
    moments = weighted_moments(
        x, w, torch.cat(batch_ids).to(torch.int64), outcome.batches.count, valid=torch.cat(valid)
    )
    return pa.table(
        {
            "weight": moments.weight.numpy(),
            "mean": moments.mean.numpy(),
            "m2": moments.m2.numpy(),
            "count": moments.count.numpy(),
            BLOCK_FIELD: np.full(outcome.batches.count, index, dtype=np.int64),
        }
    )


def block_advantages(
    batch: pa.Table,
    blocks: list[list[FilePart]],
    payload: Any,
    token: str,
    config: ComputeConfig,
    provenance: bytes,
    group_size: int | None = None,
) -> pa.Table:
    """One part of the input (its index in ``batch``), every column in its file's own types, with
    the advantage and activity columns appended, rows in order.

    ``payload`` (the keys and the :class:`~grpo_cli.run.outcome.GroupOutcome`, or an
    object-store reference to them) is read once per worker process.
    """
    (index,) = batch.column("block").to_pylist()
    plan, keys, outcome = _worker_state(payload, token, config)
    ((part, record),) = _read_block(blocks[index], None, group_size)
    _, advantages, ids_np = _part_advantages(plan, keys, outcome, part, record, record.schema)
    if group_size is not None:  # the key column is the jobs' own, not the output's
        record = record.drop_columns([ROW_GROUP_FIELD])
    ids = torch.from_numpy(ids_np)
    arrays = new_column_arrays(advantages, outcome.active[ids], ids_np, outcome.group_columns)
    out = pa.Table.from_batches([record])
    for name, array in zip(plan.new_columns, arrays, strict=True):
        out = out.append_column(name, array)
    if outcome.kept is not None:
        out = out.filter(pa.array(outcome.kept.numpy()[ids_np]))
    return out.replace_schema_metadata({**(out.schema.metadata or {}), PROVENANCE_KEY: provenance})


def block_verify(
    batch: pa.Table,
    blocks: list[list[FilePart]],
    payload: Any,
    token: str,
    config: ComputeConfig,
    group_size: int | None = None,
) -> pa.Table:
    """``check --verify-advantage-col``: one part's advantages, computed as the advantage job
    computes them (in the output's dtype), compared with the given column by a
    :class:`~grpo_cli.results.verify.Verifier` of its own; returns what it saw (pickled, for
    :meth:`~grpo_cli.results.verify.Verifier.merge`) and the part's advantage range."""
    (index,) = batch.column("block").to_pylist()
    plan, keys, outcome = _worker_state(payload, token, config)
    assert config.verify is not None
    columns = list(dict.fromkeys([*plan.input_columns, config.verify.column]))
    try:
        ((part, record),) = _read_block(blocks[index], columns, group_size)
        rewards, advantages, ids_np = _part_advantages(plan, keys, outcome, part, record, record.schema)
        verifier = Verifier(
            config.verify,
            outcome.stats,
            config.advantage,
            keys,  # the worker holds every key: it names its examples
            batch_transform=plan.needs_moments_pass,
            first_row=part.file.offset + part.start,
        )
        column = record.column(config.verify.column)
        verifier.compare(
            column, advantages, rewards.combined, as_tensor(ids_np), part.file.shard(), part.start
        )
    except GrpoError as error:
        return _refusal(error.template).append_column(BLOCK_FIELD, pa.array([index]))
    return _ranged(index, advantages, partial=pickle.dumps(verifier.partial()))


def verify_part(
    index: int,
    parts: list[list[FilePart]],
    payload: Any,
    token: str,
    config: ComputeConfig,
    group_size: int | None,
    starts: list[int],
) -> tuple[pa.Table, ...]:
    """``check --verify-advantage-col`` where the reducers finished job 1: :func:`block_verify`
    of part ``index``, its constant groups' state cut by bucket (``starts``: each bucket's
    first group in the workers' order) for :func:`settle_bucket`; the answer keeps the rest."""
    table = block_verify(pa.table({"block": [index]}), parts, payload, token, config, group_size)
    if ERROR_FIELD in table.column_names:
        return (table, *[pa.table({})] * len(starts))
    rest, cuts = split_by_groups(pickle.loads(table.column("partial")[0].as_py()), starts)
    table = table.set_column(
        table.schema.get_field_index("partial"), "partial", pa.array([pickle.dumps(rest)])
    )
    return (table, *(_report_table(cut) for cut in cuts))


def settle_bucket(config: ComputeConfig, figures: pa.Table, keys: pa.Table, *cuts: pa.Table) -> pa.Table:
    """``check --verify-advantage-col``: one bucket's constant groups settled, from every part's
    cut of their state in input order (:func:`verify_part`), with the bucket's own statistics;
    what it found, named by key (:func:`~grpo_cli.results.verify.settled`)."""
    plan = RunPlan(config, device=_CPU)
    assert config.verify is not None
    stats = _outcome_of(plan, _in_bucket_order(plan, [figures], [figures.num_rows])).stats
    verifier = Verifier(
        config.verify, stats, config.advantage, _KeyTable(keys), batch_transform=plan.needs_moments_pass
    )
    for cut in cuts:
        if cut.num_rows:
            verifier.merge(_report_of(cut))
    return _report_table(settled(verifier))


def _part_advantages(
    plan: RunPlan,
    keys: GroupKeyIndex,
    outcome: GroupOutcome,
    part: FilePart,
    record: pa.RecordBatch,
    schema: pa.Schema,
) -> tuple[RewardBatch, torch.Tensor, np.ndarray]:
    """One part's rewards, its advantages in the output's dtype for ``schema`` (the file's),
    and its rows' run group IDs, as the advantage job computes them."""
    ids_np = _group_ids(record, plan.config, keys)
    reader = plan.reward_reader(record.schema, part.file.shard())
    rewards, result, batch_ids = plan.row_advantages(
        record,
        reader,
        as_tensor(ids_np),
        outcome,
        active_device=outcome.active,
        first_row=part.start,
        global_row=part.file.offset + part.start,
    )
    advantages = plan.finish(result, batch_ids, outcome, scored=rewards.combined_valid)
    return rewards, advantages.to(plan.output_dtype(schema)), ids_np


def _ranged(index: int, advantages: torch.Tensor, **values: Any) -> pa.Table:
    """A task's one-row answer: ``values``, its advantages' range (nulls when it has none) and its part."""
    low = high = None
    if advantages.numel():
        low, high = (float(x) for x in torch.aminmax(advantages.to(torch.float64)))
    columns = {name: [value] for name, value in values.items()}
    return pa.table(
        {
            **columns,
            "low": pa.array([low], pa.float64()),
            "high": pa.array([high], pa.float64()),
            BLOCK_FIELD: [index],
        }
    )


def _range_of(tables: list[pa.Table]) -> tuple[float, float] | None:
    """The advantages' range over the tasks' :func:`_ranged` answers."""
    lows = [t.column("low")[0].as_py() for t in tables if t.column("low")[0].is_valid]
    highs = [t.column("high")[0].as_py() for t in tables if t.column("high")[0].is_valid]
    return (min(lows), max(highs)) if lows else None


def block_splice(
    batch: pa.Table,
    blocks: list[list[FilePart]],
    payload: Any,
    token: str,
    config: ComputeConfig,
    provenance: bytes,
    target: str,
    group_size: int | None = None,
) -> pa.Table:
    """One input file (its index in ``batch``) spliced as the local engine splices a shard:
    its bytes copied, the new columns (computed from the run's columns only) appended as
    column chunks of each row group, the footer merged; written to ``target``'s folder under
    the local engine's name for the shard. Returns the file's name, rows and advantage range."""
    (index,) = batch.column("block").to_pylist()
    plan, keys, outcome = _worker_state(payload, token, config)
    ((part, record),) = _read_block(blocks[index], plan.input_columns, group_size)
    shard = part.file.shard()
    with _local_copy(part.file) as source:
        schema = pq.read_schema(source)
        _, advantages, ids_np = _part_advantages(plan, keys, outcome, part, record, schema)
        ids = torch.from_numpy(ids_np)
        arrays = new_column_arrays(advantages, outcome.active[ids], ids_np, outcome.group_columns)
        output_schema = plan.output_schema(schema, provenance)
        new_schema = pa.schema(list(output_schema)[len(output_schema) - len(plan.new_columns) :])
        name = output_name_of(shard)
        from grpo_cli.scratch import scratch_dir

        folder = scratch_dir(name) if is_remote(target) else Path(target)
        try:
            with open(folder / name, "wb") as handle:
                spliced = SplicedFile(source, handle)
                spliced.copy_prefix()
                spliced.begin(new_schema, {PROVENANCE_KEY: provenance}, compression=config.compression)
                if record.num_rows:
                    spliced.add(arrays)
                spliced.close()
            # the output's first bytes are the input's up to its footer: a store may copy them itself
            prefix = CopiedPrefix(part.file.source, spliced.footer.start)
            transfer = {}
            if is_remote(target):  # a staging folder on a store: this task uploads its file
                copied = {"": prefix} if prefix.source.startswith("s3://") else {}
                transfer = store_output(target + name, directory=False).publish(folder / name, copied)
        finally:
            if is_remote(target):
                shutil.rmtree(folder, ignore_errors=True)
    return _ranged(
        index,
        advantages,
        name=name,
        source=prefix.source,
        prefix=prefix.length,
        uploaded=transfer.get("bytes_uploaded", 0),
        copied=transfer.get("bytes_copied_in_store", 0),
    )


def _splice_refusal_of(file: InputFile) -> str | None:
    """Why ``file`` cannot be spliced (its footer read by the splice's own parser), or ``None``."""
    try:
        with _footer_source(file) as source:
            footer = read_footer(source)
    except (SpliceRefused, OSError) as refused:
        return first_line(refused)
    return "it has an empty row group" if any(count == 0 for count in footer.row_counts()) else None


def _on_this_machine(file: InputFile) -> Path | None:
    """``file``'s local path (a ``file://`` URI's too), or ``None`` for an object on a store."""
    if not is_remote(file.source):
        return Path(file.source)
    return Path(local_path(file.source)) if check_scheme(file.source) == "file" else None


def _footer_source(file: InputFile) -> Any:
    """A handle on ``file`` that :func:`~grpo_cli.outputs.splice.read_footer` reads (ranged reads of an
    object on a store: its footer only)."""
    path = _on_this_machine(file)
    return _open_file(file) if path is None else open(path, "rb")


@contextmanager
def _local_copy(file: InputFile) -> Iterator[Path]:
    """``file`` as a path on this machine: a local file itself, an object on a store copied
    to a private scratch file (removed on exit), as the local engine splices it."""
    path = _on_this_machine(file)
    if path is not None:
        yield path
        return
    from grpo_cli.scratch import spool

    def download(out: Any) -> None:
        with _open_file(file) as remote:
            shutil.copyfileobj(remote, out, 8 << 20)

    with spool(None, label=file.display, write=download) as path:
        yield Path(path)


def splice_plan(inputs: RayInputs, config: ComputeConfig) -> str | None:
    """Why this run's output is re-encoded rather than spliced, or ``None``: the local
    engine's reasons (:func:`~grpo_cli.outputs.output.splice_refusal`), and the Ray engine's own
    (a file staged from another format is re-encoded; so is a file the splice refuses, and
    two files of one name)."""
    shards = [file.shard() for file in inputs.files]
    refusal = splice_refusal(config, shards)
    if refusal is not None:
        return refusal
    staged = next((file for file in inputs.files if file.staged), None)
    if staged is not None:
        return (
            f"{staged.display} is staged from another format; {mention('engine')} ray splices Parquet "
            "files only"
        )
    names: dict[str, str] = {}
    refusals = side_by_side_requests(_splice_refusal_of, inputs.files)
    for file, shard, refused in zip(inputs.files, shards, refusals, strict=True):
        if refused is not None:
            return f"{file.display}: {refused}"
        name = output_name_of(shard)
        if name in names:
            return f"{file.display} and {names[name]} would both be written to {name}"
        names[name] = file.display
    return None
