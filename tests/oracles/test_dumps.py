"""``--from TRAINER``: the trainers' dumps, written by the trainers' own writer code, read back.

The dumps under ``sample_data/dumps`` were written by :mod:`tests.dump_writers` (each
trainer's writer, cut verbatim from its source); ``tests/dump_truth.json`` holds the groups
the trainer had in memory. Where the trainers' sources are present the dumps are written
again and must be the committed ones; everywhere, each adapter's groups must be the
trainer's and its advantages the trainer's preset on those groups.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from grpo_cli import add_advantages
from grpo_cli.errors import GrpoError
from grpo_cli.jobs import compute_dataset
from grpo_cli.options.config import resolve_config
from grpo_cli.trainers.dumps import DUMPS, TRAINERS, of_table, open_dump, opened
from tests.conftest import assert_one_line_error, bits, digest, one_line_error

ROOT = Path(__file__).resolve().parents[2]
DUMP_ROOT = ROOT / "sample_data" / "dumps"
TRUTH: dict[str, Any] = json.loads((Path(__file__).resolve().parents[1] / "dump_truth.json").read_text())
FROM = {
    "verl": "verl",
    "verl-v1": "verl",
    "trl": "trl",
    "nemo-rl": "nemo-rl",
    "roll": "roll",
    "slime": "slime",
    "skyrl": "skyrl",
    "prime-rl": "prime-rl",
    "areal": "areal",
    "open-instruct": "open-instruct",
}


def folder_of(name: str) -> Path:
    return DUMP_ROOT / str(TRUTH[name]["folder"])


def truth_labels(name: str, shards: list[Any]) -> list[str]:
    """The trainer's group of every row, in the order the adapter reads the files."""
    base = folder_of(name)
    labels: list[str] = []
    for shard in shards:
        relative = Path(shard.display).resolve().relative_to(base.resolve()).as_posix()
        labels += TRUTH[name]["files"][relative]["groups"]
    return labels


def same_partition(ours: list[Any], theirs: list[str]) -> bool:
    """Whether two labelings of the same rows put the same rows together."""
    forward: dict[Any, str] = {}
    backward: dict[str, Any] = {}
    for a, b in zip(ours, theirs, strict=True):
        if forward.setdefault(a, b) != b or backward.setdefault(b, a) != a:
            return False
    return True


def computed(name: str, tmp_path: Path, **values: Any) -> tuple[pa.Table, Any, Any]:
    """compute --from on the committed dump: the output table, the summary, the opened dump."""
    out = tmp_path / f"{name}.parquet"
    with opened(FROM[name], [str(folder_of(name))]) as dump:
        config = resolve_config({"stats_cols": True, **values}, dump=dump.defaults)
        summary = compute_dataset(dump.inputs, out, config)
        shards = list(dump.inputs.shards)
    return pq.read_table(out), summary, (dump, shards, config)


def keys_of(table: pa.Table, config: Any, shards: list[Any]) -> list[Any]:
    if config.group_size is not None:
        return [row // config.group_size for row in range(table.num_rows)]
    columns = [table.column(c).to_pylist() for c in config.group_cols]
    return [json.dumps(values) for values in zip(*columns, strict=True)]


# --------------------------------------------------------------------------- written by the trainers


def test_the_committed_dumps_are_what_the_trainers_writers_write(tmp_path: Path) -> None:
    from tests.dump_writers import provenance_table, write_all

    truth = write_all(tmp_path)  # skips where a trainer's source is not fetched
    # prime-rl's records are written by the verifiers package, whose dependencies only a
    # GRPO_VERIFIERS_DEPS folder holds: without it, that dump is left out here
    assert set(TRUTH) - set(truth) <= {"prime-rl"}
    assert_same_data(truth, {name: TRUTH[name] for name in truth}, "truth")
    for name, entry in truth.items():
        for relative in entry["files"]:
            ours, committed = tmp_path / entry["folder"] / relative, DUMP_ROOT / entry["folder"] / relative
            if ours.suffix == ".parquet":
                assert_same_data(
                    pq.read_table(ours).to_pydict(), pq.read_table(committed).to_pydict(), relative
                )
            elif ours.suffix == ".pt":
                assert torch.load(ours, weights_only=True) == torch.load(committed, weights_only=True)
            elif ours.read_bytes() != committed.read_bytes():  # JSON: a trainer's float32 may differ
                assert_same_data(_json_records(ours), _json_records(committed), f"{name} {relative}")
    assert provenance_table(TRUTH) in (DUMP_ROOT / "README.md").read_text()


TRAINER_FLOATS = {"advantage", "advantages"}
"""Fields the trainers' own float32 arithmetic wrote: their bits follow the CPU that ran it (its
vector width, its BLAS), so they are compared within what that arithmetic allows, everything else
exactly."""

TRAINER_FLOAT_BOUND = 2.0**-12
"""Relative to ``1 + |value|``: a few float32 ulps of each operation, and the cancellation of
NeMo-RL's ``E[x^2] - E[x]^2`` (2**-12 is about 2.4e-4; a wrong group or formula moves an advantage
by 1e-2 or more)."""


def _json_records(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_same_data(ours: Any, theirs: Any, where: str, *, trainer_float: bool = False) -> None:
    """Equal, field by field, except that a float under a :data:`TRAINER_FLOATS` field may differ by
    :data:`TRAINER_FLOAT_BOUND`."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and ours.keys() == theirs.keys(), where
        for key, value in theirs.items():
            assert_same_data(
                ours[key], value, f"{where}.{key}", trainer_float=trainer_float or key in TRAINER_FLOATS
            )
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same_data(a, b, f"{where}[{i}]", trainer_float=trainer_float)
    elif trainer_float and isinstance(theirs, float) and isinstance(ours, float):
        assert abs(ours - theirs) <= TRAINER_FLOAT_BOUND * (1 + abs(theirs)), (where, ours, theirs)
    else:
        assert type(ours) is type(theirs) and ours == theirs, (where, ours, theirs)


def test_a_trainers_float32_field_is_compared_within_its_bound_and_nothing_else_is() -> None:
    """The comparison of the committed dumps: a float32 advantage one ulp apart passes; the same
    difference in a reward, a group label, or an advantage off by 1e-3 fails."""
    row = {"rewards": [1.0], "advantages": [[0.21821734309196472]], "idx": 0}
    assert_same_data({**row, "advantages": [[0.2182174175977707]]}, row, "row")
    for changed in ({"rewards": [1.0000001]}, {"idx": 1}, {"advantages": [[0.2192]]}, {"idx": 0.0}):
        with pytest.raises(AssertionError):
            assert_same_data({**row, **changed}, row, "row")


# --------------------------------------------------------------------------- the groups and the advantages


@pytest.mark.parametrize("name", list(TRUTH))
def test_the_derived_groups_are_the_trainers_own(name: str, tmp_path: Path) -> None:
    table, summary, (_, shards, config) = computed(name, tmp_path)
    labels = truth_labels(name, shards)
    assert table.num_rows == len(labels) == summary.rows
    assert same_partition(keys_of(table, config, shards), labels)
    assert summary.groups == len(set(labels))
    assert summary.input["from"]["trainer"] == DUMPS[name].name
    assert summary.options["preset"] == DUMPS[name].preset


@pytest.mark.parametrize("name", list(TRUTH))
def test_the_advantages_are_the_trainers_preset_on_the_trainers_groups(name: str, tmp_path: Path) -> None:
    table, _, (_, shards, config) = computed(name, tmp_path)
    truth = pa.table(
        {
            "truth": truth_labels(name, shards),
            "step": table.column(config.batch_col),
            **{r.column: table.column(r.column) for r in config.rewards},
            **({config.length_col: table.column(config.length_col)} if config.length_col else {}),
        }
    )
    weights = {r.column: r.weight for r in config.rewards}
    expected = add_advantages(
        truth,
        reward_col=weights,
        group_col="truth",
        preset=DUMPS[name].preset,
        batch_col="step",
        advantage_col="expected",
        **dict(DUMPS[name].settings),
    )
    column = config.advantage_col
    assert (bits(table.column(column).to_numpy()) == bits(expected.column("expected").to_numpy())).all()


def test_a_dump_that_also_holds_an_advantage_field_keeps_it_and_names_the_new_one_apart(
    cli: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "verl"
    folder.mkdir()
    lines = (folder_of("verl") / "1.jsonl").read_text().splitlines()
    (folder / "1.jsonl").write_text(
        "".join(json.dumps({**json.loads(x), "advantage": 7.0}) + "\n" for x in lines)
    )
    out = tmp_path / "out.parquet"
    result = cli("compute", folder, "--from", "verl", "-o", out, "-q")
    assert result.exit_code == 0, result.stderr
    written = pq.read_table(out)
    assert set(written.column("advantage").to_pylist()) == {7.0}
    assert "recomputed_advantage" in written.column_names


def test_trl_its_own_advantage_is_kept_and_the_new_one_is_named_apart(tmp_path: Path) -> None:
    table, summary, _ = computed("trl", tmp_path)
    assert table.column_names[:6] == [
        "step",
        "prompt",
        "completion",
        "correctness_reward",
        "format_reward",
        "advantage",
    ]
    assert "recomputed_advantage" in table.column_names
    assert summary.input["from"]["group_key"] == "consecutive blocks of 8 rows in each file"
    theirs = [a for entry in TRUTH["trl"]["files"].values() for a in entry["advantage"]]
    assert table.column("advantage").to_pylist() == theirs


# --------------------------------------------------------------------------- the CLI, with no other option


@pytest.mark.parametrize("name", list(TRUTH))
def test_compute_and_check_need_no_other_option(name: str, cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    summary = tmp_path / "summary.json"
    result = cli("compute", folder_of(name), "--from", FROM[name], "-o", out, "--summary-json", summary, "-q")
    assert result.exit_code == 0, result.stderr
    record = json.loads(summary.read_text())
    assert record["input"]["from"]["trainer"] == DUMPS[name].name
    import duckdb
    import polars as pl

    assert pl.read_parquet(out).height == record["rows"]
    assert duckdb.execute(f"select count(*) from '{out}'").fetchall() == [(record["rows"],)]
    checked = cli("check", folder_of(name), "--from", FROM[name])
    assert checked.exit_code == 0, checked.stderr
    assert f"{DUMPS[name].trainer} dump" in checked.stderr


@pytest.mark.parametrize("name", ["trl", "nemo-rl", "prime-rl", "open-instruct"])
def test_check_verify_compares_the_trainers_own_advantage_with_its_preset(name: str, cli: Any) -> None:
    result = cli("check", folder_of(name), "--from", FROM[name], "--verify")
    assert result.exit_code == 0, result.stderr
    assert "PASS  verify-advantage-col: 0 rows differ" in result.stderr


def test_check_verify_fails_a_trl_dump_whose_advantage_was_altered(cli: Any, tmp_path: Path) -> None:
    folder = tmp_path / "trl"
    shutil.copytree(folder_of("trl"), folder)
    target = folder / "completions" / "completions_00020.parquet"
    table = pq.read_table(target)
    advantage = table.column("advantage").to_pylist()
    advantage[17] = advantage[17] + 0.25
    pq.write_table(table.set_column(5, "advantage", pa.array(advantage)), target)
    result = cli("check", folder, "--from", "trl", "--verify")
    assert result.exit_code == 1, result.stderr
    assert "FAIL  verify-advantage-col: 1 rows differ" in result.stderr
    assert "row 17" in result.stderr


def test_nemo_rl_tokens_that_disagree_fail_the_verification_on_their_row(cli: Any, tmp_path: Path) -> None:
    folder = tmp_path / "nemo"
    shutil.copytree(folder_of("nemo-rl"), folder)
    target = folder / "train_data_step2.jsonl"
    lines = target.read_text().splitlines()
    record = json.loads(lines[3])
    mask = record["token_loss_mask"][0]
    last = max(i for i, keep in enumerate(mask) if keep)
    record["advantages"][0][last] += 0.5
    lines[3] = json.dumps(record)
    target.write_text("\n".join(lines) + "\n")
    result = cli("check", folder, "--from", "nemo-rl", "--verify")
    assert result.exit_code == 1, result.stderr
    assert "row 3" in result.stderr and "train_data_step2.jsonl" in result.stderr


def _shorter(values: list[Any]) -> list[Any]:
    return values[:-1]


@pytest.mark.parametrize(
    ("field", "edit", "reason"),
    [
        ("token_loss_mask", lambda v: v + v, "the field token_loss_mask holds 2 elements, not one"),
        (
            "advantages",
            lambda v: [_shorter(v[0])],
            "advantages and token_loss_mask differ in length ({n1} and {n})",
        ),
        (
            "token_ids",
            lambda v: [_shorter(v[0])],
            "token_ids and token_loss_mask differ in length ({n1} and {n})",
        ),
        ("token_loss_mask", lambda v: [[0] * len(v[0])], "token_loss_mask keeps no token (no response)"),
    ],
)
def test_a_nemo_rl_record_whose_token_lists_do_not_line_up_is_named_by_file_and_line(
    field: str, edit: Any, reason: str, cli: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "nemo"
    shutil.copytree(folder_of("nemo-rl"), folder)
    target = folder / "train_data_step2.jsonl"
    lines = target.read_text().splitlines()
    record = json.loads(lines[3])
    tokens = len(record["token_loss_mask"][0])
    record[field] = edit(record[field])
    lines[3] = json.dumps(record)
    target.write_text("\n".join(lines) + "\n")
    assert_one_line_error(
        cli("check", folder, "--from", "nemo-rl"),
        f"{target}, line 4: " + reason.format(n=tokens, n1=tokens - 1),
    )


def test_explicit_options_override_what_the_dump_implies(cli: Any, tmp_path: Path) -> None:
    summary = tmp_path / "s.json"
    result = cli(
        "check",
        folder_of("trl"),
        "--from",
        "trl",
        "--group-size",
        "4",
        "-r",
        "correctness_reward",
        "--preset",
        "verl",
        "--summary-json",
        summary,
    )
    assert result.exit_code == 0, result.stderr
    record = json.loads(summary.read_text())
    assert record["groups"] == 1536 // 4
    assert record["options"]["preset"] == "verl"
    assert record["options"]["reward_cols"] == [{"column": "correctness_reward", "weight": 1.0}]
    assert record["input"]["from"]["group_key"] == "consecutive blocks of 4 rows in each file"


def test_a_key_that_names_rollouts_is_warned_about(cli: Any) -> None:
    result = cli("check", folder_of("slime"), "--from", "slime", "-g", "index")
    assert result.exit_code == 0, result.stderr
    assert "warning: 1,536 of 1,536 groups (100.0%) are singletons: the group key index" in result.stderr


def test_the_summary_says_which_adapter_read_the_dump_and_how_the_key_was_derived(cli: Any) -> None:
    result = cli("check", folder_of("verl-v1"), "--from", "verl")
    assert "a verl (v1 trainer) dump (3 file(s), steps 1-3)" in result.stderr
    assert "the part of uid before the first '_'" in result.stderr
    for name in ("verl", "trl"):  # read as they are, and rewritten privately
        summary = json.loads(
            cli("check", folder_of(name), "--from", FROM[name], "--summary-json", "-", "-q").stdout
        )
        assert summary["input"]["path"] == str(folder_of(name))


# --------------------------------------------------------------------------- the table API


def test_the_table_api_reads_one_dump_file_held_in_memory(tmp_path: Path) -> None:
    import polars as pl

    from grpo_cli import summarize

    trl = pq.read_table(folder_of("trl") / "completions" / "completions_00010.parquet")
    table, _, _ = computed("trl", tmp_path)
    out = add_advantages(trl, from_="trl")
    assert (
        out.column("recomputed_advantage").to_pylist()
        == table.column("recomputed_advantage").to_pylist()[:512]
    )
    assert out.column("advantage").equals(trl.column("advantage"))
    verl = pl.read_ndjson(folder_of("verl-v1") / "2.jsonl")
    lazy = add_advantages(verl.lazy(), from_="verl")
    assert isinstance(lazy, pl.LazyFrame)
    labels = TRUTH["verl-v1"]["files"]["2.jsonl"]["groups"]
    assert summarize(verl, from_="verl").groups == len(set(labels))
    nemo = pl.read_ndjson(folder_of("nemo-rl") / "train_data_step1.jsonl")
    assert summarize(nemo, from_="nemo-rl").groups == len(
        set(TRUTH["nemo-rl"]["files"]["train_data_step1.jsonl"]["groups"])
    )


def test_a_nemo_rl_table_is_one_step_unless_it_names_its_steps() -> None:
    import polars as pl

    from grpo_cli import summarize

    first = pl.read_ndjson(folder_of("nemo-rl") / "train_data_step1.jsonl").to_arrow()
    groups = len(set(TRUTH["nemo-rl"]["files"]["train_data_step1.jsonl"]["groups"]))
    # the same rollouts as two steps: a prompt in each is a group in each, not one group
    steps = pa.concat_tables(
        [first.append_column("step", pa.array([s] * first.num_rows, pa.int64())) for s in (1, 2)]
    )
    assert summarize(steps, from_="nemo-rl").groups == 2 * groups
    assert summarize(first, from_="nemo-rl").groups == groups
    rewards = first.column("rewards").to_pylist()
    rewards[1] = [1.0, 0.0]
    broken = first.set_column(first.schema.get_field_index("rewards"), "rewards", pa.array(rewards))
    with pytest.raises(GrpoError) as refused:
        add_advantages(broken, from_="nemo-rl")
    assert refused.value.message == "the table, row 1: the field rewards holds 2 elements, not one"


def test_the_table_api_refuses_a_table_of_another_trainer() -> None:

    trl = pq.read_table(folder_of("trl") / "completions" / "completions_00010.parquet")
    with pytest.raises(
        GrpoError, match="the table is not a verl dump: it has no input, output, score column"
    ):
        add_advantages(trl, from_="verl")


# --------------------------------------------------------------------------- bad dumps


def test_a_truncated_dump_file_is_refused_in_one_line(cli: Any, tmp_path: Path) -> None:
    folder = tmp_path / "verl"
    shutil.copytree(folder_of("verl"), folder)
    data = (folder / "3.jsonl").read_bytes()
    (folder / "3.jsonl").write_bytes(data[:-40])
    out = tmp_path / "out.parquet"
    assert_one_line_error(cli("compute", folder, "--from", "verl", "-o", out), "3.jsonl, line 960")
    assert not out.exists()


def test_a_truncated_roll_object_is_refused_as_truncated(cli: Any, tmp_path: Path) -> None:
    folder = tmp_path / "roll"
    shutil.copytree(folder_of("roll"), folder)
    target = folder / "rollout_dump_data.step_1.jsonl"
    target.write_bytes(target.read_bytes()[:5000])
    out = tmp_path / "out.parquet"
    assert_one_line_error(cli("compute", folder, "--from", "roll", "-o", out), "step_1.jsonl: truncated")
    assert not out.exists()


def test_a_missing_step_is_refused_and_named(cli: Any, tmp_path: Path) -> None:
    folder = tmp_path / "verl"
    shutil.copytree(folder_of("verl"), folder)
    (folder / "2.jsonl").unlink()
    out = tmp_path / "out.parquet"
    assert_one_line_error(
        cli("compute", folder, "--from", "verl", "-o", out),
        f"{folder}: step 2 is missing (verl writes one file per step; the folder holds steps 1-3 but "
        "not 2); name the files to read to skip it",
    )
    assert not out.exists()
    named = cli("check", folder / "1.jsonl", folder / "3.jsonl", "--from", "verl")
    assert named.exit_code == 0, named.stderr


def test_a_missing_step_of_a_dump_in_step_folders_names_the_folder_given(cli: Any, tmp_path: Path) -> None:
    folder = tmp_path / "prime"
    shutil.copytree(folder_of("prime-rl"), folder)
    shutil.rmtree(folder / "rollouts" / "step_2")
    assert_one_line_error(
        cli("check", folder, "--from", "prime-rl"),
        f"{folder}: step 2 is missing (prime-rl writes one file per step; the folder holds steps 1-3 but "
        "not 2); name the files to read to skip it",
    )


def test_a_generation_batch_split_across_two_files_is_refused(cli: Any, tmp_path: Path) -> None:
    folder = tmp_path / "trl" / "completions"
    folder.mkdir(parents=True)
    first = pq.read_table(folder_of("trl") / "completions" / "completions_00010.parquet")
    second = pq.read_table(folder_of("trl") / "completions" / "completions_00020.parquet")
    pq.write_table(first.slice(0, 509), folder / "completions_00010.parquet")
    pq.write_table(pa.concat_tables([first.slice(509), second]), folder / "completions_00020.parquet")
    out = tmp_path / "out.parquet"
    assert_one_line_error(
        cli("compute", folder.parent, "--from", "trl", "-o", out),
        "completions_00010.parquet: 509 rows are not a whole number of groups of 8",
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("name", "other", "fragment"),
    [
        ("roll", "verl", "holds no verl dump file"),
        ("trl", "verl", "it holds a TRL dump"),
        ("verl", "slime", "it holds a verl dump"),
        ("areal", "verl", "it holds an AReaL dump"),
        ("nemo-rl", "roll", "holds no ROLL dump file"),
    ],
)
def test_another_trainers_dump_named_with_from_is_refused(
    name: str, other: str, fragment: str, cli: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out.parquet"
    assert_one_line_error(cli("compute", folder_of(name), "--from", other, "-o", out), fragment)
    assert not out.exists()


def test_another_trainers_file_named_with_from_is_refused_with_a_hint(cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    result = cli("compute", folder_of("nemo-rl") / "train_data_step1.jsonl", "--from", "verl", "-o", out)
    assert_one_line_error(
        result, "not a verl dump: it has no input, output, score, step field", "use --from nemo-rl"
    )
    assert not out.exists()


def test_a_file_named_as_one_trainer_writes_but_holding_anothers_fields_is_hinted_by_its_fields(
    cli: Any, tmp_path: Path
) -> None:
    misnamed = tmp_path / "dump" / "rollout_dump_data.step_1.jsonl"  # ROLL's name, verl's fields
    misnamed.parent.mkdir()
    shutil.copy(folder_of("verl") / "1.jsonl", misnamed)
    result = cli("compute", misnamed, "--from", "nemo-rl", "-o", tmp_path / "out.parquet")
    assert_one_line_error(result, "not a NeMo-RL dump: it has no content, rewards", "use --from verl")
    assert "--from roll" not in result.stderr


@pytest.mark.parametrize("suffix", [".json", ".log"])
def test_a_dump_file_under_another_name_is_read_in_its_trainers_format(
    suffix: str, cli: Any, tmp_path: Path
) -> None:
    renamed = tmp_path / f"1{suffix}"  # JSON lines, whatever the name says
    shutil.copy(folder_of("verl") / "1.jsonl", renamed)
    result = cli("check", renamed, "--from", "verl", "--summary-json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["groups"] == len(set(TRUTH["verl"]["files"]["1.jsonl"]["groups"]))


PLACEHOLDERS = {
    "step": "7",
    "step:05d": "00007",
    "N": "7",
    "rollout_id": "7",
    "data_source": "gsm8k",
    "version": "7",
    "task_id": "3",  # AReaL's task IDs are integers
    "run_name": "run",
    "shard:06d": "000007",
}


@pytest.mark.parametrize("name", [name for name in DUMPS if name != "verl-v1"])  # verl's names
def test_the_file_names_a_refusal_shows_are_the_names_the_adapter_reads(
    name: str, cli: Any, tmp_path: Path
) -> None:
    import re

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a dump\n")
    dump = DUMPS[name]
    result = cli("check", empty, "--from", FROM[name])
    shown = re.search(
        rf"holds no {re.escape(dump.trainer)} dump file \({re.escape(dump.trainer)} writes (\S+), with",
        result.stderr,
    )
    assert shown is not None, result.stderr
    relative = re.sub(r"\{([^}]*)\}", lambda m: PLACEHOLDERS[m.group(1)], shown.group(1))
    made = tmp_path / "named" / relative
    made.parent.mkdir(parents=True)
    made.write_text("")
    from grpo_cli.trainers.dumps.files import _files_in, _step_of

    assert _files_in(dump, tmp_path / "named") == [made]
    if "{step" in shown.group(1) or "{N}" in shown.group(1):
        assert _step_of(dump, made) == 7


def test_a_ray_cluster_refuses_a_dump_in_one_line(cli: Any, tmp_path: Path) -> None:
    """A dump is read on this machine; a cluster's workers would not see its Parquet copies."""
    result = cli(
        "compute", folder_of("verl"), "--from", "verl", "--engine", "ray", "--ray-address", "127.0.0.1:1",
        "-o", tmp_path / "o",
    )  # fmt: skip
    assert_one_line_error(result, "a Ray cluster's workers read Parquet files", "1.jsonl")
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- pickles are data, never code


class _Runs:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(cli: Any, tmp_path: Path) -> None:
    folder = tmp_path / "rollout_data"
    folder.mkdir()
    marker = tmp_path / "ran"
    with open(folder / "0.pt", "wb") as f:
        pickle.dump({"rollout_id": 0, "samples": [_Runs(str(marker))]}, f)
    out = tmp_path / "out.parquet"
    line = one_line_error(cli("compute", folder, "--from", "slime", "-o", out), 2, "0.pt: refused")
    assert "weights_only=True" in line
    assert not marker.exists() and not out.exists()


def test_a_slime_reward_dict_is_read_as_a_struct(cli: Any, tmp_path: Path) -> None:
    folder = tmp_path / "rollout_data"
    folder.mkdir()
    samples = [
        {
            "group_index": i // 4,
            "index": i,
            "reward": {"score": float(i % 2), "acc": True},
            "status": "completed",
        }
        for i in range(16)
    ]
    torch.save({"rollout_id": 0, "samples": samples}, folder / "0.pt")
    result = cli("check", folder, "--from", "slime", "-r", "reward.score")
    assert result.exit_code == 0, result.stderr
    assert "groups                     4" in result.stderr


def test_every_trainer_has_a_committed_dump() -> None:
    assert {DUMPS[name].trainer.split(" ")[0] for name in TRUTH} == {DUMPS[t].trainer for t in TRAINERS}
    assert set(FROM.values()) == set(TRAINERS)


def test_an_unknown_trainer_is_refused_with_the_choices_and_a_close_one() -> None:
    choices = "verl, trl, nemo-rl, roll, slime, skyrl, prime-rl, areal, open-instruct"
    with pytest.raises(GrpoError) as refused:
        open_dump("openrlhf", [str(DUMP_ROOT / "verl")])
    assert refused.value.message == f"--from must be one of {choices}, got 'openrlhf'"
    with pytest.raises(GrpoError) as refused:
        add_advantages(pa.table({"reward": [1.0]}), from_="trll")
    assert refused.value.message == f"from_ must be one of {choices}, got 'trll'; did you mean 'trl'?"


def test_the_private_copies_are_removed_and_the_dump_is_untouched(tmp_path: Path) -> None:
    before = {p.name: digest(p) for p in folder_of("roll").iterdir()}
    with opened("roll", [str(folder_of("roll"))]) as dump:
        scratch = [shard.path for shard in dump.inputs.shards]
        assert all(path.exists() for path in scratch)
        assert [shard.source for shard in dump.inputs.shards] == sorted(folder_of("roll").iterdir())
        compute_dataset(dump.inputs, tmp_path / "out.parquet", resolve_config({}, dump=dump.defaults))
    assert not any(path.exists() for path in scratch)
    assert {p.name: digest(p) for p in folder_of("roll").iterdir()} == before


# --------------------------------------------------------------------------- the primitives, without --from


def test_key_before_rebuilds_verl_v1_groups_without_the_adapter(cli: Any, tmp_path: Path) -> None:
    summary = tmp_path / "s.json"
    files = [str(p) for p in sorted(folder_of("verl-v1").glob("*.jsonl"))]
    result = cli(
        "check",
        *files,
        "-g",
        "uid",
        "--key-before",
        "_",
        "-r",
        "score",
        "--batch-col",
        "step",
        "--summary-json",
        summary,
    )
    assert result.exit_code == 0, result.stderr
    labels = [g for entry in TRUTH["verl-v1"]["files"].values() for g in entry["groups"]]
    assert json.loads(summary.read_text())["groups"] == len(set(labels))
    assert "the part of uid before the first '_', as group_key" in result.stderr


def trl_groups(prompts: str) -> pa.Table:
    """TRL's committed groups of 8, one per letter of ``prompts``, each given that letter's
    prompt: equal letters side by side are a prompt drawn twice in a row."""
    groups = pq.read_table(folder_of("trl") / "completions" / "completions_00010.parquet")
    table = groups.slice(0, 8 * len(prompts))
    index = table.schema.get_field_index("prompt")
    return table.set_column(index, "prompt", pa.array([p for p in prompts for _ in range(8)]))


def test_trl_group_size_divides_every_run_of_a_prompt_the_first_and_last_of_a_file_among_them(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "trl" / "completions"
    folder.mkdir(parents=True)
    # runs of 8, 16, 16, 8: the divisor of the inner runs alone (16) would put A and B in one group
    pq.write_table(trl_groups("ABBCCD"), folder / "completions_00010.parquet")
    # runs of 8 and 8, then 16: the second file's runs alone would give 16
    pq.write_table(trl_groups("EF"), folder / "completions_00020.parquet")
    pq.write_table(trl_groups("GG"), folder / "completions_00030.parquet")
    with opened("trl", [str(folder.parent)]) as dump:
        assert dump.group_size == 8
        assert dump.notes[-3:-1] == [
            "group size 8: told from the runs of equal prompt (the dump does not record num_generations)",
            "3 run(s) of one prompt span several groups of 8 (a prompt drawn twice in a row); they are "
            "split by position, as the trainer groups them",
        ]
        assert dump.notes[-1] == (
            "rewards: the reward-function columns correctness_reward, format_reward, each of weight 1 "
            "(TRL's reward_weights are not in the dump; give -r NAME:WEIGHT to set them)"
        )
        config = resolve_config({}, dump=dump.defaults)
        summary = compute_dataset(dump.inputs, tmp_path / "out.parquet", config)
    assert summary.groups == 10
    assert add_advantages(trl_groups("ABBCCD"), from_="trl").num_rows == 48
    for prompts in ("ABBCCD", "EF"):
        _, defaults = of_table("trl", trl_groups(prompts))
        assert defaults["group_size"] == 8, prompts
    with pytest.raises(GrpoError) as refused:
        add_advantages(trl_groups("ABBCCD"), from_="trl", group_size=16)
    assert refused.value.message == (
        "the table, row 8: a new prompt starts inside a group of 16 (rows 0-15 hold two): the file is "
        "cut, or the group size is not 16 (group_size=)"
    )


def trl_runs(*runs: tuple[str, int]) -> pa.Table:
    """TRL's committed rows, their prompts replaced by runs of (prompt, rows)."""
    prompts = [prompt for prompt, rows in runs for _ in range(rows)]
    table = pq.read_table(folder_of("trl") / "completions" / "completions_00010.parquet").slice(
        0, len(prompts)
    )
    return table.set_column(table.schema.get_field_index("prompt"), "prompt", pa.array(prompts))


@pytest.mark.parametrize(
    ("runs", "given", "told"),
    [
        ((("A", 2), ("B", 4), ("C", 2)), None, 2),
        ((("A", 2), ("B", 2)), None, 2),
        # the runs inside tell 4 (not the second alone, nor the third): the first run breaks it
        (
            (("A", 5), ("B", 8), ("C", 12), ("D", 3)),
            None,
            "the table, row 5: a new prompt starts inside a group of 4 (rows 4-7 hold two): the file "
            "is cut, or the group size is not 4",
        ),
        (
            (("A", 5), ("B", 8), ("C", 4)),
            None,
            "the table: 17 rows are not a whole number of groups of 8 (the trainer writes whole "
            "generation batches): the file is truncated, or the group size is not 8",
        ),
        # every run a whole number of groups, yet their sum puts a prompt change inside one
        (
            (("A", 4), ("B", 2), ("C", 2), ("D", 4)),
            4,
            "the table, row 6: a new prompt starts inside a group of 4 (rows 4-7 hold two): the file "
            "is cut, or the group size is not 4 (group_size=)",
        ),
    ],
)
def test_trl_group_size_told_from_runs_or_refused_naming_the_row(
    runs: tuple[tuple[str, int], ...], given: int | None, told: int | str
) -> None:
    table = trl_runs(*runs)
    if isinstance(told, int):
        assert of_table("trl", table, group_size=given)[1]["group_size"] == told
        return
    with pytest.raises(GrpoError) as refused:
        of_table("trl", table, group_size=given)
    assert refused.value.worded(lambda option: f"{option}=").message == told  # as the table API words it


def test_trl_group_size_cannot_be_told_when_no_two_rows_share_a_prompt(cli: Any, tmp_path: Path) -> None:
    folder = tmp_path / "trl" / "completions"
    folder.mkdir(parents=True)
    table = trl_groups("AB")
    table = table.set_column(
        table.schema.get_field_index("prompt"), "prompt", pa.array([f"p{row}" for row in range(16)])
    )
    pq.write_table(table, folder / "completions_00010.parquet")
    out = tmp_path / "out.parquet"
    assert_one_line_error(
        cli("compute", folder.parent, "--from", "trl", "-o", out),
        "completions_00010.parquet: cannot tell num_generations from the dump (no two consecutive "
        "rows share a prompt); give --group-size",
    )
    assert_one_line_error(
        cli("compute", folder.parent, "--from", "trl", "--group-size", "8", "-o", out),
        "completions_00010.parquet, row 1: a new prompt starts inside a group of 8 (rows 0-7 hold two): "
        "the file is cut, or the group size is not 8 (--group-size)",
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("prompts", "rows", "given", "reason"),
    [
        # a generation batch cut across files: the inner runs tell 8, the edges break it
        ("ABCDE", (3, 26), None, "00010.parquet: 26 rows are not a whole number of groups of 8"),
        ("ABCD", (3, 24), None, "00010.parquet, row 5: a new prompt starts inside a group of 8 (rows 0-7"),
        # a size that is a multiple of the true one puts two prompts in a group
        ("ABBCCD", (0, 48), 16, "00010.parquet, row 8: a new prompt starts inside a group of 16 (rows 0-15"),
    ],
)
def test_trl_blocks_that_would_hold_two_prompts_are_refused_and_named(
    prompts: str, rows: tuple[int, int], given: int | None, reason: str, cli: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "trl" / "completions"
    folder.mkdir(parents=True)
    pq.write_table(trl_groups(prompts).slice(*rows), folder / "completions_00010.parquet")
    out = tmp_path / "out.parquet"
    size = ["--group-size", str(given)] if given else []
    assert_one_line_error(cli("compute", folder.parent, "--from", "trl", *size, "-o", out), reason)
    assert not out.exists()


def test_blocks_per_file_restart_at_each_file(cli: Any, tmp_path: Path) -> None:
    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.table({"reward": [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]}), first)
    pq.write_table(pa.table({"reward": [0.0, 1.0, 0.0, 0.0]}), second)
    out = tmp_path / "out.parquet"
    result = cli(
        "compute", first, second, "--group-size", "4", "--blocks-per-file", "-o", out, "--stats-cols"
    )
    assert result.exit_code == 0, result.stderr
    assert pq.read_table(out).column("advantage_group_size").to_pylist() == [4, 4, 4, 4, 2, 2, 4, 4, 4, 4]
    assert "a.parquet: its last block holds 2 of 4 rows" in result.stderr
    whole = cli("check", first, second, "--group-size", "4")
    assert (
        whole.exit_code == 2 or "groups" in whole.stderr
    )  # blocks across files: 10 rows are not whole groups


def test_json_col_reads_a_field_of_json_text(cli: Any, tmp_path: Path) -> None:
    rows = [
        {"problem_id": i // 4, "metrics": json.dumps({"reward": float(i % 3 == 0), "turns": 1})}
        for i in range(16)
    ]
    path = tmp_path / "traces.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    summary = tmp_path / "s.json"
    result = cli(
        "check",
        path,
        "-g",
        "problem_id",
        "--json-col",
        "metrics",
        "-r",
        "metrics.reward",
        "--summary-json",
        summary,
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(summary.read_text())["reward"]["max"] == 1.0
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"problem_id": [0, 0], "metrics": ['{"reward": 1}', "{oops"]}), bad)
    assert_one_line_error(
        cli("check", bad, "-g", "problem_id", "--json-col", "metrics", "-r", "metrics.reward"),
        "bad.parquet, row 1: --json-col 'metrics' is not JSON",
    )
    mixed = tmp_path / "mixed.parquet"
    pq.write_table(pa.table({"problem_id": [0, 0], "metrics": ['{"reward": 1}', "[1]"]}), mixed)
    assert_one_line_error(
        cli("check", mixed, "-g", "problem_id", "--json-col", "metrics", "-r", "metrics.reward"),
        "mixed.parquet: --json-col 'metrics' holds values of different kinds (",
    )


def test_the_json_columns_format_reads_a_roll_file_without_the_adapter(cli: Any) -> None:
    """Read as plain columns, ROLL's groups are its blocks of 8 (--group-size); a key of (step, id)
    merges the two domains' prompts that share an id, and the summary says so."""
    files = [str(p) for p in sorted(folder_of("roll").glob("*.jsonl"))]
    result = cli("check", *files, "--input-format", "json-columns", "--group-size", "8", "-r", "scores")
    assert result.exit_code == 0, result.stderr
    assert "groups                     180" in result.stderr
    keyed = cli(
        "check", *files, "--input-format", "json-columns", "-g", "global_step", "-g", "id", "-r", "scores"
    )
    assert keyed.exit_code == 0, keyed.stderr
    assert "groups                     120" in keyed.stderr
    assert "merged" in keyed.stderr


@pytest.mark.parametrize(
    ("uids", "reason"),
    [
        ([1, 1, 2], "the field uid is int64, not text"),
        (["p_1", "p_2", None], "record 3: the field uid is null"),
    ],
)
def test_key_before_refuses_a_key_that_is_not_text_naming_the_record(
    uids: list[Any], reason: str, cli: Any, tmp_path: Path
) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"uid": u, "reward": 1.0}) + "\n" for u in uids))
    one_line_error(
        cli("check", path, "-g", "uid", "--key-before", "_"),
        2,
        f"{path}{',' if 'record' in reason else ':'} {reason}",
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["-g", "a", "-g", "b", "--key-before", "_"], "--key-before needs one --group-col to cut, got 2"),
        (["--blocks-per-file"], "--blocks-per-file needs --group-size N"),
        (["--from", "verl", "--key-before", "_"], "derives the group key itself"),
    ],
)
def test_the_primitives_refuse_what_they_cannot_do(args: list[str], fragment: str, cli: Any) -> None:
    folder = folder_of("verl") if "--from" in args else folder_of("verl") / "1.jsonl"
    assert_one_line_error(cli("check", folder, *args), fragment)


def test_an_output_inside_the_dump_folder_is_refused(cli: Any) -> None:
    inside = folder_of("verl") / "out.parquet"
    assert_one_line_error(
        cli("compute", folder_of("verl"), "--from", "verl", "-o", inside), "input directory"
    )
    assert not inside.exists()


# --------------------------------------------------------------------------- SkyRL


SKYRL = ("NovaSky-AI/SkyRL", "a9564572eb8e91076be43c1bd5e4615e3de17265")


def test_skyrl_advantages_are_its_grpo_function_on_its_groups(tmp_path: Path) -> None:
    """SkyRL's ``compute_grpo_outcome_advantage``, cut verbatim from ``ppo_utils.py``, on the
    groups SkyRL had in memory: ``--from skyrl`` within float32 rounding, constant groups 0."""
    from collections import defaultdict

    import numpy as np

    from tests.trainer_source import _function, source

    text = source(SKYRL, "skyrl/backends/skyrl_train/utils/ppo_utils.py")
    namespace: dict[str, Any] = {"torch": torch, "np": np, "defaultdict": defaultdict}
    exec(_function(text, "compute_grpo_outcome_advantage"), namespace)
    table, _, (_, shards, config) = computed("skyrl", tmp_path)
    scores = torch.tensor(table.column("score").to_pylist(), dtype=torch.float32)
    theirs, _ = namespace["compute_grpo_outcome_advantage"](
        scores.unsqueeze(-1).clone(), torch.ones(len(scores), 1), np.array(truth_labels("skyrl", shards))
    )
    ours = torch.tensor(table.column(config.advantage_col).to_pylist(), dtype=torch.float64)
    assert torch.allclose(ours, theirs.squeeze(-1).to(torch.float64), rtol=1e-5, atol=1e-6)


def test_skyrl_steps_come_from_the_evaluation_folders(tmp_path: Path) -> None:
    table, summary, _ = computed("skyrl", tmp_path)
    assert sorted(set(table.column("step").to_pylist())) == [0, 5, 10]
    assert summary.input["from"]["steps"] == [0, 10]
    assert "aggregated_results" not in json.dumps(summary.input)


def test_skyrl_eval_only_folder_is_step_minus_one(cli: Any, tmp_path: Path) -> None:
    folder = tmp_path / "export" / "dumped_evals" / "eval_only"
    shutil.copytree(folder_of("skyrl") / "dumped_evals" / "global_step_5_evals", folder)
    summary = tmp_path / "summary.json"
    result = cli("check", tmp_path / "export", "--from", "skyrl", "--summary-json", summary)
    assert result.exit_code == 0, result.stderr
    assert json.loads(summary.read_text())["input"]["from"]["steps"] == [-1, -1]


def test_skyrl_training_pickle_is_refused_unopened_and_runs_nothing(cli: Any, tmp_path: Path) -> None:
    folder = tmp_path / "export" / "dumped_data"
    folder.mkdir(parents=True)
    marker = tmp_path / "ran"
    with open(folder / "global_step_3_training_input.pkl", "wb") as f:
        pickle.dump(_Runs(str(marker)), f)
    out = tmp_path / "out.parquet"
    for target in (tmp_path / "export", folder, folder / "global_step_3_training_input.pkl"):
        line = one_line_error(cli("compute", target, "--from", "skyrl", "-o", out), 2, "holds no rewards")
        assert "global_step_3_training_input.pkl" in line and "--from skyrl" in line
    assert not marker.exists() and not out.exists()


def test_skyrl_file_outside_an_evaluation_folder_is_refused(cli: Any, tmp_path: Path) -> None:
    loose = tmp_path / "math500.jsonl"
    shutil.copy(folder_of("skyrl") / "dumped_evals" / "global_step_0_evals" / "math500.jsonl", loose)
    assert_one_line_error(
        cli("check", loose, "--from", "skyrl"), "its name does not give the step", "global_step_{N}_evals"
    )


# --------------------------------------------------------------------------- prime-rl


def test_prime_rl_rows_are_the_traces_it_trains_on(tmp_path: Path) -> None:
    table, summary, (_, shards, _) = computed("prime-rl", tmp_path)
    records = sum(len((shard.origin or Path(shard.display)).read_text().splitlines()) for shard in shards)
    assert table.num_rows == len(truth_labels("prime-rl", shards)) < records  # errored ones left out
    theirs = [a for entry in TRUTH["prime-rl"]["files"].values() for a in entry["advantage"]]
    assert table.column("trainer_advantage").to_pylist() == theirs
    assert summary.input["from"]["group_key"].startswith("(step, group_id)")


def test_prime_rl_verify_fails_an_altered_token_advantage(cli: Any, tmp_path: Path) -> None:
    folder = tmp_path / "prime-rl"
    shutil.copytree(folder_of("prime-rl"), folder)
    target = folder / "rollouts" / "step_2" / "train" / "effective" / "traces.jsonl"
    lines = target.read_text().splitlines()
    record = json.loads(lines[5])
    node = record["traces"][0]["nodes"][1]
    node["advantages"] = [a + 0.5 for a in node["advantages"]]
    lines[5] = json.dumps(record)
    target.write_text("\n".join(lines) + "\n")
    result = cli("check", folder, "--from", "prime-rl", "--verify")
    assert result.exit_code == 1, result.stderr
    assert "FAIL  verify-advantage-col: 1 rows differ" in result.stderr


@pytest.mark.parametrize(
    ("record", "fragment"),
    [
        ({"id": "e", "run": {"work": {"step": 1}}, "traces": []}, "it has no group field"),
        (
            {"id": "e", "group": None, "run": {"work": {"step": 1}}, "traces": []},
            "the episode has no group id",
        ),
        ({"id": "e", "group": {"id": "g"}, "run": {}, "traces": []}, "the episode has no run.work.step"),
    ],
)
def test_a_prime_rl_record_without_its_group_or_step_is_refused(
    record: dict[str, Any], fragment: str, cli: Any, tmp_path: Path
) -> None:
    target = tmp_path / "rollouts" / "step_1" / "train" / "effective" / "traces.jsonl"
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(record) + "\n")
    out = tmp_path / "out.parquet"
    assert_one_line_error(cli("compute", tmp_path, "--from", "prime-rl", "-o", out), fragment)
    assert not out.exists()


def test_a_field_of_one_element_lists_names_the_first_line_that_is_not_one() -> None:
    from grpo_cli.trainers.dumps.columns import _one_element

    good = pa.table({"reward": [[1.0], [2.0], [3.0]]})
    assert _one_element(good, "reward", "r.jsonl").to_pylist() == [1.0, 2.0, 3.0]
    for values, line, count in (([[1.0], [2.0, 3.0], [4.0]], 2, 2), ([[1.0], [2.0], None], 3, None)):
        with pytest.raises(GrpoError) as refused:
            _one_element(pa.table({"reward": values}), "reward", "r.jsonl")
        assert refused.value.message == (
            f"r.jsonl, line {line}: the field reward holds {count} elements, not one"
        )
    with pytest.raises(GrpoError, match=r"r\.jsonl: the field reward is double, not a one-element list"):
        _one_element(pa.table({"reward": [1.0]}), "reward", "r.jsonl")


# ---------------------------------------------------------------------- groups as the trainer formed them


def test_roll_advantages_are_rolls_own_reward_norm_on_its_domain_blocks(tmp_path: Path) -> None:
    """The committed ROLL dump is a multi-domain step (math_rule and llm_judge ids overlap, a math
    prompt drawn twice in a row): grpo-cli's advantages are ROLL's ``reward_norm`` (executed by the
    writer, float32) on ROLL's groups, within float32's rounding of that arithmetic."""
    import numpy as np

    table, summary, (_, shards, config) = computed("roll", tmp_path)
    base = folder_of("roll")
    files: dict[str, Any] = TRUTH["roll"]["files"]
    names = [Path(shard.display).resolve().relative_to(base.resolve()).as_posix() for shard in shards]
    theirs = np.array([a for name in names for a in files[name]["advantage"]])
    ours = table.column(config.advantage_col).to_numpy().astype(np.float64)
    n = 8  # float32: a mean and a std of 8 values, a subtraction, an addition and a division
    bound = (2 * n + 8) * 2.0**-24 * (1 + np.abs(theirs))
    assert (np.abs(ours - theirs) <= bound).all(), float(np.max(np.abs(ours - theirs) / bound))
    labels = truth_labels("roll", shards)
    scores = table.column("scores").to_pylist()
    constant = {
        g for g in set(labels) if len({s for s, x in zip(scores, labels, strict=True) if x == g}) == 1
    }
    assert constant  # a constant group is exactly 0 here, where ROLL's float32 may leave a residue
    assert all(a == 0 for a, g in zip(ours.tolist(), labels, strict=True) if g in constant)
    assert summary.groups == len(set(truth_labels("roll", shards))) == 180
    assert any("two domains that share an id stay apart" in note for note in summary.input["from"]["notes"])


def test_roll_two_domains_sharing_an_id_side_by_side_are_two_groups() -> None:
    """The last math prompt and the first judge prompt are both id "3": runs of (domain, id) keep
    them apart, where runs of id alone made one run of 16 (and grouping by id, one group)."""
    rows = {
        "global_step": [1] * 32,
        "id": ["2"] * 8 + ["3"] * 8 + ["3"] * 8 + ["4"] * 8,
        "domain": ["math_rule"] * 16 + ["llm_judge"] * 16,
        "responses": ["r"] * 32,
        "scores": [float(i % 3 == 0) for i in range(32)],
    }
    derived, defaults = of_table("roll", pa.table(rows))
    assert defaults["group_size"] == 8 and "group_col" not in defaults
    out = add_advantages(derived, from_="roll")
    advantages = out.column("advantage").to_pylist()
    for block in range(4):  # each block centred on its own mean (3 and 2 of 8 right in the "3" blocks)
        assert abs(sum(advantages[block * 8 : block * 8 + 8])) < 1e-5, block


def test_roll_a_dump_without_its_domain_field_is_refused_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / "roll"
    folder.mkdir()
    source_file = folder_of("roll") / "rollout_dump_data.step_0.jsonl"
    columns = json.loads(source_file.read_text())
    del columns["domain"]
    (folder / "rollout_dump_data.step_0.jsonl").write_text(json.dumps(columns) + "\n")
    with pytest.raises(GrpoError, match="holds no domain field, which tells the trainer's groups apart"):
        open_dump("roll", [str(folder)])


def test_skyrl_the_same_prompt_in_two_data_sources_is_two_groups(tmp_path: Path) -> None:
    """SkyRL writes one file per data source; a prompt text both sources hold (a benchmark shared
    by two datasets) was one group of 2n under a (step, input_prompt) key."""
    evals = tmp_path / "dumped_evals" / "global_step_5_evals"
    shutil.copytree(folder_of("skyrl") / "dumped_evals" / "global_step_5_evals", evals)
    first, second = (evals / "math500.jsonl"), (evals / "openai_gsm8k.jsonl")
    shared = json.loads(first.read_text().splitlines()[0])["input_prompt"]
    lines = [json.loads(line) for line in second.read_text().splitlines()]
    theirs = lines[0]["input_prompt"]
    for line in lines:
        if line["input_prompt"] == theirs:
            line["input_prompt"] = shared
    second.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with opened("skyrl", [str(tmp_path / "dumped_evals")]) as dump:
        config = resolve_config({}, dump=dump.defaults)
        summary = compute_dataset(dump.inputs, tmp_path / "out.parquet", config)
    assert summary.group_size["min"] == summary.group_size["max"], summary.group_size  # no group of 2n
    assert "data_source" in summary.input["from"]["group_key"]


def test_verl_a_prompt_drawn_twice_in_a_step_is_named_by_the_merged_groups_warning(
    cli: Any, tmp_path: Path
) -> None:
    """verl gives each draw of a prompt its own uid, which its dump does not hold, and writes the
    rows after _balance_batch: the two draws cannot be told apart, so the summary says so, naming
    the merged key, and gives no hint (``--group-size`` would cut across groups: issue #67 A.2)."""
    folder = tmp_path / "verl"
    folder.mkdir()
    lines = [json.loads(line) for line in (folder_of("verl") / "1.jsonl").read_text().splitlines()]
    inputs = list(dict.fromkeys(line["input"] for line in lines))
    for line in lines:
        if line["input"] == inputs[1]:
            line["input"] = inputs[0]  # the dataset held the prompt twice: drawn twice this step
    (folder / "1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = cli("check", folder, "--from", "verl")
    assert result.exit_code == 0, result.stderr
    warning = next(line for line in result.stderr.splitlines() if line.startswith("warning: 1 of"))
    assert "a prompt drawn twice in a step" in warning
    assert f"e.g. key [1, {json.dumps(inputs[0])[:40]}" in warning and "(16 rows)" in warning
    assert "cannot be split here" in warning and "--group-size" not in warning
    finding = json.loads(cli("check", folder, "--from", "verl", "--summary-json", "-").stdout)["findings"][0]
    assert finding["kind"] == "merged_groups" and finding["fix"] is None
