"""The project's one exception type, and the exit codes it maps to."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_WRITTEN_THEN_FAILED = 3
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a Unix tool killed by a closed pipe


_MARK = "\x1f"  # around an option's name in a message: how it is named depends on who reads it


def mention(option: str) -> str:
    """An option named in a message, in the words of the surface that reports it: the command
    line's flag by default (:func:`cli_flag`), ``clip_advantage=`` in the table API, the tensor
    API's own keyword (:meth:`GrpoError.worded`).

    >>> GrpoError(f"{mention('clip_advantage')} needs LO <= HI").message
    '--clip-advantage needs LO <= HI'
    >>> GrpoError(f"{mention('clip_advantage')} needs LO <= HI").worded(lambda name: f"{name}=").message
    'clip_advantage= needs LO <= HI'
    """
    return f"{_MARK}{option}{_MARK}"


def cli_flag(option: str) -> str:
    """An option's long flag: its name with dashes (``from_`` is ``--from``)."""
    return "--" + option.rstrip("_").replace("_", "-")


def _worded(template: str, name: Callable[[str], str]) -> str:
    parts = template.split(_MARK)
    return "".join(name(part) if i % 2 else part for i, part in enumerate(parts))


class GrpoError(ValueError):
    """A problem with the input, the options or the disk, told in one line.

    The CLI prints ``error: <message>`` on standard error and exits with ``exit_code``:
    2 for a usage or input error (the default), 3 when the output was written but a
    later step (the summary) failed, 130 when interrupted after the output was written.
    It subclasses ``ValueError`` so that library callers can catch the kernel's and the
    I/O layer's bad-input errors alike.

    The options a message names are carried in it (:func:`mention`): ``message`` names them
    as the command line does, :meth:`worded` as another surface does.
    """

    def __init__(self, message: str, *, exit_code: int = EXIT_USAGE) -> None:
        self.template = message
        self.message = _worded(message, cli_flag)
        super().__init__(self.message)
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with its template (a Ray task's error names its options as the driver's)."""
        return (type(self), (self.template,), self.__dict__)

    @property
    def options(self) -> tuple[str, ...]:
        """The options the message names, in order."""
        return tuple(self.template.split(_MARK)[1::2])

    def worded(self, name: Callable[[str], str]) -> GrpoError:
        """This error (its type, exit code and cause) with each option it names told by ``name``."""
        reworded = copy.copy(self)
        reworded.message = _worded(self.template, name)
        reworded.args = (reworded.message,)
        return reworded


class LayoutError(GrpoError):
    """The input is not laid out as the options read it: a column missing, data in subfolders.
    The jobs add what the input looks like instead (a trainer's dump: ``--from``)."""


def os_reason(exc: OSError) -> str:
    """``No space left on device`` and the like, for one-line messages."""
    return exc.strerror or str(exc)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
