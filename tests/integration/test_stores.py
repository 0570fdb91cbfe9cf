"""Object storage: s3:// inputs and outputs against a real S3 API server on loopback (moto's),
file:// URIs as local paths, and what goes wrong on a store said in one line."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import Result

from grpo_cli import stores
from grpo_cli.errors import GrpoError
from grpo_cli.outputs.splice import read_footer
from tests.conftest import assert_same_rows, one_line_error, rollout_rows, write_parquet
from tests.integration.conftest import (
    S3Server,
    assert_engines_agree,
    big_rollouts,
    compute_on_both_engines,
    pq_without_provenance,
    previous_output,
)

Cli = Callable[..., Result]


def fetch(s3: Any, key: str, target: Path) -> Path:
    s3.download_file("rollouts", key, str(target))
    return target


def keys(s3: Any, prefix: str = "") -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket="rollouts", Prefix=prefix)
    return [entry["Key"] for page in pages for entry in page.get("Contents", [])]


def test_s3_to_s3_is_the_local_run_with_the_column_chunks_copied_in_the_store(
    s3: Any, tmp_path: Path, cli: Cli
) -> None:
    source = big_rollouts(tmp_path / "run.parquet")
    s3.upload_file(str(source), "rollouts", "run/step-1.parquet")
    local = tmp_path / "local.parquet"
    assert cli("compute", source, "-g", "uid", "-o", local, "-q").exit_code == 0

    summary_path = tmp_path / "summary.json"
    result = cli(
        "compute", "s3://rollouts/run/step-1.parquet", "-g", "uid", "-o", "s3://rollouts/out/step-1.parquet",
        "--summary-json", summary_path,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    remote = fetch(s3, "out/step-1.parquet", tmp_path / "remote.parquet")
    assert_same_rows(
        pq_without_provenance(local, tmp_path / "a.parquet"),
        pq_without_provenance(remote, tmp_path / "b.parquet"),
    )

    output = json.loads(summary_path.read_text())["output"]
    transfer = output["transfer"]
    prefix = read_footer(source.open("rb")).start
    assert output["method"] == "splice"
    assert transfer["bytes_copied_in_store"] == prefix  # every input column chunk, not moved
    assert transfer["bytes_uploaded"] == remote.stat().st_size - prefix  # new chunks and the footer
    assert transfer["bytes_uploaded"] < source.stat().st_size / 10
    assert "copied in the store" in result.stderr and "uploaded" in result.stderr
    assert keys(s3) == ["out/step-1.parquet", "run/step-1.parquet"]
    assert not s3.list_multipart_uploads(Bucket="rollouts").get("Uploads")


def test_a_folder_on_s3_to_a_folder_on_s3_one_object_per_shard(s3: Any, tmp_path: Path, cli: Cli) -> None:
    rows = rollout_rows(n_groups=30, group_size=4, seed=3)
    folder = tmp_path / "run"
    folder.mkdir()
    for index in range(3):
        shard = write_parquet(folder / f"part-{index}.parquet", rows[index * 40 : (index + 1) * 40])
        s3.upload_file(str(shard), "rollouts", f"run/part-{index}.parquet")
    s3.put_object(Bucket="rollouts", Key="run/_SUCCESS", Body=b"")  # Spark's marker: not a shard
    assert cli("compute", folder, "-g", "group_id", "-o", tmp_path / "local", "-q").exit_code == 0
    result = cli("compute", "s3://rollouts/run/", "-g", "group_id", "-o", "s3://rollouts/out/", "-q")
    assert result.exit_code == 0, result.stderr
    assert keys(s3, "out/") == [f"out/part-{index}.parquet" for index in range(3)]
    for index in range(3):
        remote = fetch(s3, f"out/part-{index}.parquet", tmp_path / f"remote-{index}.parquet")
        local = tmp_path / "local" / f"part-{index}.parquet"
        assert pq.read_table(remote).equals(pq.read_table(local))  # metadata (provenance) aside
        assert pq.read_table(remote).column("advantage").equals(pq.read_table(local).column("advantage"))


def test_check_and_a_summary_on_s3(s3: Any, tmp_path: Path, cli: Cli) -> None:
    source = write_parquet(tmp_path / "in.parquet", rollout_rows())
    s3.upload_file(str(source), "rollouts", "in.parquet")
    result = cli(
        "check", "s3://rollouts/in.parquet", "-g", "group_id", "--min-groups", "1",
        "--summary-json", "s3://rollouts/reports/summary.json", "-q",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    summary = json.loads(s3.get_object(Bucket="rollouts", Key="reports/summary.json")["Body"].read())
    assert summary["input"]["path"] == "s3://rollouts/in.parquet"
    assert summary["groups"] == 13


def test_file_uris_are_local_paths(tmp_path: Path, cli: Cli) -> None:
    source = write_parquet(tmp_path / "in.parquet", rollout_rows())
    out = tmp_path / "out.parquet"
    result = cli("compute", f"file://{source}", "-g", "group_id", "-o", f"file://{out}", "-q")
    assert result.exit_code == 0, result.stderr
    assert pq.read_table(out).num_rows == len(rollout_rows())
    refused = cli("compute", f"file://{source}", "-g", "group_id", "-o", f"file://{source}", "-q", "--force")
    one_line_error(refused, 2, "would overwrite the input")


def test_an_existing_object_is_replaced_only_with_force(s3: Any, tmp_path: Path, cli: Cli) -> None:
    source = write_parquet(tmp_path / "in.parquet", rollout_rows())
    s3.upload_file(str(source), "rollouts", "in.parquet")
    s3.put_object(Bucket="rollouts", Key="out.parquet", Body=b"keep me")
    refused = cli("compute", "s3://rollouts/in.parquet", "-g", "group_id", "-o", "s3://rollouts/out.parquet")
    one_line_error(refused, 2, "s3://rollouts/out.parquet", "exists", "--force")
    assert s3.get_object(Bucket="rollouts", Key="out.parquet")["Body"].read() == b"keep me"
    forced = cli(
        "compute", "s3://rollouts/in.parquet", "-g", "group_id", "-o", "s3://rollouts/out.parquet", "-f"
    )
    assert forced.exit_code == 0, forced.stderr
    assert s3.get_object(Bucket="rollouts", Key="out.parquet")["Body"].read()[:4] == b"PAR1"


@pytest.mark.parametrize("output", ["s3://rollouts/in.parquet", "s3://rollouts/"])
def test_an_output_over_an_input_on_the_store_is_refused(
    s3: Any, tmp_path: Path, cli: Cli, output: str
) -> None:
    source = write_parquet(tmp_path / "in.parquet", rollout_rows())
    s3.upload_file(str(source), "rollouts", "in.parquet")
    before = s3.get_object(Bucket="rollouts", Key="in.parquet")["Body"].read()
    refused = cli("compute", "s3://rollouts/in.parquet", "-g", "group_id", "-o", output, "-f")
    one_line_error(refused, 2, "would overwrite the input s3://rollouts/in.parquet")
    assert s3.get_object(Bucket="rollouts", Key="in.parquet")["Body"].read() == before


def test_a_missing_bucket_or_object_is_one_line(s3: Any, tmp_path: Path, cli: Cli) -> None:
    source = write_parquet(tmp_path / "in.parquet", rollout_rows())
    s3.upload_file(str(source), "rollouts", "in.parquet")
    missing_input = cli(
        "compute", "s3://no-such-bucket/in.parquet", "-g", "group_id", "-o", tmp_path / "o.parquet"
    )
    one_line_error(missing_input, 2, "s3://no-such-bucket/in.parquet", "'no-such-bucket' does not exist")
    missing_object = cli(
        "compute", "s3://rollouts/nothing.parquet", "-g", "group_id", "-o", tmp_path / "o.parquet"
    )
    one_line_error(missing_object, 2, "s3://rollouts/nothing.parquet", "no such file or folder")
    missing_output = cli(
        "compute", "s3://rollouts/in.parquet", "-g", "group_id", "-o", "s3://elsewhere/o.parquet"
    )
    one_line_error(missing_output, 2, "s3://elsewhere/o.parquet", "'elsewhere' does not exist")
    assert not (tmp_path / "o.parquet").exists()


def test_no_credentials_is_one_line_that_prints_none(
    s3: Any, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = write_parquet(tmp_path / "in.parquet", rollout_rows())
    s3.upload_file(str(source), "rollouts", "in.parquet")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    result = cli("compute", "s3://rollouts/in.parquet", "-g", "group_id", "-o", tmp_path / "o.parquet")
    one_line_error(result, 2, "s3://rollouts/in.parquet", "no AWS credentials")


def test_a_403_is_one_line(tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("moto.server")
    server = S3Server(enforce_auth=True)  # moto's IAM knows no key: every request is refused
    try:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        result = cli("compute", "s3://rollouts/in.parquet", "-g", "group_id", "-o", tmp_path / "o.parquet")
        line = one_line_error(result, 2, "s3://rollouts/in.parquet", "access denied", "403")
        assert "testing-secret-never-printed" not in line and "testing-key-id" not in line
    finally:
        server.stop()


def test_credentials_in_a_uri_are_never_printed_nor_written(s3: Any, tmp_path: Path, cli: Cli) -> None:
    source = write_parquet(tmp_path / "in.parquet", rollout_rows())
    s3.upload_file(str(source), "rollouts", "in.parquet")
    out = tmp_path / "out.parquet"
    uri = "s3://KEYID:SECRET@rollouts/in.parquet"
    result = cli("compute", uri, "-g", "group_id", "-o", out, "--summary-json", "-")
    assert result.exit_code == 0, result.stderr
    assert "SECRET" not in result.stdout + result.stderr and "KEYID" not in result.stdout + result.stderr
    assert b"SECRET" not in out.read_bytes() and b"KEYID" not in out.read_bytes()
    assert json.loads(result.stdout)["input"]["path"] == "s3://rollouts/in.parquet"


@contextlib.contextmanager
def second_call_fails(operation: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Inside the block, the second S3 request of ``operation`` fails as a reset connection."""
    import botocore.client

    real_call = botocore.client.BaseClient._make_api_call
    calls = []

    def flaky(self: Any, name: str, params: dict[str, Any]) -> Any:
        if name == operation:
            calls.append(params["Key"])
            if len(calls) == 2:
                raise OSError("connection reset by peer")
        return real_call(self, name, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", flaky)
    try:
        yield
    finally:
        monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", real_call)


def three_shards_on_s3(s3: Any, tmp_path: Path) -> None:
    """s3://rollouts/run/ holding part-0 to part-2.parquet, 40 rows each."""
    rows = rollout_rows(n_groups=30, group_size=4, seed=3)
    for index in range(3):
        shard = write_parquet(tmp_path / f"part-{index}.parquet", rows[index * 40 : (index + 1) * 40])
        s3.upload_file(str(shard), "rollouts", f"run/part-{index}.parquet")


def test_an_interrupted_upload_leaves_no_object_and_no_pending_upload(
    s3: Any, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    three_shards_on_s3(s3, tmp_path)
    real_parts = stores.S3Output._parts
    calls = []

    def interrupted(self: stores.S3Output, *args: Any) -> Any:
        calls.append(args)
        if len(calls) == 3:  # two objects' parts are up, none completed
            raise KeyboardInterrupt
        return real_parts(self, *args)

    monkeypatch.setattr(stores.S3Output, "_parts", interrupted)
    result = cli("compute", "s3://rollouts/run/", "-g", "group_id", "-o", "s3://rollouts/out/")
    assert result.exit_code == 130, result.stderr
    assert keys(s3, "out/") == []
    assert not s3.list_multipart_uploads(Bucket="rollouts").get("Uploads")


@pytest.mark.parametrize("output", ["s3://rollouts/out.parquet", "s3://rollouts/out/"])
def test_a_forced_run_that_fails_leaves_what_it_was_to_replace(
    s3: Any, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    """--force replaces what is there only when every object is completed: a run cut off on
    its last upload leaves the old object, or the old folder's every shard, as they were
    (the neighbour of the same test for gs://)."""
    three_shards_on_s3(s3, tmp_path)
    old = previous_output(output)
    for key, data in old.items():
        s3.put_object(Bucket="rollouts", Key=key, Body=data)
    real_parts = stores.S3Output._parts
    calls = []

    def cut_off(self: stores.S3Output, *args: Any) -> Any:
        calls.append(args)
        if len(calls) == len(old):
            raise OSError("connection reset by peer")
        return real_parts(self, *args)

    monkeypatch.setattr(stores.S3Output, "_parts", cut_off)
    result = cli("compute", "s3://rollouts/run/", "-g", "group_id", "-o", output, "-f")
    one_line_error(result, 2, output, "connection reset by peer")
    for key, data in old.items():
        assert s3.get_object(Bucket="rollouts", Key=key)["Body"].read() == data
    assert sorted(keys(s3)) == sorted([*old, *(f"run/part-{index}.parquet" for index in range(3))])
    assert not s3.list_multipart_uploads(Bucket="rollouts").get("Uploads")


def test_a_failed_completion_removes_the_objects_already_completed(
    s3: Any, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    three_shards_on_s3(s3, tmp_path)
    with second_call_fails("CompleteMultipartUpload", monkeypatch):
        result = cli("compute", "s3://rollouts/run/", "-g", "group_id", "-o", "s3://rollouts/out/")
    one_line_error(result, 2, "s3://rollouts/out", "connection reset by peer")
    assert keys(s3, "out/") == []
    assert not s3.list_multipart_uploads(Bucket="rollouts").get("Uploads")


def test_a_server_that_dies_mid_upload_fails_the_run_in_one_line(
    tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("moto.server")
    import boto3

    server = S3Server()
    try:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        client = boto3.client("s3")
        client.create_bucket(Bucket="rollouts")
        source = big_rollouts(tmp_path / "in.parquet", rows=8_000)
        client.upload_file(str(source), "rollouts", "in.parquet")
        real_parts = stores.S3Output._parts

        def dies(self: stores.S3Output, *args: Any) -> Any:
            server.stop()  # the store goes away between the run's work and its upload
            return real_parts(self, *args)

        monkeypatch.setattr(stores.S3Output, "_parts", dies)
        result = cli("compute", "s3://rollouts/in.parquet", "-g", "uid", "-o", "s3://rollouts/out.parquet")
        one_line_error(result, 2, "s3://rollouts/out.parquet", "does not answer")
    finally:
        server.stop()


def test_thousands_of_shards_are_listed_in_name_order(s3: Any) -> None:
    names = [f"run/part-{index:05d}.parquet" for index in range(2500)]
    for name in reversed(names):
        s3.put_object(Bucket="rollouts", Key=name, Body=b"PAR1")
    listed = stores.list_files("s3://rollouts/run/")
    assert [file.uri for file in listed] == [f"s3://rollouts/{name}" for name in names]


def test_a_subfolder_or_a_foreign_data_file_is_refused(s3: Any) -> None:
    s3.put_object(Bucket="rollouts", Key="run/part-0.parquet", Body=b"PAR1")
    s3.put_object(Bucket="rollouts", Key="run/step-2/part-0.parquet", Body=b"PAR1")
    with pytest.raises(GrpoError, match="holds subfolders"):
        stores.list_files("s3://rollouts/run/")
    s3.put_object(Bucket="rollouts", Key="flat/part-0.parquet", Body=b"PAR1")
    s3.put_object(Bucket="rollouts", Key="flat/part-1.orc", Body=b"ORC")
    with pytest.raises(GrpoError, match=r"part-1\.orc, a format grpo-cli does not read"):
        stores.list_files("s3://rollouts/flat/")


def test_copy_ranges_cover_the_prefix_in_parts_s3_accepts() -> None:
    for length in (5 << 20, (5 << 20) + 1, 64 << 20, (64 << 20) + 1, 1 << 30, (3 << 30) + 12345):
        ranges = stores.copy_ranges(length)
        assert ranges[0][0] == 0 and ranges[-1][1] == length
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        limits = stores.base
        assert all(limits.MIN_PART_BYTES <= high - low <= limits.MAX_COPY_PART_BYTES for low, high in ranges)
    with pytest.raises(ValueError, match="at least"):
        stores.copy_ranges((5 << 20) - 1)


def test_a_scheme_grpo_cli_does_not_read_is_refused_before_any_work(tmp_path: Path, cli: Cli) -> None:
    unknown = cli("compute", "ftp://host/in.parquet", "-g", "group_id", "-o", tmp_path / "o.parquet")
    one_line_error(unknown, 2, "ftp://host/in.parquet", "not ftp://")


DUMPS = Path(__file__).resolve().parents[2] / "sample_data" / "dumps"
DUMP_FOLDERS = {  # the sample dump folder: the trainer that reads it
    "verl": "verl", "verl-v1": "verl", "trl": "trl", "nemo-rl": "nemo-rl", "roll": "roll",
    "slime/rollout_data": "slime", "skyrl": "skyrl", "prime-rl": "prime-rl", "areal/rollout": "areal",
    "open-instruct/rollouts": "open-instruct",
}  # fmt: skip


def upload_tree(s3: Any, folder: Path, prefix: str) -> None:
    for file in sorted(folder.rglob("*")):
        if file.is_file():
            s3.upload_file(str(file), "rollouts", f"{prefix}/{file.relative_to(folder).as_posix()}")


def comparable(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without what names where the dump was read from, or when."""
    summary = {k: v for k, v in summary.items() if k not in ("elapsed_seconds", "input", "warnings")}
    return summary


@pytest.mark.parametrize("name", list(DUMP_FOLDERS))
def test_a_trainers_dump_on_s3_reads_as_the_local_dump(s3: Any, cli: Cli, name: str) -> None:
    folder, trainer = DUMPS / name, DUMP_FOLDERS[name]
    upload_tree(s3, folder, f"dumps/{name}")
    uri = f"s3://rollouts/dumps/{name}/"
    local = cli("check", "--from", trainer, folder, "--summary-json", "-", "-q")
    remote = cli("check", "--from", trainer, uri, "--summary-json", "-", "-q")
    assert local.exit_code == remote.exit_code, remote.stderr
    local_summary, remote_summary = json.loads(local.stdout), json.loads(remote.stdout)
    assert comparable(remote_summary) == comparable(local_summary)
    assert remote_summary["input"]["path"] == uri
    assert remote_summary["input"]["from"] == local_summary["input"]["from"]
    assert [w.replace(str(folder), uri.rstrip("/")) for w in local_summary["warnings"]] == remote_summary[
        "warnings"
    ]


def test_a_bad_dump_on_s3_is_named_by_its_uri(s3: Any, cli: Cli, tmp_path: Path) -> None:
    s3.put_object(Bucket="rollouts", Key="dumps/verl/1.jsonl", Body=b'{"input": "q", "output": "a"}\n')
    result = cli("check", "--from", "verl", "s3://rollouts/dumps/verl/", "-q")
    line = one_line_error(result, 2, "s3://rollouts/dumps/verl")
    assert "grpo-cli-spool" not in line and "/tmp" not in line


@pytest.mark.slow
def test_both_engines_write_the_same_data_from_s3_to_s3(s3: Any, s3_server: S3Server, tmp_path: Path) -> None:
    """The issue's command on each engine, as whole processes (Ray's workers take the
    environment they start with): the same rows and advantages, bit for bit."""
    import importlib.util
    import os

    if importlib.util.find_spec("ray") is None:
        pytest.skip("the ray extra is not installed")
    rows = rollout_rows(n_groups=200, group_size=8, seed=5)
    for index in range(4):
        shard = write_parquet(tmp_path / f"part-{index}.parquet", rows[index * 450 : (index + 1) * 450])
        s3.upload_file(str(shard), "rollouts", f"run/part-{index}.parquet")
    compute_on_both_engines("s3://rollouts/run/", "s3://rollouts/out", {**os.environ, **s3_server.env})
    outputs = {
        engine: [fetch(s3, key, tmp_path / key.replace("/", "_")) for key in keys(s3, f"out-{engine}/")]
        for engine in ("local", "ray")
    }
    assert_engines_agree(outputs["local"], outputs["ray"], len(rows))
    assert not s3.list_multipart_uploads(Bucket="rollouts").get("Uploads")


def test_a_server_that_never_answers_fails_the_run_in_one_line(
    tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that takes connections and never answers: the client's read timeout and retries
    end the run (shortened here: 0.5 s, 2 attempts), one line, nothing written."""
    import socket
    import threading
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])  # read nothing, answer nothing
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    monkeypatch.setattr(stores.s3, "READ_TIMEOUT_SECONDS", 0.5)
    monkeypatch.setattr(stores.s3, "MAX_ATTEMPTS", 2)
    stores.s3._s3_client.cache_clear()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "k"),
        ("AWS_SECRET_ACCESS_KEY", "s"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    try:
        start = time.monotonic()
        result = cli("compute", "s3://rollouts/in.parquet", "-g", "uid", "-o", tmp_path / "out.parquet")
        elapsed = time.monotonic() - start
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        listener.close()
        stores.s3._s3_client.cache_clear()
    one_line_error(result, 2, "s3://rollouts/in.parquet", "does not answer")
    assert elapsed < 30
    assert not (tmp_path / "out.parquet").exists()


# A Ray cluster's workers write an object-store output themselves: the driver claims it from the
# write guard before it joins the cluster (the address below has no cluster: a refusal comes first).
ON_A_CLUSTER = ("--engine", "ray", "--ray-address", "127.0.0.1:1")


@pytest.mark.parametrize(
    "engine", [(), ("--engine", "ray"), ON_A_CLUSTER], ids=["local", "ray", "ray-cluster"]
)
def test_an_output_on_the_store_is_refused_where_the_guard_refuses_on_every_engine(
    s3: Any, tmp_path: Path, cli: Cli, engine: tuple[str, ...]
) -> None:
    """Before, the Ray engine protected no input on a store: --force over the input's folder
    replaced its shards (a local Ray instance) or added a second set (a cluster, whose workers
    wrote through Ray Data, which appends, also over an existing output without --force)."""
    three_shards_on_s3(s3, tmp_path)
    s3.put_object(Bucket="rollouts", Key="out/part-0.parquet", Body=b"an earlier run")
    before = sorted(keys(s3))
    compute = ("compute", "s3://rollouts/run/", "-g", "group_id")
    one_line_error(cli(*compute, "-o", "s3://rollouts/out/", *engine), 2, "holds objects", "--force")
    for output in ("s3://rollouts/run/", "s3://rollouts/run/sub/", "s3://rollouts/"):
        refused = cli(*compute, "-o", output, "-f", *engine)
        one_line_error(refused, 2, "would overwrite the input s3://rollouts/run", "refusing to write there")
    missing = cli(*compute, "-o", "s3://no-such-bucket/out/", *engine)
    one_line_error(missing, 2, "the bucket 'no-such-bucket' does not exist")
    assert sorted(keys(s3)) == before


@pytest.mark.parametrize("engine", [(), ("--engine", "ray")], ids=["local", "ray"])
def test_a_file_uri_input_is_protected_as_its_local_path(
    tmp_path: Path, cli: Cli, engine: tuple[str, ...]
) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    write_parquet(folder / "part-0.parquet", rollout_rows())
    before = sorted(folder.iterdir())
    for output in (folder, folder / "out"):
        refused = cli("compute", folder.as_uri(), "-g", "group_id", "-o", output, "-f", *engine)
        one_line_error(refused, 2, "refusing to write there")
    assert sorted(folder.iterdir()) == before


def staged_shards(
    s3: Any, output: stores.S3Output, token: str = "0123456789ab"
) -> tuple[str, dict[str, bytes]]:
    """Two shards under the output's staging folder, as a cluster's workers leave them."""
    staging = output.staging_uri(token)
    shards = {"9f-000000-0.parquet": b"new shard 0" * 1000, "9f-000001-0.parquet": b"new shard 1"}
    for name, data in shards.items():
        s3.put_object(Bucket="rollouts", Key=stores.bucket_and_key(staging)[1] + name, Body=data)
    return staging, shards


def test_shards_staged_by_a_cluster_are_copied_into_place_in_the_store(s3: Any) -> None:
    old = previous_output("s3://rollouts/out/")
    for key, data in old.items():
        s3.put_object(Bucket="rollouts", Key=key, Body=data)
    output = stores.S3Output("s3://rollouts/out/", directory=True)
    staging, shards = staged_shards(s3, output)
    assert staging == "s3://rollouts/.out.0123456789ab.tmp/"  # beside the output: no reader sees it
    transfer = output.place_staged(staging)
    assert sorted(keys(s3)) == [f"out/{name}" for name in sorted(shards)]  # old shards and staging gone
    for name, data in shards.items():
        assert s3.get_object(Bucket="rollouts", Key=f"out/{name}")["Body"].read() == data
    assert transfer == {
        "uri": "s3://rollouts/out/",
        "objects": 2,
        "bytes_uploaded": sum(len(data) for data in shards.values()),
        "bytes_copied_in_store": 0,
        "uploaded_by": "workers",
    }
    nested = stores.S3Output("s3://rollouts/runs/7/out", directory=True)
    assert nested.staging_uri("0123456789ab") == "s3://rollouts/runs/7/.out.0123456789ab.tmp/"


def test_a_staged_output_cut_off_while_placed_leaves_what_was_there(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = previous_output("s3://rollouts/out/")
    for key, data in old.items():
        s3.put_object(Bucket="rollouts", Key=key, Body=data)
    output = stores.S3Output("s3://rollouts/out/", directory=True)
    staging, _ = staged_shards(s3, output)
    with (
        second_call_fails("CopyObject", monkeypatch),
        pytest.raises(GrpoError, match="connection reset by peer") as raised,
    ):
        output.place_staged(staging)
    assert "s3://rollouts/out" in raised.value.message
    assert sorted(keys(s3)) == sorted(old)  # the first copy removed, the staging folder too
    for key, data in old.items():
        assert s3.get_object(Bucket="rollouts", Key=key)["Body"].read() == data


def test_a_staged_shard_over_one_copys_limit_is_copied_in_ranged_parts(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3 copies at most 5 GiB in one request: above that, a multipart upload of ranged copies
    (the limit lowered here, to 8 MiB, for a 12 MiB shard: two parts of 6 MiB)."""
    monkeypatch.setattr(stores.s3, "MAX_COPY_PART_BYTES", 8 << 20)
    monkeypatch.setattr(stores.s3, "PART_BYTES", 8 << 20)
    output = stores.S3Output("s3://rollouts/out/", directory=True)
    staging = output.staging_uri("0123456789ab")
    data = np.random.default_rng(0).bytes(12 << 20)
    s3.put_object(Bucket="rollouts", Key=".out.0123456789ab.tmp/big.parquet", Body=data)
    output.place_staged(staging)
    assert s3.head_object(Bucket="rollouts", Key="out/big.parquet")["ETag"].endswith('-2"')  # two parts
    assert s3.get_object(Bucket="rollouts", Key="out/big.parquet")["Body"].read() == data
    assert keys(s3) == ["out/big.parquet"]
    assert not s3.list_multipart_uploads(Bucket="rollouts").get("Uploads")


@pytest.mark.slow
def test_both_engines_splice_s3_to_s3_copying_the_column_chunks_in_the_store(
    s3: Any, s3_server: S3Server, tmp_path: Path
) -> None:
    """The issue's command on each engine, as whole processes: the Ray engine's tasks splice
    each object as the local engine does (before, it re-encoded every column of an input on a
    store), so both write the same bytes and upload only the new column chunks and footers, the
    input's bytes copied inside the store."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("ray") is None:
        pytest.skip("the ray extra is not installed")
    sizes = 0
    for index in range(2):
        shard = big_rollouts(tmp_path / f"part-{index}.parquet", seed=index)
        sizes += shard.stat().st_size
        s3.upload_file(str(shard), "rollouts", f"run/part-{index}.parquet")
    summaries = {}
    for engine in ("local", "ray"):
        summary = tmp_path / f"{engine}.json"
        command = [sys.executable, "-m", "grpo_cli", "compute", "s3://rollouts/run/", "-g", "uid", "-q",
                   "-o", f"s3://rollouts/out-{engine}/", "--engine", engine,
                   "--summary-json", str(summary)]  # fmt: skip
        done = subprocess.run(
            command, env={**os.environ, **s3_server.env}, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, (engine, done.stderr)
        summaries[engine] = json.loads(summary.read_text())["output"]
    for index in range(2):
        key = f"part-{index}.parquet"
        local, ray = (s3.get_object(Bucket="rollouts", Key=f"out-{engine}/{key}")["Body"].read()
                      for engine in ("local", "ray"))  # fmt: skip
        assert local == ray, index
    local, ray = summaries["local"], summaries["ray"]
    assert ray["method"] == local["method"] == "splice"
    assert (
        ray["transfer"]["bytes_copied_in_store"] == local["transfer"]["bytes_copied_in_store"] > 0.9 * sizes
    )
    assert ray["transfer"]["bytes_uploaded"] == local["transfer"]["bytes_uploaded"] < 0.1 * sizes
    assert not s3.list_multipart_uploads(Bucket="rollouts").get("Uploads")


def test_the_ray_driver_reads_each_objects_footer_once_and_side_by_side(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing an input folder reads each object's footer (its rows and schema) 16 at a time,
    and the schema check reuses it: one after the other, three passes of a request each cost
    200 objects behind a 20 ms round trip 34.6 s of the driver's time before any work (3.3 s now)."""
    from grpo_cli.engines import ray as ray_engine
    from grpo_cli.options.config import ComputeConfig
    from grpo_cli.run.plan import RunPlan

    three_shards_on_s3(s3, tmp_path)
    with contextlib.ExitStack() as staging:
        inputs = ray_engine.resolve_inputs("s3://rollouts/run/", staging=staging)
    assert [file.rows for file in inputs.files] == [40, 40, 40]
    monkeypatch.setattr(
        ray_engine.inputs, "_open_file", lambda file: pytest.fail(f"{file.source} read again")
    )
    config = ComputeConfig(group_cols=("group_id",))
    schemas = ray_engine.inputs._read_schemas(inputs.files, RunPlan(config, device=ray_engine.fields._CPU))
    assert [schema.names for schema in schemas] == [["group_id", "step", "text", "correct", "reward"]] * 3


def test_side_by_side_requests_keep_the_order_and_raise_the_first_error() -> None:
    import threading
    import time

    from grpo_cli.engines.ray import side_by_side_requests

    threads = set()

    def read(item: int) -> int:
        threads.add(threading.get_ident())
        time.sleep(0.01 * (5 - item))  # the later items finish first
        if item >= 3:
            raise OSError(f"object {item} is gone")
        return item * 10

    assert side_by_side_requests(read, [0, 1, 2]) == [0, 10, 20]
    assert len(threads) > 1
    with pytest.raises(OSError, match="object 3 is gone"):
        side_by_side_requests(read, [0, 1, 2, 3, 4])
