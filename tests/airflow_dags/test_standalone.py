"""The DAGs against a real Spark standalone cluster: ``deploy.target: standalone``.

A master (with its REST submission server on loopback) and one worker run from pyspark's own jars; the
job's driver runs on the worker, submitted in cluster mode by ``jobctl.StandaloneControl``, and meets the
DAGs in the state directory (this machine's disk stands in for the shared mount). One story, because every
driver start costs minutes here:

1. build A runs on the cluster on a tap topic that ``TapTraffic`` keeps writing to;
2. a broken build C (unreachable tap cluster) is deployed: the graceful stop reaches A's driver through
   the stop marker, C's driver starts, fails its health gate and the rollback restarts A on the cluster;
3. a good build B is deployed and passes its health gate;
4. B's driver is killed through the master; ``kpmon_health`` sees it died and restarts it, and the
   restarted driver resumes from the checkpoint;
5. every finding of the tap topic is in the per-batch results, and no alert was opened twice.
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
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyspark
import pytest
import yaml

from airflow_dags import jobctl
from airflow_dags.redeploy import Journal
from airflow_dags.tapwindow import Window, read_window
from deploy.spark.rest import StandaloneRest
from kpmon.config import load_config
from streaming.paths import StreamPaths
from streaming.sink import read_batches
from streaming.status import read_progress
from tests.airflow_dags.conftest import DAGS
from tests.airflow_dags.traffic import TapTraffic, wait_for
from tests.tap.harness import free_port, topic_end_offsets

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent
#: A driver start on the worker, to its first completed batch, takes minutes on the loaded 2-core machine.
FIRST_BATCH_SECONDS = 480.0
STREAM = {
    "shuffle_partitions": 1,
    "trigger_seconds": 1.0,
    "max_offsets_per_trigger": 5000,
    "metrics_port": None,
    "stall_seconds": 300,
    "stop_timeout_seconds": 30,
    "spark_conf": {"spark.ui.enabled": "false"},
}
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
RUN = {
    "canary_minutes": 10,
    "health_batches": 1,
    "start_timeout_seconds": FIRST_BATCH_SECONDS,
    "health_timeout_seconds": FIRST_BATCH_SECONDS,
    "stop_timeout_seconds": 90,
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


@dataclass
class Story:
    cluster: Cluster
    topic: str
    bootstrap: str
    configs: dict[str, str]
    paths: StreamPaths
    traffic: TapTraffic
    runs: dict[str, Any] = field(default_factory=dict)


def _config(tmp: Path, name: str, base: dict[str, Any], **changes: Any) -> str:
    data = yaml.safe_load(yaml.safe_dump(base))
    for section, values in changes.items():
        data.setdefault(section, {}).update(values)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _batch_after(paths: StreamPaths, since: float, after: int | None) -> bool:
    progress = read_progress(paths.progress) or {}
    written = float((progress.get("kpmon") or {}).get("written_at", 0))
    batch = progress.get("batchId")
    return written >= since and isinstance(batch, int) and batch > (after if after is not None else -1)


def _driver_log(story: Story, record: jobctl.JobRecord | None) -> str:
    if record is None or not record.driver_id:
        return "(no driver)"
    stderr = story.cluster.home / "work" / record.driver_id / "stderr"
    return stderr.read_text(errors="replace")[-4000:] if stderr.exists() else f"(no {stderr})"


def _cluster_summary(story: Story) -> str:
    """What the master says of its workers, applications and drivers: why a driver may get no cores."""
    try:
        state = story.cluster.state()
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
    from confluent_kafka.admin import AdminClient, NewTopic

    tmp = tmp_path_factory.mktemp("standalone-redeploy")
    topic = f"kpmon-tap-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    del admin
    base = {
        "state_dir": str(tmp / "state"),
        "kafka": {"bootstrap_servers": kafka_stack.bootstrap_servers},
        "tap": {"topic": topic},
        "stream": {**STREAM, "master": cluster.master},
        "deploy": {**DEPLOY, "rest_url": cluster.rest},
        "checks": {"watermark_seconds": 2.0},
        "quality": {"data_docs": False},
        "alerts": {"hooks": [{"kind": "log"}]},
    }
    configs = {
        "A": _config(tmp, "a", base),
        "B": _config(tmp, "b", base, stream={"trigger_seconds": 1.5}),
        # Unreachable tap cluster: no batch ever completes, so it stalls (or Spark's Kafka admin fails it).
        "C": _config(
            tmp, "c", base, kafka={"bootstrap_servers": "127.0.0.1:1"}, stream={"stall_seconds": 60}
        ),
    }
    paths = StreamPaths.of(load_config(configs["A"]))
    traffic = TapTraffic(kafka_stack.bootstrap_servers, topic, base_ns=time.time_ns(), chunk=6).start()
    story = Story(cluster, topic, kafka_stack.bootstrap_servers, configs, paths, traffic)
    control = jobctl.control_for(configs["A"])
    try:
        started = time.time()
        record = control.start(jobctl.JobSpec(sys.executable, configs["A"]), paths)
        assert record.target == "standalone" and record.driver_id.startswith("driver-")
        wait_for(
            lambda: _batch_after(paths, started, 0) or not control.is_running(record),
            FIRST_BATCH_SECONDS,
            "the first driver's batches",
        )
        assert control.is_running(record), _driver_log(story, record)
        yield story
    finally:
        traffic.stop()
        running = control.describe_running(paths)
        if running is not None:
            control.stop(paths, running, timeout=60, term_grace=10)


def redeploy(new: str, current: str) -> tuple[Any, dict[str, str], dict[str, Any]]:
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(str(DAGS)).dags["kpmon_redeploy"]
    run = dag.test(
        run_conf={**RUN, "new_config": new, "current_config": current, "new_python": sys.executable}
    )
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in run.get_task_instances()}
    return run, states, Journal.for_run(current, run.run_id).read()


def test_standalone_redeploy_rolls_back_a_broken_build(story: Story) -> None:
    control = jobctl.control_for(story.configs["A"])
    before = control.describe_running(story.paths)
    assert before is not None and before.config == story.configs["A"]
    run, states, journal = redeploy(story.configs["C"], story.configs["A"])
    story.runs["broken"] = run
    assert states == {
        "validate": "success",
        "canary": "success",
        "stop_current": "success",
        "start_new": "success",
        "health_gate": "failed",
        "rollback": "success",
        "deploy_failed": "failed",
    }, journal
    assert journal["validate"]["current"]["target"] == "standalone"
    assert journal["validate"]["new"]["resumes"] is True
    stopped = journal["stop_current"]
    # The stop marker reached the driver on the worker: it finished its batch and ended by itself.
    assert (stopped["how"], stopped["handle"]) == ("graceful", before.driver_id), stopped
    rest = StandaloneRest(story.cluster.rest)
    assert rest.status(before.driver_id).state == "FINISHED"
    broken = journal["start_new"]["driver_id"]
    assert broken.startswith("driver-") and rest.status(broken).state in ("FINISHED", "KILLED", "FAILED")
    rollback = journal["rollback"]
    assert rollback["rolled_back"] and rollback["failed_step"] == "health_gate"
    restarted = rollback["restarted"]
    assert restarted["config"] == story.configs["A"] and restarted["target"] == "standalone"
    now = control.describe_running(story.paths)
    assert now is not None and now.driver_id == restarted["driver_id"]
    # A runs again on the cluster, from the checkpoint, and goes on past the batch it stopped after.
    wait_for(
        lambda: _batch_after(story.paths, restarted["started_at"], stopped["batch_id"]),
        FIRST_BATCH_SECONDS,
        "a batch from the restarted driver",
    )


def test_standalone_redeploy_moves_the_job_to_a_good_build(story: Story) -> None:
    control = jobctl.control_for(story.configs["A"])
    old = control.describe_running(story.paths)
    assert old is not None
    run, states, journal = redeploy(story.configs["B"], story.configs["A"])
    assert str(getattr(run.state, "value", run.state)) == "success"
    assert states == {
        "validate": "success",
        "canary": "success",
        "stop_current": "success",
        "start_new": "success",
        "health_gate": "success",
        "rollback": "skipped",
        "deploy_failed": "skipped",
    }, journal
    assert (journal["stop_current"]["how"], journal["stop_current"]["handle"]) == ("graceful", old.driver_id)
    now = control.describe_running(story.paths)
    assert now is not None and now.config == story.configs["B"] and now.driver_id != old.driver_id


def test_standalone_health_restarts_a_killed_driver(story: Story) -> None:
    from airflow.dag_processing.dagbag import DagBag

    control = jobctl.control_for(story.configs["B"])
    victim = control.describe_running(story.paths)
    assert victim is not None
    batch = (read_progress(story.paths.progress) or {}).get("batchId")
    # No time to stop: straight to the master's kill, as when a driver hangs past its stop timeout.
    result = control.stop(story.paths, victim, timeout=0.0, term_grace=60.0)
    assert result.how == "killed"
    assert StandaloneRest(story.cluster.rest).status(victim.driver_id).state == "KILLED"
    assert control.describe_running(story.paths) is None

    dag = DagBag(str(DAGS)).dags["kpmon_health"]
    killed_at = time.time()
    run = dag.test(run_conf={"config": victim.config, "report_minutes": 5})
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in run.get_task_instances()}
    assert states["check_and_heal"] == "success", states
    restarted = control.describe_running(story.paths)
    assert restarted is not None and restarted.driver_id != victim.driver_id
    assert restarted.config == victim.config
    # The killed driver's checkpoint is usable: the new driver commits batches after the last one.
    try:
        wait_for(
            lambda: _batch_after(story.paths, killed_at, batch if isinstance(batch, int) else None),
            FIRST_BATCH_SECONDS,
            "a batch from the driver the health DAG restarted",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_cluster_summary(story)}\n{_driver_log(story, restarted)}") from None
    _no_finding_lost_nor_alert_sent_twice(story)


def _no_finding_lost_nor_alert_sent_twice(story: Story) -> None:
    story.traffic.stop()
    end = topic_end_offsets(story.bootstrap, story.topic).get(0, 0)
    config = load_config(story.configs["B"])
    records = list(read_window(config.tap_cluster, Window(story.topic, {0: 0}, {0: end})))
    last_ts = max(r.ts_ns for r in records)

    def caught_up() -> int | None:
        progress = read_progress(story.paths.progress) or {}
        mark = (progress.get("eventTime") or {}).get("watermark")
        if not mark:
            return None
        watermark_ns = int(datetime.fromisoformat(mark.replace("Z", "+00:00")).timestamp() * 1e9)
        return watermark_ns if watermark_ns >= last_ts - 3_000_000_000 else None

    watermark_ns = wait_for(caught_up, 300, "the restarted driver to catch up with the tap topic")
    import checks
    from codec.taprecord import frames_from_record

    monitor = checks.new_monitor(config.checks.settings())
    reference = monitor.feed_all(
        frame for r in records for frame in frames_from_record(r.headers, r.value, r.partition, r.offset)
    )
    cutoff = watermark_ns - 1_000_000_000
    expected = {f.id for f in reference if f.ts_ns < cutoff}
    batches = read_batches(story.paths)
    found = {
        f["id"]
        for batch in batches
        for f in batch["findings"]
        if not f["rule"].startswith("quality.") and f["ts_ns"] < cutoff
    }
    assert found == expected, (sorted(expected - found)[:10], sorted(found - expected)[:10])
    # An alert update is its id, status and count: one published by two batches was sent twice.
    published: dict[tuple[str, str, int], list[int]] = {}
    for batch in batches:
        for alert in batch["alerts"]:
            key = (alert["id"], alert["status"], alert["count"])
            published.setdefault(key, []).append(int(batch["batch_id"]))
    assert published and {k: v for k, v in published.items() if len(v) > 1} == {}
