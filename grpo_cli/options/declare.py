"""Options declared on the dataclass fields they set, as TRL's ``GRPOConfig`` declares its own.

A field of :class:`~grpo_cli.options.advantage.AdvantageOptions`,
:class:`~grpo_cli.options.config.ComputeConfig`, :class:`~grpo_cli.options.checks.CheckBounds`,
:class:`~grpo_cli.options.config.VerifySpec` or :class:`~grpo_cli.options.command.CommandOptions`
is an option when :func:`option` made it: its flags, help and panel sit beside its type and
default, and :func:`declared` reads them back as :class:`Option` rows. The CLI's parameters, the
table API's keywords, the provenance record and ``--help`` all read those rows
(:mod:`grpo_cli.options.catalog` gathers them), so a field's default is written once, on the field.

Plain data (standard library only): ``--help`` reads it without importing torch or pyarrow.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Example:
...     epsilon: float = option(1e-6, "--epsilon", help="Added to the std.", panel="Advantage")
...     extra: int = 3
>>> [row] = declared(Example, "advantage")
>>> row.name, row.flags, row.kind, row.default, row.show_default
('epsilon', ('--epsilon',), float | None, None, '1e-6')
>>> Example().epsilon
1e-06
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from grpo_cli.errors import mention

Target = Literal["advantage", "config", "bounds", "verify", "run"]
"""Where a value goes: an :class:`~grpo_cli.options.advantage.AdvantageOptions` field, a
:class:`~grpo_cli.options.config.ComputeConfig` field, a :class:`~grpo_cli.options.checks.CheckBounds`
field, a :class:`~grpo_cli.options.config.VerifySpec` field, or a
:class:`~grpo_cli.options.command.CommandOptions` field (how the command runs and reports)."""

SHARED = ("compute", "check")
EVERY = ("compute", "check", "inspect")

_DECLARED = "grpo_cli.option"
_LAYERED: tuple[Target, ...] = ("advantage", "config")
"""The targets whose values a layer below the command line can set (a preset, an estimator, a
trainer's dump, an output's record): the CLI passes ``None`` for "not given" and shows the
field's default."""
CHECKS, OUTPUT, INPUT, ADVANTAGE, SHAPING, ENGINE, RUN = (
    "Checks",
    "Output",
    "Input",
    "Advantage",
    "Reward shaping",
    "Engine",
    "Run",
)
PANELS = (CHECKS, OUTPUT, INPUT, ADVANTAGE, SHAPING, ENGINE, RUN)
"""The help's panels, in order; within one, the options of each dataclass in the catalogue's order."""
_PANELS: dict[Target, str] = {"advantage": ADVANTAGE, "bounds": CHECKS, "verify": CHECKS}


@dataclass(frozen=True)
class Option:
    """One option. ``default=None`` means "not given": the preset's, the recorded or the
    configuration's default applies. ``flags=()``: no CLI flag (a preset or an estimator sets
    it, or only the Python APIs take it). ``record``: its key in the provenance record (advantage
    options are recorded by field); ``from_provenance``: ``check --verify`` takes it from the
    record unless it is given. ``values``: the vocabulary of the field it sets, where the CLI
    takes another type (``--whiten`` is a flag)."""

    name: str
    flags: tuple[str, ...]
    help: str | Mapping[str, str]
    kind: Any
    default: Any = None
    target: Target = "config"
    field: str | None = None
    panel: str | None = None
    commands: tuple[str, ...] = SHARED
    keyword: bool = True
    positive_finite: bool = False
    values: Any = None
    record: str | None = None
    from_provenance: bool = False
    metavar: str | None = None
    envvar: str | None = None
    show_default: bool | str = True
    min: float | None = None
    max: float | None = None

    @property
    def label(self) -> str:
        """How messages name the option (:func:`~grpo_cli.errors.mention`: its long flag on the
        command line, its keyword in the table API), or its name where it has no flag."""
        return mention(self.name) if self.flags else self.name

    @property
    def setting(self) -> str:
        """The field it sets in its target."""
        return self.field or self.name

    @property
    def vocabulary(self) -> Any:
        """The ``Literal`` of the values it takes where it is a choice (``None`` where not)."""
        if self.values is not None:
            return self.values
        for part in (self.kind, *get_args(self.kind)):
            if get_origin(part) is Literal:
                return part
        return None

    def help_for(self, command: str) -> str:
        return self.help if isinstance(self.help, str) else self.help[command]


def option(
    default: Any = dataclasses.MISSING,
    *flags: str,
    help: str | Mapping[str, str],
    default_factory: Any = dataclasses.MISSING,
    name: str | None = None,
    kind: Any = None,
    panel: str | None = None,
    commands: tuple[str, ...] | None = None,
    keyword: bool | None = None,
    shown: str | bool | None = None,
    **row: Any,
) -> Any:
    """A dataclass field that is an option: ``default`` (or ``default_factory``) is the field's,
    ``flags`` the CLI's (none: only a preset, an estimator or the Python APIs set it).

    ``name``: the option's name where it is not the field's (``clip_advantage`` sets ``clip``);
    ``kind``: the type the CLI and the table API take where it is not the field's (``--reward-col``
    takes texts, the field holds :class:`~grpo_cli.options.advantage.RewardSpec` objects);
    ``required=True``: the CLI needs it (``--output``);
    ``shown``: what ``--help`` shows as the default where the field's value does not say it
    (``"the whole input is one batch"``), ``False`` for nothing. ``commands``, ``keyword`` and
    ``panel`` default by target (:func:`declared`); ``row``: the other :class:`Option` fields."""
    metadata = {
        _DECLARED: {
            "flags": flags,
            "help": help,
            "name": name,
            "kind": kind,
            "panel": panel,
            "commands": commands,
            "keyword": keyword,
            "shown": shown,
            **row,
        }
    }
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@functools.cache
def declared(cls: type, target: Target) -> tuple[Option, ...]:
    """The options ``cls``'s fields declare, in field order, as ``target``'s rows.

    The CLI's default is the field's, except for ``target``s a layer below the command line can
    set (advantage and configuration fields: a preset, an estimator, a dump, a record), where it
    is ``None``, "not given" (a flag's is ``False``), and ``--help`` shows the field's default.
    """
    hints = typing.get_type_hints(cls)
    rows = []
    for field in dataclasses.fields(cls):
        spec = field.metadata.get(_DECLARED)
        if spec is None:
            continue
        spec = dict(spec)
        name = spec.pop("name") or field.name
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default  # type: ignore[operator]
        hint = spec.pop("kind") or hints[field.name]
        layered = target in _LAYERED
        if hint is bool:  # a flag
            kind, cli_default = bool, False if layered else default
        elif layered:
            kind, cli_default = hint | None, None
        else:
            kind, cli_default = hint, default
        shown = spec.pop("shown")
        if shown is None:
            shown = _shown(default) if layered and hint is not bool else True
        commands = spec.pop("commands")
        keyword = spec.pop("keyword")
        panel = spec.pop("panel") or _PANELS.get(target)
        rows.append(
            Option(
                name,
                spec.pop("flags"),
                spec.pop("help"),
                kind,
                ... if spec.pop("required", False) else cli_default,
                target=target,
                field=None if name == field.name else field.name,
                panel=panel,
                commands=commands if commands is not None else SHARED if layered else ("check",),
                keyword=keyword if keyword is not None else layered,
                show_default=shown,
                **spec,
            )
        )
    return tuple(rows)


def _shown(default: Any) -> str | bool:
    """A field's default as ``--help`` shows it: ``1e-6``, ``1``, ``group_id``; nothing for ``None``.

    >>> _shown(1e-6), _shown(1.0), _shown(("group_id",)), _shown(None)
    ('1e-6', '1', 'group_id', False)
    """
    if default is None:
        return False
    if isinstance(default, tuple):
        return ", ".join(str(_shown(part)) for part in default)
    if isinstance(default, float):
        return re.sub(r"e([+-])0*(\d)", lambda m: f"e{m[1].replace('+', '')}{m[2]}", format(default, "g"))
    return str(getattr(default, "column", default))
