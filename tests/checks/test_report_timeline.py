"""The report's alert timeline: per-batch results of the streaming job folded into one entry per alert."""

from __future__ import annotations

from typing import Any

from checks.report import (
    ReportData,
    TimelineEntry,
    alert_timeline,
    render_html,
    render_timeline_html,
    render_timeline_svg,
)

S = 1_000_000_000
T0 = 1_700_000_000 * S  # 2023-11-14 22:13:20 UTC


def alert(
    aid: str,
    rule: str,
    severity: str = "warning",
    status: str = "firing",
    first: int = T0,
    last: int | None = None,
    count: int = 1,
    subject: str = "subject",
) -> dict[str, Any]:
    return {
        "id": aid,
        "rule": rule,
        "severity": severity,
        "status": status,
        "first_seen": first,
        "last_seen": first if last is None else last,
        "count": count,
        "subject": subject,
        "summary": f"{rule} happened",
        "evidence": [],
    }


def batches() -> list[dict[str, Any]]:
    return [
        {"batch_id": 0, "alerts": [alert("a", "producer.stale_epoch_rejected", first=T0 + 5 * S)]},
        {"batch_id": 1, "alerts": []},
        {
            "batch_id": 2,
            "alerts": [
                alert("b", "apiversions.out_of_range", "warning", first=T0),
                alert("a", "producer.stale_epoch_rejected", first=T0 + 5 * S, last=T0 + 9 * S, count=3),
            ],
        },
        {
            "batch_id": 3,
            "alerts": [
                alert(
                    "a",
                    "producer.stale_epoch_rejected",
                    status="resolved",
                    first=T0 + 5 * S,
                    last=T0 + 20 * S,
                    count=3,
                ),
                alert("c", "envelope.untrusted_source", "critical", first=T0 + 30 * S, subject="<script>"),
            ],
        },
    ]


def test_one_entry_per_alert_the_newest_update_wins_ordered_by_first_seen() -> None:
    entries = alert_timeline(batches())
    assert [e.id for e in entries] == ["b", "a", "c"]
    a = entries[1]
    assert (a.status, a.count, a.last_seen) == ("resolved", 3, T0 + 20 * S)
    assert entries[2].severity == "critical"


def test_malformed_alerts_are_skipped_not_fatal() -> None:
    broken = [
        {"alerts": [{"id": "x"}, alert("ok", "frame.decode_error"), {"id": "y", "first_seen": "soon"}]},
        {},
    ]
    assert [e.id for e in alert_timeline(broken)] == ["ok"]


def test_svg_has_a_lane_per_rule_most_severe_first_and_marks_resolved_hollow() -> None:
    svg = render_timeline_svg(alert_timeline(batches()))
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    lanes = ["envelope.untrusted_source", "apiversions.out_of_range", "producer.stale_epoch_rejected"]
    positions = [svg.index(f">{rule} (") for rule in lanes]
    assert positions[0] < min(positions[1:]), "critical lane first"
    assert svg.count("<circle") == 3
    assert 'fill="#fff" stroke="#e6a100"' in svg  # the resolved warning
    assert "&lt;script&gt;" in svg and "<script>" not in svg
    assert "22:13:20" in svg  # the axis starts at the first alert, UTC


def test_section_counts_by_rule_and_severity() -> None:
    section = render_timeline_html(alert_timeline(batches()))
    assert "<td>producer.stale_epoch_rejected</td><td>1</td><td>0</td>" in section
    assert "<td>envelope.untrusted_source</td><td>1</td><td>1</td>" in section
    assert render_timeline_html([]) == '<p class="muted">no alerts yet</p>'
    assert render_timeline_svg([]) == ""


def _empty_report() -> ReportData:
    return ReportData(
        source="tap topic t", stats={}, findings=[], coverage=[], fleet=[], groups=[], producers=[]
    )


def test_render_html_adds_the_timeline_and_links_only_when_given() -> None:
    plain = render_html(_empty_report(), None)
    assert "Alert timeline" not in plain and "class='links'" not in plain
    entries: list[TimelineEntry] = alert_timeline(batches())
    page = render_html(
        _empty_report(), None, timeline=entries, links=[("Data Docs", "../stream/data-docs/site/index.html")]
    )
    assert "<h2>Alert timeline</h2>" in page and "<svg" in page
    assert "<a href='../stream/data-docs/site/index.html'>Data Docs</a>" in page
    assert page.index("Alert timeline") < page.index("ApiVersions coverage")


def _summary(page: str) -> str:
    return page.split("<h2>Summary</h2>", 1)[1].split("</pre>", 1)[0]


def test_the_live_summary_counts_the_alerts_it_lists_apart_from_the_findings() -> None:
    # The live report lists the streaming job's alerts by rule; its summary once said "findings: 0"
    # above them, because its findings come from another monitor (the report's own checks).
    entries = alert_timeline(batches())
    summary = _summary(render_html(_empty_report(), None, timeline=entries))
    assert "findings: 0 (this report&#x27;s checks over the records above; see Findings)" in summary
    assert (
        f"alerts: {len(entries)} raised by the streaming job, 2 still firing (see Alert timeline)" in summary
    )
    for entry in entries:
        assert entry.rule in summary
    assert summary.index("alerts:") > summary.index("findings:")


def test_the_capture_summary_has_no_alert_line() -> None:
    summary = _summary(render_html(_empty_report(), None))
    assert "findings: 0\n" in summary + "\n" and "alerts:" not in summary
