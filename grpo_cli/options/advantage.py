"""Advantage options, trainer presets and reward specs (plain data, no torch).

Resolution order, lowest first: grpo-cli's defaults, the ``preset``, the ``estimator``,
then every option given explicitly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from grpo_cli.choices import (
    Baseline,
    EpsilonMode,
    Estimator,
    NanPolicy,
    OverlongStyle,
    Preset,
    Renormalize,
    RewardSum,
    Scale,
    Singleton,
    Std,
    Whiten,
    check_choice,
)
from grpo_cli.errors import GrpoError, mention
from grpo_cli.estimators import ESTIMATORS
from grpo_cli.options.declare import SHAPING, Option, declared, option

if TYPE_CHECKING:
    from torch import Tensor

    from grpo_cli.estimators import AdvantageEstimator
    from grpo_cli.kernel import GroupStats, Normalization


@dataclass(frozen=True)
class AdvantageOptions:
    """How advantages are computed; every field maps to one CLI option.

    >>> AdvantageOptions.resolve(preset="trl").epsilon
    0.0001
    >>> AdvantageOptions.resolve(preset="trl", epsilon=1e-3).epsilon
    0.001
    """

    preset: Preset | None = option(
        None,
        "--preset",
        help="Reproduce a trainer's GRPO convention; explicit options override it.",
        envvar="GRPO_CLI_PRESET",
    )
    estimator: Estimator = option(
        "grpo",
        "--estimator",
        help="; ".join(estimator.help for estimator in ESTIMATORS.values()) + ". See the README's table.",
    )
    epsilon: float = option(1e-6, "--epsilon", help="Added to the std.", positive_finite=True, metavar="EPS")
    std: Std = option("population", "--std", help="population (divide by n) or sample (n - 1).")
    scale: Scale = option(
        "group", "--scale", help="Divide by the group std, the batch std, the group mean (MaxRL), or nothing."
    )
    baseline: Baseline = option(
        "mean",
        help="mean: the group's mean; leave-one-out: the mean of the group's other rollouts.",
        commands=(),
    )
    epsilon_mode: EpsilonMode = option(
        "add",
        "--epsilon-mode",
        help="add: std + eps; clamp: max(std, eps); add-if-nonzero: divide only where std > 0.",
    )
    singleton: Singleton = option(
        "zero", "--singleton", help="One-rollout groups: zero, or raw (r / (1 + eps), verl)."
    )
    nan: NanPolicy = option(
        "error",
        "--nan",
        help="Null, NaN or infinite rewards: error, or ignore (left out of the statistics, advantage 0).",
    )
    whiten: Whiten = option(
        "none",
        "--whiten",
        help="Whiten the advantages over each batch as verl's masked_whiten and ROLL do: "
        "(A - mean) * rsqrt(unbiased var + 1e-8); under --preset trl-rloo, RLOOTrainer's "
        "normalize_advantages: (A - mean) / (sample std over rows + 1e-4).",
        kind=bool,
        values=Whiten,
    )
    renormalize: Renormalize = option(
        "none",
        help="The batch re-normalisation of normalize-then-sum (set by the trl and nemo-rl presets).",
        commands=(),
        keyword=False,
    )
    clip: tuple[float, float] | None = option(
        None,
        "--clip-advantage",
        name="clip_advantage",
        help="Clamp the final advantages to [LO, HI] (ROLL's advantage_clip, NeMo-RL's "
        "advantage_clip_low/high).",
        metavar="LO HI",
    )
    inactive_tolerance: float = option(
        0.0,
        "--inactive-tolerance",
        help="A group whose rewards span at most T (max - min <= T) is inactive and gets advantage 0, as "
        "a constant group does (LLM-judge rewards; SkyRL 1e-6). The summary counts the groups it made "
        "inactive beyond the exact rule.",
        metavar="T",
        shown="0: exact",
    )
    pass_k: int | None = option(
        None,
        "--pass-k",
        help="With --estimator pass_at_k: the k of pass@k, clamped to each group's size (k = 1 is the "
        "mean-centred reward over n).",
        metavar="K",
    )
    gpg_f_norm: float = option(
        1.0,
        "--gpg-f-norm",
        help="With --estimator gpg: the divisor f_norm.",
        positive_finite=True,
        metavar="F",
    )
    reward_sum: RewardSum = option(
        "sum",
        help="How several reward columns are added up (set by the trl preset: nansum).",
        commands=(),
        keyword=False,
    )
    overlong: tuple[float, float] | None = option(  # DAPO's penalty
        None,
        "--overlong",
        help="DAPO's overlong penalty before the estimator: a response beyond MAX_TOKENS - BUFFER tokens "
        "(--length-col) loses (length - (MAX_TOKENS - BUFFER)) / BUFFER * --overlong-factor.",
        panel=SHAPING,
        metavar="MAX_TOKENS BUFFER",
    )
    overlong_factor: float = option(
        1.0,
        "--overlong-factor",
        help="The largest overlong penalty (OpenRLHF's overlong_penalty_factor, NeMo-RL's "
        "overlong_buffer_penalty).",
        panel=SHAPING,
        metavar="F",
    )
    overlong_style: OverlongStyle = option(
        "capped",
        "--overlong-style",
        help="capped: the excess stops at BUFFER, so the penalty at --overlong-factor (OpenRLHF, the DAPO "
        "paper); uncapped: it keeps growing past MAX_TOKENS (NeMo-RL's apply_reward_shaping).",
        panel=SHAPING,
    )
    stop_properly: float | None = option(
        None,
        "--stop-properly",
        help="ProRL's penalty on a truncated rollout (--truncated-col): C in [0, 1] multiplies its reward "
        "(NeMo-RL, OpenRLHF); a negative C is its reward (OpenRLHF).",
        panel=SHAPING,
        metavar="C",
    )
    reward_bias: float = option(
        0.0,
        "--reward-bias",
        help="Add B to every reward, before --reward-scale (AReaL's reward_bias).",
        panel=SHAPING,
        metavar="B",
    )
    reward_scale: float = option(
        1.0,
        "--reward-scale",
        help="Multiply every reward by S, after --reward-bias (AReaL's reward_scaling).",
        panel=SHAPING,
        metavar="S",
    )
    reward_clip: tuple[float, float] | None = option(
        None,
        "--reward-clip",
        help="Clamp every reward to [LO, HI] before the estimator, after the other transforms (TRL RLOO's "
        "reward_clip_range, AReaL's reward_clip).",
        panel=SHAPING,
        metavar="LO HI",
    )

    @classmethod
    def resolve(
        cls,
        *,
        preset: Preset | None = None,
        estimator: Estimator | None = None,
        base: AdvantageOptions | None = None,
        **explicit: Any,
    ) -> AdvantageOptions:
        """Defaults (or ``base``), then ``preset``, then ``estimator``, then options not ``None``.

        ``base`` (options recorded in an output's provenance) replaces the defaults unless a
        ``preset`` is given, which starts again from the defaults.
        """
        options = base if base is not None and preset is None else cls()
        if preset is not None:
            if preset not in PRESETS:
                raise GrpoError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
            options = replace(options, preset=preset, **PRESETS[preset].settings)
        if estimator is not None:
            check_choice(mention("estimator"), estimator, Estimator)
            options = replace(options, estimator=estimator, **ESTIMATORS[estimator].settings)
        unknown = set(explicit) - {f.name for f in fields(cls)}
        if unknown:
            raise GrpoError(f"unknown advantage option(s): {', '.join(sorted(unknown))}")
        options = replace(options, **{k: v for k, v in explicit.items() if v is not None})
        options.validate()
        return options

    def validate(self) -> None:
        """Each field against the option it declares, then the rules between them."""
        for field in fields(self):
            row, value = ADVANTAGE_FIELDS[field.name], getattr(self, field.name)
            if value is None and field.default is None:
                continue
            if row.vocabulary is not None:
                check_choice(row.label, value, row.vocabulary)
            if row.positive_finite and not (_is_number(value) and math.isfinite(value) and value > 0):
                raise GrpoError(f"{row.label} must be a positive finite number, got {value!r}")
        for label, pair in (
            (mention("clip_advantage"), self.clip),
            (mention("reward_clip"), self.reward_clip),
        ):
            if pair is not None:
                if len(pair) != 2 or not all(_is_number(v) for v in pair):
                    raise GrpoError(f"{label} needs two numbers LO HI, got {pair!r}")
                low, high = pair
                if not (math.isfinite(low) and math.isfinite(high) and low <= high):
                    raise GrpoError(f"{label} needs finite LO <= HI, got {low} {high}")
        self._validate_shaping()
        tolerance = self.inactive_tolerance
        if not (_is_number(tolerance) and math.isfinite(tolerance) and tolerance >= 0):
            raise GrpoError(
                f"{mention('inactive_tolerance')} must be a finite number >= 0, got {tolerance!r}"
            )
        estimator = ESTIMATORS[self.estimator]
        if tolerance > 0 and estimator.own_baseline:
            raise GrpoError(
                f"{mention('inactive_tolerance')} zeroes a group's normalised rewards; "
                f"{mention('estimator')} {self.estimator} "
                "subtracts a baseline of its own: leave the tolerance at 0"
            )
        self._validate_taken(estimator)
        if estimator.own_baseline and self.baseline != "mean":
            raise GrpoError(
                f"{mention('estimator')} {self.estimator} subtracts its own baseline; leave --baseline as "
                "mean"
            )

    def _validate_taken(self, estimator: AdvantageEstimator) -> None:
        """The options only some estimator reads: given with it, and only with it."""
        for name, row in ADVANTAGE_FIELDS.items():
            owners = [other for other in ESTIMATORS.values() if name in other.takes]
            if not owners:
                continue
            value = getattr(self, name)
            if name in estimator.takes:
                if value is None:
                    raise GrpoError(
                        f"{mention('estimator')} {estimator.name} needs {row.label} {row.metavar or 'VALUE'} "
                        f"({estimator.takes[name]})"
                    )
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise GrpoError(f"{row.label} must be a whole number >= 1, got {value!r}")
            elif value is not None:
                what = (row.metavar or "value").lower()
                raise GrpoError(
                    f"{row.label} {value} is the {what} of {mention('estimator')} {owners[0].name}; "
                    f"{mention('estimator')} {self.estimator} has none"
                )

    def _validate_shaping(self) -> None:
        """The reward transforms' values, as the trainers assert them."""
        for label, value in (
            (mention("reward_bias"), self.reward_bias),
            (mention("reward_scale"), self.reward_scale),
        ):
            if not (_is_number(value) and math.isfinite(value)):
                raise GrpoError(f"{label} must be a finite number, got {value!r}")
        if self.overlong is not None:
            if len(self.overlong) != 2 or not all(_is_number(v) for v in self.overlong):
                raise GrpoError(
                    f"{mention('overlong')} needs two numbers MAX_TOKENS BUFFER, got {self.overlong!r}"
                )
            max_tokens, buffer = self.overlong
            if not (math.isfinite(max_tokens) and math.isfinite(buffer) and 0 < buffer <= max_tokens):
                raise GrpoError(
                    f"{mention('overlong')} needs 0 < BUFFER <= MAX_TOKENS (the penalty ramps over the last "
                    "BUFFER "
                    f"tokens), got {max_tokens:g} {buffer:g}"
                )
        factor = self.overlong_factor
        if not (_is_number(factor) and math.isfinite(factor) and factor >= 0):
            raise GrpoError(f"{mention('overlong_factor')} must be a finite number >= 0, got {factor!r}")
        coef = self.stop_properly
        if coef is not None and not (_is_number(coef) and math.isfinite(coef) and coef <= 1):
            raise GrpoError(
                f"{mention('stop_properly')} must be in [0, 1] (a factor on a truncated rollout's reward) or "
                f"negative (its reward, OpenRLHF's), got {coef!r}"
            )

    @property
    def shapes_rewards(self) -> bool:
        """Whether a reward transform applies before the estimator."""
        return (
            self.overlong is not None
            or self.stop_properly is not None
            or self.reward_bias != 0.0
            or self.reward_scale != 1.0
            or self.reward_clip is not None
        )

    def shape(self, rewards: Tensor, *, lengths: Tensor | None, truncated: Tensor | None) -> Tensor:
        """The rewards after this run's transforms (:func:`~grpo_cli.kernel.shaped_rewards`)."""
        from grpo_cli.kernel import shaped_rewards

        return shaped_rewards(
            rewards,
            lengths=lengths,
            truncated=truncated,
            overlong=self.overlong,
            overlong_factor=self.overlong_factor,
            overlong_capped=self.overlong_style == "capped",
            stop_properly=self.stop_properly,
            bias=self.reward_bias,
            scale=self.reward_scale,
            clip=self.reward_clip,
        )

    def normalization(self, stats: GroupStats, *, batch_std: Tensor | None = None) -> Normalization:
        """The kernel's :class:`~grpo_cli.kernel.Normalization` of ``stats`` under these options.

        ``batch_std``: with ``scale="batch"``, the std of each group's batch, shape
        ``(num_groups,)`` (default: the std of every reward in ``stats``).
        """
        from grpo_cli.kernel import prepare_normalization

        return prepare_normalization(
            stats,
            epsilon=self.epsilon,
            std=self.std,
            scale=self.scale,
            baseline=self.baseline,
            epsilon_mode=self.epsilon_mode,
            singleton=self.singleton,
            batch_std=batch_std,
            inactive_tolerance=self.inactive_tolerance,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


ADVANTAGE_FIELDS: dict[str, Option] = {row.setting: row for row in declared(AdvantageOptions, "advantage")}
"""The options :class:`AdvantageOptions`' fields declare, by field (``clip``, not ``clip_advantage``)."""


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class TrainerPreset:
    """A trainer's GRPO convention, as read in its source."""

    settings: dict[str, Any]
    source: str
    note: str
    whiten_flag: Whiten = "unbiased"  # what --whiten means under this preset


def whitening_of_flag(preset: str | None) -> Whiten:
    """The whitening ``--whiten`` asks for: verl's masked_whiten, or the preset's trainer's own."""
    return PRESETS[preset].whiten_flag if preset in PRESETS else "unbiased"


PRESETS: dict[str, TrainerPreset] = {
    "trl": TrainerPreset(
        {
            "std": "sample",
            "epsilon": 1e-4,
            "epsilon_mode": "add",
            "nan": "ignore",
            "renormalize": "trl",
            "reward_sum": "nansum",
        },
        "trl/trainer/grpo_trainer.py, GRPOTrainer._generate_and_score_completions (TRL 0.2x)",
        "(r - mean) / (std + 1e-4), torch.std (Bessel); scale_rewards group|batch|none = --scale; "
        "several reward columns are summed with nansum (a null counts as 0; a row is left out of "
        "the statistics only when every column is null)",
    ),
    "trl-rloo": TrainerPreset(
        {"baseline": "leave-one-out", "scale": "none", "nan": "ignore", "reward_sum": "nansum"},
        "trl/trainer/rloo_trainer.py, RLOOTrainer._generate_and_score_completions",
        "r - the nan-aware mean of the group's other scorable rewards (a group with one scorable "
        "rollout: 0); reward functions summed with nansum, a row left out only when every one is null; "
        "--whiten is its normalize_advantages: (A - nanmean) / (nanstd + 1e-4) over the batch's rows",
        whiten_flag="trl-rloo",
    ),
    "verl": TrainerPreset(
        {"std": "sample", "epsilon": 1e-6, "epsilon_mode": "add", "singleton": "raw"},
        "verl/trainer/ppo/core_algos.py, compute_grpo_outcome_advantage",
        "(r - mean) / (std + 1e-6), torch.std; a one-rollout group uses mean 0, std 1; "
        "norm_adv_by_std_in_grpo=False = --scale none",
    ),
    "openrlhf": TrainerPreset(
        {"std": "sample", "epsilon": 1e-9, "epsilon_mode": "add"},
        "openrlhf/trainer/ppo_utils/experience_maker.py, advantage_estimator group_norm / dr_grpo",
        "(r - mean) / (std + 1e-9), torch.std; dr_grpo = --estimator dr_grpo",
    ),
    "nemo-rl": TrainerPreset(
        {
            "baseline": "leave-one-out",
            "std": "sample",
            "epsilon": 1e-6,
            "epsilon_mode": "add-if-nonzero",
            "renormalize": "gdpo",
        },
        "nemo_rl/algorithms/utils.py, calculate_baseline_and_std_per_prompt; nemo_rl/algorithms/grpo.py",
        "leave-one-out baseline, sample std over the same other rollouts, + 1e-6 only where std > 0; "
        "a group with one valid rollout gets 0",
    ),
    "areal": TrainerPreset(
        {
            "std": "sample",
            "epsilon": 1e-5,
            "epsilon_mode": "add",
            "whiten": "areal",
            "reward_clip": (-20.0, 20.0),
        },
        "areal/utils/data.py, Normalization (reward_norm: group mean and std; adv_norm: batch), "
        "as examples/math/gsm8k_grpo.yaml configures them; areal/trainer/ppo/actor.py",
        "rewards clipped to +-20 (reward_clip), then (r - mean) / (sample std + 1e-5) per group, float64, "
        "then the advantages whitened over the batch: (A - mean) / (unbiased std + 1e-5), token-weighted "
        "with --length-col (AReaL's loss mask)",
    ),
    "roll": TrainerPreset(
        {"std": "sample", "epsilon": 1e-6, "epsilon_mode": "add"},
        "roll/utils/functionals.py, reward_norm / compute_advantage (grpo)",
        "(r - mean) / (std + 1e-6), torch.std",
    ),
    "torchrl": TrainerPreset(
        {"std": "sample", "epsilon": 1e-6, "epsilon_mode": "clamp"},
        "torchrl/objectives/llm/grpo.py, MCAdvantage",
        "(r - mean) / std.clamp_min(1e-6), torch.std",
    ),
    "slime": TrainerPreset(
        {"std": "sample", "epsilon": 1e-6, "epsilon_mode": "add"},
        "slime/ray/rollout.py, RolloutManager._post_process_rewards (grpo, rewards_normalization)",
        "(r - mean) / (std + 1e-6), torch.std, float32; --grpo-std-normalization off = --scale none; "
        "groups are consecutive blocks of n_samples_per_prompt, and a batch whose groups are uneven "
        "is normalised as one group (rewards.view(-1, N)), which grpo-cli does not reproduce (check "
        "--trainer-filter slime-fallback reports it)",
    ),
}


@dataclass(frozen=True)
class RewardSpec:
    """One reward column and its weight in the combined reward.

    >>> RewardSpec.parse("correct:0.5")
    RewardSpec(column='correct', weight=0.5)
    >>> RewardSpec.parse("reward")
    RewardSpec(column='reward', weight=1.0)
    """

    column: str
    weight: float = 1.0

    @classmethod
    def parse(cls, text: str) -> RewardSpec:
        name, sep, weight = text.rpartition(":")
        if not sep:
            return cls(text)
        try:
            value = float(weight)
        except ValueError:
            # A colon that is part of the column name, not a weight.
            return cls(text)
        if not math.isfinite(value):
            raise GrpoError(f"{mention('reward_col')} {text!r}: the weight must be a finite number")
        if not name:
            raise GrpoError(f"{mention('reward_col')} {text!r}: a column name is needed before ':'")
        return cls(name, value)
