"""grpo-cli benchmarks: the kernel, the file-to-file job, and peak memory, beside their peers.

Run ``make bench`` (10M rows; a few minutes and ~6 GB of scratch files under
benchmarks/data/) or ``python benchmarks/bench.py --help``. The first table (``process``,
:mod:`process`) is what a user meets: each command a fresh process, its wall, CPU, peak RSS
and page faults. The tables after it are profiles: every contender runs in this one warm
process on the same data, so the ratios are meaningful on a noisy shared machine even when
the absolute seconds are not. Each of their figures is the best of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from bench_data import (  # noqa: E402
    machine,
    make_arrays,
    write_layouts,
    write_text_shards,
    write_uid_shards,
)

EPS = 1e-6


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def interleaved_times(repeats: int, contenders: dict[str, Callable[[], object]]) -> dict[str, list[float]]:
    """Each contender's ``repeats`` times, the contenders taking turns (one warm-up run each
    first): a drift of the machine (another job, the host reclaiming memory) then touches every
    contender alike, where timing one contender's runs after another's left its ratios to the
    others at the mercy of when it ran. Each round after the first takes them in a new order
    (a seeded shuffle), so that no contender always runs after the same one: a run after
    pandas' (which frees about 1 GiB) was measured slower, whichever contender it was (+0.04 s
    for the I/O floor, +0.09 s for the polars one-liner on 10M sorted rows)."""
    for fn in contenders.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    order = list(contenders)
    shuffler = random.Random(0)
    for round_ in range(repeats):
        if round_:
            shuffler.shuffle(order)
        for name in order:
            gc.collect()
            start = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - start)
    return times


def best_interleaved(repeats: int, contenders: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Each contender's best time of ``repeats`` (see :func:`interleaved_times`)."""
    return {name: min(times) for name, times in interleaved_times(repeats, contenders).items()}


def table_rows(title: str, rows: int, results: dict[str, float], ratio_to: list[str]) -> None:
    print(f"\n{title}")
    header = f"  {'contender':38s} {'seconds':>8s} {'Mrows/s':>8s}" + "".join(
        f" {'x ' + r:>16s}" for r in ratio_to
    )
    print(header)
    for name, seconds in results.items():
        line = f"  {name:38s} {seconds:8.3f} {rows / seconds / 1e6:8.2f}"
        for ref in ratio_to:
            line += f" {seconds / results[ref]:16.2f}"
        print(line)


# --------------------------------------------------------------------------- contenders


def polars_expr() -> Any:
    import polars as pl

    r = pl.col("reward").cast(pl.Float64)
    return ((r - r.mean().over("group_id")) / (r.std(ddof=0).over("group_id") + EPS)).alias("advantage")


def io_floor_pyarrow(src: Path, dst: Path) -> None:
    table = pq.read_table(src)
    table = table.append_column("advantage", pa.array(np.zeros(table.num_rows, dtype=np.float64)))
    pq.write_table(table, dst)


def io_floor_polars(src: Path, dst: Path) -> None:
    import polars as pl

    df = pl.read_parquet(src)
    df.with_columns(pl.lit(0.0).alias("advantage")).write_parquet(dst)


def io_floor_with_columns(src: Path, dst: Path, columns: pa.Table) -> None:
    """The I/O floor writing the columns grpo-cli writes (its own advantages and mask, computed
    beforehand): what any tool pays to read the file and write those columns."""
    import polars as pl

    written = pl.from_arrow(columns)
    assert isinstance(written, pl.DataFrame)
    pl.read_parquet(src).hstack(written.get_columns()).write_parquet(dst)


def polars_oneliner(src: Path, dst: Path) -> None:
    import polars as pl

    pl.read_parquet(src).with_columns(polars_expr()).write_parquet(dst)


def pandas_job(src: Path, dst: Path) -> None:
    import pandas as pd

    df = pd.read_parquet(src)
    grouped = df.groupby("group_id", sort=False)["reward"]
    reward = df["reward"].astype("float64")
    df["advantage"] = (reward - grouped.transform("mean")) / (grouped.transform("std", ddof=0) + EPS)
    df.to_parquet(dst)


def grpo_job(src: Path, dst: Path, *, streaming: bool = False) -> None:
    from grpo_cli.jobs import compute_dataset
    from grpo_cli.options.config import ComputeConfig

    config = ComputeConfig(memory_budget_bytes=0) if streaming else ComputeConfig()
    compute_dataset(src, dst, config, force=True)


# --------------------------------------------------------------------------- sections


def bench_kernel(rows: int, group_size: int, repeats: int) -> None:
    arrays = make_arrays(rows, group_size)
    for layout in ("sorted", "shuffled"):
        ids = arrays["sorted_ids"] if layout == "sorted" else arrays["sorted_ids"][arrays["perm"]]
        rewards = arrays["rewards"] if layout == "sorted" else arrays["rewards"][arrays["perm"]]
        results = kernel_contenders(ids, rewards, repeats)
        title = f"kernel, {rows:,} rollouts, {group_size} per group, {layout} IDs"
        table_rows(title, rows, results, ["polars over()"])


def kernel_contenders(ids: np.ndarray, rewards: np.ndarray, repeats: int) -> dict[str, float]:
    import pandas as pd
    import polars as pl
    import torch

    from grpo_cli.kernel import normalize_in_groups as group_advantages

    r_t, ids_t = torch.from_numpy(rewards), torch.from_numpy(ids)
    df_pl = pl.DataFrame({"group_id": ids, "reward": rewards})
    df_pd = pd.DataFrame({"group_id": ids, "reward": rewards})

    def pandas_kernel() -> None:
        grouped = df_pd.groupby("group_id", sort=False)["reward"]
        reward = df_pd["reward"].astype("float64")
        _ = (reward - grouped.transform("mean")) / (grouped.transform("std", ddof=0) + EPS)

    from grpo_cli import kernel

    def library_roots() -> None:
        """The kernel as it was before its roots were correctly rounded: torch's own sqrt."""
        exact = kernel.sqrt_rn
        kernel.sqrt_rn = lambda x: x.sqrt()
        try:
            group_advantages(r_t, ids_t, EPS)
        finally:
            kernel.sqrt_rn = exact

    return best_interleaved(
        repeats,
        {
            "grpo-cli kernel (torch, cpu)": lambda: group_advantages(r_t, ids_t, EPS),
            "  the same, torch's library sqrt": library_roots,
            "polars over()": lambda: df_pl.select(polars_expr()),
            "pandas groupby-transform": pandas_kernel,
        },
    )


def bench_files(rows: int, group_size: int, repeats: int, data_dir: Path) -> None:
    paths = write_layouts(data_dir, rows, group_size)
    out = data_dir / "out.parquet"
    for layout, src in paths.items():
        results, floor_name = file_contenders(src, out, repeats)
        size = src.stat().st_size / 2**20
        table_rows(
            f"file to file, {rows:,} rows, {layout} ({size:.0f} MiB Parquet); floor = {floor_name}",
            rows,
            results,
            ["I/O floor", "polars one-liner"],
        )
        stage_table(src, out, repeats)
    out.unlink(missing_ok=True)


def bench_keys(rows: int, group_size: int, repeats: int, data_dir: Path) -> None:
    """Exact group IDs for a column of shuffled 32-character uids: grpo-cli's key index against
    the native hash tables a library offers, each checked to give the same partition."""
    import polars as pl
    import pyarrow.compute as pc
    import torch

    from grpo_cli.arrow.keys import GroupKeyIndex

    column = pq.read_table(write_layouts(data_dir, rows, group_size)["shuffled uid strings"]).column(0)
    column = column.combine_chunks()
    chunk = 1 << 21
    ours = f"grpo-cli, {chunk >> 20}Mi-row chunks"

    def grpo(chunk_rows: int) -> np.ndarray:
        index = GroupKeyIndex(["uid"])
        parts = [index.encode([column.slice(i, chunk_rows)]) for i in range(0, len(column), chunk_rows)]
        return np.concatenate(parts)

    def first_appearance(ids: np.ndarray) -> np.ndarray:
        _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        rank = np.empty(first.size, dtype=np.int64)
        rank[np.argsort(first)] = np.arange(first.size)
        return rank[inverse]

    series = pl.Series("uid", column)
    frame = pl.DataFrame({"uid": series})
    contenders: dict[str, Callable[[], np.ndarray]] = {
        ours: lambda: grpo(chunk),
        "grpo-cli, one call": lambda: grpo(len(column)),
        "pyarrow dictionary_encode": lambda: pc.dictionary_encode(column).indices.to_numpy(),
        "polars cast(Categorical)": lambda: series.cast(pl.Categorical).to_physical().to_numpy(),
        "polars first row over(uid)": lambda: (
            frame.with_row_index("row").select(pl.col("row").first().over("uid")).to_series().to_numpy()
        ),
        "hash + torch.unique, unchecked": lambda: torch.unique(
            torch.from_numpy(series.hash(0).to_numpy().view(np.int64).copy()), return_inverse=True
        )[1].numpy(),
    }
    expected = grpo(chunk)
    results = {}
    for name, job in contenders.items():
        if not np.array_equal(first_appearance(job()), expected):  # the first call warms up, too
            raise SystemExit(f"{name}: not the same groups as grpo-cli's")
        results[name] = best_of(repeats, job)
    table_rows(
        f"exact group IDs, {rows:,} shuffled 32-character uids ({rows // group_size:,} groups), in memory",
        rows,
        results,
        [ours],
    )


def stage_table(src: Path, out: Path, repeats: int) -> None:
    """Where grpo-cli's time goes on one file (``grpo_cli.stages``), from its fastest run."""
    from grpo_cli.stages import STAGES, recording

    best: tuple[float, dict[str, float]] | None = None
    for _ in range(repeats):
        with recording() as clock:
            start = time.perf_counter()
            grpo_job(src, out)
            wall = time.perf_counter() - start
        if best is None or wall < best[0]:
            best = (wall, dict(clock.seconds))
    assert best is not None
    wall, seconds = best
    print(f"  where grpo-cli compute's {wall:.2f} s go (its fastest of {repeats} runs; threads overlap)")
    print(f"    {'stage':22s} {'seconds':>8s} {'of wall':>8s}  what")
    for name, what in STAGES:
        if name in seconds:
            print(f"    {name:22s} {seconds[name]:8.3f} {seconds[name] / wall:8.0%}  {what}")


def file_contenders(src: Path, out: Path, repeats: int) -> tuple[dict[str, float], str]:
    grpo_job(src, out)
    written = pq.read_table(out, columns=["advantage", "group_active"])
    results = best_interleaved(
        repeats,
        {
            "I/O floor: pyarrow": lambda: io_floor_pyarrow(src, out),
            "I/O floor: polars": lambda: io_floor_polars(src, out),
            "I/O floor, grpo-cli's columns: polars": lambda: io_floor_with_columns(src, out, written),
            "polars one-liner": lambda: polars_oneliner(src, out),
            "pandas groupby-transform": lambda: pandas_job(src, out),
            "grpo-cli compute": lambda: grpo_job(src, out),
            "grpo-cli compute (forced streaming)": lambda: grpo_job(src, out, streaming=True),
        },
    )
    floor_name = min(("I/O floor: pyarrow", "I/O floor: polars"), key=results.__getitem__)
    results["I/O floor"] = results[floor_name]
    return results, floor_name


CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
which, src, dst = sys.argv[1], sys.argv[2], sys.argv[3]
if which.startswith("grpo-cli"):  # as the CLI does when a command runs
    from grpo_cli.allocator import reuse_freed_memory
    from grpo_cli.threads import let_idle_threads_sleep
    reuse_freed_memory()
    let_idle_threads_sleep()
start = time.perf_counter()
if which == "grpo-cli":
    from grpo_cli.jobs import compute_dataset
    compute_dataset(src, dst, force=True)
elif which == "grpo-cli --by step":
    from grpo_cli.options.config import ComputeConfig
    from grpo_cli.jobs import compute_dataset
    summary = compute_dataset(src, dst, ComputeConfig(by_cols=("step",)), force=True)
    assert len(summary.by["step"]) == 100
else:
    import polars as pl
    r = pl.col("reward").cast(pl.Float64)
    expr = ((r - r.mean().over("group_id")) / (r.std(ddof=0).over("group_id") + 1e-6)).alias("advantage")
    pl.read_parquet(src + "/*.parquet").with_columns(expr).write_parquet(dst + ".parquet")
def peak_rss_mib():
    # VmHWM is this process's own high-water mark; ru_maxrss can carry the parent's peak
    # across fork and exec on Linux.
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"seconds": time.perf_counter() - start, "peak_rss_mib": peak_rss_mib()}}))
"""


def bench_memory(rows: int, group_size: int, data_dir: Path, text_bytes: int) -> None:
    folder = write_text_shards(data_dir, rows, group_size, shards=8, text_bytes=text_bytes)
    size = sum(p.stat().st_size for p in folder.iterdir()) / 2**30
    print(
        f"\npeak memory, {rows:,} rows with a {text_bytes} B text column in 8 shards ({size:.1f} GiB Parquet)"
    )
    print(f"  {'contender':34s} {'seconds':>8s} {'peak RSS':>12s}")
    for which in ("grpo-cli", "grpo-cli --by step", "polars one-liner"):
        dst = data_dir / ("rss_polars" if which == "polars one-liner" else "rss_out")
        done = subprocess.run(
            [sys.executable, "-c", CHILD.format(root=str(ROOT)), which, str(folder), str(dst)],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            print(f"  {which:34s} failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"  {which:34s} {figures['seconds']:8.2f} {figures['peak_rss_mib']:8.0f} MiB")
    for leftover in (data_dir / "rss_out", data_dir / "rss_polars.parquet"):
        if leftover.is_dir():
            for f in leftover.iterdir():
                f.unlink()
            leftover.rmdir()
        else:
            leftover.unlink(missing_ok=True)


def bench_ray(rows: int, group_size: int, repeats: int, data_dir: Path) -> None:
    """The Ray engine beside the local engine on a sharded dataset (string uids)."""
    import importlib.util
    import shutil
    import tempfile

    from grpo_cli.jobs import compute_dataset
    from grpo_cli.options.config import ComputeConfig

    if importlib.util.find_spec("ray") is None:
        print("\nray engine: not installed (pip install 'grpo-cli[ray]')")
        return
    folder = write_uid_shards(data_dir, rows, group_size, shards=8)
    out = Path(tempfile.mkdtemp(prefix="grpo-bench-", dir=data_dir))
    config = ComputeConfig()
    startups = []
    try:
        results = {
            "local engine": best_of(
                repeats, lambda: compute_dataset(folder, out / "local", config, force=True)
            ),
        }
        for workers in (1, 2, 4):  # a fresh process each: one local Ray instance per process
            script = RAY_WORKERS.format(root=str(ROOT))
            done = subprocess.run(
                [sys.executable, "-c", script, str(folder), str(out / "ray"), str(workers), str(repeats)],
                capture_output=True,
                text=True,
            )
            if done.returncode:
                print(f"  ray engine, {workers} worker(s): failed: {done.stderr.strip().splitlines()[-1:]}")
                continue
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            startups.append(figures["startup"])
            results[f"ray engine, {workers} worker process(es)"] = figures["seconds"]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    title = f"engines, {rows:,} rows in 8 shards, {rows // group_size:,} string uids, {os.cpu_count()} CPUs"
    started = f"Ray start-up {min(startups):.2f}-{max(startups):.2f} s (not included)" if startups else ""
    print(f"\n{title}; {started}")
    print(f"  {'contender':34s} {'seconds':>8s} {'Mrows/s':>8s} {'x local':>8s}")
    for name, seconds in results.items():
        ratio = seconds / results["local engine"]
        print(f"  {name:34s} {seconds:8.2f} {rows / seconds / 1e6:8.2f} {ratio:8.2f}")


RAY_WORKERS = r"""
import json, sys, time
sys.path.insert(0, {root!r})
from grpo_cli.allocator import reuse_freed_memory
from grpo_cli.threads import let_idle_threads_sleep

let_idle_threads_sleep()  # the driver is the CLI's process, which does these when a command runs
reuse_freed_memory()
from grpo_cli.options.config import ComputeConfig
from grpo_cli.engines.ray import ray_session
from grpo_cli.jobs import Ray, compute_dataset
source, target, workers, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
start = time.perf_counter()
with ray_session(None, num_cpus=workers):
    startup = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        compute_dataset(source, target, ComputeConfig(), engine=Ray(), force=True)
        best = min(best, time.perf_counter() - start)
print(json.dumps({{"seconds": best, "startup": startup}}))
"""


RAY_DRIVER = r"""
import json, sys, threading, time
sys.path.insert(0, {root!r})
from grpo_cli.allocator import reuse_freed_memory
from grpo_cli.threads import let_idle_threads_sleep

let_idle_threads_sleep()  # the driver is the CLI's process, which does these when a command runs
reuse_freed_memory()
from grpo_cli.options.config import ComputeConfig
from grpo_cli.jobs import Ray, compute_dataset
from grpo_cli.options.advantage import AdvantageOptions

advantage = (
    AdvantageOptions.resolve(estimator="pass_at_k", pass_k=2)
    if sys.argv[4] == "pass_at_k"
    else AdvantageOptions(scale=sys.argv[4])
)
by_cols = ("step",) if sys.argv[5] == "by" else ()

def status(field):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field))

# the driver's own memory (RssAnon), sampled: VmHWM also counts the object store's pages it maps
anon = [0]
done = threading.Event()
def sample():
    while not done.wait(0.02):
        anon[0] = max(anon[0], status("RssAnon:"))
threading.Thread(target=sample, daemon=True).start()
start = time.perf_counter()
config = ComputeConfig(stats_block_rows=int(sys.argv[3]), advantage=advantage, by_cols=by_cols)
compute_dataset(sys.argv[1], sys.argv[2], config, engine=Ray(), force=True)
seconds = time.perf_counter() - start
done.set()
print(json.dumps({{"seconds": seconds, "driver_peak_rss_mib": status("VmHWM:") / 1024,
                  "driver_peak_anon_mib": anon[0] / 1024}}))
"""


def bench_ray_driver(data_dir: Path, group_counts: tuple[int, ...], task_counts: tuple[int, ...]) -> None:
    """The Ray driver's peak memory and wall time against the number of groups (2 rows a group,
    int IDs shuffled over 4 shards), then against the statistics tasks at 10^6 groups (the
    blocks cut smaller); each a fresh process that starts its own local instance. The reducers
    compute their buckets' outcome and findings and the driver holds their merged summaries;
    last, --scale batch, --by and pass_at_k, whose reducers take more rounds. (Until 2026-12-07
    each row was run a second time with the driver gathering every group's figures; that path
    was deleted after its last run, recorded in docs/architecture.md.)"""
    print("\nray engine: the driver's peak memory against groups (fresh process each; resident:")
    print("VmHWM, with the object store's pages it maps; own: the peak of RssAnon, sampled)")
    columns = ("groups", 12), ("rows", 12), ("tasks", 6), ("seconds", 8), ("resident MiB", 13), ("own MiB", 8)
    header = "  " + " ".join(f"{name:>{width}s}" for name, width in columns)
    print(header)
    for groups in group_counts:
        _ray_driver_run(data_dir, groups, 1 << 22)
    print("\nray engine: the driver against rows (10^5 groups, more rows a group)")
    print(header)
    for rows_per_group in (20, 200):
        _ray_driver_run(data_dir, 10**5, 1 << 22, rows_per_group=rows_per_group)
    groups = 10**6
    print(f"\nray engine: the driver against its statistics tasks ({groups:,} groups, blocks cut smaller)")
    print(header)
    for tasks in task_counts:
        _ray_driver_run(data_dir, groups, -(-2 * groups // tasks))
    print(f"\nray engine: the driver with --scale batch, --by step (100 steps) and pass_at_k, at {groups:,}")
    print("groups (the batch's std in two more rounds; the groups cut again by step; each row sent")
    print("to its group's bucket)")
    print(header)
    for scale, by in (("batch", False), ("group", True), ("pass_at_k", False)):
        print(
            {"batch": "  --scale batch", "pass_at_k": "  --estimator pass_at_k --pass-k 2"}.get(
                scale, "  --by step"
            )
        )
        _ray_driver_run(data_dir, groups, 1 << 22, scale=scale, by=by)


def _ray_driver_run(
    data_dir: Path,
    groups: int,
    block_rows: int,
    *,
    rows_per_group: int = 2,
    scale: str = "group",
    by: bool = False,
) -> None:
    import shutil

    folder = data_dir / (
        f"ray_groups_{groups}" + (f"_{rows_per_group}" if rows_per_group != 2 else "") + ("_by" if by else "")
    )
    if not (folder.exists() and len(list(folder.glob("*.parquet"))) == 4):
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(6)
        ids = rng.permutation(np.repeat(np.arange(groups, dtype=np.int64), rows_per_group))
        rewards = (rng.random(ids.size) < 0.5).astype(np.float32)
        table = pa.table({"group_id": ids, "reward": rewards})
        if by:
            table = table.append_column("step", pa.array(ids % 100))
        per_shard = -(-ids.size // 4)
        for s in range(4):
            pq.write_table(table.slice(s * per_shard, per_shard), folder / f"part-{s}.parquet")
    out = data_dir / f"ray_groups_out_{groups}"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            RAY_DRIVER.format(root=str(ROOT)),
            str(folder),
            str(out),
            str(block_rows),
            scale,
            "by" if by else "-",
        ],
        capture_output=True,
        text=True,
    )
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode:
        print(f"  {groups:12,d} failed: {done.stderr.strip().splitlines()[-1:]}")
        return
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    seconds, peak, own = figures["seconds"], figures["driver_peak_rss_mib"], figures["driver_peak_anon_mib"]
    rows = rows_per_group * groups
    tasks = -(-rows // block_rows)
    print(f"  {groups:12,d} {rows:12,d} {tasks:6d} {seconds:8.2f} {peak:13.0f} {own:8.0f}")


def bench_estimators(rows: int, group_size: int, repeats: int, data_dir: Path) -> None:
    """What the batch-level estimators cost beside GRPO: the extra moments pass, --batch-col."""
    from grpo_cli.jobs import compute_dataset
    from grpo_cli.options.advantage import AdvantageOptions, RewardSpec
    from grpo_cli.options.config import ComputeConfig

    data_dir.mkdir(parents=True, exist_ok=True)
    src = data_dir / f"estimators_{rows}_{group_size}.parquet"
    if not src.exists():
        arrays = make_arrays(rows, group_size)
        ids = arrays["sorted_ids"][arrays["perm"]]
        groups = rows // group_size
        rng = np.random.default_rng(1)
        table = pa.table(
            {
                "group_id": ids,
                "reward": arrays["rewards"][arrays["perm"]],
                "step": ids * 16 // groups,
                "length": rng.integers(1, 2048, rows),
            }
        )
        pq.write_table(table, src)
    out = data_dir / "estimators_out.parquet"
    rewards = (RewardSpec("reward"),)
    cases = {
        "grpo": ComputeConfig(rewards=rewards),
        "reinforce_plus_plus_baseline": ComputeConfig(
            rewards=rewards,
            advantage=AdvantageOptions.resolve(estimator="reinforce_plus_plus_baseline"),
            length_col="length",
        ),
        "gpg --batch-col step": ComputeConfig(
            rewards=rewards, advantage=AdvantageOptions.resolve(estimator="gpg"), batch_col="step"
        ),
        "grpo --whiten --batch-col step": ComputeConfig(
            rewards=rewards, advantage=AdvantageOptions.resolve(whiten="unbiased"), batch_col="step"
        ),
    }
    for mode, budget in (("in memory", 1 << 34), ("streaming", 0)):
        results = {}
        compute_dataset(src, out, cases["grpo"], force=True)  # warm up: imports, page cache
        for name, config in cases.items():
            run_config = replace(config, memory_budget_bytes=budget)

            def job(run_config: ComputeConfig = run_config) -> None:
                compute_dataset(src, out, run_config, force=True)

            results[name] = best_of(repeats, job)
        table_rows(
            f"estimators, {rows:,} rows, groups of {group_size}, 16 steps ({mode})", rows, results, ["grpo"]
        )


# --------------------------------------------------------------------------- a realistic rollout dump

DUMP_CHILD = r"""
import sys
which, src, dst = sys.argv[1], sys.argv[2], sys.argv[3]
import polars as pl
if which == "polars-floor":
    pl.scan_parquet(src + "/*.parquet").with_columns(pl.lit(0.0).alias("advantage")).sink_parquet(dst)
else:
    r = pl.col("reward").cast(pl.Float64)
    a = ((r - r.mean().over("uid")) / (r.std(ddof=0).over("uid") + 1e-6)).alias("advantage")
    pl.read_parquet(src + "/*.parquet").with_columns(a, (r.max().over("uid") > r.min().over("uid"))
        .alias("group_active")).write_parquet(dst)
"""


def write_rollout_dump(data_dir: Path, rows: int, shards: int, group_size: int = 8) -> Path:
    """A rollout dump as trainers write it: group rows contiguous, text 95% of the bytes.

    String ``uid``; a ~150-word ``prompt`` shared by the group; a 125-1000-word
    ``completion``; float ``reward``; int ``response_length``; dictionary ``data_source``.
    """
    folder = data_dir / f"dump_{rows}_{shards}"
    if folder.exists() and len(list(folder.glob("*.parquet"))) == shards:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    vocabulary = [
        "".join(chr(97 + c) for c in rng.integers(0, 26, size=int(n))) for n in rng.integers(2, 10, size=6000)
    ]
    corpus = " ".join(vocabulary[i] for i in rng.integers(0, len(vocabulary), size=4_000_000)).encode()
    per_shard = rows // shards

    def texts(words: np.ndarray) -> pa.Array:
        starts = rng.integers(0, len(corpus) - 8 * int(words.max()), size=words.size)
        return pa.array([corpus[s : s + 6 * int(w)].decode() for s, w in zip(starts, words, strict=True)])

    for s in range(shards):
        groups = np.arange(s * per_shard, (s + 1) * per_shard) // group_size
        unique_groups = np.unique(groups)
        prompts = texts(np.full(unique_groups.size, 150)).take(pa.array(groups - unique_groups[0]))
        completion_words = rng.integers(125, 1001, size=per_shard)
        table = pa.table(
            {
                "uid": pa.array([f"{g:016x}" for g in groups]),
                "prompt": prompts,
                "completion": texts(completion_words),
                "reward": (rng.random(per_shard) < 0.4).astype(np.float32),
                "response_length": (completion_words * 1.3).astype(np.int64),
                "data_source": pa.array(
                    np.array(["gsm8k", "math", "aime"])[rng.integers(0, 3, per_shard)]
                ).dictionary_encode(),
            }
        )
        pq.write_table(table, folder / f"part-{s:05d}.parquet", row_group_size=10_000)
    return folder


def _seconds(command: list[str], *, env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=env)
    return time.perf_counter() - start


def bench_dump(rows: int, repeats: int, data_dir: Path) -> None:
    """Whole processes on a realistic dump: cp, the polars floor and one-liner, grpo-cli."""
    import shutil

    folder = write_rollout_dump(data_dir, rows, shards=8)
    size = sum(p.stat().st_size for p in folder.iterdir()) / 2**30
    out = data_dir / "dump_out"
    python = sys.executable
    cli = [python, "-m", "grpo_cli", "compute", str(folder), "-o", str(out), "-g", "uid", "-q", "--force"]

    def clear() -> None:
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()

    def run(command: list[str]) -> Callable[[], float]:
        def once() -> float:
            clear()
            os.sync()  # no contender pays for the write-back of another's output
            return _seconds(command)

        return once

    def polars(which: str) -> Callable[[], float]:
        return run([python, "-c", DUMP_CHILD, which, str(folder), str(out)])

    def best(fn: Callable[[], float]) -> float:
        return min(fn() for _ in range(repeats))

    # What a compute run imports (torch with the engine); the run copies bytes meanwhile. The
    # process ends as grpo-cli's does, without the interpreter's teardown (cli._end_process).
    imports = "import grpo_cli.cli, grpo_cli.jobs, grpo_cli.engines.local, os; os._exit(0)"
    startup = best(lambda: _seconds([python, "-c", imports]))
    results = {
        "cp -r": best(run(["cp", "-r", str(folder), str(out)])),
        "cp -r + sync (durable, as grpo-cli's fsync)": best(
            run(["sh", "-c", f"cp -r '{folder}' '{out}' && sync '{out}'/*"])
        ),
        "polars scan + sink, one new column (floor)": best(polars("polars-floor")),
        "polars one-liner (advantage + mask)": best(polars("polars-oneliner")),
        "grpo-cli compute (splice)": best(run(cli)),
        "grpo-cli compute --rewrite": best(run([*cli, "--rewrite"])),
    }
    clear()
    spliced = results["grpo-cli compute (splice)"]
    print(
        f"\nrealistic rollout dump: {rows:,} rows in 8 shards ({size:.2f} GiB Parquet), whole processes; "
        f"grpo-cli start-up (imports) {startup:.2f} s"
    )
    print(f"  {'contender':44s} {'seconds':>8s} {'vs grpo-cli':>12s}")
    for name, seconds in results.items():
        print(f"  {name:44s} {seconds:8.2f} {seconds / spliced:11.1f}x")
    durable = results["cp -r + sync (durable, as grpo-cli's fsync)"]
    work = spliced - startup
    print(
        f"  grpo-cli (splice) less start-up: {work:.2f} s = "
        f"{work / results['cp -r']:.1f}x cp -r, {work / durable:.1f}x cp -r + sync"
    )


def bench_imports(repeats: int = 7) -> None:
    print(f"\nstart-up (fresh interpreters taking turns, {repeats} rounds: median and best)")
    sample = str(ROOT / "sample_data" / "rollouts.parquet")
    scratch = ROOT / "benchmarks" / "data" / "startup.parquet"
    scratch.parent.mkdir(parents=True, exist_ok=True)
    cli = [sys.executable, "-m", "grpo_cli"]
    rows: list[tuple[str, list[str]]] = [
        ("import torch (the floor)", [sys.executable, "-c", "import torch"]),
        # grpo-cli ends its process without the interpreter's teardown (grpo_cli.cli._end_process)
        ("import torch, ended as grpo-cli ends", [sys.executable, "-c", "import torch, os; os._exit(0)"]),
        ("grpo-cli --help path (grpo_cli.cli)", [sys.executable, "-c", "import grpo_cli.cli"]),
        ("grpo-cli compute path (engine+torch)", [sys.executable, "-c", "import grpo_cli.engines.local"]),
        ("grpo-cli check sample_data (whole run)", [*cli, "check", sample, "-q"]),
        ("grpo-cli check sample_data, with its summary", [*cli, "check", sample]),
        (
            "grpo-cli compute sample_data (whole run)",
            [*cli, "compute", sample, "-o", str(scratch), "-q", "-f"],
        ),
        ("polars", [sys.executable, "-c", "import polars"]),
        ("pandas", [sys.executable, "-c", "import pandas"]),
    ]
    # An install's modules have bytecode caches (pip writes them; the first import writes a
    # source checkout's): a shell that turns them off compiles grpo_cli at every call.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

    def call(command: list[str]) -> Callable[[], object]:
        return lambda: subprocess.run(
            command, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    times = interleaved_times(repeats, {label: call(command) for label, command in rows})
    median = {label: statistics.median(runs) for label, runs in times.items()}
    for label, runs in times.items():
        print(f"  {label:44s} {median[label]:6.2f} s  (best {min(runs):.2f} s)")
    floor = median["import torch (the floor)"]
    for label in (
        "grpo-cli check sample_data (whole run)",
        "grpo-cli check sample_data, with its summary",
        "grpo-cli compute sample_data (whole run)",
    ):
        print(f"  {label} - import torch, medians: {median[label] - floor:+.2f} s (target +0.30 s)")
    ended = median["import torch, ended as grpo-cli ends"]
    print(f"  torch's teardown at exit, which grpo-cli skips: {floor - ended:.2f} s (medians)")


def bench_jsonl_reads(data_dir: Path, sizes: tuple[int, ...] = (200_000, 700_000)) -> None:
    """Bytes each command reads from a JSON lines input, per byte of it (strace): a file under the
    small-file limit (64 MiB) and one past it that fits the default memory budget with its rows."""
    for rows in sizes:
        _jsonl_reads(data_dir, rows)
    _jsonl_reads(data_dir, sizes[-1], ["--memory-limit-mb", "0"])  # past the budget: it streams


def _jsonl_reads(data_dir: Path, rows: int, options: list[str] | None = None) -> None:
    import re
    import shutil

    if shutil.which("strace") is None:
        print("\nJSON lines reads: no strace here, skipped")
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / f"reads_{rows}.jsonl"
    if not path.exists():
        rng = np.random.default_rng(0)
        with open(path, "w") as handle:
            for i in range(rows):
                handle.write(
                    json.dumps(
                        {
                            "group_id": f"{i // 8:08x}",
                            "reward": float(rng.random() < 0.5),
                            "prompt": "x" * 120,
                        }
                    )
                    + "\n"
                )
    size = path.stat().st_size
    extra = options or []
    print(
        f"\nJSON lines reads ({size / 2**20:.0f} MiB input{' ' + ' '.join(extra) if extra else ''}; "
        "bytes read from it / its size, opens)"
    )
    cli = [sys.executable, "-m", "grpo_cli"]
    for label, command in (
        ("check", [*cli, "check", str(path), "-q", *extra]),
        ("compute", [*cli, "compute", str(path), "-o", str(data_dir / "reads.parquet"), "-q", "-f", *extra]),
    ):
        trace = data_dir / "strace.txt"
        subprocess.run(
            ["strace", "-f", "-qq", "-e", "trace=openat,read,pread64,close", "-o", str(trace), *command],
            check=True,
        )
        open_fds: set[str] = set()
        total = opens = 0
        for line in trace.read_text(errors="replace").splitlines():
            opened = re.search(r'openat\(.*"' + re.escape(str(path)) + r'".*\) = (\d+)', line)
            if opened:
                open_fds.add(opened.group(1))
                opens += 1
                continue
            read = re.search(r"(?:read|pread64)\((\d+),.*\) = (\d+)", line)
            if read and read.group(1) in open_fds:
                total += int(read.group(2))
                continue
            closed = re.search(r"close\((\d+)\)", line)
            if closed:
                open_fds.discard(closed.group(1))
        print(f"  {label:8s} {total / size:5.2f} bytes per byte, {opens} opens")


def write_jsonl_of_size(path: Path, megabytes: int, *, key: str, columns: str) -> int:
    """A JSON lines file of about ``megabytes`` MB: integer or 32-character text keys in groups of 8,
    float64 rewards written in full; ``columns='several'`` adds a step, a score list and a prompt."""
    rng = np.random.default_rng(megabytes)
    per_row = (40 if key == "int" else 75) + (0 if columns == "one" else 110)
    rows = max(8, megabytes * 1_000_000 // per_row // 8 * 8)
    groups = np.repeat(np.arange(rows // 8), 8)
    rewards = rng.random(rows).tolist()
    keys = [f'"{g:032x}"' for g in groups.tolist()] if key == "string" else [str(g) for g in groups.tolist()]
    with open(path, "w") as handle:
        for start in range(0, rows, 100_000):
            lines = []
            for i in range(start, min(rows, start + 100_000)):
                if columns == "one":
                    lines.append(f'{{"group_id": {keys[i]}, "reward": {rewards[i]!r}}}\n')
                else:
                    lines.append(
                        f'{{"group_id": {keys[i]}, "reward": {rewards[i]!r}, "step": {i // 4096}, '
                        f'"scores": [{rewards[i]!r}, 1.0], "prompt": "solve problem {i // 8} step by step '
                        f'and give the answer"}}\n'
                    )
            handle.write("".join(lines))
    return rows


def bench_jsonl_speed(data_dir: Path, sizes: tuple[int, ...] = (1, 10, 100), repeats: int = 3) -> None:
    """check and compute on JSON lines of 1, 10 and 100 MB (integer and text keys, one and several
    columns) beside the same rows as Parquet: whole processes, best of ``repeats``. A run's cost must
    grow with its size, never faster (a 40 MB file once took hours)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    cli = [sys.executable, "-m", "grpo_cli"]
    imports = [sys.executable, "-c", "import grpo_cli.engines.local"]
    startup = best_of(repeats, lambda: subprocess.run(imports, check=True))
    print(
        f"\nJSON lines beside Parquet, whole processes (best of {repeats}; "
        f"start-up, the imports: {startup:.2f} s)"
    )
    print(
        f"  {'file':34s} {'rows':>10s} {'command':8s} {'jsonl s':>8s} {'parquet s':>9s} {'ratio':>6s}"
        f" {'jsonl MB/s':>10s}"
    )
    for megabytes in sizes:
        for key in ("int", "string"):
            for columns in ("one", "several"):
                jsonl = data_dir / f"speed_{megabytes}mb_{key}_{columns}.jsonl"
                parquet = jsonl.with_suffix(".parquet")
                if not jsonl.exists():
                    write_jsonl_of_size(jsonl, megabytes, key=key, columns=columns)
                    import pyarrow.json as pa_json

                    pq.write_table(pa_json.read_json(jsonl), parquet)
                rows = pq.ParquetFile(parquet).metadata.num_rows
                size = jsonl.stat().st_size / 1e6
                out = data_dir / "speed_out.parquet"
                for command in ("check", "compute"):

                    def run(path: Path, command: str = command, out: Path = out) -> Callable[[], object]:
                        tail = ["--min-groups", "1"] if command == "check" else ["-o", str(out), "-f"]
                        return lambda: subprocess.run(
                            [*cli, command, str(path), "-q", *tail], check=True, stdout=subprocess.DEVNULL
                        )

                    text_s = best_of(repeats, run(jsonl))
                    parquet_s = best_of(repeats, run(parquet))
                    label = f"{size:6.1f} MB, {key} keys, {columns} column{'s' if columns != 'one' else ''}"
                    work = text_s - startup  # past the imports: the reading, the passes, the write
                    rate = f"{size / work:10.1f}" if work > 0.2 else f"{'(start-up)':>10s}"
                    print(
                        f"  {label:34s} {rows:10,d} {command:8s} {text_s:8.2f} {parquet_s:9.2f}"
                        f" {text_s / parquet_s:5.2f}x {rate}"
                    )


def bench_scaling(rows: int, group_size: int, repeats: int, factor: int = 6) -> None:
    """Whether pass 1's running totals cost the same per row at ``rows`` and ``factor`` times as
    many (sorted IDs fed in 1 Mi-row chunks, as the local engine feeds them), and whether a Ray
    reducer's merge costs the same per group over 10 and 50 blocks of new groups: a per-row cost
    that grows with the input is a total that grows faster than it."""
    print(
        f"\nscaling: pass 1's running totals, sorted IDs in {SCALING_CHUNK:,}-row chunks (best of {repeats})"
    )
    columns = " ".join(f"{name:>11s} {'ns/row':>7s}" for name in ("statistics", "figures", "top two"))
    print(f"  {'rows':>12s} {columns}")
    for n in (rows, rows * factor):
        times = _running_totals_seconds(n, group_size, repeats)
        cells = " ".join(f"{t:10.2f}s {t / n * 1e9:7.1f}" for t in times)
        print(f"  {n:12,d} {cells}")
    per_block = 200_000
    print(f"\nscaling: a Ray reducer merging blocks of {per_block:,} new groups each (best of {repeats})")
    print(f"  {'blocks':>7s} {'groups':>12s} {'seconds':>8s} {'ns/group':>9s}")
    for blocks in (10, 50):
        seconds = best_of(repeats, functools.partial(_reducer_merges, blocks, per_block))
        groups = blocks * per_block
        print(f"  {blocks:7d} {groups:12,d} {seconds:8.2f} {seconds / groups * 1e9:9.1f}")


SCALING_CHUNK = 1 << 20


def _running_totals_seconds(n: int, group_size: int, repeats: int) -> list[float]:
    """The best seconds of the statistics, the figures and grpo_passk's top two over ``n`` rows."""
    import torch

    from grpo_cli.kernel import GroupStatsAccumulator
    from grpo_cli.run.figures import FigureAccumulator, RowInputs, wanted

    ids = torch.arange(n) // group_size
    rewards = (torch.rand(n, generator=torch.Generator().manual_seed(n), dtype=torch.float64) < 0.5).double()
    ids_np, rewards_np, valid_np = ids.numpy(), rewards.numpy(), np.ones(n, dtype=bool)
    chunks = [slice(start, start + SCALING_CHUNK) for start in range(0, n, SCALING_CHUNK)]

    def statistics() -> None:
        accumulator = GroupStatsAccumulator()
        for part in chunks:
            accumulator.update(rewards[part], ids[part])
        accumulator.compute()

    def figures() -> None:
        accumulator = FigureAccumulator(wanted(()), block_rows=1 << 22)
        for part in chunks:
            accumulator.update(ids_np[part], RowInputs(rewards_np[part], valid_np[part], None))
        accumulator.compute()

    def top_two() -> None:  # the figure alone, folded as the local engine folds it
        accumulator = FigureAccumulator(
            [f for f in wanted(("top_two",)) if f.name == "top_two"], block_rows=1 << 22
        )
        for part in chunks:
            rows = RowInputs(
                rewards_np[part], valid_np[part], None, runs=((part.start, rewards_np[part].size),)
            )
            accumulator.update(ids_np[part], rows)
        accumulator.compute()

    return [best_of(repeats, job) for job in (statistics, figures, top_two)]


def _reducer_merges(blocks: int, per_block: int) -> None:
    """A Ray reducer's merge of ``blocks`` blocks of ``per_block`` new groups each."""
    import torch

    from grpo_cli.kernel import RunningGroupStats, group_stats

    block = group_stats(
        torch.rand(per_block * 2, dtype=torch.float64), torch.arange(per_block).repeat_interleave(2)
    )
    running = RunningGroupStats()
    for b in range(blocks):
        running.merge_rows(block, torch.arange(b * per_block, (b + 1) * per_block), (b + 1) * per_block)


def bench_by(rows: int, repeats: int, data_dir: Path) -> None:
    """``check --by`` over a column of 1,000 to all-distinct values, whole processes, beside the
    same check without ``--by``: the figures per value cost the groups, not values x groups
    (issue #67 D.18: 66 s for 200k rows of 100k values, 1.8 s without)."""
    path = data_dir / f"by-{rows}.parquet"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        group = np.arange(rows) // 2
        pq.write_table(
            pa.table(
                {
                    "group_id": group,
                    "reward": (rng.random(rows) < 0.5).astype(np.float32),
                    **{f"v{n}": group % n for n in (1_000, 10_000)},
                    "v_all": group.astype(str),
                }
            ),
            path,
        )
    python = sys.executable
    check = [python, "-m", "grpo_cli", "check", str(path), "-q"]
    results = {
        "check, no --by": min(_seconds(check) for _ in range(repeats)),
        **{
            f"check --by, {label} values": min(_seconds([*check, "--by", column]) for _ in range(repeats))
            for column, label in (("v1000", "1,000"), ("v10000", "10,000"), ("v_all", f"{rows // 2:,}"))
        },
    }
    base = results["check, no --by"]
    print(f"\n--by over many values: {rows:,} rows in groups of 2, whole processes (best of {repeats})")
    print(f"  {'contender':34s} {'seconds':>8s} {'vs no --by':>11s}")
    for name, seconds in results.items():
        print(f"  {name:34s} {seconds:8.2f} {seconds / base:10.1f}x")


SECTIONS = [
    "process",
    "imports",
    "jsonl",
    "kernel",
    "keys",
    "dump",
    "files",
    "memory",
    "estimators",
    "by",
    "ray",
    "scaling",
]
"""Every section, in the order a full run takes them."""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rss-rows", type=int, default=5_000_000)
    parser.add_argument("--text-bytes", type=int, default=1024)
    parser.add_argument("--data-dir", type=Path, default=HERE / "data")
    parser.add_argument("--ray-rows", type=int, default=2_000_000)
    parser.add_argument("--dump-rows", type=int, default=400_000)
    parser.add_argument(
        "--ray-max-groups-exponent", type=int, default=7, help="driver memory up to 10**N groups"
    )
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        action="append",
    )
    args = parser.parse_args()
    from grpo_cli.allocator import reuse_freed_memory
    from grpo_cli.threads import let_idle_threads_sleep

    # as grpo-cli does when a command runs, before torch is imported (pyarrow and polars bring
    # their own allocators and thread pools)
    reused = reuse_freed_memory()
    asleep = let_idle_threads_sleep()
    import torch

    print(
        f"grpo-cli benchmarks: python {sys.version.split()[0]}, torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads\n{machine()}\n"
        f"malloc keeps large freed blocks for reuse (grpo_cli.allocator, as the CLI): {reused}\n"
        f"OpenMP's idle threads sleep (grpo_cli.threads, as the CLI): {asleep}"
    )
    sections = args.only or SECTIONS
    if "process" in sections:  # the figures as a user meets them: each command a fresh process
        from process import bench_process

        bench_process(args.rows, args.group_size, max(args.repeats, 5), args.data_dir)
    if "imports" in sections:
        bench_imports()
    if "jsonl" in sections:
        bench_jsonl_speed(args.data_dir, repeats=args.repeats)
        bench_jsonl_reads(args.data_dir)
    if "kernel" in sections:
        bench_kernel(args.rows, args.group_size, args.repeats)
    if "keys" in sections:
        bench_keys(args.rows, args.group_size, args.repeats, args.data_dir)
    if "dump" in sections:
        bench_dump(args.dump_rows, args.repeats, args.data_dir)
    if "files" in sections:
        bench_files(args.rows, args.group_size, args.repeats, args.data_dir)
    if "memory" in sections:
        bench_memory(args.rss_rows, args.group_size, args.data_dir, args.text_bytes)
    if "estimators" in sections:
        bench_estimators(args.rows // 5, args.group_size, args.repeats, args.data_dir)
    if "by" in sections:
        bench_by(200_000, args.repeats, args.data_dir)
    if "scaling" in sections:
        bench_scaling(args.rows, args.group_size, args.repeats)
    if "ray" in sections:
        bench_ray(args.ray_rows, args.group_size, args.repeats, args.data_dir)
        bench_ray_driver(
            args.data_dir, tuple(10**e for e in range(5, args.ray_max_groups_exponent + 1)), (1, 4, 16, 64)
        )
    print(f"\npeak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
