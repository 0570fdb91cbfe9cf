"""gs:// inputs and outputs against a real GCS API server on loopback (gcp-storage-emulator's):
runs equal to the local ones, objects that appear whole or not at all, and what goes wrong
on the store said in one line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import Result

from grpo_cli import stores
from grpo_cli.errors import GrpoError
from tests.conftest import assert_same_rows, one_line_error, rollout_rows, write_parquet
from tests.integration.conftest import (
    GcsServer,
    assert_dump_checks_as_local,
    assert_engines_agree,
    compute_on_both_engines,
    free_port,
    pq_without_provenance,
    previous_output,
)

Cli = Callable[..., Result]
DUMPS = Path(__file__).resolve().parents[2] / "sample_data" / "dumps"


def objects(gcs: Any, prefix: str = "") -> list[str]:
    """The bucket's object names under ``prefix``."""
    gcs.invalidate_cache()
    return sorted(name.split("/", 1)[1] for name in gcs.find(f"rollouts/{prefix}"))


def fetch(gcs: Any, name: str, target: Path) -> Path:
    gcs.get_file(f"rollouts/{name}", str(target))
    return target


def three_shards(gcs: Any, tmp_path: Path) -> Path:
    """gs://rollouts/run/ holding part-0 to part-2.parquet, 40 rows each; the local folder."""
    rows = rollout_rows(n_groups=30, group_size=4, seed=3)
    folder = tmp_path / "run"
    folder.mkdir()
    for index in range(3):
        shard = write_parquet(folder / f"part-{index}.parquet", rows[index * 40 : (index + 1) * 40])
        gcs.put_file(str(shard), f"rollouts/run/part-{index}.parquet")
    return folder


def test_gs_to_gs_is_the_local_run_uploaded_whole(gcs: Any, tmp_path: Path, cli: Cli) -> None:
    source = write_parquet(tmp_path / "run.parquet", rollout_rows(n_groups=50, group_size=8, seed=2))
    gcs.put_file(str(source), "rollouts/run/step-1.parquet")
    local = tmp_path / "local.parquet"
    assert cli("compute", source, "-g", "group_id", "-o", local, "-q").exit_code == 0

    summary_path = tmp_path / "summary.json"
    result = cli(
        "compute", "gs://rollouts/run/step-1.parquet", "-g", "group_id",
        "-o", "gs://rollouts/out/step-1.parquet", "--summary-json", summary_path,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    remote = fetch(gcs, "out/step-1.parquet", tmp_path / "remote.parquet")
    assert_same_rows(
        pq_without_provenance(local, tmp_path / "a.parquet"),
        pq_without_provenance(remote, tmp_path / "b.parquet"),
    )
    summary = json.loads(summary_path.read_text())
    assert summary["input"]["path"] == "gs://rollouts/run/step-1.parquet"
    assert summary["output"]["method"] == "splice"
    assert summary["output"]["transfer"] == {
        "uri": "gs://rollouts/out/step-1.parquet",
        "objects": 1,
        "bytes_uploaded": remote.stat().st_size,  # GCS copies no byte range: every byte is sent
        "bytes_copied_in_store": 0,
    }
    assert "uploaded" in result.stderr and "copied in the store" not in result.stderr
    assert "Could not determine" not in result.stderr  # gcsfs's own log lines stay off the terminal
    assert objects(gcs) == ["out/step-1.parquet", "run/step-1.parquet"]


def test_a_folder_to_a_folder_one_object_per_shard_and_a_summary(gcs: Any, tmp_path: Path, cli: Cli) -> None:
    folder = three_shards(gcs, tmp_path)
    gcs.pipe_file("rollouts/run/_SUCCESS", b"")  # Spark's marker: not a shard
    local = cli("compute", folder, "-g", "group_id", "-o", tmp_path / "local", "--summary-json", "-", "-q")
    assert local.exit_code == 0, local.stderr
    result = cli(
        "compute", "gs://rollouts/run/", "-g", "group_id", "-o", "gs://rollouts/out/",
        "--summary-json", "gs://rollouts/reports/summary.json", "-q",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    assert objects(gcs, "out/") == [f"out/part-{index}.parquet" for index in range(3)]
    for index in range(3):
        remote = fetch(gcs, f"out/part-{index}.parquet", tmp_path / f"remote-{index}.parquet")
        assert pq.read_table(remote).equals(pq.read_table(tmp_path / "local" / f"part-{index}.parquet"))
    summary = json.loads(gcs.cat_file("rollouts/reports/summary.json"))
    assert summary["groups"] == json.loads(local.stdout)["groups"]
    assert summary["output"]["path"] == "gs://rollouts/out/"


def test_check_reads_a_trainers_dump_on_gcs_as_the_local_dump(gcs: Any, cli: Cli) -> None:
    folder = DUMPS / "verl"
    for file in sorted(folder.rglob("*")):
        if file.is_file():
            gcs.put_file(str(file), f"rollouts/dumps/verl/{file.relative_to(folder).as_posix()}")
    assert_dump_checks_as_local(cli, "verl", folder, "gs://rollouts/dumps/verl/")


def test_an_existing_object_or_folder_is_replaced_only_with_force(gcs: Any, tmp_path: Path, cli: Cli) -> None:
    three_shards(gcs, tmp_path)
    gcs.pipe_file("rollouts/out.parquet", b"keep me")
    refused = cli("compute", "gs://rollouts/run/", "-g", "group_id", "-o", "gs://rollouts/out.parquet")
    one_line_error(refused, 2, "gs://rollouts/out.parquet", "exists", "--force")
    assert gcs.cat_file("rollouts/out.parquet") == b"keep me"

    gcs.pipe_file("rollouts/old/part-9.parquet", b"an old shard")
    kept = cli("compute", "gs://rollouts/run/", "-g", "group_id", "-o", "gs://rollouts/old/")
    one_line_error(kept, 2, "gs://rollouts/old/", "holds objects", "--force")
    forced = cli("compute", "gs://rollouts/run/", "-g", "group_id", "-o", "gs://rollouts/old/", "-f", "-q")
    assert forced.exit_code == 0, forced.stderr
    # the stale shard of the replaced folder goes: the folder is this run's output only
    assert objects(gcs, "old/") == [f"old/part-{index}.parquet" for index in range(3)]

    gcs.pipe_file("rollouts/mixed/notes.txt", b"not a shard")
    mixed = cli("compute", "gs://rollouts/run/", "-g", "group_id", "-o", "gs://rollouts/mixed/", "-f")
    one_line_error(mixed, 2, "gs://rollouts/mixed/", "notes.txt, which is not a Parquet shard")
    assert objects(gcs, "mixed/") == ["mixed/notes.txt"]


def test_a_missing_bucket_or_object_is_one_line(gcs: Any, tmp_path: Path, cli: Cli) -> None:
    source = write_parquet(tmp_path / "in.parquet", rollout_rows())
    gcs.put_file(str(source), "rollouts/in.parquet")
    missing_object = cli("check", "gs://rollouts/nothing.parquet", "-g", "group_id")
    one_line_error(missing_object, 2, "gs://rollouts/nothing.parquet", "no such file or folder")
    missing_bucket = cli("check", "gs://no-such-bucket/in.parquet", "-g", "group_id")
    one_line_error(missing_bucket, 2, "gs://no-such-bucket/in.parquet")
    missing_output = cli(
        "compute", "gs://rollouts/in.parquet", "-g", "group_id", "-o", "gs://elsewhere/o.parquet"
    )
    one_line_error(missing_output, 2, "gs://elsewhere/o.parquet", "'elsewhere' does not exist")
    bare = cli("compute", "gs://rollouts/in.parquet", "-g", "group_id", "-o", "gs://elsewhere")
    one_line_error(bare, 2, "gs://elsewhere", "name the object to write")
    assert objects(gcs) == ["in.parquet"]


@pytest.mark.parametrize("output", ["gs://rollouts/in.parquet", "gs://rollouts/"])
def test_an_output_over_an_input_on_gcs_is_refused(gcs: Any, tmp_path: Path, cli: Cli, output: str) -> None:
    source = write_parquet(tmp_path / "in.parquet", rollout_rows())
    gcs.put_file(str(source), "rollouts/in.parquet")
    refused = cli("compute", "gs://rollouts/in.parquet", "-g", "group_id", "-o", output, "-f")
    one_line_error(refused, 2, "would overwrite the input gs://rollouts/in.parquet")
    assert gcs.cat_file("rollouts/in.parquet") == source.read_bytes()


def test_an_upload_cut_off_never_becomes_an_object(gcs: Any, tmp_path: Path) -> None:
    """Whatever ends an upload early (here its progress callback raises once 2 MiB are sent),
    what was sent is never finalised into an object; an upload that ends is the file's bytes."""
    import os

    file = tmp_path / "shard.parquet"
    file.write_bytes(os.urandom((3 << 20) + 12345))
    output = stores.GcsOutput("gs://rollouts/out/shard.parquet", directory=False)
    sent: list[int] = []

    def cut_off(size: int) -> None:
        sent.append(size)
        if sum(sent) >= 2 << 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        output._upload(file, "rollouts/out/shard.parquet", cut_off)
    assert sum(sent) >= 2 << 20 and objects(gcs) == []
    sent.clear()
    assert output._upload(file, "rollouts/out/shard.parquet", sent.append) == file.stat().st_size
    assert sum(sent) == file.stat().st_size
    assert gcs.cat_file("rollouts/out/shard.parquet") == file.read_bytes()


@pytest.mark.parametrize("failure", [KeyboardInterrupt, OSError])
def test_a_run_that_fails_mid_upload_leaves_no_object(
    gcs: Any, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch, failure: type[BaseException]
) -> None:
    """The second shard's upload is cut off after its first bytes were sent: the first
    shard, already whole, is removed, and the second never becomes an object."""
    three_shards(gcs, tmp_path)
    real_write = stores.base.COPY_CHUNK
    monkeypatch.setattr(stores.gcs, "COPY_CHUNK", 1024)  # many writes a shard
    calls = []
    real_open = type(gcs).open

    def cut_off(self: Any, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        handle = real_open(self, path, mode, **kwargs)
        if "w" not in mode:
            return handle
        calls.append(path)
        if len(calls) == 2:
            real = handle.write

            def write(data: bytes) -> int:
                if handle.tell() + len(data) > 2048:
                    handle.flush(force=True)  # what was written so far is on the server
                    raise failure("connection reset by peer")
                return int(real(data))

            handle.write = write
        return handle

    monkeypatch.setattr(type(gcs), "open", cut_off)
    result = cli("compute", "gs://rollouts/run/", "-g", "group_id", "-o", "gs://rollouts/out/")
    if failure is KeyboardInterrupt:
        assert result.exit_code == 130, result.stderr
    else:
        one_line_error(result, 2, "gs://rollouts/out/", "cannot upload the output", "connection reset")
    assert len(calls) == 2 and real_write > 1024
    assert objects(gcs, "out/") == []
    assert objects(gcs, "run/") == [f"run/part-{index}.parquet" for index in range(3)]


@pytest.mark.parametrize("output", ["gs://rollouts/out.parquet", "gs://rollouts/out/"])
def test_a_forced_run_that_fails_leaves_what_it_was_to_replace(
    gcs: Any, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    """--force replaces what is there only once the whole output is up: a run whose upload is
    cut off leaves the old object, or the old folder's every shard, as they were."""
    three_shards(gcs, tmp_path)
    old = previous_output(output)
    for name, data in old.items():
        gcs.pipe_file(f"rollouts/{name}", data)
    uploads = []

    def cut_off(self: stores.GcsOutput, file: Path, target: str, progress: Any) -> int:
        uploads.append(target)
        if len(uploads) == len(old):  # the last file's upload: every other one is up
            raise OSError("connection reset by peer")
        return real_upload(self, file, target, progress)

    real_upload = stores.GcsOutput._upload
    monkeypatch.setattr(stores.GcsOutput, "_upload", cut_off)
    result = cli("compute", "gs://rollouts/run/", "-g", "group_id", "-o", output, "-f")
    one_line_error(result, 2, output, "connection reset by peer")
    assert sorted(objects(gcs)) == sorted([*old, *(f"run/part-{index}.parquet" for index in range(3))])
    for name, data in old.items():
        assert gcs.cat_file(f"rollouts/{name}") == data


def test_a_failure_while_placing_the_files_leaves_no_object_of_the_run(
    gcs: Any, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every shard is up and the second copy into place fails: the first, already placed, and
    every staged object are removed; nothing hidden is left behind."""
    three_shards(gcs, tmp_path)
    copies = []
    store = stores.gcs_filesystem()  # the run's own (fsspec binds copy to each instance)
    real_copy = store.copy

    def flaky(source: str, target: str, **kwargs: Any) -> Any:
        copies.append(target)
        if len(copies) == 2:
            raise OSError("connection reset by peer")
        return real_copy(source, target, **kwargs)

    monkeypatch.setattr(store, "copy", flaky)
    result = cli("compute", "gs://rollouts/run/", "-g", "group_id", "-o", "gs://rollouts/out/")
    one_line_error(result, 2, "gs://rollouts/out/", "connection reset by peer")
    assert copies == ["rollouts/out/part-0.parquet", "rollouts/out/part-1.parquet"]
    assert objects(gcs, "out/") == []


def test_a_staged_object_that_vanishes_is_named_not_taken_for_a_missing_bucket(
    gcs: Any, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Something removes a staged shard before it is copied into place: the run ends in one
    line that says the object was not found (the bucket is there), and leaves nothing."""
    three_shards(gcs, tmp_path)
    store = stores.gcs_filesystem()
    real_copy = store.copy

    def vanished(source: str, target: str, **kwargs: Any) -> Any:
        if target.endswith("part-1.parquet"):
            store.rm(source)
        return real_copy(source, target, **kwargs)

    monkeypatch.setattr(store, "copy", vanished)
    result = cli("compute", "gs://rollouts/run/", "-g", "group_id", "-o", "gs://rollouts/out/")
    message = one_line_error(result, 2, "gs://rollouts/out/", "not found")
    assert "does not exist" not in message
    assert objects(gcs, "out/") == []


def test_what_a_killed_run_staged_is_replaced_not_refused(gcs: Any, tmp_path: Path, cli: Cli) -> None:
    """A run killed outright (SIGKILL) leaves its staged objects, hidden, in the folder: the
    next run to that folder is not refused for them, and removes them with --force."""
    three_shards(gcs, tmp_path)
    leftover = "out/.part-0.parquet.0123456789ab.tmp"
    gcs.pipe_file(f"rollouts/{leftover}", b"half a shard")
    result = cli("compute", "gs://rollouts/run/", "-g", "group_id", "-o", "gs://rollouts/out/", "-f", "-q")
    assert result.exit_code == 0, result.stderr
    assert objects(gcs, "out/") == [f"out/part-{index}.parquet" for index in range(3)]


def test_a_server_that_is_gone_is_one_line(tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """gcsfs tries each request 6 times, waiting about 1, 2, 4, 8 then 16 s between tries, then
    the run ends in one line; here the waits are skipped (and counted)."""
    import types

    retry = pytest.importorskip("gcsfs.retry")
    waits: list[float] = []

    async def no_wait(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(retry, "asyncio", types.SimpleNamespace(sleep=no_wait))
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")
    source = write_parquet(tmp_path / "in.parquet", rollout_rows())
    result = cli("compute", source, "-g", "group_id", "-o", "gs://rollouts/out.parquet")
    one_line_error(result, 2, "gs://rollouts/out.parquet", "cannot write the output there")
    assert len(waits) >= 5 and not (tmp_path / "out.parquet").exists()


@pytest.mark.slow
def test_both_engines_read_and_write_gcs_with_the_same_data(
    gcs: Any, gcs_server: GcsServer, tmp_path: Path
) -> None:
    """``compute gs://rollouts/run/ -o gs://rollouts/out-ENGINE/`` on each engine, as whole
    processes (Ray's workers take the environment they start with): the Ray engine lists and
    reads gs:// through the same gcsfs file system, and its output goes through the same guard;
    the same rows and advantages, bit for bit."""
    import os

    pytest.importorskip("ray")
    rows = rollout_rows(n_groups=200, group_size=8, seed=5)
    for index in range(4):
        shard = write_parquet(tmp_path / f"part-{index}.parquet", rows[index * 450 : (index + 1) * 450])
        gcs.put_file(str(shard), f"rollouts/run/part-{index}.parquet")
    compute_on_both_engines("gs://rollouts/run/", "gs://rollouts/out", {**os.environ, **gcs_server.env})
    outputs = {
        engine: [
            fetch(gcs, name, tmp_path / name.replace("/", "_")) for name in objects(gcs, f"out-{engine}/")
        ]
        for engine in ("local", "ray")
    }
    assert_engines_agree(outputs["local"], outputs["ray"], len(rows))


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (403, "access denied when trying to write the output there (Forbidden: b/out.parquet"),
        (401, "access denied when trying to write the output there (Invalid Credentials"),
        (500, "cannot write the output there (Backend Error"),
    ],
)
def test_gcs_errors_are_told_by_their_status_not_by_digits_in_the_text(status: int, expected: str) -> None:
    """The errors are gcsfs's own (``validate_response``, as it raises them for each status):
    a 401 or 403 is access denied, anything else says what failed; a connection refused on a
    port whose number holds 403 is not access denied (it was, whenever the loopback server's
    free port did)."""
    retry = pytest.importorskip("gcsfs.retry")
    output = stores.GcsOutput("gs://b/out.parquet", directory=False)
    content = {
        403: b"forbidden",
        401: b'{"error": {"message": "Invalid Credentials"}}',
        500: b"Backend Error",
    }
    with pytest.raises(GrpoError) as error, output._errors("write the output there"):
        retry.validate_response(status, content[status], "b/out.parquet")
    assert expected in error.value.message
    refused = OSError("Cannot connect to host 127.0.0.1:42403 ssl:default [Connect call failed]")
    with pytest.raises(GrpoError) as error, output._errors("write the output there"):
        raise refused
    assert error.value.message.startswith("gs://b/out.parquet: cannot write the output there (Cannot connect")


@pytest.mark.parametrize("fail", [False, True], ids=["placed", "cut-off"])
def test_shards_staged_by_a_cluster_are_copied_into_place_or_none(
    gcs: Any, monkeypatch: pytest.MonkeyPatch, fail: bool
) -> None:
    """A Ray cluster's workers write gs:// shards to a hidden folder beside the output; the
    driver copies them into place inside the store and removes the replaced shards and the
    staging folder, or (a copy cut off) removes what it placed and staged, leaving the old
    output as it was (the neighbour of the s3:// tests)."""
    old = previous_output("gs://rollouts/out/")
    for name, data in old.items():
        gcs.pipe_file(f"rollouts/{name}", data)
    output = stores.GcsOutput("gs://rollouts/out/", directory=True)
    staging = output.staging_uri("0123456789ab")
    assert staging == "gs://rollouts/.out.0123456789ab.tmp/"
    shards = {"9f-000000-0.parquet": b"new shard 0" * 1000, "9f-000001-0.parquet": b"new shard 1"}
    for name, data in shards.items():
        gcs.pipe_file(f"rollouts/.out.0123456789ab.tmp/{name}", data)
    if fail:
        real_copy, copies = output.fs.copy, []

        def cut_off(source: str, target: str, **kwargs: Any) -> Any:
            copies.append(target)
            if len(copies) == 2:
                raise OSError("connection reset by peer")
            return real_copy(source, target, **kwargs)

        monkeypatch.setattr(output.fs, "copy", cut_off)
        with pytest.raises(GrpoError, match="connection reset by peer"):
            output.place_staged(staging)
        assert objects(gcs) == sorted(old)
        for name, data in old.items():
            assert gcs.cat_file(f"rollouts/{name}") == data
        return
    transfer = output.place_staged(staging)
    assert objects(gcs) == [f"out/{name}" for name in sorted(shards)]
    for name, data in shards.items():
        assert gcs.cat_file(f"rollouts/out/{name}") == data
    assert transfer["objects"] == 2 and transfer["uploaded_by"] == "workers"
    assert transfer["bytes_uploaded"] == sum(len(data) for data in shards.values())
