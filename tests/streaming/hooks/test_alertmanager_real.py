"""The alertmanager hook against a real Alertmanager: it accepts our payloads and tracks the alerts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from streaming.hooks import AlertHooks
from tests.streaming.hooks.alertmanager import alertmanager_binary, current_alerts, running_alertmanager
from tests.streaming.hooks.builders import CLUSTER, RUNBOOK, T0, alert
from tests.streaming.hooks.conftest import hooks_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def alertmanager_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = alertmanager_binary()
    if binary is None:
        pytest.skip("no Alertmanager: `make setup` installs it (Debian package prometheus-alertmanager)")
    with running_alertmanager(binary, tmp_path_factory.mktemp("alertmanager")) as url:
        yield url


def _find(url: str, alert_id: str) -> dict[str, Any] | None:
    return next((a for a in current_alerts(url) if a["labels"].get("alert_id") == alert_id), None)


def _eventually(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_firing_then_resolved(
    alertmanager_url: str, make_hooks: Callable[..., AlertHooks], tmp_path: Path
) -> None:
    config = hooks_config(
        {"kind": "alertmanager", "url": alertmanager_url, "labels": {"team": "kafka"}, "resend_seconds": 0.5}
    )
    hooks = make_hooks(config)
    hooks.publish([alert("am1", severity="critical", subject="group:<g&1>", count=4)])
    assert hooks.flush(10.0), hooks.stats()
    assert _eventually(lambda: _find(alertmanager_url, "am1") is not None)
    seen = _find(alertmanager_url, "am1")
    assert seen is not None
    assert {k: seen["labels"][k] for k in ("alertname", "severity", "subject", "team", "instance")} == {
        "alertname": "group.join.protocol_type_null",
        "severity": "critical",
        "subject": "group:<g&1>",
        "team": "kafka",
        "instance": "kpmon",
    }
    assert seen["annotations"]["count"] == "4"
    # The alert's context survives Alertmanager: the cluster label and the runbook_url annotation.
    assert seen["labels"]["cluster"] == CLUSTER
    assert seen["annotations"]["runbook_url"] == f"{RUNBOOK}#groupjoinprotocol_type_null"
    assert datetime.fromisoformat(seen["startsAt"]).timestamp() == pytest.approx(T0 / 1e9)
    assert seen["status"]["state"] in ("active", "unprocessed")
    # Firing alerts carry no endsAt: Alertmanager sets now + resolve_timeout, and the re-sends push it on.
    first_ends = datetime.fromisoformat(seen["endsAt"])
    assert _eventually(lambda: datetime.fromisoformat(_find(alertmanager_url, "am1")["endsAt"]) > first_ends)  # type: ignore[index]

    hooks.publish(
        [alert("am1", status="resolved", severity="critical", subject="group:<g&1>", last_seen=T0 + 10**9)]
    )
    assert hooks.flush(10.0)
    assert _eventually(lambda: _find(alertmanager_url, "am1") is None)
    assert hooks.stats()["alertmanager"]["dropped"] == 0
