"""``kpmon deploy submit --target standalone`` against a real Spark standalone cluster.

A master and one worker run from pyspark's own jars, so the executors live in a JVM of their own, as on
a real cluster: the connector comes from the pre-resolved jar directory (the air-gapped path), the
checkpoint and RocksDB state from a path declared shared, the Python workers from --executor-python
(or a packed venv, see ``python_env``).
Traffic goes through a real tap into the tap topic; the job runs stateful batches, then stops on its
stop marker, and spark-submit exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest
import yaml

from kpconfig.model import load_config
from kpmon.traffic.workload import create_topic, idempotent_produce
from streaming.connector import connector_dir, connector_jars
from streaming.paths import StreamPaths
from tests.tap.harness import TappedCluster, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
WAIT_SECONDS = 240.0


def python_env() -> list[str]:
    """This interpreter on the executors; or, with ``KPMON_ENV_ARCHIVE`` set, that venv-pack archive
    (``kpmon deploy pack-venv``, minutes to build, so not built here)."""
    archive = os.environ.get("KPMON_ENV_ARCHIVE")
    return ["--archive", archive] if archive else ["--executor-python", sys.executable]


def _master_state(ui_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as response:
        return dict(json.load(response))


def _wait(what: str, predicate: Any, timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(1)
    tail = log.read_text()[-4000:] if log and log.exists() else ""
    raise AssertionError(f"{what} within {timeout:.0f} s\n{tail}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


@pytest.fixture(scope="module")
def spark_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """``spark://127.0.0.1:PORT`` with one 2-core worker, and the master's web UI port."""
    home = tmp_path_factory.mktemp("spark-standalone")
    port, ui = free_port(), free_port()
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOG_DIR": str(home)}
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, *args: str) -> None:
        with (home / f"{name}.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [str(SPARK_CLASS), *args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    try:
        spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(ui))  # fmt: skip
        _wait("the master's web UI", lambda: _master_state(ui), 90, home / "master.log")
        url = f"spark://127.0.0.1:{port}"
        spawn("worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "2",
              "--memory", "2g", "--webui-port", str(free_port()), "--work-dir", str(home / "work"), url)  # fmt: skip
        _wait("a registered worker", lambda: _master_state(ui)["aliveworkers"] == 1, 90, home / "worker.log")
        yield url, ui
    finally:
        for proc in procs:
            _stop(proc)


def test_submit_runs_the_job_on_a_standalone_cluster(
    spark_master: tuple[str, int], tapped_cluster: TappedCluster, tmp_path: Path
) -> None:
    master, ui = spark_master
    topic = f"kpmon.tap.{uuid.uuid4().hex[:8]}"
    create_topic(tapped_cluster.mirror_bootstrap, topic, partitions=2)
    tap, _ = tapped_cluster.start_tap(topic=topic, capture="headers")
    checkpoint = tmp_path / "shared" / "checkpoint"
    config = {
        "state_dir": str(tmp_path / "state"),
        "kafka": {"bootstrap_servers": tapped_cluster.bootstrap},
        "tap": {"topic": topic, "cluster": {"bootstrap_servers": tapped_cluster.mirror_bootstrap}},
        "stream": {
            "master": master,
            "checkpoint_dir": str(checkpoint),
            "shuffle_partitions": 1,
            "trigger_seconds": 1.0,
            "starting_offsets": "earliest",
            "metrics_port": None,
        },
        "checks": {"watermark_seconds": 1.0},
        "quality": {"data_docs": False},
        "alerts": {"hooks": [{"kind": "log"}]},
    }
    config_path = tmp_path / "kpmon.yaml"
    config_path.write_text(yaml.safe_dump(config))
    assert connector_jars()  # the air-gapped directory must be complete before the submit
    log = tmp_path / "submit.log"
    command = [
        str(Path(sys.executable).parent / "kpmon"), "deploy", "submit", "--config", str(config_path),
        "--target", "standalone", "--connector", "jars", "--jars-dir", str(connector_dir()),
        *python_env(), "--shared-checkpoint",
        "--conf", "spark.cores.max=2", "--conf", "spark.executor.cores=2", "--conf", "spark.executor.memory=1g",
        "--conf", "spark.executor.memoryOverhead=512m", "--conf", "spark.driver.memory=1g",
    ]  # fmt: skip
    env = {**os.environ, "KPMON_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        # Real client traffic through the tap: every produce is a frame the stateful checks see.
        for _ in range(3):
            idempotent_produce(tapped_cluster.bootstrap, f"standalone-{uuid.uuid4().hex[:6]}", count=20)

        def running_on_the_cluster() -> bool:
            assert proc.poll() is None, f"spark-submit exited {proc.returncode}:\n{log.read_text()[-4000:]}"
            apps = _master_state(ui)["activeapps"]
            return any(a["name"] == "kpmon-stream" and a["state"] == "RUNNING" for a in apps)

        _wait("the application running on the master", running_on_the_cluster, WAIT_SECONDS, log)

        def state_written() -> bool:
            assert proc.poll() is None, f"spark-submit exited {proc.returncode}:\n{log.read_text()[-4000:]}"
            idempotent_produce(tapped_cluster.bootstrap, "standalone-keepalive", count=5)
            committed = list((checkpoint / "commits").glob("[0-9]*")) if checkpoint.exists() else []
            state = list((checkpoint / "state").rglob("*.changelog")) if checkpoint.exists() else []
            return bool(committed) and bool(state)

        # Commits prove batches finished; RocksDB changelog files prove the executor wrote state there.
        _wait("committed batches with RocksDB changelogs in the checkpoint", state_written, WAIT_SECONDS, log)
        assert topic in (checkpoint / "offsets" / "0").read_text()
        stop_marker = StreamPaths.of(load_config(config_path, environ={})).stop_marker
        stop_marker.parent.mkdir(parents=True, exist_ok=True)
        stop_marker.touch()
        assert proc.wait(WAIT_SECONDS) == 0, log.read_text()[-4000:]
    finally:
        _stop(proc)
        tap.stop()
