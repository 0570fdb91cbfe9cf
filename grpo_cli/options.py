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
    Preset,
    Renormalize,
    RewardSum,
    Scale,
    Singleton,
    Std,
    Whiten,
    check_choice,
)
from grpo_cli.errors import GrpoError
from grpo_cli.option_table import ADVANTAGE_FIELDS

if TYPE_CHECKING:
    from torch import Tensor

    from grpo_cli.kernel import GroupStats, Normalization


@dataclass(frozen=True)
class AdvantageOptions:
    """How advantages are computed; every field maps to one CLI option.

    >>> AdvantageOptions.resolve(preset="trl").epsilon
    0.0001
    >>> AdvantageOptions.resolve(preset="trl", epsilon=1e-3).epsilon
    0.001
    """

    epsilon: float = 1e-6
    std: Std = "population"
    scale: Scale = "group"
    baseline: Baseline = "mean"
    epsilon_mode: EpsilonMode = "add"
    singleton: Singleton = "zero"
    nan: NanPolicy = "error"
    estimator: Estimator = "grpo"
    whiten: Whiten = "none"
    renormalize: Renormalize = "none"
    clip: tuple[float, float] | None = None
    gpg_f_norm: float = 1.0
    reward_sum: RewardSum = "sum"
    preset: Preset | None = None

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
            check_choice("--estimator", estimator, Estimator)
            options = replace(options, estimator=estimator, **ESTIMATORS[estimator])
        unknown = set(explicit) - {f.name for f in fields(cls)}
        if unknown:
            raise GrpoError(f"unknown advantage option(s): {', '.join(sorted(unknown))}")
        options = replace(options, **{k: v for k, v in explicit.items() if v is not None})
        options.validate()
        return options

    def validate(self) -> None:
        """Each field against its row in :mod:`grpo_cli.option_table`, then the rules between them."""
        for field in fields(self):
            row, value = ADVANTAGE_FIELDS[field.name], getattr(self, field.name)
            if value is None and field.default is None:
                continue
            if row.vocabulary is not None:
                check_choice(row.label, value, row.vocabulary)
            if row.positive_finite and not (_is_number(value) and math.isfinite(value) and value > 0):
                raise GrpoError(f"{row.label} must be a positive finite number, got {value!r}")
        if self.clip is not None:
            if len(self.clip) != 2 or not all(_is_number(v) for v in self.clip):
                raise GrpoError(f"--clip-advantage needs two numbers LO HI, got {self.clip!r}")
            low, high = self.clip
            if not (math.isfinite(low) and math.isfinite(high) and low <= high):
                raise GrpoError(f"--clip-advantage needs finite LO <= HI, got {low} {high}")
        if self.estimator in ROW_BASELINE_ESTIMATORS and self.baseline != "mean":
            raise GrpoError(
                f"--estimator {self.estimator} subtracts its own baseline; leave --baseline as mean"
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
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


ESTIMATORS: dict[str, dict[str, Any]] = {
    "grpo": {"baseline": "mean"},
    "dr_grpo": {"baseline": "mean", "scale": "none"},
    "rloo": {"baseline": "leave-one-out", "scale": "none"},
    # verl: r - group mean (a singleton's mean is 0), then masked_whiten over the batch
    "reinforce_plus_plus_baseline": {
        "baseline": "mean",
        "scale": "none",
        "singleton": "raw",
        "whiten": "unbiased",
    },
    # OpenRLHF: r - group mean, then its advantage whitening over the batch (population)
    "reinforce_baseline": {"baseline": "mean", "scale": "none", "singleton": "zero", "whiten": "population"},
    # verl: alpha * (r - group mean) / f_norm, alpha = batch rows / rows with a non-zero reward
    "gpg": {"baseline": "mean", "scale": "none", "singleton": "raw"},
    # verl: r - the row's own baseline (--baseline-col, the greedy rollout's reward)
    "remax": {"baseline": "mean", "scale": "none"},
    # verl: r - the length-weighted mean reward of the group (--length-col); a singleton's is 0
    "opo": {"baseline": "mean", "scale": "none", "singleton": "raw"},
    # verl Pass@k: only a group's best rollout gets (r_max - r_second) / (sample std + eps)
    "grpo_passk": {"baseline": "mean", "std": "sample"},
}
"""What each estimator sets; options given explicitly override it."""

ESTIMATOR_NEEDS: dict[str, str] = {
    "reinforce_plus_plus_baseline": "a whitening over the whole batch (weighted by length_col=)",
    "reinforce_baseline": "a whitening over the whole batch (weighted by length_col=)",
    "gpg": "the batch's count of non-zero rewards for its alpha (per batch_col=)",
    "remax": "each row's baseline reward (baseline_col=)",
    "opo": "each row's response length (length_col=)",
    "grpo_passk": "each group's first best rollout, in row order",
}
"""What an estimator needs beyond a reward and a group per row: the tensor API takes neither,
so it refuses these (``add_advantages`` and the CLI compute them)."""

ROW_BASELINE_ESTIMATORS = ("remax", "opo", "grpo_passk")
"""Estimators whose baseline is a per-row column rather than the group's rewards."""


@dataclass(frozen=True)
class TrainerPreset:
    """A trainer's GRPO convention, as read in its source."""

    settings: dict[str, Any]
    source: str
    note: str


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
            raise GrpoError(f"--reward-col {text!r}: the weight must be a finite number")
        if not name:
            raise GrpoError(f"--reward-col {text!r}: a column name is needed before ':'")
        return cls(name, value)
