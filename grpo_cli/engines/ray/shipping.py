"""How the driver sends work to tasks: blocks mapped as tasks or a Ray Data job, a task's
options, the first refusal raised."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from grpo_cli.engines.ray.blocks import FilePart
from grpo_cli.engines.ray.fields import BLOCK_FIELD, ERROR_FIELD, GROUP_FIELD, RowsUnknown


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
