from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checks.alerts import Alert
from streaming.hooks.formatters import (
    ALERTMANAGER_EVIDENCE_CHARS,
    PAGERDUTY_SUMMARY_CHARS,
    SLACK_CONTEXT_CHARS,
    SLACK_HEADER_CHARS,
    SLACK_MAX_BLOCKS,
    SLACK_MAX_DETAILED,
    SLACK_SECTION_CHARS,
    InvalidAlert,
    alert_payload,
    alertmanager_alert,
    alertmanager_body,
    encode,
    json_safe,
    kafka_record,
    pagerduty_event,
    rfc3339,
    slack_escape,
    slack_payload,
    webhook_body,
)
from streaming.hooks.log_sender import LogSender, log_line
from tests.streaming.hooks.builders import RUNBOOK, T0, alert, payload

# ----- strategies ------------------------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.binary(max_size=16),
)
_evidence_values = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(st.text(max_size=8), children, max_size=4),
    ),
    max_leaves=6,
)
# Text with the characters formatters must escape or survive: mrkdwn controls, backticks, quotes, unicode.
_text = st.one_of(
    st.text(alphabet=st.sampled_from("ab <>&`*_~\"'\\\n\té€😀"), max_size=60),
    st.text(max_size=20),
    # Beyond every receiver's length limit, to exercise truncation.
    # (Built by repetition: drawing thousands of characters one by one is slow.)
    st.builds(
        lambda part, size: (part * size)[:size],
        st.text(alphabet="x<&é`", min_size=1, max_size=5),
        st.integers(min_value=3000, max_value=3300),
    ),
)
_ns = st.integers(min_value=0, max_value=2**63 - 1)


@st.composite
def alerts(draw: st.DrawFn) -> Alert:
    first = draw(_ns)
    return alert(
        draw(st.text(alphabet="0123456789abcdef", min_size=1, max_size=24)),
        rule=draw(
            st.sampled_from(["group.join.protocol_type_null", "producer.epoch.stale", "frame.decode_error"])
        ),
        severity=draw(st.sampled_from(["info", "warning", "critical"])),
        status=draw(st.sampled_from(["firing", "resolved"])),
        subject=draw(_text),
        summary=draw(_text),
        count=draw(st.integers(min_value=1, max_value=10**9)),
        first_seen=first,
        last_seen=draw(_ns),
        evidence=draw(
            st.lists(st.dictionaries(st.text(max_size=8), _evidence_values, max_size=3), max_size=3)
        ),
        cluster=draw(st.sampled_from(["", "prod-eu-1", "kafka-1.example:9092,kafka-2.example:9092"]) | _text),
        runbook_url=draw(
            st.sampled_from(["", "docs/runbook.md#groupjoinprotocol_type_null"])
            | st.builds(
                lambda tail: "https://runbooks.example/r.md#" + tail,
                st.from_regex(r"[\w-]{0,40}", fullmatch=True),
            )
        ),
    )


def _parse_rfc3339(text: str) -> datetime:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", text), text
    return datetime.fromisoformat(text)


# ----- the alert dict --------------------------------------------------------------------------------------


@settings(deadline=None)
@given(alerts())
def test_alert_payload_is_strict_json_and_round_trips(value: Alert) -> None:
    data = alert_payload(value)
    assert json.loads(encode(data)) == data
    back = Alert.from_dict(data)
    assert (back.id, back.rule, back.severity, back.status, back.count) == (
        value.id,
        value.rule,
        value.severity,
        value.status,
        value.count,
    )
    assert alert_payload(data) == data  # idempotent: the spool's copy validates again


@settings(deadline=None)
@given(_evidence_values)
def test_json_safe_accepts_anything_evidence_may_hold(value: Any) -> None:
    safe = json_safe(value)
    assert json.loads(json.dumps(safe, allow_nan=False)) == safe


def test_json_safe_conversions() -> None:
    assert json_safe({1: b"\x00\xff", "t": (1, 2), "s": {3}, "f": math.nan}) == {
        "1": "00ff",
        "t": [1, 2],
        "s": [3],
        "f": "nan",
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"id": ""}, "empty"),
        ({"id": None}, "'id'"),
        ({"severity": "fatal"}, "severity"),
        ({"status": "open"}, "status"),
        ({"count": True}, "'count'"),
        ({"count": "3"}, "'count'"),
        ({"first_seen": 1.5}, "'first_seen'"),
        ({"evidence": {}}, "'evidence'"),
        ({"summary": None}, "'summary'"),
    ],
)
def test_invalid_alerts_are_named(change: dict[str, Any], message: str) -> None:
    data = {**payload(), **change}
    with pytest.raises(InvalidAlert, match=message):
        alert_payload(data)


def test_not_an_alert() -> None:
    with pytest.raises(InvalidAlert, match="not an alert"):
        alert_payload(42)
    missing = payload()
    del missing["rule"]
    with pytest.raises(InvalidAlert, match="'rule'"):
        alert_payload(missing)


@settings(deadline=None)
@given(_ns)
def test_rfc3339_is_utc_with_microseconds(ns: int) -> None:
    parsed = _parse_rfc3339(rfc3339(ns))
    assert parsed.tzinfo is not None and parsed.utcoffset() == UTC.utcoffset(None)
    micros = (parsed - datetime(1970, 1, 1, tzinfo=UTC)) // _MICROSECOND
    assert micros == ns // 1000


_MICROSECOND = datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)


def test_rfc3339_known_value() -> None:
    assert rfc3339(1_700_000_000_123_456_789) == "2023-11-14T22:13:20.123456Z"
    assert rfc3339(0) == "1970-01-01T00:00:00.000000Z"


# ----- webhook, kafka, log ---------------------------------------------------------------------------------


@settings(deadline=None)
@given(alerts())
def test_webhook_body_is_the_alert_dict(value: Alert) -> None:
    data = alert_payload(value)
    assert json.loads(webhook_body(data)) == data


@settings(deadline=None)
@given(alerts())
def test_kafka_record_keyed_by_id(value: Alert) -> None:
    data = alert_payload(value)
    record = kafka_record(data)
    assert record.key == value.id.encode()
    assert json.loads(record.value) == data
    assert dict(record.headers) == {
        "rule": value.rule.encode(),
        "severity": value.severity.value.encode(),
        "status": value.status.encode(),
        "cluster": value.cluster.encode(),
    }


@settings(deadline=None)
@given(alerts())
def test_log_line_is_one_json_line(value: Alert) -> None:
    data = alert_payload(value)
    line = log_line(data)
    assert "\n" not in line
    assert json.loads(line) == {"event": "kpmon.alert", **data}


# ----- Slack -----------------------------------------------------------------------------------------------


def _mrkdwn_texts(message: dict[str, Any]) -> list[str]:
    texts = [message["text"]]
    for block in message["blocks"]:
        parts = [block["text"]] if "text" in block else block.get("elements", [])
        texts += [part["text"] for part in parts if part["type"] == "mrkdwn"]
    return texts


@st.composite
def bursts(draw: st.DrawFn) -> list[Alert]:
    """Up to 45 alerts: a few drawn in full, the rest copies under their own ids (cheap to generate)."""
    drawn = draw(st.lists(alerts(), min_size=1, max_size=4))
    size = draw(st.integers(min_value=len(drawn), max_value=45))
    return [replace(drawn[n % len(drawn)], id=f"{drawn[n % len(drawn)].id}-{n}") for n in range(size)]


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(bursts())
def test_slack_message_within_limits_and_lists_every_alert(batch: list[Alert]) -> None:
    data = [alert_payload(value) for value in batch]
    message = slack_payload(data)
    blocks = message["blocks"]
    assert message["text"] and len(message["text"]) <= SLACK_SECTION_CHARS
    assert len(blocks) <= SLACK_MAX_BLOCKS
    assert blocks[0]["type"] == "header" and len(blocks[0]["text"]["text"]) <= SLACK_HEADER_CHARS
    for block in blocks:
        if block["type"] == "section":
            assert block["text"]["type"] == "mrkdwn" and 0 < len(block["text"]["text"]) <= SLACK_SECTION_CHARS
        if block["type"] == "context":
            assert all(len(element["text"]) <= SLACK_CONTEXT_CHARS for element in block["elements"])
        if "accessory" in block:
            assert block["accessory"]["url"].startswith("https://")
            assert not re.search(r"\s", block["accessory"]["url"])
    for text in _mrkdwn_texts(message):
        # User text is escaped: a raw < or > would be parsed as a link or mention.
        assert "<" not in text and ">" not in text
    # Nothing silently left out: every alert is detailed, or named in the overflow section.
    detailed = [b for b in blocks if b["type"] == "section"][: min(len(data), SLACK_MAX_DETAILED)]
    assert len(detailed) == min(len(data), SLACK_MAX_DETAILED)
    if len(data) > SLACK_MAX_DETAILED:
        overflow = blocks[-1]["text"]["text"]
        assert overflow.startswith(f"…and {len(data) - SLACK_MAX_DETAILED} more:")
    json.loads(encode(message))


def test_slack_single_alert_shape() -> None:
    message = slack_payload([payload(subject="group:<g&1>", severity="critical")])
    assert message["text"] == (
        "[CRITICAL] prod-eu-1: group.join.protocol_type_null on group:&lt;g&amp;1&gt;: JoinGroup v7 response without ProtocolType"
    )
    assert [block["type"] for block in message["blocks"]] == ["header", "section", "context"]
    section = message["blocks"][1]["text"]["text"]
    assert section.startswith(":red_circle: *FIRING* · *critical* · `group.join.protocol_type_null`")
    assert "*Cluster:* prod-eu-1\n*Subject:* group:&lt;g&amp;1&gt;" in section
    assert message["blocks"][1]["accessory"] == {
        "type": "button",
        "text": {"type": "plain_text", "text": "Runbook"},
        "url": "https://runbooks.example.com/kpmon/runbook.md#groupjoinprotocol_type_null",
        "action_id": "runbook-0",
    }
    assert "first seen 2025-11-13T02:13:20.000000Z" in section
    assert message["blocks"][2]["elements"][0]["text"] == "id `a1`"


def test_slack_burst_summary_and_resolved_icon() -> None:
    batch = [payload("a1"), payload("a2", status="resolved"), payload("a3")]
    message = slack_payload(batch)
    assert message["text"] == "kpmon on prod-eu-1: 3 alerts (2 firing, 1 resolved)"
    assert [b["accessory"]["action_id"] for b in message["blocks"] if "accessory" in b] == [
        "runbook-0",
        "runbook-1",
        "runbook-2",
    ]
    assert message["blocks"][3]["text"]["text"].startswith(":white_check_mark: *RESOLVED*")


def test_slack_needs_an_alert() -> None:
    with pytest.raises(ValueError):
        slack_payload([])


def test_slack_escape() -> None:
    assert slack_escape("<@U1> & <!here>") == "&lt;@U1&gt; &amp; &lt;!here&gt;"


# ----- PagerDuty -------------------------------------------------------------------------------------------


@settings(deadline=None)
@given(alerts(), st.text(min_size=1, max_size=32), st.text(min_size=1, max_size=32))
def test_pagerduty_events(value: Alert, routing_key: str, source: str) -> None:
    event = pagerduty_event(alert_payload(value), routing_key, source)
    assert event["routing_key"] == routing_key and event["dedup_key"] == value.id
    if value.status == "resolved":
        assert event == {"routing_key": routing_key, "event_action": "resolve", "dedup_key": value.id}
        return
    assert event["event_action"] == "trigger"
    body = event["payload"]
    assert 0 < len(body["summary"]) <= PAGERDUTY_SUMMARY_CHARS
    assert body["severity"] in {"critical", "error", "warning", "info"}
    assert body["source"] == source and body["class"] == value.rule and body["component"]
    _parse_rfc3339(body["timestamp"])
    assert body["custom_details"]["id"] == value.id
    assert body["custom_details"]["evidence"] == alert_payload(value)["evidence"]
    assert body["group"] == (value.cluster or source)
    assert body["custom_details"]["cluster"] == value.cluster
    if value.runbook_url.startswith("https://"):
        assert event["links"] == [{"href": value.runbook_url, "text": f"Runbook: {value.rule}"}]
    else:
        assert "links" not in event
    json.loads(encode(event))


def test_pagerduty_trigger_shape() -> None:
    event = pagerduty_event(payload(count=3), "R0UT1NG", "kpmon-prod")
    assert event["payload"] == {
        "summary": "[WARNING] prod-eu-1: group.join.protocol_type_null on group:g1: JoinGroup v7 response without ProtocolType",
        "severity": "warning",
        "source": "kpmon-prod",
        "timestamp": "2025-11-13T02:13:20.000000Z",
        "component": "group:g1",
        "group": "prod-eu-1",
        "class": "group.join.protocol_type_null",
        "custom_details": {
            "id": "a1",
            "rule": "group.join.protocol_type_null",
            "status": "firing",
            "first_seen": T0,
            "last_seen": T0,
            "count": 3,
            "subject": "group:g1",
            "evidence": [{"partition": 0, "offset": 42, "conn": "c1", "seq": 7}],
            "cluster": "prod-eu-1",
            "runbook_url": RUNBOOK + "#groupjoinprotocol_type_null",
        },
    }
    assert event["client"] == "kpmon"
    assert event["links"] == [
        {"href": RUNBOOK + "#groupjoinprotocol_type_null", "text": "Runbook: group.join.protocol_type_null"}
    ]


def test_a_runbook_path_is_text_not_a_link() -> None:
    # The default runbook base is the repository path: no Slack button or PagerDuty link for it.
    data = payload(runbook_url="docs/runbook.md#groupjoinprotocol_type_null", cluster="")
    assert "links" not in pagerduty_event(data, "R", "kpmon")
    assert pagerduty_event(data, "R", "kpmon")["payload"]["group"] == "kpmon"
    message = slack_payload([data])
    assert "accessory" not in message["blocks"][1]
    assert "Runbook: `docs/runbook.md#groupjoinprotocol_type_null`" in message["blocks"][1]["text"]["text"]
    assert "*Cluster:*" not in message["blocks"][1]["text"]["text"]
    entry = alertmanager_alert(data, source="kpmon")
    assert entry["annotations"]["runbook_url"] == "docs/runbook.md#groupjoinprotocol_type_null"
    assert "cluster" not in entry["labels"]


def test_alerts_spooled_before_they_had_context_still_deliver() -> None:
    old = alert("a1").to_dict()
    del old["cluster"], old["runbook_url"]
    data = alert_payload(old)
    assert (data["cluster"], data["runbook_url"]) == ("", "")
    assert pagerduty_event(data, "R", "kpmon")["event_action"] == "trigger"
    with pytest.raises(InvalidAlert, match="cluster"):
        alert_payload({**old, "cluster": 7})


# ----- Alertmanager ----------------------------------------------------------------------------------------

_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@settings(deadline=None)
@given(
    alerts(),
    st.dictionaries(st.from_regex(_LABEL_NAME, fullmatch=True), st.text(max_size=10), max_size=3),
    st.none() | st.just("http://grafana.local/d/kpmon"),
)
def test_alertmanager_alerts(value: Alert, labels: dict[str, str], generator_url: str | None) -> None:
    entry = alertmanager_alert(
        alert_payload(value), source="kpmon", labels=labels, generator_url=generator_url
    )
    assert entry["labels"]["alertname"] == value.rule
    assert entry["labels"]["severity"] == value.severity.value
    assert entry["labels"]["alert_id"] == value.id
    for name, label in entry["labels"].items():
        assert _LABEL_NAME.fullmatch(name) and isinstance(label, str) and label
    assert all(isinstance(text, str) for text in entry["annotations"].values())
    assert len(entry["annotations"]["evidence"]) <= ALERTMANAGER_EVIDENCE_CHARS
    starts = _parse_rfc3339(entry["startsAt"])
    if value.status == "resolved":
        assert _parse_rfc3339(entry["endsAt"]) >= starts
    else:
        assert "endsAt" not in entry
    assert entry.get("generatorURL") == generator_url
    assert ("subject" in entry["labels"]) == bool(value.subject)
    assert entry["labels"].get("cluster", "") == value.cluster
    assert entry["annotations"].get("runbook_url", "") == value.runbook_url


def test_alertmanager_body_shape() -> None:
    body = alertmanager_body(
        [payload(), payload("a2", status="resolved", last_seen=T0 + 5_000_000_000)],
        source="kpmon",
        labels={"team": "kafka", "alertname": "overridden?"},
    )
    assert body[0] == {
        "labels": {
            "team": "kafka",
            "alertname": "group.join.protocol_type_null",
            "severity": "warning",
            "alert_id": "a1",
            "instance": "kpmon",
            "subject": "group:g1",
            "cluster": "prod-eu-1",
        },
        "annotations": {
            "summary": "JoinGroup v7 response without ProtocolType",
            "count": "1",
            "first_seen": "2025-11-13T02:13:20.000000Z",
            "last_seen": "2025-11-13T02:13:20.000000Z",
            "evidence": '[{"partition":0,"offset":42,"conn":"c1","seq":7}]',
            "runbook_url": RUNBOOK + "#groupjoinprotocol_type_null",
        },
        "startsAt": "2025-11-13T02:13:20.000000Z",
    }
    assert body[1]["endsAt"] == "2025-11-13T02:13:25.000000Z"


def test_alertmanager_resolve_never_ends_before_it_starts() -> None:
    entry = alertmanager_alert(payload(status="resolved", first_seen=T0, last_seen=T0 - 10), source="s")
    assert entry["endsAt"] == entry["startsAt"]


def test_log_sender_levels(caplog: pytest.LogCaptureFixture) -> None:
    from streaming.hooks.core import Result

    with caplog.at_level(logging.INFO, logger="kpmon.alerts"):
        sent = LogSender().send(
            [payload(severity="critical"), payload("a2", status="resolved", severity="critical")]
        )
    assert sent.results == [Result.OK, Result.OK]
    assert [record.levelno for record in caplog.records] == [logging.ERROR, logging.INFO]
    assert json.loads(caplog.records[0].getMessage())["id"] == "a1"
