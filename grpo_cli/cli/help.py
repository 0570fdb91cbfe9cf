"""How the CLI's help reads: a label for every value (``N``, ``F``, ``a|b``, none on a flag), help
text escaped for Typer's Markdown, and ``-h``'s summary of a command's options.

No torch, no pyarrow: ``--help`` and ``-h`` answer at once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from grpo_cli.options.catalog import offered


def label(param: Any) -> None:
    """A help label a user can read: ``N``, ``F``, ``a|b`` or ``NAME`` plus its choices, none on a flag.

    Typer labels every value with its Python type (``<int range>``, ``<bool>`` for a flag,
    ``<list[str]>``); options that set ``metavar`` keep theirs.
    """
    if param.param_type_name == "argument":
        param.display_type_rich = lambda ctx: None  # the argument's name says it
        return
    if getattr(param, "is_flag", False):
        param.metavar = ""
        return
    choices, annotation = value_type(param)
    if choices is not None:
        names = [str(choice) for choice in choices]
        if param.metavar is None and len("|".join(names)) <= 30:
            param.metavar = "|".join(names)
            return
        if not all(escaped(name) in (param.help or "") for name in names):
            param.help = f"{param.help} One of: {escaped(', '.join(names))}."
    if param.metavar is not None:
        return
    if choices is not None:
        param.metavar = param.name.upper()
    elif annotation is int:
        param.metavar = "N"
    elif annotation is float:
        param.metavar = "F"
    else:
        param.metavar = param.name.upper()


def escaped(text: str) -> str:
    """Help text as it reads, in Typer's Markdown: ``{uid}_{session}_{index}`` keeps its
    underscores, a ``*`` is not emphasis."""
    return text.replace("\\", "\\\\").replace("_", "\\_").replace("*", "\\*")


def value_type(param: Any) -> tuple[Sequence[Any] | None, type | None]:
    """A parameter's choices (``None``: any value) and its value's type (``int``, ``float``, or
    ``None`` for any other), read from Typer 0.29's descriptor or, before 0.29, from the Click
    type it converts with (``Choice``, ``IntRange``, ...): pyproject admits both."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None:
        return (descriptor.choices if descriptor.is_choice else None), descriptor.annotation
    click_type = param.type
    numeric = {"integer": int, "int": int, "float": float}
    name = getattr(click_type, "name", "").removesuffix(" range")
    return getattr(click_type, "choices", None), numeric.get(name)


def label_types(command: Any) -> None:
    """:func:`label` for every parameter of ``command``, its ``--help`` included."""
    help_option = command.get_help_option

    def labeled_help_option(ctx: Any) -> Any:
        option = help_option(ctx)
        if option is not None:
            label(option)
        return option

    command.get_help_option = labeled_help_option
    for param in command.params:
        label(param)


def summary_of(command: str, docstring: str, width: int | None = None) -> str:
    """``command``'s options by panel, each its flags, its value and its help's first sentence,
    wrapped at word boundaries to ``width`` columns (the terminal's, 80 where there is none).

    >>> print(summary_of("inspect", "Print how an output was made.", width=60))
    Usage: grpo-cli inspect [OPTIONS] ...
    <BLANKLINE>
      Print how an output was made.
    <BLANKLINE>
    Run:
      --debug               Show the traceback of unexpected
                            errors.
    <BLANKLINE>
    -h: this summary; --help: every option's whole text.
    """
    import shutil
    import textwrap

    width = min(width or shutil.get_terminal_size((80, 24)).columns, 100)
    column = 24
    about = textwrap.wrap(docstring.strip().split("\n\n")[0], width - 2)
    lines = [f"Usage: grpo-cli {command} [OPTIONS] ...", "", *(f"  {line}" for line in about)]
    panels: dict[str, list[str]] = {}
    for row in offered(command):
        flags = ", ".join(sorted(row.flags, key=len))
        name = f"  {flags}" + ("" if row.kind is bool else f" {row.metavar or row.name.upper()}")
        first = _FIRST_SENTENCE.split(row.help_for(command), maxsplit=1)[0].rstrip(".") + "."
        wrapped = textwrap.wrap(first, width - column)
        shown = panels.setdefault(row.panel or "Options", [])
        if len(name) < column - 1:
            shown.append(f"{name:<{column}}{wrapped[0]}")
        else:
            shown += [name, f"{'':<{column}}{wrapped[0]}"]
        shown += [f"{'':<{column}}{line}" for line in wrapped[1:]]
    for panel, rows in panels.items():
        lines += ["", f"{panel}:", *rows]
    lines += ["", "-h: this summary; --help: every option's whole text."]
    return "\n".join(lines)


_FIRST_SENTENCE = re.compile(r"(?<!e\.g)(?<!i\.e)\.\s+(?=[A-Z(])")
