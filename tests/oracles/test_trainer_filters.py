"""``check --trainer-filter``: each trainer's no-signal rule, against the trainer's own code.

Each rule in :mod:`grpo_cli.trainers.filters` is compared with the trainer's code, cut
verbatim from its fetched source, on the same groups: constant groups of fractional values
in float32 and float64 (where the trainers' float arithmetic disagrees with exactness),
binary groups, tiny spreads, singletons.
"""

from __future__ import annotations

import json
import math
import os
import random
import types
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from grpo_cli.trainers.filters import FILTERS
from tests.dump_writers import SLIME, VERL
from tests.trainer_source import TRL, _cut, _function, source

VERL_RECIPE = ("verl-project/verl-recipe", "48ea0a797fa29867ea0ad92aff7d284eec7d4be3")
SKYRL = ("NovaSky-AI/SkyRL", "a9564572eb8e91076be43c1bd5e4615e3de17265")
PRIME_RL = ("PrimeIntellect-ai/prime-rl", "559b44772e471d1538537b8805cc77f3824a5e64")
FRACTIONS = (0.1, 0.2, 0.3, 0.7, 0.7804687, 0.9, 1 / 3)


def groups_of(seed: int, *, size: int | None = None) -> list[list[float]]:
    """Constant groups of fractional values (float32-rounded half the time), binary groups,
    groups one ulp or 1e-7 apart, singletons, spreads at the rules' tolerances."""
    rng = random.Random(seed)
    out = []
    for v in FRACTIONS:
        for n in range(2, 17) if size is None else (size,):
            out.append([float(np.float32(v))] * n)
            out.append([v] * n)
    for _ in range(60):
        n = size or rng.randint(1, 9)
        kind = rng.random()
        if kind < 0.4:
            out.append([float(rng.random() < 0.5) for _ in range(n)])
        elif kind < 0.7:
            base = rng.choice(FRACTIONS)
            out.append([base] * (n - 1) + [float(np.nextafter(base, 1.0))] if n > 1 else [base])
        else:
            base = rng.choice(FRACTIONS)
            out.append([base + rng.choice((0.0, 1e-7, 2e-6)) for _ in range(n)])
    # spreads within 10% of the rules' 1e-6 tolerances (on max - min, or on the std of two
    # alternating values), where float32 and float64 arithmetic decide differently
    for base in (0.1, 0.9):
        for spread in (1e-6, 2e-6):
            for j in range(-20, 21):
                step = spread * (1 + j / 200)
                out.append([base + step * (i % 2) for i in range(size or 8)])
    return out + with_nans(out, rng, size=size)


NAN = float("nan")


def with_nans(groups: list[list[float]], rng: random.Random, *, size: int | None) -> list[list[float]]:
    """Groups holding NaN rewards (a null reward, TRL's unscorable rollout) in their places:
    issue #67's cases, then copies of ``groups`` with some, one or every slot NaN."""
    cases = [
        [NAN, 1.0],
        [1.0, NAN],
        [0.9] * 11 + [NAN] * 5,
        [0.1] * 15 + [NAN],
        [NAN],
        [NAN, NAN],
        [NAN, 0.5, 0.5],
    ]
    out = [g for g in cases if size is None or len(g) == size]
    for g in rng.sample(groups, min(len(groups), 120)):
        n = len(g)
        slots = rng.choice((1, rng.randint(1, n), n))
        holes = set(rng.sample(range(n), slots))
        out.append([NAN if i in holes else v for i, v in enumerate(g)])
    return out


def ours(name: str, groups: list[list[float]], dtype: Any = np.float64) -> list[bool]:
    return [FILTERS[name].keeps(np.array(g, dtype=dtype)) for g in groups]


def test_dapo_is_the_recipes_filter_groups_on_float32_and_float64_metrics() -> None:
    text = source(VERL_RECIPE, "dapo/dapo_ray_trainer.py")
    block = _cut(
        text,
        "prompt_uid2metric_vals = defaultdict(list)",
        "if std > 0 or len(prompt_uid2metric_vals[uid]) == 1",
    )
    block += "\n]"
    groups = groups_of(1)
    for name, metric, dtype in (
        ("dapo", "seq_final_reward", np.float32),
        ("dapo-float64", "acc", np.float64),
    ):
        uids = [f"g{i}" for i, g in enumerate(groups) for _ in g]
        values = np.array([r for g in groups for r in g], dtype=dtype)
        new_batch = types.SimpleNamespace(
            non_tensor_batch={"uid": np.array(uids, dtype=object), metric: values}
        )
        namespace: dict[str, Any] = {
            "np": np,
            "defaultdict": defaultdict,
            "new_batch": new_batch,
            "metric_name": metric,
        }
        exec(block, namespace)
        kept = set(namespace["kept_prompt_uids"])
        assert ours(name, groups, dtype) == [f"g{i}" in kept for i in range(len(groups))], name
    constant32 = [g for g in groups[: 2 * 7 * 15 : 2]]
    assert sum(ours("dapo", constant32, np.float32)) == 43  # of the 105 float32 constant groups


def test_verl_v1_is_its_replay_buffers_classification() -> None:
    text = source(VERL, "verl/trainer/ppo/v1/replay_buffer.py")
    block = _cut(
        text,
        "for uid in new_finished_uids:",
        "classification_cache[uid] = float(values[0]) if len(values) > 1",
    )
    groups = groups_of(2)
    metrics_by_uid = {f"g{i}": [float(r) for r in g] for i, g in enumerate(groups)}
    namespace: dict[str, Any] = {
        "np": np,
        "new_finished_uids": list(metrics_by_uid),
        "metrics_by_uid": metrics_by_uid,
        "classification_cache": {},
    }
    exec(block, namespace)
    filtered = {uid for uid, value in namespace["classification_cache"].items() if value is not None}
    assert ours("verl-v1", groups) == [f"g{i}" not in filtered for i in range(len(groups))]


def test_skyrl_is_its_zero_variance_filter_at_its_configured_tolerance() -> None:
    namespace: dict[str, Any] = {"defaultdict": defaultdict, "List": list, "Optional": Any}
    exec(_function(source(SKYRL, "skyrl/train/utils/trainer_utils.py"), "zero_variance_filter"), namespace)
    groups = groups_of(3)
    uids = [f"g{i}" for i, g in enumerate(groups) for _ in g]
    kept_rows = set(namespace["zero_variance_filter"]([r for g in groups for r in g], uids, tol=1e-6))
    kept = {uids[i] for i in kept_rows}
    assert ours("skyrl", groups) == [f"g{i}" in kept for i in range(len(groups))]


def test_slime_is_its_check_reward_nonzero_std() -> None:
    text = source(SLIME, "slime/rollout/filter_hub/dynamic_sampling_filters.py")
    namespace: dict[str, Any] = {"torch": torch, "DynamicFilterOutput": lambda keep, reason: keep}
    exec(_function(text, "check_reward_nonzero_std"), namespace)
    groups = groups_of(4)

    class Sample:
        def __init__(self, reward: float) -> None:
            self.reward = reward

        def get_reward_value(self, args: Any) -> float:
            return self.reward

    with warnings.catch_warnings():  # torch warns on a group of one (its std is NaN)
        warnings.simplefilter("ignore", UserWarning)
        theirs = [bool(namespace["check_reward_nonzero_std"](None, [Sample(r) for r in g])) for g in groups]
    assert ours("slime", groups) == theirs


def test_roll_is_its_agentic_reward_norm_zero_rule() -> None:
    """ROLL's group normalisation, cut verbatim from ``agentic_reward_norm``: a group whose
    advantages it sets to zeros is one it does not learn from."""
    from tests.dump_writers import ROLL

    text = source(ROLL, "roll/pipeline/agentic/utils.py")
    block = _cut(text, "scores_float = scores.float()", "normalized_scores = scores_float - reward_mean")
    theirs = []
    for group in groups_of(5):
        local: dict[str, Any] = {
            "torch": torch,
            "scores": torch.tensor(group, dtype=torch.float64),
            "norm_mean_type": "group",
            "norm_std_type": "group",
            "batch_mean": None,
            "batch_std": None,
        }
        with warnings.catch_warnings():  # a group of one: its std is NaN, torch warns
            warnings.simplefilter("ignore", UserWarning)
            exec(block, local)
        theirs.append(bool((local["normalized_scores"] != 0).any()))
    assert ours("roll", groups_of(5)) == theirs
    assert theirs.count(True) > 10 and theirs.count(False) > 10


def test_prime_rl_is_its_grpo_advantage_then_its_zero_advantage_prune() -> None:
    grpo = source(PRIME_RL, "src/prime_rl/orchestrator/algo/grpo.py")
    sink = source(PRIME_RL, "src/prime_rl/orchestrator/train_sink.py")
    advantage_line = _cut(
        grpo, "advantages = rewards - rewards.mean()", "advantages = rewards - rewards.mean()"
    )
    prune = _cut(sink, "def _prune_zero_advantages(sample: TrainingSample) -> bool:", "return True", before=0)
    assert "advantage == 0.0" in sink  # the prune's test, applied below to every trainable token
    groups = groups_of(6)
    theirs = []
    for g in groups:
        local: dict[str, Any] = {"rewards": torch.tensor(g, dtype=torch.float32)}
        exec(advantage_line, local)
        theirs.append(any(a != 0.0 for a in local["advantages"].tolist()))
    assert prune.startswith("def _prune_zero_advantages")
    assert ours("prime-rl", groups) == theirs


def test_nemo_rl_is_its_dynamic_samplings_row_rule_on_the_leave_one_out_std() -> None:
    from grpo_cli.trainers.filters import _nemo_rl_rows
    from tests.trainer_source import NEMO_RL

    utils = source(NEMO_RL, "nemo_rl/algorithms/utils.py")
    grpo = source(NEMO_RL, "nemo_rl/algorithms/grpo.py")
    assert "non_zero_std_mask = std != 0.0" in grpo  # the row rule dynamic_sampling applies
    namespace: dict[str, Any] = {"torch": torch}
    exec(_function(utils, "calculate_baseline_and_std_per_prompt"), namespace)
    groups = groups_of(7)
    rewards = torch.tensor([r for g in groups for r in g], dtype=torch.float32)
    prompts = torch.tensor([[i] for i, g in enumerate(groups) for _ in g])
    _, std = namespace["calculate_baseline_and_std_per_prompt"](prompts, rewards, torch.ones_like(rewards))
    theirs = (std != 0.0).tolist()
    mine = [bool(k) for g in groups for k in _nemo_rl_rows(np.array(g))]
    assert mine == theirs
    assert _nemo_rl_rows(np.array([1.0, 0.0, 0.0, 0.0])).tolist() == [
        False,
        True,
        True,
        True,
    ]  # NeMo-RL PR #3469


def test_check_trainer_filter_nemo_rl_counts_the_groups_it_splits(cli: Any, tmp_path: Path) -> None:
    rows = [{"uid": "a", "reward": r} for r in (1.0, 0.0, 0.0, 0.0)] + [
        {"uid": "b", "reward": r} for r in (1.0, 0.0, 1.0, 0.0)
    ]
    path = tmp_path / "split.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    result = cli(
        "check", path, "-g", "uid", "--trainer-filter", "nemo-rl", "--summary-json", tmp_path / "s.json"
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads((tmp_path / "s.json").read_text())["trainer_filter"]
    assert (
        report["split"] == 1
        and report["kept_although_inactive"] == 0
        and report["dropped_although_active"] == 0
    )
    assert "group 'a': split: 3 of 4 rows kept" in result.stderr


@pytest.mark.parametrize("size", [2, 4, 8, 16])
def test_trl_is_its_is_std_zero_under_group_scaling(size: int) -> None:
    utils = source(TRL, "trl/trainer/utils.py")
    trainer = source(TRL, "trl/trainer/grpo_trainer.py")
    namespace: dict[str, Any] = {"torch": torch}
    exec(_function(utils, "nanstd"), namespace)
    line = _cut(
        trainer,
        "std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)",
        "std_rewards = nanstd(rewards.view",
    )
    zero = _cut(
        trainer,
        "is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))",
        "is_std_zero = torch.isclose",
    )
    groups = groups_of(5, size=size)
    rewards = torch.tensor([r for g in groups for r in g], dtype=torch.float32)
    local: dict[str, Any] = {}
    exec(line + "\n" + zero, {**namespace, "rewards": rewards, "num_generations": size}, local)
    assert ours("trl", groups) == [not bool(z) for z in local["is_std_zero"]]


def test_check_trainer_filter_dapo_names_the_constant_groups_it_keeps(cli: Any, tmp_path: Path) -> None:
    rows = []
    for step in (1, 2):
        for v in FRACTIONS:
            for n in range(2, 17):
                rows += [{"step": step, "uid": f"{step}/{v:.7f}/{n}", "reward": float(np.float32(v))}] * n
        rows += [{"step": step, "uid": f"{step}/mixed", "reward": float(i % 2)} for i in range(4)]
    path = tmp_path / "constant32.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    summary = tmp_path / "s.json"
    result = cli(
        "check",
        path,
        "-g",
        "uid",
        "--batch-col",
        "step",
        "--trainer-filter",
        "dapo",
        "--summary-json",
        summary,
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(summary.read_text())["trainer_filter"]
    assert report["kept_although_inactive"] == 2 * 43 and report["dropped_although_active"] == 0
    assert [v["kept_although_inactive"] for v in report["by"]["values"]] == [43, 43]
    assert "86 kept although constant, 0 dropped although active" in result.stderr
    assert "group '1/0.1000000/7': kept although constant" in result.stderr
    gated = cli("check", path, "-g", "uid", "--trainer-filter", "dapo", "--max-misclassified-groups", "0")
    assert gated.exit_code == 1
    assert "FAIL  max-misclassified-groups (dapo): 86 (bound <= 0)" in gated.stderr
    exact = cli("check", path, "-g", "uid", "--trainer-filter", "skyrl", "--max-misclassified-groups", "0")
    assert exact.exit_code == 0, exact.stderr


def test_a_gate_without_a_filter_fails_rather_than_passing_nothing(cli: Any, parquet_file: Path) -> None:
    result = cli("check", parquet_file, "--max-misclassified-groups", "0")
    assert result.exit_code == 1
    assert "FAIL  max-misclassified-groups: no --trainer-filter" in result.stderr


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_trl_batch_is_its_is_std_zero_under_batch_scaling(seed: int) -> None:
    """TRL's ``scale_rewards="batch"`` lines, cut verbatim: one ``nanstd`` of the whole batch,
    so every row carries the same flag; on batches that are constant, nearly constant, or
    hold constant groups beside active ones."""
    from grpo_cli.trainers.filters import compare

    utils = source(TRL, "trl/trainer/utils.py")
    trainer = source(TRL, "trl/trainer/grpo_trainer.py")
    namespace: dict[str, Any] = {"torch": torch}
    exec(_function(utils, "nanstd"), namespace)
    batch_std = _cut(trainer, "# Compute global std", "std_rewards = torch.zeros_like(rewards)")
    zero = _cut(
        trainer,
        "is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))",
        "is_std_zero = torch.isclose",
    )
    rng = random.Random(seed)
    batches = [
        [[0.7] * 4 for _ in range(5)],  # the whole batch constant: zero std
        [[0.7] * 4 for _ in range(4)] + [[0.7, 0.7, 0.7, float(np.nextafter(np.float32(0.7), 1))]],
        [[1.0] * 4, [0.0] * 4, [0.0, 1.0, 1.0, 0.0]],  # constant groups in a batch that is not
        [[float(rng.random() < 0.5) for _ in range(4)] for _ in range(6)],
        [[0.25]],  # one row
    ]
    groups = [np.array(g, dtype=np.float64) for batch in batches for g in batch]
    batch_of_group = np.array([b for b, batch in enumerate(batches) for _ in batch])
    report = compare(
        "trl-batch",
        groups,
        np.array([g.min() != g.max() for g in groups]),
        value_of_group=("step", batch_of_group, list(range(len(batches)))),
    )
    hidden = 0
    for b, batch in enumerate(batches):
        rewards = torch.tensor([r for g in batch for r in g], dtype=torch.float32)
        local: dict[str, Any] = {}
        exec(
            "if True:\n" + "\n".join("    " + line for line in batch_std.splitlines()) + "\n" + zero,
            {**namespace, "rewards": rewards},
            local,
        )
        flags = local["is_std_zero"]
        assert bool(flags.all()) or not bool(flags.any())  # one flag for the whole batch
        assert report["by"]["values"][b]["batch_kept"] == (not bool(flags[0]))
        hidden += 0 if bool(flags[0]) else sum(min(g) == max(g) for g in batch)
    assert report["kept_although_inactive"] == hidden >= 6  # batch 1's four 0.7 groups, batch 2's two


def test_check_trl_batch_names_the_steps_whose_constant_groups_it_hides(cli: Any, tmp_path: Path) -> None:
    rows = [{"step": 1, "uid": f"1/{g}", "reward": float(g % 2)} for g in range(4) for _ in range(4)]
    rows += [{"step": 2, "uid": f"2/{g}", "reward": float(i % 2)} for g in range(4) for i in range(4)]
    path = tmp_path / "batch.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    result = cli(
        "check",
        path,
        "-g",
        "uid",
        "--batch-col",
        "step",
        "--trainer-filter",
        "trl-batch",
        "--max-misclassified-groups",
        "0",
    )
    assert result.exit_code == 1
    assert "4 kept although constant" in result.stderr
    assert "step 1: 4 kept although constant, 0 dropped although active (of 4); the whole step counted" in (
        result.stderr
    )
    assert "step 2:" not in result.stderr


@pytest.mark.parametrize("uneven", [False, True])
def test_slime_fallback_is_its_post_process_rewards(uneven: bool) -> None:
    """slime's group normalisation, cut verbatim: groups of n_samples_per_prompt are each
    normalised; when the batch's sample count is not n * rollout_batch_size (uneven groups),
    ``rewards.view(-1, N)`` normalises the whole batch as one group. A group is trained on
    where some rollout's advantage is not 0."""
    from grpo_cli.trainers.filters import compare

    text = source(SLIME, "slime/ray/rollout.py")
    block = _cut(
        text, "rewards = torch.tensor(raw_rewards, dtype=torch.float)", "rewards = rewards / (std + 1e-6)"
    )
    rng = random.Random(11)
    n = 8
    groups = []
    for g in range(40):
        size = n - 2 if uneven and g % 7 == 3 else n
        kind = rng.random()
        if kind < 0.3:
            groups.append([rng.choice((0.0, 1.0, 0.7))] * size)
        else:
            groups.append([rng.choice((0.0, 0.25, 1.0)) for _ in range(size)])
    raw = [r for g in groups for r in g]
    args = types.SimpleNamespace(
        n_samples_per_prompt=n,
        rollout_batch_size=len(groups),
        advantage_estimator="grpo",
        grpo_std_normalization=True,
    )
    local: dict[str, Any] = {"torch": torch, "raw_rewards": raw, "self": types.SimpleNamespace(args=args)}
    exec(block, local)
    advantages = local["rewards"].flatten()
    theirs, start = [], 0
    for values in groups:
        theirs.append(bool((advantages[start : start + len(values)] != 0).any()))
        start += len(values)
    arrays = [np.array(values) for values in groups]
    report = compare(
        "slime-fallback",
        arrays,
        np.array([min(g) != max(g) for g in groups]),
        value_of_group=("step", np.zeros(len(groups), np.int64), [1]),
    )
    constant = sum(min(g) == max(g) for g in groups)
    assert report["kept"] == sum(theirs)
    assert report["by"]["values"][0]["uneven"] is uneven
    if uneven:
        assert report["kept_although_inactive"] == constant > 5  # the fallback trains on every one
    assert report["dropped_although_active"] == 0


def test_check_slime_fallback_names_the_uneven_step(cli: Any, tmp_path: Path) -> None:
    rows = [{"step": 1, "uid": f"1/{g}", "reward": float(g % 2)} for g in range(4) for _ in range(4)]
    rows += [{"step": 1, "uid": "1/x", "reward": float(i % 2)} for i in range(4)]
    rows += [{"step": 2, "uid": f"2/{g}", "reward": float(g % 2)} for g in range(4) for _ in range(4)]
    rows += [{"step": 2, "uid": "2/x", "reward": float(i % 2)} for i in range(3)]  # a group short
    path = tmp_path / "uneven.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    result = cli("check", path, "-g", "uid", "--batch-col", "step", "--trainer-filter", "slime-fallback")
    assert result.exit_code == 0, result.stderr
    assert "4 kept although constant, 0 dropped although active" in result.stderr
    assert "step 2: 4 kept although constant, 0 dropped although active (of 5); uneven group sizes" in (
        result.stderr
    )
    assert "step 1:" not in result.stderr


DECISIONS = Path(__file__).resolve().parents[1] / "snapshots" / "trainer-filter-decisions.json"


def decision_groups() -> list[list[float]]:
    """The groups whose decisions are recorded: mixed sizes, pairs, groups of eight."""
    return groups_of(11) + groups_of(12, size=2) + groups_of(13, size=8)


def _decisions() -> dict[str, str]:
    """Every rule's decisions on fixed groups, as strings of 0 and 1: each group in float64 and
    in float32, NeMo-RL's per-row rule, and the batch rules on batches of 7 groups."""
    groups = decision_groups()
    batches = [groups[i : i + 7] for i in range(0, len(groups), 7)]

    def bits(values: Any) -> str:
        return "".join("1" if bool(v) else "0" for v in values)

    out = {}
    for name, rule in FILTERS.items():
        for dtype in (np.float64, np.float32):
            out[f"{name} {np.dtype(dtype).name}"] = bits(ours(name, groups, dtype))
        if rule.rows is not None:
            out[f"{name} rows"] = bits(np.concatenate([rule.rows(np.array(g)) for g in groups]))
        if rule.batch_rule is not None:
            rows = [rule.batch_rule([np.array(g) for g in batch]) for batch in batches]
            out[f"{name} batches"] = bits(np.concatenate(rows))
    return out


def test_every_rule_gives_the_decisions_its_trainers_code_gave() -> None:
    """The tests above run each rule beside its trainer's code, where a mirror of the trainer is
    present (and ``make test`` runs them again under another CPU capability and thread count, so
    the groups at a rule's edge are held to the trainer's own answer on each). This one holds
    every rule to the decisions recorded when they agreed, on the groups placed clearly on either
    side of it (:func:`at_edge`): a group at the edge is decided by the rounding of the trainer's
    float32 or torch arithmetic, which follows the CPU's vector width and BLAS, so its recorded
    bit is one machine's. Rewrite them with ``UPDATE_SNAPSHOTS=1`` where the mirrors are."""
    found = _decisions()
    if os.environ.get("UPDATE_SNAPSHOTS"):
        DECISIONS.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(DECISIONS.read_text())
    assert found.keys() == recorded.keys()
    clear = _clear()
    for key, bits in recorded.items():
        assert len(clear[key]) == len(bits), key
        differ = [
            i for i, (a, b, c) in enumerate(zip(found[key], bits, clear[key], strict=True)) if c and a != b
        ]
        assert not differ, f"{key}: decisions differ at groups {differ[:10]}"
        decided = {b for b, c in zip(bits, clear[key], strict=True) if c}
        assert decided == {"0", "1"} or key.startswith("trl-batch"), (key, decided)  # both sides held
        assert sum(clear[key]) >= 100, f"{key}: {sum(clear[key])} of {len(bits)} groups clear"


U32, U64 = 2.0**-24, 2.0**-53
"""The unit roundoff of float32 and float64."""

EDGES: dict[str, tuple[str, float, float]] = {
    # the rules whose arithmetic is torch's (its reductions' order follows the CPU) or BLAS's:
    # (the test, the unit roundoff of its arithmetic, its threshold)
    "slime": ("std above", U64, 1e-6),
    "roll": ("std above", U32, 1e-6),
    "trl": ("std above", U32, 1e-8),  # isclose(std, 0): |std| <= 1e-8
    "trl-batch": ("std above", U32, 1e-8),
    "prime-rl": ("offset", U32, 0.0),
    "slime-fallback": ("offset", U32, 0.0),
    "nemo-rl": ("leave one out", U32, 0.0),
}
"""numpy's rules (dapo, verl-v1) and SkyRL's max - min add in a fixed order: every group is clear."""


def _bits(value: float) -> int:
    """The significand bits ``value`` needs (0 for 0)."""
    from fractions import Fraction

    fraction = Fraction(value)
    numerator = fraction.numerator
    while numerator and numerator % 2 == 0:
        numerator //= 2
    return abs(numerator).bit_length()


def _sums_exactly(value: float, n: int, unit: float) -> bool:
    """Whether every partial sum of ``n`` copies of ``value`` is exact in the arithmetic of ``unit``
    (so any order of adding them gives the same bits)."""
    precision = 24 if unit == U32 else 53
    return _bits(value) + n.bit_length() <= precision


def _exact_variance(values: list[float]) -> Any:
    """The sample variance, as a fraction."""
    from fractions import Fraction

    xs = [Fraction(v) for v in values]
    mean = sum(xs, Fraction(0)) / len(xs)
    return sum(((x - mean) ** 2 for x in xs), Fraction(0)) / (len(xs) - 1)


def at_edge(name: str, group: np.ndarray) -> bool:
    """Whether the rule's decision on ``group`` rests on the rounding of its arithmetic: its exact
    figure lies within that arithmetic's error bound of the threshold (``2 n u max|x|`` for a std,
    ``4 n u max x^2`` for NeMo-RL's ``E[x^2] - E[x]^2``), or a mean that is exact in no order."""
    if name not in EDGES:
        return False
    test, unit, threshold = EDGES[name]
    cast = np.float32 if unit == U32 else np.float64
    values = [float(cast(v)) for v in group]
    if any(math.isnan(v) for v in values):
        if not name.startswith("trl"):
            return False  # a NaN makes the rule's figure NaN, in any order of its arithmetic
        values = [v for v in values if not math.isnan(v)]  # TRL's nanstd leaves them out
    n = len(values)
    if n < 2:
        return False
    largest = max(abs(v) for v in values)
    constant = len(set(values)) == 1
    if test == "offset":  # r - mean == 0 everywhere only for a constant group summed exactly
        return constant and not _sums_exactly(values[0], n, unit)
    if constant and _sums_exactly(values[0], n, unit):
        return False  # every deviation is exactly 0.0, in any order
    if test == "std above":
        error = 2 * n * unit * largest
        variance = _exact_variance(values)
        low = max(threshold - error, 0.0)
        return (variance > low * low or (low == 0 and variance >= 0)) and variance < (threshold + error) ** 2
    return any(rows_at_edge(group, unit))


def rows_at_edge(group: np.ndarray, unit: float = U32) -> list[bool]:
    """NeMo-RL's per-row rule: whether each row's leave-one-out std (float32 ``E[x^2] - E[x]^2`` by
    a matrix product, whose order is the BLAS's) is within its rounding of 0.0: not 0.0 exactly in
    every order, and an exact variance within ``4 n u max x^2``."""
    values = [float(np.float32(v)) for v in group]
    n = len(values)
    largest = max((abs(v) for v in values), default=0.0)
    edge = []
    for row in range(n):
        others = values[:row] + values[row + 1 :]
        if len(others) < 2 or any(math.isnan(v) for v in others):  # a NaN std, in any order
            edge.append(False)
            continue
        exact_zero = (
            len(set(others)) == 1
            and 2 * _bits(others[0]) <= 24
            and _sums_exactly(others[0], len(others), unit)
            and _sums_exactly(others[0] ** 2, len(others), unit)
        )
        edge.append(not exact_zero and _exact_variance(others) <= 4 * n * unit * largest * largest)
    return edge


def _clear() -> dict[str, list[bool]]:
    """For every key of :func:`_decisions`, which of its groups (or rows) are clear of the edge."""
    groups = decision_groups()
    batches = [groups[i : i + 7] for i in range(0, len(groups), 7)]
    out: dict[str, list[bool]] = {}
    for name, rule in FILTERS.items():
        for dtype in (np.float64, np.float32):
            out[f"{name} {np.dtype(dtype).name}"] = [
                not at_edge(name, np.array(g, dtype=dtype)) for g in groups
            ]
        if rule.rows is not None:
            out[f"{name} rows"] = [not edge for g in groups for edge in rows_at_edge(np.array(g))]
        if rule.batch_rule is not None:
            out[f"{name} batches"] = [
                not at_edge(name, np.concatenate([np.array(g) for g in batch]))
                if len({len(g) for g in batch}) > 1 or name == "trl-batch"
                else not at_edge(name, np.array(g))
                for batch in batches
                for g in batch
            ]
    return out


def test_the_edge_holds_the_groups_whose_decision_moved_between_cpus() -> None:
    """The groups at which NeMo-RL's float32 rule decided otherwise on an AVX-512 Intel CPU than
    where the decisions were recorded (issue: groups 74-81 and 106-109) are at its edge; binary
    groups and dyadic constants are clear for every rule."""
    groups = decision_groups()
    for index in (74, 75, 76, 77, 80, 81, 106, 107, 108, 109):
        assert at_edge("nemo-rl", np.array(groups[index], dtype=np.float32)), (index, groups[index])
    for name in FILTERS:
        for group in ([0.0, 1.0, 1.0, 0.0], [0.5] * 8, [1.0] * 16, [0.0, 0.0]):
            assert not at_edge(name, np.array(group)), (name, group)


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_a_run_shows_each_rule_its_groups_nan_and_null_slots_in_place(
    name: str, cli: Any, tmp_path: Path
) -> None:
    """Issue #67 B.4: the run dropped a group's NaN rows before the rule, where TRL's ``nanstd``
    counts them in place (``[NaN, 1.0]`` has a NaN std, not a zero one; a constant group with NaN
    slots rounds otherwise): 14 of 889 groups differed. Every rule now sees every row, a null
    as NaN, and its decisions are the rule's on the whole groups (the rules' own tests hold them
    to the trainers' code)."""
    rng = random.Random(67)
    groups = [g for g in groups_of(21, size=16) if any(math.isnan(v) for v in g)]
    groups += [[0.9] * 11 + [NAN] * 5, [0.1] * 15 + [NAN]]
    rows = []
    for i, g in enumerate(groups):
        for v in g:
            null = math.isnan(v) and rng.random() < 0.5  # a null reward is a NaN to the trainers
            rows.append({"uid": f"g{i}", "reward": None if null else v})
    path = tmp_path / "nan.parquet"
    pq.write_table(
        pa.Table.from_pylist(rows, schema=pa.schema([("uid", pa.string()), ("reward", pa.float64())])), path
    )
    summary = tmp_path / "s.json"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = cli(
            "check", path, "-g", "uid", "--nan", "ignore", "--trainer-filter", name, "--summary-json", summary
        )
    assert result.exit_code == 0, result.stderr
    # numpy's and torch's warnings on a NaN would reach the user's terminal
    assert not [str(w.message) for w in caught if w.category in (RuntimeWarning, UserWarning)]
    rule = FILTERS[name]
    arrays = [np.array(g) for g in groups]
    if rule.batch_rule is not None:  # the whole input is one batch
        expected = int(rule.batch_rule(arrays).sum())
    else:
        expected = sum(rule.keeps(g) for g in arrays)
    report = json.loads(summary.read_text())["trainer_filter"]
    assert report["groups"] == len(groups)
    assert report["kept"] == expected


def test_trl_counts_a_group_of_one_scored_rollout_and_a_null_as_not_zero_std(
    cli: Any, tmp_path: Path
) -> None:
    """TRL's ``nanstd`` of ``[NaN, 1.0]`` is NaN (one value left), which ``isclose`` does not call
    zero: TRL trains on that group, constant though its scored rewards are. The example names
    the NaN slot (JSON null in the summary)."""
    path = tmp_path / "n.csv"
    path.write_text("uid,reward\na,\na,1\nb,0.5\nb,0.5\nb,\n")
    summary = tmp_path / "s.json"
    result = cli(
        "check", path, "-g", "uid", "--nan", "ignore", "--trainer-filter", "trl", "--summary-json", summary
    )
    assert result.exit_code == 0, result.stderr
    assert "group 'a': kept although constant (rewards nan, 1)" in result.stderr
    report = json.loads(summary.read_text())["trainer_filter"]
    assert report["kept"] == 1 and report["kept_although_inactive"] == 1
    assert report["examples"][0]["rewards"] == [None, 1.0]


@pytest.mark.parametrize("view", [[], ["--by", "gid"], ["--by", "step"], ["--by", "source", "--by", "gid"]])
def test_a_whole_batch_rule_takes_its_batch_from_batch_col_whatever_by_views(
    view: list[str], cli: Any, tmp_path: Path
) -> None:
    """Issue #67 B.5: one step holding ``[0.5, 0.5, 0.5]`` and ``[1, 0, 1, 1]``: slime falls back to
    one baseline for the uneven batch and trains on the constant group. The first ``--by``
    column took the batch's place, so ``--by gid`` made every group a batch of its own and the
    finding vanished. ``--by`` is a view of the results: the decisions never change with it."""
    rows = [{"step": 1, "gid": "a", "source": "math", "reward": 0.5}] * 3
    rows += [{"step": 1, "gid": "b", "source": "code", "reward": r} for r in (1.0, 0.0, 1.0, 1.0)]
    rows += [{"step": 2, "gid": "c", "source": "math", "reward": r} for r in (1.0, 1.0)]
    rows += [{"step": 2, "gid": "d", "source": "code", "reward": r} for r in (0.0, 1.0)]
    path = tmp_path / "batch.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    # slime: step 1's uneven batch shares one baseline, so constant a is trained on; step 2 is
    # even, each group on its own. TRL: neither step is constant, so a and c are not zero std.
    expected = {"slime-fallback": ((1, 0), [True, False]), "trl-batch": ((2, 0), [True, True])}
    for name, (counts, per_step) in expected.items():
        summary = tmp_path / f"{name}.json"
        args = ["check", path, "-g", "gid", "--batch-col", "step", "--trainer-filter", name, *view]
        result = cli(*args, "--summary-json", summary)
        assert result.exit_code == 0, result.stderr
        report = json.loads(summary.read_text())["trainer_filter"]
        assert (report["kept_although_inactive"], report["dropped_although_active"]) == counts, (name, view)
        if view[:2] == ["--by", "gid"]:
            assert [v["value"] for v in report["by"]["values"]] == ["a", "b", "c", "d"]
            assert all("uneven" not in v and "batch_kept" not in v for v in report["by"]["values"])
        elif not view or view[:2] == ["--by", "step"]:
            batch_figure = {"slime-fallback": "uneven", "trl-batch": "batch_kept"}[name]
            assert [v[batch_figure] for v in report["by"]["values"]] == per_step
