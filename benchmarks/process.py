"""Whole-process figures: each contender a fresh process, as a user runs it.

``grpo-cli compute`` is timed as the command a user types (its start-up, its imports, its page
faults, its exit), beside the same work done by the I/O floor (polars: read the file, append a
column, write it) and the polars one-liner (``over()``), each in a fresh interpreter. For each:
wall time, CPU time (user and system), peak RSS and minor page faults, read from the child's own
``rusage`` (``os.wait4``), the median of ``--repeats`` runs taken in turns (a new order each
round, after one warm-up round). ``make bench`` prints this table first; the in-process tables
after it are profiles.

    python benchmarks/process.py                 # 10M rows, sorted int IDs and shuffled uids
    python benchmarks/process.py --scaling       # and how wall and memory grow with rows
    python benchmarks/process.py --against DIR   # and another version, taking turns with this one

``--against`` names a directory holding another version's ``grpo_cli`` package (``git worktree
add /tmp/before <commit>``, or ``git archive <commit> grpo_cli | tar -x -C /tmp/before``): its
``compute`` and its start-up take turns with the others, so that two versions are compared in
one run, as the machine drifts alike for both.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from bench_data import machine, write_layouts, write_sorted  # noqa: E402

GRPO = [sys.executable, "-m", "grpo_cli"]
FLOOR = """
import sys, polars as pl
pl.read_parquet(sys.argv[1]).with_columns(pl.lit(0.0).alias("advantage")).write_parquet(sys.argv[2])
"""
ONE_LINER = """
import sys, polars as pl
r = pl.col("reward").cast(pl.Float64)
a = ((r - r.mean().over("group_id")) / (r.std(ddof=0).over("group_id") + 1e-6)).alias("advantage")
pl.read_parquet(sys.argv[1]).with_columns(a).write_parquet(sys.argv[2])
"""


@dataclass(frozen=True)
class Figures:
    """One fresh process: seconds of wall, user and system CPU, peak RSS (MiB), minor faults."""

    wall: float
    user: float
    system: float
    peak_mib: float
    faults: int


LAUNCHER = """
import json, os, sys, time
with open(sys.argv[1], "wb") as errors:
    started = time.perf_counter()
    pid = os.posix_spawn(sys.argv[2], sys.argv[2:], dict(os.environ), file_actions=[
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0), (os.POSIX_SPAWN_DUP2, errors.fileno(), 2)])
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - started
print(json.dumps([os.waitstatus_to_exitcode(status), wall, usage.ru_utime, usage.ru_stime,
                  usage.ru_maxrss / 1024, usage.ru_minflt]))
"""


def run_fresh(command: list[str]) -> Figures:
    """``command`` as a fresh process, its own resource usage (not this process's).

    Started by a small launcher process, which reads the command's ``rusage``: Linux counts the
    memory map a process is spawned from (fork, or vfork and exec) toward the new program's peak
    RSS, and this benchmark's own map holds gigabytes of data."""
    with tempfile.NamedTemporaryFile() as errors:
        done = subprocess.run(
            [sys.executable, "-c", LAUNCHER, errors.name, *command],
            capture_output=True,
            text=True,
            check=True,
        )
        code, wall, user, system, peak, faults = json.loads(done.stdout)
        if code:
            last = Path(errors.name).read_text(errors="replace").strip().splitlines()[-1:]
            raise SystemExit(f"{' '.join(command)}: exit {code}: {last}")
    return Figures(wall, user, system, peak, faults)


def medians(runs: list[Figures]) -> Figures:
    return Figures(
        statistics.median(r.wall for r in runs),
        statistics.median(r.user for r in runs),
        statistics.median(r.system for r in runs),
        statistics.median(r.peak_mib for r in runs),
        int(statistics.median(r.faults for r in runs)),
    )


def in_turns(contenders: dict[str, list[str]], repeats: int) -> dict[str, Figures]:
    """Each contender ``repeats`` times, in rounds of a new order each, after a warm-up round."""
    runs: dict[str, list[Figures]] = {name: [] for name in contenders}
    names = list(contenders)
    for round_ in range(repeats + 1):
        random.Random(round_).shuffle(names)
        for name in names:
            figures = run_fresh(contenders[name])
            if round_:
                runs[name].append(figures)
    return {name: medians(runs[name]) for name in contenders}


AGAINST = " (--against)"


def grpo_at(checkout: Path | None) -> list[str]:
    """``python -m grpo_cli``, or the same from another version's ``grpo_cli`` package in
    ``checkout`` (``-m`` would put the working directory, this checkout, ahead of it)."""
    if checkout is None:
        return GRPO
    start = f"import sys; sys.path.insert(0, {str(checkout)!r}); from grpo_cli.__main__ import main; main()"
    return [sys.executable, "-c", start]


def contenders_of(
    src: Path, out: Path, sample_out: Path, against: Path | None = None
) -> dict[str, list[str]]:
    python = [sys.executable, "-c"]
    versions = {"": None} if against is None else {"": None, AGAINST: against}
    contenders: dict[str, list[str]] = {}
    for label, checkout in versions.items():
        grpo = grpo_at(checkout)
        contenders[f"grpo-cli compute{label}"] = [
            *grpo,
            "compute",
            str(src),
            "-o",
            f"{out}{label.strip()}",
            "-g",
            "group_id",
            "--force",
            "-q",
        ]
        contenders[f"start-up: grpo-cli on the sample{label}"] = [
            *grpo,
            "compute",
            str(ROOT / "sample_data" / "rollouts.parquet"),
            "-o",
            f"{sample_out}{label.strip()}",
            "--force",
            "-q",
        ]
    contenders["I/O floor (polars)"] = [*python, FLOOR, str(src), str(out) + ".floor.parquet"]
    contenders["polars one-liner (over)"] = [*python, ONE_LINER, str(src), str(out) + ".polars.parquet"]
    contenders["start-up: import polars"] = [*python, "import polars"]
    return contenders


def print_table(title: str, results: dict[str, Figures]) -> None:
    width = max(36, *(len(name) for name in results))
    print(f"\n{title}")
    print(f"  {'command':{width}s} {'wall':>7s} {'user':>7s} {'system':>7s} {'peak RSS':>10s} {'faults':>9s}")
    for name, f in results.items():
        print(
            f"  {name:{width}s} {f.wall:6.2f}s {f.user:6.2f}s {f.system:6.2f}s {f.peak_mib:7.0f} MiB "
            f"{f.faults:9,d}"
        )


def bench_process(
    rows: int, group_size: int, repeats: int, data_dir: Path, against: Path | None = None
) -> None:
    """The fresh-process table for both 10M layouts, with the issue's ratios."""
    files = write_layouts(data_dir, rows, group_size)
    with tempfile.TemporaryDirectory(dir=data_dir) as scratch:
        for layout, src in files.items():
            out = Path(scratch) / "out.parquet"
            results = in_turns(contenders_of(src, out, Path(scratch) / "sample.parquet", against), repeats)
            decoded = pq.read_metadata(src).schema.to_arrow_schema()
            print_table(
                f"fresh processes, {rows:,} rows, {layout} ({src.stat().st_size / 2**20:.0f} MiB Parquet, "
                f"columns {', '.join(decoded.names)}); medians of {repeats}",
                results,
            )
            floor, polars_import = results["I/O floor (polars)"], results["start-up: import polars"]
            floor_work = floor.wall - polars_import.wall
            for label in ("", AGAINST) if against is not None else ("",):
                grpo, startup = (
                    results[f"grpo-cli compute{label}"],
                    results[f"start-up: grpo-cli on the sample{label}"],
                )
                work = grpo.wall - startup.wall
                print(
                    f"  grpo-cli{label}'s work past its start-up {work:.2f}s against the floor's "
                    f"past polars' import {floor_work:.2f}s: {work / floor_work:.2f}x (goal <= 2x); "
                    f"whole: {grpo.wall / floor.wall:.2f}x the floor, "
                    f"{grpo.wall / results['polars one-liner (over)'].wall:.2f}x the polars one-liner"
                )
                print(
                    f"  peak RSS above start-up: grpo-cli{label} {grpo.peak_mib - startup.peak_mib:.0f} MiB, "
                    f"floor {floor.peak_mib - polars_import.peak_mib:.0f} MiB"
                )


def bench_scaling(
    group_size: int,
    data_dir: Path,
    sorted_rows: tuple[int, ...],
    shuffled_rows: tuple[int, ...],
    against: Path | None = None,
) -> None:
    """Wall and peak RSS of one ``grpo-cli compute`` run as rows grow (default memory limit),
    and of ``against``'s right after it."""
    print("\nhow cost grows: one fresh grpo-cli compute each, --memory-limit-mb default (1024)")
    width = 36 if against is None else 36 + len(AGAINST)
    print(f"  {'input':{width}s} {'rows':>12s} {'wall':>7s} {'per 1M rows':>12s} {'peak RSS':>10s}")
    with tempfile.TemporaryDirectory(dir=data_dir) as scratch:
        out = Path(scratch) / "out.parquet"
        cases = [
            (
                "sorted int IDs",
                rows,
                write_sorted(data_dir / f"sorted_stream_{rows}.parquet", rows, group_size),
            )
            for rows in sorted_rows
        ]
        cases += [
            ("shuffled uids", rows, write_layouts(data_dir, rows, group_size)["shuffled uid strings"])
            for rows in shuffled_rows
        ]
        versions = {"": None} if against is None else {"": None, AGAINST: against}
        for label, rows, src in cases:
            for version, checkout in versions.items():
                command = [
                    *grpo_at(checkout),
                    "compute",
                    str(src),
                    "-o",
                    str(out),
                    "-g",
                    "group_id",
                    "--force",
                ]
                f = run_fresh([*command, "-q"])
                print(
                    f"  {label + version:{width}s} {rows:12,d} {f.wall:6.2f}s {f.wall / rows * 1e6:10.3f}s "
                    f"{f.peak_mib:7.0f} MiB"
                )
                out.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=HERE / "data")
    parser.add_argument(
        "--scaling", action="store_true", help="also 10M, 30M and 100M sorted, 10M and 30M shuffled"
    )
    parser.add_argument(
        "--against",
        type=Path,
        help="a directory holding another version's grpo_cli package: it takes turns with this one",
    )
    args = parser.parse_args()
    if args.against is not None and not (args.against / "grpo_cli" / "__init__.py").is_file():
        parser.error(f"--against {args.against}: no grpo_cli package in it")
    args.data_dir.mkdir(parents=True, exist_ok=True)
    print(f"fresh-process figures: python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n{machine()}")
    if args.against is not None:
        print(f"--against: the grpo_cli package in {args.against.resolve()}")
    bench_process(args.rows, args.group_size, args.repeats, args.data_dir, args.against)
    if args.scaling:
        bench_scaling(
            args.group_size,
            args.data_dir,
            (10_000_000, 30_000_000, 100_000_000),
            (10_000_000, 30_000_000),
            args.against,
        )


if __name__ == "__main__":
    main()
