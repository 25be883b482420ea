"""Every metric the Grafana dashboard and the alerting rules name is exported by a running tap or job.

A real tap (in front of the tapped cluster, clients' traffic through it) and a real streaming job
(``python -m streaming``) are scraped over HTTP, as Prometheus would; the names in the dashboard's
queries and the rules' expressions must all be there. ``up`` is Prometheus's own.
"""

from __future__ import annotations

import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kpmon.traffic import violations, workload
from tests.deploy.test_prometheus_rules import dashboard_exprs, metric_names, rules
from tests.streaming.jobproc import KeepTrafficFlowing, StreamProcess, write_config
from tests.tap.harness import TappedCluster, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def scrape(port: int) -> set[str]:
    """The sample names (``x_total``, ``y_bucket``...) a metrics endpoint exports."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


@pytest.mark.timeout(900)
def test_the_dashboard_and_the_rules_name_only_real_metrics(
    tapped_cluster: TappedCluster, tmp_path: Path
) -> None:
    tap_port = free_port()
    tap, topic = tapped_cluster.start_tap()
    tap.tap.metrics.serve(tap_port, "127.0.0.1")
    stream_port = free_port()
    config = {
        "state_dir": str(tmp_path / "state"),
        "kafka": {"bootstrap_servers": tapped_cluster.bootstrap},
        "tap": {"topic": topic, "cluster": {"bootstrap_servers": tapped_cluster.mirror_bootstrap}},
        "stream": {
            "master": "local[2]",
            "shuffle_partitions": 2,
            "trigger_seconds": 1.0,
            "metrics_port": stream_port,
        },
        "checks": {"watermark_seconds": 2.0},
        "alerts": {"hooks": [{"kind": "log"}]},
    }
    job = StreamProcess(
        write_config(tmp_path / "kpmon.yaml", config), tmp_path / "state", tmp_path / "job.log"
    )
    keepalive = KeepTrafficFlowing(tapped_cluster.bootstrap, f"quiet-{uuid.uuid4().hex[:6]}")
    try:
        # Traffic through the tap: clean clients and an error response, so traffic series exist.
        workload.clean_round(tapped_cluster.bootstrap, f"clean-{uuid.uuid4().hex[:6]}", "metrics-group")
        violations.mixed_protocol_group(
            tapped_cluster.bootstrap, f"mixed-{uuid.uuid4().hex[:6]}", "mixed-topic"
        )
        job.start()
        keepalive.start()
        job.wait_batches(2, timeout=600)
        exported = scrape(tap_port) | scrape(stream_port)
    finally:
        keepalive.stop()
        job.stop()
        tap.stop()
    named = set().union(
        *(metric_names(e) for e in dashboard_exprs()), *(metric_names(r["expr"]) for r in rules())
    )
    named.discard("up")
    assert len(named) >= 25
    missing = sorted(named - exported)
    assert not missing, f"named by the dashboard or the rules but not exported: {missing}"
    # The traffic series carry the API name, broker and listener labels (docs/tap.md).
    assert "kpmon_tap_frames_total" in exported and "kpmon_alert_hook_pending" in exported
