"""Trainers' dumps written by the trainers' own writer code, for the ``--from`` adapters.

Each ``write_*`` function builds synthetic batches (seeded; ours) the way the trainer holds
them in memory (the group IDs included), then runs the trainer's writer block, cut verbatim
from its fetched source at the commit recorded in :data:`WRITERS`, to write the dump files.
It returns the truth the trainer had in memory: one group label per written row, in file
order, plus the trainer's own advantage where the dump carries one.

``python -m tests.dump_writers sample_data/dumps`` rewrites the committed dumps (it needs the
mirrors, :mod:`tests.trainer_source`); ``tests/oracles/test_dumps.py`` rewrites them into a temporary
folder where the mirrors exist and checks that they are the committed ones, and checks the
adapters against the truth everywhere (``sample_data/dumps/truth.json``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import random
import shutil
import sys
import types
import uuid
from collections import UserDict, defaultdict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.trainer_source import NEMO_RL, TRL, _cut, _function, _method, source, trl_advantages

VERL = ("verl-project/verl", "1dda039b9c6311889a9c9a26040677e1254814f9")
ROLL = ("alibaba/ROLL", "8eb27cc2dc34c4d1310b169d9b86d339004d811a")
SLIME = ("THUDM/slime", "624b824a898ab0ec1fcb4d373004c7f3852bf515")
SKYRL = ("NovaSky-AI/SkyRL", "a9564572eb8e91076be43c1bd5e4615e3de17265")
PRIME_RL = ("PrimeIntellect-ai/prime-rl", "559b44772e471d1538537b8805cc77f3824a5e64")
VERIFIERS = ("PrimeIntellect-ai/verifiers", "a60a606ecc4d309247edf9ff92c3eabca362781f")
AREAL = ("inclusionAI/AReaL", "4aef98d8d818af55b43621aaadba047ae10f4e77")
OPEN_INSTRUCT = ("allenai/open-instruct", "e6c3044aa6201c8bfa4573c1b03142af599e730d")

WRITERS: dict[str, tuple[tuple[str, str], str, str]] = {
    "verl": (VERL, "verl/trainer/ppo/ray_trainer.py", "RayPPOTrainer._write_generations"),
    "verl-v1": (
        VERL,
        "verl/trainer/ppo/v1/trainer_base.py",
        "_log_rollout_data (the uid sort) and _write_generations",
    ),
    "trl": (TRL, "trl/trainer/grpo_trainer.py", "GRPOTrainer.log (the completions table and to_parquet)"),
    "nemo-rl": (
        NEMO_RL,
        "nemo_rl/algorithms/grpo.py + nemo_rl/utils/logger.py",
        "grpo_train (the log_data block) and Logger.log_batched_dict_as_jsonl",
    ),
    "roll": (
        ROLL,
        "roll/pipeline/rlvr/utils.py",
        "dump_rollout_to_specific_path (the write_data block) and write_to_json_process",
    ),
    "slime": (SLIME, "slime/observability/rollout_data_utils.py", "save_debug_rollout_data, Sample.to_dict"),
    "skyrl": (
        SKYRL,
        "skyrl/train/evaluate.py + skyrl/train/utils/trainer_utils.py",
        "evaluate (the dumped_evals folder block), dump_per_dataset_eval_results, sanitize_data_source",
    ),
    "prime-rl": (
        PRIME_RL,
        "src/prime_rl/monitors/file.py + src/prime_rl/orchestrator/algo/grpo.py",
        "FileMonitor.log_episodes (the write block), GRPOAlgorithm.score_group, assign_advantages, "
        "iter_trainable_traces; the records by verifiers (a60a606e) Episode.to_record",
    ),
    "areal": (
        AREAL,
        "areal/infra/workflow_executor.py",
        "WorkflowExecutor._dump_trajectory (the record block)",
    ),
    "open-instruct": (
        OPEN_INSTRUCT,
        "open_instruct/rl_utils.py + open_instruct/data_loader.py",
        "RolloutRecord, _save_rollouts, and the standard advantage block",
    ),
}
"""Per dump: (repository, commit), the writer's file, the function(s) cut from it."""

STEPS = 3
WORDS = ("add", "two", "primes", "sum", "of", "the", "digits", "count", "ways", "to", "tile", "a", "grid")


def _prompt(rng: random.Random, number: int) -> str:
    return f"Problem {number}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) + "?"


def _binary_or_partial(rng: random.Random, size: int) -> list[float]:
    """A group's rewards: all 0, all 1, mixed binary, or partial credit in float32 steps."""
    kind = rng.random()
    if kind < 0.25:
        return [0.0] * size
    if kind < 0.4:
        return [1.0] * size
    if kind < 0.8:
        return [float(rng.random() < 0.5) for _ in range(size)]
    return [float(np.float32(rng.choice((0.0, 0.1, 0.25, 0.7, 1.0)))) for _ in range(size)]


# --------------------------------------------------------------------------- verl


def write_verl(folder: Path, *, prompts: int = 120, n: int = 8, seed: int = 1) -> dict[str, Any]:
    """verl's ``{step}.jsonl``: rows after ``_balance_batch`` (not grouped), score a float32 sum."""
    text = source(VERL, "verl/trainer/ppo/ray_trainer.py")
    namespace: dict[str, Any] = {"os": os, "json": json}
    exec(_method(text, "RayPPOTrainer", "_write_generations"), namespace)
    rng = random.Random(seed)
    truth: dict[str, Any] = {}
    for step in range(1, STEPS + 1):
        rows = []
        for p in range(prompts):
            uid = str(uuid.UUID(int=rng.getrandbits(128)))
            prompt = _prompt(rng, step * 1000 + p)
            for reward in _binary_or_partial(rng, n):
                token_level = torch.zeros(4, dtype=torch.float32)
                token_level[-1] = reward
                rows.append((uid, prompt, f"answer {rng.randint(0, 99)}", token_level))
        rng.shuffle(rows)  # _balance_batch reorders the rows across data-parallel ranks
        scores = torch.stack([r[3] for r in rows]).sum(-1).cpu().tolist()
        namespace["_write_generations"](
            [r[1] for r in rows],
            [r[2] for r in rows],
            [str(rng.randint(0, 99)) for _ in rows],
            scores,
            {"acc": [float(s) for s in scores]},
            str(folder),
            step,
        )
        truth[f"{step}.jsonl"] = {"groups": [r[0] for r in rows]}
    return truth


def write_verl_v1(folder: Path, *, prompts: int = 100, n: int = 6, seed: int = 2) -> dict[str, Any]:
    """verl v1's ``{step}.jsonl``: sorted by the queue key ``{uid}_{session}_{index}``, dumped as uid."""
    text = source(VERL, "verl/trainer/ppo/v1/trainer_base.py")
    namespace: dict[str, Any] = {"os": os, "json": json, "np": np}
    exec(_method(text, "PPOTrainer", "_write_generations"), namespace)
    sort_block = _cut(
        text, "# Sort by uid key ({sample}_{rollout}_{output})", 'reward_extra_infos_dict = {"uid"'
    )
    rng = random.Random(seed)
    truth: dict[str, Any] = {}
    for step in range(1, STEPS + 1):
        keys: list[str] = []
        inputs: list[str] = []
        outputs: list[str] = []
        gts: list[str | None] = []
        scores: list[float] = []
        groups: list[str] = []
        previous = ""
        for p in range(prompts):
            uid = str(uuid.UUID(int=rng.getrandbits(128)))
            prompt = _prompt(rng, step * 1000 + p)
            if p % 25 == 7:  # the dataset holds the last prompt again: drawn twice, two uids
                prompt = previous
            previous = prompt
            for session, reward in enumerate(_binary_or_partial(rng, n)):
                keys.append(f"{uid}_{session}_0")
                inputs.append(prompt)
                outputs.append(f"answer {rng.randint(0, 99)}")
                gts.append(None)
                scores.append(float(torch.tensor([reward], dtype=torch.float32).sum()))
                groups.append(uid)
        order = list(range(len(keys)))
        rng.shuffle(order)  # the replay buffer hands the rows over in completion order
        batch = types.SimpleNamespace(keys=[keys[i] for i in order])
        local: dict[str, Any] = {
            "batch": batch,
            "inputs": [inputs[i] for i in order],
            "outputs": [outputs[i] for i in order],
            "gts": [gts[i] for i in order],
            "scores": [scores[i] for i in order],
        }
        exec(sort_block, local)
        sorted_groups = [groups[order[i]] for i in local["sorted_indices"]]
        namespace["_write_generations"](
            local["inputs"],
            local["outputs"],
            local["gts"],
            local["scores"],
            local["reward_extra_infos_dict"],
            str(folder),
            step,
        )
        truth[f"{step}.jsonl"] = {"groups": sorted_groups}
    return truth


# --------------------------------------------------------------------------- TRL


def write_trl(folder: Path, *, prompts: int = 64, n: int = 8, seed: int = 3) -> dict[str, Any]:
    """TRL's ``completions/completions_{step:05d}.parquet``: the last generation batch of each
    logging step, consecutive groups of num_generations rows, two reward functions (one may
    return None), TRL's own float32 advantage."""
    import pandas as pd

    text = source(TRL, "trl/trainer/grpo_trainer.py")
    block = _cut(text, "table = {", 'f"completions_{self.state.global_step:05d}.parquet",', before=0)
    block += "\n    )\n)"
    rng = random.Random(seed)
    truth: dict[str, Any] = {}
    (folder / "completions").mkdir(parents=True, exist_ok=True)
    for step in (10, 20, 30):
        prompt_texts: list[str] = []
        completions: list[str] = []
        groups: list[str] = []
        correctness: list[float] = []
        fmt: list[float | None] = []
        for p in range(prompts):
            prompt = _prompt(rng, step * 1000 + p)
            if p % 16 == 5:  # a prompt drawn twice in a row: two groups by position
                prompt = prompt_texts[-1]
            for reward in _binary_or_partial(rng, n):
                prompt_texts.append(prompt)
                completions.append(f"answer {rng.randint(0, 99)}")
                groups.append(f"{step}-{p}")
                correctness.append(reward)
                fmt.append(None if rng.random() < 0.05 else float(rng.random() < 0.8))
        rewards_per_func = torch.tensor(
            [[c, torch.nan if f is None else f] for c, f in zip(correctness, fmt, strict=True)],
            dtype=torch.float32,
        )
        advantages = trl_advantages(rewards_per_func, [1.0, 1.0], n)
        maxlen = len(prompt_texts)
        logs: dict[str, Any] = {
            "prompt": deque(prompt_texts, maxlen=maxlen),
            "completion": deque(completions, maxlen=maxlen),
            "rewards": defaultdict(functools.partial(deque, maxlen=maxlen)),
            "advantages": deque(advantages.tolist(), maxlen=maxlen),
            "extra": defaultdict(functools.partial(deque, maxlen=maxlen)),
        }
        for i, name in enumerate(("correctness_reward", "format_reward")):
            logs["rewards"][name].extend(rewards_per_func[:, i].tolist())
        trainer = types.SimpleNamespace(
            _logs=logs,
            state=types.SimpleNamespace(global_step=step),
            args=types.SimpleNamespace(output_dir=str(folder)),
        )
        exec(block, {"pd": pd, "os": os, "self": trainer})
        truth[f"completions/completions_{step:05d}.parquet"] = {
            "groups": groups,
            "advantage": advantages.tolist(),
        }
    return truth


# --------------------------------------------------------------------------- NeMo-RL


class _PackedTensor:  # NeMo-RL's multimodal container; never present here
    pass


def _batched_data_dict() -> type:
    """NeMo-RL's ``BatchedDataDict``: its ``slice``, ``make_microbatch_iterator`` and ``size``, verbatim."""
    text = source(NEMO_RL, "nemo_rl/distributed/batched_data_dict.py")
    namespace: dict[str, Any] = {"torch": torch, "PackedTensor": _PackedTensor, "Iterator": Any}
    body = "\n".join(
        "    " + line
        for method in ("slice", "make_microbatch_iterator")
        for line in _method(text, "BatchedDataDict", method).splitlines()
    )
    size_block = _method(text, "BatchedDataDict", "size")
    body += "\n    @property\n" + "\n".join("    " + line for line in size_block.splitlines())
    namespace["UserDict"] = UserDict
    exec(f"class BatchedDataDict(UserDict):\n{body}\n", namespace)
    cls: type = namespace["BatchedDataDict"]
    namespace["SlicedDataDict"] = cls
    return cls


def write_nemo_rl(folder: Path, *, prompts: int = 160, n: int = 4, seed: int = 4) -> dict[str, Any]:
    """NeMo-RL's ``train_data_step{N}.jsonl``: one sample per line, every field a one-element
    list, the advantage repeated on every token; groups on the prompt's token IDs (a prompt
    repeated within a step is one group of 2n)."""
    grpo = source(NEMO_RL, "nemo_rl/algorithms/grpo.py")
    logger_text = source(NEMO_RL, "nemo_rl/utils/logger.py")
    block = _cut(grpo, "log_data = {}", 'log_data, f"train_data_step{total_steps + 1}.jsonl"')
    block += "\n)"
    batched = _batched_data_dict()
    namespace: dict[str, Any] = {"os": os, "json": json, "np": np, "torch": torch, "BatchedDataDict": batched}
    exec(_method(logger_text, "Logger", "log_batched_dict_as_jsonl"), namespace)
    from tests.trainer_source import nemo_rl_advantages_per_token

    rng = random.Random(seed)
    truth: dict[str, Any] = {}
    pad = 0
    for total_steps in range(STEPS):
        prompt_tokens: list[list[int]] = []
        for p in range(prompts):
            if p % 12 == 7:  # the same prompt twice in a step: NeMo-RL makes one group of 2n
                prompt_tokens.append(prompt_tokens[-1])
            else:
                prompt_tokens.append([rng.randint(5, 900) for _ in range(rng.randint(3, 7))])
        rows, groups = [], []
        for tokens in prompt_tokens:
            for reward in _binary_or_partial(rng, n):
                response = [rng.randint(5, 900) for _ in range(rng.randint(2, 6))]
                rows.append((tokens, response, reward))
                groups.append(" ".join(map(str, tokens)))
        width = max(len(t) + len(r) for t, r, _ in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.int64)
        mask = torch.zeros((len(rows), width), dtype=torch.float32)
        prompts_padded = torch.full((len(rows), max(len(t) for t, _, _ in rows)), pad, dtype=torch.int64)
        for i, (tokens, response, _) in enumerate(rows):
            ids[i, : len(tokens) + len(response)] = torch.tensor(tokens + response)
            mask[i, len(tokens) : len(tokens) + len(response)] = 1.0
            prompts_padded[i, : len(tokens)] = torch.tensor(tokens)
        rewards = torch.tensor([r for _, _, r in rows], dtype=torch.float32)
        advantages = nemo_rl_advantages_per_token(rewards, prompts_padded, mask)
        lengths = torch.tensor([len(t) + len(r) for t, r, _ in rows])
        train_data = {
            "input_ids": ids,
            "token_mask": mask,
            "sample_mask": torch.ones(len(rows)),
            "advantages": advantages,
            "generation_logprobs": torch.zeros_like(mask),
            "prev_logprobs": torch.zeros_like(mask),
        }
        flat_messages = {"content": [[f"prompt {g}", "response"] for g in groups]}
        logger = types.SimpleNamespace(base_log_dir=str(folder))
        logger.log_batched_dict_as_jsonl = functools.partial(namespace["log_batched_dict_as_jsonl"], logger)
        master_config = types.SimpleNamespace(grpo=types.SimpleNamespace(use_dynamic_sampling=False))
        local = {
            "repeated_batch": {},
            "flat_messages": flat_messages,
            "rewards": rewards,
            "master_config": master_config,
            "input_lengths": lengths,
            "train_data": train_data,
            "logger": logger,
            "total_steps": total_steps,
        }
        exec(block, local)
        first_token = [adv[len(t)] for adv, (t, _, _) in zip(advantages.tolist(), rows, strict=True)]
        truth[f"train_data_step{total_steps + 1}.jsonl"] = {"groups": groups, "advantage": first_token}
    return truth


# --------------------------------------------------------------------------- ROLL


class _GroupedProto:
    """The fields of ROLL's ``DataProto`` that its ``group_by`` reads: no tensors, these columns."""

    _batch = None
    _remote_batch = None

    def __init__(self, columns: dict[str, Any]) -> None:
        self._non_tensor_batch = columns

    def __len__(self) -> int:
        return len(next(iter(self._non_tensor_batch.values())))


def write_roll(folder: Path, *, prompts: int = 40, n: int = 8, seed: int = 5) -> dict[str, Any]:
    """ROLL's ``rollout_dump_data.step_{N}.jsonl``: ONE JSON object whose fields are columns.

    Each step is a multi-domain RLVR step as ``RLVRPipeline.run`` makes it: a ``math_rule`` and an
    ``llm_judge`` batch, each drawn from its own dataset (so their ``id`` values overlap: math ``"3"``
    and judge ``"3"`` in one step), concatenated in domain order (``DataProto.concat``) and dumped
    in that order; one math prompt is drawn twice in a row (a dataset with a repeat). The truth is
    ROLL's own grouping: the rows in generation order (``prompt_id``), ``DataProto.group_by("domain")``
    (its code, executed), each domain's scores through ``reward_norm`` (executed, the grpo
    estimator's group mean and std) in blocks of ``num_return_sequences``."""
    text = source(ROLL, "roll/pipeline/rlvr/utils.py")
    functionals = source(ROLL, "roll/utils/functionals.py")
    protocol = source(ROLL, "roll/distributed/scheduler/protocol.py")

    class Timer:
        def __init__(self, name: str, logger: Any) -> None:
            self.last = 0.0

        def __enter__(self) -> Timer:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    columns_block = _cut(text, "COLUMMNS_CONFIG = [", "    ]")
    namespace: dict[str, Any] = {
        "os": os,
        "json": json,
        "numpy": np,
        "Timer": Timer,
        "logger": types.SimpleNamespace(info=lambda message: None),
    }
    exec(columns_block, namespace)
    exec(_function(text, "write_to_json_process"), namespace)
    norm: dict[str, Any] = {"torch": torch}
    exec(_function(functionals, "reward_norm"), norm)
    group_by = _cut(protocol, "group_key_values = []", "grouped_data[group_key] = self.select_idxs(indices)")
    write_data_block = _cut(
        text, "write_data = {k: copy.deepcopy(v)", "write_data['global_step'] = [global_step] * data_cnt"
    )
    rng = random.Random(seed)
    truth: dict[str, Any] = {}
    import copy
    from collections import defaultdict

    for global_step in range(STEPS):
        ids, prompt_texts, domains, scores = [], [], [], []
        for domain, count in (("math_rule", prompts), ("llm_judge", prompts // 2)):
            drawn = list(range(count))
            if domain == "math_rule":
                drawn[5] = drawn[4]  # the dataset holds prompt 4 twice: drawn twice in a row
            for p in drawn:
                prompt = _prompt(rng, global_step * 1000 + p + (500 if domain == "llm_judge" else 0))
                for reward in _binary_or_partial(rng, n):
                    ids.append(str(p))  # each domain's dataset numbers its prompts from 0
                    prompt_texts.append(prompt)
                    domains.append(domain)
                    scores.append(reward)
        data = types.SimpleNamespace(
            non_tensor_batch={
                "id": np.array(ids, dtype=object),
                "prompt": np.array(prompt_texts, dtype=object),
                "source": np.array(["math" if d == "math_rule" else "judge" for d in domains], dtype=object),
                "domain": np.array(domains, dtype=object),
            },
            batch={"responses": list(range(len(ids))), "scores": torch.tensor(scores, dtype=torch.float32)},
            meta_info={"temperature": 1.0},
        )
        tokenizer = types.SimpleNamespace(
            batch_decode=lambda ids, skip_special_tokens: [f"answer {i}" for i in ids]
        )
        local = {"data": data, "tokenizer": tokenizer, "copy": copy, "json": json, "global_step": global_step}
        exec(write_data_block, local)
        namespace["write_to_json_process"](str(folder), local["write_data"], namespace["COLUMMNS_CONFIG"])

        # RLVRPipeline.run: prompt_id = arange in dump order, reorder by it, group_by("domain")
        order = torch.argsort(torch.arange(len(ids)))

        proto = _GroupedProto({"domain": data.non_tensor_batch["domain"][order.numpy()]})
        grouping: dict[str, Any] = {"self": proto, "keys": ["domain"], "defaultdict": defaultdict}
        exec(group_by.replace("self.select_idxs(indices)", "indices"), grouping)
        groups: list[str] = [""] * len(ids)
        advantages = [0.0] * len(ids)
        for domain, indices in grouping["grouped_data"].items():
            rows = order[indices]
            normalised = norm["reward_norm"](
                data.batch["scores"][rows], n_sample=n, norm_mean_type="group", norm_std_type="group"
            )
            for position, (row, value) in enumerate(zip(rows.tolist(), normalised.tolist(), strict=True)):
                groups[row] = f"{global_step}/{domain}/{position // n}"
                advantages[row] = value
        truth[f"rollout_dump_data.step_{global_step}.jsonl"] = {"groups": groups, "advantage": advantages}
    return truth


# --------------------------------------------------------------------------- slime


def _slime_types() -> dict[str, Any]:
    """slime's ``slime/utils/types.py`` executed (its one slime import stubbed)."""
    misc = types.ModuleType("slime.utils.misc")
    misc.decode_int32_meta_array = lambda meta, keys: None  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in ("slime", "slime.utils", "slime.utils.misc")}
    sys.modules.update(
        {
            "slime": types.ModuleType("slime"),
            "slime.utils": types.ModuleType("slime.utils"),
            "slime.utils.misc": misc,
        }
    )
    module = types.ModuleType("slime_utils_types")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    try:
        exec(source(SLIME, "slime/utils/types.py"), module.__dict__)
        namespace: dict[str, Any] = module.__dict__
    finally:
        sys.modules.pop(module.__name__, None)
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    return namespace


def write_slime(folder: Path, *, prompts: int = 64, n: int = 8, seed: int = 6) -> dict[str, Any]:
    """slime's ``rollout_data/{rollout_id}.pt``: ``torch.save`` of ``Sample.to_dict()`` per sample."""
    from pathlib import Path as _Path

    sample_types = _slime_types()
    Sample = sample_types["Sample"]
    text = source(SLIME, "slime/observability/rollout_data_utils.py")
    namespace: dict[str, Any] = {
        "Path": _Path,
        "torch": torch,
        "logger": types.SimpleNamespace(info=lambda m: None),
    }
    exec(_function(text, "save_debug_rollout_data"), namespace)
    rng = random.Random(seed)
    truth: dict[str, Any] = {}
    index = 0
    for rollout_id in range(STEPS):
        samples, groups = [], []
        previous = ""
        for group_index in range(prompts):
            prompt = _prompt(rng, rollout_id * 1000 + group_index)
            if group_index % 25 == 7:  # the dataset holds the last prompt again: two sample groups
                prompt = previous
            previous = prompt
            for reward in _binary_or_partial(rng, n):
                sample = Sample(
                    group_index=group_index,
                    index=index,
                    prompt=prompt,
                    tokens=[rng.randint(5, 900) for _ in range(6)],
                    response=f"answer {rng.randint(0, 99)}",
                    response_length=rng.randint(2, 40),
                    label=str(rng.randint(0, 99)),
                    reward=reward,
                    status=Sample.Status.COMPLETED if rng.random() < 0.9 else Sample.Status.TRUNCATED,
                )
                index += 1
                samples.append(sample)
                groups.append(f"{rollout_id}-{group_index}")
        namespace["save_debug_rollout_data"](
            str(folder / "{rollout_id}.pt"), samples, rollout_id=rollout_id, evaluation=False
        )
        truth[f"{rollout_id}.pt"] = {"groups": groups}
    return truth


# --------------------------------------------------------------------------- AReaL


class _AsyncFile:
    def __init__(self, path: str, mode: str) -> None:
        self._file = open(path, mode)  # noqa: SIM115 (closed in __aexit__)

    async def __aenter__(self) -> _AsyncFile:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._file.close()

    async def write(self, text: str) -> None:
        self._file.write(text)


async def _makedirs(path: str, exist_ok: bool = False) -> None:
    os.makedirs(path, exist_ok=exist_ok)


def write_areal(folder: Path, *, tasks: int = 40, n: int = 8, seed: int = 7) -> dict[str, Any]:
    """AReaL's ``rollout/{version}/{task_id}.jsonl``: one file per task (its n samples)."""
    text = source(AREAL, "areal/infra/workflow_executor.py")
    block = _cut(text, "tail_version = max(versions)", 'await f.write(json.dumps(record) + "\\n")')
    body = "\n".join("    " + line for line in block.splitlines())
    aiofiles = types.SimpleNamespace(open=_AsyncFile, os=types.SimpleNamespace(makedirs=_makedirs))
    namespace: dict[str, Any] = {"os": os, "json": json, "aiofiles": aiofiles}
    exec(
        "async def dump(traj, task_id, dump_dir, versions, input_ids, rewards, loss_mask, "
        f"attention_mask, tokenizer):\n{body}\n",
        namespace,
    )
    tokenizer = types.SimpleNamespace(decode=lambda ids, skip_special_tokens: " ".join(f"t{i}" for i in ids))
    rng = random.Random(seed)
    truth: dict[str, Any] = {}
    task_id = 0
    for version in range(1, STEPS + 1):
        for _ in range(tasks):
            prompt = [rng.randint(5, 900) for _ in range(rng.randint(3, 6))]
            responses = [[rng.randint(5, 900) for _ in range(rng.randint(1, 5))] for _ in range(n)]
            width = max(len(prompt) + len(r) for r in responses) + 2
            input_ids = torch.zeros((n, width), dtype=torch.int64)
            loss_mask = torch.zeros((n, width), dtype=torch.int64)
            attention_mask = torch.zeros((n, width), dtype=torch.int64)
            for i, response in enumerate(responses):
                length = len(prompt) + len(response)
                input_ids[i, :length] = torch.tensor(prompt + response)
                loss_mask[i, len(prompt) : length] = 1
                attention_mask[i, :length] = 1
            rewards = torch.tensor(_binary_or_partial(rng, n), dtype=torch.float32)
            versions = [version - 1, version]
            asyncio.run(
                namespace["dump"](
                    None,
                    task_id,
                    str(folder),
                    versions,
                    input_ids,
                    rewards,
                    loss_mask,
                    attention_mask,
                    tokenizer,
                )
            )
            truth[f"{version}/{task_id}.jsonl"] = {"groups": [f"task-{task_id}"] * n}
            task_id += 1
    return truth


# --------------------------------------------------------------------------- SkyRL


SKYRL_EVAL_STEPS = (0, 5, 10)  # an evaluation before training, then every trainer.eval_interval = 5


def write_skyrl(folder: Path, *, prompts: int = 36, n: int = 4, seed: int = 9) -> dict[str, Any]:
    """SkyRL's ``dumped_evals/global_step_{N}_evals/{data_source}.jsonl`` (``dump_eval_results``):
    each evaluation's rollouts split by data source, ``eval_n_samples_per_prompt`` per prompt,
    the decoded prompt text and the score, no group ID."""
    trainer_utils = source(SKYRL, "skyrl/train/utils/trainer_utils.py")
    evaluate = source(SKYRL, "skyrl/train/evaluate.py")
    namespace: dict[str, Any] = {
        "json": json,
        "Path": Path,
        "logger": types.SimpleNamespace(info=lambda message: None),
        "AutoTokenizer": Any,
        "GeneratorOutput": Any,
        "List": list,
        "Dict": dict,
        "Any": Any,
    }
    exec(_function(trainer_utils, "sanitize_data_source"), namespace)
    exec(_function(trainer_utils, "dump_per_dataset_eval_results"), namespace)
    folder_block = _cut(evaluate, "data_save_dir = (", "data_save_dir.mkdir(parents=True, exist_ok=True)")
    tokenizer = types.SimpleNamespace(decode=lambda ids: " ".join(f"t{i}" for i in ids))
    sources = ("openai/gsm8k", "math500")
    rng = random.Random(seed)
    truth: dict[str, Any] = {}
    for global_step in SKYRL_EVAL_STEPS:
        prompt_ids, response_ids, rewards, stop_reasons, envs, extras, groups = [], [], [], [], [], [], []
        for p in range(prompts):
            data_source = rng.choice(sources)
            ids = [rng.randint(5, 900) for _ in range(rng.randint(3, 7))]
            for reward in _binary_or_partial(rng, n):
                prompt_ids.append(ids)
                response_ids.append([rng.randint(5, 900) for _ in range(rng.randint(1, 6))])
                rewards.append(reward)
                stop_reasons.append(rng.choice(("stop", "stop", "length")))
                envs.append("gsm8k")
                extras.append({"data_source": data_source, "reward_spec": {"ground_truth": str(p)}})
                groups.append(f"{global_step}-{p}")
        local: dict[str, Any] = {
            "Path": Path,
            "cfg": types.SimpleNamespace(trainer=types.SimpleNamespace(export_path=str(folder))),
            "global_step": global_step,
        }
        exec(folder_block, local)
        concat_data_sources = [extra.get("data_source") for extra in extras]
        namespace["dump_per_dataset_eval_results"](
            local["data_save_dir"],
            tokenizer,
            {
                "prompt_token_ids": prompt_ids,
                "response_ids": response_ids,
                "rewards": rewards,
                "stop_reasons": stop_reasons,
            },
            concat_data_sources,
            envs,
            extras,
            {"eval/all/avg_score": float(np.mean(rewards))},
        )
        for data_source in sources:
            file_name = namespace["sanitize_data_source"](data_source)
            rows = zip(groups, concat_data_sources, strict=True)
            truth[f"dumped_evals/global_step_{global_step}_evals/{file_name}.jsonl"] = {
                "groups": [group for group, source_of_row in rows if source_of_row == data_source]
            }
    return truth


# --------------------------------------------------------------------------- prime-rl


class WriterUnavailable(Exception):
    """A trainer's writer cannot run here (a package it needs is not installed)."""


_PRIME_RL_SCRIPT = """
import asyncio, json, sys
from pathlib import Path

import orjson
import torch
import verifiers.v1 as vf
from verifiers.v1.configs.agent import WireAgentConfig
from verifiers.v1.trace import MessageNode, Timing
from verifiers.v1.types import AssistantMessage, UserMessage

{iter_trainable_traces}

{assign_advantages}


async def score_group(self, episodes):
{score_group}


def log_episodes(self, episodes, step, kind, subset):
{write}
    write()


spec = json.load(sys.stdin)
self = type("Monitor", (), {{}})()
self.output_dir = Path(spec["folder"])
self.length_penalty = None
for step in spec["steps"]:
    episodes = []
    for group in step["groups"]:
        members = []
        for e in group["episodes"]:
            task = vf.TraceTask(type="MathTask", data={{"question": group["question"]}}, key=group["id"])
            nodes = [
                MessageNode(message=UserMessage(content=group["question"]), token_ids=group["prompt"],
                            mask=[False] * len(group["prompt"]), timestamp=0.0),
                MessageNode(parent=0, message=AssistantMessage(content=e["answer"]), sampled=True,
                            token_ids=e["tokens"], mask=[True] * len(e["tokens"]), timestamp=0.0),
            ]
            rewards = {{name: (None if score is None else vf.Reward(score=score, weight=weight))
                        for name, (score, weight) in e["rewards"].items()}}
            trace = vf.Trace(id=e["id"] + "-t", task=task, agent=vf.AgentInfo(config=WireAgentConfig()),
                             nodes=nodes, rewards=rewards, ok=e["ok"], is_completed=True,
                             timing=Timing(start=0.0))
            members.append(vf.Episode(id=e["id"], task=task, group=vf.GroupInfo(id=group["id"]),
                                      run=vf.TrainRunInfo(id="run", work=vf.TrainWorkInfo(step=step["step"])),
                                      ok=e["ok"], traces=[trace]))
        asyncio.run(score_group(self, members))
        episodes += members
    log_episodes(self, episodes, step["step"], "train", "effective")
    print(json.dumps([
        [e.group.id, e.traces[0].nodes[1].advantages[0] if e.traces[0].nodes[1].advantages else None]
        for e in episodes if e.traces[0].ok
    ]))
"""


def write_prime_rl(folder: Path, *, prompts: int = 24, n: int = 4, seed: int = 10) -> dict[str, Any]:
    """prime-rl's ``rollouts/step_{N}/train/effective/traces.jsonl`` (its file monitor): one
    verifiers ``Episode`` record per line, its traces nested, rewards a dict of weighted scores,
    the GRPO advantage on each sampled token. The records are built and written by the
    verifiers package (``GRPO_VERIFIERS_DEPS``: a folder holding its dependencies, which
    conflict with this environment's) in a subprocess running prime-rl's blocks."""
    import subprocess
    import tempfile

    deps = os.environ.get("GRPO_VERIFIERS_DEPS")
    if not deps or not Path(deps).is_dir():
        raise WriterUnavailable("set GRPO_VERIFIERS_DEPS to a folder with verifiers' dependencies")
    base = source(PRIME_RL, "src/prime_rl/orchestrator/algo/base.py")
    routing = source(PRIME_RL, "src/prime_rl/orchestrator/algo/routing.py")
    grpo = source(PRIME_RL, "src/prime_rl/orchestrator/algo/grpo.py")
    monitor = source(PRIME_RL, "src/prime_rl/monitors/file.py")
    score = _cut(
        grpo,
        "traces = [trace for _, trace in iter_trainable_traces(episodes)]",
        "assign_advantages(trace, advantage)",
    )
    write = _cut(
        monitor,
        "def write() -> None:",
        "f.write(orjson.dumps(episode.to_record(), default=str, option=opts))",
    )
    script = _PRIME_RL_SCRIPT.format(
        iter_trainable_traces=_function(base, "iter_trainable_traces"),
        assign_advantages=_function(routing, "assign_advantages"),
        score_group="\n".join("    " + line for line in score.splitlines()),
        write="\n".join("    " + line for line in write.splitlines()),
    )
    rng = random.Random(seed)
    steps = []
    for step in range(1, STEPS + 1):
        groups = []
        for p in range(prompts):
            rewards = _binary_or_partial(rng, n)
            episodes = []
            for i, reward in enumerate(rewards):
                fmt = rng.choice((1.0, 0.0, None))
                episodes.append(
                    {
                        "id": f"s{step}p{p}e{i}",
                        "answer": f"answer {rng.randint(0, 99)}",
                        "tokens": [rng.randint(5, 900) for _ in range(rng.randint(1, 6))],
                        "rewards": {"correct": [reward, 1.0], "format": [fmt, 0.25]},
                        "ok": rng.random() > 0.04,  # an errored rollout: prime-rl trains on none of it
                    }
                )
            groups.append(
                {
                    "id": f"{step}-{p}",
                    "question": _prompt(rng, step * 1000 + p),
                    "prompt": [rng.randint(5, 900) for _ in range(rng.randint(2, 5))],
                    "episodes": episodes,
                }
            )
        steps.append({"step": step, "groups": groups})
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "write.py").write_text(script)
        mirror = (
            Path(os.environ.get("GRPO_TRAINER_MIRRORS", "/work/.mirror"))
            / "PrimeIntellect-ai+verifiers"
            / "repo"
        )
        archive = subprocess.run(
            ["git", "--git-dir", str(mirror), "archive", VERIFIERS[1], "verifiers"], capture_output=True
        )
        if archive.returncode != 0:
            raise WriterUnavailable(f"no mirror of {VERIFIERS[0]} at {VERIFIERS[1][:8]}")
        subprocess.run(["tar", "-x", "-C", scratch], input=archive.stdout, check=True)
        done = subprocess.run(
            [sys.executable, str(Path(scratch) / "write.py")],
            input=json.dumps({"folder": str(folder), "steps": steps}),
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": f"{scratch}:{deps}"},
        )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    truth: dict[str, Any] = {}
    for step, line in zip(range(1, STEPS + 1), done.stdout.splitlines(), strict=True):
        rows = json.loads(line)
        truth[f"rollouts/step_{step}/train/effective/traces.jsonl"] = {
            "groups": [group for group, _ in rows],
            "advantage": [advantage for _, advantage in rows],
        }
    return truth


# --------------------------------------------------------------------------- open-instruct


def write_open_instruct(folder: Path, *, prompts: int = 40, n: int = 8, seed: int = 8) -> dict[str, Any]:
    """open-instruct's ``{run_name}_rollouts_{shard:06d}.jsonl`` (``save_traces``): 10,000-row
    shards appended step after step, ``prompt_idx = i // n`` within the step, its advantage."""
    from dataclasses import asdict, dataclass

    rl_utils = source(OPEN_INSTRUCT, "open_instruct/rl_utils.py")
    loader = source(OPEN_INSTRUCT, "open_instruct/data_loader.py")
    namespace: dict[str, Any] = {
        "os": os,
        "json": json,
        "np": np,
        "asdict": asdict,
        "dataclass": dataclass,
        "logger": types.SimpleNamespace(info=lambda message: None),
        "model_utils": types.SimpleNamespace(Batch=Any),
        "data_types": types.SimpleNamespace(GenerationResult=Any, RequestInfo=Any),
        "Any": Any,
        "__name__": __name__,  # dataclasses look the class's module up
    }
    record_class = _cut(rl_utils, "class RolloutRecord:", "logprobs: list[float] | None = None", before=1)
    exec(record_class, namespace)
    exec(_function(rl_utils, "_get_request_info_for_sample"), namespace)
    exec(_function(rl_utils, "_save_rollouts"), namespace)
    advantage_block = _cut(loader, "scores = np.array(batch.scores)", "std_grouped_rewards = np.repeat(")
    standard = _cut(
        loader,
        "advantages = (scores - mean_grouped_rewards) / (std_grouped_rewards + 1e-8)",
        "advantages = (scores",
    )
    shard_size = int(_cut(rl_utils, "ROLLOUT_SHARD_SIZE = ", "ROLLOUT_SHARD_SIZE = ").split("=")[1])
    rng = random.Random(seed)
    truth: dict[str, Any] = {}
    written = 0
    for step in range(1, STEPS + 1):
        scores, groups = [], []
        for p in range(prompts):
            for reward in _binary_or_partial(rng, n):
                scores.append(reward)
                groups.append(f"{step}-{p}")
        batch = types.SimpleNamespace(
            queries=[[rng.randint(5, 900) for _ in range(4)] for _ in scores],
            scores=scores,
            datasets=["gsm8k"] * len(scores),
            ground_truths=[None] * len(scores),
        )
        result = types.SimpleNamespace(
            responses=[[rng.randint(5, 900) for _ in range(3)] for _ in scores],
            finish_reasons=["stop"] * len(scores),
            request_info=None,
            logprobs=None,
        )
        local: dict[str, Any] = {
            "np": np,
            "batch": batch,
            "self": types.SimpleNamespace(config=types.SimpleNamespace(num_samples_per_prompt_rollout=n)),
        }
        exec(advantage_block + "\n" + standard, local)
        namespace["_save_rollouts"](
            str(folder), "grpo_run", step, batch, result, local["advantages"], n, written // shard_size
        )
        shard = f"grpo_run_rollouts_{written // shard_size:06d}.jsonl"
        entry = truth.setdefault(shard, {"groups": [], "advantage": []})
        entry["groups"] += groups
        entry["advantage"] += [float(a) for a in local["advantages"]]
        written += len(scores)
    return truth


WRITE: dict[str, Callable[[Path], dict[str, Any]]] = {
    "verl": write_verl,
    "verl-v1": write_verl_v1,
    "trl": write_trl,
    "nemo-rl": write_nemo_rl,
    "roll": write_roll,
    "slime": write_slime,
    "skyrl": write_skyrl,
    "prime-rl": write_prime_rl,
    "areal": write_areal,
    "open-instruct": write_open_instruct,
}


def _quietly(write: Any, folder: Path) -> dict[str, Any]:
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):  # the writers print a line
        result: dict[str, Any] = write(folder)
    return result


def write_all(root: Path) -> dict[str, Any]:
    """Every dump under ``root/<name>/`` (slime's under ``rollout_data/``, AReaL's under
    ``rollout/``, as the trainers lay them out); the truth of each, by dump and file. A dump
    whose writer cannot run here (:class:`WriterUnavailable`) is left out."""
    truth: dict[str, Any] = {}
    layout = {
        "slime": "slime/rollout_data",
        "areal": "areal/rollout",
        "trl": "trl",
        "open-instruct": "open-instruct/rollouts",
    }
    for name, write in WRITE.items():
        folder = root / layout.get(name, name)
        folder.mkdir(parents=True, exist_ok=True)
        repo, path, function = WRITERS[name]
        try:
            files = _quietly(write, folder)
        except WriterUnavailable:
            shutil.rmtree(folder, ignore_errors=True)
            continue
        truth[name] = {
            "writer": {"repository": repo[0], "commit": repo[1], "path": path, "function": function},
            "folder": str(folder.relative_to(root)),
            "files": files,
        }
    return truth


TRUTH = Path(__file__).resolve().parent / "dump_truth.json"
"""The committed dumps' truth (:func:`write_all`'s answer for ``sample_data/dumps``)."""


def provenance_table(truth: dict[str, Any]) -> str:
    """The Markdown table of ``sample_data/dumps/README.md``: which writer wrote each folder."""
    lines = ["| folder | repository | commit | file | writer |", "| --- | --- | --- | --- | --- |"]
    for entry in truth.values():
        writer = entry["writer"]
        lines.append(
            f"| `{entry['folder']}` | {writer['repository']} | `{writer['commit'][:12]}` | "
            f"`{writer['path']}` | "
            f"{writer['function']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import tempfile

    target = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as scratch:  # the writers append (AReaL, open-instruct): start empty
        written = write_all(Path(scratch))
        committed = json.loads(TRUTH.read_text()) if TRUTH.exists() else {}
        written = {
            name: written.get(name, committed.get(name))
            for name in WRITE
            if name in written or name in committed
        }
        for entry in written.values():
            top = Path(entry["folder"]).parts[0]
            if not (Path(scratch) / top).exists():  # its writer could not run: the committed files stay
                continue
            shutil.rmtree(target / top, ignore_errors=True)
            shutil.copytree(Path(scratch) / top, target / top)
    TRUTH.write_text(json.dumps(written, separators=(",", ":")) + "\n")
    readme = target / "README.md"
    if readme.exists():
        text = readme.read_text()
        start = text.index("| folder |")
        end = text.index("\n\n", start) + 1 if "\n\n" in text[start:] else len(text)
        readme.write_text(text[:start] + provenance_table(written) + text[end:])
    print(f"wrote {sum(len(d['files']) for d in written.values())} files under {target}")
