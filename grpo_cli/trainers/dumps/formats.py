"""Each trainer's dump format, declared once: the files it writes, their layout, the fields
that hold the reward, the step and its own advantage, its group rule and preset."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa

from grpo_cli.choices import Trainer, choices_of
from grpo_cli.trainers.dumps.rules import ConsecutiveBlocks, GroupRule, KeyColumns, KeyPrefix, PromptTokens

Layout = Literal["jsonl", "parquet", "json-columns", "torch", "episodes"]


RESPONSE_LENGTH = "response_length"
"""The response's token count a dump's fields give (AReaL: ``seqlen - prompt_len``)."""


EVAL_ONLY_STEP = -1
"""The step of a SkyRL ``eval_only`` folder (an evaluation run outside training)."""


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
