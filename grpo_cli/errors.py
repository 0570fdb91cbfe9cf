"""The project's one exception type."""

from __future__ import annotations


class GrpoError(ValueError):
    """A problem with the input, the options or the disk, told in one line.

    The CLI prints ``error: <message>`` on standard error and exits with ``exit_code``:
    2 for a usage or input error (the default), 3 when the output was written but a
    later step (the summary) failed, 130 when interrupted after the output was written.
    It subclasses ``ValueError`` so that library callers can catch the kernel's and the
    I/O layer's bad-input errors alike.
    """

    def __init__(self, message: str, *, exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
