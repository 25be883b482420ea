"""Alert → receiver payload, one function per hook kind. Pure: no clock, no I/O.

Every function takes *alert dicts* (``Alert.to_dict()`` passed through :func:`json_safe`), which is also
what the spool stores, so a delivery restored after a restart renders exactly like a fresh one.
Receiver limits (Slack block counts and text lengths, PagerDuty's summary length) are enforced here so
that no alert, however long its summary or evidence, produces a payload the receiver rejects.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from checks.model import Severity

AlertDict = dict[str, Any]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SEVERITIES = tuple(s.value for s in Severity)
STATUSES = ("firing", "resolved")

# Slack rejects a message with more than 50 blocks, a section text over 3000 characters, a header over
# 150 and a context element over 2000 (api.slack.com/reference/block-kit).
SLACK_MAX_BLOCKS = 50
SLACK_SECTION_CHARS = 3000
SLACK_HEADER_CHARS = 150
SLACK_CONTEXT_CHARS = 2000
#: A button's url (api.slack.com/reference/block-kit/block-elements#button).
SLACK_URL_CHARS = 3000
#: Alerts shown in full per Slack message (header + 2 blocks each + one overflow section fits in 50).
SLACK_MAX_DETAILED = 20
#: PagerDuty truncates/rejects summaries beyond 1024 characters.
PAGERDUTY_SUMMARY_CHARS = 1024
#: Alertmanager stores annotations in memory for every alert: keep the evidence annotation bounded.
ALERTMANAGER_EVIDENCE_CHARS = 4000

_SLACK_ICON = {"critical": ":red_circle:", "warning": ":warning:", "info": ":information_source:"}
_SLACK_RESOLVED_ICON = ":white_check_mark:"


def json_safe(value: Any) -> Any:
    """A copy of ``value`` that ``json.dumps`` accepts (strict JSON: no NaN) and that round-trips.

    Evidence carries decoded protocol fields, which may be bytes, tuples or enums; they become hex
    strings, lists and their string form, so a hook never fails on an alert's contents.
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    if isinstance(value, set | frozenset):
        return sorted((json_safe(item) for item in value), key=repr)
    return str(value)


def encode(payload: Any) -> bytes:
    """Compact UTF-8 JSON, the body of every HTTP hook and the value of every Kafka record."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def rfc3339(ns: int) -> str:
    """Nanoseconds since the epoch as RFC 3339 UTC with microseconds (what Alertmanager and PagerDuty parse)."""
    moment = _EPOCH + timedelta(microseconds=ns // 1000)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def headline(alert: AlertDict) -> str:
    """One line naming the alert, used where a receiver shows a single line (Slack fallback, PagerDuty):
    severity, cluster, rule, subject and summary."""
    cluster = f" {alert['cluster']}:" if alert.get("cluster") else ""
    subject = f" on {alert['subject']}" if alert.get("subject") else ""
    state = " (resolved)" if alert["status"] == "resolved" else ""
    return f"[{alert['severity'].upper()}]{cluster} {alert['rule']}{subject}: {alert['summary']}{state}"


def link(alert: AlertDict) -> str | None:
    """The alert's runbook URL where a receiver needs a real link (Slack button, PagerDuty ``links``):
    only an http(s) URL (``alerts.runbook_base_url``); a repository path stays text."""
    url = str(alert.get("runbook_url") or "")
    return url if re.fullmatch(r"https?://[^\s<>|]+", url) else None


class InvalidAlert(ValueError):
    """An alert missing a field of the alert contract, or with a value of the wrong type."""


_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "id": str,
    "rule": str,
    "severity": str,
    "status": str,
    "first_seen": int,
    "last_seen": int,
    "count": int,
    "subject": str,
    "summary": str,
    "evidence": list,
}
#: Context fields (checks.alerts.AlertContext); absent from deliveries spooled before alerts had them.
_CONTEXT_FIELDS = ("cluster", "runbook_url")


def alert_payload(alert: Any) -> AlertDict:
    """The JSON-safe alert dict every formatter and the spool work from, from an ``Alert`` or its dict.

    Raises :class:`InvalidAlert` naming the first bad field, so one broken alert is reported and skipped
    instead of failing a whole publish.
    """
    try:
        raw = alert if isinstance(alert, Mapping) else alert.to_dict()
    except Exception as exc:
        raise InvalidAlert(f"not an alert: {type(alert).__name__}: {exc}") from exc
    data = json_safe(raw)
    if not isinstance(data, dict):
        raise InvalidAlert(f"not an alert: {type(alert).__name__}")
    for name, expected in _FIELD_TYPES.items():
        value = data.get(name)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise InvalidAlert(
                f"alert {data.get('id')!r}: field {name!r} must be {getattr(expected, '__name__', expected)}, got {value!r}"[
                    :300
                ]
            )
    if not data["id"]:
        raise InvalidAlert("alert id must not be empty")
    if data["severity"] not in SEVERITIES:
        raise InvalidAlert(f"alert {data['id']!r}: unknown severity {data['severity']!r}")
    if data["status"] not in STATUSES:
        raise InvalidAlert(f"alert {data['id']!r}: unknown status {data['status']!r}")
    for name in _CONTEXT_FIELDS:
        value = data.setdefault(name, "")
        if not isinstance(value, str):
            raise InvalidAlert(f"alert {data['id']!r}: field {name!r} must be str, got {value!r}"[:300])
    return data


# ----- generic webhook and Kafka ------------------------------------------------------------------------


def webhook_body(alert: AlertDict) -> bytes:
    """The generic webhook posts the alert dict itself, one alert per request."""
    return encode(alert)


@dataclass(frozen=True)
class KafkaRecord:
    key: bytes
    value: bytes
    headers: list[tuple[str, str | bytes | None]]


def kafka_record(alert: AlertDict) -> KafkaRecord:
    """Key = alert id (so a compacted topic keeps each alert's latest state), value = the alert dict."""
    headers: list[tuple[str, str | bytes | None]] = [
        (name, str(alert[name]).encode()) for name in ("rule", "severity", "status", "cluster")
    ]
    return KafkaRecord(key=str(alert["id"]).encode(), value=encode(alert), headers=headers)


# ----- Slack ---------------------------------------------------------------------------------------------


def slack_escape(text: str) -> str:
    """Slack mrkdwn treats ``&``, ``<`` and ``>`` as control characters (links, mentions)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_code(text: str) -> str:
    # mrkdwn has no escape inside inline code; a backtick would end the span early.
    return "`" + slack_escape(text).replace("`", "'") + "`"


def _slack_section(alert: AlertDict) -> str:
    resolved = alert["status"] == "resolved"
    icon = _SLACK_RESOLVED_ICON if resolved else _SLACK_ICON.get(alert["severity"], "")
    lines = [
        f"{icon} *{alert['status'].upper()}* · *{alert['severity']}* · {_slack_code(alert['rule'])}",
    ]
    if alert.get("cluster"):
        lines.append(f"*Cluster:* {slack_escape(str(alert['cluster']))}")
    if alert.get("subject"):
        lines.append(f"*Subject:* {slack_escape(str(alert['subject']))}")
    lines.append(slack_escape(str(alert["summary"])))
    lines.append(
        f"_count {alert['count']}, first seen {rfc3339(alert['first_seen'])}, "
        f"last seen {rfc3339(alert['last_seen'])}_"
    )
    if alert.get("runbook_url") and link(alert) is None:
        lines.append(f"Runbook: {_slack_code(str(alert['runbook_url']))}")
    return truncate("\n".join(lines), SLACK_SECTION_CHARS)


def _slack_block(alert: AlertDict, index: int) -> dict[str, Any]:
    """The alert's section; a "Runbook" button beside it when the runbook has a URL (an accessory, so
    the message's block count does not grow)."""
    block: dict[str, Any] = {"type": "section", "text": {"type": "mrkdwn", "text": _slack_section(alert)}}
    url = link(alert)
    if url is not None and len(url) <= SLACK_URL_CHARS:
        block["accessory"] = {
            "type": "button",
            "text": {"type": "plain_text", "text": "Runbook"},
            "url": url,
            "action_id": f"runbook-{index}",
        }
    return block


def slack_payload(alerts: Sequence[AlertDict]) -> dict[str, Any]:
    """An incoming-webhook message listing ``alerts``: ``text`` is the notification fallback, ``blocks``
    the rendered message. Bursts are coalesced into one message by the caller; beyond
    ``SLACK_MAX_DETAILED`` alerts the rest are listed one line each so nothing is silently left out."""
    if not alerts:
        raise ValueError("a Slack message needs at least one alert")
    firing = sum(1 for alert in alerts if alert["status"] == "firing")
    resolved = len(alerts) - firing
    if len(alerts) == 1:
        text = headline(alerts[0])
    else:
        clusters = sorted({str(alert.get("cluster")) for alert in alerts if alert.get("cluster")})
        where = f" on {', '.join(clusters)}" if clusters else ""
        text = f"kpmon{where}: {len(alerts)} alerts ({firing} firing, {resolved} resolved)"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": truncate(text, SLACK_HEADER_CHARS)}}
    ]
    for index, alert in enumerate(alerts[:SLACK_MAX_DETAILED]):
        blocks.append(_slack_block(alert, index))
        blocks.append(
            {
                "type": "context",
                "elements": [
                    {
                        "type": "mrkdwn",
                        "text": truncate(f"id {_slack_code(alert['id'])}", SLACK_CONTEXT_CHARS),
                    }
                ],
            }
        )
    rest = alerts[SLACK_MAX_DETAILED:]
    if rest:
        lines = [f"…and {len(rest)} more:"]
        lines += [
            f"• {alert['status']} {alert['severity']} {_slack_code(alert['rule'])} "
            f"{slack_escape(str(alert.get('subject', '')))} ({_slack_code(alert['id'])})"
            for alert in rest
        ]
        blocks.append(
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": truncate("\n".join(lines), SLACK_SECTION_CHARS)},
            }
        )
    return {"text": truncate(slack_escape(text), SLACK_SECTION_CHARS), "blocks": blocks}


# ----- PagerDuty Events API v2 ---------------------------------------------------------------------------


def pagerduty_event(alert: AlertDict, routing_key: str, source: str) -> dict[str, Any]:
    """A trigger for a firing alert, a resolve for a resolved one; ``dedup_key`` = alert id, so PagerDuty
    folds re-sends and the resolve into one incident."""
    if alert["status"] == "resolved":
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": alert["id"]}
    details = {key: value for key, value in alert.items() if key not in ("summary", "severity")}
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": alert["id"],
        "client": "kpmon",
        "payload": {
            "summary": truncate(headline(alert), PAGERDUTY_SUMMARY_CHARS),
            # kpmon's severities are a subset of PagerDuty's (critical, error, warning, info).
            "severity": alert["severity"],
            "source": source,
            "timestamp": rfc3339(alert["first_seen"]),
            "component": str(alert.get("subject", "")) or source,
            # PagerDuty's "logical grouping of components": the cluster the alert is about.
            "group": str(alert.get("cluster", "")) or source,
            "class": alert["rule"],
            "custom_details": details,
        },
    }
    url = link(alert)
    if url is not None:
        event["links"] = [{"href": url, "text": f"Runbook: {alert['rule']}"}]
    return event


# ----- Prometheus Alertmanager API v2 --------------------------------------------------------------------


def alertmanager_alert(
    alert: AlertDict,
    *,
    source: str,
    labels: Mapping[str, str] | None = None,
    generator_url: str | None = None,
) -> dict[str, Any]:
    """One entry of the ``POST /api/v2/alerts`` list.

    Alertmanager identifies an alert by its label set, so the alert id is a label: two alerts for the same
    rule and subject (it cleared, then fired again) stay distinct. Firing alerts carry no ``endsAt``;
    Alertmanager resolves them after its ``resolve_timeout`` unless re-sent, which the hook does every
    ``resend_seconds``. A resolve carries ``endsAt`` = the time the rule cleared.
    """
    merged = {name: value for name, value in (labels or {}).items() if value}
    merged.update(
        {
            "alertname": alert["rule"],
            "severity": alert["severity"],
            "alert_id": alert["id"],
            "instance": source,
        }
    )
    if alert.get("subject"):
        merged["subject"] = str(alert["subject"])
    if alert.get("cluster"):
        merged["cluster"] = str(alert["cluster"])
    evidence = json.dumps(alert.get("evidence", []), ensure_ascii=False, separators=(",", ":"))
    entry: dict[str, Any] = {
        "labels": merged,
        "annotations": {
            "summary": str(alert["summary"]),
            "count": str(alert["count"]),
            "first_seen": rfc3339(alert["first_seen"]),
            "last_seen": rfc3339(alert["last_seen"]),
            "evidence": truncate(evidence, ALERTMANAGER_EVIDENCE_CHARS),
        },
        "startsAt": rfc3339(alert["first_seen"]),
    }
    if alert.get("runbook_url"):
        # The annotation name Prometheus alerting rules conventionally use for the runbook link.
        entry["annotations"]["runbook_url"] = str(alert["runbook_url"])
    if alert["status"] == "resolved":
        # endsAt before startsAt is rejected ("start time must be before end time").
        entry["endsAt"] = rfc3339(max(alert["last_seen"], alert["first_seen"]))
    if generator_url:
        entry["generatorURL"] = generator_url
    return entry


def alertmanager_body(
    alerts: Sequence[AlertDict],
    *,
    source: str,
    labels: Mapping[str, str] | None = None,
    generator_url: str | None = None,
) -> list[dict[str, Any]]:
    return [
        alertmanager_alert(alert, source=source, labels=labels, generator_url=generator_url)
        for alert in alerts
    ]
