"""The DAGs against a real YARN cluster: ``deploy.target: yarn``.

A ResourceManager and a NodeManager (``deploy.yarn.LocalYarn``, from the Hadoop jars ``make setup``
caches) run on loopback, with a ``HADOOP_CONF_DIR`` that spark-submit and the job control read. The
job's driver runs in the application master's container, submitted by ``jobctl.YarnControl`` through
spark-submit in cluster mode; its state and kill go through the ResourceManager's REST API. The story
is the one every real cluster runs (``stories.py``): a broken build rolled back, a good build swapped
in, a killed application restarted by ``kpmon_health``, and no finding lost nor alert sent twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest

from deploy.spark.rest import ResourceManagerRest
from deploy.yarn import LocalYarn
from tests.airflow_dags import stories
from tests.airflow_dags.stories import Story, Target

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent
#: The driver (the application master) and one executor of one core each. Spark's jars are on this
#: node already (``local:``), so a submission uploads only the job's files, not pyspark's 456 MB.
SPARK_CONF = {
    "spark.executor.instances": "1",
    "spark.executor.cores": "1",
    "spark.executor.memory": "768m",
    "spark.executor.memoryOverhead": "384m",
    "spark.yarn.jars": f"local:{SPARK_HOME}/jars/*",
}


@pytest.fixture(scope="module")
def yarn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalYarn]:
    """One ResourceManager and one NodeManager of 6 GiB: two applications fit while one ends."""
    cluster = LocalYarn(tmp_path_factory.mktemp("yarn"), memory_mb=6144, vcores=4).start()
    try:
        with pytest.MonkeyPatch.context() as env:
            # What the Airflow worker needs for spark-submit (docs/operations.md).
            env.setenv("HADOOP_CONF_DIR", str(cluster.conf_dir))
            env.delenv("YARN_CONF_DIR", raising=False)
            yield cluster
    finally:
        cluster.stop()


def _driver_log(yarn: LocalYarn, app_id: str) -> str:
    """The last application master's stderr: where the Python driver's output goes."""
    logs = sorted((yarn.container_logs / app_id).glob("container_*_000001/stderr"))
    return logs[-1].read_text(errors="replace")[-4000:] if logs else f"(no log of {app_id})"


def _summary(yarn: LocalYarn) -> str:
    metrics = (yarn.cluster_info("metrics") or {}).get("clusterMetrics") or {}
    apps = ((yarn.cluster_info("apps") or {}).get("apps") or {}).get("app") or []
    keys = ("activeNodes", "availableMB", "allocatedMB", "appsRunning", "appsPending")
    return f"{ {k: metrics.get(k) for k in keys} }; apps {[(a['id'], a['state']) for a in apps]}"


@pytest.fixture(scope="module")
def story(
    yarn: LocalYarn, kafka_stack: Any, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Story]:
    rm = ResourceManagerRest(yarn.rest_url)
    target = Target(
        name="yarn",
        id_prefix="application_",
        state=rm.state,
        finished="FINISHED",
        killed="KILLED",
        ended=frozenset({"FINISHED", "KILLED", "FAILED"}),
        log=lambda app_id: _driver_log(yarn, app_id),
        summary=lambda: _summary(yarn),
    )
    tmp = tmp_path_factory.mktemp("yarn-redeploy")
    deploy = {
        "target": "yarn",
        "rest_url": yarn.rest_url,
        "connector": "jars",
        "driver_memory": "768m",
        "spark_conf": {**SPARK_CONF, "spark.yarn.stagingDir": str(tmp / "staging")},
    }
    # An absolute checkpoint on this machine's disk: the mount every NodeManager shares, here one.
    stream = {"checkpoint_dir": str(tmp / "checkpoint")}
    yield from stories.open_story(target, kafka_stack.bootstrap_servers, tmp, "yarn", deploy, stream)


def test_yarn_redeploy_rolls_back_a_broken_build(story: Story) -> None:
    stories.a_broken_build_is_rolled_back(story)


def test_yarn_redeploy_moves_the_job_to_a_good_build(story: Story) -> None:
    stories.a_good_build_is_swapped_in(story)


def test_yarn_health_restarts_a_killed_application(story: Story) -> None:
    stories.health_restarts_a_killed_driver(story)
