"""Input validation and the group layout of a chunk of rewards (one block, blocks of one
size, scattered IDs)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


def _check_rewards(rewards: Tensor, *, allow_nonfinite: bool = False) -> None:
    if not isinstance(rewards, Tensor):
        raise ValueError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if not rewards.dtype.is_floating_point:
        raise ValueError(
            f"rewards must be a floating-point tensor (float16, bfloat16, float32 or float64), "
            f"got dtype {rewards.dtype}"
        )
    if allow_nonfinite or rewards.numel() == 0:
        return
    bad = ~torch.isfinite(rewards)
    if bool(bad.any()):
        flat = bad.reshape(-1)
        positions = flat.nonzero()
        first = int(positions[0])
        value = rewards.reshape(-1)[first].item()
        raise ValueError(
            f"rewards contain {positions.numel()} NaN or infinite value(s); "
            f"the first is {value} at index {first}"
        )


def _check_epsilon(epsilon: float) -> None:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")


def _check_group_ids(rewards: Tensor, group_ids: Tensor) -> None:
    """Refuse IDs that are no group IDs for ``rewards`` by their type, shape or device (their
    values: :func:`_id_range`)."""
    if not isinstance(group_ids, Tensor):
        raise ValueError(f"group_ids must be a torch.Tensor, got {type(group_ids).__name__}")
    if group_ids.dtype.is_floating_point or group_ids.dtype.is_complex or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")
    if group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must have the same shape, got {tuple(rewards.shape)} "
            f"and {tuple(group_ids.shape)}"
        )
    if group_ids.device != rewards.device:
        raise ValueError(
            f"rewards and group_ids must be on the same device, got {rewards.device} and {group_ids.device}"
        )


def _id_range(flat_ids: Tensor) -> tuple[int, int]:
    """The lowest and the highest of flat group IDs (``(0, -1)`` for none); a negative one is
    refused."""
    if not flat_ids.numel():
        return 0, -1
    lowest, highest = torch.aminmax(flat_ids)  # one pass over the IDs for both
    if int(lowest) < 0:
        first = int((flat_ids < 0).nonzero()[0])
        raise ValueError(f"group_ids must be non-negative, got {int(flat_ids[first])} at index {first}")
    return int(lowest), int(highest)


@dataclass(frozen=True)
class _Layout:
    """How flat rows map to groups: explicit IDs, or consecutive blocks of ``group_size``, one
    block each for groups ``first_group`` to ``num_groups - 1`` (a chunk of sorted input names
    the groups after the chunks before it)."""

    num_groups: int
    group_ids: Tensor | None = None  # (N,) int64
    group_size: int | None = None
    first_group: int = 0


def _layout(rewards: Tensor, group_ids: Tensor | None, group_size: int | None) -> tuple[Tensor, _Layout]:
    """Validate a call form and return the flat rewards with their layout."""
    if group_ids is not None and group_size is not None:
        raise ValueError("pass either group_ids or group_size, not both")
    if group_ids is not None:
        _check_group_ids(rewards, group_ids)
        flat_ids = group_ids.reshape(-1).to(torch.int64)
        layout = _block_layout(flat_ids)
        if layout is None:
            layout = _Layout(_id_range(flat_ids)[1] + 1, group_ids=flat_ids)
        return rewards.reshape(-1), layout
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
        if rewards.dim() != 1:
            raise ValueError(
                f"group_size needs 1-D rewards, got shape {tuple(rewards.shape)}; "
                "2-D rewards are already grouped by row"
            )
        if rewards.numel() % group_size:
            raise ValueError(
                f"the number of rewards ({rewards.numel()}) is not divisible by group_size ({group_size})"
            )
        return rewards, _Layout(rewards.numel() // group_size, group_size=group_size)
    if rewards.dim() == 2:
        num_groups, size = rewards.shape
        if size == 0:
            raise ValueError(f"2-D rewards need at least one column, got shape {tuple(rewards.shape)}")
        return rewards.reshape(-1), _Layout(num_groups, group_size=size)
    raise ValueError(
        f"rewards of shape {tuple(rewards.shape)} need group_ids or group_size; "
        "only 2-D rewards of shape (num_prompts, group_size) are grouped by row"
    )


def _block_layout(flat_ids: Tensor) -> _Layout | None:
    """The fixed-size layout where the IDs are f,f,..,f+1,f+1,.. in equal blocks from the first
    ID ``f >= 0`` to the last (sorted input, a chunk of it past group 0 too), else ``None``. The
    first and last IDs bound them then: no pass over the IDs for their range.

    >>> _block_layout(torch.tensor([3, 3, 4, 4]))
    _Layout(num_groups=5, group_ids=None, group_size=2, first_group=3)
    >>> _block_layout(torch.tensor([3, 4, 4, 5])) is None
    True
    """
    n = flat_ids.numel()
    if not n:
        return None
    first, last = int(flat_ids[0]), int(flat_ids[-1])
    blocks = last - first + 1
    if first < 0 or blocks < 1 or n % blocks:
        return None
    size = n // blocks
    heads = flat_ids[::size]
    # each block's first ID is the next group's, then every ID equals its block's
    if torch.equal(heads, torch.arange(first, last + 1, device=flat_ids.device)) and torch.equal(
        flat_ids.view(blocks, size), heads[:, None].expand(blocks, size)
    ):
        return _Layout(last + 1, group_size=size, first_group=first)
    return None


def flat_groups(
    rewards: Tensor, group_ids: Tensor | None = None, *, group_size: int | None = None
) -> tuple[Tensor, Tensor, int]:
    """A call form of :func:`normalize_in_groups`, validated, as flat rows: the rewards ``(N,)``,
    each row's group ID ``(N,)`` int64 (on the rewards' device) and the number of groups ``K``.

    >>> flat_groups(torch.tensor([[1.0, 0.0], [0.5, 0.5]]))
    (tensor([1.0000, 0.0000, 0.5000, 0.5000]), tensor([0, 0, 1, 1]), 2)
    >>> flat_groups(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([2, 0, 2]))[1:]
    (tensor([2, 0, 2]), 3)
    """
    _check_rewards(rewards, allow_nonfinite=True)
    flat, layout = _layout(rewards, group_ids, group_size)
    return flat, _row_group_ids(layout, flat.device), layout.num_groups


def _row_group_ids(layout: _Layout, device: torch.device) -> Tensor:
    if layout.group_ids is not None:
        return layout.group_ids
    assert layout.group_size is not None  # a layout has IDs or a group size
    groups = torch.arange(layout.first_group, layout.num_groups, device=device)
    return groups.repeat_interleave(layout.group_size)
