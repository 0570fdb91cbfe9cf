"""Errors carry the options they name: the command line, the table API and the tensor API each
word them their own way, with no rewriting of the text."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from grpo_cli import add_advantages, group_advantages
from grpo_cli.errors import GrpoError, LayoutError, cli_flag, mention
from grpo_cli.options.catalog import OPTIONS

PACKAGE = Path(__file__).resolve().parents[2] / "grpo_cli"
ERROR_TYPES = {"GrpoError", "LayoutError", "UnsupportedContainer", "RowsUnknown"}
LONG_FLAGS = {flag: name for name, row in OPTIONS.items() for flag in row.flags if flag.startswith("--")}


def test_an_error_names_its_options_on_the_command_line_by_default():
    error = GrpoError(f"{mention('clip_advantage')} needs LO <= HI; see {mention('from_')}")
    assert error.message == str(error) == "--clip-advantage needs LO <= HI; see --from"
    assert error.options == ("clip_advantage", "from_")


def test_worded_keeps_the_type_exit_code_and_other_words():
    error = LayoutError(f"no column 'x'; {mention('group_col')} names it", exit_code=3)
    worded = error.worded(lambda option: f"{option}=")
    assert type(worded) is LayoutError and worded.exit_code == 3
    assert worded.message == str(worded) == "no column 'x'; group_col= names it"
    assert error.message == "no column 'x'; --group-col names it"  # the original is unchanged


def test_an_error_pickled_between_processes_keeps_its_options():
    error = GrpoError(f"{mention('batch_col')} 'step' is null", exit_code=3)
    back = pickle.loads(pickle.dumps(error))
    assert (back.message, back.exit_code, back.options) == (error.message, 3, ("batch_col",))


def test_every_long_flag_is_its_option_name_with_dashes():
    for name, row in OPTIONS.items():
        if row.flags:
            assert row.flags[0] == cli_flag(name), name


def _written_flags(node: ast.AST) -> list[str]:
    """The catalogue's long flags written out in the string constants under ``node``."""
    found = []
    for part in ast.walk(node):
        if isinstance(part, ast.Constant) and isinstance(part.value, str):
            found += [
                word.rstrip(".,;:)'") for word in part.value.split() if word.rstrip(".,;:)'") in LONG_FLAGS
            ]
    return found


def test_no_error_writes_an_option_out_as_a_flag():
    """An error names an option with ``mention()``, never as ``--flag`` text: text is what the
    table and tensor APIs cannot reword."""
    written = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                called = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                if called in ERROR_TYPES or called == "check_choice":
                    for argument in node.args[:1]:
                        written += [
                            f"{path.relative_to(PACKAGE)}:{node.lineno} {flag}"
                            for flag in _written_flags(argument)
                        ]
    assert not written, written


TABLE = pa.table({"group_id": [0, 0, 1, 1], "reward": [1.0, 0.0, 1.0, 1.0], "n": [3.0, 1.0, 2.0, 2.0]})


@pytest.mark.parametrize(
    ("keywords", "named"),
    [
        ({"epsilon": -1.0}, "epsilon="),
        ({"clip_advantage": (1.0, 0.0)}, "clip_advantage="),
        ({"std": "bessel"}, "std="),
        ({"estimator": "remax"}, "baseline_col="),
        ({"overlong": (10.0, 2.0)}, "length_col="),
        ({"length_col": "n"}, "length_col="),
        ({"advantage_col": "group_id"}, "advantage_col="),
        ({"group_col": "g", "group_size": 2}, "group_size= and group_col= cannot be used together"),
        ({"pass_k": 2}, "pass_k="),
    ],
)
def test_the_table_api_names_its_keywords(keywords, named):
    with pytest.raises(GrpoError) as refused:
        add_advantages(TABLE, **keywords)
    message = refused.value.message
    assert named in message
    assert not [flag for flag in LONG_FLAGS if flag in message and OPTIONS[LONG_FLAGS[flag]].keyword], message


def test_the_tensor_api_names_its_own_keywords():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    with pytest.raises(GrpoError, match=r"^estimator='opo' needs lengths= "):
        group_advantages(rewards, estimator="opo")
    lengths = torch.tensor([[3.0, float("nan"), 1.0, 1.0]])
    with pytest.raises(GrpoError) as refused:
        group_advantages(rewards, estimator="opo", lengths=lengths)
    assert refused.value.message.startswith("rewards index 1: lengths= is nan"), refused.value.message
    with pytest.raises(GrpoError, match=r"^pass_k= must be a whole number >= 1, got 0"):
        group_advantages(rewards, estimator="pass_at_k", pass_k=0)
