from __future__ import annotations

from checks.alerts import Alert, AlertBook
from checks.model import Finding, Severity


def _finding(
    offset: int, ts: int, severity: Severity = Severity.WARNING, incomplete: bool = False
) -> Finding:
    return Finding(
        "producer.stale_epoch_rejected",
        severity,
        "producer:7",
        "zombie write",
        ts,
        {"offsets": [[0, offset]]},
        incomplete,
    )


def test_repeated_findings_update_one_alert_with_a_stable_id() -> None:
    book = AlertBook()
    first = book.add(_finding(10, 100))
    again = book.add(_finding(11, 90, Severity.CRITICAL))
    assert first is again and again.count == 2
    assert (again.first_seen, again.last_seen) == (90, 100)
    assert again.severity == Severity.CRITICAL
    # A replay (new book, same frames) gives the same id; other frames give another id.
    assert AlertBook().add(_finding(10, 100)).id == first.id
    assert AlertBook().add(_finding(12, 100)).id != first.id


def test_resolve_closes_and_round_trips_as_plain_data() -> None:
    book = AlertBook()
    alert = book.add(_finding(1, 5))
    resolved = book.resolve(alert.rule, alert.subject, 50)
    assert resolved is not None and resolved.status == "resolved" and resolved.last_seen == 50
    assert book.resolve(alert.rule, alert.subject, 60) is None
    assert Alert.from_dict(resolved.to_dict()) == resolved


def test_incomplete_findings_never_alert_above_info() -> None:
    alert = AlertBook().add(_finding(1, 5, Severity.CRITICAL, incomplete=True))
    assert alert.severity == Severity.INFO


def test_the_cluster_is_in_every_alert_and_in_its_id() -> None:
    from checks.alerts import AlertContext

    prod = AlertBook(AlertContext("prod-eu-1", "https://runbooks.example/kpmon/runbook.md"))
    alert = prod.add(_finding(10, 100))
    assert alert.cluster == "prod-eu-1"
    assert alert.runbook_url == "https://runbooks.example/kpmon/runbook.md#producerstale_epoch_rejected"
    # Same cluster, same frames (a restart replaying them): same id. Another cluster: another id.
    assert AlertBook(AlertContext("prod-eu-1")).add(_finding(10, 100)).id == alert.id
    assert AlertBook(AlertContext("prod-us-1")).add(_finding(10, 100)).id != alert.id
    assert alert.to_dict()["cluster"] == "prod-eu-1" and Alert.from_dict(alert.to_dict()) == alert


def test_an_alert_saved_before_alerts_had_context_loads() -> None:
    data = AlertBook().add(_finding(1, 5)).to_dict()
    del data["cluster"], data["runbook_url"]
    assert (Alert.from_dict(data).cluster, Alert.from_dict(data).runbook_url) == ("", "")


def test_runbook_anchors_follow_the_headings() -> None:
    from checks.alerts import AlertContext, runbook_anchor

    assert runbook_anchor("apiversions.out_of_range") == "apiversionsout_of_range"
    assert runbook_anchor("envelope.inner_producer.sequence_gap") == "envelopeinner_"
    assert AlertContext().runbook_url("tap.gap") == "docs/runbook.md#tapgap"
