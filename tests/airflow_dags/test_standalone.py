"""The DAGs against a real Spark standalone cluster: ``deploy.target: standalone``.

A master (with its REST submission server on loopback) and one worker run from pyspark's own jars; the
job's driver runs on the worker, submitted in cluster mode by ``jobctl.StandaloneControl``. The story is
the one every real cluster runs (``stories.py``): a broken build rolled back, a good build swapped in,
a killed driver restarted by ``kpmon_health``, and no finding lost nor alert sent twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import pytest

from deploy.spark.rest import StandaloneRest
from tests.airflow_dags import stories
from tests.airflow_dags.stories import Story, Target
from tests.airflow_dags.traffic import wait_for
from tests.tap.harness import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent
#: The driver takes one of the worker's cores, the one executor another.
DEPLOY = {
    "target": "standalone",
    "connector": "jars",
    "driver_memory": "768m",
    "spark_conf": {
        "spark.cores.max": "1",
        "spark.executor.cores": "1",
        "spark.executor.memory": "768m",
        "spark.executor.memoryOverhead": "384m",
    },
}


@dataclass
class Cluster:
    master: str
    rest: str
    ui: int
    home: Path

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=5) as response:
            return dict(json.load(response))


def _stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A master with its REST server and one worker of 4 cores and 4 GiB, all on loopback: a driver and
    its executor take half, so a new driver and its executor find room while the master is still
    reclaiming a killed one's (the cores are the master's accounting; the machine may have two)."""
    home = tmp_path_factory.mktemp("spark-standalone")
    port, ui, rest = free_port(), free_port(), free_port()
    (home / "master.conf").write_text(
        f"spark.master.rest.enabled true\nspark.master.rest.host 127.0.0.1\nspark.master.rest.port {rest}\n"
    )
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOG_DIR": str(home)}
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, *args: str) -> None:
        with (home / f"{name}.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [str(SPARK_HOME / "bin" / "spark-class"), *args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    master = f"spark://127.0.0.1:{port}"
    found = Cluster(master, f"http://127.0.0.1:{rest}", ui, home)
    try:
        spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(ui), "--properties-file", str(home / "master.conf"))  # fmt: skip
        wait_for(lambda: _quiet(found.state), 90, "the master's web UI")
        spawn("worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "4",
              "--memory", "4g", "--webui-port", str(free_port()), "--work-dir", str(home / "work"), master)  # fmt: skip
        wait_for(lambda: (_quiet(found.state) or {}).get("aliveworkers") == 1, 90, "a registered worker")
        yield found
    finally:
        for proc in reversed(procs):
            _stop_process(proc)


def _quiet(call: Any) -> Any:
    try:
        return call()
    except OSError:
        return None


def _driver_log(cluster: Cluster, driver_id: str) -> str:
    stderr = cluster.home / "work" / driver_id / "stderr"
    return stderr.read_text(errors="replace")[-4000:] if stderr.exists() else f"(no {stderr})"


def _cluster_summary(cluster: Cluster) -> str:
    """What the master says of its workers, applications and drivers: why a driver may get no cores."""
    try:
        state = cluster.state()
    except OSError as exc:
        return f"(master's state unreadable: {exc})"
    workers = [
        (w.get("id"), w.get("state"), w.get("coresused"), w.get("memoryused"))
        for w in state.get("workers", [])
    ]
    apps = [(a.get("id"), a.get("state"), a.get("cores")) for a in state.get("activeapps", [])]
    drivers = [(d.get("id"), d.get("state"), d.get("worker")) for d in state.get("activedrivers", [])]
    return f"workers {workers}; active apps {apps}; active drivers {drivers}"


@pytest.fixture(scope="module")
def story(
    cluster: Cluster, kafka_stack: Any, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Story]:
    rest = StandaloneRest(cluster.rest)
    target = Target(
        name="standalone",
        id_prefix="driver-",
        state=lambda driver_id: rest.status(driver_id).state,
        finished="FINISHED",
        killed="KILLED",
        ended=frozenset({"FINISHED", "KILLED", "FAILED"}),
        log=lambda driver_id: _driver_log(cluster, driver_id),
        summary=lambda: _cluster_summary(cluster),
    )
    yield from stories.open_story(
        target,
        kafka_stack.bootstrap_servers,
        tmp_path_factory.mktemp("standalone-redeploy"),
        cluster.master,
        {**DEPLOY, "rest_url": cluster.rest},
    )


def test_standalone_redeploy_rolls_back_a_broken_build(story: Story) -> None:
    stories.a_broken_build_is_rolled_back(story)


def test_standalone_redeploy_moves_the_job_to_a_good_build(story: Story) -> None:
    stories.a_good_build_is_swapped_in(story)


def test_standalone_health_restarts_a_killed_driver(story: Story) -> None:
    stories.health_restarts_a_killed_driver(story)
