"""``--estimator reinforce``: the raw reward, no baseline, whitened over the batch's tokens.

Against the trainers' own code, cut verbatim and run: NeMo-RL ``RawRewardAdvantageEstimator``
with ``normalize_advantages`` and OpenRLHF's advantage normalisation for ``reinforce``
(population variance, ``rsqrt(max(var, 1e-8))``, over the response tokens), and, with
``--whiten``, verl's ``compute_reinforce_plus_plus_outcome_advantage`` at gamma 1 (its
``masked_whiten``: unbiased variance, ``rsqrt(var + 1e-8)``). A constant group carries its
reward's offset from the batch mean: no group is zeroed.
"""

from __future__ import annotations

import random
import types
from typing import Any

import pyarrow as pa
import pytest
import torch

from grpo_cli import add_advantages
from tests.trainer_source import NEMO_RL, _cut, _function, _method, source

OPENRLHF = ("OpenRLHF/OpenRLHF", "3c3be6234e0cb353e76bb8019947db9dfe99fca7")
VERL = ("verl-project/verl", "1dda039b9c6311889a9c9a26040677e1254814f9")


def rollouts(seed: int, prompts: int = 50, n: int = 4) -> tuple[list[float], list[int], torch.Tensor]:
    """float32 rewards (binary, partial, constant groups), response lengths, the token mask."""
    rng = random.Random(seed)
    rewards: list[float] = []
    for _ in range(prompts):
        if rng.random() < 0.3:
            rewards += [rng.choice((0.0, 1.0))] * n
        else:
            rewards += [
                float(torch.tensor(rng.choice((0.0, 0.2, 0.5, 1.0)), dtype=torch.float32)) for _ in range(n)
            ]
    lengths = [rng.randint(1, 24) for _ in rewards]
    mask = torch.zeros(len(rewards), max(lengths))
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    return rewards, lengths, mask


def ours(rewards: list[float], lengths: list[int], n: int = 4, **options: Any) -> torch.Tensor:
    table = pa.table(
        {
            "group_id": [row // n for row in range(len(rewards))],
            "reward": pa.array(rewards, pa.float32()),
            "length": lengths,
        }
    )
    out = add_advantages(table, estimator="reinforce", length_col="length", **options)
    return torch.tensor(out.column("advantage").to_pylist(), dtype=torch.float64)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reinforce_is_nemo_rls_raw_reward_estimator(seed: int) -> None:
    text = source(NEMO_RL, "nemo_rl/algorithms/advantage_estimator.py")
    namespace: dict[str, Any] = {"torch": torch}
    exec(_method(text, "RawRewardAdvantageEstimator", "compute_advantage"), namespace)
    rewards, lengths, mask = rollouts(seed)
    estimator = types.SimpleNamespace(normalize_advantages=True)
    theirs, _ = namespace["compute_advantage"](estimator, None, torch.tensor(rewards), mask)
    got = ours(rewards, lengths)
    assert torch.allclose(got, theirs[:, 0].to(torch.float64), rtol=1e-5, atol=1e-6)
    constant = torch.tensor(rewards).view(-1, 4)
    assert (got.view(-1, 4)[constant.eq(constant[:, :1]).all(dim=1)] != 0).all()  # no group zeroed


@pytest.mark.parametrize("seed", [4, 5])
def test_reinforce_is_openrlhfs_advantage_normalisation(seed: int) -> None:
    text = source(OPENRLHF, "openrlhf/trainer/ppo_utils/experience_maker.py")
    block = _cut(
        text,
        'if args.algo.advantage.estimator in ["gae", "reinforce", "reinforce_baseline"]:',
        "exp.advantages = (exp.advantages - mean) * rstd",
    )
    rewards, lengths, mask = rollouts(seed)
    # gamma 1, no KL: every response token's return is the reward
    advantages = torch.tensor(rewards).unsqueeze(-1) * mask
    experiences = [
        types.SimpleNamespace(advantages=advantages[i : i + 25], action_mask=mask[i : i + 25].bool())
        for i in range(0, len(rewards), 25)
    ]
    args = types.SimpleNamespace(
        algo=types.SimpleNamespace(advantage=types.SimpleNamespace(estimator="reinforce", no_std_norm=False))
    )
    exec(block, {"torch": torch, "args": args, "experiences": experiences})
    theirs = torch.cat([exp.advantages[:, 0] for exp in experiences]).to(torch.float64)
    assert torch.allclose(ours(rewards, lengths), theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", [6, 7])
def test_reinforce_with_whiten_is_verls_reinforce_plus_plus_at_gamma_one(seed: int) -> None:
    core = source(VERL, "verl/trainer/ppo/core_algos.py")
    functional = source(VERL, "verl/utils/torch_functional.py")
    helpers: dict[str, Any] = {"torch": torch}
    for name in ("masked_mean", "masked_sum", "masked_var", "masked_whiten"):
        if f"def {name}(" in functional:
            exec(_function(functional, name), helpers)
    namespace: dict[str, Any] = {
        "torch": torch,
        "verl_F": types.SimpleNamespace(masked_whiten=helpers["masked_whiten"]),
        "Optional": Any,
        "AlgoConfig": Any,
    }
    exec(_function(core, "compute_reinforce_plus_plus_outcome_advantage"), namespace)
    rewards, lengths, mask = rollouts(seed)
    token_rewards = torch.zeros_like(mask)
    for row, length in enumerate(lengths):
        token_rewards[row, length - 1] = rewards[row]  # the outcome reward on the last token
    theirs, _ = namespace["compute_reinforce_plus_plus_outcome_advantage"](
        token_rewards, mask, config=types.SimpleNamespace(gamma=1.0)
    )
    got = ours(rewards, lengths, whiten=True)
    assert torch.allclose(got, theirs[:, 0].to(torch.float64), rtol=1e-5, atol=1e-6)
