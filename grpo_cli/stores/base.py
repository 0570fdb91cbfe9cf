"""What every store shares: URIs and their schemes, credentials kept out of messages, a remote
file, timeouts and part sizes, an output that will not replace what it was not told to, and
shards staged by other machines placed into the output."""

from __future__ import annotations

import contextlib
import posixpath
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any, Protocol

from grpo_cli.errors import GrpoError, mention
from grpo_cli.file_names import OTHER_DATA_SUFFIXES, PARQUET_SUFFIXES, READ_SUFFIXES

SCHEMES = ("s3", "gs", "gcs", "hf", "file")
"""The URI schemes grpo-cli reads; ``gcs`` is another name for ``gs``."""


WRITABLE_SCHEMES = ("s3", "gs", "gcs", "hf", "file")


_URI = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$")


CONNECT_TIMEOUT_SECONDS = 10


READ_TIMEOUT_SECONDS = 60  # a server that stops answering fails the run after MAX_ATTEMPTS of this


MAX_ATTEMPTS = 5


MIN_PART_BYTES = 5 << 20  # S3: every part of a multipart upload but the last


PART_BYTES = 64 << 20  # what grpo-cli uploads or copies per part


MAX_COPY_PART_BYTES = 5 << 30  # S3: the largest range one UploadPartCopy copies


COPY_CHUNK = 8 << 20


def split_uri(spec: str) -> tuple[str, str] | None:
    """``(scheme, rest)`` of an object-store URI, ``None`` for a local path."""
    match = _URI.match(spec)
    if match is None:
        return None
    return match["scheme"].lower(), match["rest"]


def is_uri(spec: str) -> bool:
    """Whether ``spec`` names a file on a store (or a ``file://`` URI) rather than a local path."""
    return split_uri(spec) is not None


def redact(uri: str) -> str:
    """``uri`` without any credentials in it (``scheme://user:secret@host/...``)."""
    parts = split_uri(uri)
    if parts is None:
        return uri
    scheme, rest = parts
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = authority.rsplit("@", 1)[1]
    return f"{scheme}://{authority}{slash}{path}"


def local_path(uri: str) -> str:
    """The local path a ``file://`` URI names.

    >>> local_path("file:///data/run/step-1.parquet"), local_path("file://localhost/x.jsonl")
    ('/data/run/step-1.parquet', '/x.jsonl')
    """
    parsed = urllib.parse.urlparse(uri)
    if parsed.netloc not in ("", "localhost"):
        raise GrpoError(f"{uri}: a file:// URI names a file on this machine (file:///path)")
    return urllib.parse.unquote(parsed.path)


def check_scheme(uri: str) -> str:
    """The URI's scheme, refused in one line when grpo-cli reads no such store."""
    parts = split_uri(uri)
    assert parts is not None
    scheme = parts[0]
    if scheme not in SCHEMES:
        raise GrpoError(
            f"{redact(uri)}: grpo-cli reads {', '.join(s + '://' for s in SCHEMES)} URIs, not {scheme}://"
        )
    return scheme


@dataclass(frozen=True)
class RemoteFile:
    """One file on a store: its URI and size."""

    uri: str
    size: int

    @property
    def name(self) -> str:
        return self.uri.rstrip("/").rsplit("/", 1)[-1]


def _hidden(relative: str) -> bool:
    """A path below the folder with a part starting with ``.`` or ``_`` (Spark's and Ray's own files)."""
    return any(part.startswith((".", "_")) for part in relative.split("/") if part)


def _folder_files(uri: str, found: list[RemoteFile], folders: list[str]) -> list[RemoteFile]:
    """A folder's files of formats grpo-cli reads, in name order, as a local folder is read."""
    if folders:
        names = ", ".join(sorted(folders)[:3]) + (", ..." if len(folders) > 3 else "")
        raise GrpoError(
            f"{redact(uri)}: holds subfolders ({names}); grpo-cli reads the files of one folder: "
            "name the subfolder to read"
        )
    readable = []
    for file in sorted(found, key=lambda f: f.uri):
        lowered = file.name.lower()
        if lowered.endswith(READ_SUFFIXES):
            readable.append(file)
        elif lowered.endswith(OTHER_DATA_SUFFIXES):
            raise GrpoError(
                f"{redact(uri)}: the folder holds {file.name}, a format grpo-cli does not read; move it out"
            )
    if not readable:
        raise GrpoError(f"{redact(uri)}: the folder holds no file of a format grpo-cli reads")
    return readable


def same_or_within(a: str, b: str) -> bool:
    """Whether URI ``a`` is ``b`` or lies inside the folder ``b``: credentials ignored, and each
    place however it is spelled (:func:`place_of`).

    >>> same_or_within("hf://datasets/me/run@main/./data/x.parquet", "hf://datasets/me/run/data/")
    True
    >>> same_or_within("gcs://bucket/run/x.parquet", "gs://bucket/run"), same_or_within("s3://b/x2", "s3://b/x")
    (True, False)
    """
    a, b = place_of(a), place_of(b)
    return a == b or a.startswith(b + "/")


def place_of(uri: str) -> str:
    """One spelling of the place ``uri`` names: ``gcs://`` as ``gs://``; a Hub path with its repo
    type, its repo in lower case (the Hub may take a name in another case: two spellings are one
    place rather than risk an input), its revision (``main`` where none is named, ``refs/heads/``
    dropped) and its path without ``.`` segments; no trailing slash."""
    scheme, rest = split_uri(redact(uri)) or ("", uri)
    if scheme == "gcs":
        scheme = "gs"
    if scheme == "hf":
        try:
            from huggingface_hub import parse_hf_uri

            parsed = parse_hf_uri(f"hf://{rest}")
        except Exception:  # not a Hub path: compared as written (reading it fails in its own line)
            return f"hf://{rest}".rstrip("/")
        revision = parsed.revision or "main"
        revision = revision.removeprefix("refs/heads/")
        path = posixpath.normpath(parsed.path_in_repo or ".").lstrip("/")
        path = "" if path == "." else path
        where = f"{parsed.type}/{parsed.id.lower()}@{urllib.parse.quote(revision, safe='')}"
        return f"hf://{where}/{path}".rstrip("/")
    return f"{scheme}://{rest}".rstrip("/") if scheme else uri.rstrip("/")


def refuse_to_replace(uri: str, existing: list[str], *, directory: bool, force: bool) -> None:
    """Refuse an output whose place holds ``existing`` objects (their names), unless ``force``;
    a folder output replaces only a folder of Parquet shards, even with ``force``."""
    if existing and not force:
        shown = "holds objects" if directory else "exists"
        raise GrpoError(f"{uri}: {shown}; pass {mention('force')} to replace it")
    if directory:
        others = [name for name in existing if not name.lower().endswith(PARQUET_SUFFIXES)]
        if others:
            raise GrpoError(
                f"{uri}: holds {others[0].rsplit('/', 1)[-1]}, which is not a Parquet shard; "
                f"grpo-cli replaces only a folder of Parquet shards (even with {mention('force')})"
            )


@dataclass(frozen=True)
class CopiedPrefix:
    """The first ``length`` bytes of an output file are those of the S3 object ``source``
    (a spliced output's copied column chunks)."""

    source: str
    length: int


class StagingOutput(Protocol):
    """An output on a store that other machines' shards are staged beside (S3, GCS)."""

    uri: str

    def _errors(self, doing: str) -> contextlib.AbstractContextManager[None]: ...
    def _staged(self, staging: str) -> list[tuple[str, str, int]]: ...
    def _final(self, name: str) -> str: ...
    def _copy_in_store(self, source: str, target: str, size: int) -> None: ...
    def _remove_stale(self, written: set[str]) -> None: ...
    def _remove_object(self, key: str) -> None: ...
    def remove_staged(self, staging: str) -> None: ...


def place_staged(output: StagingOutput, staging: str) -> dict[str, Any]:
    """Copy the shards other machines (a Ray cluster's workers) wrote under ``staging``, a
    hidden folder beside the folder ``output``, into it inside the store, then remove the
    folder's shards that this run did not write and the staging folder. An error or interrupt
    before the end removes what this run placed and what it staged, and leaves what was there
    as it was. Returns the objects and their bytes (uploaded by the machines that wrote them)."""
    placed: list[str] = []
    try:
        with output._errors("move the output into place"):
            staged = output._staged(staging)
            for source, name, size in staged:
                final = output._final(name)
                output._copy_in_store(source, final, size)
                placed.append(final)
            output._remove_stale(set(placed))
    except BaseException:
        for final in placed:
            with contextlib.suppress(Exception):
                output._remove_object(final)
        output.remove_staged(staging)
        raise
    output.remove_staged(staging)
    return {
        "uri": output.uri,
        "objects": len(staged),
        "bytes_uploaded": sum(size for _, _, size in staged),
        "bytes_copied_in_store": 0,
        "uploaded_by": "workers",
    }
