"""``grpo-cli check``: every check at its boundary, exit codes, JSON, verification, stdin."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.conftest import (
    assert_one_line_error,
    rollout_rows,
    with_advantage_changed,
    write_jsonl,
    write_parquet,
)

# rollout_rows(): 12 groups of 4 (kinds 0..3 cycle: all wrong, all right, mixed, mixed)
# plus one singleton. With -r correct: 13 groups, 3 + 3 constant groups + the singleton
# (+ mixed groups that happen to be constant) are inactive.


@pytest.fixture
def data(tmp_path):
    rows = rollout_rows(seed=0)
    return write_parquet(tmp_path / "in.parquet", rows), rows


def summary_of(cli, path, *args, reward="correct"):
    result = cli("check", path, "-r", reward, "--summary-json", "-", "-q", *args)
    return result, json.loads(result.stdout)


def test_no_checks_prints_summary_and_exits_0(cli, data):
    path, _ = data
    result = cli("check", path)
    assert result.exit_code == 0
    assert "groups" in result.stderr and result.stdout == ""


def test_quiet_keeps_a_line_for_each_failed_check_and_silent_prints_nothing(cli, data):
    """A CI log of check -q says why the step is red: one line for each failed check, nothing
    for those that passed, no summary; -s prints nothing, the exit code alone says it."""
    path, _ = data
    failing = ("--min-groups", "1000", "--max-group-size", "1", "--min-active-groups", "1")
    result = cli("check", path, "-r", "correct", "-q", *failing)
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert [line.split(":")[0] for line in lines] == ["FAIL  min-groups", "FAIL  max-group-size"]
    assert "(bound >= 1000)" in lines[0]
    silent = cli("check", path, "-r", "correct", "-s", *failing)
    assert (silent.exit_code, silent.stdout, silent.stderr) == (1, "", "")
    passing = cli("check", path, "-r", "correct", "-q", "--min-active-groups", "1")
    assert (passing.exit_code, passing.stderr) == (0, "")
    errored = cli("check", path, "-r", "no_such_column", "-s", "--min-groups", "1")
    assert errored.exit_code == 2 and "no column 'no_such_column'" in errored.stderr


def test_output_format_github_annotates_each_failed_check_and_junit_reports_every_check(cli, data):
    """--output-format github: an ::error workflow command for each failed check, escaped as the
    Actions toolkit escapes (a detail's commas stay in the message, the title's are %2C); junit:
    one test case a check, a failure for each that failed, which an XML parser reads."""
    from xml.etree import ElementTree

    path, _ = data
    checks = ("--min-groups", "1000", "--uniform-group-size", "--min-active-groups", "1")
    github = cli("check", path, "-r", "correct", "-s", "--output-format", "github", *checks)
    assert github.exit_code == 1 and github.stderr == ""
    lines = github.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("::error title=grpo-cli check ") for line in lines)
    assert lines[0].endswith("::min-groups: 13 (bound >= 1000)")
    assert "uniform-group-size: 1..4 (bound min == max): " in lines[1] and "%0A" not in lines[1]
    junit = cli("check", path, "-r", "correct", "-q", "--output-format", "junit", *checks)
    assert junit.exit_code == 1
    suites = ElementTree.fromstring(junit.stdout)
    suite = suites.find("testsuite")
    assert suite is not None and (suite.get("tests"), suite.get("failures")) == ("3", "2")
    cases = {case.get("name"): case.find("failure") for case in suite.iter("testcase")}
    assert list(cases) == ["min-active-groups", "min-groups", "uniform-group-size"]
    assert cases["min-active-groups"] is None
    failure = cases["min-groups"]
    assert failure is not None and failure.get("message") == "13 (bound >= 1000)"
    passing = cli("check", path, "-r", "correct", "-q", "--output-format", "github", "--min-groups", "1")
    assert (passing.exit_code, passing.stdout) == (0, "")
    both = cli("check", path, "--output-format", "junit", "--summary-json", "-", "--min-groups", "1")
    assert_one_line_error(both, "would both write to standard output")


@pytest.mark.parametrize(
    ("option", "value_key", "make_bound"),
    [
        ("--max-inactive-fraction", "inactive_fraction", None),
        ("--min-active-groups", "active_groups", None),
        ("--min-groups", "groups", None),
        ("--max-singleton-groups", "singleton_groups", None),
    ],
)
def test_count_checks_at_their_boundary(cli, data, option, value_key, make_bound):
    path, _ = data
    _, base = summary_of(cli, path)
    measured = {
        "inactive_fraction": base["inactive_groups"] / base["groups"],
        "active_groups": base["active_groups"],
        "groups": base["groups"],
        "singleton_groups": base["singleton_groups"],
    }[value_key]
    is_max = option.startswith("--max")
    if value_key == "inactive_fraction":
        passing, failing = f"{measured:.6f}", f"{measured - 0.01:.6f}"
    else:
        passing, failing = str(measured), str(measured - 1 if is_max else measured + 1)
    result, summary = summary_of(cli, path, option, passing)
    assert result.exit_code == 0, summary["checks"]
    assert summary["checks"][0]["passed"] is True
    assert summary["checks_passed"] is True
    result, summary = summary_of(cli, path, option, failing)
    assert result.exit_code == 1
    check = summary["checks"][0]
    assert check["passed"] is False and check["name"] == option[2:]
    assert summary["checks_passed"] is False


def test_group_size_checks(cli, data):
    path, _ = data
    # group sizes are 1 (the singleton) and 4
    assert summary_of(cli, path, "--min-group-size", "1")[0].exit_code == 0
    assert summary_of(cli, path, "--min-group-size", "2")[0].exit_code == 1
    assert summary_of(cli, path, "--max-group-size", "4")[0].exit_code == 0
    assert summary_of(cli, path, "--max-group-size", "3")[0].exit_code == 1
    result, summary = summary_of(cli, path, "--uniform-group-size")
    assert result.exit_code == 1 and summary["checks"][0]["value_text"] == "1..4"
    assert (summary["checks"][0]["value"], summary["checks"][0]["op"], summary["checks"][0]["bound"]) == (
        3,
        "==",
        0,
    )


def test_uniform_group_size_passes_on_uniform_data(cli, tmp_path):
    path = write_parquet(tmp_path / "u.parquet", rollout_rows(singletons=0))
    assert cli("check", path, "--uniform-group-size", "-q").exit_code == 0


def test_one_line_per_check_on_stderr(cli, data):
    path, _ = data
    result = cli("check", path, "-r", "correct", "--min-groups", "1", "--max-singleton-groups", "0")
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert lines == ["PASS  min-groups: 13 (bound >= 1)", "FAIL  max-singleton-groups: 1 (bound <= 0)"]


def test_any_failure_fails_the_run(cli, data):
    path, _ = data
    result, summary = summary_of(cli, path, "--min-groups", "1", "--min-groups", "1", "--max-group-size", "1")
    assert result.exit_code == 1
    assert [c["passed"] for c in summary["checks"]] == [True, False]


def test_verify_correct_column(cli, tmp_path, data):
    path, _ = data
    out = tmp_path / "with_adv.parquet"
    assert cli("compute", path, "-o", out, "--preset", "trl", "-q").exit_code == 0
    result, summary = summary_of(
        cli, out, "--verify-advantage-col", "advantage", "--preset", "trl", reward="reward"
    )
    assert result.exit_code == 0, summary
    verify = summary["verify"]
    assert verify["mismatched"] == 0 and verify["compared"] == 49
    assert verify["max_abs_diff"] == 0.0


def test_verify_detects_another_convention(cli, tmp_path, data):
    path, _ = data
    out = tmp_path / "with_adv.parquet"
    assert cli("compute", path, "-o", out, "--preset", "trl", "-q").exit_code == 0
    result, summary = summary_of(
        cli, out, "--verify-advantage-col", "advantage", "--preset", "openrlhf", reward="reward"
    )
    assert result.exit_code == 1
    assert summary["verify"]["mismatched"] > 0


def test_verify_uses_the_options_the_output_records(cli, tmp_path, data):
    """compute, then check --verify with no other flag: the recorded options are used."""
    path, _ = data
    out = tmp_path / "with_adv.parquet"
    made = cli("compute", path, "-o", out, "--preset", "trl", "--std", "population", "-q")
    assert made.exit_code == 0
    result = cli("check", out, "--verify", "--summary-json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    verify = json.loads(result.stdout)["verify"]
    assert (verify["column"], verify["mismatched"], verify["compared"]) == ("advantage", 0, 49)
    options = json.loads(result.stdout)["options"]
    assert (options["preset"], options["std"], options["epsilon"]) == ("trl", "population", 1e-4)
    # the same without --verify: --verify-advantage-col alone defaults to the recorded options
    assert cli("check", out, "--verify-advantage-col", "advantage", "-q").exit_code == 0
    # a flag given beside it overrides the record
    assert cli("check", out, "--verify", "--std", "sample", "-q").exit_code == 1
    # a changed value fails
    changed = with_advantage_changed(out, tmp_path / "changed.parquet", row=3, by=0.5)
    result = cli("check", changed, "--verify", "--summary-json", "-", "-q")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["verify"]["examples"][0]["row"] == 3


def test_check_dataset_verifies_against_the_recorded_options_as_check_verify_does(cli, tmp_path, data):
    """The library's check_dataset(verify=True) is the CLI's check --verify: the options the
    output recorded, its advantage column, the same verify object; a changed value fails, and
    an input without provenance or with options given beside it is refused."""
    from grpo_cli.errors import GrpoError
    from grpo_cli.jobs import check_dataset
    from grpo_cli.options.checks import CheckBounds
    from grpo_cli.options.config import ComputeConfig

    path, _ = data
    out = tmp_path / "with_adv.parquet"
    assert cli("compute", path, "-o", out, "--preset", "trl", "--std", "population", "-q").exit_code == 0
    by_cli = json.loads(cli("check", out, "--verify", "--summary-json", "-", "-q").stdout)
    summary = check_dataset(out, CheckBounds(), verify=True).to_dict()
    assert summary["verify"] == by_cli["verify"]
    assert (summary["verify"]["compared"], summary["verify"]["mismatched"]) == (49, 0)
    assert summary["options"]["preset"] == "trl" and summary["checks"][0]["passed"]
    changed = with_advantage_changed(out, tmp_path / "changed.parquet", row=5, by=-0.25)
    failed = check_dataset(changed, CheckBounds(), verify=True).to_dict()
    assert failed["verify"]["mismatched"] == 1 and failed["verify"]["examples"][0]["row"] == 5
    assert not all(check["passed"] for check in failed["checks"])
    with pytest.raises(GrpoError, match="no grpo-cli provenance to verify against"):
        check_dataset(path, CheckBounds(), verify=True)
    with pytest.raises(GrpoError, match="leave config out"):
        check_dataset(out, CheckBounds(), ComputeConfig(), verify=True)


def test_verify_without_provenance_asks_for_the_column(cli, data):
    path, _ = data
    result = cli("check", path, "--verify")
    assert_one_line_error(result, "no grpo-cli provenance to verify against")


def test_inspect_prints_the_provenance(cli, tmp_path, data):
    path, _ = data
    out = tmp_path / "with_adv.parquet"
    assert cli("compute", path, "-o", out, "--preset", "verl", "--drop-inactive", "-q").exit_code == 0
    result = cli("inspect", out)
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["options"]["preset"] == "verl" and record["inputs"] == [str(path)]
    assert record["rows"] == 49 and record["rows_written"] == pq.read_metadata(out).num_rows
    assert record["groups"] >= record["active_groups"] > 0
    assert_one_line_error(cli("inspect", path), "no grpo-cli provenance")


def test_verify_corrupted_rows_are_reported(cli, tmp_path, data):
    path, rows = data
    out = tmp_path / "with_adv.parquet"
    assert cli("compute", path, "-o", out, "-q").exit_code == 0
    table = pq.read_table(out)
    advantages = table.column("advantage").to_pylist()
    for row in (5, 17, 30):
        advantages[row] += 0.5
    table = table.set_column(table.schema.get_field_index("advantage"), "advantage", pa.array(advantages))
    pq.write_table(table, out)
    result = cli("check", out, "--verify-advantage-col", "advantage", "--summary-json", "-")
    assert result.exit_code == 1
    verify = json.loads(result.stdout)["verify"]
    assert verify["mismatched"] == 3
    assert [e["row"] for e in verify["examples"]] == [5, 17, 30]
    assert verify["examples"][0]["group"] == rows[5]["group_id"]
    assert verify["max_abs_diff"] == pytest.approx(0.5)
    assert "row 5 group" in result.stderr
    assert "FAIL  verify-advantage-col: 3 rows differ" in result.stderr


def test_verify_tolerances(cli, tmp_path, data):
    path, _ = data
    out = tmp_path / "with_adv.parquet"
    assert cli("compute", path, "-o", out, "-q").exit_code == 0
    table = pq.read_table(out)
    advantages = [a + 1e-7 for a in table.column("advantage").to_pylist()]
    table = table.set_column(table.schema.get_field_index("advantage"), "advantage", pa.array(advantages))
    pq.write_table(table, out)
    assert cli("check", out, "--verify-advantage-col", "advantage", "-q").exit_code == 0
    assert (
        cli(
            "check", out, "--verify-advantage-col", "advantage", "--atol", "1e-9", "--rtol", "0", "-q"
        ).exit_code
        == 1
    )


def test_verify_missing_column_is_an_input_error(cli, data):
    path, _ = data
    result = cli("check", path, "--verify-advantage-col", "adv")
    assert result.exit_code == 2
    assert "no column 'adv' to verify" in result.stderr


def test_check_reads_stdin(cli, tmp_path, data):
    _, rows = data
    jsonl = write_jsonl(tmp_path / "in.jsonl", rows)
    result = cli("check", "-", "--min-groups", "13", "--summary-json", "-", "-q", input=jsonl.read_bytes())
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["groups"] == 13


def test_check_input_errors_exit_2(cli, tmp_path):
    assert cli("check", tmp_path / "missing.parquet").exit_code == 2
    result = cli("check", tmp_path / "x.parquet", "--max-inactive-fraction", "1.5")
    assert result.exit_code == 2  # Typer's range check


def test_check_writes_nothing(cli, tmp_path, data):
    path, _ = data
    before = sorted(p.name for p in tmp_path.iterdir())
    assert cli("check", path, "--min-groups", "1", "-q").exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def _exported(tmp_path, groups, advantages, name="exported.parquet"):
    rows = [
        {"group_id": g, "reward": r, "trainer_advantage": a}
        for g, (group, adv) in enumerate(zip(groups, advantages, strict=True))
        for r, a in zip(group, adv, strict=True)
    ]
    table = pa.Table.from_pylist(rows).cast(
        pa.schema([("group_id", pa.int64()), ("reward", pa.float32()), ("trainer_advantage", pa.float32())])
    )
    path = tmp_path / name
    pq.write_table(table, path)
    return path


def test_verify_tells_a_trainers_rounding_residue_from_a_mismatch(cli, tmp_path):
    from tests.trainers import verl_float32

    # constant groups of values float32 cannot hold, a large offset, and ordinary groups
    groups = [[0.1] * 8, [0.7804687] * 13, [1e6, 1e6 + 0.0625], [0.0, 1.0, 1.0, 0.0], [0.2, 0.9, 0.4]]
    advantages = verl_float32(groups)
    assert any(a != 0 for a in advantages[0])  # verl's float32 residue in a constant group
    path = _exported(tmp_path, groups, advantages)
    args = ["--verify-advantage-col", "trainer_advantage", "--preset", "verl", "--summary-json", "-"]
    result = cli("check", path, *args)
    assert result.exit_code == 0, result.stderr
    verify = json.loads(result.stdout)["verify"]
    assert verify["mismatched"] == 0
    assert verify["residue"] >= 8 + 13 + 2 - 2  # constant rows, and the offset group
    assert {e["group"] for e in verify["residue_examples"]} <= {0, 1, 2}
    assert "rounding residue (fails with --strict)" in result.stderr
    strict = cli("check", path, *args, "--strict")
    assert strict.exit_code == 1
    assert json.loads(strict.stdout)["checks"][-1]["bound_text"] == "0 rows differ (--strict)"


def test_a_constant_groups_residue_is_bounded_by_the_trainers_epsilon(cli, tmp_path):
    """-119.2 for 13 rewards of 0.7804687 is what OpenRLHF (eps 1e-9) exported; verl's eps
    1e-6 bounds its residue there to 8 (n + 2) ulp32 / eps, about 7."""
    from tests.trainers import verl_float32

    groups = [[0.7804687] * 13, [0.0, 1.0, 1.0, 0.0]]
    advantages = verl_float32(groups)
    advantages[0] = [-119.2] * 13
    path = _exported(tmp_path, groups, advantages)
    args = ["--verify-advantage-col", "trainer_advantage", "--summary-json", "-"]
    openrlhf = json.loads(cli("check", path, *args, "--preset", "openrlhf").stdout)["verify"]
    assert (openrlhf["mismatched"], openrlhf["residue"]) == (0, 13)
    result = cli("check", path, *args, "--preset", "verl")
    assert result.exit_code == 1
    verl = json.loads(result.stdout)["verify"]
    assert (verl["mismatched"], verl["residue"]) == (13, 0)
    assert [(e["row"], e["group"]) for e in verl["examples"]] == [(0, 0)]  # one example per group


def test_verify_residue_of_identical_other_rollouts_under_leave_one_out(cli, tmp_path):
    from tests.trainers import nemo_rl_float32

    groups = [[0.9, 0.9, 0.9, 1.0], [0.3, 0.3, 0.3, 0.0, 0.3], [0.1, 0.5, 0.8]]
    advantages = nemo_rl_float32(groups)
    assert abs(advantages[0][3]) > 100  # NeMo-RL divides by a rounding residue: 235.9 here
    path = _exported(tmp_path, groups, advantages)
    args = ["--verify-advantage-col", "trainer_advantage", "--preset", "nemo-rl", "--summary-json", "-"]
    result = cli("check", path, *args)
    assert result.exit_code == 0, result.stderr
    verify = json.loads(result.stdout)["verify"]
    assert (verify["mismatched"], verify["residue"]) == (0, 1)  # [0.3] * 4 happens to cancel exactly
    assert [e["row"] for e in verify["residue_examples"]] == [3]


def test_verify_a_changed_value_in_an_active_group_is_a_mismatch(cli, tmp_path):
    from tests.trainers import verl_float32

    groups = [[0.1] * 4, [0.0, 1.0, 1.0, 0.0], [1e6, 1e6 + 0.0625]]
    advantages = verl_float32(groups)
    advantages[1][2] += 0.01
    path = _exported(tmp_path, groups, advantages)
    result = cli(
        "check",
        path,
        "--verify-advantage-col",
        "trainer_advantage",
        "--preset",
        "verl",
        "--summary-json",
        "-",
    )
    assert result.exit_code == 1
    verify = json.loads(result.stdout)["verify"]
    assert verify["mismatched"] == 1 and verify["examples"][0]["row"] == 6
    assert "FAIL  verify-advantage-col: 1 rows differ (" in result.stderr


def test_strict_needs_a_column_to_verify(cli, tmp_path, data):
    path, _ = data
    assert_one_line_error(cli("check", path, "--strict"), "--strict needs --verify or --verify-advantage-col")


def test_check_reads_the_data_once_unless_it_verifies(cli, tmp_path, data, monkeypatch):
    from grpo_cli.engines import local
    from grpo_cli.inputs import readers

    path, _ = data
    out = tmp_path / "with_adv.parquet"
    assert cli("compute", path, "-o", out, "-r", "reward", "-q").exit_code == 0
    reads: list[str] = []
    real = readers.iter_batches  # what the engine calls

    def counting(shard, columns, batch_rows):
        reads.append(f"{shard.display}:{columns}")
        return real(shard, columns, batch_rows)

    monkeypatch.setattr(local.engine, "iter_batches", counting)
    assert cli("check", out, "-r", "reward", "--memory-limit-mb", "0", "-q").exit_code == 0
    # one pass, the needed columns only (and the step column, watched for groups that span steps)
    assert reads == [f"{out}:['reward', 'group_id', 'step']"]
    reads.clear()
    assert cli("check", out, "--verify", "--memory-limit-mb", "0", "-q").exit_code == 0
    assert len(reads) == 2


@pytest.mark.parametrize(
    "options",
    [
        [],
        ["--preset", "verl"],
        ["--preset", "trl", "--scale", "batch"],
        ["--estimator", "dr_grpo"],
        ["--epsilon-mode", "add-if-nonzero", "--std", "sample"],
        ["--preset", "torchrl"],
    ],
)
@pytest.mark.parametrize("reward", ["reward", "correct"])
def test_one_pass_check_reports_the_advantage_range_compute_writes(cli, tmp_path, data, options, reward):
    path, _ = data
    out = tmp_path / "with_adv.parquet"
    made = cli("compute", path, "-o", out, "-r", reward, *options, "--summary-json", "-", "-q")
    checked = cli("check", path, "-r", reward, *options, "--summary-json", "-", "-q")
    assert made.exit_code == checked.exit_code == 0
    written = pq.read_table(out).column("advantage").to_pylist()
    advantage = json.loads(checked.stdout)["advantage"]
    assert (advantage["min"], advantage["max"]) == (min(written), max(written))
    assert json.loads(made.stdout)["advantage"] == advantage


@pytest.mark.parametrize("nulls", ["all", "some"])
def test_one_pass_check_reports_the_range_compute_writes_where_rewards_are_left_out(cli, tmp_path, nulls):
    """``--nan ignore`` writes advantage 0 on each row it leaves out, so the range holds 0; where
    every reward was left out, no group statistic is seen and check reported no range at all
    (found by the end-to-end property test's differential run)."""
    rows = [
        {"group_id": g, "reward": None if nulls == "all" or i == 0 else float(i)}
        for g in (1, 2)
        for i in range(3)
    ]
    path = write_parquet(tmp_path / "in.parquet", rows)
    out = tmp_path / "out.parquet"
    made = cli("compute", path, "-o", out, "--nan", "ignore", "--summary-json", "-", "-q")
    checked = cli("check", path, "--nan", "ignore", "--summary-json", "-", "-q")
    assert made.exit_code == checked.exit_code == 0, (made.stderr, checked.stderr)
    written = pq.read_table(out).column("advantage").to_pylist()
    advantage = json.loads(checked.stdout)["advantage"]
    assert (advantage["min"], advantage["max"]) == (min(written), max(written))
    assert json.loads(made.stdout)["advantage"] == advantage


@pytest.mark.parametrize(("color", "escapes"), [("always", True), ("never", False), ("auto", False)])
def test_pass_and_fail_are_coloured_only_when_asked_or_on_a_terminal(cli, data, color, escapes):
    path, _ = data
    result = cli("check", path, "--min-groups", "1", "--max-group-size", "1", "--color", color)
    assert result.exit_code == 1
    assert ("\x1b[31mFAIL" in result.stderr) is escapes
    assert ("\x1b[32mPASS" in result.stderr) is escapes
    assert "FAIL  max-group-size" in result.stderr


# --------------------------------------------------------------------------- residue has a shape


def _corrupted(tmp_path, cli, changes, *, name="bad.parquet"):
    """The issue's 12 rows (group 1 constant at 1.0), computed by grpo-cli, then ``changes``
    ({row: value}) written over the advantage column."""
    table = pa.table(
        {
            "group_id": [0, 0, 0, 0, 1, 1, 1, 1, 2, 3, 3, 3],
            "reward": pa.array([1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 1, 1], pa.float32()),
        }
    )
    source, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pq.write_table(table, source)
    assert cli("compute", source, "-o", out, "-q", "-f").exit_code == 0
    written = pq.read_table(out)
    advantages = written.column("advantage").to_pylist()
    for row, value in changes.items():
        advantages[row] = value
    index = written.schema.get_field_index("advantage")
    bad = written.set_column(index, "advantage", pa.array(advantages, pa.float32()))
    pq.write_table(bad.replace_schema_metadata(written.schema.metadata), tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize("value", [0.75, 1e6, -1e-3])
@pytest.mark.parametrize("how", [["--verify"], ["--verify-advantage-col", "advantage"]])
def test_a_corrupted_row_of_a_constant_group_is_a_mismatch(cli, tmp_path, value, how):
    bad = _corrupted(tmp_path, cli, {5: value})
    result = cli("check", bad, *how, "--summary-json", "-")
    assert result.exit_code == 1, result.stderr
    verify = json.loads(result.stdout)["verify"]
    assert (verify["mismatched"], verify["residue"]) == (1, 0)
    assert [(e["row"], e["group"]) for e in verify["examples"]] == [(5, 1)]
    assert "bad.parquet row 5 group 1: expected 0, found" in result.stderr


def test_a_whole_constant_group_changed_alike_is_a_mismatch_where_its_mean_is_exact(cli, tmp_path):
    """Four rewards of 1.0 have an exact float32 mean, so every trainer gives exactly 0: one
    value on every row is no residue either."""
    bad = _corrupted(tmp_path, cli, {4: 0.5, 5: 0.5, 6: 0.5, 7: 0.5})
    verify = json.loads(cli("check", bad, "--verify", "--summary-json", "-").stdout)["verify"]
    assert (verify["mismatched"], verify["residue"]) == (4, 0)


@pytest.mark.parametrize("batch_rows", ["1", "3", "1000"])
@pytest.mark.parametrize("row", [0, 3, 7])
def test_a_constant_groups_residue_is_one_value_on_every_row(cli, tmp_path, batch_rows, row):
    """verl's float32 residue on eight rewards of 0.1 is residue; the same group with one row
    changed by less than the residue bound is a mismatch, wherever that row falls among the
    batches (the group is settled once every row has been read)."""
    from tests.trainers import verl_float32

    groups = [[0.1] * 8, [0.0, 1.0, 1.0, 0.0]]
    advantages = verl_float32(groups)
    args = ["--verify-advantage-col", "trainer_advantage", "--preset", "verl", "--summary-json", "-"]
    args += ["--batch-rows", batch_rows]
    verify = json.loads(cli("check", _exported(tmp_path, groups, advantages), *args).stdout)["verify"]
    assert (verify["mismatched"], verify["residue"]) == (0, 8)
    advantages[0][row] = advantages[0][row] * 2  # within 8 (n + 2) ulp32 / eps, but not the others' value
    result = cli("check", _exported(tmp_path, groups, advantages, name="changed.parquet"), *args)
    assert result.exit_code == 1
    verify = json.loads(result.stdout)["verify"]
    assert (verify["mismatched"], verify["residue"]) == (8, 0)
    assert verify["examples"][0]["group"] == 0


def test_leave_one_out_residue_needs_the_sign_the_bound_and_inexact_others(cli, tmp_path):
    from tests.trainers import nemo_rl_float32

    groups = [[0.9, 0.9, 0.9, 1.0], [0.0, 0.0, 0.0, 1.0], [0.1, 0.5, 0.8]]
    args = ["--verify-advantage-col", "trainer_advantage", "--preset", "nemo-rl", "--summary-json", "-"]

    def verify(advantages, name):
        return json.loads(cli("check", _exported(tmp_path, groups, advantages, name=name), *args).stdout)[
            "verify"
        ]

    own = nemo_rl_float32(groups)
    assert (verify(own, "own.parquet")["mismatched"], verify(own, "own.parquet")["residue"]) == (0, 1)
    for name, change in (("sign", -own[0][3]), ("bound", 0.1 / 1e-6 * 2)):
        changed = [list(g) for g in own]
        changed[0][3] = change
        assert verify(changed, f"{name}.parquet")["mismatched"] == 1, name
    # others of 0.0: their squares are exact, NeMo-RL's std is exactly 0, no residue possible
    changed = [list(g) for g in own]
    changed[1][3] = own[1][3] * 100
    assert verify(changed, "exact.parquet")["mismatched"] == 1


def _float32_groups(seed, count, sizes=(4, 8, 16)):
    g = torch.Generator().manual_seed(seed)
    groups = []
    for i in range(count):
        size = sizes[i % len(sizes)]
        kind = i % 3
        if kind == 0:
            values = torch.rand(size, generator=g)
        elif kind == 1:
            values = torch.randint(0, 2, (size,), generator=g).float()
        else:
            values = torch.randint(0, 11, (size,), generator=g).float() / 10
        groups.append(values.tolist())
    return groups


@pytest.mark.parametrize(("preset", "oracle"), [("nemo-rl", "nemo_rl_float32"), ("verl", "verl_float32")])
def test_a_trainers_own_float32_values_pass_its_preset(cli, tmp_path, preset, oracle):
    """NeMo-RL's E[x^2] - E[x]^2 std in float32 is 1.9e-5 off in relative terms: a fixed atol
    rejected 3 of 2,048 of its own rows. With a preset, the bound follows its arithmetic; a
    change of 1e-3 in an active group is still caught."""
    from tests import trainers

    groups = _float32_groups(11, 200)
    advantages = getattr(trainers, oracle)(groups)
    args = ["--verify-advantage-col", "trainer_advantage", "--preset", preset, "--summary-json", "-"]
    result = cli("check", _exported(tmp_path, groups, advantages), *args)
    verify = json.loads(result.stdout)["verify"]
    assert verify["mismatched"] == 0 and verify["trainer_rounding"], verify["examples"]
    assert result.exit_code == 0
    changed = [list(g) for g in advantages]
    changed[0][1] += 1e-3
    verify = json.loads(cli("check", _exported(tmp_path, groups, changed, name="c.parquet"), *args).stdout)[
        "verify"
    ]
    assert verify["mismatched"] == 1 and verify["examples"][0]["row"] == 1


# --------------------------------------------------------------------------- the gate's own false alarms


def _rollouts_with_meta(tmp_path):
    rows = [
        {"group_id": g, "reward": float((g * 7 + i) % 3 == 0), "meta": {"score": float((g + i) % 2)}}
        for g in range(12)
        for i in range(4)
    ]
    path = tmp_path / "rs.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (["--whiten", "--drop-inactive"], "filtered (--drop-inactive) after a step over the whole batch"),
        (["--scale", "batch", "--keep-mean-range", "0", "0.6"], "(--keep-mean-range) after a step"),
        (["--estimator", "gpg", "--drop-inactive"], "(--estimator gpg)"),
    ],
)
def test_verify_refuses_a_filtered_output_of_a_batch_wide_step(cli, tmp_path, options, fragment):
    """Its advantages were computed with rows the output no longer holds: --verify failed
    every row of an untouched output (48 of 48)."""
    out = tmp_path / "out.parquet"
    assert cli("compute", _rollouts_with_meta(tmp_path), "-o", out, "-q", *options).exit_code == 0
    assert_one_line_error(cli("check", out, "--verify"), fragment, "cannot be recomputed from it")


@pytest.mark.parametrize("options", [["--drop-inactive"], ["--keep-mean-range", "0", "0.6"], ["--whiten"]])
def test_verify_passes_an_untouched_output_a_group_step_filtered(cli, tmp_path, options):
    out = tmp_path / "out.parquet"
    assert cli("compute", _rollouts_with_meta(tmp_path), "-o", out, "-q", *options).exit_code == 0
    result = cli("check", out, "--verify")
    assert result.exit_code == 0, result.stderr


def test_an_output_name_that_shadows_an_input_field_is_refused(cli, tmp_path):
    """A top-level 'meta.score' column beside the struct field meta.score shadowed it: --verify
    then recomputed from the advantages and passed a tampered reward."""
    source = _rollouts_with_meta(tmp_path)
    out = tmp_path / "o.parquet"
    for option in ("--advantage-col", "--active-col"):
        result = cli("compute", source, "-o", out, "-r", "meta.score", option, "meta.score")
        assert_one_line_error(result, "the input already has a nested field 'meta.score'", option)
    assert not out.exists()
    assert_one_line_error(
        cli("check", source, "--verify-advantage-col", "reward"), "'reward', is also read to compute"
    )


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda m: m["options"].__setitem__("epsilon", "abc"), "--epsilon must be a positive finite number"),
        (lambda m: m["options"].__setitem__("epsilon", None), "got None"),
        (lambda m: m.__setitem__("options", [1, 2]), "options is list, not an object"),
        (lambda m: m["options"].__setitem__("clip", [1]), "--clip-advantage needs two numbers"),
        (lambda m: m["options"].__setitem__("reward_cols", [{"column": "reward"}]), "cannot be read"),
        (
            lambda m: (
                m["options"].__setitem__("reward_transform", "overlong"),
                m.__setitem__("version", "9.0"),
            ),
            "hold reward_transform, which this grpo-cli",
        ),
    ],
)
def test_an_edited_provenance_record_is_one_line(cli, tmp_path, data, edit, fragment):
    """Each was an internal error (exit 70), or (an option this version does not know) a
    verification that silently ignored it."""
    path, _ = data
    out = tmp_path / "out.parquet"
    assert cli("compute", path, "-o", out, "-r", "correct", "-q").exit_code == 0
    table = pq.read_table(out)
    record = json.loads(table.schema.metadata[b"grpo_cli"])
    edit(record)
    edited = tmp_path / "edited.parquet"
    pq.write_table(table.replace_schema_metadata({b"grpo_cli": json.dumps(record).encode()}), edited)
    assert_one_line_error(cli("check", edited, "--verify"), "the recorded grpo-cli options", fragment)


def _grouped(tmp_path, sizes, name="g.parquet", key="input"):
    rows = [
        {key: f"prompt {p}", "score": float(i % 2), "step": 1} for p, n in enumerate(sizes) for i in range(n)
    ]
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_uniform_group_size_names_the_groups_off_the_common_size(cli, tmp_path):
    sizes = [8] * 20
    sizes[3] = sizes[7] = 16
    sizes[9] = 5
    path = _grouped(tmp_path, sizes)
    result = cli("check", path, "-g", "input", "-r", "score", "--uniform-group-size")
    assert result.exit_code == 1
    assert (
        "FAIL  uniform-group-size: 5..16 (bound min == max): 3 groups are not of the common size 8: "
        "group 'prompt 3' (16 rows), group 'prompt 7' (16 rows), group 'prompt 9' (5 rows)"
    ) in result.stderr


@pytest.mark.parametrize(
    ("sizes", "key", "warning"),
    [
        ([8] * 20 + [16, 24], "input", "2 of 22 groups have 2 or more times the 8 rows most groups have"),
        (
            [1] * 6 + [2] * 4,
            "uid",
            "6 of 10 groups (60.0%) are singletons: the group key uid seems to name rollouts",
        ),
    ],
)
def test_the_summary_warns_of_grouping_mistakes(cli, tmp_path, sizes, key, warning):
    """Found by nothing before: -g input without -g step merges one prompt's steps (sizes 8/16/40),
    and a per-rollout uid makes every group a singleton."""
    path = _grouped(tmp_path, sizes, key=key)
    result = cli("check", path, "-g", key, "-r", "score", "--summary-json", "-")
    assert result.exit_code == 0
    assert [w[: len(warning)] for w in json.loads(result.stdout)["warnings"]] == [warning]
    assert f"warning: {warning}" in result.stderr


def test_no_warning_for_groups_of_one_size(cli, tmp_path):
    path = _grouped(tmp_path, [8] * 20 + [5])
    assert (
        json.loads(cli("check", path, "-g", "input", "-r", "score", "--summary-json", "-").stdout)["warnings"]
        == []
    )


def test_group_size_blocks_that_mix_prompts_are_warned_of(cli, tmp_path):
    """verl dumps after balancing its batch: --group-size 8 then reported 510 of 511 groups
    active where 199 were."""
    import random

    rows = [{"input": f"prompt {p}", "score": float(p % 3 == 0)} for p in range(64) for _ in range(8)]
    random.Random(0).shuffle(rows)
    path = tmp_path / "verl.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    result = cli("check", path, "--group-size", "8", "-r", "score", "--summary-json", "-")
    warnings = json.loads(result.stdout)["warnings"]
    assert len(warnings) == 1 and warnings[0].startswith("64 of the first 64 --group-size 8 blocks hold more")
    assert "-g input" in warnings[0]
    followed = json.loads(cli("check", path, "-g", "input", "-r", "score", "--summary-json", "-").stdout)
    assert followed["warnings"] == [] and followed["groups"] == 64  # the hint, followed: the 64 prompts
    assert followed["group_size"] == {"min": 8, "median": 8, "max": 8}
    rows.sort(key=lambda r: str(r["input"]))
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert (
        json.loads(cli("check", path, "--group-size", "8", "-r", "score", "--summary-json", "-").stdout)[
            "warnings"
        ]
        == []
    )


def _checksummed_with_a_flipped_byte(tmp_path, needle: bytes, *, occurrence: int = 0):
    """A Parquet file with page CRCs, one byte of ``needle``'s ``occurrence`` flipped (a text
    value appears in its page header's statistics first, then in the page)."""
    table = pa.table(
        {
            "group_id": [0, 0, 1, 1],
            "reward": [1.0, 0.0, 0.5, 0.25],
            "text": ["alpha-unique-text", "b", "c", "d"],
        }
    )
    path = tmp_path / "crc.parquet"
    pq.write_table(table, path, write_page_checksum=True, compression="none", use_dictionary=False)
    data = bytearray(path.read_bytes())
    at = -1
    for _ in range(occurrence + 1):
        at = data.find(needle, at + 1)
    assert at > 0
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    return path


def test_validate_pages_finds_a_corrupt_page_splicing_copies(cli, tmp_path):
    """Splice copies the bytes of columns it does not read; --validate-pages decodes them all."""
    path = _checksummed_with_a_flipped_byte(tmp_path, b"alpha-unique-text", occurrence=1)
    out = tmp_path / "out.parquet"
    assert cli("compute", path, "-o", out, "-q").exit_code == 0  # spliced: the text column is not read
    result = cli("check", path, "--validate-pages", "--summary-json", "-")
    assert result.exit_code == 1
    check = json.loads(result.stdout)["checks"][-1]
    assert check["name"] == "validate-pages" and not check["passed"]
    assert (
        "row group 0, column 'text': does not decode (could not verify page integrity" in check["value_text"]
    )
    assert (check["value"], check["op"], check["bound"]) == (1, "==", 0)
    fine = tmp_path / "fine.parquet"
    pq.write_table(
        pq.read_table(out).drop_columns(["advantage", "group_active"]), fine, write_page_checksum=True
    )
    passed = json.loads(cli("check", fine, "--validate-pages", "--summary-json", "-").stdout)["checks"][-1]
    assert passed == {
        "name": "validate-pages",
        "value": 0,
        "op": "==",
        "bound": 0,
        "passed": True,
        "value_text": "3 column chunks in 1 row groups decoded",
        "bound_text": "every page decodes",
    }


def test_a_page_that_fails_its_checksum_in_a_column_read_is_refused(cli, tmp_path):
    """The run decoded a reward page whose CRC did not match: the rewards could be anything."""
    import struct

    path = _checksummed_with_a_flipped_byte(tmp_path, struct.pack("<d", 0.25))
    for command in ("compute", "check"):
        args = ["-o", tmp_path / "o.parquet"] if command == "compute" else []
        assert_one_line_error(
            cli(command, path, *args), "crc.parquet: corrupt Parquet data (could not verify page"
        )
    assert not (tmp_path / "o.parquet").exists()


def test_nemo_rls_own_values_pass_its_preset(cli, tmp_path):
    """NeMo-RL's GRPOAdvantageEstimator, run from a mirror of its source (skips without one), on
    2,048 float32 rollouts: a fixed atol rejected its own values where an offset makes its
    E[x^2] - E[x]^2 std lose digits; the re-implementation in tests/trainers.py gives its values
    bit for bit."""
    from tests import trainers
    from tests.trainer_source import nemo_rl_advantages

    g = torch.Generator().manual_seed(0)
    offset = (5 + torch.rand(1024, generator=g)).tolist()  # rewards in [5, 6): 1,180 of 2,048 failed
    groups = [offset[i : i + 16] for i in range(0, 1024, 16)] + _float32_groups(5, 64, sizes=(16,))
    rewards = torch.tensor([r for g in groups for r in g], dtype=torch.float32)
    prompts = torch.tensor([g for g, group in enumerate(groups) for _ in group])
    own = nemo_rl_advantages(rewards, prompts)
    assert own.tolist() == [a for g in trainers.nemo_rl_float32(groups) for a in g]
    per_group = own.reshape(len(groups), -1).tolist()
    args = ["--verify-advantage-col", "trainer_advantage", "--preset", "nemo-rl", "--summary-json", "-"]
    result = cli("check", _exported(tmp_path, groups, per_group), *args)
    verify = json.loads(result.stdout)["verify"]
    assert result.exit_code == 0 and verify["mismatched"] == 0, verify["examples"]


def test_verify_fails_a_corrupted_one_rollout_group(cli, tmp_path):
    """A singleton fell under the offset rule: 1.5 in place of verl's 1.0 passed as residue."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "export.parquet"
    advantage = [-0.7071063, 0.7071063, 1.5]  # the singleton's is r / (1 + 1e-6), about 1.0
    pq.write_table(pa.table({"group_id": [0, 0, 1], "reward": [0.0, 1.0, 1.0], "a": advantage}), path)
    result = cli("check", path, "--verify-advantage-col", "a", "--preset", "verl")
    assert result.exit_code == 1, result.stderr
    assert "row 2 group 1" in result.stderr


def _footer_edited(
    path: Path, *, column_values: dict[int, int] | None = None, rows: int | None = None
) -> Path:
    """``path`` with its footer rewritten (Thrift fields, as a damaged writer leaves them): column
    ``c``'s chunk in row group 0 declaring ``column_values[c]`` values (pyarrow then decodes that
    many), or the row group and file declaring ``rows`` rows."""
    import io
    import struct

    from thrift.Thrift import TType

    from grpo_cli.outputs import splice as s

    data = path.read_bytes()
    footer = s.read_footer(io.BytesIO(data))
    group = footer.row_groups[0]
    element_type, chunks = s.read_list(s._raw(s._get(group, s.ROW_GROUP_COLUMNS)))
    for column, values in (column_values or {}).items():
        chunk = s.read_struct(chunks[column])
        meta = s.read_struct(s._raw(s._get(chunk, s.CHUNK_META)))
        meta = s._replace(meta, s.int_field(5, TType.I64, values))  # ColumnMetaData.num_values
        chunks[column] = s.write_struct(
            s._replace(chunk, s.Field(s.CHUNK_META, TType.STRUCT, s.write_struct(meta)))
        )
    group = s._replace(group, s.Field(s.ROW_GROUP_COLUMNS, TType.LIST, s.write_list(element_type, chunks)))
    fields = footer.fields
    if rows is not None:
        group = s._replace(group, s.int_field(s.ROW_GROUP_ROWS, TType.I64, rows))
        fields = s._replace(fields, s.int_field(s.FILE_NUM_ROWS, TType.I64, rows))
    group_type, _ = s.read_list(s._raw(s._get(fields, s.FILE_ROW_GROUPS)))
    fields = s._replace(
        fields, s.Field(s.FILE_ROW_GROUPS, TType.LIST, s.write_list(group_type, [s.write_struct(group)]))
    )
    footer_bytes = s.write_struct(fields)
    damaged = path.with_name("damaged.parquet")
    damaged.write_bytes(data[: footer.start] + footer_bytes + struct.pack("<I", len(footer_bytes)) + b"PAR1")
    return damaged


def _three_rows(tmp_path: Path) -> Path:
    path = tmp_path / "three.parquet"
    table = pa.table({"group_id": [0, 0, 1], "reward": [1.0, 0.0, 0.5], "text": ["a", "b", "c"]})
    pq.write_table(table, path, row_group_size=3)
    return path


def test_validate_pages_fails_a_column_chunk_short_of_its_row_group(cli, tmp_path):
    """Issue #67 C.7 (apache/parquet-testing ARROW-GH-41317): a row group declares 3 rows and one
    column decodes to 0 values; pyarrow reads that column alone without a word, so every page
    decoded and the gate passed. The values each chunk yields are held to the row group's rows."""
    path = _footer_edited(_three_rows(tmp_path), column_values={2: 0})
    with pytest.raises(pa.ArrowInvalid):
        pq.read_table(path)  # the damage as pyarrow sees it whole
    result = cli("check", path, "--validate-pages", "--summary-json", "-")
    assert result.exit_code == 1, result.stderr
    check = json.loads(result.stdout)["checks"][-1]
    assert check["name"] == "validate-pages" and not check["passed"]
    assert check["value_text"] == (
        f"{path}: row group 0, column 'text': decodes to 0 values where the row group declares 3 rows"
    )


def test_a_footer_declaring_rows_the_columns_do_not_hold_is_refused_by_name(cli, tmp_path):
    """A footer that declares 5 rows over columns of 3: the run read 3 and the splice, expecting
    5, failed with an internal error (exit 70). It is one line naming the chunk, on every path
    that reads Parquet (streamed, in memory), and nothing is written."""
    path = _footer_edited(_three_rows(tmp_path), rows=5)
    out = tmp_path / "out.parquet"
    expected = (
        "damaged.parquet: row group 0, column 'group_id': decodes to 3 values where the row group declares 5"
    )
    for args in (
        ["compute", path, "-o", out],
        ["compute", path, "-o", out, "--memory-limit-mb", "0"],
        ["check", path],
    ):
        assert_one_line_error(cli(*args), expected)
    assert not out.exists()
    check = cli("check", path, "--validate-pages")
    assert_one_line_error(check, expected)


def test_every_bad_data_file_of_parquet_testing_is_refused_or_read_whole(cli, tmp_path):
    """apache/parquet-testing's ``bad_data/`` (from a local mirror; skips without one): for each
    file the gate (:func:`~grpo_cli.inputs.readers.validate_pages`) names its damage, or pyarrow reads it
    whole, every row its footer declares; ARROW-GH-41317 fails ``check --validate-pages``."""
    import subprocess

    from grpo_cli.inputs.readers import validate_pages
    from grpo_cli.inputs.sources import Shard
    from tests.integration.test_splice import PARQUET_TESTING
    from tests.trainer_source import source

    source(PARQUET_TESTING, "bad_data/README.md")  # skips where no mirror is present
    git = ["git", "--git-dir", "/work/.mirror/apache+parquet-testing/repo"]
    listed = subprocess.run(
        [*git, "ls-tree", "--name-only", PARQUET_TESTING[1], "bad_data/"], capture_output=True, text=True
    )
    names = [n for n in listed.stdout.split() if n.endswith(".parquet")]
    assert len(names) >= 8
    refused = []
    for name in names:
        path = tmp_path / name.split("/")[-1]
        data = subprocess.run([*git, "show", f"{PARQUET_TESTING[1]}:{name}"], capture_output=True).stdout
        path.write_bytes(data)
        found = validate_pages([Shard(path, path.name, "parquet", len(data))])["error"]
        if found is not None:
            assert found.startswith(f"{path.name}: "), found
            refused.append(name)
            continue
        assert pq.read_table(path).num_rows == pq.read_metadata(path).num_rows, name  # read whole
    assert len(refused) >= 7, refused
    gated = cli(
        "check",
        tmp_path / "ARROW-GH-41317.parquet",
        "--group-size",
        "1",
        "-r",
        "float64",
        "--nan",
        "ignore",
        "--validate-pages",
        "--summary-json",
        "-",
    )
    assert gated.exit_code == 1, gated.stderr
    check = json.loads(gated.stdout)["checks"][-1]
    assert check["name"] == "validate-pages" and not check["passed"]
    assert "decodes to 0 values where the row group declares 3 rows" in check["value_text"]
