"""Alerts for the hook tests, built the way checks.alerts builds them."""

from __future__ import annotations

from typing import Any

from checks.alerts import Alert, AlertContext
from checks.model import Severity

T0 = 1_763_000_000_000_000_000
CLUSTER = "prod-eu-1"
RUNBOOK = "https://runbooks.example.com/kpmon/runbook.md"


def alert(
    alert_id: str = "a1",
    *,
    rule: str = "group.join.protocol_type_null",
    severity: str = "warning",
    status: str = "firing",
    subject: str = "group:g1",
    summary: str = "JoinGroup v7 response without ProtocolType",
    count: int = 1,
    first_seen: int = T0,
    last_seen: int | None = None,
    evidence: list[dict[str, Any]] | None = None,
    cluster: str = CLUSTER,
    runbook_url: str | None = None,
) -> Alert:
    return Alert(
        id=alert_id,
        rule=rule,
        severity=Severity(severity),
        status=status,
        first_seen=first_seen,
        last_seen=first_seen if last_seen is None else last_seen,
        count=count,
        subject=subject,
        summary=summary,
        evidence=evidence
        if evidence is not None
        else [{"partition": 0, "offset": 42, "conn": "c1", "seq": 7}],
        cluster=cluster,
        runbook_url=AlertContext(cluster, RUNBOOK).runbook_url(rule) if runbook_url is None else runbook_url,
    )


def payload(alert_id: str = "a1", **kwargs: Any) -> dict[str, Any]:
    """The alert dict the core and the formatters work on."""
    from streaming.hooks.formatters import alert_payload

    return alert_payload(alert(alert_id, **kwargs))
