"""Trainers' rollout dumps, read as the trainers write them: ``--from TRAINER``.

Each :class:`DumpFormat` says, for one trainer, which files its dump switch writes, how one
file is laid out, which fields hold the reward, the step and the trainer's own advantage,
and how to rebuild the group key the dump leaves out. :func:`open_dump` turns a dump (its
folder, its files, or a glob) into an :class:`~grpo_cli.inputs.sources.InputSet` plus the option
values the format implies; explicit options override every one of them
(:func:`grpo_cli.options.config.resolve_config`).

Files a format reads as they are (verl's and open-instruct's JSON lines, TRL's Parquet, ROLL's
column object) are read in place. The others are rewritten once, file by file, into a private
Arrow file (:mod:`grpo_cli.scratch`) that holds every field of the dump plus the derived
ones: slime's ``torch.save`` file (loaded with ``weights_only=True``: nothing in a dump is
ever executed), NeMo-RL's one-element lists, verl v1's uid prefix, the step of SkyRL's and
AReaL's folders, AReaL's response length, prime-rl's traces (a row per trace it trains on).
SkyRL's training pickle is refused unopened. The user's files are never written.

>>> sorted(DUMPS)
['areal', 'nemo-rl', 'open-instruct', 'prime-rl', 'roll', 'skyrl', 'slime', 'trl', 'verl', 'verl-v1']
>>> DUMPS["verl"].group.describe()
'(step, input): the prompt text within a step'
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from grpo_cli.choices import InputFormat, Trainer, check_choice
from grpo_cli.errors import GrpoError, mention
from grpo_cli.inputs.sources import InputSet, Shard, refuse_copies
from grpo_cli.stores import check_scheme, is_uri, local_path, redact, staged_tree
from grpo_cli.trainers.dumps.columns import DERIVED_KEY, TABLE, _at, _parsed_json, _whole_table, _with_column
from grpo_cli.trainers.dumps.files import (
    _check_fields,
    _display,
    _dump_files,
    _holds,
    _listed,
    _refuse_two_files_of_a_step,
    _which,
    _without_empty_steps,
    trainer_hint,
)
from grpo_cli.trainers.dumps.formats import (
    DUMPS,
    EVAL_ONLY_STEP,
    RESPONSE_LENGTH,
    TRAINERS,
    DumpFormat,
    formats_of,
)
from grpo_cli.trainers.dumps.loading import (
    _derived,
    _derived_table,
    _input_format,
    _reward_functions,
    _spooled_arrow,
)
from grpo_cli.trainers.dumps.rules import (
    ConsecutiveBlocks,
    GroupRule,
    KeyPrefix,
    _block_size,
    _blocks,
    _run_lengths,
)

__all__ = [
    "DERIVED_KEY",
    "DUMPS",
    "EVAL_ONLY_STEP",
    "RESPONSE_LENGTH",
    "TRAINERS",
    "DerivedInputs",
    "DumpFormat",
    "GroupRule",
    "OpenedDump",
    "derived_inputs",
    "formats_of",
    "of_table",
    "open_dump",
    "opened",
    "trainer_hint",
]


@dataclass
class OpenedDump:
    """A dump as a run reads it: the shards, the option values it implies, what it said."""

    dump: DumpFormat
    inputs: InputSet
    defaults: dict[str, Any]
    steps: list[int]
    files: int
    group_size: int | None = None
    notes: list[str] = field(default_factory=list)

    def info(self) -> dict[str, Any]:
        """The summary's ``input.from`` object."""
        return {
            "trainer": self.dump.name,
            "dump": f"{self.dump.article} {self.dump.trainer} dump",
            "writer": self.dump.writer,
            "files": self.files,
            "steps": [self.steps[0], self.steps[-1]] if self.steps else None,
            "group_key": self.dump.group.describe_size(self.group_size)
            if isinstance(self.dump.group, ConsecutiveBlocks) and self.group_size is not None
            else self.dump.group.describe(),
            "rewards": self.defaults.get("reward_col"),
            "notes": self.notes,
        }


def open_dump(trainer: str, specs: Sequence[str], *, group_size: int | None = None) -> OpenedDump:
    """Read the dump ``specs`` name (a dump folder, files, or a quoted glob; or their URIs on
    an object store) as ``trainer`` writes it. Use the returned inputs as a context manager.

    A dump on a store is streamed to a private scratch folder laid out as on the store and read
    there; its files are named by their URIs, in messages as in the summary.
    """
    if not any(is_uri(spec) for spec in specs):
        return _open_local_dump(trainer, specs, group_size=group_size)
    staging = contextlib.ExitStack()
    try:
        local_specs, names = [], {}
        for spec in specs:
            if not is_uri(spec):
                local_specs.append(spec)
            elif check_scheme(spec) == "file":
                local_specs.append(local_path(spec))
            else:
                local = staging.enter_context(staged_tree(spec))
                names[os.fspath(local)] = redact(spec).rstrip("/")
                local_specs.append(os.fspath(local))
        try:
            opened = _open_local_dump(trainer, local_specs, group_size=group_size)
        except GrpoError as exc:
            raise GrpoError(_renamed(exc.template, names), exit_code=exc.exit_code) from None
        inputs = opened.inputs
        inputs.shards = [_on_store(shard, names) for shard in inputs.shards]
        inputs.spec = " ".join(redact(spec) for spec in specs)
        inputs.uris += [spec for spec in specs if is_uri(spec) and check_scheme(spec) != "file"]
        inputs._spools.callback(staging.pop_all().close)
        return opened
    finally:
        staging.close()


def _on_store(shard: Shard, names: dict[str, str]) -> Shard:
    """A shard of a staged dump, named by its URI; one that reads the object's own bytes (not
    a private rewrite of it) keeps the object's URI, so that a store can copy them."""
    path = os.fspath(shard.path)
    remote = _renamed(path, names) if path.startswith(tuple(names)) else None
    return replace(shard, display=_renamed(shard.display, names), remote=remote)


def _renamed(text: str, names: dict[str, str]) -> str:
    """``text`` with each scratch folder's path put back as the URI it was streamed from."""
    for local, uri in names.items():
        text = text.replace(local, uri)
    return text


def _open_local_dump(trainer: str, specs: Sequence[str], *, group_size: int | None) -> OpenedDump:
    """:func:`open_dump` of local paths.

    Refused, in one line each: a folder with no such file, a gap in the steps of a trainer
    that writes every step, a file without the fields the trainer writes (naming the
    trainer whose fields it has), a file that is not a whole number of TRL groups.
    """
    check_choice(mention("from_"), trainer, Trainer)
    candidates = formats_of(trainer)
    named, from_folder = _dump_files(candidates[0], specs)
    refuse_copies([(path, _display(path)) for path, _ in named])  # before any step is read
    _refuse_two_files_of_a_step(candidates[0], named)
    files, skipped = _without_empty_steps(candidates[0], named)
    dump = _which(candidates, files[0])
    _check_fields(dump, files[0])
    steps = sorted({s for _, s in files if s is not None})
    every = sorted({s for _, s in named if s is not None})  # a step written empty is no gap
    if from_folder and dump.every_step and every:
        missing = sorted(set(range(every[0], every[-1] + 1)) - set(every))
        if missing:
            folder = next(Path(spec) for spec in specs if Path(spec).is_dir())
            raise GrpoError(
                f"{_display(folder)}: step {missing[0]} is missing ({dump.trainer} "
                "writes one file per "
                f"step; the folder holds steps {steps[0]}-{steps[-1]} but not {_listed(missing)}); "
                "name the files to read to skip it"
            )
    opened = OpenedDump(dump, _inputs(dump, files, " ".join(specs)), _defaults(dump), steps, len(files))
    opened.inputs.directories += [Path(spec) for spec in specs if Path(spec).is_dir()]  # never written into
    opened.notes += dump.notes
    opened.notes += skipped
    try:
        if isinstance(dump.group, ConsecutiveBlocks):
            opened.group_size = _blocks(dump.group, opened.inputs.shards, group_size, opened.notes)
            opened.defaults["group_size"] = opened.group_size
            del opened.defaults["group_col"]
            if not dump.rewards:  # TRL: a column per reward function
                opened.defaults["reward_col"] = _reward_functions(dump, opened.inputs.shards[0])
                opened.notes.append(
                    f"rewards: the reward-function columns {', '.join(opened.defaults['reward_col'])}, "
                    "each of weight 1 (TRL's reward_weights are not in the dump; give -r NAME:WEIGHT to "
                    "set them)"
                )
        if dump.advantage_col == "advantage" or _holds(opened.inputs.shards[0], "advantage"):
            opened.defaults["advantage_col"] = "recomputed_advantage"
    except BaseException:
        opened.inputs.close()
        raise
    opened.inputs.about = opened.info()
    return opened


def _defaults(dump: DumpFormat) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "reward_col": list(dump.rewards),
        "group_col": list(dump.group.columns),
        "batch_col": dump.step_field,
        "grouping_of": dump.trainer,
        "own_grouping": dump.key_is_the_trainers,
    }
    if dump.preset is not None:
        defaults["preset"] = dump.preset
    defaults.update(dict(dump.settings))
    return defaults


def _inputs(dump: DumpFormat, files: list[tuple[Path, int | None]], label: str) -> InputSet:
    if not dump.rewritten:
        inputs = InputSet([os.fspath(p) for p, _ in files], input_format=_input_format(dump))
        inputs.spec = label
        return inputs
    stack = contextlib.ExitStack()
    shards = []
    try:
        for path, step in files:
            table = _derived(dump, path, step)
            shards.append(_spooled_arrow(stack, table, path))
    except BaseException:
        stack.close()
        raise
    return InputSet.of_shards(label, shards, stack)


def of_table(
    trainer: str, table: pa.Table, *, group_size: int | None = None
) -> tuple[pa.Table, dict[str, Any]]:
    """A table holding one dump's rows (the table API's ``from_=``): the table with the fields
    the format derives, and the option values it implies. A table without the step field of a
    trainer that names the step in the file name (NeMo-RL, slime) is one step.

    >>> table = pa.table({"input": ["p", "p", "q", "q"], "output": ["a"] * 4, "score": [1.0, 0.0, 1.0, 1.0],
    ...                   "step": [3] * 4})
    >>> of_table("verl", table)[1]["group_col"]
    ['step', 'input']
    """
    check_choice("from_", trainer, Trainer)
    candidates = formats_of(trainer)
    dump = next(
        (d for d in candidates if d.tells_apart is None or d.tells_apart(table.schema)), candidates[0]
    )
    missing = [name for name in dump.fields if name not in table.schema.names]
    if missing:
        raise GrpoError(
            f"the table is not {dump.article} {dump.trainer} dump: it has no {', '.join(missing)} column"
        )
    stepless = dump.step_from_file and dump.step_field not in table.schema.names
    derived = _derived_table(dump, table, TABLE, 0 if stepless else None)
    defaults = _defaults(dump)
    if isinstance(dump.group, ConsecutiveBlocks):
        missing = dump.group.missing(table.schema.names)
        if missing:
            raise GrpoError(
                f"the table is not {dump.article} {dump.trainer} dump: it has no {', '.join(missing)} column"
            )
        runs = _run_lengths(*(table.column(name) for name in dump.group.run_fields))
        files = [(TABLE, runs, functools.partial(_at, TABLE))]
        defaults["group_size"] = _block_size(
            dump.group.runs_of, files, group_size, mention("group_size"), [], size_name=dump.group.size_name
        )
        del defaults["group_col"]
        if not dump.rewards:  # TRL: a column per reward function
            floats = [
                f.name for f in table.schema if f.name not in dump.fields and pa.types.is_floating(f.type)
            ]
            defaults["reward_col"] = floats
    if "advantage" in table.schema.names:
        defaults["advantage_col"] = "recomputed_advantage"
    return derived, defaults


@contextlib.contextmanager
def opened(trainer: str, specs: Sequence[str], *, group_size: int | None = None) -> Iterator[OpenedDump]:
    """:func:`open_dump` as a context manager that removes its private files."""
    dump = open_dump(trainer, specs, group_size=group_size)
    try:
        yield dump
    finally:
        dump.inputs.close()


@dataclass
class DerivedInputs:
    """Inputs read through the primitives the adapters are built from, for dumps no adapter
    knows: each shard rewritten privately with the derived columns; ``overrides``: the option
    values that point the run at them (they replace what was given: ``-g uid`` becomes the
    derived ``group_key``)."""

    inputs: InputSet
    overrides: dict[str, Any]
    notes: list[str]


def derived_inputs(
    specs: Sequence[str],
    *,
    input_format: InputFormat | None = None,
    group_cols: Sequence[str] = (),
    key_before: str | None = None,
    group_size: int | None = None,
    blocks_per_file: bool = False,
    json_cols: Sequence[str] = (),
) -> DerivedInputs:
    """Read ``specs`` as any INPUT, then derive per shard: ``json_cols`` (JSON text) parsed into
    structs; with ``key_before`` the group key is the part of the one ``group_cols`` column
    before the first ``key_before``; with ``blocks_per_file`` the groups are blocks of
    ``group_size`` rows that restart at each file (a file's last block may be short)."""
    if key_before is not None:
        if len(group_cols) != 1:
            raise GrpoError(
                f"{mention('key_before')} needs one {mention('group_col')} to cut, got {len(group_cols)}"
            )
        if not key_before:
            raise GrpoError(f"{mention('key_before')} needs a non-empty separator")
    if blocks_per_file and group_size is None:
        raise GrpoError(f"{mention('blocks_per_file')} needs {mention('group_size')} N")
    if blocks_per_file and key_before is not None:
        raise GrpoError(
            f"{mention('blocks_per_file')} and {mention('key_before')} each make the group key; choose one"
        )
    overrides: dict[str, Any] = {}
    notes: list[str] = []
    if key_before is not None:
        overrides = {"group_col": [DERIVED_KEY]}
        notes.append(f"groups: the part of {group_cols[0]} before the first {key_before!r}, as {DERIVED_KEY}")
    if blocks_per_file:
        overrides = {"group_col": [DERIVED_KEY], "group_size": None}
        notes.append(f"groups: blocks of {group_size} rows restarting at each file, as {DERIVED_KEY}")
    source = InputSet(list(specs), input_format=input_format)
    stack = contextlib.ExitStack()
    stack.enter_context(source)
    shards = []
    try:
        for number, shard in enumerate(source.shards):
            table = _whole_table(shard)
            for column in json_cols:
                table = _parsed_json(table, column, shard.display)
            if key_before is not None:
                table = KeyPrefix("", group_cols[0], key_before).derive(table, shard.display)
            if blocks_per_file:
                assert group_size is not None
                blocks = [number * (1 << 40) + row // group_size for row in range(table.num_rows)]
                if table.num_rows % group_size:
                    notes.append(
                        f"{shard.display}: its last block holds {table.num_rows % group_size} of "
                        f"{group_size} rows"
                    )
                table = _with_column(table, DERIVED_KEY, pa.array(blocks, pa.int64()), shard.display)
            origin = shard.source or Path(shard.display)
            label = shard.display
            shards.append(_spooled_arrow(stack, table, origin, label=label))
    except BaseException:
        stack.close()
        raise
    inputs = InputSet.of_shards(" ".join(specs), shards, stack)
    inputs.directories += source.directories
    return DerivedInputs(inputs, overrides, notes)
