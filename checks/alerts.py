"""Findings grouped into alerts, per the alert contract in ARCHITECTURE.md.

An alert is one (rule, subject) that is firing: repeated findings update its ``last_seen`` and ``count``
instead of raising new alerts. Its id is deterministic — derived from the rule, the subject and the tap
offsets of the first finding — so a replay after a restart produces the same id, and receivers can
deduplicate on it. Incomplete findings (after a tap gap) never open an alert above ``info``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from checks.model import Finding, Severity

#: Evidence kept per alert: the first few findings' evidence, so the alert stays bounded in size.
MAX_EVIDENCE = 5


@dataclass
class Alert:
    id: str
    rule: str
    severity: Severity
    status: str
    first_seen: int
    last_seen: int
    count: int
    subject: str
    summary: str
    evidence: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rule": self.rule,
            "severity": self.severity.value,
            "status": self.status,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "count": self.count,
            "subject": self.subject,
            "summary": self.summary,
            "evidence": self.evidence,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Alert:
        return Alert(
            id=data["id"],
            rule=data["rule"],
            severity=Severity(data["severity"]),
            status=data["status"],
            first_seen=data["first_seen"],
            last_seen=data["last_seen"],
            count=data["count"],
            subject=data["subject"],
            summary=data["summary"],
            evidence=list(data.get("evidence", [])),
        )


def alert_id(finding: Finding) -> str:
    anchor = finding.evidence.get("offsets") or [[finding.evidence.get("conn"), finding.evidence.get("seq")]]
    key = f"alert|{finding.rule}|{finding.subject}|{anchor[0]}"
    return hashlib.sha256(key.encode()).hexdigest()[:24]


class AlertBook:
    """Open alerts by (rule, subject). Plain data in and out, so it can live in any state store."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, str], Alert] = {}

    def add(self, finding: Finding) -> Alert:
        """Fold one finding in; returns the alert it opened or updated (status ``firing``)."""
        key = (finding.rule, finding.subject)
        alert = self.open.get(key)
        severity = Severity.INFO if finding.incomplete else finding.severity
        if alert is None:
            alert = Alert(
                id=alert_id(finding),
                rule=finding.rule,
                severity=severity,
                status="firing",
                first_seen=finding.ts_ns,
                last_seen=finding.ts_ns,
                count=1,
                subject=finding.subject,
                summary=finding.summary,
                evidence=[finding.evidence],
            )
            self.open[key] = alert
            return alert
        alert.count += 1
        alert.first_seen = min(alert.first_seen, finding.ts_ns)
        alert.last_seen = max(alert.last_seen, finding.ts_ns)
        if severity.rank > alert.severity.rank:
            alert.severity = severity
            alert.summary = finding.summary
        if len(alert.evidence) < MAX_EVIDENCE:
            alert.evidence.append(finding.evidence)
        return alert

    def resolve(self, rule: str, subject: str, ts_ns: int) -> Alert | None:
        """Close (rule, subject); returns the resolved alert, or None if it was not open."""
        alert = self.open.pop((rule, subject), None)
        if alert is None:
            return None
        alert.status = "resolved"
        alert.last_seen = max(alert.last_seen, ts_ns)
        return alert
