"""Object storage: ``s3://``, ``gs://``, ``hf://`` and ``file://`` URIs wherever a path is taken.

Inputs on a store are listed there (a file, or a folder's files in name order, as a local
folder is read) and streamed to private scratch files that the engine reads as local ones;
their messages and the output's provenance name the URI. ``s3://`` goes through boto3, which
takes credentials and endpoints as AWS tools do (the environment, ``AWS_ENDPOINT_URL``,
``AWS_PROFILE``, an instance role); ``gs://`` through gcsfs and ``hf://`` (a dataset repo's
files) through huggingface_hub's file system, each an optional extra. ``file://`` is a local path.

Outputs on a Hub repo are one commit each (:class:`HfOutput`). Outputs on S3 are written by
:class:`S3Output` as multipart uploads that are completed only when every object of the run is
whole, and aborted on every error and interrupt: an object
appears complete or not at all. A spliced output whose input is an S3 object is made without
moving the input's bytes: its unchanged column chunks are copied server-side
(``UploadPartCopy`` with byte ranges) and only the new column chunks and the footer are
uploaded. Credentials are never printed, nor written into provenance (:func:`redact`).

>>> split_uri("s3://bucket/run/step-1.parquet"), split_uri("rollouts.parquet")
(('s3', 'bucket/run/step-1.parquet'), None)
>>> redact("s3://AKIA:secret@bucket/x.parquet")
's3://bucket/x.parquet'
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import posixpath
import re
import shutil
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from grpo_cli.errors import GrpoError, first_line
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


# --------------------------------------------------------------------------- S3 (boto3)


def _import_boto3() -> Any:
    try:
        import boto3
    except ImportError:
        raise GrpoError("s3:// needs boto3: pip install 'grpo-cli[s3]'") from None
    return boto3


def s3_client() -> Any:
    """A boto3 S3 client as AWS tools configure it (environment, ``AWS_ENDPOINT_URL``,
    profiles, instance roles), with bounded timeouts and retries; one per configuration
    (boto3's clients are thread-safe, and making one costs tens of milliseconds)."""
    return _s3_client(tuple(os.environ.get(name) for name in _AWS_SETTINGS))


_AWS_SETTINGS = tuple(
    f"AWS_{name}"
    for name in (
        "ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "SESSION_TOKEN", "PROFILE", "DEFAULT_REGION", "REGION",
        "ENDPOINT_URL", "ENDPOINT_URL_S3", "CONFIG_FILE", "SHARED_CREDENTIALS_FILE", "EC2_METADATA_DISABLED",
    )
)  # fmt: skip


@functools.lru_cache(maxsize=8)
def _s3_client(settings: tuple[str | None, ...]) -> Any:
    boto3 = _import_boto3()
    from botocore.config import Config

    config = Config(
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        read_timeout=READ_TIMEOUT_SECONDS,
        retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
        s3={"addressing_style": "auto"},
    )
    return boto3.session.Session().client("s3", config=config)


def bucket_and_key(uri: str) -> tuple[str, str]:
    """The bucket and key of an ``s3://`` URI (credentials in it dropped)."""
    rest = redact(uri).split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise GrpoError(f"{redact(uri)}: an s3:// URI names a bucket (s3://bucket/path)")
    return bucket, key


def s3_error(uri: str, exc: BaseException, doing: str) -> GrpoError:
    """One line for what went wrong talking to S3, naming the URI and never a credential."""
    from botocore import exceptions as bx

    where = redact(uri)
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return GrpoError(
            f"{where}: no AWS credentials to {doing} (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE)"
        )
    if isinstance(exc, bx.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":
            return GrpoError(f"{where}: the bucket {bucket_and_key(uri)[0]!r} does not exist")
        if code in ("AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return GrpoError(f"{where}: access denied ({code}, HTTP {status}) when trying to {doing}")
        if code in ("NoSuchKey", "404", "NotFound"):
            return GrpoError(f"{where}: no such object")
        message = (str(error.get("Message") or code or exc).strip().splitlines() or ["no message"])[0]
        return GrpoError(f"{where}: cannot {doing} ({code or 'error'}, HTTP {status}: {message})")
    if isinstance(exc, bx.EndpointConnectionError | bx.ConnectTimeoutError | bx.ReadTimeoutError):
        return GrpoError(f"{where}: cannot {doing}: the S3 endpoint does not answer ({first_line(exc)})")
    if isinstance(exc, bx.BotoCoreError | OSError):
        return GrpoError(f"{where}: cannot {doing} ({first_line(exc)})")
    raise exc


def _code(exc: BaseException) -> str | None:
    """The error code of a boto3 ``ClientError`` (``None`` for anything else)."""
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code")) if isinstance(response, dict) else None


@contextlib.contextmanager
def _s3_errors(uri: str, doing: str) -> Iterator[None]:
    from botocore import exceptions as bx

    try:
        yield
    except (bx.BotoCoreError, bx.ClientError, OSError) as exc:
        raise s3_error(uri, exc, doing) from None


def _s3_size(client: Any, bucket: str, key: str) -> int | None:
    """The object's size, or ``None`` where there is no such object (a folder has none)."""
    if not key or key.endswith("/"):
        return None
    try:
        return int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
    except Exception as exc:
        if _code(exc) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def _s3_list(uri: str) -> list[RemoteFile]:
    client = s3_client()
    bucket, key = bucket_and_key(uri)
    with _s3_errors(uri, "list it"):
        size = _s3_size(client, bucket, key)
        if size is not None:
            return [RemoteFile(f"s3://{bucket}/{key}", size)]
        prefix = key if not key or key.endswith("/") else key + "/"
        found: list[RemoteFile] = []
        folders: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, Delimiter="/"
        ):
            for entry in page.get("Contents", []):
                relative = entry["Key"][len(prefix) :]
                if relative and not _hidden(relative):
                    found.append(RemoteFile(f"s3://{bucket}/{entry['Key']}", int(entry["Size"])))
            for common in page.get("CommonPrefixes", []):
                relative = common["Prefix"][len(prefix) :]
                if not _hidden(relative):
                    folders.append(relative.rstrip("/"))
    if not found and not folders:
        raise GrpoError(f"{redact(uri)}: no such file or folder")
    return _folder_files(uri, found, folders)


def _s3_download(file: RemoteFile, target: IO[bytes]) -> None:
    client = s3_client()
    bucket, key = bucket_and_key(file.uri)
    with _s3_errors(file.uri, "read it"):
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        try:
            for chunk in iter(lambda: body.read(COPY_CHUNK), b""):
                target.write(chunk)
        finally:
            body.close()


# --------------------------------------------------------------------------- gs://, hf:// (fsspec)


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


# --------------------------------------------------------------------------- listing and staging


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


def list_files(uri: str) -> list[RemoteFile]:
    """The files an INPUT URI names: the object, or the folder's readable files in name order."""
    scheme = check_scheme(uri)
    if scheme == "s3":
        return _s3_list(uri)
    return _fsspec_list(uri)


def download(file: RemoteFile, target: IO[bytes]) -> None:
    """Stream ``file``'s bytes into ``target`` (a few MiB at a time, whatever its size)."""
    if check_scheme(file.uri) == "s3":
        _s3_download(file, target)
    else:
        _fsspec_download(file, target)


def walk(uri: str) -> tuple[bool, list[tuple[str, RemoteFile]]]:
    """Whether ``uri`` is a folder, and every file below it (hidden ones too: a trainer's dump
    is read as its writer laid it out), each with its path relative to ``uri``."""
    scheme = check_scheme(uri)
    if scheme == "s3":
        client = s3_client()
        bucket, key = bucket_and_key(uri)
        with _s3_errors(uri, "list it"):
            size = _s3_size(client, bucket, key)
            if size is not None:
                file = RemoteFile(f"s3://{bucket}/{key}", size)
                return False, [(file.name, file)]
            prefix = key if not key or key.endswith("/") else key + "/"
            found = [
                (entry["Key"][len(prefix) :], RemoteFile(f"s3://{bucket}/{entry['Key']}", int(entry["Size"])))
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                for entry in page.get("Contents", [])
                if not entry["Key"].endswith("/")
            ]
    else:
        fs, path = _fsspec(uri)
        try:
            info = fs.info(path)
            if info.get("type") != "directory":
                file = RemoteFile(uri, int(info.get("size") or 0))
                return False, [(file.name, file)]
            root = path.rstrip("/") + "/"
            found = [
                (name[len(root) :], RemoteFile(f"{scheme}://{name}", int(entry.get("size") or 0)))
                for name, entry in fs.find(path, detail=True).items()
            ]
        except FileNotFoundError as missing:
            raise _not_found(uri, missing) from None
        except Exception as exc:
            raise GrpoError(f"{redact(uri)}: cannot list it ({first_line(exc)})") from None
    if not found:
        raise GrpoError(f"{redact(uri)}: no such file or folder")
    return True, sorted(found)


@contextlib.contextmanager
def staged_tree(uri: str) -> Iterator[Path]:
    """``uri`` (a file, or a folder with everything below it) streamed to a private scratch
    folder, laid out as on the store; the local file or folder, removed on every exit path."""
    from grpo_cli.scratch import scratch_dir

    is_folder, files = walk(uri)
    root = scratch_dir(redact(uri))
    try:
        for relative, file in files:
            target = root.joinpath(*[part for part in relative.split("/") if part not in ("", ".", "..")])
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as out:
                download(file, out)
        yield root if is_folder else root / files[0][0]
    finally:
        shutil.rmtree(root, ignore_errors=True)


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


# --------------------------------------------------------------------------- S3 output


def refuse_to_replace(uri: str, existing: list[str], *, directory: bool, force: bool) -> None:
    """Refuse an output whose place holds ``existing`` objects (their names), unless ``force``;
    a folder output replaces only a folder of Parquet shards, even with ``force``."""
    if existing and not force:
        shown = "holds objects" if directory else "exists"
        raise GrpoError(f"{uri}: {shown}; pass --force to replace it")
    if directory:
        others = [name for name in existing if not name.lower().endswith(PARQUET_SUFFIXES)]
        if others:
            raise GrpoError(
                f"{uri}: holds {others[0].rsplit('/', 1)[-1]}, which is not a Parquet shard; "
                "grpo-cli replaces only a folder of Parquet shards (even with --force)"
            )


@dataclass(frozen=True)
class CopiedPrefix:
    """The first ``length`` bytes of an output file are those of the S3 object ``source``
    (a spliced output's copied column chunks)."""

    source: str
    length: int


@dataclass
class _Upload:
    key: str
    upload_id: str
    parts: list[dict[str, Any]]


class S3Output:
    """An ``s3://`` output: a file (one object) or a folder (one object per shard).

    :meth:`check` runs when the output is claimed, before any work: the bucket must exist
    and be reachable with the credentials at hand, and what is there is replaced only with
    ``force``. :meth:`publish` uploads the finished local files, all or none.
    """

    def __init__(self, uri: str, *, directory: bool) -> None:
        self.uri = redact(uri)
        self.directory = directory
        self.bucket, key = bucket_and_key(uri)
        if not key or (key.endswith("/") and not directory):
            raise GrpoError(f"{self.uri}: name the object to write (s3://bucket/path/out.parquet)")
        self.key = key.rstrip("/")
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = s3_client()
        return self._client

    def check(self, *, force: bool, what: str) -> None:
        """Refuse, before any work, an output that cannot be written or would replace data."""
        with _s3_errors(self.uri, f"write the {what} there"):
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except Exception as exc:  # HEAD has no body: a missing bucket is a bare 404
                if _code(exc) in ("404", "NoSuchBucket", "NotFound"):
                    raise GrpoError(f"{self.uri}: the bucket {self.bucket!r} does not exist") from None
                raise
            existing = self._existing()
        refuse_to_replace(self.uri, existing, directory=self.directory, force=force)

    def _existing(self) -> list[str]:
        if not self.directory:
            return [] if _s3_size(self.client, self.bucket, self.key) is None else [self.key]
        return [key for key, _ in self._listed(self.key + "/")]

    def publish(
        self,
        local: Path,
        copied: dict[str, CopiedPrefix],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """Upload ``local`` (the run's finished file, or folder of shards) as the output.

        ``copied``: for each output file (by name in the folder; ``""`` for a file output)
        whose first bytes are those of an S3 object, that object and how many bytes. Every
        object is uploaded in parts first and completed only when all are whole; any error
        or interrupt aborts them all. Returns the bytes uploaded and copied server-side.
        """
        files = sorted(local.iterdir()) if self.directory else [local]
        uploads: list[_Upload] = []
        uploaded = copied_bytes = 0
        completed: list[str] = []
        try:
            with _s3_errors(self.uri, "upload the output"):
                for file in files:
                    name = file.name if self.directory else ""
                    key = f"{self.key}/{file.name}" if self.directory else self.key
                    upload = _Upload(
                        key,
                        self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"],
                        [],
                    )
                    uploads.append(upload)
                    sent, copied_here = self._parts(file, upload, copied.get(name), progress)
                    uploaded += sent
                    copied_bytes += copied_here
                for upload in uploads:
                    self.client.complete_multipart_upload(
                        Bucket=self.bucket,
                        Key=upload.key,
                        UploadId=upload.upload_id,
                        MultipartUpload={"Parts": upload.parts},
                    )
                    completed.append(upload.key)
                if self.directory:
                    self._remove_stale({upload.key for upload in uploads})
        except BaseException:
            self._abort(uploads, completed)
            raise
        return {
            "uri": self.uri,
            "objects": len(files),
            "bytes_uploaded": uploaded,
            "bytes_copied_in_store": copied_bytes,
        }

    def _parts(
        self,
        file: Path,
        upload: _Upload,
        prefix: CopiedPrefix | None,
        progress: Callable[[int], None] | None,
    ) -> tuple[int, int]:
        size = file.stat().st_size
        start = copied = 0
        if prefix is not None and prefix.length >= MIN_PART_BYTES:
            self._copy_parts(upload, *bucket_and_key(prefix.source), prefix.length)
            start = copied = prefix.length
        sent = 0
        with open(file, "rb") as handle:
            handle.seek(start)
            while start + sent < size or not upload.parts:  # an empty file is one empty part
                body = handle.read(PART_BYTES)
                result = self.client.upload_part(
                    Bucket=self.bucket,
                    Key=upload.key,
                    UploadId=upload.upload_id,
                    PartNumber=len(upload.parts) + 1,
                    Body=body,
                )
                upload.parts.append({"PartNumber": len(upload.parts) + 1, "ETag": result["ETag"]})
                sent += len(body)
                if progress is not None:
                    progress(len(body))
        assert start + sent == size
        return sent, copied

    def staging_uri(self, token: str) -> str:
        """A hidden folder beside the output for a run whose shards other machines write (a
        Ray cluster's workers): :meth:`place_staged` moves them into place."""
        parent, _, name = self.key.rpartition("/")
        return f"s3://{self.bucket}/{parent + '/' if parent else ''}.{name}.{token}.tmp/"

    def place_staged(self, staging: str) -> dict[str, Any]:
        """Copy every object under ``staging`` (:meth:`staging_uri`) into the output folder,
        inside the store (no byte leaves it), then remove the replaced folder's other shards
        and the staging folder: :func:`place_staged`."""
        return place_staged(self, staging)

    def _errors(self, doing: str) -> contextlib.AbstractContextManager[None]:
        return _s3_errors(self.uri, doing)

    def _staged(self, staging: str) -> list[tuple[str, str, int]]:
        """Each object under ``staging``: its key, its name there, its size."""
        _, prefix = bucket_and_key(staging)
        return [
            (key, key[len(prefix) :], size) for key, size in self._listed(prefix) if not key.endswith("/")
        ]

    def _final(self, name: str) -> str:
        return f"{self.key}/{name}"

    def _remove_object(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)

    def remove_staged(self, staging: str) -> None:
        """Remove what a run staged (best effort: the run's own error is the one to report)."""
        _, prefix = bucket_and_key(staging)
        with contextlib.suppress(Exception):
            self._delete([key for key, _ in self._listed(prefix)])

    def _listed(self, prefix: str) -> list[tuple[str, int]]:
        found = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            found += [(entry["Key"], int(entry["Size"])) for entry in page.get("Contents", [])]
        return sorted(found)

    def _copy_in_store(self, source: str, key: str, size: int) -> None:
        """One object copied inside the bucket: whole up to 5 GiB (S3's limit for one copy),
        in ranged parts above that."""
        if size <= MAX_COPY_PART_BYTES:
            self.client.copy_object(
                Bucket=self.bucket, Key=key, CopySource={"Bucket": self.bucket, "Key": source}
            )
            return
        upload = _Upload(
            key, self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"], []
        )
        try:
            self._copy_parts(upload, self.bucket, source, size)
            self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload.upload_id,
                MultipartUpload={"Parts": upload.parts},
            )
        except BaseException:
            self._abort([upload], [])
            raise

    def _copy_parts(self, upload: _Upload, source_bucket: str, source_key: str, length: int) -> None:
        """The first ``length`` bytes of an object, copied inside the store as the upload's next
        parts (:func:`copy_ranges`)."""
        for low, high in copy_ranges(length):
            result = self.client.upload_part_copy(
                Bucket=self.bucket,
                Key=upload.key,
                UploadId=upload.upload_id,
                PartNumber=len(upload.parts) + 1,
                CopySource={"Bucket": source_bucket, "Key": source_key},
                CopySourceRange=f"bytes={low}-{high - 1}",
            )
            upload.parts.append(
                {"PartNumber": len(upload.parts) + 1, "ETag": result["CopyPartResult"]["ETag"]}
            )

    def _remove_stale(self, written: set[str]) -> None:
        """A replaced folder's shards that this run did not write (``--force``)."""
        self._delete([key for key in self._existing() if key not in written])

    def _delete(self, keys: list[str]) -> None:
        for low in range(0, len(keys), 1000):  # S3 deletes at most 1000 objects a request
            self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": key} for key in keys[low : low + 1000]]}
            )

    def _abort(self, uploads: list[_Upload], completed: list[str]) -> None:
        """Leave nothing of a failed run: abort its uploads; remove objects it had completed."""
        for upload in uploads:
            if upload.key in completed:
                with contextlib.suppress(Exception):
                    self.client.delete_object(Bucket=self.bucket, Key=upload.key)
            else:
                with contextlib.suppress(Exception):
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload.key, UploadId=upload.upload_id
                    )


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


# --------------------------------------------------------------------------- hf:// output


class HfOutput:
    """An ``hf://`` output: a file, or a folder of shards, in a Hub repo (a dataset's, or a model's),
    at a branch (``owner/name@BRANCH/path``; ``main`` where none is named).

    :meth:`check` runs when the output is claimed, before any work: the repo and the branch must
    exist and be readable with the token at hand, and what is there is replaced only with
    ``force``. :meth:`publish` makes one commit of the finished local files (and, for a folder,
    the removal of the shards of the output it replaces): the Hub applies a commit whole or not
    at all, so the output appears complete or not at all. The commit names the branch's head it
    read just before as its parent, so a push made in between fails the run rather than being
    overwritten. Each output of a run (data, summary, report) is a commit of its own.
    """

    def __init__(self, uri: str, *, directory: bool) -> None:
        self.uri = redact(uri)
        self.directory = directory
        self.fs, self.path = _fsspec(uri)
        self.path = self.path.rstrip("/")

    def _errors(self, doing: str) -> contextlib.AbstractContextManager[None]:
        return _hf_errors(self.uri, doing)

    def _resolved(self) -> Any:
        """The repo, revision and path in the repo the URI names (the repo and revision must exist)."""
        try:
            resolved = self.fs.resolve_path(self.path)
        except FileNotFoundError as missing:
            absent = (
                "no such repo or branch on the Hub; create the repo first "
                "(hf repo create OWNER/NAME --repo-type dataset)"
            )
            raise _not_found(self.uri, missing, absent) from None
        if not hasattr(resolved, "repo_id"):
            raise GrpoError(f"{self.uri}: grpo-cli writes to a repo's files, not to an hf:// bucket")
        if not resolved.path_in_repo:
            raise GrpoError(f"{self.uri}: name the file to write (hf://datasets/OWNER/NAME/path/out.parquet)")
        return resolved

    def check(self, *, force: bool, what: str) -> None:
        """Refuse, before any work, an output that cannot be written or would replace data."""
        with self._errors(f"write the {what} there"):
            resolved = self._resolved()
            existing = self._existing(resolved)
        refuse_to_replace(self.uri, existing, directory=self.directory, force=force)

    def _existing(self, resolved: Any) -> list[str]:
        """The paths in the repo the output would replace."""
        self.fs.invalidate_cache()
        if not self.directory:
            return [resolved.path_in_repo] if self.fs.isfile(self.path) else []
        if not self.fs.isdir(self.path):
            return []
        root = self.path + "/"
        return sorted(resolved.path_in_repo + "/" + name[len(root) :] for name in self.fs.find(self.path))

    def publish(
        self,
        local: Path,
        copied: dict[str, CopiedPrefix],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """Commit ``local`` (the run's finished file, or folder of shards) as the output, in one
        commit. ``copied`` is unused: the Hub copies no byte range. Returns the bytes uploaded
        and the commit."""
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

        files = sorted(local.iterdir()) if self.directory else [local]
        with self._errors("commit the output"):
            resolved = self._resolved()
            base = resolved.path_in_repo
            added = {f"{base}/{file.name}" if self.directory else base: file for file in files}
            stale = [path for path in self._existing(resolved) if path not in added]
            api = HfApi()
            head = api.repo_info(
                resolved.repo_id, repo_type=resolved.repo_type, revision=resolved.revision
            ).sha
            operations: list[Any] = [CommitOperationAdd(path, str(file)) for path, file in added.items()]
            operations += [CommitOperationDelete(path) for path in stale]
            commit = api.create_commit(
                resolved.repo_id,
                operations,
                commit_message=f"grpo-cli: {base}",
                repo_type=resolved.repo_type,
                revision=resolved.revision,
                parent_commit=head,
            )
        uploaded = sum(file.stat().st_size for file in files)
        if progress is not None:
            progress(uploaded)
        return {
            "uri": self.uri,
            "objects": len(files),
            "bytes_uploaded": uploaded,
            "bytes_copied_in_store": 0,
            "commit": commit.oid,
        }


@contextlib.contextmanager
def _hf_errors(uri: str, doing: str) -> Iterator[None]:
    """huggingface_hub's errors, in one line each: a refusal (HTTP 401, 403), a branch moved by
    another push (HTTP 412), anything else with its first line."""
    try:
        yield
    except GrpoError:
        raise
    except Exception as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        text = first_line(exc)
        if status in (401, 403):
            raise GrpoError(f"{uri}: access denied when trying to {doing} (HTTP {status}: {text})") from None
        if status == 412:
            raise GrpoError(
                f"{uri}: the branch moved while the run wrote (another push); nothing was committed"
            ) from None
        raise GrpoError(f"{uri}: cannot {doing} ({text})") from None


def _gcs_folder(uri: str) -> str:
    """A ``gs://`` folder as gcsfs names it: ``bucket/path``, no trailing slash."""
    return uri.split("://", 1)[1].rstrip("/")


_GCS_STAGED = re.compile(r"/\.[^/]+\.[0-9a-f]{12}\.tmp$")
"""A staged object's name (:meth:`GcsOutput._staging`)."""


def place_staged(output: S3Output | GcsOutput, staging: str) -> dict[str, Any]:
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


def store_output(uri: str, *, directory: bool) -> S3Output | GcsOutput | HfOutput:
    """The output on the store ``uri`` names (one of :data:`WRITABLE_SCHEMES` but ``file``)."""
    scheme = check_scheme(uri)
    if scheme == "s3":
        return S3Output(uri, directory=directory)
    if scheme == "hf":
        return HfOutput(uri, directory=directory)
    return GcsOutput(uri, directory=directory)


def copy_ranges(length: int) -> list[tuple[int, int]]:
    """Byte ranges ``[low, high)`` that cover ``length`` bytes in parts S3 copies: each at least
    :data:`MIN_PART_BYTES` (``length`` itself must be) and at most :data:`MAX_COPY_PART_BYTES`.

    >>> copy_ranges(150 << 20)
    [(0, 52428800), (52428800, 104857600), (104857600, 157286400)]
    >>> [high - low for low, high in copy_ranges((64 << 20) + 1)]
    [33554433, 33554432]
    """
    if length < MIN_PART_BYTES:
        raise ValueError(f"a copied part holds at least {MIN_PART_BYTES} bytes, not {length}")
    count = max(1, -(-length // PART_BYTES))
    size = -(-length // count)
    return [(low, min(low + size, length)) for low in range(0, length, size)]
