"""hf:// inputs against a Hugging Face Hub on loopback (:mod:`tests.hub_server`): a dataset repo's
files and folders read as the local ones, at the revision the URI names, a trainer's dump, and
what the Hub refuses said in one line."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import Result

from tests.conftest import assert_same_rows, one_line_error, rollout_rows, write_parquet
from tests.integration.conftest import (
    assert_dump_checks_as_local,
    assert_engines_agree,
    compute_on_both_engines,
    free_port,
    point_huggingface_hub_at,
    pq_without_provenance,
)

Cli = Callable[..., Result]
DUMPS = Path(__file__).resolve().parents[2] / "sample_data" / "dumps"


def parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue()


def two_shards(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A local folder of two Parquet shards, and a repo's files holding them under data/ beside
    what a dataset repo holds at its root."""
    rows = rollout_rows(n_groups=20, group_size=4, seed=5)
    folder = tmp_path / "local"
    folder.mkdir()
    files = {"README.md": b"---\nlicense: mit\n---\n", ".gitattributes": b"*.parquet filter=lfs\n"}
    for index in range(2):
        shard = write_parquet(folder / f"part-{index}.parquet", rows[index * 40 : (index + 1) * 40])
        files[f"data/part-{index}.parquet"] = shard.read_bytes()
    return folder, files


def test_a_repos_folder_and_file_compute_as_the_local_ones(hub: Any, tmp_path: Path, cli: Cli) -> None:
    folder, files = two_shards(tmp_path)
    hub.repos["me/run"] = {"main": files}
    local = cli(
        "compute", folder, "-g", "group_id", "-o", tmp_path / "local-out", "--summary-json", "-", "-q"
    )
    assert local.exit_code == 0, local.stderr
    remote = cli(
        "compute", "hf://datasets/me/run/data/", "-g", "group_id", "-o", tmp_path / "out",
        "--summary-json", "-", "-q",
    )  # fmt: skip
    assert remote.exit_code == 0, remote.stderr
    for index in range(2):
        name = f"part-{index}.parquet"
        assert pq.read_table(tmp_path / "out" / name).equals(pq.read_table(tmp_path / "local-out" / name))
    summary, local_summary = json.loads(remote.stdout), json.loads(local.stdout)
    assert summary["input"]["path"] == "hf://datasets/me/run/data/"
    assert (summary["groups"], summary["active_groups"]) == (
        local_summary["groups"],
        local_summary["active_groups"],
    )

    one = cli(
        "check", "hf://datasets/me/run/data/part-1.parquet", "-g", "group_id", "--summary-json", "-", "-q"
    )
    assert one.exit_code == 0, one.stderr
    assert json.loads(one.stdout)["rows"] == 40


def test_the_revision_the_uri_names_is_the_one_read(hub: Any, tmp_path: Path, cli: Cli) -> None:
    """``owner/name@rev``: its listing and its bytes, never the main branch's."""
    rows = rollout_rows(n_groups=6, group_size=4, seed=1)
    changed = [{**row, "reward": 1.0 - row["reward"]} for row in rows]
    hub.repos["me/run"] = {
        "main": {"data/step.parquet": parquet_bytes(rows)},
        "v1": {"data/step.parquet": parquet_bytes(changed)},
    }
    for uri in ("hf://datasets/me/run@v1/data/", "hf://datasets/me/run@v1/data/step.parquet"):
        hub.requests.clear()
        result = cli("compute", uri, "-g", "group_id", "-o", tmp_path / "out.parquet", "-f", "-q")
        assert result.exit_code == 0, result.stderr
        assert pq.read_table(tmp_path / "out.parquet").column("reward").to_pylist() == [
            r["reward"] for r in changed
        ]
        downloads = [request for request in hub.requests if "/resolve/" in request]
        assert downloads == ["GET /datasets/me/run/resolve/v1/data/step.parquet"]
    missing = cli("check", "hf://datasets/me/run@v2/data/", "-g", "group_id")
    one_line_error(missing, 2, "hf://datasets/me/run@v2/data/", "no such file or folder")


def test_a_folder_read_again_is_listed_again(hub: Any, tmp_path: Path) -> None:
    """A program that reads a repo's folder, then again once a shard was pushed, reads the new
    shard too: huggingface_hub's file system keeps its listings for the life of an instance,
    which fsspec otherwise shares between calls."""
    from grpo_cli.jobs import compute_dataset

    _, files = two_shards(tmp_path)
    hub.repos["me/run"] = {"main": {name: data for name, data in files.items() if "part-1" not in name}}
    first = compute_dataset("hf://datasets/me/run/data/", tmp_path / "first", force=True)
    hub.repos["me/run"]["main"]["data/part-1.parquet"] = files["data/part-1.parquet"]
    second = compute_dataset("hf://datasets/me/run/data/", tmp_path / "second", force=True)
    assert (first.rows, second.rows) == (40, 80)


def test_a_trainers_dump_on_the_hub_checks_as_the_local_dump(hub: Any, cli: Cli) -> None:
    folder = DUMPS / "verl"
    files = {
        f"dumps/verl/{file.relative_to(folder).as_posix()}": file.read_bytes()
        for file in sorted(folder.rglob("*"))
        if file.is_file()
    }
    hub.repos["me/run"] = {"main": files}
    assert_dump_checks_as_local(cli, "verl", folder, "hf://datasets/me/run/dumps/verl/")


@pytest.mark.parametrize(
    ("status", "code", "fragments"),
    [
        (404, "RepoNotFound", ("no such file or folder",)),
        (401, "RepoNotFound", ("the Hub shows no such repo without a token (HF_TOKEN)", "HTTP 401")),
        (403, "GatedRepo", ("a gated repo", "HTTP 403", "accept its conditions", "HF_TOKEN")),
        (500, "Internal", ("cannot list it", "500")),
    ],
)
def test_what_the_hub_refuses_is_one_line(
    hub: Any, tmp_path: Path, cli: Cli, status: int, code: str, fragments: tuple[str, ...]
) -> None:
    hub.repos["me/run"] = {"main": {"data/step.parquet": parquet_bytes(rollout_rows())}}
    hub.refusal = (status, code)
    for uri in ("hf://datasets/me/run/data/", "hf://datasets/me/run/data/step.parquet"):
        result = cli("compute", uri, "-g", "group_id", "-o", tmp_path / "out.parquet")
        one_line_error(result, 2, uri, *fragments)
        dump = cli("check", "--from", "verl", uri)
        one_line_error(dump, 2, uri, *fragments)
    assert not (tmp_path / "out.parquet").exists()


def test_a_missing_file_or_repo_is_one_line(hub: Any, cli: Cli) -> None:
    hub.repos["me/run"] = {"main": {"data/step.parquet": parquet_bytes(rollout_rows())}}
    for uri in ("hf://datasets/me/run/data/nothing.parquet", "hf://datasets/me/none/data/"):
        one_line_error(cli("check", uri, "-g", "group_id"), 2, uri, "no such file or folder")


def test_a_hub_that_is_gone_is_one_line(hub: Any, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    point_huggingface_hub_at(f"http://127.0.0.1:{free_port()}", monkeypatch)
    result = cli("check", "hf://datasets/me/run/data/", "-g", "group_id")
    one_line_error(result, 2, "hf://datasets/me/run/data/", "cannot list it")


def test_a_download_that_keeps_failing_is_one_line_after_the_retries(
    hub: Any, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """huggingface_hub tries a download 6 times, waiting 1, 2, 4, 8 and 8 s, and logs a warning
    at each: the run ends in one line, the warnings unsaid (the waits are skipped, and counted)."""
    import types

    from huggingface_hub.utils import _http

    waits: list[float] = []
    monkeypatch.setattr(_http, "time", types.SimpleNamespace(sleep=waits.append))
    hub.repos["me/run"] = {"main": {"data/step.parquet": parquet_bytes(rollout_rows())}}
    hub.download_refusal = (503, "Unavailable")
    caplog.set_level("WARNING")
    result = cli("compute", "hf://datasets/me/run/data/", "-g", "group_id", "-o", tmp_path / "out.parquet")
    one_line_error(result, 2, "hf://datasets/me/run/data/step.parquet", "cannot read it", "503")
    assert len(waits) == 5 and not (tmp_path / "out.parquet").exists()
    # huggingface_hub's own handler writes them to the terminal, where CliRunner does not look
    assert [
        record.getMessage() for record in caplog.records if record.name.startswith("huggingface_hub")
    ] == []


@pytest.mark.slow
def test_both_engines_read_and_write_a_repo_with_the_same_data(hub: Any, tmp_path: Path) -> None:
    """``compute hf://datasets/me/run/data/ -o hf://datasets/me/run/out-ENGINE/`` on each engine,
    as whole processes (``HF_ENDPOINT`` set for them): the Ray engine reads the repo's files
    through the same file system into private Parquet files, and its output is committed from
    this machine as the local engine's; the same rows and advantages, bit for bit, one commit
    each."""
    import os

    pytest.importorskip("ray")
    rows = rollout_rows(n_groups=100, group_size=8, seed=6)
    files = {
        f"data/part-{index}.parquet": parquet_bytes(rows[index * 200 : (index + 1) * 200])
        for index in range(4)
    }
    hub.repos["me/run"] = {"main": files}
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf-home")}
    compute_on_both_engines("hf://datasets/me/run/data/", "hf://datasets/me/run/out", env)
    outputs: dict[str, list[Path]] = {}
    for engine in ("local", "ray"):
        folder = tmp_path / engine
        folder.mkdir()
        prefix = f"out-{engine}/"
        for name, data in hub.repos["me/run"]["main"].items():
            if name.startswith(prefix):
                (folder / name[len(prefix) :]).write_bytes(data)
        outputs[engine] = sorted(folder.glob("*.parquet"))
    assert_engines_agree(outputs["local"], outputs["ray"], 800)
    assert hub.commits == {("me/run", "main"): 2}


# --------------------------------------------------------------------------- hf:// outputs


def test_a_file_output_is_one_commit_of_the_local_runs_file(hub: Any, tmp_path: Path, cli: Cli) -> None:
    source = write_parquet(tmp_path / "in.parquet", rollout_rows(n_groups=30, group_size=4, seed=8))
    hub.repos["me/out"] = {"main": {"README.md": b"# rollouts\n"}}
    local = cli("compute", source, "-g", "group_id", "-o", tmp_path / "local.parquet", "-q")
    assert local.exit_code == 0, local.stderr
    uri = "hf://datasets/me/out/advantages/step-1.parquet"
    result = cli("compute", source, "-g", "group_id", "-o", uri, "--summary-json", tmp_path / "s.json", "-q")
    assert result.exit_code == 0, result.stderr
    files = hub.repos["me/out"]["main"]
    assert sorted(files) == ["README.md", "advantages/step-1.parquet"]
    (tmp_path / "remote.parquet").write_bytes(files["advantages/step-1.parquet"])
    assert_same_rows(
        pq_without_provenance(tmp_path / "local.parquet", tmp_path / "a.parquet"),
        pq_without_provenance(tmp_path / "remote.parquet", tmp_path / "b.parquet"),
    )
    transfer = json.loads((tmp_path / "s.json").read_text())["output"]["transfer"]
    assert transfer["commit"] == hub.head("me/out", "main") and hub.commits == {("me/out", "main"): 1}
    assert transfer["bytes_uploaded"] == len(files["advantages/step-1.parquet"])

    again = cli("compute", source, "-g", "group_id", "-o", uri)
    one_line_error(again, 2, uri, "exists", "--force")
    assert hub.commits == {("me/out", "main"): 1}


def test_a_folder_output_replaces_the_old_shards_in_the_same_commit(
    hub: Any, tmp_path: Path, cli: Cli
) -> None:
    _, files = two_shards(tmp_path)
    hub.repos["me/run"] = {"main": files}
    hub.repos["me/out"] = {"main": {"out/part-9.parquet": b"an old shard", "keep.txt": b"x"}}
    refused = cli(
        "compute", "hf://datasets/me/run/data/", "-g", "group_id", "-o", "hf://datasets/me/out/out/"
    )
    one_line_error(refused, 2, "hf://datasets/me/out/out/", "holds objects", "--force")
    assert hub.commits == {}
    forced = cli(
        "compute", "hf://datasets/me/run/data/", "-g", "group_id", "-o", "hf://datasets/me/out/out/",
        "--summary-json", "hf://datasets/me/out/summary.json", "-f", "-q",
    )  # fmt: skip
    assert forced.exit_code == 0, forced.stderr
    written = hub.repos["me/out"]["main"]
    assert sorted(written) == ["keep.txt", "out/part-0.parquet", "out/part-1.parquet", "summary.json"]
    assert json.loads(written["summary.json"])["output"]["path"] == "hf://datasets/me/out/out/"
    assert hub.commits == {("me/out", "main"): 2}  # the shards (and the stale one's removal), the summary


@pytest.mark.parametrize(
    ("status", "code", "fragments"),
    [
        (403, "Forbidden", ("access denied when trying to commit the output", "HTTP 403")),
        (412, "PreconditionFailed", ("the branch moved while the run wrote", "nothing was committed")),
        (500, "Internal", ("cannot commit the output",)),
    ],
)
def test_a_refused_commit_is_one_line_and_changes_nothing(
    hub: Any, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch, status: int, code: str,
    fragments: tuple[str, ...],
) -> None:  # fmt: skip
    import types

    from huggingface_hub.utils import _http

    monkeypatch.setattr(_http, "time", types.SimpleNamespace(sleep=lambda seconds: None))
    source = write_parquet(tmp_path / "in.parquet", rollout_rows())
    hub.repos["me/out"] = {"main": {"README.md": b"# rollouts\n"}}
    hub.refuse_commits = (status, code)
    uri = "hf://datasets/me/out/step.parquet"
    one_line_error(cli("compute", source, "-g", "group_id", "-o", uri), 2, uri, *fragments)
    assert hub.repos["me/out"]["main"] == {"README.md": b"# rollouts\n"} and hub.commits == {}


def test_an_output_the_hub_cannot_take_is_refused_before_any_work(hub: Any, tmp_path: Path, cli: Cli) -> None:
    source = write_parquet(tmp_path / "in.parquet", rollout_rows())
    hub.repos["me/run"] = {"main": {"data/step.parquet": parquet_bytes(rollout_rows())}}
    cases = {
        "hf://datasets/me/none/out.parquet": "no such repo or branch on the Hub",
        "hf://datasets/me/run@nobranch/out.parquet": "no such repo or branch on the Hub",
        "hf://datasets/me/run/data/step.parquet": "exists",
        "hf://datasets/me/run": "name the file to write",
    }
    for uri, fragment in cases.items():
        one_line_error(cli("compute", source, "-g", "group_id", "-o", uri), 2, uri, fragment)
    for spelled in (
        "hf://datasets/me/run/data/",
        "hf://datasets/me/run@main/data/",  # the default branch, named
        "hf://datasets/me/run@refs%2Fheads%2Fmain/data/",
        "hf://datasets/me/run/./data/",
        "hf://datasets/Me/Run/data/step.parquet",  # compared in lower case, to be safe
    ):
        over = cli("compute", "hf://datasets/me/run/data/", "-g", "group_id", "-o", spelled, "-f")
        one_line_error(over, 2, spelled, "overwrite the input hf://datasets/me/run/data/")
    assert hub.repos["me/run"]["main"] == {"data/step.parquet": parquet_bytes(rollout_rows())}
    assert hub.commits == {}


def test_an_output_a_ray_clusters_workers_would_write_is_refused_when_claimed(hub: Any) -> None:
    """``--ray-address`` has the workers write the output's shards: one commit made from this
    machine cannot take them, so the claim is refused before the Hub is asked anything."""
    from grpo_cli.errors import GrpoError
    from grpo_cli.inputs.protected import ProtectedInputs
    from grpo_cli.outputs.guard import WriteGuard

    with WriteGuard(ProtectedInputs.of([])) as guard, pytest.raises(GrpoError) as refused:
        guard.claim("hf://datasets/me/out/out/", directory=True, force=False, written_elsewhere=True)
    assert "an hf:// output is one commit made from this machine" in refused.value.message
    assert "--ray-address" in refused.value.message and hub.requests == []
