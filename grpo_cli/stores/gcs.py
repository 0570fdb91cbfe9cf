"""``gs://`` (and ``hf://`` reads) through fsspec: listing, downloads, and outputs staged beside
their objects and moved into place whole."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from grpo_cli.errors import GrpoError, first_line
from grpo_cli.stores.base import (
    COPY_CHUNK,
    PART_BYTES,
    CopiedPrefix,
    RemoteFile,
    _folder_files,
    _hidden,
    check_scheme,
    place_staged,
    redact,
    refuse_to_replace,
    split_uri,
)


def _fsspec(uri: str) -> tuple[Any, str]:
    """The fsspec file system of a ``gs://`` or ``hf://`` URI and the path on it."""
    scheme, rest = split_uri(uri) or ("", "")
    if scheme == "hf":
        try:
            from huggingface_hub import HfFileSystem
        except ImportError:
            raise GrpoError("hf:// needs huggingface_hub: pip install 'grpo-cli[hf]'") from None
        # its retries log a line each on the terminal: what goes wrong is said once, in grpo-cli's line
        logging.getLogger("huggingface_hub").setLevel(logging.CRITICAL)
        # a file system of its own: fsspec would share one, whose listings are never read again
        return HfFileSystem(skip_instance_cache=True), rest
    return gcs_filesystem(), rest


def gcs_filesystem() -> Any:
    """gcsfs's file system, configured as gcsfs configures it (``GOOGLE_APPLICATION_CREDENTIALS``,
    gcloud's credentials, the metadata server, else anonymous; ``STORAGE_EMULATOR_HOST`` for
    another endpoint), one per configuration.

    It is ``gcsfs.core``'s class: the package's default one first asks the storage-control API
    for the bucket's layout, which without a project's credentials logs a warning on the
    terminal at every call, and reading and writing objects needs none of it. gcsfs's own log
    lines are silenced: what goes wrong is said once, in grpo-cli's one line.
    """
    return _gcs_filesystem(tuple(os.environ.get(name) for name in _GCS_SETTINGS))


_GCS_SETTINGS = ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT")


@functools.lru_cache(maxsize=8)
def _gcs_filesystem(settings: tuple[str | None, ...]) -> Any:
    try:
        from gcsfs.core import GCSFileSystem
    except ImportError:
        raise GrpoError("gs:// needs gcsfs: pip install 'grpo-cli[gcs]'") from None
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
    return GCSFileSystem(skip_instance_cache=True, use_listings_cache=False)


def _not_found(uri: str, missing: FileNotFoundError, absent: str = "no such file or folder") -> GrpoError:
    """What a file system's "not found" means: ``absent``, or a refusal. huggingface_hub's raises
    it for a repo the Hub refused too: a gated repo (its conditions not accepted), and, without a
    token, any repo it does not show (HTTP 401: a private repo, or none by that name)."""
    cause = missing.__cause__
    status = getattr(getattr(cause, "response", None), "status_code", None)
    where = redact(uri)
    if type(cause).__name__ == "GatedRepoError":
        return GrpoError(
            f"{where}: a gated repo, and the Hub refused access (HTTP {status}): accept its "
            "conditions on the Hub and set HF_TOKEN to a token of that account"
        )
    if status in (401, 403):
        from huggingface_hub import get_token  # HF_TOKEN, else the token `hf auth login` saved

        token = "to the token at hand" if get_token() else "without a token (HF_TOKEN)"
        return GrpoError(
            f"{where}: the Hub shows no such repo {token} (HTTP {status}): check its name, "
            "or set HF_TOKEN to a token that can read it"
        )
    return GrpoError(f"{where}: {absent}")


def _fsspec_list(uri: str) -> list[RemoteFile]:
    fs, path = _fsspec(uri)
    scheme = check_scheme(uri)
    try:
        info = fs.info(path)
        if info.get("type") != "directory":
            return [RemoteFile(uri, int(info.get("size") or 0))]
        entries = fs.ls(path, detail=True)
    except FileNotFoundError as missing:
        raise _not_found(uri, missing) from None
    except Exception as exc:  # each library raises its own; all end here in one line
        raise GrpoError(f"{redact(uri)}: cannot list it ({first_line(exc)})") from None
    root = path.rstrip("/") + "/"
    found, folders = [], []
    for entry in entries:
        relative = str(entry["name"])[len(root) :]
        if _hidden(relative):
            continue
        if entry.get("type") == "directory":
            folders.append(relative)
        else:
            found.append(RemoteFile(f"{scheme}://{entry['name']}", int(entry.get("size") or 0)))
    return _folder_files(uri, found, folders)


def _fsspec_download(file: RemoteFile, target: IO[bytes]) -> None:
    fs, path = _fsspec(file.uri)
    try:
        with fs.open(path, "rb") as source:
            shutil.copyfileobj(source, target, COPY_CHUNK)
    except Exception as exc:
        raise GrpoError(f"{redact(file.uri)}: cannot read it ({first_line(exc)})") from None


class GcsOutput:
    """A ``gs://`` output: a file (one object) or a folder (one object per shard), through gcsfs.

    :meth:`check` runs when the output is claimed, before any work, as :class:`S3Output`'s.
    :meth:`publish` streams each finished local file into a resumable upload, a few MiB at a
    time, under a hidden staging name beside the output, and finalises it only once the whole
    file is there (an upload never finalised is no object; GCS drops it after a week). Once
    every file is up, each is copied into place inside the store (a rewrite: no byte leaves
    GCS) and its staged object removed. A failure or an interrupt before then removes the staged
    objects and leaves what was there as it was, so ``--force`` replaces an output only once
    the whole new one is up. GCS copies no byte range server-side (its ``compose`` joins whole
    objects), so a spliced output is uploaded whole.
    """

    def __init__(self, uri: str, *, directory: bool) -> None:
        self.uri = redact(uri)
        self.directory = directory
        rest = self.uri.split("://", 1)[1]
        self.bucket, _, key = rest.partition("/")
        if not self.bucket or not key or (key.endswith("/") and not directory):
            raise GrpoError(f"{self.uri}: name the object to write (gs://bucket/path/out.parquet)")
        self.path = f"{self.bucket}/{key.rstrip('/')}"
        self.fs = gcs_filesystem()

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except GrpoError:
            raise
        except FileNotFoundError as missing:
            if not self._bucket_exists():
                raise GrpoError(f"{self.uri}: the bucket {self.bucket!r} does not exist") from None
            raise GrpoError(f"{self.uri}: cannot {doing} (not found: {first_line(missing)})") from None
        except Exception as exc:  # gcsfs raises OSError, HttpError, ValueError, aiohttp's errors
            text = first_line(exc)
            # gcsfs raises a 403 as OSError("Forbidden: ...") and a 401 as HttpError(code=401);
            # digits in a message (a port, an object's name) say nothing
            if text.startswith("Forbidden") or getattr(exc, "code", None) in (401, 403):
                raise GrpoError(f"{self.uri}: access denied when trying to {doing} ({text})") from None
            raise GrpoError(f"{self.uri}: cannot {doing} ({text})") from None

    def _bucket_exists(self) -> bool:
        """Whether the bucket is there (a not-found error names an object or the bucket);
        ``True`` where the store cannot say, so that the error names what was not found."""
        try:
            self.fs.info(self.bucket)
        except FileNotFoundError:
            return False
        except Exception:  # the first error is the one to report
            return True
        return True

    def check(self, *, force: bool, what: str) -> None:
        """Refuse, before any work, an output that cannot be written or would replace data
        (the staged objects a killed run left in a folder are its own: replaced, never refused)."""
        with self._errors(f"write the {what} there"):
            self.fs.info(self.bucket)  # a missing bucket: FileNotFoundError
            existing = [path for path in self._existing() if not _GCS_STAGED.search(path)]
        refuse_to_replace(self.uri, existing, directory=self.directory, force=force)

    def _existing(self) -> list[str]:
        self.fs.invalidate_cache()
        if not self.directory:
            return [self.path] if self.fs.isfile(self.path) else []
        return sorted(self.fs.find(self.path + "/"))

    def publish(
        self,
        local: Path,
        copied: dict[str, CopiedPrefix],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """Upload ``local`` (the run's finished file, or folder of shards) as the output: every
        file staged whole, then each copied into place; any error or interrupt before that
        removes what was staged. ``copied`` is unused: GCS uploads every byte. Returns the bytes
        uploaded."""
        files = sorted(local.iterdir()) if self.directory else [local]
        token = uuid.uuid4().hex[:12]
        staged: list[tuple[str, str]] = []  # (staging path, final path), each finalised whole
        placed: list[str] = []  # final paths this run has copied into place
        uploaded = 0
        try:
            with self._errors("upload the output"):
                for file in files:
                    final = f"{self.path}/{file.name}" if self.directory else self.path
                    staging = self._staging(final, token)
                    uploaded += self._upload(file, staging, progress)
                    staged.append((staging, final))
                for staging, final in staged:  # every file is up: into place, inside the store
                    self.fs.copy(staging, final)
                    placed.append(final)
                if self.directory:
                    keep = set(placed) | {staging for staging, _ in staged}
                    stale = [path for path in self._existing() if path not in keep]
                    if stale:
                        self.fs.rm(stale)
        except BaseException:
            # what this run placed is removed (what it replaced is gone either way); what it
            # only staged never touched the output
            for path in [*placed, *(staging for staging, _ in staged)]:
                with contextlib.suppress(Exception):
                    self.fs.rm_file(path)
            raise
        for staging, _ in staged:  # hidden names: a leftover would be skipped by every reader
            with contextlib.suppress(Exception):
                self.fs.rm_file(staging)
        return {
            "uri": self.uri,
            "objects": len(files),
            "bytes_uploaded": uploaded,
            "bytes_copied_in_store": 0,
        }

    def staging_uri(self, token: str) -> str:
        """A hidden folder beside the output for a run whose shards other machines write (a
        Ray cluster's workers): :meth:`place_staged` moves them into place."""
        parent, _, name = self.path.rpartition("/")
        return f"gs://{parent}/.{name}.{token}.tmp/"

    def place_staged(self, staging: str) -> dict[str, Any]:
        """Copy every object under ``staging`` (:meth:`staging_uri`) into the output folder,
        inside the store, then remove the replaced folder's other shards and the staging
        folder: :func:`place_staged`."""
        return place_staged(self, staging)

    def _staged(self, staging: str) -> list[tuple[str, str, int]]:
        """Each object under ``staging``: its path, its name there, its size."""
        prefix = _gcs_folder(staging)
        self.fs.invalidate_cache()
        found = self.fs.find(prefix, detail=True).items()
        return sorted(
            (path, path[len(prefix) + 1 :], int(info["size"]))
            for path, info in found
            if not path.endswith("/")
        )

    def _final(self, name: str) -> str:
        return f"{self.path}/{name}"

    def _copy_in_store(self, source: str, target: str, size: int) -> None:
        self.fs.copy(source, target)

    def _remove_object(self, path: str) -> None:
        self.fs.rm_file(path)

    def _remove_stale(self, written: set[str]) -> None:
        """A replaced folder's shards that this run did not write (``--force``)."""
        stale = [path for path in self._existing() if path not in written]
        if stale:
            self.fs.rm(stale)

    def remove_staged(self, staging: str) -> None:
        """Remove what a run staged (best effort: the run's own error is the one to report)."""
        prefix = _gcs_folder(staging)
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache()
            found = self.fs.find(prefix)
            if found:
                self.fs.rm(found)

    def _staging(self, final: str, token: str) -> str:
        """A hidden name beside ``final`` for this run's upload of it (:data:`_GCS_STAGED`)."""
        parent, _, name = final.rpartition("/")
        return f"{parent}/.{name}.{token}.tmp"

    def _upload(self, file: Path, target: str, progress: Callable[[int], None] | None) -> int:
        # autocommit=False: closing or collecting the handle never finalises a partial upload;
        # only commit() does, once every byte is sent.
        handle = self.fs.open(target, "wb", autocommit=False, block_size=PART_BYTES)
        sent = 0
        try:
            with open(file, "rb") as source:
                for chunk in iter(lambda: source.read(COPY_CHUNK), b""):
                    handle.write(chunk)
                    sent += len(chunk)
                    if progress is not None:
                        progress(len(chunk))
            handle.flush(force=True)
            handle.commit()
        finally:
            handle.close()
        return sent


def _gcs_folder(uri: str) -> str:
    """A ``gs://`` folder as gcsfs names it: ``bucket/path``, no trailing slash."""
    return uri.split("://", 1)[1].rstrip("/")


_GCS_STAGED = re.compile(r"/\.[^/]+\.[0-9a-f]{12}\.tmp$")
"""A staged object's name (:meth:`GcsOutput._staging`)."""
