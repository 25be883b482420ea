"""The redeploy and health stories that every real cluster target runs (test_standalone.py, test_yarn.py).

The job's driver runs on the cluster, submitted in cluster mode by the target's ``jobctl`` control, and
meets the DAGs in the state directory (this machine's disk stands in for the shared mount). One story
per cluster, in order, because every driver start costs minutes here:

1. build A runs on the cluster on a tap topic that ``TapTraffic`` keeps writing to;
2. a broken build C (unreachable tap cluster) is deployed: the graceful stop reaches A's driver through
   the stop marker, C's driver starts, fails its health gate and the rollback restarts A on the cluster;
3. a good build B is deployed and passes its health gate;
4. B's driver is killed through the cluster's API; ``kpmon_health`` sees it died and restarts it, and
   the restarted driver resumes from the checkpoint;
5. every finding of the tap topic is in the per-batch results, and no alert was opened twice.

A target says what is its own in a ``Target``: how to ask the cluster for a driver's state, the states
a graceful stop and a kill end in, and where the driver's log is. The local-mode story
(test_kpmon_redeploy.py) writes its configs, waits for batches and runs the DAG with the helpers here.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from airflow_dags import jobctl
from airflow_dags.redeploy import Journal
from airflow_dags.tapwindow import Window, read_window
from kpconfig.model import load_config
from streaming.paths import StreamPaths
from streaming.sink import read_batches
from streaming.status import read_progress
from tests.airflow_dags.conftest import DAGS
from tests.airflow_dags.traffic import TapTraffic, wait_for
from tests.tap.harness import topic_end_offsets

#: A driver start on the cluster, to its first completed batch, takes minutes on the loaded 2-core machine.
FIRST_BATCH_SECONDS = 480.0
STREAM = {
    "shuffle_partitions": 1,
    "trigger_seconds": 1.0,
    "max_offsets_per_trigger": 5000,
    "metrics_port": None,
    "stall_seconds": 300,
    # A graceful stop waits for a moment without a batch running, which back-to-back batches never
    # leave, so it ends at this bound every time: each stop of the story costs it.
    "stop_timeout_seconds": 10,
    "spark_conf": {"spark.ui.enabled": "false"},
}
RUN = {
    "canary_minutes": 10,
    "health_batches": 1,
    "start_timeout_seconds": FIRST_BATCH_SECONDS,
    "health_timeout_seconds": FIRST_BATCH_SECONDS,
    "stop_timeout_seconds": 90,
}


@dataclass(frozen=True)
class Target:
    """What differs between clusters: ``deploy.target``, the driver ids it hands out (their prefix), the
    cluster's state of a driver, the states a graceful stop and a kill leave, and the driver's log."""

    name: str
    id_prefix: str
    state: Callable[[str], str]
    finished: str
    killed: str
    ended: frozenset[str]
    log: Callable[[str], str]
    #: Where the cluster stands (free resources, drivers), for a timeout's message.
    summary: Callable[[], str] = lambda: ""


@dataclass
class Story:
    target: Target
    topic: str
    bootstrap: str
    configs: dict[str, str]
    paths: StreamPaths
    traffic: TapTraffic
    runs: dict[str, Any] = field(default_factory=dict)

    def driver_log(self, record: jobctl.JobRecord | None) -> str:
        if record is None or not record.driver_id:
            return "(no driver)"
        return self.target.log(record.driver_id)


def config_file(tmp: Path, name: str, base: dict[str, Any], **changes: Any) -> str:
    data = yaml.safe_load(yaml.safe_dump(base))
    for section, values in changes.items():
        data.setdefault(section, {}).update(values)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def batch_after(paths: StreamPaths, since: float, after: int | None) -> bool:
    progress = read_progress(paths.progress) or {}
    written = float((progress.get("kpmon") or {}).get("written_at", 0))
    batch = progress.get("batchId")
    return written >= since and isinstance(batch, int) and batch > (after if after is not None else -1)


def open_story(
    target: Target,
    bootstrap: str,
    tmp: Path,
    master: str,
    deploy: dict[str, Any],
    stream: dict[str, Any] | None = None,
) -> Iterator[Story]:
    """Build A started on the cluster and past its first batch, with traffic flowing; stopped after."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"kpmon-tap-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    del admin
    base = {
        "state_dir": str(tmp / "state"),
        "kafka": {"bootstrap_servers": bootstrap},
        "tap": {"topic": topic},
        "stream": {**STREAM, "master": master, **(stream or {})},
        "deploy": deploy,
        "checks": {"watermark_seconds": 2.0},
        "quality": {"data_docs": False},
        "alerts": {"hooks": [{"kind": "log"}]},
    }
    configs = {
        "A": config_file(tmp, "a", base),
        "B": config_file(tmp, "b", base, stream={"trigger_seconds": 1.5}),
        # Unreachable tap cluster: no batch ever completes, so it stalls (or Spark's Kafka admin fails it).
        "C": config_file(
            tmp, "c", base, kafka={"bootstrap_servers": "127.0.0.1:1"}, stream={"stall_seconds": 30}
        ),
    }
    paths = StreamPaths.of(load_config(configs["A"]))
    traffic = TapTraffic(bootstrap, topic, base_ns=time.time_ns(), chunk=6).start()
    story = Story(target, topic, bootstrap, configs, paths, traffic)
    control = jobctl.control_for(configs["A"])
    try:
        started = time.time()
        record = control.start(jobctl.JobSpec(sys.executable, configs["A"]), paths)
        assert record.target == target.name and record.driver_id.startswith(target.id_prefix)
        wait_for(
            lambda: batch_after(paths, started, 0) or not control.is_running(record),
            FIRST_BATCH_SECONDS,
            "the first driver's batches",
        )
        assert control.is_running(record), story.driver_log(record)
        yield story
    finally:
        traffic.stop()
        running = control.describe_running(paths)
        if running is not None:
            control.stop(paths, running, timeout=60, term_grace=10)


def redeploy(
    new: str, current: str, settings: dict[str, Any] | None = None
) -> tuple[Any, dict[str, str], dict[str, Any]]:
    """One ``dag.test()`` run of ``kpmon_redeploy`` with ``settings`` (default ``RUN``): the run, its task
    states and its journal."""
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(str(DAGS)).dags["kpmon_redeploy"]
    conf = RUN if settings is None else settings
    run = dag.test(
        run_conf={**conf, "new_config": new, "current_config": current, "new_python": sys.executable}
    )
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in run.get_task_instances()}
    return run, states, Journal.for_run(current, run.run_id).read()


def a_broken_build_is_rolled_back(story: Story) -> None:
    target = story.target
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
    assert journal["validate"]["current"]["target"] == target.name
    assert journal["validate"]["new"]["resumes"] is True
    stopped = journal["stop_current"]
    # The stop marker reached the driver on the cluster: it finished its batch and ended by itself.
    assert (stopped["how"], stopped["handle"]) == ("graceful", before.driver_id), stopped
    assert target.state(before.driver_id) == target.finished
    broken = journal["start_new"]["driver_id"]
    assert broken.startswith(target.id_prefix) and target.state(broken) in target.ended
    rollback = journal["rollback"]
    assert rollback["rolled_back"] and rollback["failed_step"] == "health_gate"
    restarted = rollback["restarted"]
    assert restarted["config"] == story.configs["A"] and restarted["target"] == target.name
    now = control.describe_running(story.paths)
    assert now is not None and now.driver_id == restarted["driver_id"]
    # A runs again on the cluster, from the checkpoint, and goes on past the batch it stopped after.
    wait_for(
        lambda: batch_after(story.paths, restarted["started_at"], stopped["batch_id"]),
        FIRST_BATCH_SECONDS,
        "a batch from the restarted driver",
    )


def a_good_build_is_swapped_in(story: Story) -> None:
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


def health_restarts_a_killed_driver(story: Story) -> None:
    from airflow.dag_processing.dagbag import DagBag

    control = jobctl.control_for(story.configs["B"])
    victim = control.describe_running(story.paths)
    assert victim is not None
    batch = (read_progress(story.paths.progress) or {}).get("batchId")
    # No time to stop: straight to the cluster's kill, as when a driver hangs past its stop timeout.
    result = control.stop(story.paths, victim, timeout=0.0, term_grace=60.0)
    assert result.how == "killed"
    assert story.target.state(victim.driver_id) == story.target.killed
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
            lambda: batch_after(story.paths, killed_at, batch if isinstance(batch, int) else None),
            FIRST_BATCH_SECONDS,
            "a batch from the driver the health DAG restarted",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{story.target.summary()}\n{story.driver_log(restarted)}") from None
    no_finding_lost_nor_alert_sent_twice(story)


@dataclass
class Compared:
    """The tap topic's findings, by one monitor over every record (the batch-mode reference), beside
    those the job's per-batch results hold; both before ``cutoff_ns``, the job's watermark less a second."""

    expected: dict[str, Any]
    found: set[str]
    batches: list[dict[str, Any]]


def compare_with_reference(
    traffic: TapTraffic, bootstrap: str, topic: str, config_path: str, paths: StreamPaths, job: str
) -> Compared:
    """Stop the traffic (it finishes its round), wait for ``job`` to read the whole topic and move its
    watermark past it, then compare its findings with the reference's."""
    traffic.stop()
    end = topic_end_offsets(bootstrap, topic).get(0, 0)
    config = load_config(config_path)
    records = list(read_window(config.tap_cluster, Window(topic, {0: 0}, {0: end})))
    last_ts = max(r.ts_ns for r in records)

    def caught_up() -> int | None:
        progress = read_progress(paths.progress) or {}
        mark = (progress.get("eventTime") or {}).get("watermark")
        if not mark:
            return None
        watermark_ns = int(datetime.fromisoformat(mark.replace("Z", "+00:00")).timestamp() * 1e9)
        # The last round's clean tail is 15 s after its scenario: past it, every round is final.
        return watermark_ns if watermark_ns >= last_ts - 3_000_000_000 else None

    watermark_ns = wait_for(caught_up, 300, f"{job} to catch up with the tap topic")
    import checks
    from codec.taprecord import frames_from_record

    monitor = checks.new_monitor(config.checks.settings())
    reference = monitor.feed_all(
        frame for r in records for frame in frames_from_record(r.headers, r.value, r.partition, r.offset)
    )
    cutoff = watermark_ns - 1_000_000_000
    batches = read_batches(paths)
    found = {
        f["id"]
        for batch in batches
        for f in batch["findings"]
        if not f["rule"].startswith("quality.") and f["ts_ns"] < cutoff
    }
    return Compared({f.id: f for f in reference if f.ts_ns < cutoff}, found, batches)


def no_finding_lost_nor_alert_sent_twice(story: Story) -> None:
    compared = compare_with_reference(
        story.traffic, story.bootstrap, story.topic, story.configs["B"], story.paths, "the restarted driver"
    )
    assert compared.found == set(compared.expected), (
        sorted(compared.expected.keys() - compared.found)[:10],
        sorted(compared.found - compared.expected.keys())[:10],
    )
    # An alert update is its id, status and count: one published by two batches was sent twice.
    published: dict[tuple[str, str, int], list[int]] = {}
    for batch in compared.batches:
        for alert in batch["alerts"]:
            key = (alert["id"], alert["status"], alert["count"])
            published.setdefault(key, []).append(int(batch["batch_id"]))
    assert published and {k: v for k, v in published.items() if len(v) > 1} == {}
