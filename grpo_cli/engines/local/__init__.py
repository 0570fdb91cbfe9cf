"""The local engine: two passes over a rollout dataset with bounded memory.

Pass 1 (:class:`~grpo_cli.engines.local.statistics._StatisticsPass`) reads only the reward
and group-key columns, maps keys to dense group IDs and feeds the kernel's
:class:`~grpo_cli.kernel.GroupStatsAccumulator`. The plan turns the statistics into a
:class:`~grpo_cli.run.outcome.GroupOutcome`. Pass 2 streams every column again, appends the
advantage and activity columns and writes them out. Inputs whose decoded size fits
``memory_budget_bytes`` are read once and kept in memory for pass 2; the arithmetic is
the same, so both paths give bitwise identical results.
"""

from __future__ import annotations

import pyarrow as pa

from grpo_cli.engines.local.engine import LocalEngine
from grpo_cli.engines.local.spool import _IdSpool
from grpo_cli.errors import GrpoError
from grpo_cli.inputs.readers import (
    MAX_TYPE_SETTLINGS,
    SchemaDrift,
)
from grpo_cli.inputs.sources import InputSet
from grpo_cli.options.config import ComputeConfig
from grpo_cli.outputs.output import (
    MemoryTarget,
    OutputTarget,
    open_output,
)
from grpo_cli.results.summary import RunSummary
from grpo_cli.run.plan import RunPlan
from grpo_cli.run.progress import Progress


def run_local(
    inputs: InputSet,
    config: ComputeConfig,
    output: OutputTarget | None,
    *,
    progress: Progress | None,
) -> RunSummary:
    """Run ``config`` over ``inputs``, writing to ``output`` (``None``: write nothing).

    ``output`` comes from :func:`~grpo_cli.outputs.output.open_output`, which may already be
    copying spliced shards' bytes; it is discarded if the run fails. Text columns whose
    type changes after the first block are settled (JSONL: the whole file's types; CSV:
    the column widened) and the run starts again (nothing was written by the failed attempt).
    """
    for _ in range(MAX_TYPE_SETTLINGS):
        try:
            engine = LocalEngine(inputs, RunPlan(config), writes_output=output is not None, progress=progress)
            return engine.run(output)
        except SchemaDrift as drift:
            drift.settle()
        finally:
            if output is not None:
                output.discard()  # a no-op once committed
        if output is not None:
            output = open_output(output.claim, config, inputs.shards)
    raise GrpoError(f"{inputs.spec}: the column types could not be settled")


def run_in_memory(inputs: InputSet, config: ComputeConfig) -> pa.Table:
    """Run ``config`` over in-memory ``inputs`` (the table API): the output rows."""
    target = MemoryTarget()
    LocalEngine(inputs, RunPlan(config), writes_output=True).run(target)
    return target.table()


def check_inputs(inputs: InputSet, config: ComputeConfig) -> None:
    """Refuse ``inputs`` as a run of ``config`` would, before reading any row (a LazyFrame's schema)."""
    LocalEngine(inputs, RunPlan(config), writes_output=True)


def refuse_as_local(inputs: InputSet, config: ComputeConfig) -> None:
    """Raise the error this engine's first pass raises on ``inputs``, if any: a null or
    NaN key, a group across two batches, or (with ``--nan error``) a bad reward, each
    naming its file and row.

    The Ray engine finds those in blocks its workers reduce, and the driver, which merges
    the blocks' per-group rows, knows no row; it calls this to word its refusal as this
    engine does (which error comes first included), reading the key and reward columns
    once more. Returns when ``inputs`` hold nothing to refuse.
    """
    engine = LocalEngine(inputs, RunPlan(config), writes_output=False)
    spool = _IdSpool(on_disk=not engine.in_memory)
    try:
        engine._statistics(spool)
    finally:
        spool.close()
