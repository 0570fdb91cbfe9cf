"""The project's one exception type, and the exit codes it maps to."""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_WRITTEN_THEN_FAILED = 3
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a Unix tool killed by a closed pipe


class GrpoError(ValueError):
    """A problem with the input, the options or the disk, told in one line.

    The CLI prints ``error: <message>`` on standard error and exits with ``exit_code``:
    2 for a usage or input error (the default), 3 when the output was written but a
    later step (the summary) failed, 130 when interrupted after the output was written.
    It subclasses ``ValueError`` so that library callers can catch the kernel's and the
    I/O layer's bad-input errors alike.
    """

    def __init__(self, message: str, *, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


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
