"""The project's one exception type."""

from __future__ import annotations


class GrpoError(ValueError):
    """A problem with the input or the options, told in one line.

    The CLI prints ``error: <message>`` on standard error and exits with ``exit_code``
    (2: usage or input error). It subclasses ``ValueError`` so that library callers can
    catch the kernel's and the I/O layer's bad-input errors alike.
    """

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
