"""The local engine: the passes in order (statistics, moments, advantages or --verify), the
input held in memory where it fits, pass 2's figures, the output written."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, Generic, TypeVar, cast

import numpy as np
import pyarrow as pa
import torch

from grpo_cli import collector, interrupts
from grpo_cli.arrow.columns import column_of, filter_rows, is_key_type, top_level
from grpo_cli.arrow.keys import (
    GroupKeyIndex,
    InvalidKeyError,
    arrow_of,
    as_tensor,
    check_key_types,
)
from grpo_cli.engines.local.spool import _IdSpool
from grpo_cli.engines.local.statistics import _Statistics, _StatisticsPass
from grpo_cli.errors import GrpoError
from grpo_cli.inputs.readers import (
    describe_row,
    estimated_memory_bytes,
    hold_text_within,
    iter_batches,
    read_ahead,
    read_schema,
    read_table,
    row_count,
)
from grpo_cli.inputs.sources import InputSet, Shard
from grpo_cli.kernel import (
    WeightedMoments,
    WeightedMomentsAccumulator,
)
from grpo_cli.outputs.output import (
    JsonlShardWriter,
    MemoryTarget,
    OutputTarget,
    ShardWriter,
    SplicedShardWriter,
    splice_refusal,
)
from grpo_cli.results.findings import GroupFindings
from grpo_cli.results.summary import RunSummary, build_summary, group_findings, input_info
from grpo_cli.results.verify import Verifier
from grpo_cli.run.columns import check_columns
from grpo_cli.run.outcome import GroupOutcome
from grpo_cli.run.plan import RunPlan
from grpo_cli.run.progress import NoProgress, Progress
from grpo_cli.run.reward_columns import RewardReader, new_column_arrays
from grpo_cli.run.rewards import RewardBatch, bad_rewards_error
from grpo_cli.run.steps import with_watched_step
from grpo_cli.stages import timed

BATCH_BYTES = 64 << 20


MAX_BATCH_ROWS = 1 << 20


CPU_SLICE_ROWS = 1 << 18
"""Rows whose advantages pass 2 computes at once on the CPU, a batch a slice at a time: each
row's advantage is its own, so slices give the same bits, and their float64 temporaries (2 MiB
each) are reused from slice to slice, where batches of 1M rows taken whole left some 30 MB more
of the process's pages behind them (the 10M-row sorted file). Smaller slices took longer (see
:data:`grpo_cli.kernel.accumulate.CPU_SLICE_ROWS`)."""


SMALL_INPUT_ROWS = 100_000  # below this, keys are matched in a dict: no polars import


PROMPT_COLUMNS = ("prompt", "input", "question", "query", "problem", "input_prompt", "instruction")
"""Columns that hold a rollout's prompt in the trainers' dumps, checked in this order."""


BLOCK_PROBE_ROWS = 1 << 16
"""Rows read to check that ``--group-size`` blocks hold one prompt each."""


class _Pass2Figures:
    """Figures gathered while advantages are written: their range, and the verification."""

    def __init__(self, verifier: Verifier | None) -> None:
        self.minimum = float("inf")
        self.maximum = float("-inf")
        self.verifier = verifier

    def observe(
        self,
        batch: pa.RecordBatch,
        advantages: torch.Tensor,
        rewards: torch.Tensor,
        ids: torch.Tensor,
        shard: Shard,
        shard_row: int,
        written: torch.Tensor | None = None,
    ) -> None:
        """One batch's advantages: their range over the rows ``written`` (bool, the rows
        the filters keep; every row where ``None``), all of them verified."""
        kept = advantages if written is None else advantages[written]
        if kept.numel():
            low, high = torch.aminmax(kept)  # in the advantages' dtype: float() of either is exact
            self.minimum = min(self.minimum, float(low))
            self.maximum = max(self.maximum, float(high))
        if self.verifier is not None:
            column = column_of(batch, self.verifier.spec.column)
            self.verifier.compare(column, advantages, rewards, ids, shard, shard_row)

    def advantage_range(self) -> tuple[float, float] | None:
        if self.minimum > self.maximum:
            return None
        return self.minimum, self.maximum

    def verify_result(self) -> dict[str, Any] | None:
        return None if self.verifier is None else self.verifier.result()


class LocalEngine:
    """One run of ``compute`` or ``check`` over an :class:`InputSet`, on this machine."""

    def __init__(
        self, inputs: InputSet, plan: RunPlan, *, writes_output: bool = True, progress: Progress | None = None
    ) -> None:
        self.inputs = inputs
        self.plan = plan
        self.config = plan.config
        self.progress: Progress = progress or NoProgress()
        budget = self.config.memory_budget_bytes
        hold_text_within(inputs.shards, budget)  # before the first scan reads a text shard
        self.schemas = [read_schema(shard) for shard in inputs.shards]
        watching = with_watched_step(plan.config, self.schemas)
        if watching is not plan.config:
            plan = self.plan = RunPlan(watching, device=plan.device)
            self.config = watching
        for shard, schema in zip(inputs.shards, self.schemas, strict=True):
            check_columns(plan.config, shard, schema, writes_output=writes_output)
        if self.config.group_size is None:
            check_key_types(
                [(shard.display, schema) for shard, schema in zip(inputs.shards, self.schemas, strict=True)],
                self.config.group_cols,
            )
        self.in_memory = sum(estimated_memory_bytes(s) for s in inputs.shards) <= budget
        self.one_pass_dtype = self._one_pass_dtype(writes_output)
        self.splice_refusal = splice_refusal(self.config, inputs.shards) if writes_output else "no output"
        self.bytes_read = 0

    @property
    def keeps_every_column(self) -> bool:
        """Whether pass 1, when it keeps the batches, keeps every column (no shard is spliced)."""
        return self.splice_refusal is not None

    def run(self, output: OutputTarget | MemoryTarget | None) -> RunSummary:
        """Both passes; the output is committed only when everything succeeded."""
        collector.resume()  # the modules are loaded: the CLI's start-up paused it
        started = time.perf_counter()
        if isinstance(output, OutputTarget):
            for shard, schema in zip(self.inputs.shards, self.schemas, strict=True):
                output.refuse_unwritable(shard, schema)
        spool = _IdSpool(on_disk=not self.in_memory)
        findings: _Beside[GroupFindings] | None = None
        try:
            first = self._statistics(spool)
            if first.rows == 0 and output is not None:
                raise GrpoError(f"{self.inputs.spec}: no rows; there is nothing to compute advantages for")
            with timed("outcome"):
                outcome = self.plan.outcome(
                    first.channel_stats,
                    first.summary_stats,
                    rows_per_group=first.rows_per_group,
                    rows=first.rows,
                    nan_rewards=first.nan_rewards,
                    figures=first.figures,
                    batches=first.batches,
                )
            if first.group_rows is not None:
                outcome = self.plan.with_group_rows(outcome, first.group_rows)
            if self.one_pass_dtype is not None:
                advantage_range = self.plan.advantage_range_from_stats(outcome, self.one_pass_dtype)
                verify_result = None
            else:
                if self.plan.needs_moments_pass:
                    outcome = replace(
                        outcome, transform=self.plan.transform(self._moments(first, outcome, spool))
                    )
                # pass 2 waits on the writer about half its time: the summary's figures of the
                # groups are computed meanwhile
                findings = _Beside(self._findings, first, outcome)
                figures = self._advantages(first, outcome, spool.reader(), output)
                advantage_range, verify_result = figures.advantage_range(), figures.verify_result()
            with timed("commit"):
                output_info = output.commit() if output is not None else None
        finally:
            spool.close()
            if output is not None:
                output.discard()
            if findings is not None:  # a failed run too: see _Beside
                findings.join()
        with timed("summary"):
            return self._summary(
                first,
                outcome,
                output_info,
                advantage_range,
                verify_result,
                started,
                findings.result() if findings is not None else self._findings(first, outcome),
            )

    def _findings(self, first: _Statistics, outcome: GroupOutcome) -> GroupFindings:
        with timed("group findings"):
            return group_findings(
                outcome,
                options=self.config.findings_options(),
                key_at=first.keys.key_at if first.keys is not None else None,
                by=first.by,
            )

    def _summary(
        self,
        first: _Statistics,
        outcome: GroupOutcome,
        output_info: dict[str, Any] | None,
        advantage_range: tuple[float, float] | None,
        verify_result: dict[str, Any] | None,
        started: float,
        findings: GroupFindings,
    ) -> RunSummary:
        inputs = self.inputs
        return build_summary(
            outcome,
            input=input_info(
                inputs.spec,
                inputs.shards,
                stdin=inputs.is_stdin,
                bytes_decoded=self.bytes_read,
                about=inputs.about,
            ),
            output=output_info,
            options=self.config.options_summary(),
            advantage_range=advantage_range,
            mode="in-memory" if self.in_memory else "streaming",
            device=str(self.plan.device),
            elapsed=time.perf_counter() - started,
            verify=verify_result,
            key_at=first.keys.key_at if first.keys is not None else None,
            warnings=self._block_warnings(),
            by=first.by,
            trainer_filter=self._trainer_filter(first, outcome),
            findings=findings,
            reward_counts=first.reward_counts,
        )

    def _trainer_filter(self, first: _Statistics, outcome: GroupOutcome) -> dict[str, Any] | None:
        """``--trainer-filter``: the trainer's rule on each group against the exact decision."""
        if self.config.trainer_filter is None or first.filter_rows is None:
            return None
        ids = (
            np.concatenate([ids for ids, _ in first.filter_rows])
            if first.filter_rows
            else np.zeros(0, np.int64)
        )
        values = np.concatenate([v for _, v in first.filter_rows]) if first.filter_rows else np.zeros(0)
        return self.plan.trainer_filter_report(
            ids,
            values,
            outcome.active,
            by=first.by,
            batches=first.batches,
            key_at=first.keys.key_at if first.keys is not None else None,
        )

    def _block_warnings(self) -> list[str]:
        """With ``--group-size``: do the first blocks each hold one prompt (where a prompt-like
        column says)? A trainer that reorders its batch before it dumps (verl balances it)
        leaves a prompt's rows apart, and consecutive blocks then mix prompts."""
        size = self.config.group_size
        if size is None or size < 2 or not self.inputs.shards or not len(self.schemas[0]):
            return []
        shard, schema = self.inputs.shards[0], self.schemas[0]
        column = next(
            (c for c in PROMPT_COLUMNS if c in schema.names and is_key_type(schema.field(c).type)), None
        )
        if column is None:
            return []
        parts, rows = [], 0
        for batch in self._batches(shard, schema, [column]):
            parts.append(batch.column(0))
            rows += batch.num_rows
            if rows >= BLOCK_PROBE_ROWS:
                break
        blocks = min(rows, BLOCK_PROBE_ROWS) // size
        if blocks == 0:
            return []
        values = pa.chunked_array(parts).slice(0, blocks * size)
        try:
            ids = GroupKeyIndex([column], exact=True).encode([values]).reshape(blocks, size)
        except (GrpoError, InvalidKeyError):
            return []  # a null or NaN prompt: not the place to refuse it
        mixed = int((ids != ids[:, :1]).any(axis=1).sum())
        if not mixed:
            return []
        return [
            f"{mixed:,} of the first {blocks:,} --group-size {size} blocks hold more than one "
            f"{column!r}: "
            f"the rows of a group are not consecutive (verl dumps after balancing its batch); group by "
            f"the prompt instead (-g {column}, with -g step if the file holds several steps)"
        ]

    # ----------------------------------------------------------------- pass 1

    def _statistics(self, spool: _IdSpool) -> _Statistics:
        total_rows = self._total_rows()
        small = total_rows is not None and total_rows <= SMALL_INPUT_ROWS
        state = _StatisticsPass(self.plan, spool, exact_keys=small, expected_rows=total_rows)
        length_col = self.config.length_col if "length_sums" in self.plan.needs else None
        step_col = self.config.step_col
        keep_batches = self.in_memory and self.one_pass_dtype is None
        cached: list[list[pa.RecordBatch]] | None = [] if keep_batches else None
        columns = None if keep_batches and self.keeps_every_column else self.plan.input_columns
        self.progress.start("statistics" if self.one_pass_dtype else "pass 1/2: statistics", total_rows)
        for shard, schema in zip(self.inputs.shards, self.schemas, strict=True):
            shard_batches: list[pa.RecordBatch] = []
            if len(schema) == 0:
                if cached is not None:
                    cached.append(shard_batches)
                continue
            reader = self._reward_reader(schema, shard)
            # what pass 2 reads again: the keys' IDs are spooled, so the key columns (a shuffled
            # file's uid strings: most of what it decodes) are not held between the passes
            kept = None if columns is None else top_level(schema, self.config.row_columns)
            shard_row = 0
            for batch in self._batches(shard, schema, columns):
                if cached is not None:
                    shard_batches.append(batch if kept is None else batch.select(kept))
                lengths = reader.lengths(batch, length_col, shard_row) if length_col is not None else None
                steps = None if step_col is None else reader.column(batch, step_col, shard_row).numpy()
                with timed("rewards"):
                    rewards = reader.read(batch, shard_row)
                state.add(batch, rewards, shard, shard_row, lengths, steps)
                shard_row += batch.num_rows
                self.bytes_read += batch.nbytes
                interrupts.raise_if_requested()
                if state.chunk_full:
                    self.progress.advance(state.flush(shard))
            self.progress.advance(state.flush(shard))
            if cached is not None:
                cached.append(shard_batches)
        self.progress.finish()
        if state.bad_count and self.config.advantage.nan == "error":
            assert state.first_bad is not None
            shard, row, value = state.first_bad
            what = "null" if value != value and self._is_null_at(shard, row) else str(value)
            raise bad_rewards_error(describe_row(shard, row), what, state.bad_count)
        return state.result(self.inputs.spec, cached)

    def _one_pass_dtype(self, writes_output: bool) -> torch.dtype | None:
        """``check`` without verification needs no second pass when the advantages' range
        follows from the group statistics (see :meth:`RunPlan.advantage_range_from_stats`):
        the dtype of the advantages then, else ``None``."""
        if writes_output or self.config.verify is not None or not self.plan.range_follows_from_stats:
            return None
        dtypes = {self.plan.output_dtype(schema) for schema in self.schemas if len(schema)}
        return dtypes.pop() if len(dtypes) == 1 else None

    def _reward_reader(self, schema: pa.Schema, shard: Shard) -> RewardReader:
        return self.plan.reward_reader(schema, shard)

    def _batches(
        self, shard: Shard, schema: pa.Schema, columns: list[str] | None
    ) -> Iterator[pa.RecordBatch]:
        """Batches sized to about ``BATCH_BYTES`` unless ``batch_rows`` is set; ``columns``
        may name nested fields, which are read with their top-level struct."""
        batch_rows = self.config.batch_rows or _batch_rows_for(shard)
        if columns is not None:
            columns = top_level(schema, columns)
        if self.in_memory and shard.format == "parquet" and columns is None:
            # Read whole: pyarrow decodes row groups and columns in parallel.
            with timed("read"):
                table = read_table(shard)
            yield from table.to_batches(max_chunksize=batch_rows)
            return
        # The next batch is decoded while this one's keys and rewards are processed.
        yield from read_ahead(iter_batches(shard, columns, batch_rows))

    def _total_rows(self) -> int | None:
        counts = [row_count(s) for s in self.inputs.shards]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    def _is_null_at(self, shard: Shard, row: int) -> bool:
        schema = self.schemas[self.inputs.shards.index(shard)]
        for spec in self.config.rewards:
            value = _read_row(shard, schema, spec.column, row, self.config.batch_rows or MAX_BATCH_ROWS)
            if value is not None and not value.is_valid:
                return True
        return False

    # ----------------------------------------------------------------- pass 2

    def _advantages(
        self,
        first: _Statistics,
        outcome: GroupOutcome,
        take_ids: Callable[[int], np.ndarray],
        output: OutputTarget | MemoryTarget | None,
    ) -> _Pass2Figures:
        config, plan = self.config, self.plan
        verifier = None
        if config.verify is not None:
            verifier = Verifier(
                config.verify,
                outcome.stats,
                config.advantage,
                first.keys,
                batch_transform=self.plan.needs_moments_pass,
            )
        figures = _Pass2Figures(verifier)
        provenance = plan.provenance([shard.display for shard in self.inputs.shards], outcome.totals)
        active_device = outcome.active.to(plan.device)
        slice_rows = CPU_SLICE_ROWS if plan.device.type == "cpu" else MAX_BATCH_ROWS
        self.progress.start("pass 2/2: advantages" if output else "pass 2/2: verify", first.rows)
        global_row = 0
        for index, (shard, schema) in enumerate(zip(self.inputs.shards, self.schemas, strict=True)):
            out_schema = plan.output_schema(schema, provenance)
            spliced: SplicedShardWriter | None = None
            writer: ShardWriter | JsonlShardWriter | MemoryTarget | None = None
            if output is not None:
                spliced = output.open_spliced(shard, out_schema, len(plan.new_columns))
                if spliced is None:
                    writer = output.open_shard(shard, out_schema, len(plan.new_columns))
            if writer is not None:
                reader, batches = self._shard_batches(first, index, None, all_columns=True)
            else:
                verified = [config.verify.column] if config.verify is not None else []
                reader, batches = self._shard_batches(first, index, [*plan.input_columns, *verified])
            shard_row = 0
            for batch in batches:
                n = batch.num_rows
                ids = self._group_ids(global_row, n, take_ids)
                assert reader is not None
                written = None if outcome.kept is None else outcome.kept[ids]
                slices = [
                    self._slice_advantages(
                        batch.slice(start, slice_rows),
                        ids[start : start + slice_rows],
                        None if written is None else written[start : start + slice_rows],
                        reader,
                        outcome,
                        active_device,
                        figures,
                        shard,
                        shard_row + start,
                        global_row + start,
                    )
                    for start in range(0, max(n, 1), slice_rows)
                ]
                result = slices[0] if len(slices) == 1 else torch.cat(slices)
                if writer is not None or spliced is not None:
                    with timed("cast"):
                        arrays = new_column_arrays(
                            result, outcome.active[ids], ids.numpy(), outcome.group_columns
                        )
                    if spliced is not None:
                        spliced.write_new(arrays)
                    elif writer is not None:
                        out_batch = pa.RecordBatch.from_arrays([*batch.columns, *arrays], schema=out_schema)
                        if written is not None:
                            out_batch = filter_rows(out_batch, arrow_of(written.numpy()))
                        writer.write(out_batch)
                if first.cached is None:
                    self.bytes_read += batch.nbytes
                shard_row += n
                global_row += n
                self.progress.advance(n)
                interrupts.raise_if_requested()
            for done in (writer, spliced):
                if done is not None:
                    done.close()
        self.progress.finish()
        return figures

    def _slice_advantages(
        self,
        rows: pa.RecordBatch,
        ids: torch.Tensor,
        written: torch.Tensor | None,
        reader: RewardReader,
        outcome: GroupOutcome,
        active_device: torch.Tensor,
        figures: _Pass2Figures,
        shard: Shard,
        shard_row: int,
        global_row: int,
    ) -> torch.Tensor:
        """The advantages of ``rows`` (a slice of a batch; ``ids`` theirs, ``written`` which of
        them the output keeps, all where ``None``) in the output's dtype, observed by ``figures``."""
        plan = self.plan
        with timed("pass 2: advantages"):
            rewards, result, batch_ids = self._row_advantages(
                rows, reader, ids, outcome, active_device, shard_row, global_row
            )
            result = plan.finish(result, batch_ids, outcome, scored=rewards.combined_valid)
        with timed("cast"):
            result = result.to(plan.output_dtype(rows.schema))
        figures.observe(rows, result, rewards.combined, ids, shard, shard_row, written)
        return result

    def _shard_batches(
        self, first: _Statistics, index: int, columns: list[str] | None, *, all_columns: bool = False
    ) -> tuple[RewardReader | None, Iterator[pa.RecordBatch]]:
        """Shard ``index``'s reward reader and batches again: kept from pass 1, or read anew.

        ``all_columns``: every column is needed (a re-encoded output), whatever pass 1 kept.
        An empty JSONL file (no columns) has no reader and no batches.
        """
        shard, schema = self.inputs.shards[index], self.schemas[index]
        if not len(schema):
            return None, iter(())
        reader = self._reward_reader(schema, shard)
        if first.cached is not None and (self.keeps_every_column or not all_columns):
            return reader, iter(first.cached[index])
        return reader, self._batches(shard, schema, None if all_columns else columns)

    def _group_ids(self, global_row: int, n: int, take_ids: Callable[[int], np.ndarray]) -> torch.Tensor:
        group_size = self.config.group_size
        if group_size is not None:
            return torch.arange(global_row, global_row + n) // group_size
        return as_tensor(take_ids(n))

    def _row_advantages(
        self,
        batch: pa.RecordBatch,
        reader: RewardReader,
        ids: torch.Tensor,
        outcome: GroupOutcome,
        active_device: torch.Tensor,
        shard_row: int,
        global_row: int,
    ) -> tuple[RewardBatch, torch.Tensor, torch.Tensor | None]:
        """One batch's rewards, advantages before any batch transform (CPU), and batch IDs where
        they are read (``global_row``: the batch's first row in the whole input)."""
        rewards, result, batch_ids = self.plan.row_advantages(
            batch,
            reader,
            ids,
            outcome,
            active_device=active_device,
            first_row=shard_row,
            global_row=global_row,
        )
        return rewards, result, batch_ids

    def _moments(self, first: _Statistics, outcome: GroupOutcome, spool: _IdSpool) -> WeightedMoments:
        """The extra pass of a batch transform: weighted moments of the advantages per batch."""
        config, plan = self.config, self.plan
        assert outcome.batches is not None
        take_ids = spool.reader()
        active_device = outcome.active.to(plan.device)
        total = WeightedMomentsAccumulator(
            num_batches=outcome.batches.count, block_rows=config.stats_block_rows
        )
        columns = None if first.cached is not None else plan.input_columns
        self.progress.start("pass 2/3: batch moments", first.rows)
        global_row = 0
        for index in range(len(self.inputs.shards)):
            reader, batches = self._shard_batches(first, index, columns)
            shard_row = 0
            for batch in batches:
                n = batch.num_rows
                ids = self._group_ids(global_row, n, take_ids)
                assert reader is not None
                rewards, result, batch_ids = self._row_advantages(
                    batch, reader, ids, outcome, active_device, shard_row, global_row
                )
                lengths = (
                    None if config.length_col is None else reader.lengths(batch, config.length_col, shard_row)
                )
                assert batch_ids is not None  # a moments pass reads each row's batch
                total.update(result, lengths, batch_ids, valid=rewards.combined_valid)
                shard_row += n
                global_row += n
                self.progress.advance(n)
        self.progress.finish()
        return total.compute()


T = TypeVar("T")


class _Beside(Generic[T]):
    """``function(*args)`` run on a thread of its own while the caller goes on. :meth:`result`
    waits for it and returns its value, or raises its error. A run that fails first must still
    :meth:`join` it: a thread inside torch when the process exits aborts the process (C++'s
    "terminate called without an active exception", after the error's line)."""

    def __init__(self, function: Callable[..., T], *args: Any) -> None:
        self._value: T | None = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = function(*args)
            except BaseException as exc:  # re-raised by result(), on the caller's thread
                self._error = exc

        self._thread = threading.Thread(target=run, name="grpo-cli-beside", daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Wait for the function to end (its value or error kept for :meth:`result`)."""
        self._thread.join()

    def result(self) -> T:
        self.join()
        if self._error is not None:
            raise self._error
        return cast(T, self._value)


def _batch_rows_for(shard: Shard) -> int:
    decoded = estimated_memory_bytes(shard)
    rows = row_count(shard)
    if not rows:
        return MAX_BATCH_ROWS
    return int(min(MAX_BATCH_ROWS, max(1024, BATCH_BYTES * rows // max(decoded, 1))))


def _read_row(shard: Shard, schema: pa.Schema, column: str, row: int, batch_rows: int) -> pa.Scalar | None:
    seen = 0
    for batch in iter_batches(shard, top_level(schema, [column]), batch_rows):
        if seen + batch.num_rows > row:
            return column_of(batch, column)[row - seen]
        seen += batch.num_rows
    return None
