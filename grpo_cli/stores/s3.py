"""``s3://`` through boto3: listing, downloads, and outputs written as multipart uploads that
are completed only when the run's every object is whole (unchanged column chunks copied
inside the store)."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from grpo_cli.errors import GrpoError, first_line
from grpo_cli.stores.base import (
    CONNECT_TIMEOUT_SECONDS,
    COPY_CHUNK,
    MAX_ATTEMPTS,
    MAX_COPY_PART_BYTES,
    MIN_PART_BYTES,
    PART_BYTES,
    READ_TIMEOUT_SECONDS,
    CopiedPrefix,
    RemoteFile,
    _folder_files,
    _hidden,
    place_staged,
    redact,
    refuse_to_replace,
)


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
