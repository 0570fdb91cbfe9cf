"""What a run was asked for: :class:`ComputeConfig` (plain data, validated).

It imports neither torch nor pyarrow: the CLI builds it, and a run starts copying the
spliced outputs' bytes, while torch is still being imported.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from grpo_cli import __version__
from grpo_cli.choices import Aggregation, Compression, InputFormat, TrainerFilterName, check_choice
from grpo_cli.errors import GrpoError, mention
from grpo_cli.estimators import ESTIMATORS
from grpo_cli.options.advantage import ADVANTAGE_FIELDS, AdvantageOptions, RewardSpec, whitening_of_flag
from grpo_cli.options.declare import CHECKS, ENGINE, INPUT, OUTPUT, declared, option

DEFAULT_MEMORY_BUDGET = 1 << 30


@dataclass(frozen=True)
class VerifySpec:
    """What to verify: the column, the tolerances, and whether residue fails the check."""

    column: str
    atol: float = option(1e-6, "--atol", help="Absolute tolerance for --verify-advantage-col.", min=0.0)
    rtol: float = option(1e-5, "--rtol", help="Relative tolerance for --verify-advantage-col.", min=0.0)
    max_examples: int = 5
    strict: bool = option(
        False,
        "--strict",
        help="With --verify-advantage-col: rows that differ only by a trainer's float rounding residue "
        "(constant groups, identical other rollouts, float32 offsets) fail the check too.",
    )


@dataclass(frozen=True)
class ComputeConfig:
    """Everything a run needs besides the input and output paths; a field that is an option
    declares it (:func:`~grpo_cli.options.declare.option`)."""

    # ------------------------------------------------------------------ what is read
    rewards: tuple[RewardSpec, ...] = option(
        (RewardSpec("reward"),),
        "--reward-col",
        "-r",
        name="reward_col",
        kind=list[str],
        help="Reward column or nested field (reward.score), optionally NAME:WEIGHT; repeat for several "
        "rewards (weighted sum).",
        panel=INPUT,
        metavar="NAME[:WEIGHT]",
        envvar="GRPO_CLI_REWARD_COL",
        record="reward_cols",
        from_provenance=True,
    )
    group_cols: tuple[str, ...] = option(
        ("group_id",),
        "--group-col",
        "-g",
        name="group_col",
        kind=list[str],
        help="Group key column or nested field (meta.prompt_id); a list or struct column groups on its "
        "exact value; repeat for a composite key (e.g. prompt_id and step).",
        panel=INPUT,
        metavar="COL",
        envvar="GRPO_CLI_GROUP_COL",
        record="group_cols",
        from_provenance=True,
    )
    group_size: int | None = option(
        None,
        "--group-size",
        help="Groups are consecutive blocks of N rows (instead of a key column).",
        panel=INPUT,
        metavar="N",
        min=1,
        record="group_size",
        from_provenance=True,
    )
    by_cols: tuple[str, ...] = option(
        (),
        "--by",
        name="by",
        kind=list[str],
        help="Report every summary figure per value of COL too (e.g. step, data_source): groups, active "
        "and inactive (all-min, all-max, other), effective rows, group mean and std percentiles; repeat "
        "for several columns. Each group must lie in one value.",
        panel=INPUT,
        metavar="COL",
        shown=False,
    )
    aggregation: Aggregation = option(
        "sum-then-normalize",
        "--reward-aggregation",
        name="reward_aggregation",
        help="With several rewards: normalise their weighted sum, or normalise each in its group and then "
        "sum (GDPO).",
        panel=INPUT,
        record="reward_aggregation",
        from_provenance=True,
    )
    batch_col: str | None = option(
        None,
        "--batch-col",
        help="Training-batch column (e.g. step): --scale batch, whitening, GPG's alpha and the TRL/GDPO "
        "re-normalisation use each batch's statistics. Each group must lie in one batch.",
        panel=INPUT,
        metavar="COL",
        shown="the whole input is one batch",
        record="batch_col",
        from_provenance=True,
    )
    length_col: str | None = option(
        None,
        "--length-col",
        help="Response length (tokens): whitening weighs each rollout by it, as the trainers whiten over "
        "tokens.",
        panel=INPUT,
        metavar="COL",
        record="length_col",
        from_provenance=True,
    )
    truncated_col: str | None = option(
        None,
        "--truncated-col",
        help="Whether each rollout was truncated, for --stop-properly: a boolean column, or a finish "
        "reason (vLLM's finish_reason, SkyRL's stop_reason) where 'length' marks a truncated rollout.",
        panel=INPUT,
        metavar="COL",
        record="truncated_col",
        from_provenance=True,
    )
    baseline_col: str | None = option(
        None,
        "--baseline-col",
        help="With --estimator remax: each row's baseline reward (the greedy rollout's).",
        panel=INPUT,
        metavar="COL",
        record="baseline_col",
        from_provenance=True,
    )
    input_format: InputFormat | None = option(
        None,
        "--input-format",
        help="Override the format detected from the name (json: an array or lines, told by content).",
        panel=INPUT,
        keyword=False,
    )
    # ------------------------------------------------------------------ how advantages are computed
    advantage: AdvantageOptions = field(default_factory=AdvantageOptions)
    # ------------------------------------------------------------------ what is written
    advantage_col: str = option(
        "advantage",
        "--advantage-col",
        help="Name of the advantage column.",
        panel=OUTPUT,
        commands=("compute",),
        metavar="NAME",
        record="advantage_col",
    )
    active_col: str = option(
        "group_active",
        "--active-col",
        help="Name of the per-row group-is-active column.",
        panel=OUTPUT,
        commands=("compute",),
        metavar="NAME",
        record="active_col",
    )
    stats_cols: bool = option(
        False,
        "--stats-cols",
        help="Also write each row's group mean, std and size.",
        panel=OUTPUT,
        commands=("compute",),
        record="stats_cols",
    )
    drop_inactive: bool = option(
        False,
        "--drop-inactive",
        help="Leave out rollouts of inactive groups (DAPO dynamic sampling).",
        panel=OUTPUT,
        commands=("compute",),
        record="drop_inactive",
    )
    keep_mean_range: tuple[float, float] | None = option(
        None,
        "--keep-mean-range",
        help="Keep only groups whose mean reward lies in [LO, HI] (difficulty filter).",
        panel=OUTPUT,
        commands=("compute",),
        metavar="LO HI",
        record="keep_mean_range",
    )
    rewrite: bool = option(  # re-encode every column even where the new ones could be spliced in
        False,
        "--rewrite",
        help="Re-encode every column instead of splicing the new ones into a copy of each Parquet input's "
        "bytes (e.g. to change --compression).",
        panel=OUTPUT,
        commands=("compute",),
        keyword=False,
    )
    compression: Compression = option(
        "snappy",
        "--compression",
        help="Codec of the columns grpo-cli encodes: the new ones (spliced), or all (--rewrite).",
        panel=OUTPUT,
        commands=("compute",),
        keyword=False,
    )
    # ------------------------------------------------------------------ how the run goes
    device: str = option(
        "cpu",
        "--device",
        help="auto, cpu, cuda, cuda:N or mps (auto: CUDA, then MPS, then CPU).",
        panel=ENGINE,
        metavar="DEVICE",
        envvar="GRPO_CLI_DEVICE",
        record="device",
    )
    memory_budget_bytes: int = option(
        DEFAULT_MEMORY_BUDGET,
        "--memory-limit-mb",
        name="memory_limit_mb",
        kind=int,
        help="Inputs that decode to less than this are read once and kept in memory; larger ones stream "
        "in two passes, their rows not held (what is held grows with the groups, not the rows). "
        "0 always streams.",
        panel=ENGINE,
        metavar="MB",
        envvar="GRPO_CLI_MEMORY_LIMIT_MB",
        shown=str(DEFAULT_MEMORY_BUDGET >> 20),
        min=0,
    )
    batch_rows: int | None = option(
        None,
        "--batch-rows",
        help="Rows per record batch.",
        panel=ENGINE,
        metavar="N",
        shown="about 64 MiB of data per batch",
        min=1,
    )
    stats_block_rows: int = 1 << 22
    # ------------------------------------------------------------------ what check compares
    verify: VerifySpec | None = None
    trainer_filter: TrainerFilterName | None = option(
        None,
        "--trainer-filter",
        help="Apply this trainer's own no-signal rule to every group, in its dtype and arithmetic, beside "
        "the exact decision: report the groups it keeps although constant and drops although active "
        "(with --by or --batch-col, per value).",
        panel=CHECKS,
        commands=("check",),
        keyword=False,
        metavar="NAME",
    )
    filter_unshaped: bool = option(
        False,
        "--filter-unshaped",
        help="With --trainer-filter and a reward transform: the trainer's rule sees the rewards before "
        "the transforms, as NeMo-RL's dynamic sampling filters on its unshaped reward; the exact "
        "decision stays on the shaped reward the estimator normalises.",
        panel=CHECKS,
        commands=("check",),
        keyword=False,
    )
    # the step column whose values each group's rows should share (a group across steps is a
    # grouping mistake the summary reports); None: none watched (see steps.watched_step)
    step_col: str | None = None
    # the trainer whose dump the run reads (--from), and whether the key is its own grouping
    # (findings never advise against it) or a stand-in for an ID the dump leaves out
    grouping_of: str | None = None
    own_grouping: bool = False

    def __post_init__(self) -> None:
        # Plain names are accepted where specs are expected: ComputeConfig(rewards=("correct",)).
        rewards = (self.rewards,) if isinstance(self.rewards, str | RewardSpec) else self.rewards
        specs = tuple(RewardSpec(r) if isinstance(r, str) else r for r in rewards)
        groups = (self.group_cols,) if isinstance(self.group_cols, str) else tuple(self.group_cols)
        object.__setattr__(self, "rewards", specs)
        object.__setattr__(self, "group_cols", groups)
        object.__setattr__(
            self, "by_cols", (self.by_cols,) if isinstance(self.by_cols, str) else tuple(self.by_cols)
        )

    def validate(self) -> None:
        if not self.rewards:
            raise GrpoError(f"at least one {mention('reward_col')} is needed")
        if len(set(self.by_cols)) != len(self.by_cols):
            raise GrpoError(f"{mention('by')} names a column twice: {', '.join(self.by_cols)}")
        names = [r.column for r in self.rewards]
        if len(set(names)) != len(names):
            raise GrpoError(f"{mention('reward_col')} names a column twice: {', '.join(names)}")
        if self.group_size is not None and self.group_size < 1:
            raise GrpoError(f"{mention('group_size')} must be a positive integer, got {self.group_size}")
        if self.group_size is None and not self.group_cols:
            raise GrpoError(f"give {mention('group_col')} or {mention('group_size')}")
        check_choice(mention("reward_aggregation"), self.aggregation, Aggregation)
        check_choice(mention("compression"), self.compression, Compression)
        if self.input_format is not None:
            check_choice(mention("input_format"), self.input_format, InputFormat)
        if self.advantage_col == self.active_col:
            raise GrpoError(
                f"{mention('advantage_col')} and {mention('active_col')} are both {self.advantage_col!r}"
            )
        if self.keep_mean_range is not None:
            low, high = self.keep_mean_range
            if not low <= high:
                raise GrpoError(f"{mention('keep_mean_range')} needs LO <= HI, got {low} {high}")
        if self.batch_rows is not None and self.batch_rows < 1:
            raise GrpoError(f"batch_rows must be positive, got {self.batch_rows}")
        self.advantage.validate()
        estimator = self.advantage.estimator
        spec = ESTIMATORS[estimator]
        for need, flag, given in (
            ("row_baselines", mention("baseline_col"), self.baseline_col),
            ("row_lengths", mention("length_col"), self.length_col),
        ):
            if need in spec.needs and given is None:
                raise GrpoError(f"{mention('estimator')} {estimator} needs {flag} ({spec.row_input})")
        if self.baseline_col is not None and "row_baselines" not in spec.needs:
            takers = [name for name, other in ESTIMATORS.items() if "row_baselines" in other.needs]
            raise GrpoError(
                f"{mention('baseline_col')} is the baseline of {mention('estimator')} {takers[0]}; add "
                f"{mention('estimator')} {takers[0]}"
            )
        if self.per_column and self.advantage.renormalize != "none" and self.advantage.whiten != "none":
            raise GrpoError(
                f"{mention('whiten')} {self.advantage.whiten} and the {self.advantage.renormalize} "
                "re-normalisation of "
                "normalize-then-sum both transform the batch; choose one"
            )
        if self.verify is not None and self.verify.column in self.input_columns:
            raise GrpoError(
                f"the column to verify, {self.verify.column!r}, is also read to compute the advantages; "
                "it cannot be both"
            )
        options = self.advantage
        if (
            self.length_col is not None
            and options.whiten == "none"
            and "row_lengths" not in spec.needs
            and options.overlong is None
        ):
            raise GrpoError(
                f"{mention('length_col')} weights the batch whitening by response length: it needs "
                f"{mention('whiten')} or an "
                "estimator that whitens (reinforce_plus_plus_baseline, reinforce_baseline), or "
                f"{mention('overlong')}"
            )
        if options.overlong is not None and self.length_col is None:
            raise GrpoError(
                f"{mention('overlong')} penalises long responses: it needs {mention('length_col')} (each "
                "response's tokens)"
            )
        if options.stop_properly is not None and self.truncated_col is None:
            raise GrpoError(
                f"{mention('stop_properly')} penalises truncated rollouts: it needs "
                f"{mention('truncated_col')}"
            )
        if self.truncated_col is not None and options.stop_properly is None:
            raise GrpoError(
                f"{mention('truncated_col')} is read by {mention('stop_properly')}; give "
                f"{mention('stop_properly')} C"
            )
        if self.filter_unshaped and (self.trainer_filter is None or not options.shapes_rewards):
            raise GrpoError(
                f"{mention('filter_unshaped')} gives {mention('trainer_filter')} the rewards before the "
                "reward transforms: it "
                f"needs {mention('trainer_filter')} and a transform ({mention('overlong')}, "
                f"{mention('stop_properly')}, {mention('reward_bias')}, ...)"
            )
        if options.shapes_rewards and self.per_column:
            raise GrpoError(
                f"the reward transforms ({mention('overlong')}, {mention('stop_properly')}, "
                f"{mention('reward_bias')}/-scale/-clip) shape the "
                f"summed reward; {mention('reward_aggregation')} normalize-then-sum normalises each column "
                "first"
            )

    def check_recomputable(self, output: str) -> None:
        """Refuse to verify an ``output`` made with these options when its advantages cannot be
        recomputed from its own rows: a row filter after a step over the whole batch."""
        steps = self.batch_wide_steps()
        if steps and (self.drop_inactive or self.keep_mean_range is not None):
            row_filter = mention("drop_inactive" if self.drop_inactive else "keep_mean_range")
            raise GrpoError(
                f"{output} was filtered ({row_filter}) after a step over the whole batch ({steps[0]}): "
                "its advantages depend on rows it no longer holds and cannot be recomputed from it; "
                f"verify the unfiltered output, or check the input with {mention('verify_advantage_col')}"
            )

    @property
    def per_column(self) -> bool:
        """Whether each reward column is normalised on its own (normalize-then-sum, several columns)."""
        return self.aggregation == "normalize-then-sum" and len(self.rewards) > 1

    def batch_wide_steps(self) -> list[str]:
        """The options whose advantages depend on every row of a batch, not only the group's."""
        options = self.advantage
        steps = []
        if options.whiten != "none":
            steps.append(
                f"{mention('estimator')} {options.estimator}"
                if ESTIMATORS[options.estimator].whitens
                else f"{mention('whiten')} {options.whiten}"
            )
        if options.scale == "batch":
            steps.append(f"{mention('scale')} batch")
        if "batch_nonzero" in ESTIMATORS[options.estimator].needs:  # a factor of each batch
            steps.append(f"{mention('estimator')} {options.estimator}")
        if self.per_column and options.renormalize != "none":
            steps.append(f"the {options.renormalize} re-normalisation of normalize-then-sum")
        return steps

    @property
    def input_columns(self) -> list[str]:
        """The columns pass 1 reads: the rewards, the group keys, then the batch, length and
        baseline columns (without repeats)."""
        columns = [r.column for r in self.rewards]
        wanted = list(self.group_cols) if self.group_size is None else []
        wanted += [
            c
            for c in (self.batch_col, self.length_col, self.truncated_col, self.baseline_col, self.step_col)
            if c is not None
        ]
        wanted += list(self.by_cols)
        return columns + [c for c in dict.fromkeys(wanted) if c not in columns]

    @property
    def row_columns(self) -> list[str]:
        """The columns read again after pass 1, for each row's own value: the rewards and the
        length, truncation and baseline columns. The rest of :attr:`input_columns` (the group
        keys, the batch, step and ``--by`` columns) pass 1 turns into each group's figures."""
        per_row = {r.column for r in self.rewards} | {self.length_col, self.truncated_col, self.baseline_col}
        return [c for c in self.input_columns if c in per_row]

    @property
    def new_columns(self) -> list[str]:
        """The columns a run appends, in order."""
        cols = [self.advantage_col, self.active_col]
        if self.stats_cols:
            cols += [
                f"{self.advantage_col}_group_mean",
                f"{self.advantage_col}_group_std",
                f"{self.advantage_col}_group_size",
            ]
        return cols

    @classmethod
    def from_provenance(cls, record: dict[str, Any]) -> ComputeConfig:
        """The configuration a grpo-cli output was made with, from its provenance entry."""
        try:
            options = record.get("options") or {}
            if not isinstance(options, dict):
                raise TypeError(f"options is {type(options).__name__}, not an object")
            unknown = sorted(set(options) - set(ADVANTAGE_FIELDS) - set(_RECORDED))
            if unknown:
                raise GrpoError(
                    f"the recorded grpo-cli options hold {', '.join(unknown)}, which this grpo-cli "
                    f"({__version__}) does not know (recorded by grpo-cli {record.get('version')}); "
                    "verify with the grpo-cli that wrote it"
                )
            for key, row in _RECORDED.items():
                if key in options:
                    _check_recorded(key, options[key], row.kind)
            advantage = {k: v for k, v in options.items() if k in ADVANTAGE_FIELDS}
            if advantage.get("clip") is not None:
                advantage["clip"] = tuple(advantage["clip"])
            values = {
                row.name: _from_record(row.name, options[key])
                for key, row in _RECORDED.items()
                if key in options
            }
            config = replace(
                resolve_config(values, advantage=AdvantageOptions(**advantage)),
                group_cols=tuple(options.get("group_cols") or ()),
                group_size=options.get("group_size"),
            )
            config.validate()
            return config
        except GrpoError as exc:
            if exc.message.startswith("the recorded grpo-cli options"):
                raise
            raise GrpoError(f"the recorded grpo-cli options cannot be used ({exc.template})") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise GrpoError(f"the recorded grpo-cli options cannot be read ({exc!r})") from None

    def options_summary(self) -> dict[str, Any]:
        """Every option in force, after the preset: the summary's ``options`` and the provenance
        record (the advantage options by field, then each recorded configuration option)."""
        summary = {
            **self.advantage.as_dict(),
            **{key: _to_record(row.name, getattr(self, row.setting)) for key, row in _RECORDED.items()},
        }
        if self.group_size is not None:
            summary["group_cols"] = []  # the groups are blocks of rows, whatever the key columns say
        return summary

    def findings_options(self) -> dict[str, Any]:
        """What the grouping's findings read (:func:`grpo_cli.results.findings.findings_of`): the options
        in force, the step column the run watched and the trainer whose own grouping the key is
        (neither an option of its own, so neither in a provenance record)."""
        return {
            **self.options_summary(),
            "step_col": self.step_col,
            "grouping_of": self.grouping_of,
            "own_grouping": self.own_grouping,
        }


CONFIG_OPTIONS = declared(ComputeConfig, "config")
"""The options :class:`ComputeConfig`'s fields declare."""

_RECORDED = {row.record: row for row in CONFIG_OPTIONS if row.record is not None}
"""The options a provenance record holds besides the advantage options, by their key in it."""


def _check_recorded(key: str, value: Any, kind: Any) -> None:
    """Refuse a recorded option value of another type than its option's (a record edited by
    hand): ``group_cols`` as text would be read as one column per letter.

    >>> _check_recorded("group_cols", "g", list[str] | None)
    Traceback (most recent call last):
    ...
    grpo_cli.errors.GrpoError: the recorded grpo-cli options hold group_cols 'g', not a list of names
    """
    if key == "reward_cols":  # [{"column": NAME, "weight": NUMBER}, ...]
        if not (
            isinstance(value, list)
            and value
            and all(isinstance(r, dict) and isinstance(r.get("column"), str) for r in value)
        ):
            raise GrpoError(
                f"the recorded grpo-cli options hold reward_cols {value!r}, not a list of columns"
            )
        return
    if value is None and type(None) in typing.get_args(kind):
        return
    kinds = [k for k in typing.get_args(kind) if k is not type(None)] if typing.get_args(kind) else [kind]
    for expected in kinds:
        origin, args = typing.get_origin(expected), typing.get_args(expected)
        if origin is typing.Literal and value in args:
            return
        if origin in (list, tuple) and isinstance(value, list):
            inner = args[0] if args else str
            if all(_is_of(v, inner) for v in value) and (origin is list or len(value) == len(args)):
                return
        if origin is None and _is_of(value, expected):
            return
    shapes: dict[Any, str] = {
        list: "a list of names",
        tuple: "a pair of numbers",
        typing.Literal: "one of its choices",
    }
    scalars: dict[Any, str] = {str: "text", int: "a whole number", float: "a number", bool: "true or false"}
    what = shapes.get(typing.get_origin(kinds[0])) or scalars.get(kinds[0]) or "of its type"
    raise GrpoError(f"the recorded grpo-cli options hold {key} {value!r}, not {what}")


def _is_of(value: Any, kind: Any) -> bool:
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _to_record(name: str, value: Any) -> Any:
    if name == "reward_col":
        return [{"column": r.column, "weight": r.weight} for r in value]
    if name == "group_col":
        return list(value)
    if name == "keep_mean_range":
        return list(value) if value else None
    return value


def _from_record(name: str, value: Any) -> Any:
    if name == "reward_col":
        return [RewardSpec(r["column"], float(r["weight"])) for r in value]
    if name == "keep_mean_range" and value is not None:
        return (float(value[0]), float(value[1]))
    if name == "stats_cols" or name == "drop_inactive":
        return bool(value)
    return value


def _given(value: Any) -> bool:
    """Whether an option was given (Typer passes ``None`` for an option not on the command line)."""
    return value is not None


def resolve_config(
    values: Mapping[str, Any],
    *,
    recorded: ComputeConfig | None = None,
    verify: VerifySpec | None = None,
    advantage: AdvantageOptions | None = None,
    dump: Mapping[str, Any] | None = None,
) -> ComputeConfig:
    """The one translation of option values into a :class:`ComputeConfig`; the CLI, the table
    API and the provenance record all come through it.

    ``values``: by option name (:mod:`grpo_cli.options.catalog`); ``None`` (or absent) means not given.
    Precedence, lowest first: the configuration's defaults, the options ``recorded`` in an
    output's provenance (``check --verify``: the rows marked ``from_provenance``), the values a
    trainer's ``dump`` implies (``--from``: its reward, group key, step and preset), then
    ``preset``, ``estimator`` and each value given. ``reward_col``: ``NAME[:WEIGHT]`` texts or
    :class:`~grpo_cli.options.advantage.RewardSpec` objects. ``advantage``: options already resolved
    (a provenance record's), used as they are.

    >>> resolve_config({"reward_col": ["correct:0.5"], "group_size": 4, "std": "sample"}).rewards
    (RewardSpec(column='correct', weight=0.5),)
    >>> resolve_config({"group_size": 4, "group_col": ["prompt"]})
    Traceback (most recent call last):
    ...
    grpo_cli.errors.GrpoError: --group-size and --group-col cannot be used together
    """
    given = {name: value for name, value in values.items() if _given(value)}
    if given.get("group_size") is not None and given.get("group_col"):
        raise GrpoError(f"{mention('group_size')} and {mention('group_col')} cannot be used together")
    grouping: dict[str, Any] = {}
    if dump is not None:
        implied = {name: value for name, value in dump.items() if _given(value)}
        # the trainer whose dump it is, and whether the key is its own grouping
        grouping = {name: implied.pop(name) for name in ("grouping_of", "own_grouping") if name in implied}
        if "group_col" in given or "group_size" in given:
            implied.pop("group_col", None)
            implied.pop("group_size", None)
            grouping = {}  # a key of the user's
        given = {**implied, **given}
    if recorded is not None:
        inherited = {
            row.name: getattr(recorded, row.setting) for row in CONFIG_OPTIONS if row.from_provenance
        }
        if "group_col" in given or "group_size" in given:
            del inherited["group_col"], inherited["group_size"]
        given = {**{k: v for k, v in inherited.items() if _given(v)}, **given}
    if advantage is None:
        explicit = {
            row.setting: given.get(row.name)
            for row in ADVANTAGE_FIELDS.values()
            if row.name not in ("preset", "estimator")
        }
        whiten = explicit.pop("whiten")
        advantage = AdvantageOptions.resolve(
            base=None if recorded is None else recorded.advantage,
            preset=given.get("preset"),
            estimator=given.get("estimator"),
            whiten=(whitening_of_flag(given.get("preset")) if whiten else None)
            if isinstance(whiten, bool)
            else whiten,
            **explicit,
        )
    settings = {row.setting: given[row.name] for row in CONFIG_OPTIONS if row.name in given}
    if "rewards" in settings:
        rewards = settings["rewards"]
        settings["rewards"] = tuple(
            RewardSpec.parse(r) if isinstance(r, str) else r
            for r in ((rewards,) if isinstance(rewards, str | RewardSpec) else rewards)
        )
    if "group_size" in settings:
        settings["group_cols"] = ()
    if "memory_budget_bytes" in settings:
        settings["memory_budget_bytes"] = int(settings["memory_budget_bytes"]) << 20
    return ComputeConfig(**settings, advantage=advantage, verify=verify, **grouping)
