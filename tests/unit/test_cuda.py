"""CUDA against the CPU: the same advantages, bit for bit, for every estimator (skipped without CUDA).

``make gpu-check`` runs these first, then measures the kernel and ``compute --device cuda``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_cli import add_advantages
from grpo_cli.kernel import group_stats, normalize_in_groups
from tests.conftest import PARITY_ESTIMATORS, bits, parity_case

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("layout", ["sorted", "shuffled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernels_statistics_and_advantages_are_the_cpus(layout, dtype):
    gen = torch.Generator().manual_seed(3)
    ids = torch.arange(5000).repeat_interleave(8)
    if layout == "shuffled":
        ids = ids[torch.randperm(ids.numel(), generator=gen)]
    rewards = torch.rand(ids.numel(), generator=gen, dtype=torch.float64).to(dtype)
    cpu_stats, gpu_stats = group_stats(rewards, ids), group_stats(rewards.cuda(), ids.cuda()).to("cpu")
    for name in ("count", "mean", "m2", "minimum", "maximum"):
        assert torch.equal(getattr(gpu_stats, name), getattr(cpu_stats, name)), name
    cpu = normalize_in_groups(rewards, ids)
    gpu = normalize_in_groups(rewards.cuda(), ids.cuda())
    assert np.array_equal(bits(gpu["advantages"].cpu().numpy()), bits(cpu["advantages"].numpy()))
    assert torch.equal(gpu["active_group_mask"].cpu(), cpu["active_group_mask"])


@pytest.mark.parametrize("estimator", PARITY_ESTIMATORS)
def test_every_estimator_on_cuda_is_the_cpus(estimator):
    case = parity_case(11, estimator=estimator, preset=None)
    keywords = {k: v for k, v in case["keywords"].items() if k != "batch_rows"}
    cpu = add_advantages(case["table"], **keywords, device="cpu")
    gpu = add_advantages(case["table"], **keywords, device="cuda")
    assert np.array_equal(bits(gpu.column("advantage").to_numpy()), bits(cpu.column("advantage").to_numpy()))
    assert gpu.column("group_active").equals(cpu.column("group_active"))
