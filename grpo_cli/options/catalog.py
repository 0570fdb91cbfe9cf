"""Every option, gathered from the dataclass fields that declare them, in ``--help``'s order.

The CLI's parameters (:mod:`grpo_cli.cli` builds each command's signature from these rows),
the table API's keywords and their error wording (:mod:`grpo_cli.tables`) and the generated
CLI reference read this catalogue; an option itself is declared once, on the field it sets
(:func:`~grpo_cli.options.declare.option`). Plain data (no torch, no pyarrow).

>>> OPTIONS["gpg_f_norm"].flags
('--gpg-f-norm',)
>>> OPTIONS["gpg_f_norm"].target, OPTIONS["clip_advantage"].setting
('advantage', 'clip')
>>> [row.name for row in offered("inspect")]
['debug']
>>> keyword_named("clip_advantage"), keyword_named("rewrite")
('clip_advantage=', '--rewrite')
"""

from __future__ import annotations

from grpo_cli.errors import cli_flag
from grpo_cli.options.advantage import AdvantageOptions
from grpo_cli.options.checks import CheckBounds
from grpo_cli.options.command import CommandOptions
from grpo_cli.options.config import ComputeConfig, VerifySpec
from grpo_cli.options.declare import PANELS, Option, declared

_DECLARED = (
    *declared(CheckBounds, "bounds"),
    *declared(CommandOptions, "run"),
    *declared(ComputeConfig, "config"),
    *declared(AdvantageOptions, "advantage"),
    *declared(VerifySpec, "verify"),
)
_ROWS = sorted(_DECLARED, key=lambda row: PANELS.index(row.panel) if row.panel in PANELS else len(PANELS))

OPTIONS: dict[str, Option] = {row.name: row for row in _ROWS}
"""Every option by name, in the order the CLI's help lists them."""


def offered(command: str) -> list[Option]:
    """The rows ``command`` takes (``compute``, ``check``, ``inspect``), in help order."""
    return [row for row in _ROWS if command in row.commands]


def keywords() -> list[str]:
    """The keywords of :func:`~grpo_cli.tables.add_advantages` and ``summarize``."""
    return [row.name for row in _ROWS if row.keyword]


def keyword_named(option: str) -> str:
    """How the Python APIs name an option in a message (:meth:`~grpo_cli.errors.GrpoError.worded`):
    its keyword, or the CLI's flag where it is no keyword (``--rewrite``)."""
    return f"{option}=" if option in OPTIONS and OPTIONS[option].keyword else cli_flag(option)
