"""A dump's files read as rows: read in place where they are, else rewritten once into a
private Arrow file with the derived fields (slime's torch.save samples, prime-rl's traces)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from grpo_cli.choices import InputFormat
from grpo_cli.errors import GrpoError, first_line
from grpo_cli.inputs.sources import InputSet, Shard
from grpo_cli.scratch import spool
from grpo_cli.trainers.dumps.columns import (
    _one_element,
    _per_token_value,
    _plain,
    _table_of_rows,
    _whole_table,
    _with_column,
)
from grpo_cli.trainers.dumps.formats import RESPONSE_LENGTH, DumpFormat, _pattern_text


def _input_format(dump: DumpFormat) -> InputFormat:
    return {"parquet": "parquet", "json-columns": "json-columns"}.get(dump.layout, "jsonl")  # type: ignore[return-value]


def _spooled_arrow(
    stack: contextlib.ExitStack, table: pa.Table, path: Path, *, label: str | None = None
) -> Shard:
    label = label or os.fspath(path)

    def write(out: Any) -> None:
        with pa.ipc.new_file(out, table.schema) as writer:
            writer.write_table(table)

    scratch = stack.enter_context(spool(None, label=label, write=write))
    return Shard(scratch, label, "arrow", path.stat().st_size if path.exists() else 0, origin=path)


def _derived(dump: DumpFormat, path: Path, step: int | None) -> pa.Table:
    """One dump file with the fields the format derives: the step, the unwrapped lists, the key."""
    label = os.fspath(path)
    if dump.step_from_file and step is None:
        raise GrpoError(
            f"{label}: its name does not give the step ({dump.trainer} writes {_pattern_text(dump)})"
        )
    return _derived_table(dump, _loaded(dump, path), label, step)


def _derived_table(dump: DumpFormat, table: pa.Table, label: str, step: int | None) -> pa.Table:
    if dump.step_from_file and step is not None:
        table = _with_column(table, dump.step_field, pa.array([step] * table.num_rows, pa.int64()), label)
    for listed, name in dump.unwrap:
        table = _with_column(table, name, _one_element(table, listed, label), label)
    if dump.response_length is not None:
        total, prompt = dump.response_length
        length = pc.subtract_checked(table.column(total), table.column(prompt))
        table = _with_column(table, RESPONSE_LENGTH, length, label)
    if dump.per_token_advantage is not None:
        assert dump.advantage_col is not None
        advantages, mask = dump.per_token_advantage
        table = _with_column(
            table, dump.advantage_col, _per_token_value(table, advantages, mask, label), label
        )
    return dump.group.derive(table, label)


def _loaded(dump: DumpFormat, path: Path) -> pa.Table:
    label = os.fspath(path)
    if dump.layout == "torch":
        return _torch_samples(path, label)
    if dump.layout == "episodes":
        return _episode_traces(path, label)
    with InputSet([label], input_format=_input_format(dump)) as inputs:
        return _whole_table(inputs.shards[0])


def _torch_samples(path: Path, label: str) -> pa.Table:
    """slime's file: ``torch.save({"rollout_id", "samples": [Sample.to_dict()]})``, loaded
    with ``weights_only=True`` (tensors and plain containers only; no code runs)."""
    import pickle

    import torch

    try:
        with warnings.catch_warnings():  # torch warns of a pickle protocol it then refuses in one line
            warnings.simplefilter("ignore", UserWarning)
            value = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise GrpoError(
            f"{label}: refused: it holds objects other than tensors and plain containers "
            f"({first_line(exc)[:160]}); grpo-cli loads pickled dumps only with weights_only=True, since "
            "loading any other object runs code from the file; convert it to JSON lines with the trainer's "
            "own code"
        ) from None
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise GrpoError(f"{label}: not a readable torch.save file ({first_line(exc)[:160]})") from None
    if not isinstance(value, dict) or not isinstance(value.get("samples"), list):
        raise GrpoError(f"{label}: not a slime rollout dump (expected a dict with a list of samples)")
    rows = []
    for number, sample in enumerate(value["samples"]):
        if not isinstance(sample, dict):
            raise GrpoError(f"{label}: sample {number} is a {type(sample).__name__}, not a dict")
        rows.append({key: _plain(item) for key, item in sample.items()})
    return _table_of_rows(rows, label)


_EPISODE_FIELDS = ("id", "group", "run", "traces")


def _episode_traces(path: Path, label: str) -> pa.Table:
    """prime-rl's ``traces.jsonl``: one verifiers ``Episode`` record a line, read through the
    hardened JSON lines reader; a row per trace prime-rl trains on (``iter_trainable_traces``:
    no error, a trainable agent, a sampled token), its reward the sum of its weighted scores."""
    with InputSet([label], input_format="jsonl") as inputs:
        table = _whole_table(inputs.shards[0])
    missing = [name for name in _EPISODE_FIELDS if name not in table.column_names]
    if missing:
        raise GrpoError(
            f"{label}: not a prime-rl dump: it has no {', '.join(missing)} field (its fields: "
            f"{', '.join(table.column_names[:8])}{', ...' if table.num_columns > 8 else ''})"
        )
    rows = []
    for line, episode in enumerate(table.select(list(_EPISODE_FIELDS)).to_pylist(), start=1):
        group, run = episode["group"], episode["run"] or {}
        step = (run.get("work") or {}).get("step")
        if not group or group.get("id") is None or step is None:
            what = "group id" if not group or group.get("id") is None else "run.work.step"
            raise GrpoError(f"{label}, line {line}: the episode has no {what} (prime-rl stamps both)")
        for index, trace in enumerate(episode["traces"] or []):
            agent = trace.get("agent") or {}
            nodes = [node for node in trace.get("nodes") or [] if any(node.get("mask") or [])]
            if not trace.get("ok") or not agent.get("trainable", True) or not nodes:
                continue
            rewards = [r for r in (trace.get("rewards") or {}).values() if r is not None]
            for name, reward in (trace.get("rewards") or {}).items():
                score = reward.get("score") if isinstance(reward, dict) else None
                if reward is not None and not (
                    isinstance(score, int | float) and not isinstance(score, bool)
                ):
                    raise GrpoError(
                        f"{label}, line {line}: trace {index}'s reward {name!r} has no numeric score "
                        f"({json.dumps(reward)[:80]}); verifiers' Reward.score is a float"
                    )
            advantages = [a for node in nodes for a in node.get("advantages") or []]
            rows.append(
                {
                    "step": int(step),
                    "group_id": str(group["id"]),
                    "episode_id": episode["id"],
                    "trace": index,
                    "agent": agent.get("name"),
                    "reward": float(sum(r["score"] * r.get("weight", 1.0) for r in rewards)),
                    "sampled_tokens": sum(sum(bool(m) for m in node["mask"]) for node in nodes),
                    "trainer_advantage": None
                    if not advantages
                    else advantages[0]
                    if all(a == advantages[0] for a in advantages)
                    else math.nan,
                }
            )
    schema = pa.schema(
        [
            ("step", pa.int64()),
            ("group_id", pa.string()),
            ("episode_id", pa.string()),
            ("trace", pa.int64()),
            ("agent", pa.string()),
            ("reward", pa.float64()),
            ("sampled_tokens", pa.int64()),
            ("trainer_advantage", pa.float64()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def _reward_functions(dump: DumpFormat, shard: Shard) -> list[str]:
    """TRL's reward-function columns: its numeric columns other than ``step`` and ``advantage``."""
    from grpo_cli.inputs.readers import read_schema

    schema = read_schema(shard)
    known = set(dump.fields)
    names = [f.name for f in schema if f.name not in known and pa.types.is_floating(f.type)]
    if not names:
        raise GrpoError(
            f"{shard.display}: holds no reward-function column (a float column besides "
            f"{', '.join(dump.fields)})"
        )
    return names
