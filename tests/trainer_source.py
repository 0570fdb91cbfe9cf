"""A trainer's own code, read from a fetched copy of its repository at a recorded commit.

The trainers' code is not copied into this repository: a test that runs it reads it from a
local mirror (``GRPO_TRAINER_MIRRORS``, default ``/work/.mirror``, laid out as the search
tool's ``fetch`` lays it: ``owner+name/repo`` bare git directories) and skips when the mirror
is absent. The independent re-implementations in :mod:`tests.trainers` are checked against
it there, and the suite everywhere else runs on those.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
import torch

TRL = ("huggingface/trl", "f2cd57710ae345ea6428ae95363267fcf38a3dc8")


def source(repo: tuple[str, str], path: str) -> str:
    """The file at ``path`` in ``repo`` (name, commit), or skip the test when no mirror holds it."""
    name, commit = repo
    git_dir = Path(os.environ.get("GRPO_TRAINER_MIRRORS", "/work/.mirror")) / name.replace("/", "+") / "repo"
    if not git_dir.is_dir():
        pytest.skip(f"no local mirror of {name} at {git_dir}")
    shown = subprocess.run(
        ["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"], capture_output=True, text=True
    )
    if shown.returncode != 0:
        pytest.skip(f"{name} mirror lacks {commit[:8]}:{path}")
    return shown.stdout


def _cut(text: str, first: str, last: str, *, before: int = 0) -> str:
    """The lines of ``text`` from the one holding ``first`` (``before`` lines earlier) to the one
    holding ``last``, dedented: a block of a trainer's function, verbatim."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if first in line) - before
    end = next(i for i in range(start, len(lines)) if last in lines[i]) + 1
    return textwrap.dedent("\n".join(lines[start:end]))


def _function(text: str, name: str) -> str:
    """The top-level function ``name`` of ``text``, verbatim: its ``def`` to the next top-level line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {name}("))
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i] and lines[i][0] not in " \t)"),
        len(lines),
    )
    return "\n".join(lines[start:end])


def trl_advantages(
    rewards_per_func: torch.Tensor,
    weights: list[float],
    num_generations: int,
    *,
    scale_rewards: str = "group",
    aggregation: str = "sum_then_normalize",
) -> torch.Tensor:
    """TRL's advantage block of ``GRPOTrainer._generate_and_score_completions``, verbatim (from
    ``unscorable_mask`` to ``nan_to_num``, trl/trainer/grpo_trainer.py), with its ``nanstd``
    (trl/trainer/utils.py), run on ``rewards_per_func`` (rows x functions, float32)."""
    trainer = source(TRL, "trl/trainer/grpo_trainer.py")
    utils = source(TRL, "trl/trainer/utils.py")
    block = _cut(
        trainer,
        "unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)",
        "advantages = torch.nan_to_num(advantages, nan=0.0)",
        before=3,
    )
    namespace: dict[str, Any] = {"torch": torch}
    exec(_function(utils, "nanstd"), namespace)
    body = textwrap.indent(block, "    ")
    exec(f"def block(self, rewards_per_func, device):\n{body}\n    return advantages\n", namespace)
    trainer_self = types.SimpleNamespace(
        scale_rewards=scale_rewards,
        multi_objective_aggregation=aggregation,
        reward_weights=torch.tensor(weights, dtype=torch.float32),
        reward_funcs=[None] * len(weights),
    )
    namespace["num_generations"] = num_generations
    # the block reads num_generations as a local of the enclosing method: give it as a global
    result: torch.Tensor = namespace["block"](trainer_self, rewards_per_func, "cpu")
    return result


NEMO_RL = ("NVIDIA-NeMo/RL", "7ea279abfbeb698b092856d0dab61e7cf39bc909")


def _method(text: str, class_name: str, name: str) -> str:
    """Method ``name`` of class ``class_name`` in ``text``, verbatim and dedented to top level."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"class {class_name}"))
    begin = next(i for i in range(start, len(lines)) if lines[i].strip().startswith(f"def {name}("))
    indent = len(lines[begin]) - len(lines[begin].lstrip())
    end = next(
        (
            i
            for i in range(begin + 1, len(lines))
            if lines[i].strip()
            and len(lines[i]) - len(lines[i].lstrip()) <= indent
            and not lines[i].lstrip().startswith(")")  # a signature's closing line
        ),
        len(lines),
    )
    return textwrap.dedent("\n".join(lines[begin:end]))


def nemo_rl_advantages(rewards: torch.Tensor, prompt_ids: torch.Tensor) -> torch.Tensor:
    """NeMo-RL's ``GRPOAdvantageEstimator.compute_advantage`` (leave-one-out baseline, rewards
    normalised), with ``calculate_baseline_and_std_per_prompt``, both verbatim from
    nemo_rl/algorithms/advantage_estimator.py and utils.py; one advantage per row."""
    mask = torch.ones(rewards.shape[0], 1)
    return nemo_rl_advantages_per_token(rewards, prompt_ids.reshape(-1, 1), mask)[:, 0]


def nemo_rl_advantages_per_token(
    rewards: torch.Tensor, prompt_ids: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """:func:`nemo_rl_advantages` as the trainer hands them to the loss: expanded to ``mask``'s
    (rows x tokens) shape, the same value on every token (prompt and padding included);
    ``prompt_ids`` (rows x prompt tokens)."""
    utils = source(NEMO_RL, "nemo_rl/algorithms/utils.py")
    estimator = source(NEMO_RL, "nemo_rl/algorithms/advantage_estimator.py")
    namespace: dict[str, Any] = {"torch": torch}
    exec(_function(utils, "calculate_baseline_and_std_per_prompt"), namespace)
    exec(_method(estimator, "GRPOAdvantageEstimator", "compute_advantage"), namespace)
    trainer_self = types.SimpleNamespace(use_leave_one_out_baseline=True, normalize_rewards=True)
    advantages: torch.Tensor = namespace["compute_advantage"](trainer_self, prompt_ids, rewards, mask)
    return advantages
