"""Groupings a user gets wrong, and what the run says of them (issue #67 A): each finding in one
line with the key that mends it, in the summary JSON, gated by ``check --sound-grouping``; and
every hint the tool prints, followed, gives the right answer."""

from __future__ import annotations

import json
import random
import shlex
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import assert_one_line_error, write_jsonl
from tests.oracles.test_dumps import FROM, TRUTH, folder_of

STEPS, PROMPTS, G = 5, 40, 8


def stepped_rows(*, step_col: str = "step", seed: int = 0) -> list[dict[str, Any]]:
    """Issue #67 A.1's file: 5 steps of 40 prompts, 8 rollouts each per step, binary rewards."""
    rng = random.Random(seed)
    return [
        {step_col: step, "prompt": f"prompt {p}", "reward": float(rng.random() < 0.5)}
        for step in range(STEPS)
        for p in range(PROMPTS)
        for _ in range(G)
    ]


def summary_of(cli: Any, *args: Any) -> tuple[Any, dict[str, Any]]:
    result = cli("check", *args, "--summary-json", "-")
    assert result.exit_code in (0, 1), result.stderr
    return result, json.loads(result.stdout)


def args_of_fix(fix: dict[str, Any]) -> list[str]:
    """A finding's ``fix`` as the options a user types."""
    if "group_cols" in fix:
        return [arg for column in fix["group_cols"] for arg in ("-g", column)]
    return ["--group-size", str(fix["group_size"])]


@pytest.mark.parametrize("step_col", ["step", "global_step", "iteration", "epoch", "train_step"])
def test_a_prompt_key_without_the_step_is_found_and_its_fix_gives_groups_within_each_step(
    step_col: str, cli: Any, tmp_path: Path
) -> None:
    """``-g prompt`` on 5 steps reported 40 groups of 40, 100% active, no warning (the merged-groups
    warning fired only when some groups were oversized, not all). The run names the groups that
    span steps, and the key it prints, followed, gives the 200 groups of 8 the trainer had."""
    path = write_jsonl(tmp_path / "f.jsonl", stepped_rows(step_col=step_col))
    result, data = summary_of(cli, path, "-g", "prompt", "-r", "reward")
    (finding,) = data["findings"]
    assert finding["kind"] == "groups_span_steps" and finding["severity"] == "warning"
    assert finding["groups"] == PROMPTS and finding["fix"] == {"group_cols": ["prompt", step_col]}
    assert finding["message"].startswith(f"40 of 40 groups span several values of {step_col!r}")
    assert f"-g prompt -g {step_col} keys each group within its step" in finding["message"]
    assert f"warning: {finding['message']}" in result.stderr
    assert data["warnings"] == [finding["message"]]
    _, fixed = summary_of(cli, path, *args_of_fix(finding["fix"]), "-r", "reward")
    assert fixed["findings"] == [] and fixed["warnings"] == []
    assert fixed["groups"] == STEPS * PROMPTS and fixed["group_size"] == {"min": G, "median": G, "max": G}


def test_check_gates_on_a_grouping_finding(cli: Any, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "f.jsonl", stepped_rows())
    failed = cli("check", path, "-g", "prompt", "-r", "reward", "--sound-grouping")
    assert failed.exit_code == 1
    assert (
        "FAIL  sound-grouping: 1 (bound 0 grouping findings): groups_span_steps (40 groups)" in failed.stderr
    )
    passed = cli("check", path, "-g", "prompt", "-g", "step", "-r", "reward", "--sound-grouping")
    assert passed.exit_code == 0, passed.stderr
    assert "PASS  sound-grouping: 0 (bound 0 grouping findings)" in passed.stderr


def test_the_span_is_found_on_every_read_path(cli: Any, tmp_path: Path) -> None:
    """Streamed in small batches across files (a group's steps met in different chunks), or read
    whole: the same finding."""
    rows = stepped_rows()
    random.Random(1).shuffle(rows)
    folder = tmp_path / "shards"
    folder.mkdir()
    for i in range(3):
        pq.write_table(pa.Table.from_pylist(rows[i::3]), folder / f"part-{i}.parquet")
    _, whole = summary_of(cli, folder, "-g", "prompt", "-r", "reward")
    _, streamed = summary_of(
        cli, folder, "-g", "prompt", "-r", "reward", "--memory-limit-mb", "0", "--batch-rows", "37"
    )
    assert whole["findings"] == streamed["findings"] and whole["findings"][0]["groups"] == PROMPTS


def test_a_step_that_is_part_of_the_key_or_a_view_is_not_watched(cli: Any, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "f.jsonl", stepped_rows())
    _, keyed = summary_of(cli, path, "-g", "prompt", "-g", "step", "-r", "reward", "--by", "step")
    assert keyed["findings"] == []
    # a step that is not numeric is no step column to watch
    text = write_jsonl(tmp_path / "t.jsonl", [{**r, "step": f"s{r['step']}"} for r in stepped_rows()])
    _, unwatched = summary_of(cli, text, "-g", "prompt", "-r", "reward")
    assert unwatched["findings"] == []


def test_a_group_across_by_values_is_refused_with_the_key_that_mends_it(cli: Any, tmp_path: Path) -> None:
    """``--by step`` refused the run without saying that ``-g step`` keys each group within one."""
    path = write_jsonl(tmp_path / "f.jsonl", stepped_rows())
    refused = cli(
        "compute", path, "-g", "prompt", "-r", "reward", "--by", "step", "-o", tmp_path / "o.parquet"
    )
    assert_one_line_error(
        refused, "a group spans two values of --by 'step'", ": -g prompt -g step keys each group"
    )
    fix = shlex.split(refused.stderr.split(": -g ", 1)[1].split(" keys")[0])
    followed = cli("compute", path, "-g", *fix, "-r", "reward", "--by", "step", "-o", tmp_path / "o.parquet")
    assert followed.exit_code == 0, followed.stderr


def test_a_key_that_makes_every_rollout_a_singleton_names_the_share_and_the_varying_part(
    cli: Any, tmp_path: Path
) -> None:
    """Item 11 of the trainers' reports: a harness stamps a time on each prompt, and every rollout
    becomes a group of one. The finding names the share of singletons and that the keys differ
    only in their digits."""
    rows = [
        {"prompt": f"Solve {p} + {p} [sent 2026-12-06T10:{p:02d}:{i:02d}]", "reward": float(i % 2)}
        for p in range(20)
        for i in range(8)
    ]
    path = write_jsonl(tmp_path / "stamped.jsonl", rows)
    _, data = summary_of(cli, path, "-g", "prompt", "-r", "reward")
    (finding,) = data["findings"]
    assert finding["kind"] == "singleton_groups" and finding["groups"] == 160
    assert finding["message"].startswith("160 of 160 groups (100.0%) are singletons")
    assert (
        "the keys differ only in their digits or hexadecimal runs: "
        "'Solve 0 + 0 [sent 2026-12-06T10:00:00]' and" in finding["message"]
    )
    distinct = write_jsonl(
        tmp_path / "uids.jsonl",
        [{"prompt": f"{random.Random(i).getrandbits(64):x}", "reward": 1.0} for i in range(40)],
    )
    _, uids = summary_of(cli, distinct, "-g", "prompt", "-r", "reward")
    assert "differ only in their digits" not in uids["findings"][0]["message"]  # a bare uid varies whole


def test_merged_groups_name_the_key_that_mends_them(cli: Any, tmp_path: Path) -> None:
    """Most groups of 8 and a few of 16 (a prompt drawn twice in a step, in consecutive rows):
    the hint ``--group-size 8``, followed, gives groups of 8."""
    rows = [{"prompt": f"p{p}", "reward": float(i % 3 == 0)} for p in range(20) for i in range(8)]
    rows += [{"prompt": "p0", "reward": float(i % 2)} for i in range(8)]  # p0 drawn again, after the rest
    ordered = sorted(rows, key=lambda r: int(str(r["prompt"])[1:]))  # the trainer's consecutive blocks
    path = write_jsonl(tmp_path / "merged.jsonl", ordered)
    _, data = summary_of(cli, path, "-g", "prompt", "-r", "reward")
    (finding,) = data["findings"]
    assert finding["kind"] == "merged_groups" and finding["fix"] == {"group_size": 8}
    _, fixed = summary_of(cli, path, *args_of_fix(finding["fix"]), "-r", "reward")
    assert fixed["groups"] == 21 and fixed["group_size"]["max"] == 8 and fixed["findings"] == []


@pytest.mark.parametrize("name", list(TRUTH))
def test_no_dump_read_with_from_is_advised_against_its_trainers_grouping(name: str, cli: Any) -> None:
    """``--from nemo-rl`` warned that 39 groups were merged and advised ``--group-size 4``, which
    gave 282 rows that differ from NeMo-RL's own: that merging is NeMo-RL's grouping. A dump's
    own grouping is an ``info`` finding, never a warning, and the dump's groups are the
    trainer's (``tests/dump_truth.json``)."""
    _, data = summary_of(cli, folder_of(name), "--from", FROM[name])
    assert [f for f in data["findings"] if f["severity"] == "warning"] == [], data["findings"]
    assert all(f["fix"] is None for f in data["findings"])
    if name == "nemo-rl":
        (info,) = data["findings"]
        assert info["kind"] == "merged_groups" and info["groups"] == 39
        assert (
            "the key is NeMo-RL's own grouping" in info["message"] and "--group-size" not in info["message"]
        )
        assert data["warnings"] == []


def test_nemo_rl_verify_passes_the_grouping_the_dump_is_read_with(cli: Any) -> None:
    result = cli("check", folder_of("nemo-rl"), "--from", "nemo-rl", "--verify", "--sound-grouping")
    assert result.exit_code == 0, result.stderr
    assert "PASS  verify-advantage-col: 0 rows differ" in result.stderr


@pytest.mark.parametrize("name", list(TRUTH))
def test_a_dump_given_without_from_hears_the_trainer_and_the_folder(name: str, cli: Any) -> None:
    """A dump given without ``--from`` never heard "use --from verl", and a folder one level too
    high (``slime``, ``areal``, ``open-instruct``) failed with no hint that the files sit in a
    subfolder. Both are said, and the command they name reads the trainer's groups."""
    top = folder_of(name).parent if name in ("slime", "areal", "open-instruct") else folder_of(name)
    plain = cli("check", top)
    line = plain.stderr.strip().splitlines()[-1]
    assert plain.exit_code == 2 and "use --from " in line, line
    told = shlex.split(line.split("use --from ", 1)[1])
    trainer, folder = told[0], (told[1] if len(told) > 1 else str(top))
    assert trainer == FROM[name]
    assert Path(folder).resolve() == folder_of(name).resolve()
    followed = cli("check", folder, "--from", trainer)
    assert followed.exit_code == 0, followed.stderr
    if top != folder_of(name):  # --from with the folder a level too high names the subfolder
        high = cli("check", top, "--from", FROM[name])
        assert_one_line_error(high, f"sit in {folder_of(name)}: name that folder")


@pytest.mark.parametrize("name", [n for n in TRUTH if n != "verl-v1"])
def test_the_wrong_from_names_the_right_one_whole(name: str, cli: Any) -> None:
    """``--from areal`` on an open-instruct dump named ``--from open-instr`` (cut): every wrong
    ``--from`` names the right trainer whole, and it reads the dump."""
    wrong = "areal" if name != "areal" else "verl"
    result = cli("check", folder_of(name), "--from", wrong)
    assert result.exit_code == 2
    assert f"use --from {FROM[name]}" in result.stderr.split("\n")[0] + " ", result.stderr
    rest = result.stderr.split(f"use --from {FROM[name]}", 1)[1]
    assert rest[:1] in ("", "\n", " "), rest[:20]
