"""Jobs over files, the library form of the CLI's commands: ``compute`` and ``check``.

Each job validates its options, resolves its inputs, claims its outputs (the data and
the summary file) from one :class:`~grpo_cli.outputs.guard.WriteGuard` before any work starts,
runs an engine, and writes the summary file only after the data was committed. The
engines never choose paths; they write to the claims they are handed.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from grpo_cli.errors import LayoutError
from grpo_cli.file_names import output_is_directory
from grpo_cli.inputs.readers import read_provenance, validate_pages
from grpo_cli.inputs.sources import InputSet
from grpo_cli.options.config import ComputeConfig
from grpo_cli.outputs.guard import (
    Claim,
    ProtectedInputs,
    WriteGuard,
    reported_after_commit,
    write_text,
)
from grpo_cli.outputs.output import open_output
from grpo_cli.results.checks import CheckBounds, evaluate_checks
from grpo_cli.results.summary import RunSummary
from grpo_cli.run.progress import Progress
from grpo_cli.trainers.dumps import trainer_hint

PathLike = str | os.PathLike[str]
Inputs = PathLike | Sequence[PathLike] | InputSet
"""A path, several, or inputs already resolved (a trainer's dump:
:func:`grpo_cli.trainers.dumps.open_dump`)."""


def _specs(input: Inputs) -> list[str]:
    if isinstance(input, InputSet):
        return input.specs
    if isinstance(input, str | os.PathLike):
        return [os.fspath(input)]
    if isinstance(input, list | tuple) and all(isinstance(item, str | os.PathLike) for item in input):
        return [os.fspath(item) for item in input]
    raise TypeError(
        f"expected a path or a list of paths, got a {type(input).__module__}.{type(input).__name__}; "
        "grpo_cli.add_advantages takes tables in memory"
    )


def compute_dataset(
    input: Inputs,
    output: PathLike | None,
    config: ComputeConfig | None = None,
    *,
    force: bool = False,
    progress: Progress | None = None,
    summary_json: PathLike | None = None,
    report: PathLike | None = None,
) -> RunSummary:
    """The same job as ``grpo-cli compute``, on this machine.

    Reads ``input`` (a file, directory of shards, glob, or ``-``; or a list of them),
    writes the augmented ``output`` atomically (nothing is written when ``output`` is ``None``),
    writes the summary as JSON to ``summary_json`` if given, and returns the run's
    :class:`~grpo_cli.results.summary.RunSummary`. Every path is checked by the write guard
    before any work starts.
    """
    return _local_job(
        input, output, config, force=force, progress=progress, summary_json=summary_json, report=report
    )


def compute_table(table: pa.Table, config: ComputeConfig) -> pa.Table:
    """The table API's job: ``table``'s rows (kept ones) with the new columns; nothing is written."""
    from grpo_cli.engines.local import run_in_memory

    config.validate()
    with InputSet.of_table(table) as inputs:
        return run_in_memory(inputs, config)


def check_table(table: pa.Table, config: ComputeConfig) -> None:
    """Refuse ``table`` as :func:`compute_table` would, without computing (a lazy frame's schema)."""
    from grpo_cli.engines.local import check_inputs

    config.validate()
    with InputSet.of_table(table) as inputs:
        check_inputs(inputs, config)


def summarize_table(table: pa.Table, config: ComputeConfig) -> RunSummary:
    """The run summary of a table in memory (``check``'s figures without checks)."""
    from grpo_cli.engines.local import run_local

    config.validate()
    with InputSet.of_table(table) as inputs:
        return run_local(inputs, config, None, progress=None)


def check_dataset(
    input: Inputs,
    bounds: CheckBounds,
    config: ComputeConfig | None = None,
    *,
    force: bool = False,
    progress: Progress | None = None,
    summary_json: PathLike | None = None,
    report: PathLike | None = None,
) -> RunSummary:
    """The same job as ``grpo-cli check``; ``summary.checks`` holds the results."""

    def add_checks(summary: RunSummary, inputs: InputSet) -> None:
        pages = validate_pages(inputs.shards) if bounds.validate_pages else None
        summary.checks = evaluate_checks(summary, bounds, pages=pages)

    return _local_job(
        input,
        None,
        config,
        force=force,
        progress=progress,
        summary_json=summary_json,
        finish=add_checks,
        report=report,
    )


def recorded_provenance(input: Inputs) -> dict[str, Any] | None:
    """The provenance entry grpo-cli wrote into ``input`` (its first shard that has one), or ``None``.

    Standard input is never read for it (it can be read only once).
    """
    specs = _specs(input)
    if "-" in specs:
        return None
    with InputSet(specs) as inputs:
        for shard in inputs.shards:
            record = read_provenance(shard)
            if record is not None:
                return record
    return None


def check_dataset_ray(
    input: Inputs,
    bounds: CheckBounds,
    config: ComputeConfig,
    *,
    address: str | None = None,
    partitions: int | None = None,
    quiet: bool = True,
    summary_json: PathLike | None = None,
    force: bool = False,
    report: PathLike | None = None,
) -> RunSummary:
    """``grpo-cli check --engine ray``: the local engine's check figures from Ray's jobs, nothing written.

    ``--verify-advantage-col`` compares each part of the input on a worker and merges what
    they saw; ``--trainer-filter`` gathers every scored row's group and reward on the driver,
    in input order, as the local engine holds them.
    """
    return _ray_job(
        input, None, config, address=address, partitions=partitions, quiet=quiet,
        summary_json=summary_json, force=force, bounds=bounds, report=report,
    )  # fmt: skip


def compute_dataset_ray(
    input: Inputs,
    output: str,
    config: ComputeConfig,
    *,
    address: str | None = None,
    partitions: int | None = None,
    force: bool = False,
    quiet: bool = True,
    summary_json: PathLike | None = None,
    report: PathLike | None = None,
) -> RunSummary:
    """``grpo-cli compute --engine ray``: read the input, write a directory of Parquet files.

    ``input`` is a file, directory, glob or object-store URI, or a list of them, or inputs
    already resolved (a trainer's dump). Parquet files and URIs are read by Ray's tasks; every
    other input is first written to private Parquet files on this machine, so it needs a local
    Ray instance (no ``address``). Local outputs are claimed from the same write guard as the
    local engine's.
    """
    return _ray_job(
        input, output, config, address=address, partitions=partitions, quiet=quiet,
        summary_json=summary_json, force=force, report=report,
    )  # fmt: skip


def _ray_job(input: Inputs, output: str | None, config: ComputeConfig, **options: Any) -> RunSummary:
    with _as_dumps_hint(input):
        return _ray_run(input, output, config, **options)


def _ray_run(
    input: Inputs,
    output: str | None,
    config: ComputeConfig,
    *,
    address: str | None,
    partitions: int | None,
    quiet: bool,
    summary_json: PathLike | None,
    force: bool,
    bounds: CheckBounds | None = None,
    report: PathLike | None = None,
) -> RunSummary:
    from grpo_cli.engines import ray as ray_engine

    started = time.perf_counter()
    ray_engine.check_ray_run(output, config, partitions=partitions)
    if report is not None:
        from grpo_cli.results.html_report import check_report_path

        check_report_path(os.fspath(report))
    with contextlib.ExitStack() as staging:
        specs = input if isinstance(input, InputSet) else _specs(input)
        inputs = ray_engine.resolve_inputs(
            specs, staging=staging, input_format=config.input_format, cluster=address is not None
        )

        def run(claim: Claim | None) -> RunSummary:
            try:
                summary = ray_engine.run_ray(
                    inputs, output, claim, config, address=address, partitions=partitions, quiet=quiet
                )
            except ray_engine.RowsUnknown:
                # Ray's blocks lost each row's file and position: the local engine's first pass
                # finds the same refusal and names the row, in the words it uses itself.
                if len(inputs.paths) == len(inputs.shards):
                    from grpo_cli.engines.local import refuse_as_local

                    with InputSet.of_shards(inputs.spec, inputs.shards, contextlib.ExitStack()) as local:
                        refuse_as_local(local, config)
                raise
            summary.elapsed_seconds = time.perf_counter() - started
            if bounds is not None:
                pages = validate_pages(inputs.shards) if bounds.validate_pages else None
                summary.checks = evaluate_checks(summary, bounds, pages=pages)
            return summary

        # Every output goes through the write guard. A local Ray instance writes on this machine
        # (an output on a store is uploaded all or none when the run commits); a cluster's workers
        # write a store's output to a staging folder there, moved into place when the run commits.
        return _guarded(
            inputs.protected(),
            output,
            summary_json,
            directory=True,
            force=force,
            run=run,
            report=report,
            written_elsewhere=address is not None,
        )


def _local_job(
    input: Inputs,
    output: PathLike | None,
    config: ComputeConfig | None,
    *,
    force: bool,
    progress: Progress | None,
    summary_json: PathLike | None,
    finish: Callable[[RunSummary, InputSet], None] | None = None,
    report: PathLike | None = None,
) -> RunSummary:
    config = config or ComputeConfig()
    config.validate()
    if report is not None:
        from grpo_cli.results.html_report import check_report_path

        check_report_path(os.fspath(report))
    directory = output_is_directory(os.fspath(output)) if output is not None else False  # "-": stdout
    with _as_dumps_hint(input):
        resolved = (
            input
            if isinstance(input, InputSet)
            else InputSet(_specs(input), input_format=config.input_format)
        )
        return _local_run(resolved, output, config, directory, force, progress, summary_json, finish, report)


def _local_run(
    resolved: InputSet,
    output: PathLike | None,
    config: ComputeConfig,
    directory: bool,
    force: bool,
    progress: Progress | None,
    summary_json: PathLike | None,
    finish: Callable[[RunSummary, InputSet], None] | None,
    report: PathLike | None,
) -> RunSummary:
    with resolved as inputs:

        def run(claim: Claim | None) -> RunSummary:
            # The spliced shards' bytes are copied while torch is imported (by the engine).
            target = open_output(claim, config, inputs.shards) if claim is not None else None
            from grpo_cli.engines.local import run_local

            summary = run_local(inputs, config, target, progress=progress)
            if finish is not None:
                finish(summary, inputs)
            return summary

        return _guarded(
            inputs.protected(), output, summary_json, directory=directory, force=force, run=run, report=report
        )


@contextlib.contextmanager
def _as_dumps_hint(input: Inputs) -> Iterator[None]:
    """A run over files whose layout does not fit the options (a column missing, data in
    subfolders) says what the files look like instead: a trainer's dump, to read with ``--from``."""
    try:
        yield
    except LayoutError as error:
        if isinstance(input, InputSet) or (hint := trainer_hint(_specs(input))) == "":
            raise
        raise LayoutError(error.message + hint, exit_code=error.exit_code) from None


def _guarded(
    protected: ProtectedInputs,
    output: PathLike | None,
    summary_json: PathLike | None,
    *,
    directory: bool,
    force: bool,
    run: Callable[[Claim | None], RunSummary],
    report: PathLike | None = None,
    written_elsewhere: bool = False,
) -> RunSummary:
    """Claim the outputs, run, then write the summary file; every failure after the commit says so."""
    with WriteGuard(protected) as guard:
        claim, summary_claim, report_claim = guard.claim_run(
            output,
            summary_json,
            directory=directory,
            force=force,
            report=report,
            written_elsewhere=written_elsewhere,
        )
        with reported_after_commit(claim):
            summary = run(claim)
            if summary_claim is not None:
                write_text(summary_claim, summary.to_json() + "\n")
            if report_claim is not None:
                from grpo_cli.results.html_report import report_bytes

                write_text(
                    report_claim, report_bytes(summary.to_dict(), os.fspath(report_claim.path)), "the report"
                )
            return summary
