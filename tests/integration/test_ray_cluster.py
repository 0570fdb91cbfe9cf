"""The Ray engine on a real multi-node cluster on loopback: a head and two worker nodes of one
CPU each (`ray start`), object stores capped below the data's size, started and stopped here.

The driver runs as its own process (`python -m grpo_cli ... --ray-address`): a test process
that already holds a local Ray instance (tests/integration/test_ray.py's) would reuse it instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import rollout_rows, write_parquet
from tests.integration.conftest import big_rollouts

if importlib.util.find_spec("ray") is None:
    pytest.skip("the ray extra is not installed", allow_module_level=True)

pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).with_name("ray"))
OBJECT_STORE_BYTES = 80 << 20  # per node; the data decodes to about twice that


STORE_ENV: dict[str, str] = {}  # a loopback S3 server's settings, where moto is installed


def clean_env() -> dict[str, str]:
    """This environment without a local Ray instance's auth settings (set by
    tests/integration/test_ray.py), and token authentication off for every node and client
    alike: Ray's nodes turn it on when they find a token in ``~/.ray/auth_token`` (one left
    there by any earlier Ray session), and its CLI then fails to reach them. The nodes and the
    driver reach the loopback S3 server (a worker takes its node's environment)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["RAY_AUTH_MODE"] = "disabled"
    return {**env, **STORE_ENV}


class LoopbackCluster:
    def __init__(self, workers: int) -> None:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.temp = Path(tempfile.mkdtemp(prefix="grpo-rc-", dir="/tmp"))  # short: Ray's socket paths
        self.nodes: list[subprocess.Popen[bytes]] = []
        self.log = open(self.temp / "nodes.log", "ab")  # noqa: SIM115 (closed by stop())
        common = ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1"]
        common += ["--object-store-memory", str(OBJECT_STORE_BYTES), "--disable-usage-stats"]
        self._start([RAY, "start", "--head", "--port", str(self.port), "--include-dashboard", "false",
                     "--temp-dir", str(self.temp), *common])  # fmt: skip
        self._wait_for(1)
        for index in range(workers):  # one at a time: two raylets starting at once on 2 cores time out
            self._start([RAY, "start", "--address", self.address, *common])
            self._wait_for(2 + index)

    def _start(self, command: list[str]) -> None:
        self.nodes.append(
            subprocess.Popen(
                command, env=clean_env(), stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    def _wait_for(self, nodes: int) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status = subprocess.run(
                [RAY, "status", "--address", self.address], env=clean_env(), capture_output=True, text=True
            )
            if status.returncode == 0 and status.stdout.count(" node_") >= nodes:
                return
            time.sleep(1)
        log = (self.temp / "nodes.log").read_text(errors="replace")[-3000:]
        self.stop()
        raise RuntimeError(f"the loopback Ray cluster did not reach {nodes} node(s):\n{log}")

    def kill(self, index: int) -> None:
        """Node ``index`` (0: the head) and every process it started, at once."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.nodes[index].pid, signal.SIGKILL)

    def stop(self) -> None:
        """Every process of the cluster, found by its session folder in its command line (a
        node's workers leave its process group), ended: SIGTERM, then SIGKILL after 5 s."""
        for node in self.nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGTERM)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self._processes():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 5
            while self._processes() and time.monotonic() < deadline:
                time.sleep(0.2)
        for node in self.nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
            node.wait()
        self.log.close()
        shutil.rmtree(self.temp, ignore_errors=True)

    def _processes(self) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                with contextlib.suppress(OSError):
                    if str(self.temp).encode() in (entry / "cmdline").read_bytes():
                        found.append(int(entry.name))
        return found


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[LoopbackCluster]:
    if importlib.util.find_spec("moto") is not None and importlib.util.find_spec("boto3") is not None:
        STORE_ENV.update(request.getfixturevalue("s3_server").env)  # before the nodes start
    cluster = LoopbackCluster(workers=2)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """240,000 rows in 6 shards with 640 bytes of text each (150 MiB of text: more than one
    node's object store holds), 30,000 uids spread over every shard."""
    folder = tmp_path_factory.mktemp("cluster_rollouts")
    rng = np.random.default_rng(11)
    rows, groups = 240_000, 30_000
    uids = np.array([f"{value:032x}" for value in rng.integers(0, 2**62, groups)])
    group = rng.permutation(np.repeat(np.arange(groups), rows // groups))
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", dtype=np.uint8)
    for shard in range(6):
        part = group[shard * 40_000 : (shard + 1) * 40_000]
        text = letters[rng.integers(0, letters.size, size=part.size * 640)].tobytes()
        offsets = np.arange(0, (part.size + 1) * 640, 640, dtype=np.int32)
        table = pa.table(
            {
                "uid": pa.array(uids[part]),
                "completion": pa.StringArray.from_buffers(
                    part.size, pa.py_buffer(offsets), pa.py_buffer(text)
                ),
                "reward": (rng.random(part.size) < 0.3).astype(np.float32),
            }
        )
        pq.write_table(table, folder / f"part-{shard}.parquet")
    return folder


def grpo(*args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "grpo_cli", *[str(a) for a in args]]
    return subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=600)


def read_folder(folder: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in sorted(folder.glob("*.parquet"))])


def test_a_three_node_cluster_computes_what_the_local_engine_does(
    cluster: LoopbackCluster, rollouts: Path, tmp_path: Path
) -> None:
    local = grpo("compute", rollouts, "-g", "uid", "-o", tmp_path / "local", "-q")
    assert local.returncode == 0, local.stderr
    ray = grpo("compute", rollouts, "-g", "uid", "-o", tmp_path / "ray", "-q", "--engine", "ray",
               "--ray-address", cluster.address, "--partitions", "6")  # fmt: skip
    assert ray.returncode == 0, ray.stderr
    assert read_folder(tmp_path / "ray").equals(read_folder(tmp_path / "local"))


def test_a_worker_node_killed_mid_job_leaves_a_whole_output_or_none(
    cluster: LoopbackCluster, rollouts: Path, tmp_path: Path
) -> None:
    assert grpo("compute", rollouts, "-g", "uid", "-o", tmp_path / "local", "-q").returncode == 0
    command = [sys.executable, "-m", "grpo_cli", "compute", str(rollouts), "-g", "uid", "-o",
               str(tmp_path / "ray"), "-q", "--engine", "ray", "--ray-address", cluster.address,
               "--partitions", "6"]  # fmt: skip
    job = subprocess.Popen(
        command, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    time.sleep(6)  # the statistics tasks are running on every node
    assert job.poll() is None, job.communicate()  # still running: the node dies mid-job
    cluster.kill(2)
    _, stderr = job.communicate(timeout=600)
    if job.returncode == 0:  # Ray ran the lost node's tasks again elsewhere
        assert read_folder(tmp_path / "ray").equals(read_folder(tmp_path / "local"))
    else:
        assert "Traceback" not in stderr
        assert stderr.strip().splitlines()[-1].startswith("error: "), stderr[-2000:]
        assert not (tmp_path / "ray").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_clusters_output_on_s3_is_staged_on_the_store_then_placed_whole(
    cluster: LoopbackCluster, tmp_path: Path
) -> None:
    """The workers write the shards to a hidden folder beside the output, and the driver copies
    them into place when every task is done. Before, they wrote into the output through Ray
    Data, which appends: a second run without --force added a second set of shards."""
    if not STORE_ENV:
        pytest.skip("the object-storage tests need moto[server] and boto3 (the dev extra)")
    import boto3

    s3 = boto3.client("s3", endpoint_url=STORE_ENV["AWS_ENDPOINT_URL"], region_name="us-east-1",
                      aws_access_key_id=STORE_ENV["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=STORE_ENV["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    bucket = f"cluster-{os.getpid()}"
    s3.create_bucket(Bucket=bucket)
    rows = rollout_rows(n_groups=3000, group_size=8, seed=9)
    (tmp_path / "run").mkdir()
    for index in range(3):
        shard = write_parquet(
            tmp_path / "run" / f"part-{index}.parquet", rows[index * 8000 : (index + 1) * 8000]
        )
        s3.upload_file(str(shard), bucket, f"run/part-{index}.parquet")

    def objects() -> dict[str, int]:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return {entry["Key"]: entry["Size"] for page in pages for entry in page.get("Contents", [])}

    def output() -> pa.Table:
        files = []
        for key in sorted(key for key in objects() if key.startswith("out/")):
            files.append(tmp_path / key.replace("/", "_"))
            s3.download_file(bucket, key, str(files[-1]))
        return pa.concat_tables([pq.read_table(f) for f in files])

    assert grpo("compute", tmp_path / "run", "-g", "group_id", "-o", tmp_path / "local", "-q").returncode == 0
    command = ("compute", f"s3://{bucket}/run/", "-o", f"s3://{bucket}/out/", "-g", "group_id", "-q",
               "--engine", "ray", "--ray-address", cluster.address,
               "--summary-json", tmp_path / "summary.json")  # fmt: skip
    first = grpo(*command)
    assert first.returncode == 0, first.stderr
    written = objects()
    assert output().equals(read_folder(tmp_path / "local"))
    assert [key for key in written if not key.startswith(("run/", "out/"))] == []  # no staging left
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    summary = json.loads((tmp_path / "summary.json").read_text())["output"]
    assert summary["method"] == "splice"  # each task splices its shard and uploads it to the staging folder
    transfer = summary["transfer"]
    shards = [key for key in written if key.startswith("out/")]
    assert transfer["objects"] == len(shards) and transfer["uploaded_by"] == "workers"
    assert transfer["bytes_uploaded"] == sum(written[key] for key in shards)

    again = grpo(*command, "-f")  # not again without --force: an existing output is refused
    refused = grpo(*command)
    assert refused.returncode == 2 and "holds objects; pass --force" in refused.stderr, refused.stderr
    assert again.returncode == 0, again.stderr
    assert len([key for key in objects() if key.startswith("out/")]) == len(shards)  # replaced, not added to
    assert output().equals(read_folder(tmp_path / "local"))
    over_input = grpo(*command[:3], f"s3://{bucket}/run/", *command[4:], "-f")
    assert over_input.returncode == 2 and "refusing to write there" in over_input.stderr
    assert sorted(key for key in objects() if key.startswith("run/")) == [
        f"run/part-{i}.parquet" for i in range(3)
    ]

    # A shard with 5 MiB or more before its footer: the task copies those bytes inside the store
    # (UploadPartCopy) and uploads the new columns and the footer, as the local engine does.
    big = big_rollouts(tmp_path / "big.parquet")
    s3.upload_file(str(big), bucket, "big/part-0.parquet")
    engines = {"local": [], "ray": ["--engine", "ray", "--ray-address", cluster.address]}
    for engine, options in engines.items():
        done = grpo("compute", f"s3://{bucket}/big/", "-g", "uid", "-q", "-o", f"s3://{bucket}/big-{engine}/",
                    "--summary-json", tmp_path / f"{engine}.json", *options)  # fmt: skip
        assert done.returncode == 0, done.stderr
    local, ray = (s3.get_object(Bucket=bucket, Key=f"big-{engine}/part-0.parquet")["Body"].read()
                  for engine in ("local", "ray"))  # fmt: skip
    assert local == ray
    transfer = json.loads((tmp_path / "ray.json").read_text())["output"]["transfer"]
    assert transfer["bytes_copied_in_store"] > 0.9 * big.stat().st_size > 10 * transfer["bytes_uploaded"]
    assert transfer["bytes_copied_in_store"] + transfer["bytes_uploaded"] == len(ray)
    assert [key for key in objects() if ".tmp/" in key] == []
