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
