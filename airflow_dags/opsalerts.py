"""Operational alerts from the DAGs (rolled-back redeploys, unhealthy jobs) through the job's own hooks.

They follow the alert contract (ARCHITECTURE.md): deterministic ids, so a retried DAG task re-sends the
same id and receivers deduplicate. The running job holds the lock on its own hook spool, so the DAGs
spool in ``<state_dir>/airflow/hooks-spool`` instead.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from checks.alerts import Alert, AlertContext, stable_id
from checks.model import Severity
from kpconfig.model import KpmonConfig
from streaming.paths import StreamPaths

log = logging.getLogger("kpmon.airflow")

ROLLED_BACK = "ops.redeploy_rolled_back"
UNHEALTHY = "ops.stream_unhealthy"


def ops_alert_id(rule: str, subject: str, episode: str, cluster: str = "") -> str:
    return stable_id(cluster, rule, subject, episode)


def ops_alert(
    rule: str,
    severity: Severity,
    subject: str,
    summary: str,
    episode: str,
    evidence: dict[str, Any],
    context: AlertContext,
    now_ns: int | None = None,
) -> Alert:
    """One firing alert; ``episode`` names the occurrence (a DAG run, a stalled batch) for the id;
    ``context`` (``KpmonConfig.alert_context()``) gives the cluster and the runbook link."""
    now = now_ns if now_ns is not None else time.time_ns()
    return Alert(
        id=ops_alert_id(rule, subject, episode, context.cluster),
        rule=rule,
        severity=severity,
        status="firing",
        first_seen=now,
        last_seen=now,
        count=1,
        subject=subject,
        summary=summary,
        evidence=[evidence],
        cluster=context.cluster,
        runbook_url=context.runbook_url(rule),
    )


def spool_dir(config: KpmonConfig) -> Path:
    return StreamPaths.of(config).root.parent / "airflow" / "hooks-spool"


def publish(config: KpmonConfig, alerts: list[Alert], timeout: float = 30.0) -> dict[str, Any]:
    """Deliver through ``config.alerts.hooks``; waits up to ``timeout`` for delivery. What is not delivered
    by then stays in the spool and goes out with the next DAG run's alerts."""
    from streaming.hooks import AlertHooks, SpoolLockedError

    deadline = time.monotonic() + timeout
    while True:
        try:
            hooks = AlertHooks(config, spool_dir(config))
            break
        except SpoolLockedError:
            # Another DAG task is publishing (a health check during a rollback): it is done in seconds.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    try:
        hooks.publish(alerts)
        delivered = hooks.flush(timeout)
        stats = hooks.stats()
    finally:
        hooks.close(5.0)
    for alert in alerts:
        log.warning(
            "ops alert %s %s on %s: %s", alert.severity.value, alert.rule, alert.subject, alert.summary
        )
    if not delivered:
        log.error(
            "ops alerts: not every hook delivered within %.0f s (kept in the spool): %s", timeout, stats
        )
    return {"delivered": delivered, "hooks": stats}
