"""The Ray engine: the same run on Ray Data, for datasets beyond one machine, with the local
engine's bits.

The local engine's pass 1 cuts the input into statistics blocks at fixed row positions
(``stats_block_rows``, counted over the whole input in order), reduces each block to per-group
statistics and figures, and merges the blocks in input order. A float sum depends on the order
of its terms, so the Ray engine makes the same cuts and the same merge:

1. statistics: one Ray task per statistics block reads the block's row ranges of its files
   (:func:`statistics_blocks`, only the run's columns, page CRCs verified), reduces them to
   one row per group with the kernel's accumulators (:func:`block_statistics`) and cuts those
   rows by their key's hash into one bucket per reducer (:func:`block_partials`). One task
   per bucket takes its rows of every block in block order and merges each group as the local
   engine merges its blocks (:func:`merge_bucket`, :class:`OrderedMerge`): a group's merged
   figures depend on its own partial rows only, so they are the local engine's bits. The
   reducer then finishes its bucket: the groups' outcome (the estimator's state among it),
   round 1 of the summary's findings, ``--by``'s cuts by value and a trainer filter's
   decisions. The driver holds one report a bucket and references to the buckets' figures
   and keys in the object store, never a per-group figure; round 2 of the findings runs a
   task per bucket (:mod:`grpo_cli.engines.ray.gather`);
2. moments (a batch whitening only): one task per statistics block computes the block's
   weighted moments per training batch; the driver merges them in block order;
3. advantages: every block of the input, read by Ray Data, is joined with the per-group
   outcome, which each worker process rebuilds once from the buckets' figures, the groups
   numbered bucket after bucket (:func:`~grpo_cli.engines.ray.tasks._worker_state`), and
   written out.

So the advantages, masks and summary are the local engine's, bit for bit, and the driver's
memory does not grow with the groups (``benchmarks/bench.py --only ray``). Until 2026-12-07 a
second path, where the driver gathered every group's figures and ordered them by first
appearance, was kept beside this one; it was deleted after its last benchmark
(``docs/architecture.md``). Patterns measured to be much slower and avoided here:
``groupby().map_groups()`` (one call and one Parquet row group per group) and Ray's ``Std``
aggregation (a Python path, ddof=1 by default).
"""

from __future__ import annotations

from grpo_cli.engines.ray.blocks import statistics_blocks
from grpo_cli.engines.ray.fields import RowsUnknown
from grpo_cli.engines.ray.inputs import (
    InputFile,
    RayInputs,
    check_ray_run,
    resolve_inputs,
    side_by_side_requests,
)
from grpo_cli.engines.ray.run import run_ray
from grpo_cli.engines.ray.session import WORKER_ENV, import_ray, ray_session

__all__ = [
    "WORKER_ENV",
    "InputFile",
    "RayInputs",
    "RowsUnknown",
    "check_ray_run",
    "import_ray",
    "ray_session",
    "resolve_inputs",
    "run_ray",
    "side_by_side_requests",
    "statistics_blocks",
]
