"""What the driver sends to tasks and how: tensors shipped as arrays, a run's payload put once in
the object store, blocks mapped as tasks or a Ray Data job, the first refusal raised."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from grpo_cli.engines.ray.blocks import FilePart
from grpo_cli.engines.ray.fields import BLOCK_FIELD, ERROR_FIELD, GROUP_FIELD, RowsUnknown
from grpo_cli.engines.ray.merge import MergedStatistics
from grpo_cli.run.outcome import GroupOutcome


def _payload(ray: Any, merged: MergedStatistics, outcome: GroupOutcome) -> Any:
    """What the workers of the moments and advantage jobs read once, in the object store: the
    keys' buckets and IDs (their tables are there already) and the outcome, its tensors
    shipped as NumPy arrays (:func:`_shipped`)."""
    assert merged.keys is not None
    return ray.put(
        {"keys": replace(merged.keys, positions=np.zeros(0, np.int64)), "outcome": _shipped(outcome)}
    )


class _ShippedTensor:
    """A CPU tensor on its way to Ray's object store as the NumPy array over its memory: Ray
    stores an array's buffer without a copy, where a tensor is first pickled into a copy of its
    bytes on the driver (about 100 bytes a group for an outcome: the driver's peak)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.array = tensor.numpy()

    def __reduce__(self) -> tuple[Any, tuple[np.ndarray]]:
        return _tensor_of, (self.array,)


def _tensor_of(array: np.ndarray) -> torch.Tensor:
    """A shipped tensor, back in a worker: a copy, since the object store's pages are read-only."""
    return torch.from_numpy(array.copy())


def _shipped(value: Any) -> Any:
    """``value`` with each tensor in it (through dataclasses, lists, tuples and dicts) shipped as
    a :class:`_ShippedTensor`, which a worker unpickles as the tensor; nothing is copied here."""
    if isinstance(value, torch.Tensor):
        return _ShippedTensor(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {f.name: _shipped(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return replace(value, **changed)
    if isinstance(value, list):
        return [_shipped(item) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_shipped(item) for item in value)
    if isinstance(value, dict):
        return {key: _shipped(item) for key, item in value.items()}
    return value


def _block_dataset(ray: Any, blocks: list[list[FilePart]], function: Any, **kwargs: Any) -> Any:
    """A dataset of ``function`` over every block (its index in a one-row batch), a Ray task each."""
    ds = ray.data.from_items([{"block": i} for i in range(len(blocks))], override_num_blocks=len(blocks))
    return ds.map_batches(
        function, batch_size=1, batch_format="pyarrow", fn_kwargs={"blocks": blocks, **kwargs}
    )


def _map_blocks(ray: Any, blocks: list[list[FilePart]], function: Any, **kwargs: Any) -> list[pa.Table]:
    """``function`` over every statistics block, a Ray task each; the tables in block order."""
    if not blocks:
        return []
    out = _block_dataset(ray, blocks, function, **kwargs)
    tables = [t for t in ray.get(out.to_arrow_refs()) if t.num_rows]
    errors = [t.column(ERROR_FIELD)[0].as_py() for t in tables if ERROR_FIELD in t.column_names]
    if errors:
        raise RowsUnknown(errors[0])

    # Ray may hand a task's rows back in several pieces: put them back in block order.
    def position(table: pa.Table) -> tuple[int, int]:
        first = table.column(GROUP_FIELD)[0].as_py() if GROUP_FIELD in table.column_names else 0
        return table.column(BLOCK_FIELD)[0].as_py(), first

    return sorted(tables, key=position)


def _raise_first_refusal(answers: Sequence[pa.Table]) -> None:
    """Raise the refusal of the first block among tasks' answers (each naming its block), if any."""
    errors = [t for t in answers if ERROR_FIELD in t.column_names]
    if errors:
        first = min(errors, key=lambda t: t.column(BLOCK_FIELD)[0].as_py())
        raise RowsUnknown(first.column(ERROR_FIELD)[0].as_py())


_TASKS: dict[tuple[Any, int], Any] = {}


def _task(ray: Any, function: Any, *, num_returns: int) -> Any:
    """``function`` as a Ray task of one CPU with ``num_returns`` results (made once a process)."""
    made = _TASKS.get((function, num_returns))
    if made is None:
        made = _TASKS[(function, num_returns)] = ray.remote(num_cpus=1, num_returns=num_returns)(function)
    return made
