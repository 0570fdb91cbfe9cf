"""Jobs over files, the library form of the CLI's commands: one function a command
(:func:`compute_dataset`, :func:`check_dataset`), and the engine it runs on as a value
(:class:`Local`, the default, or :class:`Ray`).

Each job validates its options, resolves its inputs, claims its outputs (the data and
the summary file) from one :class:`~grpo_cli.outputs.guard.WriteGuard` before any work starts,
runs the engine, and writes the summary file only after the data was committed. The
engines never choose paths; they write to the claims they are handed.

>>> engine_named("ray", partitions=4)
Ray(address=None, partitions=4, quiet=True)
>>> engine_named("local", partitions=4)
Traceback (most recent call last):
...
grpo_cli.errors.GrpoError: --ray-address and --partitions need --engine ray
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from grpo_cli.choices import Engine as EngineName
from grpo_cli.choices import check_choice
from grpo_cli.errors import GrpoError, LayoutError, mention
from grpo_cli.file_names import output_is_directory
from grpo_cli.inputs.protected import ProtectedInputs
from grpo_cli.inputs.readers import read_provenance, read_schema, validate_pages
from grpo_cli.inputs.sources import InputSet
from grpo_cli.options.checks import CheckBounds
from grpo_cli.options.config import ComputeConfig, VerifySpec
from grpo_cli.outputs.guard import (
    Claim,
    WriteGuard,
    reported_after_commit,
    write_text,
)
from grpo_cli.outputs.output import open_output
from grpo_cli.results.checks import evaluate_checks
from grpo_cli.results.summary import RunSummary
from grpo_cli.run.columns import check_columns
from grpo_cli.run.progress import Progress
from grpo_cli.trainers.dumps import trainer_hint

if TYPE_CHECKING:
    from grpo_cli.inputs.sources import Shard

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
    engine: Engine | None = None,
    force: bool = False,
    progress: Progress | None = None,
    summary_json: PathLike | None = None,
    report: PathLike | None = None,
) -> RunSummary:
    """The same job as ``grpo-cli compute``, on ``engine`` (:class:`Local`, the default, or
    :class:`Ray`).

    Reads ``input`` (a file, directory of shards, glob, or ``-``; or a list of them; or inputs
    already resolved, a trainer's dump), writes the augmented ``output`` atomically (nothing
    is written when ``output`` is ``None``; on Ray, a directory of Parquet files or a store's
    URI), writes the summary as JSON to ``summary_json`` if given, and returns the run's
    :class:`~grpo_cli.results.summary.RunSummary`. Every path is checked by the write guard
    before any work starts.
    """
    job = Job(input, output, config or ComputeConfig(), force, progress, summary_json, report)
    return (engine or Local()).run(job)


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
    engine: Engine | None = None,
    force: bool = False,
    progress: Progress | None = None,
    summary_json: PathLike | None = None,
    report: PathLike | None = None,
    verify: bool = False,
) -> RunSummary:
    """The same job as ``grpo-cli check`` on ``engine``; ``summary.checks`` holds the results.
    Nothing but the summary and the report is written.

    ``verify``: as ``check --verify``, recompute the advantages ``input`` holds with the options
    it recorded when grpo-cli wrote it and compare them (``summary.verify``); ``config`` is then
    those options (:func:`recorded_config`) and must not be given. To verify a column made
    otherwise, give the options it was made with and the column:
    ``ComputeConfig(..., verify=VerifySpec(column))``.
    """
    if verify:
        if config is not None:
            raise GrpoError(
                "check_dataset(verify=True) takes the options the input recorded; leave config out"
            )
        recorded = recorded_config(input)
        assert recorded is not None  # refused where there is none
        config = replace(recorded, verify=VerifySpec(recorded.advantage_col))
    job = Job(input, None, config or ComputeConfig(), force, progress, summary_json, report, bounds)
    return (engine or Local()).run(job)


def recorded_config(input: Inputs, *, column: str | None = None) -> ComputeConfig | None:
    """The options grpo-cli made ``input`` with (its provenance), to verify it against.

    Without ``column`` (verify the column grpo-cli wrote), refuses an input without a
    provenance record, and one whose advantages its own rows cannot give again (filtered after
    a step over the whole batch). With ``column``, ``None`` where there is no record (the
    options are then the caller's).
    """
    specs = _specs(input)
    record = recorded_provenance(input)
    if record is None and column is not None:
        return None
    if record is None:
        raise GrpoError(
            f"{' '.join(specs)}: no grpo-cli provenance to verify against (not written by grpo-cli "
            f"compute); name the column with {mention('verify_advantage_col')} and give the options it was "
            "made with"
        )
    recorded = ComputeConfig.from_provenance(record)
    if column is None:
        recorded.check_recomputable(" ".join(specs))
    return recorded


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


@dataclass(frozen=True)
class Job:
    """One command's work, as an engine runs it: what it reads, what it writes (``output``:
    ``None`` writes no data), the options, and ``check``'s bounds (``None``: ``compute``)."""

    input: Inputs
    output: PathLike | None
    config: ComputeConfig
    force: bool = False
    progress: Progress | None = None
    summary_json: PathLike | None = None
    report: PathLike | None = None
    bounds: CheckBounds | None = None


@dataclass(frozen=True)
class Local:
    """The engine on this machine: two passes over the input in batches, the output spliced
    or rewritten beside its target and committed at the end (:mod:`grpo_cli.engines.local`)."""

    shows_progress: ClassVar[bool] = True

    def run(self, job: Job) -> RunSummary:
        """One job on this machine."""
        input, output, config, report = job.input, job.output, job.config, job.report
        config.validate()
        _check_report(report)
        directory = output_is_directory(os.fspath(output)) if output is not None else False  # "-": stdout
        with _as_dumps_hint(input):
            resolved = (
                input
                if isinstance(input, InputSet)
                else InputSet(_specs(input), input_format=config.input_format)
            )
            with resolved as inputs:

                def run(claim: Claim | None) -> RunSummary:
                    _check_columns_first(inputs.shards, config, writes_output=claim is not None)
                    # The spliced shards' bytes are copied while torch is imported (by the engine).
                    target = open_output(claim, config, inputs.shards) if claim is not None else None
                    from grpo_cli.engines.local import run_local

                    summary = run_local(inputs, config, target, progress=job.progress)
                    _add_checks(summary, inputs.shards, job.bounds)
                    return summary

                return _guarded(job, inputs.protected(), output, directory=directory, run=run)


@dataclass(frozen=True)
class Ray:
    """The Ray Data engine, on a local instance or the cluster at ``address``
    (:mod:`grpo_cli.engines.ray`): the local engine's bits, the output a directory of Parquet
    files or a store's URI. ``partitions``: the advantage job's parts (default: one per
    256 MiB of input); ``quiet``: Ray's own log lines left out.

    Parquet files and URIs are read by Ray's tasks; every other input is first written to
    private Parquet files on this machine, so it needs a local instance (no ``address``).
    ``check --verify-advantage-col`` compares each part of the input on a worker and merges
    what they saw; a trainer's filter runs on the reducers, each group's rows sent to its
    bucket.
    """

    address: str | None = None
    partitions: int | None = None
    quiet: bool = True

    shows_progress: ClassVar[bool] = False

    def run(self, job: Job) -> RunSummary:
        """One job on Ray (its ``progress`` is not drawn: Ray reports its own)."""
        input, output, config, report = job.input, job.output, job.config, job.report
        from grpo_cli.engines import ray as ray_engine

        started = time.perf_counter()
        target = None if output is None else os.fspath(output)
        ray_engine.check_ray_run(target, config, partitions=self.partitions)
        _check_report(report)
        with _as_dumps_hint(input), contextlib.ExitStack() as staging:
            specs = input if isinstance(input, InputSet) else _specs(input)
            inputs = ray_engine.resolve_inputs(
                specs, staging=staging, input_format=config.input_format, cluster=self.address is not None
            )

            def run(claim: Claim | None) -> RunSummary:
                try:
                    summary = ray_engine.run_ray(
                        inputs,
                        target,
                        claim,
                        config,
                        address=self.address,
                        partitions=self.partitions,
                        quiet=self.quiet,
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
                _add_checks(summary, inputs.shards, job.bounds)
                return summary

            # Every output goes through the write guard. A local Ray instance writes on this
            # machine (an output on a store is uploaded all or none when the run commits); a
            # cluster's workers write a store's output to a staging folder there, moved into
            # place when the run commits.
            return _guarded(
                job,
                inputs.protected(),
                target,
                directory=True,
                run=run,
                written_elsewhere=self.address is not None,
            )


Engine = Local | Ray
"""Where a job runs: a value, with the engine's own settings."""


def engine_named(
    name: EngineName, *, address: str | None = None, partitions: int | None = None, quiet: bool = True
) -> Engine:
    """The engine ``--engine`` names, with its own options; the Ray engine's given to the local
    one are refused."""
    check_choice(mention("engine"), name, EngineName)
    if name == "local":
        if address is not None or partitions is not None:
            raise GrpoError(
                f"{mention('ray_address')} and {mention('partitions')} need {mention('engine')} ray"
            )
        return Local()
    return Ray(address=address, partitions=partitions, quiet=quiet)


def _check_columns_first(shards: Sequence[Shard], config: ComputeConfig, *, writes_output: bool) -> None:
    """The columns of every Parquet and Arrow shard against the options, from their footers,
    before torch loads: a misspelt column's one line comes at once, not after the imports.
    Text shards are checked by the engine, which infers their schema as it reads them once."""
    for shard in shards:
        if shard.format in ("parquet", "arrow"):
            check_columns(config, shard, read_schema(shard), writes_output=writes_output)


def _check_report(report: PathLike | None) -> None:
    if report is not None:
        from grpo_cli.results.html_report import check_report_path

        check_report_path(os.fspath(report))


def _add_checks(summary: RunSummary, shards: Sequence[Shard], bounds: CheckBounds | None) -> None:
    """``check``: the checks' results on the summary, each shard's pages validated where asked."""
    if bounds is not None:
        pages = validate_pages(shards) if bounds.validate_pages else None
        summary.checks = evaluate_checks(summary, bounds, pages=pages)


@contextlib.contextmanager
def _as_dumps_hint(input: Inputs) -> Iterator[None]:
    """A run over files whose layout does not fit the options (a column missing, data in
    subfolders) says what the files look like instead: a trainer's dump, to read with ``--from``."""
    try:
        yield
    except LayoutError as error:
        if isinstance(input, InputSet) or (hint := trainer_hint(_specs(input))) == "":
            raise
        raise LayoutError(error.template + hint, exit_code=error.exit_code) from None


def _guarded(
    job: Job,
    protected: ProtectedInputs,
    output: PathLike | None,
    *,
    directory: bool,
    run: Callable[[Claim | None], RunSummary],
    written_elsewhere: bool = False,
) -> RunSummary:
    """Claim the job's outputs (``output``, its summary file and report), run, then write the
    summary file and the report; every failure after the commit says so."""
    report = job.report
    with WriteGuard(protected) as guard:
        claim, summary_claim, report_claim = guard.claim_run(
            output,
            job.summary_json,
            directory=directory,
            force=job.force,
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
