"""Fixtures of the integration tests: object stores served on loopback (S3 by moto, GCS by an
emulator, a Hugging Face Hub), and the helpers that run one command on both engines."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import Result


def big_rollouts(path: Path, *, rows: int = 40_000, seed: int = 0) -> Path:
    """About 10 MiB of Parquet (a completion column of random text), in several row groups:
    large enough that its column chunks are copied in the store (parts of 5 MiB or more)."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", dtype=np.uint8)
    text = letters[rng.integers(0, letters.size, size=rows * 256)].tobytes()
    offsets = np.arange(0, (rows + 1) * 256, 256, dtype=np.int32)
    table = pa.table(
        {
            "uid": pa.array([f"prompt-{g}" for g in rng.permutation(rows) // 8]),
            "completion": pa.StringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(text)),
            "reward": (rng.random(rows) < 0.4).astype(np.float32),
        }
    )
    pq.write_table(table, path, row_group_size=10_000)
    return path


def previous_output(output: str) -> dict[str, bytes]:
    """What an object-store output held before a forced run, by name under the bucket: the
    one object of a file output, or three shards of a folder output (``.../out/``)."""
    if output.endswith(".parquet"):
        return {"out.parquet": b"the old output"}
    return {f"out/part-{index}.parquet": f"old shard {index}".encode() for index in range(3)}


def pq_without_provenance(path: Path, target: Path) -> Path:
    """The file's rows with its provenance entry dropped (it names the input's path)."""
    from grpo_cli.file_names import PROVENANCE_KEY

    table = pq.read_table(path)
    metadata = {k: v for k, v in (table.schema.metadata or {}).items() if k != PROVENANCE_KEY}
    pq.write_table(table.replace_schema_metadata(metadata), target)
    return target


def assert_dump_checks_as_local(cli: Callable[..., Result], trainer: str, folder: Path, uri: str) -> None:
    """``check --from TRAINER`` of a dump copied to a store (``uri``) gives the summary of the
    local ``folder``, but for what names the input and the timings."""
    local = cli("check", "--from", trainer, folder, "--summary-json", "-", "-q")
    remote = cli("check", "--from", trainer, uri, "--summary-json", "-", "-q")
    assert local.exit_code == remote.exit_code, remote.stderr
    drop = ("elapsed_seconds", "input", "warnings")
    local_summary, remote_summary = json.loads(local.stdout), json.loads(remote.stdout)
    assert {k: v for k, v in remote_summary.items() if k not in drop} == {
        k: v for k, v in local_summary.items() if k not in drop
    }
    assert remote_summary["input"]["path"] == uri


def compute_on_both_engines(source: str, output_prefix: str, env: dict[str, str]) -> None:
    """``compute SOURCE -g group_id -o PREFIX-ENGINE/`` on the local and the Ray engine, as whole
    processes with ``env`` (Ray's workers take the environment they start with)."""
    import subprocess
    import sys

    for engine in ("local", "ray"):
        command = [sys.executable, "-m", "grpo_cli", "compute", source, "-g", "group_id"]
        command += ["-o", f"{output_prefix}-{engine}/", "--engine", engine, "-q"]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (engine, done.stderr)


def assert_engines_agree(local_files: Sequence[Path], ray_files: Sequence[Path], rows: int) -> None:
    """Both engines' output shards hold the same ``rows`` rows, every column's values equal
    (the Ray engine's types cast to the local engine's), ordered by the ``text`` column."""
    assert local_files and ray_files
    local, ray = (
        pa.concat_tables([pq.read_table(f) for f in files]).sort_by([("text", "ascending")])
        for files in (local_files, ray_files)
    )
    assert local.num_rows == ray.num_rows == rows
    for name in local.column_names:
        expected = local.column(name).to_pylist()
        assert ray.column(name).cast(local.schema.field(name).type).to_pylist() == expected, name


# --------------------------------------------------------------------------- an S3 API server on loopback


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_server(command: list[str], env: dict[str, str], ready_url: str) -> Any:
    """``command`` started in its own process, once ``ready_url`` answers (30 s at most)."""
    import subprocess
    import time
    import urllib.request

    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(ready_url, timeout=1).close()
            return process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                if process.poll() is None:
                    process.kill()
                process.wait()
                raise RuntimeError(f"{command[2]} did not start") from None
            time.sleep(0.1)


class S3Server:
    """``moto_server`` in its own process on 127.0.0.1: a real S3 API over HTTP, started and
    stopped by the tests. ``env`` is what a client needs to reach it (credentials moto accepts)."""

    def __init__(self, *, enforce_auth: bool = False) -> None:
        import os
        import sys

        port = free_port()
        server_env = dict(os.environ)
        if enforce_auth:  # every request must be signed by a key moto's IAM knows: 403 otherwise
            server_env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        self.endpoint = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        self.process = start_server(command, server_env, f"{self.endpoint}/moto-api/")
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing-key-id",
            "AWS_SECRET_ACCESS_KEY": "testing-secret-never-printed",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
            "AWS_CONFIG_FILE": "/nonexistent/config",
        }

    def reset(self) -> None:
        import urllib.request

        urllib.request.urlopen(
            urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        ).close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@pytest.fixture(scope="session")
def s3_server() -> Any:
    pytest.importorskip("moto.server", reason="the object-storage tests need moto[server] (the dev extra)")
    pytest.importorskip("boto3")
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A boto3 client of a fresh loopback S3 server, with the environment pointing at it and
    one bucket, ``rollouts``."""
    import boto3

    s3_server.reset()
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    client = boto3.client("s3")
    client.create_bucket(Bucket="rollouts")
    return client


# --------------------------------------------------------------------------- a GCS API server on loopback


class GcsServer:
    """``gcp-storage-emulator`` in its own process on 127.0.0.1: Google Cloud Storage's JSON API
    over HTTP (resumable uploads included), started and stopped by the tests. ``env`` points
    gcsfs at it (``STORAGE_EMULATOR_HOST``); it takes no credentials."""

    def __init__(self) -> None:
        import os
        import sys

        port = free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1"]
        command += ["--port", str(port), "--in-memory", "--quiet"]
        self.process = start_server(command, dict(os.environ), f"{self.endpoint}/")
        self.env = {"STORAGE_EMULATOR_HOST": self.endpoint}

    def reset(self, bucket: str) -> None:
        """No objects, and one empty bucket."""
        import json
        import urllib.request

        urllib.request.urlopen(f"{self.endpoint}/wipe").close()
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b",
            data=json.dumps({"name": bucket}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request).close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@pytest.fixture(scope="session")
def gcs_server() -> Any:
    pytest.importorskip("gcp_storage_emulator", reason="the GCS tests need gcp-storage-emulator (dev extra)")
    pytest.importorskip("gcsfs")
    server = GcsServer()
    yield server
    server.stop()


@pytest.fixture
def gcs(gcs_server: GcsServer, monkeypatch: pytest.MonkeyPatch) -> Any:
    """gcsfs's file system on a fresh loopback GCS server with one bucket, ``rollouts``, and
    the environment pointing at it (as grpo-cli's own file system will be)."""
    from gcsfs.core import GCSFileSystem

    gcs_server.reset("rollouts")
    for name, value in gcs_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    return GCSFileSystem(skip_instance_cache=True, token="anon")


# --------------------------------------------------------------------------- a Hugging Face Hub on loopback


def point_huggingface_hub_at(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's endpoint, as ``HF_ENDPOINT`` sets it when it is imported."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    )


@pytest.fixture(scope="session")
def hub_server() -> Any:
    pytest.importorskip("huggingface_hub", reason="the hf:// tests need huggingface_hub (hf extra)")
    from tests.hub_server import HubServer

    server = HubServer()
    yield server
    server.stop()


@pytest.fixture
def hub(hub_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The loopback Hub (:class:`tests.hub_server.HubServer`) with no repo, and huggingface_hub
    pointed at it, without a token (none from the environment nor from a saved login)."""
    from huggingface_hub import constants

    hub_server.reset()
    point_huggingface_hub_at(hub_server.endpoint, monkeypatch)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setenv("HF_ENDPOINT", hub_server.endpoint)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return hub_server
