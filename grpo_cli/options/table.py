"""Every option, declared once: its name, flags, help, type, default, what it sets, who takes it.

The CLI's parameters (:mod:`grpo_cli.cli` builds each command's signature from these rows),
the table API's keywords and their error wording (:mod:`grpo_cli.tables`), the translation
into a :class:`~grpo_cli.options.config.ComputeConfig` (:func:`grpo_cli.options.config.resolve_config`), the
validation of advantage options and the provenance record all read this table. Adding an
option is one row here plus the code that uses its value.

Plain data (standard library only): ``--help`` reads it without importing torch or pyarrow.

>>> OPTIONS["gpg_f_norm"].flags
('--gpg-f-norm',)
>>> OPTIONS["gpg_f_norm"].target, OPTIONS["clip_advantage"].setting
('advantage', 'clip')
>>> [row.name for row in offered("inspect")]
['debug']
>>> keyword_of("--clip-advantage")
'clip_advantage'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from grpo_cli.choices import (
    Aggregation,
    Baseline,
    CheckFormat,
    Color,
    Compression,
    Engine,
    EpsilonMode,
    Estimator,
    InputFormat,
    NanPolicy,
    OverlongStyle,
    Preset,
    Renormalize,
    RewardSum,
    Scale,
    Singleton,
    Std,
    Trainer,
    TrainerFilterName,
    Whiten,
)
from grpo_cli.estimators import ESTIMATORS

Target = Literal["advantage", "config", "bounds", "verify", "run"]
"""Where a value goes: an :class:`~grpo_cli.options.advantage.AdvantageOptions` field, a
:class:`~grpo_cli.options.config.ComputeConfig` field, a :class:`~grpo_cli.results.checks.CheckBounds` field,
a :class:`~grpo_cli.options.config.VerifySpec` field, or the command itself (how it runs and reports)."""

SHARED = ("compute", "check")
EVERY = ("compute", "check", "inspect")


@dataclass(frozen=True)
class Option:
    """One option. ``default=None`` means "not given": the preset's, the recorded or the
    configuration's default applies. ``flags=()``: no CLI flag (a preset or an estimator sets
    it, or only the Python APIs take it). ``record``: its key in the provenance record (advantage
    options are recorded by field); ``from_provenance``: ``check --verify`` takes it from the
    record unless it is given. ``values``: the vocabulary of the field it sets, where the CLI
    takes another type (``--whiten`` is a flag)."""

    name: str
    flags: tuple[str, ...]
    help: str | Mapping[str, str]
    kind: Any
    default: Any = None
    target: Target = "config"
    field: str | None = None
    panel: str | None = None
    commands: tuple[str, ...] = SHARED
    keyword: bool = True
    positive_finite: bool = False
    values: Any = None
    record: str | None = None
    from_provenance: bool = False
    metavar: str | None = None
    envvar: str | None = None
    show_default: bool | str = True
    min: float | None = None
    max: float | None = None

    @property
    def label(self) -> str:
        """How messages name the option: its long flag, or its name where it has none."""
        return self.flags[0] if self.flags else self.name

    @property
    def setting(self) -> str:
        """The field it sets in its target."""
        return self.field or self.name

    @property
    def vocabulary(self) -> Any:
        """The ``Literal`` of the values it takes where it is a choice (``None`` where not)."""
        if self.values is not None:
            return self.values
        for part in (self.kind, *get_args(self.kind)):
            if get_origin(part) is Literal:
                return part
        return None

    def help_for(self, command: str) -> str:
        return self.help if isinstance(self.help, str) else self.help[command]


_ROWS = (
    # ----------------------------------------------------------------- check's checks
    Option(
        "max_inactive_fraction",
        ("--max-inactive-fraction",),
        "Fail if more than F of the groups are inactive.",
        float | None,
        target="bounds",
        panel="Checks",
        commands=("check",),
        keyword=False,
        min=0.0,
        max=1.0,
    ),
    Option(
        "min_active_groups",
        ("--min-active-groups",),
        "Fail if fewer than N groups are active.",
        int | None,
        target="bounds",
        panel="Checks",
        commands=("check",),
        keyword=False,
        min=0,
    ),
    Option(
        "min_groups",
        ("--min-groups",),
        "Fail if there are fewer than N groups.",
        int | None,
        target="bounds",
        panel="Checks",
        commands=("check",),
        keyword=False,
        min=0,
    ),
    Option(
        "min_group_size",
        ("--min-group-size",),
        "Fail if any group has fewer than N rollouts.",
        int | None,
        target="bounds",
        panel="Checks",
        commands=("check",),
        keyword=False,
        min=1,
    ),
    Option(
        "max_group_size",
        ("--max-group-size",),
        "Fail if any group has more than N rollouts.",
        int | None,
        target="bounds",
        panel="Checks",
        commands=("check",),
        keyword=False,
        min=1,
    ),
    Option(
        "uniform_group_size",
        ("--uniform-group-size",),
        "Fail unless every group has the same size.",
        bool,
        False,
        target="bounds",
        panel="Checks",
        commands=("check",),
        keyword=False,
    ),
    Option(
        "sound_grouping",
        ("--sound-grouping",),
        "Fail if the groups look keyed wrongly: groups that span steps, groups merged to two or more "
        "times the common size, a key that makes most rollouts singletons (the summary's findings; "
        "a trainer's own grouping, read with --from, is not failed).",
        bool,
        False,
        target="bounds",
        panel="Checks",
        commands=("check",),
        keyword=False,
    ),
    Option(
        "max_singleton_groups",
        ("--max-singleton-groups",),
        "Fail if more than N groups have one rollout.",
        int | None,
        target="bounds",
        panel="Checks",
        commands=("check",),
        keyword=False,
        min=0,
    ),
    Option(
        "trainer_filter",
        ("--trainer-filter",),
        "Apply this trainer's own no-signal rule to every group, in its dtype and arithmetic, beside the "
        "exact decision: report the groups it keeps although constant and drops although active (with "
        "--by or --batch-col, per value).",
        TrainerFilterName | None,
        panel="Checks",
        commands=("check",),
        keyword=False,
        metavar="NAME",
    ),
    Option(
        "filter_unshaped",
        ("--filter-unshaped",),
        "With --trainer-filter and a reward transform: the trainer's rule sees the rewards before the "
        "transforms, as NeMo-RL's dynamic sampling filters on its unshaped reward; the exact decision "
        "stays on the shaped reward the estimator normalises.",
        bool,
        False,
        panel="Checks",
        commands=("check",),
        keyword=False,
    ),
    Option(
        "max_misclassified_groups",
        ("--max-misclassified-groups",),
        "With --trainer-filter: fail if the trainer's rule decides more than N groups otherwise than the "
        "exact rule.",
        int | None,
        target="bounds",
        panel="Checks",
        commands=("check",),
        keyword=False,
        min=0,
        metavar="N",
    ),
    Option(
        "validate_pages",
        ("--validate-pages",),
        "Decode every page of every Parquet input, verifying page checksums where the writer wrote them; "
        "fail on the first that does not decode (compute's splicing copies the bytes of columns it does "
        "not read without decoding them).",
        bool,
        False,
        target="bounds",
        panel="Checks",
        commands=("check",),
        keyword=False,
    ),
    Option(
        "verify_advantage_col",
        ("--verify-advantage-col",),
        "Recompute advantages with the chosen options or preset and compare them with this column.",
        str | None,
        target="run",
        panel="Checks",
        commands=("check",),
        keyword=False,
        metavar="NAME",
    ),
    Option(
        "atol",
        ("--atol",),
        "Absolute tolerance for --verify-advantage-col.",
        float,
        1e-6,
        target="verify",
        panel="Checks",
        commands=("check",),
        keyword=False,
        min=0.0,
    ),
    Option(
        "rtol",
        ("--rtol",),
        "Relative tolerance for --verify-advantage-col.",
        float,
        1e-5,
        target="verify",
        panel="Checks",
        commands=("check",),
        keyword=False,
        min=0.0,
    ),
    Option(
        "verify",
        ("--verify",),
        "Recompute the advantage column a grpo-cli output records, with the options it records (its "
        "provenance); options given beside it override them.",
        bool,
        False,
        target="run",
        panel="Checks",
        commands=("check",),
        keyword=False,
    ),
    Option(
        "strict",
        ("--strict",),
        "With --verify-advantage-col: rows that differ only by a trainer's float rounding residue "
        "(constant groups, identical other rollouts, float32 offsets) fail the check too.",
        bool,
        False,
        target="verify",
        panel="Checks",
        commands=("check",),
        keyword=False,
    ),
    # ----------------------------------------------------------------- compute's output path
    Option(
        "output",
        ("--output", "-o"),
        "Output Parquet file (.parquet); JSON lines (.jsonl, .jsonl.gz, .jsonl.zst; - for standard "
        "output); or a directory: one Parquet shard per input shard.",
        str,
        ...,
        target="run",
        panel="Output",
        commands=("compute",),
        keyword=False,
        metavar="PATH",
        show_default=False,
    ),
    Option(
        "output_format",
        ("--output-format",),
        "How check's results also go to standard output for a CI system: text (nothing more: the "
        "lines are on standard error), github (a GitHub Actions ::error annotation for each failed "
        "check) or junit (a JUnit XML report, a test case a check, for GitLab, Jenkins and others).",
        CheckFormat,
        "text",
        target="run",
        panel="Output",
        commands=("check",),
        keyword=False,
    ),
    Option(
        "report",
        ("--report",),
        "Also write the figures as charts to PATH (.html, one self-contained page that opens offline; "
        ".png or .svg, that page drawn by a headless Chromium on PATH): the inactive fraction and mean "
        "reward per value of each --by column, the group-mean and group-size distributions. Needs the "
        "report extra (plotly).",
        str | None,
        target="run",
        panel="Output",
        keyword=False,
        metavar="PATH",
        show_default=False,
    ),
    # ----------------------------------------------------------------- what is read
    Option(
        "from_",
        ("--from",),
        "INPUT is this trainer's rollout dump (its dump folder, files or a glob): the reward, step and "
        "group key are read as the trainer writes them, and its preset applies; explicit options "
        "override them. The trainer's own advantage column is kept: the new one is recomputed_advantage.",
        Trainer | None,
        target="run",
        panel="Input",
        metavar="TRAINER",
    ),
    Option(
        "key_before",
        ("--key-before",),
        "The group key is the part of the --group-col value before the first SEP (verl v1's uid "
        "{uid}_{session}_{index}: --key-before _), derived per file as the column group_key.",
        str | None,
        target="run",
        panel="Input",
        keyword=False,
        metavar="SEP",
    ),
    Option(
        "blocks_per_file",
        ("--blocks-per-file",),
        "With --group-size N: the blocks of N rows restart at each file (a file's last block may be "
        "short), derived as the column group_key.",
        bool,
        False,
        target="run",
        panel="Input",
        keyword=False,
    ),
    Option(
        "json_col",
        ("--json-col",),
        "COL holds JSON text (prime-rl's metrics, info): read it as the values it holds, so that "
        "-r COL.field reads a field of it (compute writes it so too); repeat for several.",
        list[str] | None,
        target="run",
        panel="Input",
        keyword=False,
        metavar="COL",
    ),
    Option(
        "reward_col",
        ("--reward-col", "-r"),
        "Reward column or nested field (reward.score), optionally NAME:WEIGHT; repeat for several rewards "
        "(weighted sum).",
        list[str] | None,
        field="rewards",
        panel="Input",
        metavar="NAME[:WEIGHT]",
        envvar="GRPO_CLI_REWARD_COL",
        show_default="reward",
        record="reward_cols",
        from_provenance=True,
    ),
    Option(
        "group_col",
        ("--group-col", "-g"),
        "Group key column or nested field (meta.prompt_id); a list or struct column groups on its exact "
        "value; repeat for a composite key (e.g. prompt_id and step).",
        list[str] | None,
        field="group_cols",
        panel="Input",
        metavar="COL",
        envvar="GRPO_CLI_GROUP_COL",
        show_default="group_id",
        record="group_cols",
        from_provenance=True,
    ),
    Option(
        "group_size",
        ("--group-size",),
        "Groups are consecutive blocks of N rows (instead of a key column).",
        int | None,
        panel="Input",
        metavar="N",
        min=1,
        record="group_size",
        from_provenance=True,
    ),
    Option(
        "by",
        ("--by",),
        "Report every summary figure per value of COL too (e.g. step, data_source): groups, active and "
        "inactive (all-min, all-max, other), effective rows, group mean and std percentiles; repeat for "
        "several columns. Each group must lie in one value.",
        list[str] | None,
        field="by_cols",
        panel="Input",
        metavar="COL",
    ),
    Option(
        "reward_aggregation",
        ("--reward-aggregation",),
        "With several rewards: normalise their weighted sum, or normalise each in its group and then sum "
        "(GDPO).",
        Aggregation | None,
        field="aggregation",
        panel="Input",
        show_default="sum-then-normalize",
        record="reward_aggregation",
        from_provenance=True,
    ),
    # ----------------------------------------------------------------- how advantages are computed
    Option(
        "preset",
        ("--preset",),
        "Reproduce a trainer's GRPO convention; explicit options override it.",
        Preset | None,
        target="advantage",
        panel="Advantage",
        envvar="GRPO_CLI_PRESET",
    ),
    Option(
        "estimator",
        ("--estimator",),
        "; ".join(estimator.help for estimator in ESTIMATORS.values()) + ". See the README's table.",
        Estimator | None,
        target="advantage",
        panel="Advantage",
        show_default="grpo",
    ),
    Option(
        "epsilon",
        ("--epsilon",),
        "Added to the std.",
        float | None,
        target="advantage",
        panel="Advantage",
        positive_finite=True,
        metavar="EPS",
        show_default="1e-6",
    ),
    Option(
        "std",
        ("--std",),
        "population (divide by n) or sample (n - 1).",
        Std | None,
        target="advantage",
        panel="Advantage",
        show_default="population",
    ),
    Option(
        "scale",
        ("--scale",),
        "Divide by the group std, the batch std, the group mean (MaxRL), or nothing.",
        Scale | None,
        target="advantage",
        panel="Advantage",
        show_default="group",
    ),
    Option(
        "baseline",
        (),
        "mean: the group's mean; leave-one-out: the mean of the group's other rollouts.",
        Baseline | None,
        target="advantage",
        commands=(),
    ),
    Option(
        "epsilon_mode",
        ("--epsilon-mode",),
        "add: std + eps; clamp: max(std, eps); add-if-nonzero: divide only where std > 0.",
        EpsilonMode | None,
        target="advantage",
        panel="Advantage",
        show_default="add",
    ),
    Option(
        "singleton",
        ("--singleton",),
        "One-rollout groups: zero, or raw (r / (1 + eps), verl).",
        Singleton | None,
        target="advantage",
        panel="Advantage",
        show_default="zero",
    ),
    Option(
        "nan",
        ("--nan",),
        "Null, NaN or infinite rewards: error, or ignore (left out of the statistics, advantage 0).",
        NanPolicy | None,
        target="advantage",
        panel="Advantage",
        show_default="error",
    ),
    Option(
        "whiten",
        ("--whiten",),
        "Whiten the advantages over each batch as verl's masked_whiten and ROLL do: "
        "(A - mean) * rsqrt(unbiased var + 1e-8); under --preset trl-rloo, RLOOTrainer's "
        "normalize_advantages: (A - mean) / (sample std over rows + 1e-4).",
        bool,
        False,
        target="advantage",
        panel="Advantage",
        values=Whiten,
    ),
    Option(
        "clip_advantage",
        ("--clip-advantage",),
        "Clamp the final advantages to [LO, HI] (ROLL's advantage_clip, NeMo-RL's advantage_clip_low/high).",
        tuple[float, float] | None,
        target="advantage",
        field="clip",
        panel="Advantage",
        metavar="LO HI",
    ),
    Option(
        "overlong",
        ("--overlong",),
        "DAPO's overlong penalty before the estimator: a response beyond MAX_TOKENS - BUFFER tokens "
        "(--length-col) loses (length - (MAX_TOKENS - BUFFER)) / BUFFER * --overlong-factor.",
        tuple[float, float] | None,
        target="advantage",
        panel="Reward shaping",
        metavar="MAX_TOKENS BUFFER",
    ),
    Option(
        "overlong_factor",
        ("--overlong-factor",),
        "The largest overlong penalty (OpenRLHF's overlong_penalty_factor, NeMo-RL's "
        "overlong_buffer_penalty).",
        float | None,
        target="advantage",
        panel="Reward shaping",
        metavar="F",
        show_default="1",
    ),
    Option(
        "overlong_style",
        ("--overlong-style",),
        "capped: the excess stops at BUFFER, so the penalty at --overlong-factor (OpenRLHF, the DAPO "
        "paper); uncapped: it keeps growing past MAX_TOKENS (NeMo-RL's apply_reward_shaping).",
        OverlongStyle | None,
        target="advantage",
        panel="Reward shaping",
        show_default="capped",
    ),
    Option(
        "stop_properly",
        ("--stop-properly",),
        "ProRL's penalty on a truncated rollout (--truncated-col): C in [0, 1] multiplies its reward "
        "(NeMo-RL, OpenRLHF); a negative C is its reward (OpenRLHF).",
        float | None,
        target="advantage",
        panel="Reward shaping",
        metavar="C",
    ),
    Option(
        "reward_bias",
        ("--reward-bias",),
        "Add B to every reward, before --reward-scale (AReaL's reward_bias).",
        float | None,
        target="advantage",
        panel="Reward shaping",
        metavar="B",
        show_default="0",
    ),
    Option(
        "reward_scale",
        ("--reward-scale",),
        "Multiply every reward by S, after --reward-bias (AReaL's reward_scaling).",
        float | None,
        target="advantage",
        panel="Reward shaping",
        metavar="S",
        show_default="1",
    ),
    Option(
        "reward_clip",
        ("--reward-clip",),
        "Clamp every reward to [LO, HI] before the estimator, after the other transforms (TRL RLOO's "
        "reward_clip_range, AReaL's reward_clip).",
        tuple[float, float] | None,
        target="advantage",
        panel="Reward shaping",
        metavar="LO HI",
    ),
    Option(
        "renormalize",
        (),
        "The batch re-normalisation of normalize-then-sum (set by the trl and nemo-rl presets).",
        Renormalize | None,
        target="advantage",
        commands=(),
        keyword=False,
    ),
    Option(
        "reward_sum",
        (),
        "How several reward columns are added up (set by the trl preset: nansum).",
        RewardSum | None,
        target="advantage",
        commands=(),
        keyword=False,
    ),
    Option(
        "batch_col",
        ("--batch-col",),
        "Training-batch column (e.g. step): --scale batch, whitening, GPG's alpha and the TRL/GDPO "
        "re-normalisation use each batch's statistics. Each group must lie in one batch.",
        str | None,
        panel="Input",
        metavar="COL",
        show_default="the whole input is one batch",
        record="batch_col",
        from_provenance=True,
    ),
    Option(
        "length_col",
        ("--length-col",),
        "Response length (tokens): whitening weighs each rollout by it, as the trainers whiten over tokens.",
        str | None,
        panel="Input",
        metavar="COL",
        record="length_col",
        from_provenance=True,
    ),
    Option(
        "truncated_col",
        ("--truncated-col",),
        "Whether each rollout was truncated, for --stop-properly: a boolean column, or a finish reason "
        "(vLLM's finish_reason, SkyRL's stop_reason) where 'length' marks a truncated rollout.",
        str | None,
        panel="Input",
        metavar="COL",
        record="truncated_col",
        from_provenance=True,
    ),
    Option(
        "baseline_col",
        ("--baseline-col",),
        "With --estimator remax: each row's baseline reward (the greedy rollout's).",
        str | None,
        panel="Input",
        metavar="COL",
        record="baseline_col",
        from_provenance=True,
    ),
    Option(
        "inactive_tolerance",
        ("--inactive-tolerance",),
        "A group whose rewards span at most T (max - min <= T) is inactive and gets advantage 0, as a "
        "constant group does (LLM-judge rewards; SkyRL 1e-6). The summary counts the groups it made "
        "inactive beyond the exact rule.",
        float | None,
        target="advantage",
        panel="Advantage",
        metavar="T",
        show_default="0: exact",
    ),
    Option(
        "pass_k",
        ("--pass-k",),
        "With --estimator pass_at_k: the k of pass@k, clamped to each group's size (k = 1 is the "
        "mean-centred reward over n).",
        int | None,
        target="advantage",
        panel="Advantage",
        metavar="K",
        show_default=False,
    ),
    Option(
        "gpg_f_norm",
        ("--gpg-f-norm",),
        "With --estimator gpg: the divisor f_norm.",
        float | None,
        target="advantage",
        panel="Advantage",
        positive_finite=True,
        metavar="F",
        show_default="1",
    ),
    Option(
        "device",
        ("--device",),
        "auto, cpu, cuda, cuda:N or mps (auto: CUDA, then MPS, then CPU).",
        str,
        "cpu",
        panel="Engine",
        metavar="DEVICE",
        envvar="GRPO_CLI_DEVICE",
        record="device",
    ),
    # ----------------------------------------------------------------- what is written
    Option(
        "advantage_col",
        ("--advantage-col",),
        "Name of the advantage column.",
        str | None,
        panel="Output",
        show_default="advantage",
        commands=("compute",),
        metavar="NAME",
        record="advantage_col",
    ),
    Option(
        "active_col",
        ("--active-col",),
        "Name of the per-row group-is-active column.",
        str,
        "group_active",
        panel="Output",
        commands=("compute",),
        metavar="NAME",
        record="active_col",
    ),
    Option(
        "stats_cols",
        ("--stats-cols",),
        "Also write each row's group mean, std and size.",
        bool,
        False,
        panel="Output",
        commands=("compute",),
        record="stats_cols",
    ),
    Option(
        "drop_inactive",
        ("--drop-inactive",),
        "Leave out rollouts of inactive groups (DAPO dynamic sampling).",
        bool,
        False,
        panel="Output",
        commands=("compute",),
        record="drop_inactive",
    ),
    Option(
        "keep_mean_range",
        ("--keep-mean-range",),
        "Keep only groups whose mean reward lies in [LO, HI] (difficulty filter).",
        tuple[float, float] | None,
        panel="Output",
        commands=("compute",),
        metavar="LO HI",
        record="keep_mean_range",
    ),
    Option(
        "rewrite",
        ("--rewrite",),
        "Re-encode every column instead of splicing the new ones into a copy of each Parquet input's "
        "bytes (e.g. to change --compression).",
        bool,
        False,
        panel="Output",
        commands=("compute",),
        keyword=False,
    ),
    Option(
        "compression",
        ("--compression",),
        "Codec of the columns grpo-cli encodes: the new ones (spliced), or all (--rewrite).",
        Compression,
        "snappy",
        panel="Output",
        commands=("compute",),
        keyword=False,
    ),
    Option(
        "summary_json",
        ("--summary-json",),
        "Write the summary as JSON to PATH, or - for standard output.",
        str | None,
        target="run",
        panel="Output",
        keyword=False,
        metavar="PATH",
    ),
    Option(
        "force",
        ("--force", "-f"),
        {"compute": "Overwrite an existing output.", "check": "Overwrite an existing --summary-json file."},
        bool,
        False,
        target="run",
        panel="Output",
        keyword=False,
    ),
    Option(
        "quiet",
        ("--quiet", "-q"),
        "No summary and no progress on standard error; check still prints one line for each check "
        "that failed, so a CI log says why.",
        bool,
        False,
        target="run",
        panel="Run",
        keyword=False,
    ),
    Option(
        "silent",
        ("--silent", "-s"),
        "Nothing on standard error but an error's one line: no summary, no progress, no check lines "
        "(the exit code says whether the checks passed).",
        bool,
        False,
        target="run",
        panel="Run",
        keyword=False,
    ),
    Option(
        "input_format",
        ("--input-format",),
        "Override the format detected from the name (json: an array or lines, told by content).",
        InputFormat | None,
        panel="Input",
        keyword=False,
    ),
    # ----------------------------------------------------------------- how the run goes
    Option(
        "memory_limit_mb",
        ("--memory-limit-mb",),
        "Inputs that decode to less than this are read once and kept in memory; larger ones stream in two "
        "passes with bounded memory. 0 always streams.",
        int,
        1024,
        field="memory_budget_bytes",
        panel="Engine",
        metavar="MB",
        envvar="GRPO_CLI_MEMORY_LIMIT_MB",
        min=0,
    ),
    Option(
        "batch_rows",
        ("--batch-rows",),
        "Rows per record batch.",
        int | None,
        panel="Engine",
        metavar="N",
        show_default="about 64 MiB of data per batch",
        min=1,
    ),
    Option(
        "engine",
        ("--engine",),
        "local: this machine, streaming; ray: a Ray cluster with Ray Data.",
        Engine,
        "local",
        target="run",
        panel="Engine",
        commands=("compute", "check"),
        keyword=False,
    ),
    Option(
        "ray_address",
        ("--ray-address",),
        "With --engine ray: 'auto' or host:port joins a cluster.",
        str | None,
        target="run",
        panel="Engine",
        commands=("compute", "check"),
        keyword=False,
        metavar="ADDRESS",
        show_default="start a local Ray instance",
    ),
    Option(
        "partitions",
        ("--partitions",),
        "With --engine ray: tasks, and output files, of a re-encoding advantage job "
        "(a spliced run has one per input file).",
        int | None,
        target="run",
        panel="Engine",
        commands=("compute", "check"),
        keyword=False,
        metavar="N",
        show_default="input size / 256 MiB",
        min=1,
    ),
    Option(
        "color",
        ("--color",),
        "Colour the report on standard error: auto (on a terminal, unless NO_COLOR is set), always, never.",
        Color,
        "auto",
        target="run",
        panel="Run",
        keyword=False,
    ),
    Option(
        "debug",
        ("--debug",),
        "Show the traceback of unexpected errors.",
        bool,
        False,
        target="run",
        panel="Run",
        commands=EVERY,
        keyword=False,
    ),
)

OPTIONS: dict[str, Option] = {row.name: row for row in _ROWS}
"""Every option by name, in the order the CLI's help lists them."""

ADVANTAGE_FIELDS = {row.setting: row for row in _ROWS if row.target == "advantage"}
"""The rows of :class:`~grpo_cli.options.advantage.AdvantageOptions`, by field (``clip``, not
``clip_advantage``)."""


def offered(command: str) -> list[Option]:
    """The rows ``command`` takes (``compute``, ``check``, ``inspect``), in help order."""
    return [row for row in _ROWS if command in row.commands]


def keywords() -> list[str]:
    """The keywords of :func:`~grpo_cli.tables.add_advantages` and ``summarize``."""
    return [row.name for row in _ROWS if row.keyword]


def keyword_of(flag: str) -> str | None:
    """The table API's keyword for a CLI flag (``--clip-advantage`` -> ``clip_advantage``)."""
    for row in _ROWS:
        if flag in row.flags and row.keyword:
            return row.name
    return None
