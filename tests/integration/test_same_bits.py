"""The same input gives the same bits on every CPU, capability level and thread count.

torch's CPU ``sqrt`` goes through the vector-math library of the machine (MKL's, chosen by CPU):
its float64 roots are within an ulp, not always the nearest, and which ones are off depends on the
CPU. And ``Tensor.sum`` adds in an order that follows the vector width. grpo-cli takes roots with
:func:`~grpo_cli.kernel.sqrt_rn` (correctly rounded, as IEEE's ``sqrt`` and ``math.sqrt``) and sums
with left folds, so its float64 figures are those of an exact-everywhere reference computed with
Python floats, and a run gives byte-identical columns under every ``ATEN_CPU_CAPABILITY`` and
``OMP_NUM_THREADS`` (the last test runs whole processes under each).
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from grpo_cli import kernel
from grpo_cli.kernel import fold_sum, sqrt_rn


def random_doubles(count: int, seed: int) -> list[float]:
    """Finite positive float64 values of every exponent (random bit patterns), with subnormals."""
    rng = random.Random(seed)
    out: list[float] = []
    while len(out) < count:
        value = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(63)))[0]
        if math.isfinite(value):
            out.append(value)
    return out


def test_sqrt_rn_is_the_correctly_rounded_root_of_every_float64():
    """200,000 random bit patterns (every exponent, subnormals) and values near 1, 2 and 4, where a
    vector-math library's root is most often an ulp off: each root is ``math.sqrt``'s (IEEE)."""
    values = random_doubles(200_000, seed=1)
    rng = np.random.default_rng(2)
    values += [*(rng.random(100_000) * 4).tolist(), 2.0, 3.0, 0.5, 1.0, 4.0, 5e-324, 1.7976931348623157e308]
    roots = sqrt_rn(torch.tensor(values, dtype=torch.float64)).tolist()
    wrong = [(v, r) for v, r in zip(values, roots, strict=True) if r != math.sqrt(v)]
    assert not wrong, f"{len(wrong)} roots differ from math.sqrt, e.g. {wrong[:3]}"


def test_sqrt_rn_takes_slices_of_any_shape_as_the_whole(monkeypatch):
    """On the CPU the roots are taken a slice at a time: slices that need scaling beside slices
    that do not, and a non-contiguous 2-D view, give every value its own root in its place."""
    from grpo_cli.kernel import exact

    monkeypatch.setattr(exact, "CPU_SLICE_VALUES", 999)
    values = [*random_doubles(6_000, seed=5), 0.0, -0.0, math.inf, 4.0]  # the first slices scale
    values += (np.random.default_rng(6).random(6_000) * 4).tolist()  # the last ones need not
    roots = sqrt_rn(torch.tensor(values, dtype=torch.float64))
    assert [r for r, v in zip(roots.tolist(), values, strict=True) if r != math.sqrt(v)] == []
    grid = torch.tensor(values[:6_000], dtype=torch.float64).view(60, 100).t()  # not contiguous
    assert torch.equal(sqrt_rn(grid), roots[:6_000].view(60, 100).t())


def test_sqrt_rn_keeps_ieee_special_values_and_other_dtypes():
    special = torch.tensor([0.0, -0.0, math.inf, -1.0, math.nan, -math.inf], dtype=torch.float64)
    roots = sqrt_rn(special)
    assert roots[:3].tolist() == [0.0, -0.0, math.inf] and math.copysign(1, roots[1].item()) == -1
    assert roots[3:].isnan().all()
    in_range = sqrt_rn(torch.tensor([0.0, -0.0, 4.0, 2.0, 1e-300, 1e300], dtype=torch.float64))  # no scaling
    assert in_range.tolist() == [0.0, -0.0, 2.0, math.sqrt(2.0), math.sqrt(1e-300), math.sqrt(1e300)]
    assert math.copysign(1, in_range[1].item()) == -1
    values32 = torch.rand(100_000, dtype=torch.float32) * 1000
    expected = np.sqrt(values32.numpy())  # numpy's sqrt is the hardware's, correctly rounded
    assert (sqrt_rn(values32).numpy() == expected).all()
    assert sqrt_rn(values32).dtype == torch.float32
    with pytest.raises(TypeError, match="floating"):
        sqrt_rn(torch.tensor([4]))


def test_fold_sum_is_the_left_fold_in_index_order():
    rng = np.random.default_rng(3)
    values = rng.normal(size=(50, 300)) * np.exp(rng.normal(0, 8, size=(50, 300)))
    folds = []
    for row in values.tolist():
        total = 0.0
        for v in row:
            total += v
        folds.append(total)
    assert fold_sum(torch.from_numpy(values), dim=1).tolist() == folds
    assert fold_sum(torch.from_numpy(values[0])).item() == folds[0]
    assert fold_sum(torch.zeros(0, dtype=torch.float64)).item() == 0.0
    assert fold_sum(torch.zeros(3, 0, dtype=torch.float64), dim=1).tolist() == [0.0, 0.0, 0.0]
    assert fold_sum(torch.tensor([[5.0], [-0.0]], dtype=torch.float64), dim=1).tolist() == [5.0, 0.0]


def _stats(seed: int, groups: int = 3000) -> tuple[torch.Tensor, torch.Tensor, kernel.GroupStats]:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 70, groups)  # both paths: blocks of <= 64 columns and the scatter
    ids = np.repeat(np.arange(groups), sizes)
    rewards = rng.random(ids.size) * rng.choice([1e-3, 1.0, 7.0, 1e3], ids.size)
    x, g = torch.from_numpy(rewards), torch.from_numpy(ids)
    return x, g, kernel.group_stats(x, g)


def test_every_root_the_kernel_takes_is_the_correctly_rounded_one():
    """A group's std, the batch's std and each whitening's scale are ``math.sqrt`` of the same
    float64 quotient: no library root, which would differ on another CPU in about 1 in 80."""
    _, _, stats = _stats(4)
    m2, count = stats.m2.tolist(), stats.count.tolist()
    for ddof in (0, 1):
        expected = [math.sqrt(m / max(c - ddof, 1)) for m, c in zip(m2, count, strict=True)]
        assert kernel.group_std(stats, ddof=ddof).tolist() == expected
        n, _, batch_m2 = kernel.batch_moments(stats)
        assert kernel.batch_std(stats, ddof=ddof).item() == math.sqrt(batch_m2.item() / max(n - ddof, 1))
    values = torch.from_numpy(np.random.default_rng(5).random(5000))
    batches = torch.from_numpy(np.random.default_rng(6).integers(0, 40, 5000))
    moments = kernel.weighted_moments(values, None, batches, 40)
    unbiased = kernel.whitening(moments, method="unbiased").factor.tolist()
    variance = (moments.m2 / (moments.weight - 1).clamp_min(1) + 1e-8).tolist()
    assert unbiased == [1 / math.sqrt(v) for v in variance]
    areal = kernel.whitening(moments, method="areal").factor.tolist()
    std = [
        math.sqrt(m / max(w - 1, 1))
        for m, w in zip(moments.m2.tolist(), moments.weight.tolist(), strict=True)
    ]
    assert areal == [1 / (s + 1e-5) for s in std]


# --------------------------------------------------------------------------- whole processes


def _capabilities() -> list[str]:
    """The capability levels this CPU runs: ``default`` always, AVX2 and AVX-512 where it has them."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    levels = ["default"]
    if " avx2" in flags:
        levels.append("avx2")
    if " avx512f" in flags and " avx512bw" in flags:
        levels.append("avx512")
    return levels


def _rollouts(path: Path) -> Path:
    rng = np.random.default_rng(11)
    sizes = rng.integers(1, 80, 600)
    ids = np.repeat(np.arange(sizes.size), sizes)
    rng.shuffle(ids)
    scale = rng.choice([1e-300, 1e-3, 1.0, 1e3, 1e300], sizes.size)[ids]
    reward = rng.random(ids.size) * scale
    pq.write_table(
        pa.table(
            {
                "uid": pa.array([f"p{i:05d}" for i in ids]),
                "step": pa.array(ids % 3),
                "reward": pa.array(reward),
                "correct": pa.array((rng.random(ids.size) < 0.4).astype(np.float32)),
            }
        ),
        path,
    )
    return path


RUNS = {
    "grpo, population std": ["-r", "reward"],
    "sample std, batch scale": ["-r", "reward", "--std", "sample", "--scale", "batch"],
    "verl preset, whitened": ["-r", "correct", "--preset", "verl", "--whiten"],
    "areal preset by step": ["-r", "correct", "--preset", "areal", "--batch-col", "step"],
    "openrlhf reinforce baseline": ["-r", "reward", "--estimator", "reinforce_baseline"],
    "pass@k": ["-r", "correct", "--estimator", "pass_at_k", "--pass-k", "4"],
}


def _column_digests(path: Path) -> dict[str, str]:
    table = pq.read_table(path)
    out = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        data = (
            column.to_numpy(zero_copy_only=False) if pa.types.is_floating(column.type) else column.to_pylist()
        )
        out[name] = hashlib.sha256(
            np.asarray(data).tobytes() if pa.types.is_floating(column.type) else repr(data).encode()
        ).hexdigest()
    return out


@pytest.mark.slow
def test_a_run_writes_the_same_bytes_under_every_capability_and_thread_count(tmp_path):
    """Each run under ATEN_CPU_CAPABILITY=default (and AVX2, AVX-512 where this CPU has them) with 1
    and 2 threads: every output column's values hash the same (the float columns by their bytes)."""
    source = _rollouts(tmp_path / "in.parquet")
    settings = [(level, threads) for level in _capabilities() for threads in (1, 2)]
    for label, options in RUNS.items():
        digests = {}
        for level, threads in settings:
            out = tmp_path / f"out-{level}-{threads}.parquet"
            env = {**os.environ, "ATEN_CPU_CAPABILITY": level, "OMP_NUM_THREADS": str(threads)}
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "grpo_cli",
                    "compute",
                    str(source),
                    "-o",
                    str(out),
                    "-g",
                    "uid",
                    "-q",
                    "-f",
                    *options,
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, (label, level, threads, done.stderr)
            digests[(level, threads)] = _column_digests(out)
        first = next(iter(digests.values()))
        differing = [setting for setting, digest in digests.items() if digest != first]
        assert not differing, f"{label}: the output differs under {differing} from {settings[0]}"
