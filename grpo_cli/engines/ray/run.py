"""``run_ray``: the stages in order (statistics, moments, advantages or --verify, the output
committed) and the summary."""

from __future__ import annotations

import contextlib
import itertools
import math
import pickle
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from grpo_cli import collector
from grpo_cli.arrow.keys import check_key_types
from grpo_cli.engines.ray.blocks import FilePart, advantage_parts, keyed_by_position, statistics_blocks
from grpo_cli.engines.ray.fields import _CPU, RowsUnknown, _report_of
from grpo_cli.engines.ray.gather import HeldStatistics, _held_statistics
from grpo_cli.engines.ray.inputs import (
    RayInputs,
    _files_under,
    _open_remote,
    _read_schemas,
    _write_empty,
    _written_footers,
)
from grpo_cli.engines.ray.merge import _merged_range
from grpo_cli.engines.ray.session import ray_session
from grpo_cli.engines.ray.shipping import _block_dataset, _map_blocks, _raise_first_refusal, _task
from grpo_cli.engines.ray.tasks import (
    _range_of,
    block_advantages,
    block_moments,
    block_splice,
    settle_bucket,
    splice_plan,
    verify_part,
)
from grpo_cli.errors import GrpoError, mention
from grpo_cli.kernel import (
    WeightedMoments,
    empty_group_stats,
    merge_weighted_moments,
    weighted_moments,
)
from grpo_cli.options.config import ComputeConfig
from grpo_cli.outputs.guard import Claim, RemoteClaim, StagedRemoteClaim
from grpo_cli.outputs.output import (
    commit_directory,
    footers_range,
    output_info,
)
from grpo_cli.results.findings import (
    GroupFindings,
    SecondRound,
    merged_findings,
)
from grpo_cli.results.summary import (
    RunSummary,
    build_summary,
    input_info,
)
from grpo_cli.results.verify import Verifier
from grpo_cli.run.outcome import OutcomeTotals
from grpo_cli.run.plan import RunPlan
from grpo_cli.run.reward_counts import RewardCounts
from grpo_cli.run.steps import with_watched_step

PARTITION_BYTES = 256 << 20


def _held_verify(
    ray: Any, parts: list[list[FilePart]], plan: RunPlan, held: HeldStatistics, job: dict[str, Any]
) -> tuple[dict[str, Any], tuple[float, float] | None]:
    """``check --verify-advantage-col`` where the reducers finished job 1: each part compared on
    a worker (its examples named there), each bucket's constant groups settled by a task of
    their own from every part's cut of their state; the driver merges the parts' counts and
    examples in input order with the buckets' (no per-group state), as :func:`_verify` does."""
    config = plan.config
    assert config.verify is not None
    starts = list(itertools.accumulate(held.sizes, initial=0))[:-1]
    shared = ray.put(parts)
    answers = [
        _task(ray, verify_part, num_returns=1 + len(starts)).remote(
            i, shared, job["payload"], job["token"], config, job["group_size"], starts
        )
        for i in range(len(parts))
    ]
    tables = ray.get([refs[0] for refs in answers])
    _raise_first_refusal(tables)
    settles = [
        _task(ray, settle_bucket, num_returns=1).remote(
            config, figures, keys, *[refs[1 + b] for refs in answers]
        )
        for b, (figures, keys) in enumerate(zip(held.figures, held.keys, strict=True))
    ]
    verifier = Verifier(
        config.verify,
        empty_group_stats(0, count_extremes=plan.count_extremes),
        config.advantage,
        None,
        batch_transform=plan.needs_moments_pass,
    )
    for table in tables:
        verifier.merge(pickle.loads(table.column("partial")[0].as_py()), named=True)
    for table in ray.get(settles):
        verifier.merge(_report_of(table), named=True)
    return verifier.result(), _range_of(tables)


def run_ray(
    inputs: RayInputs,
    output: str | None,
    claim: Claim | None,
    config: ComputeConfig,
    *,
    address: str | None,
    partitions: int | None,
    quiet: bool,
) -> RunSummary:
    """The Ray Data jobs; writes to ``claim`` (a local directory) or to the URI ``output``
    (``None``: ``check``, which writes nothing and needs the advantages' range only).

    A null or NaN key, a group across two batches and (with ``--nan error``) a bad reward
    raise :class:`RowsUnknown`.
    """
    collector.resume()  # the modules are loaded: the CLI's start-up paused it
    started = time.perf_counter()
    group_size = config.group_size
    asked = RunPlan(config, device=_CPU)
    schemas = _read_schemas(inputs.files, asked)
    watching = with_watched_step(config, schemas)
    if watching is not config:
        config, asked = watching, RunPlan(watching, device=_CPU)
    plan = RunPlan(keyed_by_position(config), device=_CPU)  # what the jobs run
    total_rows = sum(file.rows for file in inputs.files)
    if group_size is None:
        check_key_types(
            [(file.display, schema) for file, schema in zip(inputs.files, schemas, strict=True)],
            config.group_cols,
        )
    elif total_rows % group_size:
        raise GrpoError(
            f"{mention('group_size')} {group_size} does not divide the {total_rows} rows of {inputs.spec}"
        )
    total_bytes = sum(file.size_bytes for file in inputs.files)
    partition_count = partitions or max(1, math.ceil(total_bytes / PARTITION_BYTES))
    blocks = statistics_blocks(inputs.files, config.stats_block_rows)
    ray_start = time.perf_counter()
    # Ray prints warnings with print(): keep standard output for what the user asked for.
    with contextlib.redirect_stdout(sys.stderr), ray_session(address, quiet=quiet) as ray:
        ray_startup = time.perf_counter() - ray_start
        dtypes = {plan.output_dtype(schema) for schema in schemas}
        # check, where the advantages' range follows from each group's extremes, computed as
        # the rows would be: no advantage job
        range_dtype = (
            next(iter(dtypes))
            if output is None and config.verify is None and plan.range_follows_from_stats and len(dtypes) == 1
            else None
        )
        held = _held_statistics(ray, blocks, plan, group_size)
        totals = held.totals
        if totals.rows == 0:
            raise GrpoError(f"{inputs.spec}: no rows; there is nothing to compute advantages for")
        if totals.nan_rewards and config.advantage.nan == "error":
            raise RowsUnknown(
                f"{inputs.spec}: {totals.nan_rewards} reward(s) are null, NaN or infinite "
                f"({mention('nan')} ignore leaves them out; the local engine names the first row)"
            )
        second_round = held.round_two(ray, plan, range_dtype)  # beside the advantage job
        transform = None
        if plan.needs_moments_pass:
            moments = _moments(ray, blocks, plan, held.payload(ray), group_size)
            transform = plan.transform(moments)
        payload = held.payload(ray, transform)
        parts = advantage_parts(inputs.files, partition_count)
        written_info: dict[str, Any] | None = None
        job = {
            "payload": payload,
            "token": uuid.uuid4().hex,
            "config": plan.config,
            # the options as asked (--group-size), as the local engine records them
            "provenance": asked.provenance([file.display for file in inputs.files], totals),
            "group_size": group_size,
        }

        def summary(
            extremes: tuple[float, float] | None,
            written: dict[str, Any] | None = None,
            **checked: Any,
        ) -> RunSummary:
            seconds = [_report_of(table) for table in ray.get(second_round)]
            if range_dtype is not None:
                extremes = _merged_range([extremes for _, extremes in seconds], totals.nan_rewards)
            findings = merged_findings(
                held.first,
                sum((second for second, _ in seconds), SecondRound()),
                options=config.findings_options(),
                named=config.group_size is None,
            )
            findings = replace(findings, by=held.by)
            return _summary(
                inputs,
                config,
                totals,
                findings,
                held.reward_counts,
                parts,
                blocks,
                ray_startup,
                started,
                written,
                extremes,
                **checked,
            )

        if output is None:  # check: the figures and the advantages' range, nothing written
            filtered = verified = None
            extremes = None
            if config.trainer_filter is not None:
                assert held.filtered is not None
                filtered = plan.trainer_filter_result(held.filtered)
            if config.verify is not None:
                verified, extremes = _held_verify(ray, parts, plan, held, job)
            elif range_dtype is None:  # else each bucket's range comes with its round 2
                column = config.advantage_col
                advantages = _block_dataset(ray, parts, block_advantages, **job).select_columns([column])
                extremes = (float(advantages.min(column)), float(advantages.max(column)))
            return summary(extremes, verified=verified, trainer_filter=filtered)
        assert claim is not None
        # A cluster's workers write a store's output to its staging folder there; otherwise Ray
        # writes to the claim's temporary folder on this machine.
        filesystem: Any = None
        if isinstance(claim, StagedRemoteClaim):
            target = claim.staging_uri()
            filesystem, folder = _open_remote(target)
        else:
            target = folder = str(claim.temp_path())
        rewrite_reason = splice_plan(inputs, config)
        method = "rewrite"
        if rewrite_reason is None:  # each task splices one input file, as the local engine does
            method, parts = "splice", [[FilePart(file, 0, file.rows)] for file in inputs.files]
            tables = _map_blocks(ray, parts, block_splice, target=target, **job)
            extremes = _range_of(tables)
        else:
            _block_dataset(ray, parts, block_advantages, **job).write_parquet(
                folder, filesystem=filesystem, try_create_dir=filesystem is None
            )
        written: list[Path | str] = (
            [*_files_under(filesystem, folder)] if filesystem else [*sorted(Path(folder).glob("*.parquet"))]
        )
        if not written:  # Ray Data writes no file for no rows (every group filtered out)
            schema = asked.output_schema(schemas[0], job["provenance"])
            written = [_write_empty(schema, folder, filesystem)]
        footers = _written_footers(written, totals, claim.display, filesystem=filesystem)
        if rewrite_reason is not None:
            extremes = footers_range(footers, config.advantage_col)
        if isinstance(claim, StagedRemoteClaim):
            claim.commit()
            assert claim.transfer is not None
            written_info = {
                "path": claim.display,
                "shards": len(written),
                "bytes": claim.transfer["bytes_uploaded"],
            }
            if method == "splice":  # what the tasks uploaded, and what they copied in the store
                claim.transfer["bytes_uploaded"] = sum(t.column("uploaded")[0].as_py() for t in tables)
                claim.transfer["bytes_copied_in_store"] = sum(t.column("copied")[0].as_py() for t in tables)
        else:
            if method == "splice" and isinstance(claim, RemoteClaim):  # S3 inputs' bytes copied in the store
                for table in tables:
                    source = table.column("source")[0].as_py()
                    if source.startswith("s3://"):
                        claim.note_copied_prefix(
                            table.column("name")[0].as_py(), source, table.column("prefix")[0].as_py()
                        )
            # before the commit: an upload removes them
            written_info = output_info(claim.display, [Path(file) for file in written])
            commit_directory(claim)
        if claim.transfer is not None:
            written_info["transfer"] = claim.transfer
        written_info.update(method=method, shards_by_method={method: len(written)})
        if rewrite_reason is not None:
            written_info["rewrite_reason"] = rewrite_reason
        # in the session: the summary names groups by their keys, which the object store holds
        return summary(extremes, written_info)


def _summary(
    inputs: RayInputs,
    config: ComputeConfig,
    totals: OutcomeTotals,
    findings: GroupFindings,
    reward_counts: RewardCounts,
    parts: list[Any],
    blocks: list[Any],
    ray_startup: float,
    started: float,
    written_info: dict[str, Any] | None,
    extremes: tuple[float, float] | None,
    *,
    verified: dict[str, Any] | None = None,
    trainer_filter: dict[str, Any] | None = None,
) -> RunSummary:
    options = {
        **config.options_summary(),
        "device": "cpu",
        "engine": "ray",
        "partitions": len(parts),
        "statistics_blocks": len(blocks),
        "ray_startup_seconds": round(ray_startup, 3),
    }
    output = written_info
    return build_summary(
        totals,
        input=input_info(
            inputs.spec,
            [file.shard() for file in inputs.files],
            stdin=inputs.spec == "-",
            bytes_decoded=sum(file.size_bytes for file in inputs.files),
            about=inputs.about,
        ),
        output=output,
        options=options,
        advantage_range=extremes,
        mode="ray",
        device="cpu",
        elapsed=time.perf_counter() - started,
        verify=verified,
        trainer_filter=trainer_filter,
        reward_counts=reward_counts,
        findings=findings,
    )


def _moments(
    ray: Any,
    blocks: list[list[FilePart]],
    plan: RunPlan,
    payload: Any,
    group_size: int | None,
) -> WeightedMoments:
    """The extra job of a batch transform: each statistics block's moments of each of the
    run's batches, merged in block order as the local engine's moments pass merges them
    (``payload``: the buckets' :meth:`HeldStatistics.payload`; the batches are numbered by the
    workers' outcome, each block's table a row per batch)."""
    tables = _map_blocks(
        ray,
        blocks,
        block_moments,
        payload=payload,
        token=uuid.uuid4().hex,
        config=plan.config,
        group_size=group_size,
    )
    batches = {table.num_rows for table in tables}
    if len(batches) > 1:
        raise RuntimeError(f"the moments job's blocks returned {sorted(batches)} batches")
    count = batches.pop() if batches else 0
    total = weighted_moments(torch.zeros(0), None, torch.zeros(0, dtype=torch.int64), count)
    for table in tables:
        part = WeightedMoments(
            *(
                torch.from_numpy(table.column(name).to_numpy().copy())
                for name in ("weight", "mean", "m2", "count")
            )
        )
        total = merge_weighted_moments(total, part)
    return total
