"""grpo-cli: exact, fast GRPO group-relative advantages over rollout datasets.

Tables you hold get two columns with :func:`add_advantages` (pyarrow, polars, pandas,
datasets); files are :func:`compute_dataset`'s, on this machine or on Ray
(``engine=Ray()``). The kernel is importable without the
CLI's dependencies:

>>> import torch
>>> from grpo_cli import group_advantages
>>> group_advantages(torch.tensor([1.0, 3.0, 4.0, 4.0]), torch.tensor([0, 0, 1, 1]), 1e-8)["advantages"]
tensor([-1.,  1.,  0.,  0.])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "ComputeConfig",
    "GroupAdvantages",
    "GroupStats",
    "GroupStatsAccumulator",
    "GrpoError",
    "Local",
    "Ray",
    "__version__",
    "active_groups",
    "add_advantages",
    "advantages_from_stats",
    "check_dataset",
    "compute_dataset",
    "group_advantages",
    "group_stats",
    "merge_group_stats",
    "reuse_freed_memory",
    "summarize",
]

if TYPE_CHECKING:
    from grpo_cli.allocator import reuse_freed_memory
    from grpo_cli.api import group_advantages
    from grpo_cli.errors import GrpoError
    from grpo_cli.jobs import Local, Ray, check_dataset, compute_dataset
    from grpo_cli.kernel import (
        GroupAdvantages,
        GroupStats,
        GroupStatsAccumulator,
        active_groups,
        advantages_from_stats,
        group_stats,
        merge_group_stats,
    )
    from grpo_cli.options.config import ComputeConfig
    from grpo_cli.tables import add_advantages, summarize

_LAZY = {
    "group_advantages": "grpo_cli.api",
    "compute_dataset": "grpo_cli.jobs",
    "check_dataset": "grpo_cli.jobs",
    "Local": "grpo_cli.jobs",
    "Ray": "grpo_cli.jobs",
    "ComputeConfig": "grpo_cli.options.config",
    "GrpoError": "grpo_cli.errors",
    "add_advantages": "grpo_cli.tables",
    "summarize": "grpo_cli.tables",
    "reuse_freed_memory": "grpo_cli.allocator",
}


def __getattr__(name: str) -> Any:
    # Importing torch takes a second or more: the CLI's --help must not pay for it.
    if name in __all__:
        import importlib

        return getattr(importlib.import_module(_LAZY.get(name, "grpo_cli.kernel")), name)
    raise AttributeError(f"module 'grpo_cli' has no attribute {name!r}")
