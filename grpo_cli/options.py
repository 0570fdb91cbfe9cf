"""Advantage options, trainer presets and reward specs (plain data, no torch).

Resolution order, lowest first: grpo-cli's defaults, the ``preset``, the ``estimator``,
then every option given explicitly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

from grpo_cli.errors import GrpoError

Estimator = Literal["grpo", "dr_grpo", "rloo"]
NanPolicy = Literal["error", "ignore"]
Aggregation = Literal["sum-then-normalize", "normalize-then-sum"]

STD_CHOICES = ("population", "sample")
SCALE_CHOICES = ("group", "batch", "none")
BASELINE_CHOICES = ("mean", "leave-one-out")
EPSILON_MODE_CHOICES = ("add", "clamp", "add-if-nonzero")
SINGLETON_CHOICES = ("zero", "raw")
ESTIMATOR_CHOICES = ("grpo", "dr_grpo", "rloo")
NAN_CHOICES = ("error", "ignore")
AGGREGATION_CHOICES = ("sum-then-normalize", "normalize-then-sum")


@dataclass(frozen=True)
class AdvantageOptions:
    """How advantages are computed; every field maps to one CLI option.

    >>> AdvantageOptions.resolve(preset="trl").epsilon
    0.0001
    >>> AdvantageOptions.resolve(preset="trl", epsilon=1e-3).epsilon
    0.001
    """

    epsilon: float = 1e-6
    std: str = "population"
    scale: str = "group"
    baseline: str = "mean"
    epsilon_mode: str = "add"
    singleton: str = "zero"
    nan: str = "error"
    estimator: str = "grpo"
    preset: str | None = None

    @classmethod
    def resolve(
        cls, *, preset: str | None = None, estimator: str | None = None, **explicit: Any
    ) -> AdvantageOptions:
        """Defaults, then ``preset``, then ``estimator``, then options not ``None``."""
        options = cls()
        if preset is not None:
            if preset not in PRESETS:
                raise GrpoError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
            options = replace(options, preset=preset, **PRESETS[preset].settings)
        if estimator is not None:
            if estimator not in ESTIMATOR_CHOICES:
                raise GrpoError(f"estimator must be one of {', '.join(ESTIMATOR_CHOICES)}, got {estimator!r}")
            options = replace(options, estimator=estimator, **ESTIMATORS[estimator])  # type: ignore[arg-type]
        unknown = set(explicit) - {f.name for f in fields(cls)}
        if unknown:
            raise GrpoError(f"unknown advantage option(s): {', '.join(sorted(unknown))}")
        options = replace(options, **{k: v for k, v in explicit.items() if v is not None})
        options.validate()
        return options

    def validate(self) -> None:
        if isinstance(self.epsilon, bool) or not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise GrpoError(f"--epsilon must be a positive finite number, got {self.epsilon!r}")
        for name, value, choices in (
            ("std", self.std, STD_CHOICES),
            ("scale", self.scale, SCALE_CHOICES),
            ("baseline", self.baseline, BASELINE_CHOICES),
            ("epsilon-mode", self.epsilon_mode, EPSILON_MODE_CHOICES),
            ("singleton", self.singleton, SINGLETON_CHOICES),
            ("nan", self.nan, NAN_CHOICES),
        ):
            if value not in choices:
                raise GrpoError(f"--{name} must be one of {', '.join(choices)}, got {value!r}")

    def kernel_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`grpo_cli.kernel.advantages_from_stats`."""
        return {
            "epsilon": self.epsilon,
            "std": self.std,
            "scale": self.scale,
            "baseline": self.baseline,
            "epsilon_mode": self.epsilon_mode,
            "singleton": self.singleton,
        }

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


ESTIMATORS: dict[str, dict[str, str]] = {
    "grpo": {"baseline": "mean"},
    "dr_grpo": {"baseline": "mean", "scale": "none"},
    "rloo": {"baseline": "leave-one-out", "scale": "none"},
}


@dataclass(frozen=True)
class Preset:
    """A trainer's GRPO convention, as read in its source."""

    settings: dict[str, Any]
    source: str
    note: str


PRESETS: dict[str, Preset] = {
    "trl": Preset(
        {"std": "sample", "epsilon": 1e-4, "epsilon_mode": "add", "nan": "ignore"},
        "trl/trainer/grpo_trainer.py, GRPOTrainer._generate_and_score_completions (TRL 0.2x)",
        "(r - mean) / (std + 1e-4), torch.std (Bessel); scale_rewards group|batch|none = --scale; "
        "NaN rewards left out of the statistics",
    ),
    "verl": Preset(
        {"std": "sample", "epsilon": 1e-6, "epsilon_mode": "add", "singleton": "raw"},
        "verl/trainer/ppo/core_algos.py, compute_grpo_outcome_advantage",
        "(r - mean) / (std + 1e-6), torch.std; a one-rollout group uses mean 0, std 1; "
        "norm_adv_by_std_in_grpo=False = --scale none",
    ),
    "openrlhf": Preset(
        {"std": "sample", "epsilon": 1e-9, "epsilon_mode": "add"},
        "openrlhf/trainer/ppo_utils/experience_maker.py, advantage_estimator group_norm / dr_grpo",
        "(r - mean) / (std + 1e-9), torch.std; dr_grpo = --estimator dr_grpo",
    ),
    "nemo-rl": Preset(
        {
            "baseline": "leave-one-out",
            "std": "sample",
            "epsilon": 1e-6,
            "epsilon_mode": "add-if-nonzero",
        },
        "nemo_rl/algorithms/utils.py, calculate_baseline_and_std_per_prompt; nemo_rl/algorithms/grpo.py",
        "leave-one-out baseline, sample std over the same other rollouts, + 1e-6 only where std > 0; "
        "a group with one valid rollout gets 0",
    ),
    "roll": Preset(
        {"std": "sample", "epsilon": 1e-6, "epsilon_mode": "add"},
        "roll/utils/functionals.py, reward_norm / compute_advantage (grpo)",
        "(r - mean) / (std + 1e-6), torch.std",
    ),
    "torchrl": Preset(
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
