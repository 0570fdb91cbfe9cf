"""grpo-cli: exact, fast GRPO group-relative advantages over rollout datasets.

The kernel is importable without the CLI's dependencies:

>>> import torch
>>> from grpo_cli import group_advantages
>>> group_advantages(torch.tensor([1.0, 3.0, 4.0, 4.0]), torch.tensor([0, 0, 1, 1]), 1e-8)["advantages"]
tensor([-1.,  1.,  0.,  0.])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "GroupAdvantages",
    "GroupStats",
    "__version__",
    "active_groups",
    "advantages_from_stats",
    "group_advantages",
    "group_stats",
    "merge_group_stats",
]

if TYPE_CHECKING:
    from grpo_cli.kernel import (
        GroupAdvantages,
        GroupStats,
        active_groups,
        advantages_from_stats,
        group_advantages,
        group_stats,
        merge_group_stats,
    )


def __getattr__(name: str) -> Any:
    # Importing torch takes a second or more: the CLI's --help must not pay for it.
    if name in __all__:
        from grpo_cli import kernel

        return getattr(kernel, name)
    raise AttributeError(f"module 'grpo_cli' has no attribute {name!r}")
