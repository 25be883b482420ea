"""Findings grouped into alerts, per the alert contract in ARCHITECTURE.md.

An alert is one (rule, subject) that is firing: repeated findings update its ``last_seen`` and ``count``
instead of raising new alerts. Its id is deterministic — derived from the cluster, the rule, the subject
and the tap offsets of the first finding — so a replay after a restart produces the same id, and
receivers can deduplicate on it; two clusters never share an id. Incomplete findings (the tap lost records)
never open an alert above ``info``.

Every alert carries its context (:class:`AlertContext`): the cluster it was raised for and the link to
the rule's section of docs/runbook.md, so whoever receives it knows where to look and what to do.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from checks.model import Finding, Severity

#: Evidence kept per alert: the first few findings' evidence, so the alert stays bounded in size.
MAX_EVIDENCE = 5

#: Where the runbook is when ``alerts.runbook_base_url`` is not set: the repository path of docs/runbook.md.
DEFAULT_RUNBOOK = "docs/runbook.md"
#: Rules ``envelope.inner_<rule>`` (a rule's finding inside a forwarded Envelope, KIP-590) share one section.
ENVELOPE_INNER_PREFIX = "envelope.inner_"
#: Rules never reported about an Envelope's inner exchange, so never with the prefix: the tap's and the
#: frame's own reports (about tap records, not requests), a timer's (``txn.hanging``), the fleet count
#: (it skips forwarded requests: the client's own request was counted), and the Envelope rules themselves.
OUTSIDE_ENVELOPES: Final = frozenset(
    {
        "tap.gap",
        "tap.blind",
        "tap.worker_lost",
        "tap.tap_start",
        "frame.decode_error",
        "txn.hanging",
        "apiversions.removed_in_4_0",
    }
)


def inner_rule_ids(rules: Iterable[str]) -> frozenset[str]:
    """The ``envelope.inner_`` ids ``rules`` can take: each rule a forwarded exchange can break."""
    return frozenset(
        ENVELOPE_INNER_PREFIX + rule
        for rule in rules
        if not rule.startswith("envelope.") and rule not in OUTSIDE_ENVELOPES
    )


def runbook_anchor(rule: str) -> str:
    """The anchor of ``rule``'s section in docs/runbook.md (its heading is the rule id in backticks).

    GitHub's anchor for a heading: lower case, punctuation other than ``-`` and ``_`` dropped, so
    ``apiversions.out_of_range`` -> ``apiversionsout_of_range``.
    """
    heading = "envelope.inner_*" if rule.startswith(ENVELOPE_INNER_PREFIX) else rule
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


@dataclass(frozen=True)
class AlertContext:
    """What every alert of one monitor carries besides its finding: the cluster and the runbook's base.

    ``cluster`` is part of the alert id's input: it comes from the config, so ids stay the same across
    restarts of the same monitor and differ between clusters.
    """

    cluster: str = ""
    runbook_base: str = DEFAULT_RUNBOOK

    def runbook_url(self, rule: str) -> str:
        return f"{self.runbook_base}#{runbook_anchor(rule)}"


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
    #: The monitored cluster (``AlertContext.cluster``).
    cluster: str = ""
    #: The rule's section of the runbook (``AlertContext.runbook_url``).
    runbook_url: str = ""

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
            "cluster": self.cluster,
            "runbook_url": self.runbook_url,
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
            # Alert books and spools written before alerts had context have neither field.
            cluster=str(data.get("cluster", "")),
            runbook_url=str(data.get("runbook_url", "")),
        )


def stable_id(cluster: str, rule: str, subject: str, occurrence: str) -> str:
    """The alert id: a hash of where (cluster), what (rule, subject) and which occurrence it is."""
    key = f"alert|{cluster}|{rule}|{subject}|{occurrence}"
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def alert_id(finding: Finding, cluster: str = "") -> str:
    anchor = finding.evidence.get("offsets") or [[finding.evidence.get("conn"), finding.evidence.get("seq")]]
    return stable_id(cluster, finding.rule, finding.subject, str(anchor[0]))


class AlertBook:
    """Open alerts by (rule, subject). Plain data in and out, so it can live in any state store."""

    def __init__(self, context: AlertContext | None = None) -> None:
        self.context = context or AlertContext()
        self.open: dict[tuple[str, str], Alert] = {}

    def add(self, finding: Finding) -> Alert:
        """Fold one finding in; returns the alert it opened or updated (status ``firing``)."""
        key = (finding.rule, finding.subject)
        alert = self.open.get(key)
        severity = Severity.INFO if finding.incomplete else finding.severity
        if alert is None:
            alert = Alert(
                id=alert_id(finding, self.context.cluster),
                rule=finding.rule,
                severity=severity,
                status="firing",
                first_seen=finding.ts_ns,
                last_seen=finding.ts_ns,
                count=1,
                subject=finding.subject,
                summary=finding.summary,
                evidence=[finding.evidence],
                cluster=self.context.cluster,
                runbook_url=self.context.runbook_url(finding.rule),
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
