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
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from grpo_cli.errors import GrpoError, first_line
from grpo_cli.stores.base import (
    SCHEMES,
    WRITABLE_SCHEMES,
    CopiedPrefix,
    RemoteFile,
    check_scheme,
    is_uri,
    local_path,
    place_of,
    place_staged,
    redact,
    refuse_to_replace,
    same_or_within,
    split_uri,
)
from grpo_cli.stores.gcs import GcsOutput, _fsspec, _fsspec_download, _fsspec_list, _not_found, gcs_filesystem
from grpo_cli.stores.hf import HfOutput
from grpo_cli.stores.s3 import (
    S3Output,
    _s3_download,
    _s3_errors,
    _s3_list,
    _s3_size,
    bucket_and_key,
    copy_ranges,
    s3_client,
    s3_error,
)

__all__ = [
    "SCHEMES",
    "WRITABLE_SCHEMES",
    "CopiedPrefix",
    "GcsOutput",
    "HfOutput",
    "RemoteFile",
    "S3Output",
    "bucket_and_key",
    "check_scheme",
    "copy_ranges",
    "download",
    "gcs_filesystem",
    "is_uri",
    "list_files",
    "local_path",
    "place_of",
    "place_staged",
    "redact",
    "refuse_to_replace",
    "s3_client",
    "s3_error",
    "same_or_within",
    "split_uri",
    "staged_tree",
    "store_output",
    "walk",
]


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


def store_output(uri: str, *, directory: bool) -> S3Output | GcsOutput | HfOutput:
    """The output on the store ``uri`` names (one of :data:`WRITABLE_SCHEMES` but ``file``)."""
    scheme = check_scheme(uri)
    if scheme == "s3":
        return S3Output(uri, directory=directory)
    if scheme == "hf":
        return HfOutput(uri, directory=directory)
    return GcsOutput(uri, directory=directory)
