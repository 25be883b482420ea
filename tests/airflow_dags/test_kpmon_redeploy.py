"""``kpmon_redeploy`` end to end: the real DAG under ``dag.test()``, real Spark jobs, a real broker.

One story, shared by the tests below because every Spark start costs a minute or more here:

1. the job (config A) runs on a tap topic that ``TapTraffic`` keeps writing rounds of the every-rule
   scenario to;
2. a broken version (config C: its tap cluster is unreachable) is deployed: validation and canary pass
   (same query shape, same checks), the old job is stopped and C started from the checkpoint; C stalls,
   the health gate fails, and the rollback stops C and restarts A, which goes on processing;
3. the rollback alert arrives at a webhook receiver on loopback, through A's own hooks;
4. a good version (config B) is deployed and passes its health gate;
5. after the traffic stops and B catches up, every finding of the tap topic (one monitor over every
   record, the batch-mode reference) is in the job's per-batch results: nothing was lost across the
   stop, the failed start, the rollback and the swap.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_dags import jobctl
from airflow_dags.opsalerts import ROLLED_BACK, ops_alert_id
from kpconfig.model import load_config
from streaming.paths import StreamPaths
from tests.airflow_dags.stories import STREAM as CLUSTER_STREAM
from tests.airflow_dags.stories import batch_after, compare_with_reference, config_file, redeploy
from tests.airflow_dags.traffic import TapTraffic, wait_for
from tests.streaming.hooks.receiver import Receiver
from tests.tap.harness import topic_end_offsets

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: One Spark start, to its first completed batch, takes 1-3 minutes on a loaded 2-core machine.
FIRST_BATCH_SECONDS = 420.0
STREAM = {**CLUSTER_STREAM, "master": "local[1]"}
RUN = {
    "canary_minutes": 10,
    "health_batches": 1,
    "start_timeout_seconds": 360,
    "health_timeout_seconds": FIRST_BATCH_SECONDS,
    "stop_timeout_seconds": 90,
}


@dataclass
class Story:
    topic: str
    bootstrap: str
    configs: dict[str, str]
    paths: StreamPaths
    receiver: Receiver
    traffic: TapTraffic
    offsets: dict[str, int] = field(default_factory=dict)
    runs: dict[str, Any] = field(default_factory=dict)


def _end(story: Story) -> int:
    return topic_end_offsets(story.bootstrap, story.topic).get(0, 0)


@pytest.fixture(scope="module")
def story(kafka_stack: Any, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    from confluent_kafka.admin import AdminClient, NewTopic

    tmp = tmp_path_factory.mktemp("redeploy")
    topic = f"kpmon-tap-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    del admin
    receiver = Receiver().start()
    hook = {
        "kind": "webhook",
        "url": receiver.url,
        "backoff_initial_seconds": 0.1,
        "backoff_max_seconds": 1.0,
    }
    base = {
        "state_dir": str(tmp / "state"),
        "kafka": {"bootstrap_servers": kafka_stack.bootstrap_servers},
        "tap": {"topic": topic},
        "stream": STREAM,
        "checks": {"watermark_seconds": 2.0},
        "quality": {"data_docs": False},
        "alerts": {"hooks": [hook]},
    }
    configs = {
        "A": config_file(tmp, "a", base),
        "B": config_file(tmp, "b", base, stream={"trigger_seconds": 1.5}),
        # Unreachable tap cluster; it stalls long before Spark's own Kafka timeouts (minutes) fail it.
        "C": config_file(
            tmp, "c", base, kafka={"bootstrap_servers": "127.0.0.1:1"}, stream={"stall_seconds": 30}
        ),
    }
    paths = StreamPaths.of(load_config(configs["A"]))
    traffic = TapTraffic(kafka_stack.bootstrap_servers, topic, base_ns=time.time_ns(), chunk=6).start()
    story = Story(topic, kafka_stack.bootstrap_servers, configs, paths, receiver, traffic)
    try:
        started = time.time()
        record = jobctl.spawn(jobctl.JobSpec(sys.executable, configs["A"]), paths)
        wait_for(
            lambda: batch_after(paths, started, 0) or not jobctl.is_alive(record.pid),
            FIRST_BATCH_SECONDS,
            "the first job's batches",
        )
        assert jobctl.is_alive(record.pid), jobctl.tail(record.log)
        yield story
    finally:
        traffic.stop()
        pid = jobctl.running_pid(paths)
        if pid is not None:
            jobctl.stop(paths, pid, timeout=60, term_grace=10)
        receiver.stop()


def test_a_broken_version_is_rolled_back_leaving_the_old_one_running(story: Story) -> None:
    before = jobctl.read_record(story.paths)
    assert before is not None and before.config == story.configs["A"]
    story.offsets["before_broken"] = _end(story)
    run, states, journal = redeploy(story.configs["C"], story.configs["A"], RUN)
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
    assert str(getattr(run.state, "value", run.state)) == "failed"
    assert journal["validate"]["problems"] == [] and journal["validate"]["new"]["resumes"] is True
    assert journal["stop_current"]["how"] == "graceful" and journal["stop_current"]["pid"] == before.pid
    # It stalls (no progress for C's stall_seconds) unless Spark's Kafka admin gives up first.
    assert journal["health_gate.failed"]["error"].startswith(
        ("health gate failed: stalled", "health gate failed: failed")
    )
    rollback = journal["rollback"]
    assert rollback["rolled_back"] and rollback["failed_step"] == "health_gate"
    broken_pid = journal["start_new"]["pid"]
    assert not jobctl.is_alive(broken_pid)
    restarted = rollback["restarted"]
    assert restarted["config"] == story.configs["A"] and restarted["python"] == before.python
    assert jobctl.running_pid(story.paths) == restarted["pid"]
    # The old version runs again, from the checkpoint, and processes what arrived meanwhile.
    wait_for(
        lambda: batch_after(story.paths, restarted["started_at"], journal["stop_current"]["batch_id"]),
        FIRST_BATCH_SECONDS,
        "a batch from the restarted job",
    )
    assert jobctl.is_alive(restarted["pid"])
    story.offsets["after_broken"] = _end(story)


def test_the_rollback_alert_arrives(story: Story) -> None:
    run = story.runs.get("broken")
    assert run is not None, "needs the broken-version run"

    def rolled_back(requests: list[Any]) -> bool:
        return any(r.body.get("rule") == ROLLED_BACK for r in requests)

    assert story.receiver.wait_for(rolled_back, timeout=60)
    alerts = [r.body for r in story.receiver.requests if r.body.get("rule") == ROLLED_BACK]
    assert len(alerts) == 1
    alert = alerts[0]
    subject = f"stream:{story.paths.root}"
    cluster = alert["cluster"]
    assert cluster  # the config's cluster name (default: its bootstrap servers)
    assert alert["id"] == ops_alert_id(ROLLED_BACK, subject, run.run_id, cluster)  # deterministic per run
    assert alert["runbook_url"].endswith("#opsredeploy_rolled_back")
    assert (alert["severity"], alert["status"], alert["subject"]) == ("critical", "firing", subject)
    evidence = alert["evidence"][0]
    assert evidence["failed_step"] == "health_gate" and evidence["new"]["config"] == story.configs["C"]
    assert evidence["previous"]["config"] == story.configs["A"]
    assert "restarted the previous build" in alert["summary"]


def test_a_good_version_swaps_with_no_lost_findings(story: Story) -> None:
    old = jobctl.read_record(story.paths)
    assert old is not None
    run, states, journal = redeploy(story.configs["B"], story.configs["A"], RUN)
    assert states == {
        "validate": "success",
        "canary": "success",
        "stop_current": "success",
        "start_new": "success",
        "health_gate": "success",
        "rollback": "skipped",
        "deploy_failed": "skipped",
    }, journal
    assert str(getattr(run.state, "value", run.state)) == "success"
    comparison = journal["canary"]["comparison"]
    assert journal["canary"]["records"] > 0 and comparison["running"] > 0
    assert [d for d in comparison["missing"] if d["cause"] != "window edge"] == []
    assert journal["stop_current"]["pid"] == old.pid and journal["stop_current"]["how"] == "graceful"
    now = jobctl.read_record(story.paths)
    assert now is not None and now.config == story.configs["B"] and jobctl.running_pid(story.paths) == now.pid
    assert "rollback" not in journal

    # Let the traffic finish its round, then wait for B to read everything and move its watermark past it.
    compared = compare_with_reference(
        story.traffic, story.bootstrap, story.topic, story.configs["B"], story.paths, "the new job"
    )
    expected, found = compared.expected, compared.found
    missing = sorted((expected[i].rule, expected[i].subject) for i in expected.keys() - found)
    assert missing == [], f"{len(missing)} findings lost: {missing[:10]}"
    assert found == set(expected)
    # The comparison covers records from before, during and after both deploys.
    offsets = sorted(o for f in expected.values() for _p, o in f.evidence.get("offsets", []) if o is not None)
    assert offsets[0] < story.offsets["before_broken"] < story.offsets["after_broken"] < offsets[-1]
    rules = {f.rule for f in expected.values()}
    assert {"producer.stale_epoch_rejected", "envelope.untrusted_source", "txn.hanging", "tap.gap"} <= rules
