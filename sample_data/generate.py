"""Regenerate the bundled sample rollouts: ``python sample_data/generate.py``.

A small, realistic GRPO rollout set: 40 prompts with 8 completions each plus 3 prompts
that kept a single completion (a filter upstream dropped the rest). Each row carries a
32-character hex uid shared by its group (``group_id``), the prompt and completion text,
a binary correctness reward (``correct``) and a continuous reward (``reward``:
correctness plus a format bonus minus a length penalty). Prompt difficulty varies, so
some groups are all correct, some all wrong and most mixed. ``export.json`` holds the same
rollouts as a JSON array of nested records (``meta.prompt_id``, ``reward.score``), as an
export from a labelling tool would. The output is deterministic.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
GROUP_SIZE = 8
TOPICS = ["sum", "product", "difference"]


def build_rows(seed: int = 20261129) -> list[dict[str, object]]:
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    difficulties = [0.0] * 8 + [1.0] * 6 + [rng.uniform(0.1, 0.9) for _ in range(26)] + [0.5] * 3
    for index, solve_rate in enumerate(difficulties):
        uid = f"{rng.getrandbits(128):032x}"
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        topic = TOPICS[index % len(TOPICS)]
        answer = {"sum": a + b, "product": a * b, "difference": a - b}[topic]
        prompt = f"What is the {topic} of {a} and {b}? Answer with a number in \\boxed{{}}."
        size = 1 if index >= 40 else GROUP_SIZE
        for sample in range(size):
            correct = rng.random() < solve_rate
            given = answer if correct else answer + rng.choice([-10, -1, 1, 2, 10])
            formatted = rng.random() < 0.8
            steps = rng.randint(1, 6)
            reasoning = " ".join(f"Step {s + 1}: work on the {topic}." for s in range(steps))
            completion = f"{reasoning} The answer is " + (
                f"\\boxed{{{given}}}." if formatted else f"{given}."
            )
            reward = float(correct) + (0.1 if formatted else 0.0) - 0.01 * steps
            rows.append(
                {
                    "group_id": uid,
                    "sample_index": sample,
                    "prompt": prompt,
                    "completion": completion,
                    "correct": int(correct),
                    "reward": round(reward, 4),
                }
            )
    rng.shuffle(rows)  # rollouts of a group arrive interleaved, as from an async sampler
    return rows


STEP_GROUP_SIZE = 6
JUDGE_SCORES = (0.1, 0.2, 0.3, 0.7, 0.9)  # an LLM judge's float32 scores: no float is exactly one


def build_steps(seed: int = 20261201) -> list[dict[str, object]]:
    """A training run of 8 steps over two data sources, 24 prompts each, 6 rollouts per prompt:
    ``math`` has a binary correctness reward, ``chat`` an LLM judge's float32 score. The model
    learns (more all-correct groups as steps go on) and the judge often gives one score to a
    whole group, which a float32 std does not always see as constant."""
    import numpy as np

    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    for step in range(1, 9):
        skill = 0.25 + 0.08 * step
        for source in ("math", "chat"):
            for prompt in range(24):
                uid = f"{rng.getrandbits(64):016x}"
                difficulty = rng.random()
                for _ in range(STEP_GROUP_SIZE):
                    if source == "math":
                        reward = float(rng.random() < max(0.0, min(1.0, skill + 0.6 - difficulty)))
                    elif difficulty < 0.5:
                        reward = float(np.float32(JUDGE_SCORES[prompt % len(JUDGE_SCORES)]))
                    else:
                        reward = float(np.float32(rng.choice(JUDGE_SCORES)))
                    rows.append({"step": step, "data_source": source, "uid": uid, "reward": reward})
    return rows


def write_long_run(path: Path, steps: int = 300) -> Path:
    """A run of ``steps`` steps, 16 prompts of 8 binary rollouts each, learning as it goes:
    what a report of a long run draws (not shipped: the report tests and docs/gen_dump_examples.py
    write it where they need it)."""
    import numpy as np

    rng = np.random.default_rng(5)
    step = np.repeat(np.arange(1, steps + 1), 16 * 8)
    skill = 0.2 + 0.6 * step / steps
    reward = (rng.random(step.size) < skill * rng.random(step.size) * 1.6).astype(np.float64)
    pq.write_table(
        pa.table({"step": step, "uid": np.repeat(np.arange(steps * 16), 8), "reward": reward}), path
    )
    return path


def main() -> None:
    steps = build_steps()
    pq.write_table(pa.Table.from_pylist(steps), HERE / "steps.parquet")
    print(f"wrote {len(steps)} rows to {HERE / 'steps.parquet'}")
    rows = build_rows()
    table = pa.Table.from_pylist(rows)
    table = table.replace_schema_metadata({"source": "grpo-cli sample_data/generate.py"})
    pq.write_table(table, HERE / "rollouts.parquet")
    with open(HERE / "rollouts.jsonl", "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    print(f"wrote {len(rows)} rows to {HERE / 'rollouts.parquet'} and {HERE / 'rollouts.jsonl'}")
    exported = [
        {
            "meta": {"prompt_id": row["group_id"], "sample": row["sample_index"]},
            "reward": {"score": row["reward"], "correct": row["correct"]},
        }
        for row in rows
    ]
    with open(HERE / "export.json", "w", encoding="utf-8") as handle:  # a JSON array of nested records
        handle.write("[\n" + ",\n".join(json.dumps(record) for record in exported) + "\n]\n")
    print(f"wrote {len(exported)} nested records to {HERE / 'export.json'}")


if __name__ == "__main__":
    main()
