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
   driver receives each group's figures and where it first appeared (block, place in the
   block), never a key or a partial row, and orders the groups by first appearance over the
   whole input (:func:`_gathered`): the local engine's group IDs. The keys stay with the
   reducers in the object store (:class:`BucketKeys`);
2. moments (a batch whitening only): one task per statistics block computes the block's
   weighted moments per training batch; the driver merges them in block order;
3. advantages: every block of the input, read by Ray Data, is joined with the per-group
   outcome (broadcast once through the object store; each worker process indexes the
   buckets' keys once, with their run IDs) and written out.

So the advantages, masks and summary are the local engine's, bit for bit. The driver holds
the run's per-group figures (about 80 bytes a group, with the outcome and the summary
computed from them as the local engine computes them), not the keys. Patterns measured to be
much slower and avoided here: ``groupby().map_groups()`` (one call and one Parquet row group
per group) and Ray's ``Std`` aggregation (a Python path, ddof=1 by default).
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
