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
import json
import math
import os
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from grpo_cli.arrow.columns import is_text_type, text_kernel_input
from grpo_cli.errors import GrpoError, first_line
from grpo_cli.inputs.sources import DANGLING, InputSet, Shard, matching_files, refuse_copies
from grpo_cli.options.choices import InputFormat, Trainer, check_choice, choices_of
from grpo_cli.scratch import spool
from grpo_cli.stores import check_scheme, is_uri, local_path, redact, staged_tree

Layout = Literal["jsonl", "parquet", "json-columns", "torch", "episodes"]
RESPONSE_LENGTH = "response_length"
"""The response's token count a dump's fields give (AReaL: ``seqlen - prompt_len``)."""
EVAL_ONLY_STEP = -1
"""The step of a SkyRL ``eval_only`` folder (an evaluation run outside training)."""
DERIVED_KEY = "group_key"
"""The column that holds a group key rebuilt from the dump (verl v1's uid prefix, NeMo-RL's
prompt tokens): it is written with the other columns, so the output shows each row's group."""


# --------------------------------------------------------------------------- group rules


@dataclass(frozen=True)
class KeyColumns:
    """The group is the tuple of these fields' values."""

    columns: tuple[str, ...]
    meaning: str

    def describe(self) -> str:
        return f"({', '.join(self.columns)}): {self.meaning}"

    def derive(self, table: pa.Table, file: str) -> pa.Table:
        return table


@dataclass(frozen=True)
class KeyPrefix:
    """The group is the part of ``column`` before the first ``separator``, within the step."""

    step: str
    column: str
    separator: str

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.step, DERIVED_KEY)

    def describe(self) -> str:
        return f"(step, the part of {self.column} before the first {self.separator!r}), as {DERIVED_KEY}"

    def derive(self, table: pa.Table, file: str) -> pa.Table:
        values = table.column(self.column)
        if not is_text_type(values.type):
            raise GrpoError(f"{file}: the field {self.column} is {values.type}, not text")
        values = text_kernel_input(values)
        if values.null_count:
            row = pc.index(pc.is_null(values), True).as_py()
            raise GrpoError(f"{_at(file, row, 'record')}: the field {self.column} is null")
        prefix = pc.list_element(pc.split_pattern(values, self.separator, max_splits=1), 0)
        return _with_column(table, DERIVED_KEY, prefix, file)


@dataclass(frozen=True)
class ConsecutiveBlocks:
    """The group is a block of G consecutive rows of one file; G is given, or read from the
    runs of equal ``prompt`` values (their greatest common divisor). ``within``: fields whose
    change also ends a run (ROLL's ``domain``: two domains' prompts may share an ``id``, and
    a block never holds two domains)."""

    prompt: str
    within: tuple[str, ...] = ()
    size_name: str = "num_generations"

    columns: tuple[str, ...] = ()

    @property
    def run_fields(self) -> list[str]:
        """The fields whose values, taken together, stay the same along one prompt's rows."""
        return [*self.within, self.prompt]

    @property
    def runs_of(self) -> str:
        return " and ".join(self.run_fields)

    def describe(self) -> str:
        return (
            f"consecutive blocks of {self.size_name} rows in each file (told from the runs of "
            f"equal {self.runs_of})"
        )

    def missing(self, names: Sequence[str]) -> list[str]:
        """The ``within`` fields a file or table with these column names lacks."""
        return [name for name in self.within if name not in names]

    def describe_size(self, size: int) -> str:
        """The rule with the group size the run took."""
        within = f", none across two {' or '.join(self.within)} values" if self.within else ""
        return f"consecutive blocks of {size} rows in each file{within}"

    def derive(self, table: pa.Table, file: str) -> pa.Table:
        return table


@dataclass(frozen=True)
class PromptTokens:
    """NeMo-RL's: the prompt's token IDs (the tokens before the first one the loss mask
    keeps) within the step, as ``calculate_baseline_and_std_per_prompt`` groups them."""

    step: str
    tokens: str
    loss_mask: str

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.step, DERIVED_KEY)

    def describe(self) -> str:
        return (
            f"(step, the prompt's token IDs: {self.tokens} before the first token "
            f"{self.loss_mask} keeps), as {DERIVED_KEY}"
        )

    def derive(self, table: pa.Table, file: str) -> pa.Table:
        tokens = _one_element(table, self.tokens, file).to_pylist()
        masks = _one_element(table, self.loss_mask, file).to_pylist()
        prompts = []
        for row, (ids, mask) in enumerate(zip(tokens, masks, strict=True)):
            if ids is None or mask is None or len(ids) != len(mask):
                raise GrpoError(
                    f"{_at(file, row)}: {self.tokens} and {self.loss_mask} differ in length "
                    f"({_length(ids)} and {_length(mask)})"
                )
            first = next((i for i, keep in enumerate(mask) if keep), None)
            if first is None:
                raise GrpoError(f"{_at(file, row)}: {self.loss_mask} keeps no token (no response)")
            prompts.append(ids[:first])
        return _with_column(table, DERIVED_KEY, pa.array(prompts, pa.list_(pa.int64())), file)


GroupRule = KeyColumns | KeyPrefix | ConsecutiveBlocks | PromptTokens


# --------------------------------------------------------------------------- the formats


@dataclass(frozen=True)
class DumpFormat:
    """One trainer's dump: the files, their layout, the fields, and the group rule.

    ``file_name``: a dump file's name, its ``step`` group (where it has one) the step it holds.
    ``tree``: for dumps whose files lie in folders below the dump folder (AReaL's versions,
    SkyRL's evaluations, prime-rl's steps), the glob that finds them and the rule on their path
    whose ``step`` group is the step (none: SkyRL's ``eval_only``, step -1). ``fields``:
    what every file of this dump holds (a file without them is another trainer's).
    ``step_field``: the step's field, or the name of a column derived from the file name
    where the records do not hold it. ``unwrap``: fields written as one-element lists,
    read as their element under ``unwrapped`` names. ``fixed_group_size``: the trainer
    samples the same number of rollouts for every prompt.
    """

    name: str
    trainer: str
    writer: str
    switch: str
    file_name: re.Pattern[str]
    layout: Layout
    fields: tuple[str, ...]
    rewards: tuple[str, ...]
    group: GroupRule
    step_field: str
    preset: str | None = None
    advantage_col: str | None = None
    step_from_file: bool = False
    unwrap: tuple[tuple[str, str], ...] = ()
    every_step: bool = True
    subfolder: str | None = None
    per_token_advantage: tuple[str, str] | None = None  # (advantages, loss mask): NeMo-RL
    response_length: tuple[str, str] | None = None  # (total, prompt) token fields: AReaL
    # files in folders below the dump folder: (glob, rule on the path, its ``step`` group the step)
    tree: tuple[str, re.Pattern[str]] | None = None
    unread: tuple[tuple[re.Pattern[str], str], ...] = ()  # files the trainer writes that are refused, why
    notes: tuple[str, ...] = ()
    article: str = "a"
    settings: tuple[
        tuple[str, Any], ...
    ] = ()  # option values of the trainer's formula, where no preset has it
    tells_apart: Callable[[pa.Schema], bool] | None = field(default=None, compare=False)
    # why the trainer itself writes a file of no records (skipped, with a note), or None (refused)
    writes_empty_steps: str | None = None
    one_file_per_step: bool = True  # False: a file per data source (SkyRL), per task (AReaL)
    # the group key is the trainer's own grouping (not the prompt text standing in for an ID the
    # dump leaves out): what it shows of the groups is the trainer's doing, never to be advised against
    key_is_the_trainers: bool = True

    @property
    def rewritten(self) -> bool:
        """Whether each file is rewritten into a private Arrow file before it is read."""
        return (
            self.layout in ("torch", "episodes")
            or self.step_from_file
            or self.response_length is not None
            or bool(self.unwrap)
            or isinstance(self.group, KeyPrefix | PromptTokens)
        )


_VERL_FIELDS = ("input", "output", "score", "step")


def _is_verl_v1(schema: pa.Schema) -> bool:
    return "uid" in schema.names


DUMPS: dict[str, DumpFormat] = {
    "verl": DumpFormat(
        name="verl",
        trainer="verl",
        writer="verl/trainer/ppo/ray_trainer.py RayPPOTrainer._log_rollout_data / _write_generations",
        switch="trainer.rollout_data_dir",
        file_name=re.compile(r"^(?P<step>\d+)\.jsonl$"),
        layout="jsonl",
        fields=_VERL_FIELDS,
        rewards=("score",),
        group=KeyColumns(("step", "input"), "the prompt text within a step"),
        key_is_the_trainers=False,  # verl groups by uid, one per prompt drawn: the dump leaves it out
        step_field="step",
        preset="verl",
        tells_apart=lambda schema: not _is_verl_v1(schema),
    ),
    "verl-v1": DumpFormat(
        name="verl-v1",
        trainer="verl (v1 trainer)",
        writer="verl/trainer/ppo/v1/trainer_base.py _log_rollout_data / _write_generations",
        switch="trainer.rollout_data_dir",
        file_name=re.compile(r"^(?P<step>\d+)\.jsonl$"),
        layout="jsonl",
        fields=(*_VERL_FIELDS, "uid"),
        rewards=("score",),
        group=KeyPrefix("step", "uid", "_"),
        step_field="step",
        preset="verl",
        tells_apart=_is_verl_v1,
    ),
    "trl": DumpFormat(
        name="trl",
        trainer="TRL",
        writer="trl/trainer/grpo_trainer.py GRPOTrainer.log (completions_{step:05d}.parquet)",
        switch="log_completions=True",
        file_name=re.compile(r"^completions_(?P<step>\d+)\.parquet$"),
        layout="parquet",
        fields=("step", "prompt", "completion", "advantage"),
        rewards=(),  # every reward function's column
        group=ConsecutiveBlocks("prompt"),
        step_field="step",
        preset="trl",
        advantage_col="advantage",
        every_step=False,  # one file per logging step
        subfolder="completions",
    ),
    "nemo-rl": DumpFormat(
        name="nemo-rl",
        trainer="NeMo-RL",
        writer="nemo_rl/algorithms/grpo.py grpo_train + nemo_rl/utils/logger.py log_batched_dict_as_jsonl",
        switch="always (logger.log_dir)",
        file_name=re.compile(r"^train_data_step(?P<step>\d+)\.jsonl$"),
        layout="jsonl",
        fields=("content", "rewards", "token_ids", "token_loss_mask", "advantages", "idx"),
        rewards=("reward",),
        group=PromptTokens("step", "token_ids", "token_loss_mask"),
        step_field="step",
        preset="nemo-rl",
        advantage_col="trainer_advantage",
        step_from_file=True,
        unwrap=(("rewards", "reward"),),
        per_token_advantage=("advantages", "token_loss_mask"),
        notes=(
            "NeMo-RL groups a prompt drawn twice in a step as one group "
            "(calculate_baseline_and_std_per_prompt "
            "compares prompt token IDs), and so does this key",
            "trainer_advantage: the advantage NeMo-RL repeats on each token, read on the tokens "
            "token_loss_mask "
            "keeps (NaN where they differ)",
        ),
    ),
    "roll": DumpFormat(
        name="roll",
        trainer="ROLL",
        writer="roll/pipeline/rlvr/utils.py dump_rollout_to_specific_path / write_to_json_process",
        switch="rollout_dump_dir",
        file_name=re.compile(r"^rollout_dump_data\.step_(?P<step>\d+)\.jsonl$"),
        layout="json-columns",
        fields=("global_step", "id", "responses", "scores"),
        rewards=("scores",),
        # RLVRPipeline.run: the step's rows in generation order (argsort of prompt_id), split by
        # domain (DataProto.group_by), then reward_norm reshapes each domain's rows into blocks of
        # num_return_sequences: a prompt's id is never read, and two domains' ids may collide
        group=ConsecutiveBlocks("id", within=("domain",), size_name="num_return_sequences"),
        step_field="global_step",
        preset="roll",
        notes=(
            "ROLL normalises each domain's rows apart, in blocks of num_return_sequences in generation "
            "order (RLVRPipeline.run, reward_norm): the groups here are those blocks, so prompts of "
            "two domains that share an id stay apart, and a prompt drawn twice in a row is two groups",
        ),
    ),
    "slime": DumpFormat(
        name="slime",
        trainer="slime",
        writer="slime/observability/rollout_data_utils.py save_debug_rollout_data (Sample.to_dict)",
        switch="--save-debug-rollout-data",
        file_name=re.compile(r"^(?P<step>\d+)\.pt$"),
        layout="torch",
        fields=("group_index", "index", "reward", "status"),
        rewards=("reward",),
        group=KeyColumns(("step", "group_index"), "the sample group's index within a rollout"),
        step_field="step",
        preset="slime",
        step_from_file=True,
    ),
    "skyrl": DumpFormat(
        name="skyrl",
        trainer="SkyRL",
        writer="skyrl/train/evaluate.py evaluate + skyrl/train/utils/trainer_utils.py "
        "dump_per_dataset_eval_results",
        switch="trainer.dump_eval_results (on by default)",
        file_name=re.compile(r"^(?!aggregated_results\.jsonl$).+\.jsonl$"),
        layout="jsonl",
        fields=("input_prompt", "output_response", "score", "data_source"),
        rewards=("score",),
        key_is_the_trainers=False,  # SkyRL groups by uid: the dump leaves it out
        group=KeyColumns(
            ("step", "data_source", "input_prompt"),
            "the decoded prompt text within an evaluation's data source (one file each)",
        ),
        step_field="step",
        preset="verl",
        step_from_file=True,
        every_step=False,  # one folder per evaluation (trainer.eval_interval)
        one_file_per_step=False,
        subfolder="dumped_evals",
        tree=(
            "*/*.jsonl",
            re.compile(
                r"(^|/)(global_step_(?P<step>\d+)_evals|eval_only)/(?!aggregated_results\.jsonl$)[^/]+\.jsonl$"
            ),
        ),
        unread=(
            (
                re.compile(r"^global_step_\d+_training_input\.pkl$"),
                "SkyRL's training batch dump (trainer.dump_data_batch) holds no rewards: "
                "RayPPOTrainer.train pops them before dump_data, and it is a pickle of SkyRL's "
                "classes, which grpo-cli does not load; read the evaluation dumps "
                "(dumped_evals/global_step_{N}_evals/{data_source}.jsonl) with --from skyrl",
            ),
        ),
        notes=(
            "SkyRL's GRPO (compute_grpo_outcome_advantage) is verl's formula: sample std, "
            "+ 1e-6, a one-rollout group r / (1 + 1e-6); --preset verl",
            "an eval_only folder (an evaluation outside training) is read as step -1",
            "a prompt drawn twice in one data source of an evaluation is one group here (its decoded "
            "text is the key); the same text in two data sources is two groups, as in SkyRL",
        ),
    ),
    "prime-rl": DumpFormat(
        name="prime-rl",
        trainer="prime-rl",
        writer="src/prime_rl/monitors/file.py FileMonitor.log_episodes (verifiers Episode.to_record)",
        switch="the file monitor (monitors: file)",
        file_name=re.compile(r"^traces\.jsonl$"),
        layout="episodes",
        fields=("step", "group_id", "reward"),
        rewards=("reward",),
        group=KeyColumns(("step", "group_id"), "the episode group's id within a step"),
        step_field="step",
        advantage_col="trainer_advantage",
        subfolder="rollouts",
        tree=(
            "step_*/train/effective/traces.jsonl",
            re.compile(r"(^|/)step_(?P<step>\d+)/(train|eval)/(all|effective)/traces\.jsonl$"),
        ),
        settings=(("estimator", "dr_grpo"),),
        writes_empty_steps=(
            "prime-rl opens a step's traces.jsonl to append its shipped episodes, and writes none where "
            "the step shipped none (FileMonitor.log_episodes)"
        ),
        notes=(
            "one row per trace prime-rl trains on (iter_trainable_traces: no error, a trainable agent, a "
            "sampled token); reward: the sum of its weighted scores (verifiers Trace.reward)",
            "prime-rl's GRPO: float32 r - mean of the group, no division: --estimator dr_grpo here",
            "trainer_advantage: the advantage prime-rl set on the trace's sampled tokens (NaN where they "
            "differ)",
        ),
    ),
    "areal": DumpFormat(
        name="areal",
        trainer="AReaL",
        writer="areal/infra/workflow_executor.py WorkflowExecutor._dump_trajectory",
        switch="fileroot + experiment_name + trial_name (the rollout folder of the log path)",
        file_name=re.compile(r"^\d+\.jsonl$"),
        layout="jsonl",
        fields=("task_id", "sample_idx", "tail_version", "reward"),
        rewards=("reward",),
        group=KeyColumns(("tail_version", "task_id"), "one task's trajectories: the file"),
        step_field="tail_version",
        preset="areal",
        every_step=False,
        one_file_per_step=False,
        tree=("*/*.jsonl", re.compile(r"(^|/)(?P<step>\d+)/\d+\.jsonl$")),
        response_length=("seqlen", "prompt_len"),
        article="an",
        settings=(("length_col", RESPONSE_LENGTH),),
        notes=(
            f"{RESPONSE_LENGTH}: seqlen - prompt_len, the tokens AReaL's loss mask keeps, which weight "
            "its batch whitening (adv_norm)",
            "AReaL leaves out of its dump a sample with no completion token, so a task may show fewer rows",
        ),
    ),
    "open-instruct": DumpFormat(
        name="open-instruct",
        trainer="open-instruct",
        writer="open_instruct/rl_utils.py _save_rollouts (save_traces)",
        switch="save_traces with rollouts_save_path",
        file_name=re.compile(r"^.+_rollouts_\d{6}\.jsonl$"),
        layout="jsonl",
        fields=("step", "sample_idx", "prompt_idx", "reward", "advantage"),
        rewards=("reward",),
        group=KeyColumns(("step", "prompt_idx"), "the prompt's index within the step's batch"),
        step_field="step",
        advantage_col="advantage",
        every_step=False,  # 10,000-row shards, each of several steps
        article="an",
        settings=(("epsilon", 1e-8),),
        notes=(
            "open-instruct's standard advantage: (r - mean) / (population std + 1e-8), as "
            "--epsilon 1e-8 here",
        ),
    ),
}
"""Every dump grpo-cli reads, by ``--from`` name (``verl`` names both of verl's generations;
the content tells them apart)."""

TRAINERS = choices_of(Trainer)
"""The ``--from`` choices."""


def formats_of(trainer: str) -> list[DumpFormat]:
    """The dump formats ``--from trainer`` may mean (verl: both generations)."""
    return [dump for dump in DUMPS.values() if dump.name == trainer or dump.name.startswith(f"{trainer}-")]


# --------------------------------------------------------------------------- opening a dump


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
            raise GrpoError(_renamed(exc.message, names), exit_code=exc.exit_code) from None
        inputs = opened.inputs
        staged = tuple(names)
        inputs.shards = [
            replace(
                shard,
                display=_renamed(shard.display, names),
                # a shard that reads the object's own bytes (not a rewrite of it) can be copied in the store
                remote=_renamed(os.fspath(shard.path), names)
                if os.fspath(shard.path).startswith(staged)
                else None,
            )
            for shard in inputs.shards
        ]
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
    check_choice("--from", trainer, Trainer)
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


def _holds(shard: Shard, name: str) -> bool:
    from grpo_cli.inputs.readers import read_schema

    return name in read_schema(shard).names


def _display(path: Path) -> str:
    return os.fspath(path)


def _listed(values: list[int]) -> str:
    return ", ".join(str(v) for v in values[:5]) + (", ..." if len(values) > 5 else "")


def _dump_files(dump: DumpFormat, specs: Sequence[str]) -> tuple[list[tuple[Path, int | None]], bool]:
    """The dump's files in step order, each with its step, and whether a folder was named."""
    found: list[tuple[Path, int | None]] = []
    from_folder = False
    for spec in specs:
        if spec == "-":
            raise GrpoError(f"--from {dump.trainer} reads a dump's files, not standard input")
        path = Path(spec)
        if path.is_dir():
            from_folder = True
            _refuse_dangling(dump, path)
            matched = _files_in(dump, path)
            if not matched:
                _refuse_unread(dump, path)
                others = [
                    other
                    for other in DUMPS.values()
                    if other.trainer != dump.trainer and _files_in(other, path)
                ]
                hint = (
                    f"; it holds {others[0].article} {others[0].trainer} dump "
                    f"({_files_in(others[0], path)[0].name}, ...): "
                    f"use --from {_choice(others[0])}"
                    if others
                    else _below(dump, path) or trainer_hint([spec], but=dump.trainer)
                )
                raise GrpoError(
                    f"{spec}: holds no {dump.trainer} dump file ({dump.trainer} writes "
                    f"{_pattern_text(dump)}, "
                    f"with {dump.switch}){hint}"
                )
            found += [(p, _step_of(dump, p)) for p in matched]
        elif path.is_file():
            _refuse_unread(dump, path)
            found.append((path, _step_of(dump, path)))
        elif any(ch in spec for ch in "*?["):
            matches = matching_files(spec)
            if not matches:
                raise GrpoError(f"{spec}: the pattern matches no file")
            found += [(p, _step_of(dump, p)) for p in matches]
        else:
            raise GrpoError(f"{spec}: no such file or directory")
    found.sort(key=lambda item: (item[1] is None, item[1] or 0, str(item[0])))
    return found, from_folder


def _refuse_two_files_of_a_step(dump: DumpFormat, files: list[tuple[Path, int | None]]) -> None:
    """Refuse two files that name one step (``rollout_dump_data.step_01.jsonl`` beside
    ``..._step_1.jsonl``) of a trainer that writes one file a step: one of them is a copy, or
    another run's, and its rows would count twice."""
    if not dump.one_file_per_step:
        return
    first: dict[int, Path] = {}
    for path, step in files:
        if step is None:
            continue
        seen = first.setdefault(step, path)
        if seen != path:
            raise GrpoError(
                f"{_display(path)}: holds step {step}, as {_display(seen)} does ({dump.trainer} writes one "
                "file a step: a copy, or another run's?); name the files to read"
            )


def _is_empty(dump: DumpFormat, path: Path) -> bool:
    """Whether a dump file holds no record: no bytes, only white space, or a Parquet file of
    no rows."""
    size = path.stat().st_size
    if size == 0:
        return True
    if dump.layout == "parquet":
        try:
            return bool(pq.read_metadata(path).num_rows == 0)
        except (pa.ArrowException, OSError):
            return False  # refused as unreadable where it is read
    if dump.layout == "torch" or size > 1 << 16:
        return False
    return not path.read_bytes().strip()


def _without_empty_steps(
    dump: DumpFormat, files: list[tuple[Path, int | None]]
) -> tuple[list[tuple[Path, int | None]], list[str]]:
    """The dump's files less those it writes empty (``dump.writes_empty_steps``), with a note
    naming each; an empty file of a trainer that never writes one (a run stopped mid-write, a
    file truncated by a copy) is refused by name."""
    kept, skipped = [], []
    for path, step in files:
        if not _is_empty(dump, path):
            kept.append((path, step))
            continue
        what = (
            "no rows" if dump.layout == "parquet" else "no bytes" if not path.stat().st_size else "no record"
        )
        if dump.writes_empty_steps is None:
            raise GrpoError(
                f"{_display(path)}: an empty {dump.trainer} dump file ({what}); {dump.trainer} writes "
                "none (a run stopped while writing it, or a copy cut short?): name the files to read "
                "without it"
            )
        skipped.append(f"skipped {_display(path)}: empty ({what}); {dump.writes_empty_steps}")
    if not kept:
        raise GrpoError(
            f"{_display(files[0][0])}: every {dump.trainer} dump file named is empty ({len(files)} file(s))"
        )
    return kept, skipped


def _below(dump: DumpFormat, path: Path) -> str:
    """Where ``dump``'s files sit in a subfolder of ``path`` (a folder named a level or two too
    high: ``slime`` for ``slime/rollout_data``), the hint that names it, else ``""``."""
    for folder in _subfolders(path, depth=2):
        matched = _files_in(dump, folder)
        if matched:
            where = _display(folder)
            return f"; its {dump.trainer} files ({matched[0].name}, ...) sit in {where}: name that folder"
    return ""


def _subfolders(path: Path, *, depth: int) -> list[Path]:
    """The folders below ``path``, ``depth`` levels deep at most, nearest first (links not
    followed, hidden ones left out)."""
    found, level = [], [path]
    for _ in range(depth):
        level = [
            child
            for folder in level
            for child in sorted(folder.iterdir())
            if child.is_dir() and not child.is_symlink() and not child.name.startswith(".")
        ]
        found += level
    return found


def trainer_hint(specs: Sequence[str], *, but: str | None = None) -> str:
    """What a run's INPUT looks like when its columns do not fit the options: a trainer's dump
    (its files named as that trainer names them, with its fields), as ``"; it looks like a
    verl dump: use --from verl"`` with the folder to name, or ``""``. ``but``: a trainer not
    to name (the one ``--from`` already named)."""
    for spec in specs:
        path = Path(spec)
        if path.is_file():
            looks = _looks_like(path)
            if looks is not None and looks.trainer != but:
                return f"; it looks like {looks.article} {looks.trainer} dump: use --from {_choice(looks)}"
            continue
        if not path.is_dir():
            continue
        for folder in (path, *_subfolders(path, depth=2)):
            for dump in DUMPS.values():
                if dump.trainer == but:
                    continue
                matched = _files_in(dump, folder)
                if not matched or _looks_like(matched[0]) is not dump:
                    continue
                where = "" if folder == path else f" {_display(folder)}"
                return (
                    f"; it holds {dump.article} {dump.trainer} dump ({matched[0].name}, ...): "
                    f"use --from {_choice(dump)}{where}"
                )
    return ""


def _files_in(dump: DumpFormat, path: Path) -> list[Path]:
    """The files of ``path`` (a folder) named as ``dump`` names its files, in name order."""
    folder = path / dump.subfolder if dump.subfolder and (path / dump.subfolder).is_dir() else path
    if dump.tree is not None:
        glob, rule = dump.tree
        return [p for p in sorted(folder.glob(glob)) if p.is_file() and rule.search(p.as_posix())]
    return [p for p in sorted(folder.glob("*")) if p.is_file() and dump.file_name.match(p.name)]


def _refuse_dangling(dump: DumpFormat, path: Path) -> None:
    """Refuse a link among a dump folder's files that leads to no file (a link to itself, to a
    file since removed): passed over, its step would be missing without a word. (A glob's
    search walks past no link unseen: every entry of the folders is looked at, links too.)"""
    folder = path / dump.subfolder if dump.subfolder and (path / dump.subfolder).is_dir() else path
    entries = folder.rglob("*") if dump.tree is not None else folder.glob("*")
    for entry in entries:
        named = (
            dump.tree[1].search(entry.as_posix())
            if dump.tree is not None
            else dump.file_name.match(entry.name)
        )
        if named and entry.is_symlink() and not entry.exists():
            raise GrpoError(f"{_display(entry)}: {DANGLING}")


def _refuse_unread(dump: DumpFormat, path: Path) -> None:
    """Refuse, without opening it, a file the trainer writes that grpo-cli does not read (or
    a folder that holds only such files), saying why."""
    candidates = [path] if path.is_file() else [p for p in sorted(path.rglob("*")) if p.is_file()]
    for pattern, why in dump.unread:
        hit = next((p for p in candidates if pattern.match(p.name)), None)
        if hit is not None:
            raise GrpoError(f"{_display(hit)}: {why}")


def _pattern_text(dump: DumpFormat) -> str:
    return {
        "verl": "{step}.jsonl",
        "verl-v1": "{step}.jsonl",
        "trl": "completions/completions_{step:05d}.parquet",
        "nemo-rl": "train_data_step{N}.jsonl",
        "roll": "rollout_dump_data.step_{N}.jsonl",
        "slime": "{rollout_id}.pt",
        "skyrl": "dumped_evals/global_step_{N}_evals/{data_source}.jsonl",
        "prime-rl": "rollouts/step_{N}/train/effective/traces.jsonl",
        "areal": "{version}/{task_id}.jsonl",
        "open-instruct": "{run_name}_rollouts_{shard:06d}.jsonl",
    }[dump.name]


def _step_of(dump: DumpFormat, path: Path) -> int | None:
    if dump.tree is not None:
        found = dump.tree[1].search(path.as_posix())
        if found is None:
            return None
        return EVAL_ONLY_STEP if found["step"] is None else int(found["step"])  # SkyRL's eval_only
    match = dump.file_name.match(path.name)
    step = match.groupdict().get("step") if match is not None else None
    return int(step) if step is not None else None


def _schema_of(dump: DumpFormat, path: Path) -> pa.Schema:
    """The fields of one dump file, read the way its trainer wrote it."""
    if dump.layout == "parquet":
        try:
            return pq.read_schema(path)
        except (pa.ArrowException, OSError) as exc:
            raise GrpoError(f"{path}: not a readable Parquet file ({first_line(exc)})") from None
    if dump.layout in ("torch", "episodes"):
        return _loaded(dump, path).schema
    with InputSet([os.fspath(path)], input_format=_input_format(dump)) as inputs:
        from grpo_cli.inputs.readers import read_schema

        return read_schema(inputs.shards[0])


def _which(candidates: list[DumpFormat], first: tuple[Path, int | None]) -> DumpFormat:
    if len(candidates) == 1:
        return candidates[0]
    schema = _schema_of(candidates[0], first[0])
    for dump in candidates:
        if dump.tells_apart is not None and dump.tells_apart(schema):
            return dump
    return candidates[0]


def _check_fields(dump: DumpFormat, first: tuple[Path, int | None]) -> None:
    path = first[0]
    try:
        schema = _schema_of(dump, path)
    except GrpoError as exc:
        looks = _looks_like(path)
        if looks is None:
            raise
        raise GrpoError(
            f"{exc.message}; it looks like {looks.article} {looks.trainer} dump: use --from {_choice(looks)}"
        ) from None
    missing = [name for name in dump.fields if name not in schema.names]
    if missing:
        looks = _looks_like(path, schema)
        hint = (
            f"; it looks like {looks.article} {looks.trainer} dump: use --from {_choice(looks)}"
            if looks
            else ""
        )
        raise GrpoError(
            f"{path}: not {dump.article} {dump.trainer} dump: it has no {', '.join(missing)} field "
            f"(its fields: {', '.join(schema.names[:8])}{', ...' if len(schema.names) > 8 else ''}){hint}"
        )


def _choice(dump: DumpFormat) -> str:
    return dump.name.split("-v")[0] if dump.name.startswith("verl") else dump.name


def _looks_like(path: Path, schema: pa.Schema | None = None) -> DumpFormat | None:
    """The dump format whose file name and fields ``path`` has, if any."""
    for dump in DUMPS.values():
        if not dump.file_name.match(path.name):
            continue
        try:
            found = schema if schema is not None else _schema_of(dump, path)
        except GrpoError:
            continue
        if all(name in found.names for name in dump.fields) and (
            dump.tells_apart is None or dump.tells_apart(found)
        ):
            return dump
    if schema is not None:
        for dump in DUMPS.values():
            if all(name in schema.names for name in dump.fields):
                return dump
    return None


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


def _whole_table(shard: Shard, columns: list[str] | None = None) -> pa.Table:
    """A shard's rows (``columns`` of them), read through its format's hardened reader."""
    from grpo_cli.inputs.readers import MAX_TYPE_SETTLINGS, SchemaDrift, iter_batches, read_schema

    for _ in range(MAX_TYPE_SETTLINGS):
        try:
            batches = list(iter_batches(shard, columns, 1 << 16))
            break
        except SchemaDrift as drift:  # a line longer than the read block, types that drift: again
            drift.settle()
    else:
        raise GrpoError(f"{shard.display}: the column types could not be settled")
    if batches:
        return pa.Table.from_batches(batches, schema=batches[0].schema)
    schema = read_schema(shard)
    return (schema if columns is None else pa.schema([schema.field(c) for c in columns])).empty_table()


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


def _plain(value: Any) -> Any:
    """A sample's value as JSON data: tensors as lists; an empty dict as null (no fields)."""
    if hasattr(value, "tolist") and not isinstance(value, list | tuple | dict | str):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()} or None
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else value
    return value


def _table_of_rows(rows: list[dict[str, Any]], label: str) -> pa.Table:
    """Rows as a table, types settled as grpo-cli's JSON-lines reader settles them."""
    lines = b"".join(
        json.dumps(row, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass") + b"\n"
        for row in rows
    )
    with spool(None, label=label, write=lambda out: _write_all(out, lines)) as scratch:
        return _whole_table(Shard(scratch, label, "jsonl", len(lines), record_word="element"))


def _write_all(out: IO[bytes], data: bytes) -> None:
    out.write(data)


def _with_column(table: pa.Table, name: str, values: Any, label: str) -> pa.Table:
    if name in table.schema.names:
        raise GrpoError(f"{label}: already has a field {name}, the name of the column grpo-cli derives")
    return table.append_column(name, values)


TABLE = "the table"
"""The name a table held in memory (``of_table``) goes by in messages."""


def _at(label: str, row: int, word: str = "line") -> str:
    """Where the 0-based ``row`` of a dump file is (its 1-based line or record), or of a table
    in memory (its row, 0-based as the table API counts).

    >>> _at("3.jsonl", 0), _at(TABLE, 0)
    ('3.jsonl, line 1', 'the table, row 0')
    """
    return f"{TABLE}, row {row}" if label == TABLE else f"{label}, {word} {row + 1}"


def _one_element(table: pa.Table, name: str, label: str) -> pa.ChunkedArray:
    """A field written as one-element lists (``[x]``), as its elements."""
    column = table.column(name)
    if not pa.types.is_list(column.type) and not pa.types.is_large_list(column.type):
        raise GrpoError(f"{label}: the field {name} is {column.type}, not a one-element list")
    lengths = pc.list_value_length(column)
    wrong = pc.or_kleene(pc.is_null(lengths), pc.not_equal(lengths, 1))
    if pc.any(wrong).as_py():
        row = pc.index(wrong, True).as_py()
        raise GrpoError(f"{_at(label, row)}: the field {name} holds {lengths[row].as_py()} elements, not one")
    return pc.list_flatten(column)


def _per_token_value(table: pa.Table, advantages: str, mask: str, label: str) -> pa.Array:
    """Each row's advantage from its per-token list: the value on every token the mask keeps
    (NaN where those tokens disagree, so that a verification names the row)."""
    values = _one_element(table, advantages, label).to_pylist()
    masks = _one_element(table, mask, label).to_pylist()
    out: list[float | None] = []
    for row, (tokens, keep) in enumerate(zip(values, masks, strict=True)):
        if tokens is None or keep is None or len(tokens) != len(keep):
            raise GrpoError(
                f"{_at(label, row)}: {advantages} and {mask} differ in length "
                f"({_length(tokens)} and {_length(keep)})"
            )
        kept = {float(a) for a, k in zip(tokens, keep, strict=True) if k}
        out.append(kept.pop() if len(kept) == 1 else (math.nan if kept else None))
    return pa.array(out, pa.float64())


def _length(value: Any) -> str:
    return "null" if value is None else str(len(value))


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


def _blocks(rule: ConsecutiveBlocks, shards: list[Shard], given: int | None, notes: list[str]) -> int:
    """The group size of a dump whose groups are consecutive blocks in each file (see
    :func:`_block_size`), read from the files' runs of equal prompts."""
    from grpo_cli.inputs.readers import describe_row, read_schema

    for shard in shards:
        missing = rule.missing(read_schema(shard).names)
        if missing:
            raise GrpoError(
                f"{shard.display}: holds no {', '.join(missing)} field, which tells the trainer's groups "
                "apart (the trainer writes it in every record)"
            )
    files = [
        (
            shard.display,
            _run_lengths(*_whole_table(shard, rule.run_fields).columns),
            functools.partial(describe_row, shard),
        )
        for shard in shards
    ]
    return _block_size(rule.runs_of, files, given, "--group-size", notes, size_name=rule.size_name)


def _block_size(
    prompt: str,
    files: Sequence[tuple[str, list[int], Callable[[int], str]]],
    given: int | None,
    option: str,
    notes: list[str],
    *,
    size_name: str = "num_generations",
) -> int:
    """``given``, or the greatest common divisor of the runs of equal ``prompt`` values; each
    file (its name, its runs' lengths, and how a row of it is named) must be whole groups, and
    no group may hold two prompts.

    Blocks start at each file's first row, so a group holds one prompt only where every run,
    the first and last of a file among them, is a whole number of groups: the divisor of all
    runs is the largest size that puts no two prompts in one group. Where the runs inside the
    files agree on a size that a file's first or last run breaks (a generation batch cut
    across two files), that size is taken so that the file is named.

    >>> _block_size("prompt", [("a", [8, 16, 8], str)], None, "--group-size", notes := [])
    8
    >>> notes[1].split(";")[0]
    '1 run(s) of one prompt span several groups of 8 (a prompt drawn twice in a row)'
    """
    runs = [run for _, lengths, _ in files for run in lengths]
    size = given
    if size is None:
        size = math.gcd(*runs)
        if size <= 1:
            size = math.gcd(*(run for _, lengths, _ in files for run in lengths[1:-1]))
        if size <= 1:
            raise GrpoError(
                f"{files[0][0]}: cannot tell {size_name} from the dump (no two consecutive rows "
                f"share a {prompt}); give {option}"
            )
        longer = sum(1 for run in runs if run > size)
        notes.append(
            f"group size {size}: told from the runs of equal {prompt} (the dump does not record {size_name})"
        )
        if longer:
            notes.append(
                f"{longer} run(s) of one {prompt} span several groups of {size} (a prompt "
                "drawn twice in a row); "
                "they are split by position, as the trainer groups them"
            )
    named = f" ({option})" if given is not None else ""
    for name, lengths, where in files:
        count = sum(lengths)
        if count % size:
            raise GrpoError(
                f"{name}: {count} rows are not a whole number of groups of {size} (the "
                "trainer writes "
                "whole generation batches): the file is truncated, or the group size is not "
                f"{size}{named}"
            )
        start = 0
        for run in lengths:
            if start % size:
                first = start - start % size
                raise GrpoError(
                    f"{where(start)}: a new {prompt} starts inside a group of {size} "
                    f"(rows {first}-{first + size - 1} hold two): the "
                    f"file is cut, or the group size is not {size}{named}"
                )
            start += run
    return size


def _run_lengths(*columns: pa.ChunkedArray) -> list[int]:
    """Lengths of the runs of equal consecutive values (of all ``columns`` together).

    >>> _run_lengths(pa.chunked_array([["3", "3", "3", "3"]]), pa.chunked_array([["a", "a", "b", "b"]]))
    [2, 2]
    """
    items = list(zip(*(column.to_pylist() for column in columns), strict=True))
    out, start = [], 0
    for i in range(1, len(items) + 1):
        if i == len(items) or items[i] != items[start]:
            out.append(i - start)
            start = i
    return out


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
            dump.group.runs_of, files, group_size, "group_size=", [], size_name=dump.group.size_name
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


# --------------------------------------------------------------------------- the primitives, as options


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
            raise GrpoError(f"--key-before needs one --group-col to cut, got {len(group_cols)}")
        if not key_before:
            raise GrpoError("--key-before needs a non-empty separator")
    if blocks_per_file and group_size is None:
        raise GrpoError("--blocks-per-file needs --group-size N")
    if blocks_per_file and key_before is not None:
        raise GrpoError("--blocks-per-file and --key-before each make the group key; choose one")
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


def _parsed_json(table: pa.Table, column: str, label: str) -> pa.Table:
    """A column of JSON text (prime-rl's metrics) as the values it holds (a struct of fields)."""
    if column not in table.schema.names:
        raise GrpoError(
            f"{label}: --json-col {column!r} is not a column (columns: {', '.join(table.schema.names[:8])})"
        )
    values = table.column(column)
    if not is_text_type(values.type):
        raise GrpoError(f"{label}: --json-col {column!r} is {values.type}, not JSON text")
    parsed = []
    for row, text in enumerate(values.to_pylist()):
        try:
            parsed.append(None if text is None else json.loads(text))
        except json.JSONDecodeError as exc:
            raise GrpoError(f"{label}, row {row}: --json-col {column!r} is not JSON ({exc.msg})") from None
    try:
        array = pa.array(parsed)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise GrpoError(
            f"{label}: --json-col {column!r} holds values of different kinds ({first_line(exc)})"
        ) from None
    index = table.schema.get_field_index(column)
    return table.set_column(index, column, array)
