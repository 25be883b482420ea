"""The kpmon_health steps: diagnosis and alerting, storage sizes, Data Docs, the KIP-896 report."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_dags import health, opsalerts
from airflow_dags.health import HealthParams
from kpconfig.model import load_config
from streaming.paths import StreamPaths
from tests.airflow_dags.traffic import produce
from tests.checks import test_apiversions as av
from tests.checks.builders import SECOND, Conversation
from tests.checks.exchanges import exchange_records, flatten


def config_file(tmp_path: Path, **extra: Any) -> str:
    data = {
        "state_dir": str(tmp_path / "state"),
        "stream": {"stall_seconds": 60, "max_lag_records": 100},
        **extra,
    }
    path = tmp_path / "kpmon.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def write_progress(
    paths: StreamPaths, written_at: float, batch: int, state: str = "running", lag: int = 0
) -> None:
    paths.make()
    progress = {
        "batchId": batch,
        "sources": [{"endOffset": {"tap": {"0": 10}}, "latestOffset": {"tap": {"0": 10 + lag}}}],
        "kpmon": {"written_at": written_at, "state": state},
    }
    paths.progress.write_text(json.dumps(progress))


def test_diagnosis() -> None:
    config = load_config(None, environ={})
    now = 10_000.0
    fresh = {"batchId": 3, "kpmon": {"written_at": now - 1, "state": "running"}}
    assert health.diagnose(fresh, True, now, config)[0] == "healthy"
    assert health.diagnose(fresh, False, now, config)[:2] == (
        "died",
        "the job's process is gone without stopping its query",
    )
    stopped = {"batchId": 3, "kpmon": {"written_at": now - 500, "state": "stopped"}}
    assert health.diagnose(stopped, False, now, config)[0] == "stopped"  # an operator's stop: left alone
    old = {"batchId": 3, "kpmon": {"written_at": now - 500, "state": "running"}}
    assert health.diagnose(old, True, now, config)[0] == "stalled"


def test_a_stalled_job_raises_one_alert_per_episode(tmp_path: Path) -> None:
    path = config_file(tmp_path)
    paths = StreamPaths.of(load_config(path))
    write_progress(paths, time.time() - 300, batch=7)
    sent: list[Any] = []

    def publish(config: Any, alerts: list[Any]) -> dict[str, Any]:
        sent.extend(alerts)
        return {"delivered": True}

    params = HealthParams(config=path, restart=False)
    first = health.check_and_heal(params, publish=publish)
    health.check_and_heal(params, publish=publish)
    assert first["status"] == "died"  # "running" in the progress file, no process
    assert [a.rule for a in sent] == [opsalerts.UNHEALTHY] * 2
    assert sent[0].severity.value == "critical" and sent[0].subject == f"stream:{paths.root}"
    # The same episode (status and batch) keeps its id, so receivers deduplicate repeated health runs.
    cluster = load_config(path).cluster_name
    assert (
        sent[0].id
        == sent[1].id
        == opsalerts.ops_alert_id(opsalerts.UNHEALTHY, sent[0].subject, "died|7", cluster)
    )
    assert sent[0].cluster == cluster and sent[0].runbook_url == "docs/runbook.md#opsstream_unhealthy"
    assert "restart" not in first

    write_progress(paths, time.time(), batch=8, lag=1000)
    sent.clear()
    # A lagging job that is alive: warning. Its pid is our own process, alive for the check.
    paths.pid_file.write_text(f"{os.getpid()}\n")
    result = health.check_and_heal(params, publish=publish)
    assert result["status"] == "lagging" and sent[0].severity.value == "warning"
    write_progress(paths, time.time(), batch=9)
    sent.clear()
    assert health.check_and_heal(params, publish=publish)["status"] == "healthy" and sent == []

    # In the middle of a redeploy the job is the DAG's business: no verdict, no alert, no restart.
    from airflow_dags.redeploy import Journal

    write_progress(paths, time.time() - 300, batch=9)
    Journal(paths.root / "redeploy" / "run1.json").write("validate", {})
    assert health.check_and_heal(params, publish=publish)["status"] == "redeploying" and sent == []


def test_storage_report_measures_the_checkpoint(tmp_path: Path) -> None:
    path = config_file(tmp_path)
    config = load_config(path)
    paths = StreamPaths.of(config)
    checkpoint = Path(paths.checkpoint(config))
    for rel, size in (
        ("offsets/0", 100),
        ("commits/0", 10),
        ("state/0/0/1.changelog", 1000),
        ("state/1/0/1.zip", 5),
    ):
        (checkpoint / rel).parent.mkdir(parents=True, exist_ok=True)
        (checkpoint / rel).write_bytes(b"x" * size)
    paths.make()
    (paths.batches / "batch-0.json").write_text("{}")
    report = health.storage_report(HealthParams(config=path))
    assert report["checkpoint_size"]["bytes"] == 1115
    assert report["checkpoint_size"]["parts"]["state"] == {"bytes": 1005, "files": 2}
    assert report["checkpoint_size"]["state_operators"] == {
        "0": {"bytes": 1000, "files": 1},
        "1": {"bytes": 5, "files": 1},
    }
    assert report["batch_results"] == {"bytes": 2, "files": 1}
    assert json.loads((paths.root / "reports" / "storage.json").read_text())["checkpoint"] == str(checkpoint)
    remote = config_file(tmp_path, stream={"checkpoint_dir": "s3a://bucket/kpmon"})
    assert health.storage_report(HealthParams(config=remote))["checkpoint_size"] is None


def test_data_docs_rebuild(tmp_path: Path) -> None:
    result = health.rebuild_data_docs(HealthParams(config=config_file(tmp_path)))
    assert result["built"] and Path(result["index"]).is_file()
    off = config_file(tmp_path, quality={"data_docs": False})
    assert health.rebuild_data_docs(HealthParams(config=off)) == {
        "built": False,
        "reason": "quality.data_docs is off",
    }


@pytest.mark.integration
def test_kip896_report_from_the_tap_topic(kafka_stack: Any, tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"kpmon-kip896-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    legacy, modern = Conversation(conn="c-old", client_id="legacy"), Conversation(conn="c-new")
    fetch_v3 = {"ReplicaId": -1, "MaxWaitMs": 1, "MinBytes": 1, "Topics": []}
    frames = [
        *av.handshake(legacy, SECOND, software="kafka-python"),
        *av.handshake(modern, SECOND, software="librdkafka"),
        *legacy.exchange(av.FETCH, 3, fetch_v3, {}, 2 * SECOND),
        *av.metadata(modern, 12, 3 * SECOND),
    ]
    frames = flatten(exchange_records(frames))  # as the tap writes them: an exchange per record
    produce(kafka_stack.bootstrap_servers, topic, frames)
    path = config_file(
        tmp_path, kafka={"bootstrap_servers": kafka_stack.bootstrap_servers}, tap={"topic": topic}
    )
    summary = health.kip896_report(HealthParams(config=path, report_minutes=5))
    assert summary["frames"] == len(frames) and not summary["ready_for_4_0"]
    assert summary["removed_in_4_0"] == [
        {"software": "kafka-python/2.6.0", "api": "Fetch", "api_key": 1, "version": 3, "requests": 1}
    ]
    assert summary["clients"] == ["kafka-python/2.6.0", "librdkafka/2.6.0"]
    out = Path(summary["html"]).parent
    assert (out / "latest.html").read_text() == Path(summary["html"]).read_text()
    assert "Fleet readiness" in (out / "latest.html").read_text()
    assert (out / "latest.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.integration
def test_the_health_dag_runs_every_task(kafka_stack: Any, airflow_db: Path, tmp_path: Path) -> None:
    """``dag.test()`` of kpmon_health on a tap topic with a stopped job: nothing to heal, reports written."""
    from airflow.dag_processing.dagbag import DagBag
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.airflow_dags.conftest import DAGS
    from tests.airflow_dags.traffic import round_frames

    topic = f"kpmon-health-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    produce(kafka_stack.bootstrap_servers, topic, round_frames(0, 10**18))
    path = config_file(
        tmp_path, kafka={"bootstrap_servers": kafka_stack.bootstrap_servers}, tap={"topic": topic}
    )
    paths = StreamPaths.of(load_config(path))
    write_progress(paths, time.time() - 30, batch=5, state="stopped")

    dag = DagBag(str(DAGS)).dags["kpmon_health"]
    run = dag.test(run_conf={"config": path, "report_minutes": 5})
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in run.get_task_instances()}
    assert states == dict.fromkeys(
        ("check_and_heal", "storage_report", "data_docs", "kip896_report"), "success"
    )
    assert (paths.root / "reports" / "storage.json").is_file()
    assert (paths.data_docs / "site" / "index.html").is_file()
    summary = json.loads((paths.root / "reports" / "kip896" / "latest.json").read_text())
    assert summary["frames"] == len(round_frames(0, 10**18))
    assert summary["ready_for_4_0"] == (summary["removed_in_4_0"] == [])
    assert not (paths.root.parent / "airflow").exists()  # a stopped job is left alone: no alert spooled
