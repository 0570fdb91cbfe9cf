"""The write guard: every file grpo-cli writes goes through here first.

Data outputs, summary files and their temporaries, for every engine, are *claimed* from
one :class:`WriteGuard` before any work starts. A claim is checked on resolved paths
(symbolic links and ``..`` followed) against every input, and refused when it would

* overwrite an input file, contain an input, or lie inside an input directory;
* name the same path as another output of the run (``--summary-json`` = ``-o``);
* replace an existing file without ``force``, or a directory that holds anything but
  the Parquet shards an earlier grpo-cli run wrote there (even with ``force``);
* be written by two runs at once: a claim holds an exclusive lock (``flock``) beside
  the target until the run ends, so a second run is refused instead of racing.

Everything is written under a hidden temporary name beside the target, flushed to disk
and moved into place with ``os.replace`` (pip's ``adjacent_tmp_file``). Temporaries of
an earlier run that was killed (``kill -9``) are removed when the same target is claimed
again; a directory that a killed ``--force`` run had moved aside is put back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from grpo_cli.errors import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    EXIT_WRITTEN_THEN_FAILED,
    GrpoError,
    mention,
    os_reason,
)
from grpo_cli.file_names import PARQUET_SUFFIXES, PROVENANCE_KEY
from grpo_cli.inputs.protected import ProtectedInputs, is_within, resolve
from grpo_cli.scratch import scratch_dir, scratch_file
from grpo_cli.stores import (
    WRITABLE_SCHEMES,
    CopiedPrefix,
    GcsOutput,
    S3Output,
    check_scheme,
    is_uri,
    local_path,
    redact,
)

_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<token>[0-9a-f]{12})\.(?P<kind>tmp|old)$")


class Claim:
    """One path this run may write, locked for the run; see :meth:`WriteGuard.claim`."""

    def __init__(self, guard: WriteGuard, path: Path, resolved: Path, *, directory: bool, what: str) -> None:
        self.guard = guard
        self.what = what
        self.path = path
        self.resolved = resolved
        self.directory = directory
        self.token = uuid.uuid4().hex[:12]
        self._temp: Path | None = None
        self._lock: IO[bytes] | None = None
        self.committed = False
        self.force = False  # replace what exists at commit: --force, known when the claim is made
        self.copied: dict[str, CopiedPrefix] = {}  # an object-store output's files made by copying
        self.transfer: dict[str, Any] | None = None  # what committing an object-store output moved

    def note_copied_prefix(self, name: str, source: str, length: int) -> None:
        """The output file ``name`` (in the folder; ``""`` for a file) begins with the first
        ``length`` bytes of the object ``source``: a store can copy them without moving them."""
        self.copied[name] = CopiedPrefix(source, length)

    @property
    def display(self) -> str:
        return str(self.path)

    def temp_path(self) -> Path:
        """The hidden temporary beside the target (a folder for a directory output)."""
        if self._temp is None:
            temp = self.resolved.parent / f".{self.resolved.name}.{self.token}.tmp"
            self.guard.check_temporary(temp)
            if self.directory:
                temp.mkdir()
            self._temp = temp
        return self._temp

    def commit(self) -> None:
        """Move the finished temporary into place: fsync, then ``os.replace`` (replacing an
        existing target only where the claim was made with ``force``)."""
        force = self.force
        temp = self.temp_path()
        target = self.resolved
        try:
            if self.directory:
                for file in temp.iterdir():
                    fsync_path(file)
                fsync_path(temp, directory=True)
                if target.exists() and any(target.iterdir()):
                    if not force:
                        raise GrpoError(
                            f"{self.display}: appeared while grpo-cli ran; pass {mention('force')} to "
                            "replace it"
                        )
                    aside = target.parent / f".{target.name}.{self.token}.old"
                    os.replace(target, aside)
                    os.replace(temp, target)
                    shutil.rmtree(aside, ignore_errors=True)
                else:  # rename() replaces an empty directory, and fails on one that filled up
                    os.replace(temp, target)
            else:
                fsync_path(temp)
                if force:
                    os.replace(temp, target)
                else:
                    try:  # link() never replaces: a file that appeared meanwhile is kept
                        os.link(temp, target)
                    except FileExistsError:
                        raise GrpoError(
                            f"{self.display}: appeared while grpo-cli ran; pass {mention('force')} to "
                            "replace it"
                        ) from None
                    except OSError:  # file systems without hard links
                        if target.exists():
                            raise
                        os.replace(temp, target)
                    else:
                        temp.unlink()
            fsync_path(target.parent, directory=True)
        except OSError as exc:
            raise GrpoError(f"{self.display}: cannot move the output into place ({os_reason(exc)})") from None
        self.committed = True

    def discard(self) -> None:
        """Remove the temporary of an unfinished write (a no-op once committed)."""
        if self._temp is not None and not self.committed:
            _remove(self._temp)
        self._temp = None

    def _acquire(self) -> None:
        lock_path = self.resolved.parent / f".{self.resolved.name}.grpo-cli.lock"
        self.guard.check_temporary(lock_path)
        for _ in range(3):
            try:
                handle = open(lock_path, "ab")  # noqa: SIM115 (held until release)
            except OSError as exc:
                raise GrpoError(
                    f"{self.display}: cannot write in {self.resolved.parent} ({os_reason(exc)})"
                ) from None
            if not _try_lock(handle):
                handle.close()
                raise GrpoError(f"{self.display}: another grpo-cli run is writing it; try again when it ends")
            try:
                same = os.fstat(handle.fileno()).st_ino == os.stat(lock_path).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not a lock file that its last holder removed while we opened it
                self._lock = handle
                self._lock_path = lock_path
                return
            handle.close()
        raise GrpoError(f"{self.display}: another grpo-cli run is writing it; try again when it ends")

    def _release(self) -> None:
        self.discard()
        if self._lock is not None:
            with contextlib.suppress(OSError):
                self._lock_path.unlink()
            self._lock.close()
            self._lock = None

    def _remove_stale(self) -> None:
        """Temporaries of killed runs on this target; put back a directory moved aside."""
        target = self.resolved
        try:
            entries = list(target.parent.iterdir())
        except OSError:
            return
        for entry in entries:
            match = _TEMP_NAME.match(entry.name)
            if match is None or match["name"] != target.name:
                continue
            if match["kind"] == "old" and not os.path.lexists(target):
                with contextlib.suppress(OSError):
                    os.replace(entry, target)  # a killed --force run had moved it aside
                continue
            _remove(entry)


class _ScratchClaim(Claim):
    """A claim whose temporary is a private scratch file, not a file beside a local target:
    no lock file and no stale temporaries to look for there."""

    def _acquire(self) -> None:
        pass

    def _release(self) -> None:
        self.discard()

    def _remove_stale(self) -> None:
        pass


class StdoutClaim(_ScratchClaim):
    """``-o -``: the rows go to a private temporary file, copied to standard output only
    when the whole run succeeded, so that a failed run writes nothing there."""

    def __init__(self, guard: WriteGuard) -> None:
        super().__init__(guard, Path("-"), Path("-"), directory=False, what="output")

    @property
    def display(self) -> str:
        return "standard output"

    def temp_path(self) -> Path:
        if self._temp is None:
            self._temp = scratch_file("-o -")
        return self._temp

    def commit(self) -> None:
        temp = self.temp_path()
        sent = lines = total = 0
        last = b"\n"
        try:
            with open(temp, "rb") as rows:
                total = os.fstat(rows.fileno()).st_size
                for block in iter(lambda: rows.read(1 << 20), b""):
                    sys.stdout.buffer.write(block)
                    sent += len(block)
                    lines += block.count(b"\n")
                    last = block[-1:]
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise GrpoError(
                f"standard output: cannot write the rows ({os_reason(exc)}); what reached it is incomplete",
                exit_code=EXIT_WRITTEN_THEN_FAILED,
            ) from None
        except KeyboardInterrupt:
            if sent == total:
                raise  # every row was handed over: "interrupted after the output was written"
            cut = "" if last == b"\n" else " and part of the next"
            raise GrpoError(
                f"interrupted while writing the rows to standard output: its reader got {lines:,} whole "
                f"lines{cut} ({sent:,} of {total:,} bytes); what reached it is incomplete",
                exit_code=EXIT_INTERRUPTED,
            ) from None
        finally:
            self.committed = True  # from the first byte on, standard output was written
            _remove(temp)


class RemoteClaim(_ScratchClaim):
    """An output on an object store (``s3://``, ``gs://``): written to a private scratch file or
    folder, then uploaded whole when the run commits it (:func:`~grpo_cli.stores.store_output`), so that
    a failed run leaves nothing there. Checked when claimed: the bucket, the credentials,
    and what already exists (replaced only with ``force``)."""

    def __init__(self, guard: WriteGuard, uri: str, *, directory: bool, what: str, force: bool) -> None:
        from grpo_cli.stores import store_output

        super().__init__(guard, Path(redact(uri)), Path(redact(uri)), directory=directory, what=what)
        self.uri = redact(uri)
        self.force = force
        self.store = store_output(uri, directory=directory)
        self.store.check(force=force, what=what)

    @property
    def display(self) -> str:
        return self.uri

    def temp_path(self) -> Path:
        if self._temp is None:
            self._temp = scratch_dir(self.uri) if self.directory else scratch_file(self.uri)
        return self._temp

    def commit(self) -> None:
        self.transfer = self.store.publish(self.temp_path(), self.copied)
        self.committed = True
        _remove(self.temp_path())

    def discard(self) -> None:
        if self._temp is not None:
            _remove(self._temp)
        self._temp = None


class StagedRemoteClaim(RemoteClaim):
    """An object-store folder that other machines fill (a Ray cluster's workers, which cannot
    reach this machine's disk): they write its shards under a hidden staging folder beside it
    (:meth:`staging_uri`), and the commit copies them into place inside the store, so that a
    failed run leaves nothing there and ``--force`` replaces an output only once the whole new
    one is written. Checked when claimed, as :class:`RemoteClaim`."""

    def __init__(self, guard: WriteGuard, uri: str, *, what: str, force: bool) -> None:
        if check_scheme(uri) == "hf":
            raise GrpoError(
                f"{redact(uri)}: an hf:// output is one commit made from this machine, which a Ray "
                "cluster's workers cannot add to; write to s3://, gs:// or a path every node shares, "
                f"or leave out {mention('ray_address')}"
            )
        super().__init__(guard, uri, directory=True, what=what, force=force)
        assert isinstance(self.store, S3Output | GcsOutput)
        self.staged_store = self.store
        self._staged = False

    def staging_uri(self) -> str:
        self._staged = True
        return self.staged_store.staging_uri(self.token)

    def temp_path(self) -> Path:
        raise TypeError(f"{self.uri} is written on the store by other machines: use staging_uri()")

    def commit(self) -> None:
        self.transfer = self.staged_store.place_staged(self.staging_uri())
        self.committed = True

    def discard(self) -> None:
        if self._staged and not self.committed:
            self.staged_store.remove_staged(self.staging_uri())
        self._staged = False


class WriteGuard:
    """Claims every path a run writes; release with :meth:`close` (or use ``with``).

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> source = folder / "in.parquet"
    >>> _ = source.write_bytes(b"data")
    >>> with WriteGuard(ProtectedInputs.of([(source, "in.parquet")])) as guard:
    ...     guard.claim(folder, directory=True, force=True)
    Traceback (most recent call last):
    ...
    grpo_cli.errors.GrpoError: ...: the output would contain the input in.parquet; refusing to write there
    """

    def __init__(self, inputs: ProtectedInputs) -> None:
        self.inputs = inputs
        self.claims: list[Claim] = []

    def __enter__(self) -> WriteGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for claim in self.claims:
            claim._release()

    def claim(
        self,
        path: str | os.PathLike[str],
        *,
        directory: bool,
        force: bool,
        what: str = "output",
        written_elsewhere: bool = False,
    ) -> Claim:
        """Check ``path`` and lock it for this run, before any work is done.

        ``directory``: a folder of Parquet shards rather than one file. ``what`` names
        the option in messages (``output``, ``summary``). ``written_elsewhere``: other
        machines write the folder's shards (a Ray cluster's workers); on an object store they
        write them to a staging folder there (:class:`StagedRemoteClaim`).
        """
        if is_uri(os.fspath(path)):
            uri = os.fspath(path)
            if check_scheme(uri) == "file":
                path = local_path(uri)
            else:
                return self._claim_remote(
                    uri, directory=directory, force=force, what=what, staged=written_elsewhere
                )
        shown = Path(path)
        if shown.name in ("", ".", "..") or os.fspath(path) == "-":
            raise GrpoError(f"{path}: not a usable {what} path")
        resolved = resolve(path)
        parent = resolved.parent
        if not parent.is_dir():
            raise GrpoError(f"{path}: the folder {shown.parent} does not exist")
        if not os.access(parent, os.W_OK):
            raise GrpoError(f"{path}: cannot write in {shown.parent} (permission denied)")
        reason = self.inputs.conflict(resolved) or self._clash(resolved)
        if reason is not None:
            raise GrpoError(f"{path}: the {what} would {reason}; refusing to write there")
        claim = Claim(self, shown, resolved, directory=directory, what=what)
        claim.force = force
        claim._acquire()
        self.claims.append(claim)
        claim._remove_stale()
        self._check_existing(claim, force=force, what=what)
        return claim

    def _claim_remote(self, uri: str, *, directory: bool, force: bool, what: str, staged: bool) -> Claim:
        scheme = check_scheme(uri)
        if scheme not in WRITABLE_SCHEMES:
            raise GrpoError(
                f"{redact(uri)}: grpo-cli writes to s3://, gs://, hf:// and local paths; write the {what} "
                f"to a local path and upload it with the store's own tool"
            )
        reason = self.inputs.remote_conflict(uri) or self._clash(Path(redact(uri)))
        if reason is not None:
            raise GrpoError(f"{redact(uri)}: the {what} would {reason}; refusing to write there")
        claim = (
            StagedRemoteClaim(self, uri, what=what, force=force)
            if staged and directory
            else RemoteClaim(self, uri, directory=directory, what=what, force=force)
        )
        self.claims.append(claim)
        return claim

    def claim_run(
        self,
        output: str | os.PathLike[str] | None,
        summary_json: str | os.PathLike[str] | None,
        *,
        directory: bool,
        force: bool,
        report: str | os.PathLike[str] | None = None,
        written_elsewhere: bool = False,
    ) -> tuple[Claim | None, Claim | None, Claim | None]:
        """Claim a run's data output, summary file and HTML report (each may be ``None``), in
        that order.

        An output of ``-`` is standard output (JSON lines). ``written_elsewhere``: as
        :meth:`claim`'s, for the data output.
        """
        claim: Claim | None = None
        if output is not None and os.fspath(output) == "-":
            claim = StdoutClaim(self)
            self.claims.append(claim)
        elif output is not None:
            claim = self.claim(output, directory=directory, force=force, written_elsewhere=written_elsewhere)
        summary = (
            self.claim(summary_json, directory=False, force=force, what="summary")
            if summary_json is not None
            else None
        )
        page = self.claim(report, directory=False, force=force, what="report") if report is not None else None
        return claim, summary, page

    def check_temporary(self, temp: Path) -> None:
        """A temporary must never be an input (or lie inside an input directory)."""
        reason = self.inputs.conflict(temp)
        if reason is not None:
            raise GrpoError(f"{temp}: a temporary file would {reason}; refusing to write there")

    def _clash(self, resolved: Path) -> str | None:
        for other in self.claims:
            if resolved == other.resolved:
                return f"overwrite the {other.what} {other.display} of the same run"
            if is_within(resolved, other.resolved) or is_within(other.resolved, resolved):
                return f"overlap the {other.what} {other.display} of the same run"
        return None

    @staticmethod
    def _check_existing(claim: Claim, *, force: bool, what: str) -> None:
        target, shown = claim.resolved, claim.display
        if not os.path.lexists(target):
            return
        flag = mention("force")
        if claim.directory:
            if not target.is_dir():
                raise GrpoError(
                    f"{shown}: exists and is not a directory (name a .parquet file for one output file)"
                )
            entries = sorted(target.iterdir())
            if not entries:
                return
            foreign = [e for e in entries if not is_grpo_cli_shard(e)]
            if foreign:
                names = ", ".join(e.name for e in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
                raise GrpoError(
                    f"{shown}: the directory holds files grpo-cli did not write ({names}); "
                    f"{flag} replaces only grpo-cli's own shards: empty it or choose another directory"
                )
            if not force:
                raise GrpoError(f"{shown}: the directory exists and is not empty; pass {flag} to replace it")
            return
        if target.is_dir():
            raise GrpoError(f"{shown}: is a directory")
        if not target.is_file():
            raise GrpoError(f"{shown}: exists and is not a regular file")
        if not force:
            raise GrpoError(f"{shown}: already exists; pass {flag} to overwrite it")


def is_grpo_cli_shard(path: Path) -> bool:
    """A regular ``.parquet`` file whose footer carries grpo-cli's provenance entry."""
    if path.is_symlink() or not path.is_file() or not path.name.lower().endswith(PARQUET_SUFFIXES):
        return False
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_metadata(path).metadata or {}
    except Exception:  # not Parquet at all: not ours
        return False
    return PROVENANCE_KEY in metadata


def fsync_path(path: Path, *, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory
    finally:
        os.close(fd)


def write_text(claim: Claim, text: str | bytes, what: str = "the summary") -> None:
    """Write a small file (the summary JSON; the report, a page or a picture) through its
    claim, atomically."""
    temp = claim.temp_path()
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        claim.discard()
        raise GrpoError(f"{claim.display}: cannot write {what} ({os_reason(exc)})") from None
    claim.commit()


@contextlib.contextmanager
def reported_after_commit(claim: Claim | None) -> Iterator[None]:
    """Errors and interrupts after the output was moved into place say that it was.

    A summary that cannot be written then exits 3, an interrupt 130; neither claims
    that nothing was written.
    """
    try:
        yield
    except GrpoError as exc:
        if claim is not None and claim.committed and exc.exit_code == EXIT_USAGE:
            raise GrpoError(
                f"{exc.template}; the output {claim.display} was written", exit_code=EXIT_WRITTEN_THEN_FAILED
            ) from None
        raise
    except KeyboardInterrupt:
        if claim is not None and claim.committed:
            raise GrpoError(
                f"interrupted after the output {claim.display} was written", exit_code=EXIT_INTERRUPTED
            ) from None
        raise


# --------------------------------------------------------------------------- helpers


def _try_lock(handle: IO[bytes]) -> bool:
    if sys.platform == "win32":  # pragma: no cover - no flock; msvcrt locks a byte range
        import msvcrt

        try:
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()
