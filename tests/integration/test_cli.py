"""``grpo-cli compute`` through CliRunner: options, outputs, and every bad input."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import grpo_cli
from grpo_cli.cli import app
from grpo_cli.cli.help import label as label_help
from tests.conftest import assert_one_line_error, digest, rollout_rows, write_jsonl, write_parquet
from tests.reference import reference_advantages

SUMMARY_KEYS = {
    "rows",
    "groups",
    "active_groups",
    "inactive_groups",
    "active_fraction",
    "singleton_groups",
    "group_size",
    "reward",
    "advantage",
    "inactive_by_value",
    "input",
    "output",
    "options",
}


def expected_for(rows, reward="reward", keys=("group_id",), **options):
    key_of = [tuple(r[k] for k in keys) for r in rows]
    dense = {k: i for i, k in enumerate(dict.fromkeys(key_of))}
    return reference_advantages([float(r[reward]) for r in rows], [dense[k] for k in key_of], **options)[0]


# --------------------------------------------------------------------------- happy paths


def test_compute_parquet_keeps_every_column_and_row_order(cli, tmp_path, rows):
    table = pa.Table.from_pylist(rows).replace_schema_metadata({"origin": "test"})
    source = tmp_path / "in.parquet"
    pq.write_table(table, source)
    out = tmp_path / "out.parquet"
    result = cli("compute", source, "-o", out)
    assert result.exit_code == 0, result.stderr
    written = pq.read_table(out)
    assert written.column_names == [*table.column_names, "advantage", "group_active"]
    assert written.schema.metadata[b"origin"] == b"test"
    for name in table.column_names:
        assert written.schema.field(name).type == table.schema.field(name).type
        assert written.column(name).equals(table.column(name))
    assert written.schema.field("advantage").type == pa.float64()
    assert written.schema.field("group_active").type == pa.bool_()
    expected = expected_for(rows)
    torch.testing.assert_close(
        torch.tensor(written.column("advantage").to_pylist(), dtype=torch.float64),
        torch.tensor(expected, dtype=torch.float64),
    )


def test_active_column_marks_rows_of_active_groups(cli, tmp_path, parquet_file, rows):
    out = tmp_path / "out.parquet"
    assert cli("compute", parquet_file, "-o", out, "-r", "correct").exit_code == 0
    written = pq.read_table(out).to_pylist()
    by_group: dict[str, set[int]] = {}
    for row in rows:
        by_group.setdefault(row["group_id"], set()).add(row["correct"])
    for row in written:
        assert row["group_active"] == (len(by_group[row["group_id"]]) > 1)
        if not row["group_active"]:
            assert row["advantage"] == 0.0


def test_jsonl_and_parquet_give_identical_advantages(cli, tmp_path, parquet_file, jsonl_file):
    assert cli("compute", parquet_file, "-o", tmp_path / "a.parquet").exit_code == 0
    assert cli("compute", jsonl_file, "-o", tmp_path / "b.parquet").exit_code == 0
    a = pq.read_table(tmp_path / "a.parquet").column("advantage")
    b = pq.read_table(tmp_path / "b.parquet").column("advantage")
    assert a.equals(b)


def test_gzip_jsonl_ndjson_and_stdin(cli, tmp_path, rows, jsonl_file):
    gz = tmp_path / "r.jsonl.gz"
    gz.write_bytes(gzip.compress(jsonl_file.read_bytes()))
    nd = tmp_path / "r.ndjson"
    nd.write_bytes(jsonl_file.read_bytes())
    outs = []
    for i, source in enumerate([gz, nd]):
        out = tmp_path / f"o{i}.parquet"
        assert cli("compute", source, "-o", out).exit_code == 0
        outs.append(pq.read_table(out).column("advantage"))
    out = tmp_path / "stdin.parquet"
    result = cli("compute", "-", "-o", out, input=jsonl_file.read_bytes())
    assert result.exit_code == 0, result.stderr
    outs.append(pq.read_table(out).column("advantage"))
    assert outs[0].equals(outs[1]) and outs[0].equals(outs[2])


def test_input_format_override(cli, tmp_path, jsonl_file):
    odd = tmp_path / "rollouts.txt"
    odd.write_bytes(jsonl_file.read_bytes())
    result = cli("compute", odd, "-o", tmp_path / "o.parquet")
    assert result.exit_code == 2 and "cannot tell the format" in result.stderr
    assert cli("compute", odd, "-o", tmp_path / "o.parquet", "--input-format", "jsonl").exit_code == 0


@pytest.mark.parametrize("key", ["uid", "int", "small"])
def test_any_key_type(cli, tmp_path, key):
    rows = rollout_rows(key=key, seed=3)
    source = write_parquet(tmp_path / "in.parquet", rows)
    out = tmp_path / "o.parquet"
    assert cli("compute", source, "-o", out).exit_code == 0
    got = pq.read_table(out).column("advantage").to_pylist()
    assert got == pytest.approx(expected_for(rows), abs=1e-12)


def test_composite_key(cli, tmp_path):
    rows = rollout_rows(seed=4)
    for i, row in enumerate(rows):
        row["step"] = i % 2  # splits each uid group in two
    source = write_parquet(tmp_path / "in.parquet", rows)
    out = tmp_path / "o.parquet"
    result = cli("compute", source, "-o", out, "-g", "group_id", "-g", "step", "--summary-json", "-")
    assert result.exit_code == 0, result.stderr
    got = pq.read_table(out).column("advantage").to_pylist()
    assert got == pytest.approx(expected_for(rows, keys=("group_id", "step")), abs=1e-12)
    assert json.loads(result.stdout)["groups"] == len({(r["group_id"], r["step"]) for r in rows})


def test_group_size_layout(cli, tmp_path):
    rows = rollout_rows(shuffle=False, singletons=0)
    source = write_parquet(tmp_path / "in.parquet", rows)
    out = tmp_path / "o.parquet"
    assert cli("compute", source, "-o", out, "--group-size", "4").exit_code == 0
    got = pq.read_table(out).column("advantage").to_pylist()
    assert got == pytest.approx(expected_for(rows), abs=1e-12)


@pytest.mark.parametrize(
    ("arrow_type", "expected_type"),
    [
        (pa.float16(), pa.float16()),
        (pa.float32(), pa.float32()),
        (pa.float64(), pa.float64()),
        (pa.int64(), pa.float32()),
        (pa.int8(), pa.float32()),
        (pa.bool_(), pa.float32()),
    ],
)
def test_advantage_dtype_follows_reward_dtype(cli, tmp_path, rows, arrow_type, expected_type):
    table = pa.Table.from_pylist(rows)
    values = table.column("correct")
    table = table.set_column(table.schema.get_field_index("correct"), "correct", values.cast(arrow_type))
    source = tmp_path / "in.parquet"
    pq.write_table(table, source)
    out = tmp_path / "o.parquet"
    assert cli("compute", source, "-o", out, "-r", "correct").exit_code == 0
    written = pq.read_table(out)
    assert written.schema.field("advantage").type == expected_type
    assert written.schema.field("correct").type == arrow_type
    tolerance = 2e-3 if arrow_type == pa.float16() else 1e-6
    assert written.column("advantage").to_pylist() == pytest.approx(
        expected_for(rows, reward="correct"), abs=tolerance
    )


def test_options_reach_the_kernel(cli, tmp_path, parquet_file, rows):
    out = tmp_path / "o.parquet"
    args = ["--std", "sample", "--scale", "batch", "--epsilon", "1e-3"]
    assert cli("compute", parquet_file, "-o", out, *args).exit_code == 0
    got = pq.read_table(out).column("advantage").to_pylist()
    assert got == pytest.approx(expected_for(rows, std="sample", scale="batch", epsilon=1e-3), abs=1e-12)


def test_custom_column_names(cli, tmp_path, parquet_file):
    out = tmp_path / "o.parquet"
    assert (
        cli("compute", parquet_file, "-o", out, "--advantage-col", "adv", "--active-col", "live").exit_code
        == 0
    )
    assert pq.read_table(out).column_names[-2:] == ["adv", "live"]


def test_summary_json_file_and_stdout(cli, tmp_path, parquet_file):
    out = tmp_path / "o.parquet"
    summary_path = tmp_path / "summary.json"
    result = cli("compute", parquet_file, "-o", out, "-r", "correct", "--summary-json", summary_path)
    assert result.exit_code == 0
    assert result.stdout == ""  # nothing on stdout unless asked
    data = json.loads(summary_path.read_text())
    assert set(data) >= SUMMARY_KEYS
    assert data["rows"] == 49 and data["groups"] == 13
    assert data["active_groups"] + data["inactive_groups"] == data["groups"]
    assert data["singleton_groups"] == 1
    assert {item["value"] for item in data["inactive_by_value"]} == {0.0, 1.0}
    assert data["output"]["path"] == str(out)
    assert data["options"]["epsilon"] == 1e-6
    result = cli("compute", parquet_file, "-o", out, "--force", "--summary-json", "-", "--quiet")
    assert result.exit_code == 0 and result.stderr == ""
    assert json.loads(result.stdout)["rows"] == 49


def test_plain_summary_on_stderr(cli, tmp_path, parquet_file):
    result = cli("compute", parquet_file, "-o", tmp_path / "o.parquet", "-r", "correct")
    assert result.exit_code == 0
    err = result.stderr
    for label in (
        "rows",
        "groups",
        "active groups",
        "inactive groups",
        "all 0.0",
        "all 1.0",
        "singleton groups",
    ):
        assert label in err
    assert "histogram" in err


def test_quiet_prints_nothing(cli, tmp_path, parquet_file):
    result = cli("compute", parquet_file, "-o", tmp_path / "o.parquet", "--quiet")
    assert result.exit_code == 0
    assert result.stderr == "" and result.stdout == ""


def test_empty_parquet_input_is_refused(cli, tmp_path, rows):
    table = pa.Table.from_pylist(rows).slice(0, 0)
    source = tmp_path / "empty.parquet"
    pq.write_table(table, source)
    out = tmp_path / "o.parquet"
    result = cli("compute", source, "-o", out, "--summary-json", "-")
    assert_one_line_error(result, "no rows")
    assert not out.exists()
    result = cli("compute", source, "-o", out, "-r", "missing")
    assert_one_line_error(result, "no column 'missing'")


@pytest.mark.parametrize("content", ["", "\n\n"])
def test_empty_jsonl_and_stdin_are_refused(cli, tmp_path, content):
    source = tmp_path / "empty.jsonl"
    source.write_text(content)
    out = tmp_path / "o.parquet"
    assert_one_line_error(cli("compute", source, "-o", out), "no rows")
    assert_one_line_error(cli("compute", source, "-o", out, "-r", "nothing", "-g", "none"), "no rows")
    assert_one_line_error(cli("compute", "-", "-o", out, input=content), "no rows")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl"]


def test_force_and_existing_output(cli, tmp_path, parquet_file):
    out = tmp_path / "o.parquet"
    out.write_text("precious")
    result = cli("compute", parquet_file, "-o", out)
    assert result.exit_code == 2
    assert "already exists; pass --force" in result.stderr
    assert out.read_text() == "precious"
    assert cli("compute", parquet_file, "-o", out, "--force").exit_code == 0
    assert pq.read_table(out).num_rows == 49


def test_output_naming_the_input_is_refused(cli, parquet_file):
    before = digest(parquet_file)
    result = cli("compute", parquet_file, "-o", parquet_file, "--force")
    assert result.exit_code == 2
    assert "would overwrite the input" in result.stderr
    assert digest(parquet_file) == before


# --------------------------------------------------------------------------- bad input: one line, exit 2


def test_missing_file(cli, tmp_path):
    result = cli("compute", tmp_path / "nope.parquet", "-o", tmp_path / "o.parquet")
    assert_one_line_error(result, "nope.parquet: no such file or directory")


def test_unreadable_file(cli, tmp_path, parquet_file):
    import os

    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    parquet_file.chmod(0)
    result = cli("compute", parquet_file, "-o", tmp_path / "o.parquet")
    assert_one_line_error(result, "cannot read")


def test_corrupt_parquet(cli, tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet at all")
    result = cli("compute", bad, "-o", tmp_path / "o.parquet")
    assert_one_line_error(result, "bad.parquet", "not a readable Parquet file")


def test_truncated_parquet(cli, tmp_path, parquet_file):
    data = parquet_file.read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[: len(data) // 2])
    result = cli("compute", cut, "-o", tmp_path / "o.parquet")
    assert_one_line_error(result, "cut.parquet")


def test_malformed_jsonl_names_the_line(cli, tmp_path, rows):
    lines = [json.dumps(r) for r in rows[:5]]
    lines.insert(3, '{"group_id": "a", "reward": 1.0,,}')
    source = tmp_path / "bad.jsonl"
    source.write_text("\n".join(lines) + "\n")
    result = cli("compute", source, "-o", tmp_path / "o.parquet")
    assert_one_line_error(result, "bad.jsonl, line 4", "malformed JSONL")


def test_missing_column_lists_columns(cli, tmp_path, parquet_file):
    result = cli("compute", parquet_file, "-o", tmp_path / "o.parquet", "-r", "score")
    assert_one_line_error(result, "no column 'score'", "group_id, step, text, correct, reward")
    result = cli("compute", parquet_file, "-o", tmp_path / "o.parquet", "-g", "prompt_id")
    assert_one_line_error(result, "no column 'prompt_id'")


def test_non_numeric_reward(cli, tmp_path, parquet_file):
    result = cli("compute", parquet_file, "-o", tmp_path / "o.parquet", "-r", "text")
    assert_one_line_error(result, "reward column 'text' has type string", "numeric")


@pytest.mark.parametrize(
    ("bad_values", "what"),
    [((None, None), "null"), ((float("nan"), float("nan")), "nan"), ((float("inf"), float("-inf")), "inf")],
)
def test_bad_rewards_report_count_and_first_row(cli, tmp_path, rows, bad_values, what):
    table = pa.Table.from_pylist(rows)
    rewards = table.column("reward").to_pylist()
    rewards[7], rewards[30] = bad_values
    table = table.set_column(
        table.schema.get_field_index("reward"), "reward", pa.array(rewards, pa.float64())
    )
    source = tmp_path / "in.parquet"
    pq.write_table(table, source)
    out = tmp_path / "o.parquet"
    result = cli("compute", source, "-o", out)
    assert_one_line_error(result, "in.parquet, row 7", f"reward is {what}", "2 reward(s)")
    assert not out.exists()


def test_bad_reward_in_jsonl_names_the_line(cli, tmp_path, rows):
    rows = [dict(r) for r in rows]
    rows[4]["reward"] = None
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    result = cli("compute", source, "-o", tmp_path / "o.parquet")
    assert_one_line_error(result, "in.jsonl, line 5", "reward is null", "1 reward(s)")


def test_null_group_key(cli, tmp_path, rows):
    rows = [dict(r) for r in rows]
    rows[11]["group_id"] = None
    source = write_parquet(tmp_path / "in.parquet", rows)
    result = cli("compute", source, "-o", tmp_path / "o.parquet")
    assert_one_line_error(result, "in.parquet, row 11", "group key 'group_id' is null")


@pytest.mark.parametrize(
    ("column", "option"), [("advantage", "--advantage-col"), ("group_active", "--active-col")]
)
def test_existing_output_column(cli, tmp_path, rows, column, option):
    rows = [dict(r, **{column: 0.5}) for r in rows]
    source = write_parquet(tmp_path / "in.parquet", rows)
    result = cli("compute", source, "-o", tmp_path / "o.parquet")
    assert_one_line_error(result, f"already has a column {column!r}", option)


def test_group_size_that_does_not_divide(cli, tmp_path, parquet_file):
    result = cli("compute", parquet_file, "-o", tmp_path / "o.parquet", "--group-size", "4")
    assert_one_line_error(result, "--group-size 4 does not divide the 49 rows")


def test_conflicting_options(cli, tmp_path, parquet_file):
    result = cli("compute", parquet_file, "-o", tmp_path / "o.parquet", "--group-size", "7", "-g", "group_id")
    assert_one_line_error(result, "--group-size and --group-col cannot be used together")
    result = cli(
        "compute", parquet_file, "-o", tmp_path / "o.parquet", "--advantage-col", "x", "--active-col", "x"
    )
    assert_one_line_error(result, "both 'x'")
    result = cli("compute", parquet_file, "-o", tmp_path / "o.parquet", "--epsilon", "0")
    assert_one_line_error(result, "--epsilon must be a positive finite number, got 0.0")


def test_usage_errors_stay_typer_exit_2(cli, tmp_path, parquet_file):
    result = cli("compute", parquet_file)
    assert result.exit_code == 2 and "Missing option" in result.stderr
    result = cli("compute", parquet_file, "-o", tmp_path / "o.parquet", "--std", "biased")
    assert result.exit_code == 2 and "biased" in result.stderr


def test_unavailable_device(cli, tmp_path, parquet_file):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    result = cli("compute", parquet_file, "-o", tmp_path / "o.parquet", "--device", "cuda")
    assert_one_line_error(result, "--device cuda is not available here; available: cpu")
    result = cli("compute", parquet_file, "-o", tmp_path / "o.parquet", "--device", "tpu:x")
    assert_one_line_error(result, "--device 'tpu:x' is not a device name")


def test_device_auto_runs(cli, tmp_path, parquet_file):
    assert cli("compute", parquet_file, "-o", tmp_path / "o.parquet", "--device", "auto").exit_code == 0


def test_missing_output_folder(cli, tmp_path, parquet_file):
    result = cli("compute", parquet_file, "-o", tmp_path / "no" / "such" / "o.parquet")
    assert_one_line_error(result, "does not exist")


def test_internal_error_is_one_line(cli, tmp_path, parquet_file, monkeypatch):
    from grpo_cli.run import rewards

    def boom(*args, **kwargs):
        raise RuntimeError("kaboom\nsecond line")

    monkeypatch.setattr(rewards, "apply_normalization", boom)
    out = tmp_path / "o.parquet"
    result = cli("compute", parquet_file, "-o", out)
    assert result.exit_code == 70
    assert result.stderr.strip().splitlines() == [
        "error: internal error: RuntimeError: kaboom (rerun with --debug for the traceback)"
    ]
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [parquet_file]


def test_a_panic_inside_a_rust_library_is_one_line_too(cli, tmp_path, parquet_file, monkeypatch):
    """pyo3's PanicException derives from BaseException: ``except Exception`` let it through
    with a traceback."""
    from grpo_cli.run import rewards

    class PanicException(BaseException):
        pass

    def boom(*args, **kwargs):
        raise PanicException("called `Result::unwrap()` on an `Err` value: Utf8Error")

    monkeypatch.setattr(rewards, "apply_normalization", boom)
    out = tmp_path / "o.parquet"
    result = cli("compute", parquet_file, "-o", out)
    assert result.exit_code == 70
    assert result.stderr.strip().splitlines() == [
        "error: internal error: PanicException: called `Result::unwrap()` on an `Err` value: Utf8Error "
        "(rerun with --debug for the traceback)"
    ]
    assert list(tmp_path.iterdir()) == [parquet_file]


def test_failed_run_leaves_no_output_and_untouched_input(cli, tmp_path, rows):
    rows = [dict(r) for r in rows]
    rows[-1]["reward"] = float("nan")
    source = write_parquet(tmp_path / "in.parquet", rows)
    before = digest(source)
    out = tmp_path / "o.parquet"
    result = cli("compute", source, "-o", out)
    assert result.exit_code == 2
    assert digest(source) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]


# --------------------------------------------------------------------------- help, version, entry points


def all_commands():
    return [c.name or c.callback.__name__ for c in app.registered_commands]  # type: ignore[union-attr]


def test_every_command_has_help(cli):
    assert set(all_commands()) >= {"compute", "check"}
    for name in all_commands():
        for flag in ("--help", "-h"):
            result = cli(name, flag)
            assert result.exit_code == 0
            assert "Usage" in result.stdout and len(result.stdout) > 200


def test_top_level_help_and_version(cli):
    result = cli("--help")
    assert result.exit_code == 0 and "compute" in result.stdout and "check" in result.stdout
    result = cli("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"grpo-cli {grpo_cli.__version__}"


def test_python_dash_m_help_without_torch():
    code = (
        "import sys, runpy; sys.argv = ['grpo-cli', 'compute', '--help'];\n"
        "try:\n    runpy.run_module('grpo_cli', run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "assert 'torch' not in sys.modules, 'help imported torch'\n"
        "assert 'pyarrow' not in sys.modules, 'help imported pyarrow'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    done = subprocess.run([sys.executable, "-m", "grpo_cli", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "compute" in done.stdout


def test_python_dash_m_runs_compute(tmp_path, parquet_file):
    out = tmp_path / "o.parquet"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_cli",
            "compute",
            str(parquet_file),
            "-o",
            str(out),
            "--summary-json",
            "-",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == 49


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["-r", "corect"], "no column 'corect'; did you mean 'correct'? (the columns are group_id, step,"),
        (["-r", "correct:abc"], "'correct:abc' looks like 'correct' with a weight, but 'abc' is not"),
        (["-r", "correct", "-g", "stpe"], "did you mean 'step'?"),
    ],
)
def test_missing_column_hints(cli, tmp_path, parquet_file, args, hint):
    assert_one_line_error(cli("compute", parquet_file, "-o", tmp_path / "o.parquet", *args), hint)


def test_missing_default_group_column_points_at_the_options(cli, tmp_path):
    path = tmp_path / "no_groups.parquet"
    pq.write_table(pa.table({"prompt": ["a", "a"], "reward": [0.0, 1.0]}), path)
    result = cli("compute", path, "-o", tmp_path / "o.parquet")
    assert_one_line_error(
        result, "no column 'group_id'; name the group column with -g/--group-col, or use --group-size N"
    )


@pytest.mark.parametrize("command", ["compute", "check"])
def test_help_is_grouped_with_examples_and_exit_codes(cli, command):
    result = cli(command, "--help")
    assert result.exit_code == 0
    text = result.stdout
    for panel in ("Input", "Advantage", "Engine", "Run", "Examples", "Exit codes:"):
        assert panel in text, panel
    assert ("Output" if command == "compute" else "Checks") in text
    assert f"grpo-cli {command} " in text


@pytest.mark.parametrize(
    ("make_type", "label"),
    [
        (lambda click: click.Choice(["error", "ignore"]), "error|ignore"),
        (lambda click: click.IntRange(min=1), "N"),
        (lambda click: click.INT, "N"),
        (lambda click: click.FloatRange(min=0.0), "F"),
        (lambda click: click.FLOAT, "F"),
        (lambda click: click.STRING, "NAME"),
    ],
)
def test_help_labels_read_the_click_types_of_typer_before_0_29(make_type, label):
    """pyproject admits Typer 0.19 on, whose parameters carry a Click type where 0.29's carry a
    ``type_descriptor``: every command's help read the descriptor and failed with a traceback
    under an older Typer a user already had (seen with 0.19.2 and 0.28.0)."""
    click = pytest.importorskip("click")  # Ray's dependency; Typer 0.29 vendors its own
    option = click.Option(["--name"], type=make_type(click), help="Something.")
    label_help(option)
    assert option.metavar == label


def test_shell_completion_is_offered(cli):
    assert "--install-completion" in cli("--help").stdout


@pytest.mark.parametrize("command", [[], ["compute"], ["check"], ["inspect"]])
def test_no_arguments_print_the_help_once(cli, command):
    result = cli(*command)
    assert result.exit_code == 2
    assert result.output.count("Usage:") == 1, result.output


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["--preset", "trll"],
            "is not one of 'trl', 'trl-rloo', 'verl', 'openrlhf', 'nemo-rl', 'roll', 'torchrl', "
            "'slime', 'areal'; did you mean 'trl'?",
        ),
        (["--estimator", "grpo_pass"], "did you mean 'grpo_passk'?"),
    ],
)
def test_a_typo_in_a_choice_gets_a_did_you_mean(cli, parquet_file, args, fragment):
    assert_one_line_error(cli("check", parquet_file, *args), fragment)


def test_a_missing_reward_column_is_suggested_by_its_role(cli, tmp_path):
    """verl dumps its reward as 'score': 'reward' is closest to 'pred' by spelling alone."""
    source = tmp_path / "verl.parquet"
    pq.write_table(pa.table({"input": ["a", "a"], "pred": ["1", "2"], "score": [1.0, 0.0]}), source)
    assert_one_line_error(
        cli("check", source, "-g", "input"),
        "no column 'reward'; did you mean 'score' (a numeric column named like a reward)?",
    )
    nested = tmp_path / "nested.parquet"
    pq.write_table(pa.table({"group_id": [0, 0], "out": [{"score": 1.0}, {"score": 0.0}]}), nested)
    assert_one_line_error(cli("check", nested, "-r", "score"), "no column 'score'; did you mean 'out.score'?")


def test_api_errors_name_the_keyword_the_caller_wrote():
    from grpo_cli import GrpoError, add_advantages

    table = pa.table({"group_id": [0, 0], "reward": [1.0, 0.0], "advantage": [0.0, 0.0]})
    with pytest.raises(GrpoError, match=r"choose another name with advantage_col=$"):
        add_advantages(table)
    with pytest.raises(GrpoError, match=r"^epsilon= must be a positive finite number"):
        add_advantages(table, epsilon=-1.0, advantage_col="a")
    with pytest.raises(GrpoError, match=r"^advantage_col= and active_col= are both 'x'"):
        add_advantages(table, advantage_col="x", active_col="x")


@pytest.mark.parametrize(
    ("shell", "written"), [("zsh", ".zfunc/_grpo-cli"), ("fish", ".config/fish/completions/grpo-cli.fish")]
)
def test_install_completion_for_the_shell_named(cli, tmp_path, monkeypatch, shell, written):
    """--install-completion zsh installed the bash completion (Typer took it as a flag)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    result = cli("--install-completion", shell)
    assert result.exit_code == 0, result.output
    assert f"{shell} completion installed in {tmp_path / written}" in result.output
    assert (tmp_path / written).is_file() and not (tmp_path / ".bashrc").exists()


SAMPLE = Path(grpo_cli.__file__).resolve().parent.parent / "sample_data" / "rollouts.parquet"


def _process(
    code: str, tmp_path, *args: str, stdout: Any = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    """``code`` (setting things up), then grpo-cli's entry point with ``args``, in a process
    (its standard output to ``stdout``, captured by default)."""
    argv = ["grpo-cli", *args]
    script = f"import sys\n{code}\nsys.argv = {argv!r}\nfrom grpo_cli.cli import main\nmain()\n"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout as users have it
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )


def test_the_process_ends_with_the_commands_code_its_output_flushed_and_exit_handlers_run(tmp_path):
    """The entry point ends the process without the interpreter's teardown (0.3 s of torch's):
    what the command printed, its exit code and the exit handlers are as a normal exit's."""
    handler = "import atexit, pathlib\natexit.register(pathlib.Path('handled').write_text, 'ran')"
    sample = str(SAMPLE)
    done = _process(handler, tmp_path, "check", sample, "--summary-json", "-", "-q")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == pq.read_metadata(sample).num_rows
    assert (tmp_path / "handled").read_text() == "ran"
    late = _process(
        "import atexit\natexit.register(sys.stdout.write, 'at exit')", tmp_path, "check", sample, "-q"
    )
    assert late.returncode == 0 and late.stdout == "at exit"
    missing = _process("", tmp_path, "check", str(tmp_path / "missing.parquet"))
    assert missing.returncode == 2 and missing.stderr.startswith("error: ") and not missing.stdout
    usage = _process("", tmp_path, "compute", sample, "--no-such-option")
    assert usage.returncode == 2 and "error:" in usage.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_what_is_left_for_a_full_standard_output_at_the_end_fails_in_one_line(tmp_path):
    late = "import atexit\natexit.register(sys.stdout.write, 'x' * 100)"
    with open("/dev/full", "w") as full:
        done = _process(late, tmp_path, "check", str(SAMPLE), "-q", stdout=full)
    assert done.returncode == 3
    assert done.stderr == "error: cannot write to standard output (No space left on device)\n"


def test_a_thread_still_running_at_the_end_is_waited_for(tmp_path):
    """A thread that is not a daemon keeps the interpreter's own exit, which waits for it."""
    thread = (
        "import pathlib, threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(1), pathlib.Path('late').write_text('done'))).start()"
    )
    done = _process(thread, tmp_path, "--version")
    assert done.returncode == 0 and grpo_cli.__version__ in done.stdout
    assert (tmp_path / "late").read_text() == "done"


def test_help_lists_every_choice_and_keeps_what_markdown_would_eat():
    """--from and --trainer-filter list their values as --preset does; help text is escaped for
    Typer's Markdown, so verl v1's uid keeps its underscores."""
    from typer.testing import CliRunner

    from grpo_cli.choices import Trainer, TrainerFilterName, choices_of
    from grpo_cli.cli import app

    result = CliRunner().invoke(app, ["check", "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    text = " ".join(result.stdout.split())
    for name in (*choices_of(Trainer), *choices_of(TrainerFilterName)):
        assert name in text
    assert "{uid}_{session}_{index}" in text


@pytest.mark.parametrize("command", ["compute", "check", "inspect"])
def test_dash_h_is_a_summary_and_dash_dash_help_the_whole(command):
    """``-h`` lists every option a command takes, one sentence each, within 80 columns; ``--help``
    is the whole text, at least twice as long."""
    from typer.testing import CliRunner

    from grpo_cli.options.catalog import offered

    runner = CliRunner()
    short = runner.invoke(app, [command, "-h"], env={"COLUMNS": "80"})
    whole = runner.invoke(app, [command, "--help"], env={"COLUMNS": "80"})
    assert short.exit_code == whole.exit_code == 0
    lines = short.stdout.splitlines()
    assert lines[0].startswith(f"Usage: grpo-cli {command}") and max(len(line) for line in lines) <= 80
    for row in offered(command):
        assert row.flags[0] in short.stdout, row.flags[0]
    assert "every option's whole text" in short.stdout and "every option's whole text" not in whole.stdout
    assert 2 * len(lines) <= len(whole.stdout.splitlines())
