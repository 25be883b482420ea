"""The alerting rules and the Grafana dashboard for kpmon itself (deploy/prometheus, deploy/grafana).

``promtool check rules`` and ``promtool test rules`` (tests/deploy/prometheus/kpmon-rules-test.yaml)
judge the rules; promtool comes from Debian's ``prometheus`` package, which ``make setup`` installs
(Makefile); the rules use nothing newer than its Prometheus 2.42. That the metrics they name are really
exported is tests/deploy/test_monitoring_metrics.py's job.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "kpmon-rules.yaml"
RULE_TESTS = ROOT / "tests" / "deploy" / "prometheus" / "kpmon-rules-test.yaml"
PROMETHEUS_RULE = ROOT / "deploy" / "k8s" / "prometheusrule.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "kpmon-dashboard.json"
OPERATIONS = ROOT / "docs" / "operations.md"

#: What the issue asks the dashboard and the rules to watch, by the metric that shows it.
WATCHED = {
    "tap mirror drops": "kpmon_tap_mirror_drops_total",
    "tap queue depth": "kpmon_tap_mirror_queue_depth",
    "tap added latency": "kpmon_tap_inside_seconds_bucket",
    "stream lag": "kpmon_stream_lag_records",
    "batch duration": "kpmon_stream_batch_duration_seconds_bucket",
    "watermark delay": "kpmon_stream_watermark_lag_seconds",
    "hook failures": "kpmon_alert_hook_requests_total",
    "dead letters": "kpmon_alert_hook_alerts_total",
    "job liveness": "kpmon_stream_last_progress_timestamp_seconds",
}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: `make setup` installs it (Debian package prometheus)")
    return found


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """kpmon metric names and ``up`` in a PromQL expression."""
    return set(re.findall(r"\b(kpmon_[a-z0-9_]+|up)\b(?=\s*[{\[)]|\s*$|\s*[-+/*<>=])", expr))


def test_metric_names_are_found_in_promql() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(kpmon_stream_batch_duration_seconds_bucket{job="x"}[5m])))'
    )
    assert metric_names(expr) == {"kpmon_stream_batch_duration_seconds_bucket"}
    assert metric_names('up{job="kpmon-stream"} == 0 or absent(up{job="kpmon-stream"})') == {"up"}
    assert metric_names("time() - kpmon_stream_last_progress_timestamp_seconds > 300") == {
        "kpmon_stream_last_progress_timestamp_seconds"
    }


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout, done.stdout


def test_promtool_unit_tests_pass() -> None:
    done = subprocess.run(
        [promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, cwd=RULE_TESTS.parent
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_rejects_a_broken_rule_and_a_wrong_expectation(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(RULES.read_text().replace("increase(kpmon_tap_mirror_drops_total[5m])", "increase(", 1))
    done = subprocess.run([promtool(), "check", "rules", str(broken)], capture_output=True, text=True)
    assert done.returncode != 0
    # The unit tests can fail: the drops alert expected at 2 minutes, before any drop.
    cases = yaml.safe_load(RULE_TESTS.read_text())
    cases["rule_files"] = [str(RULES)]
    first = cases["tests"][0]["alert_rule_test"][0]
    assert (first["alertname"], first["eval_time"], first["exp_alerts"]) == ("KpmonTapMirrorDrops", "2m", [])
    first["exp_alerts"] = [{"exp_labels": {"severity": "critical", "instance": "tap-1:9464"}}]
    wrong = tmp_path / "wrong-test.yaml"
    wrong.write_text(yaml.safe_dump(cases))
    done = subprocess.run([promtool(), "test", "rules", str(wrong)], capture_output=True, text=True)
    assert done.returncode != 0 and "KpmonTapMirrorDrops" in done.stdout + done.stderr


def test_every_alert_is_unit_tested_and_links_its_runbook_section() -> None:
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    from tests.docs.test_doc_paths import anchors

    sections = anchors(OPERATIONS.read_text())
    for rule in rules():
        name = rule["alert"]
        assert name in tested, f"{name} has no promtool test case"
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        url = rule["annotations"]["runbook_url"]
        assert url == f"docs/operations.md#{name.lower()}", (name, url)
        assert name.lower() in sections, f"docs/operations.md has no section for {name}"


def test_the_prometheusrule_manifest_carries_the_same_rules() -> None:
    manifest = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert manifest["kind"] == "PrometheusRule" and manifest["apiVersion"] == "monitoring.coreos.com/v1"
    assert manifest["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_the_dashboard_and_the_rules_watch_what_the_issue_names() -> None:
    named = set().union(*(metric_names(e) for e in dashboard_exprs()))
    alerted = set().union(*(metric_names(r["expr"]) for r in rules()))
    for what, metric in WATCHED.items():
        assert metric in named, f"no dashboard panel shows {what} ({metric})"
        assert metric in alerted, f"no alert rule watches {what} ({metric})"
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "kpmon-self" and len(dash["panels"]) >= 20
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_the_docs_renderer_draws_every_panel_where_the_dashboard_puts_it(tmp_path: Path) -> None:
    from deploy.dashboard import VARIABLES, render, substitute

    asked: list[str] = []

    def query(
        expr: str, start: float, end: float, step: float
    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        asked.append(expr)
        return [({"instance": "tap-1:9464"}, [(start + i * step, float(i)) for i in range(10)])]

    out = tmp_path / "dash.png"
    drawn = render(json.loads(DASHBOARD.read_text()), query, 0.0, 600.0, out)
    assert drawn == len(dashboard_exprs()) == len(asked)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not any(name in expr for expr in asked for name in VARIABLES)  # every variable substituted
    assert substitute('up{job="$stream_job"}') == 'up{job="kpmon-stream"}'
