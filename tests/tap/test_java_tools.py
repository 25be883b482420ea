"""Kafka's Java tools through the tap give the same results as a direct run, and the tap topic is whole."""

from __future__ import annotations

import shutil
import uuid

import pytest

from tests.tap.conftest import TappedCluster
from tests.tap.harness import read_topic
from tests.tap.test_real_clients import check_tap_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.java]


def test_java_tools_through_the_tap(tapped_cluster: TappedCluster) -> None:
    if shutil.which("java") is None:
        pytest.skip("no JDK")
    tools = pytest.importorskip("deploy.local.tools")
    from deploy.versions import KAFKA_LATEST, KAFKA_LEGACY

    tapped, direct = tapped_cluster.bootstrap, tapped_cluster.mirror_bootstrap

    # The 4.4.0 tool set resolves kafka-tools 4.3.1 against 4.4.0 client jars, which fails with
    # NoClassDefFoundError (common.utils.Exit moved); the 3.9 tools speak to a 4.4 broker just as well.
    probe = tools.run_tool(KAFKA_LATEST, "kafka-topics", ["--bootstrap-server", direct, "--list"], timeout=60)
    version = KAFKA_LEGACY if "NoClassDefFoundError" in probe.stderr else KAFKA_LATEST

    def run(tool: str, args: list[str], stdin: str | None = None) -> str:
        done = tools.run_tool(version, tool, args, timeout=120, input=stdin)
        assert done.returncode == 0, done.stderr[-2000:]
        return str(done.stdout)

    t, tap_topic = tapped_cluster.start_tap(capture="full")
    topic = f"java-{uuid.uuid4().hex[:6]}"
    lines = [f"line-{i}" for i in range(50)]
    try:
        run("kafka-topics", ["--bootstrap-server", tapped, "--create", "--topic", topic, "--partitions", "2"])
        describe_args = ["--describe", "--topic", topic]
        assert run("kafka-topics", ["--bootstrap-server", tapped, *describe_args]) == run(
            "kafka-topics", ["--bootstrap-server", direct, *describe_args]
        )
        run(
            "kafka-console-producer",
            ["--bootstrap-server", tapped, "--topic", topic],
            "\n".join(lines) + "\n",
        )
        consume = ["--topic", topic, "--from-beginning", "--max-messages", "50", "--timeout-ms", "20000"]
        via_tap = run("kafka-console-consumer", ["--bootstrap-server", tapped, *consume]).split()
        via_direct = run("kafka-console-consumer", ["--bootstrap-server", direct, *consume]).split()
        assert sorted(via_tap) == sorted(via_direct) == sorted(lines)
        perf = run(
            "kafka-producer-perf-test",
            [
                *("--topic", topic, "--num-records", "20000", "--record-size", "1024", "--throughput", "-1"),
                *("--producer-props", f"bootstrap.servers={tapped}", "acks=all"),
            ],
        )
        assert "20000 records sent" in perf
        t.wait_idle()
        t.tap.sink.close(10)
        records = read_topic(tapped_cluster.mirror_bootstrap, tap_topic)
    finally:
        t.stop()
    counts = check_tap_topic(records)
    assert counts["conns"] >= 4 and counts["req"] > 0
    assert t.metric("kpmon_tap_mirror_drops_total") == 0
