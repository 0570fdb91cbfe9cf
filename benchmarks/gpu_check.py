"""`make gpu-check`: the CUDA path, tested and measured in one call (one figure a line).

1. the CUDA tests (``pytest -m cuda``): CPU and CUDA results bit-identical;
2. the kernel on 10^8 and 10^9 rollouts, sorted and shuffled group IDs, as a fraction of the
   device's own copy bandwidth measured in the same run (a clone of the same bytes);
3. ``grpo-cli compute --device cuda`` end to end on a Parquet file against ``--device cpu``
   (time, and whether the outputs are identical).

Exits 1 when CUDA is missing, 2 when a check fails. ``--device cpu --sizes 1e6`` runs the
same code on the CPU, to try the script where no GPU is lent.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
GROUP_SIZE = 8
# The modules holding CUDA tests: collecting only these keeps the check to what a GPU machine
# has (the object-storage and Ray test modules import servers and engines it may lack).
CUDA_TESTS = ("tests/unit/test_cuda.py", "tests/unit/test_kernel.py")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_of(runs: int, device: torch.device, call: object) -> float:
    assert callable(call)
    best = float("inf")
    for _ in range(runs):
        _synchronize(device)
        start = time.perf_counter()
        call()
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def kernel_figures(rows: int, device: torch.device, runs: int) -> list[str]:
    """The kernel's time on ``rows`` rollouts against a clone of the same bytes, per ID layout."""
    from grpo_cli.kernel import normalize_in_groups

    lines = []
    gen = torch.Generator(device=device).manual_seed(0)
    rewards = torch.rand(rows, generator=gen, device=device)
    groups = rows // GROUP_SIZE
    sorted_ids = torch.arange(groups, device=device).repeat_interleave(GROUP_SIZE)
    for layout in ("sorted", "shuffled"):
        ids = (
            sorted_ids
            if layout == "sorted"
            else sorted_ids[torch.randperm(rows, generator=gen, device=device)]
        )
        data = rewards.numel() * rewards.element_size() + ids.numel() * ids.element_size()
        copy = _best_of(runs, device, lambda ids=ids: (rewards.clone(), ids.clone()))
        kernel = _best_of(runs, device, lambda ids=ids: normalize_in_groups(rewards, ids))
        lines.append(
            f"kernel {rows:.0e} rows {layout}: {kernel:.3f} s, copy of the same bytes {copy:.3f} s, "
            f"{copy / kernel:.0%} of copy bandwidth ({data / kernel / 1e9:.1f} GB/s of input)"
        )
    return lines


def end_to_end(rows: int, device: str) -> list[str]:
    """``compute`` on a Parquet file of ``rows`` rollouts, on ``device`` and on the CPU."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "rollouts.parquet"
        rng = np.random.default_rng(0)
        ids = rng.permutation(np.repeat(np.arange(rows // GROUP_SIZE), GROUP_SIZE))
        pq.write_table(pa.table({"group_id": ids, "reward": rng.random(rows, dtype=np.float32)}), source)
        times, outputs = {}, {}
        for name in ("cpu", device):
            target = Path(folder) / f"out-{name}.parquet"
            start = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "grpo_cli",
                    "compute",
                    str(source),
                    "-o",
                    str(target),
                    "--device",
                    name,
                    "-q",
                    "--force",
                ],
                check=True,
            )
            times[name] = time.perf_counter() - start
            outputs[name] = pq.read_table(target, columns=["advantage", "group_active"])
        same = outputs["cpu"].equals(outputs[device])
    return [
        f"compute {rows:.0e} rows --device {device}: {times[device]:.2f} s, "
        f"--device cpu {times['cpu']:.2f} s ({times['cpu'] / times[device]:.2f}x), "
        f"outputs {'identical' if same else 'DIFFER'}"
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default); cpu tries the script")
    parser.add_argument("--sizes", default="1e8,1e9", help="kernel sizes, comma-separated")
    parser.add_argument("--file-rows", type=float, default=2e7, help="rows of the end-to-end file")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per figure (the best counts)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: no CUDA device here (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    device = torch.device(args.device)
    failed = False
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
        python_path = os.environ.get("PYTHONPATH")
        tests = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *CUDA_TESTS],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), python_path)))},
        )
        failed |= tests.returncode != 0
        print(f"cuda tests: {'passed' if tests.returncode == 0 else 'FAILED'}")
    for size in args.sizes.split(","):
        for line in kernel_figures(int(float(size)), device, args.runs):
            print(line, flush=True)
    for line in end_to_end(int(args.file_rows), args.device):
        failed |= "DIFFER" in line
        print(line, flush=True)
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
