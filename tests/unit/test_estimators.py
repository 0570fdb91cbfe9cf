"""The estimator registry: one object per ``--estimator``, read by the options and by both
engines' steps through the plan (an estimator's steps are what a run computes)."""

from __future__ import annotations

import dataclasses
from typing import Any, get_args

import pyarrow as pa
import pytest
import torch

from grpo_cli import estimators
from grpo_cli.choices import Estimator, choices_of
from grpo_cli.estimators import ESTIMATORS, AdvantageEstimator, GroupFacts, Need, RowFacts
from grpo_cli.jobs import compute_table
from grpo_cli.options.advantage import AdvantageOptions, RewardSpec
from grpo_cli.options.config import ComputeConfig


def test_the_registry_holds_every_estimator_choice_once() -> None:
    assert sorted(ESTIMATORS) == sorted(choices_of(Estimator))
    assert all(name == estimator.name for name, estimator in ESTIMATORS.items())


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_each_estimators_settings_are_options_it_resolves_to(name: str) -> None:
    estimator = ESTIMATORS[name]
    fields = {field.name for field in dataclasses.fields(AdvantageOptions)}
    assert set(estimator.settings) <= fields
    assert set(estimator.needs) <= set(get_args(Need))
    taken = {option: 2 for option in estimator.takes}
    options = AdvantageOptions.resolve(estimator=name, **taken)
    assert {key: getattr(options, key) for key in estimator.settings} == dict(estimator.settings)


class _RewardTimesGroupSize(AdvantageEstimator):
    """A made-up estimator: each row's advantage is its reward times its group's row count,
    from a between-passes step and a per-row step."""

    def between_passes(self, facts: GroupFacts) -> torch.Tensor:
        return torch.from_numpy(facts.figures["rows"]).to(torch.float64)

    def per_row(self, state: Any, rows: RowFacts) -> torch.Tensor:
        scale: torch.Tensor = state[rows.ids]
        return rows.rewards.combined.to(torch.float64) * scale


def test_a_run_computes_what_the_registered_objects_steps_say(monkeypatch: pytest.MonkeyPatch) -> None:
    """Swapping the object registered under a name changes what every run under that name
    computes: no engine or plan holds an estimator's math of its own."""
    made_up = _RewardTimesGroupSize("dr_grpo", {"baseline": "mean", "scale": "none"}, "made up", "made up")
    monkeypatch.setitem(estimators.ESTIMATORS, "dr_grpo", made_up)
    table = pa.table({"group_id": [0, 0, 0, 1, 1], "reward": [1.0, 2.0, 3.0, 0.5, 0.5]})
    config = ComputeConfig(
        rewards=(RewardSpec("reward"),),
        group_cols=("group_id",),
        advantage=AdvantageOptions.resolve(estimator="dr_grpo"),
    )
    result = compute_table(table, config)
    assert result.column("advantage").to_pylist() == [3.0, 6.0, 9.0, 1.0, 1.0]
