"""How a command runs and reports: the options that are neither the run's configuration nor a check.

A command reads them as one typed value (``CommandOptions``), each field an option declared on
it (:func:`~grpo_cli.options.declare.option`). Plain data, standard library only.

>>> CommandOptions(quiet=True).engine, CommandOptions().color
('local', 'auto')
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_cli.choices import CheckFormat, Color, Engine, Trainer
from grpo_cli.options.declare import CHECKS, ENGINE, EVERY, INPUT, OUTPUT, RUN, SHARED, option


@dataclass(frozen=True)
class CommandOptions:
    """Where a command writes, what it reads besides its configuration, and how it reports."""

    output: str | None = option(
        None,
        "--output",
        "-o",
        help="Output Parquet file (.parquet); JSON lines (.jsonl, .jsonl.gz, .jsonl.zst; - for standard "
        "output); or a directory: one Parquet shard per input shard.",
        kind=str,
        required=True,
        panel=OUTPUT,
        commands=("compute",),
        metavar="PATH",
        shown=False,
    )
    output_format: CheckFormat = option(
        "text",
        "--output-format",
        help="How check's results also go to standard output for a CI system: text (nothing more: the "
        "lines are on standard error), github (a GitHub Actions ::error annotation for each failed "
        "check) or junit (a JUnit XML report, a test case a check, for GitLab, Jenkins and others).",
        panel=OUTPUT,
    )
    report: str | None = option(
        None,
        "--report",
        help="Also write the figures as charts to PATH (.html, one self-contained page that opens offline; "
        ".svg, its charts in one picture; .png, that picture drawn by a headless Chromium on PATH): the "
        "inactive fraction and mean reward per value of each --by column, the group-mean and group-size "
        "distributions.",
        panel=OUTPUT,
        commands=SHARED,
        metavar="PATH",
        shown=False,
    )
    summary_json: str | None = option(
        None,
        "--summary-json",
        help="Write the summary as JSON to PATH, or - for standard output.",
        panel=OUTPUT,
        commands=SHARED,
        metavar="PATH",
    )
    force: bool = option(
        False,
        "--force",
        "-f",
        help={
            "compute": "Overwrite an existing output.",
            "check": "Overwrite an existing --summary-json file.",
        },
        panel=OUTPUT,
        commands=SHARED,
    )
    from_: Trainer | None = option(
        None,
        "--from",
        help="INPUT is this trainer's rollout dump (its dump folder, files or a glob): the reward, step "
        "and group key are read as the trainer writes them, and its preset applies; explicit options "
        "override them. The trainer's own advantage column is kept: the new one is recomputed_advantage.",
        panel=INPUT,
        commands=SHARED,
        keyword=True,
        metavar="TRAINER",
    )
    key_before: str | None = option(
        None,
        "--key-before",
        help="The group key is the part of the --group-col value before the first SEP (verl v1's uid "
        "{uid}_{session}_{index}: --key-before _), derived per file as the column group_key.",
        panel=INPUT,
        commands=SHARED,
        metavar="SEP",
    )
    blocks_per_file: bool = option(
        False,
        "--blocks-per-file",
        help="With --group-size N: the blocks of N rows restart at each file (a file's last block may be "
        "short), derived as the column group_key.",
        panel=INPUT,
        commands=SHARED,
    )
    json_col: list[str] | None = option(
        None,
        "--json-col",
        help="COL holds JSON text (prime-rl's metrics, info): read it as the values it holds, so that "
        "-r COL.field reads a field of it (compute writes it so too); repeat for several.",
        panel=INPUT,
        commands=SHARED,
        metavar="COL",
    )
    verify_advantage_col: str | None = option(
        None,
        "--verify-advantage-col",
        help="Recompute advantages with the chosen options or preset and compare them with this column.",
        panel=CHECKS,
        metavar="NAME",
    )
    verify: bool = option(
        False,
        "--verify",
        help="Recompute the advantage column a grpo-cli output records, with the options it records (its "
        "provenance); options given beside it override them.",
        panel=CHECKS,
    )
    engine: Engine = option(
        "local",
        "--engine",
        help="local: this machine, streaming; ray: a Ray cluster with Ray Data.",
        panel=ENGINE,
        commands=SHARED,
    )
    ray_address: str | None = option(
        None,
        "--ray-address",
        help="With --engine ray: 'auto' or host:port joins a cluster.",
        panel=ENGINE,
        commands=SHARED,
        metavar="ADDRESS",
        shown="start a local Ray instance",
    )
    partitions: int | None = option(
        None,
        "--partitions",
        help="With --engine ray: tasks, and output files, of a re-encoding advantage job "
        "(a spliced run has one per input file).",
        panel=ENGINE,
        commands=SHARED,
        metavar="N",
        shown="input size / 256 MiB",
        min=1,
    )
    quiet: bool = option(
        False,
        "--quiet",
        "-q",
        help="No summary and no progress on standard error; check still prints one line for each check "
        "that failed, so a CI log says why.",
        panel=RUN,
        commands=SHARED,
    )
    silent: bool = option(
        False,
        "--silent",
        "-s",
        help="Nothing on standard error but an error's one line: no summary, no progress, no check lines "
        "(the exit code says whether the checks passed).",
        panel=RUN,
        commands=SHARED,
    )
    color: Color = option(
        "auto",
        "--color",
        help="Colour the report on standard error: auto (on a terminal, unless NO_COLOR is set), always, "
        "never.",
        panel=RUN,
        commands=SHARED,
    )
    debug: bool = option(
        False, "--debug", help="Show the traceback of unexpected errors.", panel=RUN, commands=EVERY
    )

    @property
    def reports(self) -> bool:
        """Whether anything but errors goes to standard error (neither ``--quiet`` nor ``--silent``)."""
        return not (self.quiet or self.silent)
