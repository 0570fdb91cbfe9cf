"""The benchmarks' input files, written once under ``benchmarks/data/`` and kept (each writer
returns the path of what it finds there already), and the machine they ran on: shared by
``bench.py`` (the in-process profiles) and ``process.py`` (the fresh-process figures)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def machine() -> str:
    """The CPU's model and the vector unit torch uses on it (the kernel's speed depends on both)."""
    import torch

    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, torch capability {torch.backends.cpu.get_cpu_capability()}"


def make_arrays(rows: int, group_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    groups = rows // group_size
    sorted_ids = np.repeat(np.arange(groups, dtype=np.int64), group_size)
    perm = rng.permutation(rows)
    solve_rate = rng.random(groups)
    rewards = (rng.random(rows) < np.repeat(solve_rate, group_size)).astype(np.float32)
    return {"sorted_ids": sorted_ids, "rewards": rewards, "perm": perm}


def uid_strings(groups: int, seed: int) -> pa.Array:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(groups, 16), dtype=np.uint8)
    hexed = np.char.mod("%02x", raw).astype("U2")
    return pa.array(["".join(row) for row in hexed])


def write_layouts(data_dir: Path, rows: int, group_size: int) -> dict[str, Path]:
    data_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "sorted int ids": data_dir / f"sorted_int_{rows}.parquet",
        "shuffled uid strings": data_dir / f"shuffled_uid_{rows}.parquet",
    }
    if all(p.exists() for p in paths.values()):
        return paths
    arrays = make_arrays(rows, group_size)
    groups = rows // group_size
    rewards = arrays["rewards"]
    pq.write_table(pa.table({"group_id": arrays["sorted_ids"], "reward": rewards}), paths["sorted int ids"])
    uids = uid_strings(groups, seed=1)
    perm = arrays["perm"]
    uid_per_row = uids.take(pa.array(np.repeat(np.arange(groups), group_size)[perm]))
    pq.write_table(
        pa.table({"group_id": uid_per_row, "reward": rewards[perm]}), paths["shuffled uid strings"]
    )
    return paths


def write_text_shards(data_dir: Path, rows: int, group_size: int, shards: int, text_bytes: int) -> Path:
    folder = data_dir / f"text_{rows}_{shards}_steps"
    if folder.exists() and len(list(folder.glob("*.parquet"))) == shards:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2)
    groups = rows // group_size
    uids = uid_strings(groups, seed=3)
    order = rng.permutation(rows)
    per_shard = -(-rows // shards)
    alphabet = np.frombuffer(
        b"abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,", dtype=np.uint8
    )
    for s in range(shards):
        idx = order[s * per_shard : (s + 1) * per_shard]
        n = idx.size
        text = alphabet[rng.integers(0, alphabet.size, size=n * text_bytes, dtype=np.uint8)]
        offsets = np.arange(0, (n + 1) * text_bytes, text_bytes, dtype=np.int32)
        completion = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text.tobytes()))
        table = pa.table(
            {
                "group_id": uids.take(pa.array(idx // group_size)),
                "step": pa.array((idx // group_size) % 100),  # 100 training steps, for --by step
                "completion": completion,
                "reward": (rng.random(n) < 0.5).astype(np.float32),
            }
        )
        pq.write_table(table, folder / f"part-{s:05d}.parquet", row_group_size=50_000)
    return folder


def write_uid_shards(data_dir: Path, rows: int, group_size: int, shards: int) -> Path:
    folder = data_dir / f"uid_shards_{rows}_{shards}"
    if folder.exists() and len(list(folder.glob("*.parquet"))) == shards:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    arrays = make_arrays(rows, group_size, seed=4)
    groups = rows // group_size
    uids = uid_strings(groups, seed=5)
    perm = arrays["perm"]
    table = pa.table(
        {
            "group_id": uids.take(pa.array(np.repeat(np.arange(groups), group_size)[perm])),
            "reward": arrays["rewards"][perm],
        }
    )
    per_shard = -(-rows // shards)
    for s in range(shards):
        pq.write_table(table.slice(s * per_shard, per_shard), folder / f"part-{s:05d}.parquet")
    return folder


def write_sorted(path: Path, rows: int, group_size: int) -> Path:
    """``rows`` rows of sorted int64 group IDs and float32 0/1 rewards, in 1M-row row groups,
    written a row group at a time (a 100M-row file without 100M rows in memory)."""
    if path.exists():
        return path
    rng = np.random.default_rng(0)
    step = 1_000_000
    schema = pa.schema([("group_id", pa.int64()), ("reward", pa.float32())])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, step):
            ids = np.arange(start, min(rows, start + step), dtype=np.int64) // group_size
            rate = rng.random(int(ids[-1] - ids[0]) + 1)[ids - ids[0]]  # each group's solve rate
            rewards = (rng.random(len(ids)) < rate).astype(np.float32)
            writer.write_table(pa.table({"group_id": ids, "reward": rewards}, schema=schema))
    return path
