"""Scratch files: private temporary copies of input that can be read only once (standard
input, a pipe) or that grpo-cli rewrites to read (a JSON array as lines).

They live in the system's temporary folder, never beside the user's files, and are removed on
every exit path; those a killed run left behind (its process is gone) are removed by the next.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from grpo_cli.errors import GrpoError, os_reason

_SPOOL_PREFIX = "grpo-cli-spool-"
_SPOOL_NAME = re.compile(r"^grpo-cli-spool-(?P<pid>\d+)-[0-9a-f]{12}$")


@contextlib.contextmanager
def spool(
    stream: IO[bytes] | None, *, label: str, write: Callable[[IO[bytes]], None] | None = None
) -> Iterator[Path]:
    """Copy a stream that can be read only once (stdin, a pipe) to a private temporary file,
    or fill one with ``write`` (a JSON array turned into lines).

    The file lives in the system's temporary folder, is removed on every exit path, and
    spools that killed runs left behind (their process is gone) are removed first.
    """
    if write is None:
        assert stream is not None
        source = stream

        def write(out: IO[bytes]) -> None:
            shutil.copyfileobj(source, out, 1 << 20)

    path = scratch_file(label)
    try:
        with open(path, "wb") as out:
            write(out)
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise GrpoError(f"{label}: cannot copy the input to a temporary file ({os_reason(exc)})") from None
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def scratch_file(label: str) -> Path:
    """A new private file in the system's temporary folder, named so that a later run
    removes it if this process dies (see :func:`remove_stale_spools`)."""
    folder = Path(tempfile.gettempdir())
    remove_stale_spools(folder)
    path = folder / f"{_SPOOL_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise GrpoError(f"{label}: cannot create a temporary file in {folder} ({os_reason(exc)})") from None
    return path


def scratch_dir(label: str, *, root: Path | None = None) -> Path:
    """A new private folder in the system's temporary folder (or ``root``), removed by a later
    run if this process dies, as :func:`scratch_file`'s files are."""
    folder = Path(tempfile.gettempdir()) if root is None else root
    remove_stale_spools(folder)
    path = folder / f"{_SPOOL_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        path.mkdir(mode=0o700)
    except OSError as exc:
        raise GrpoError(f"{label}: cannot create a temporary folder in {folder} ({os_reason(exc)})") from None
    return path


SOCKET_PATH_BYTES = 107
"""The longest path of a Unix socket (``sun_path``, less its terminating NUL)."""
SCRATCH_NAME_BYTES = len(f"/{_SPOOL_PREFIX}4194304-123456789abc")
"""A :func:`scratch_dir` folder's name, with the largest process ID, and its separator."""


def socket_root(tail: int, *, program: str) -> Path | None:
    """The root for a private folder below which ``program`` makes Unix sockets ``tail`` bytes
    long: ``None`` (the system's temporary folder) where they fit in 107 bytes, else ``/tmp``.
    A long TMPDIR broke Ray (exit 70) and the report's browser (it aborted, leaving its
    folder behind). Refused in one line where neither fits.

    >>> socket_root(0, program="Ray") is None  # nothing below the root: any TMPDIR fits
    True
    """
    root = tempfile.gettempdir()
    if len(os.fsencode(root)) + tail <= SOCKET_PATH_BYTES:
        return None
    short = "/tmp"
    if (
        len(short) + tail <= SOCKET_PATH_BYTES
        and os.path.isdir(short)
        and os.access(short, os.W_OK | os.X_OK)
    ):
        return Path(short)
    raise GrpoError(
        f"the temporary folder {root} is too long for {program}'s socket paths ({SOCKET_PATH_BYTES} bytes) "
        f"and /tmp is not writable: set TMPDIR to a folder of at most {SOCKET_PATH_BYTES - tail} characters"
    )


def remove_stale_spools(folder: Path) -> None:
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        match = _SPOOL_NAME.match(entry.name)
        if match is not None and not _process_alive(int(match["pid"])):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            with contextlib.suppress(OSError):
                entry.unlink()


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
