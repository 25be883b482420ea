"""Build each hook kind's sender from its config: the formatter it renders with and where it sends."""

from __future__ import annotations

from collections.abc import Sequence

from kpconfig.model import HookConfig, KpmonConfig
from streaming.hooks.formatters import (
    AlertDict,
    alertmanager_body,
    encode,
    pagerduty_event,
    slack_payload,
    webhook_body,
)
from streaming.hooks.http_sender import HttpSender
from streaming.hooks.kafka_sender import KafkaSender
from streaming.hooks.log_sender import LogSender
from streaming.hooks.sender import Sender

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
ALERTMANAGER_PATH = "/api/v2/alerts"


def alertmanager_url(base: str) -> str:
    """Accept the Alertmanager base URL or the full endpoint."""
    trimmed = base.rstrip("/")
    return trimmed if trimmed.endswith(ALERTMANAGER_PATH) else trimmed + ALERTMANAGER_PATH


def _single(alerts: Sequence[AlertDict]) -> AlertDict:
    if len(alerts) != 1:
        raise ValueError(f"this hook sends one alert per request, got {len(alerts)}")
    return alerts[0]


def build_sender(hook: HookConfig, config: KpmonConfig) -> Sender:
    if hook.kind == "log":
        return LogSender()
    if hook.kind == "kafka":
        return KafkaSender(
            hook.cluster or config.tap_cluster,
            hook.topic,
            timeout=hook.timeout_seconds,
            create_topic=hook.create_topic,
            client_id=f"kpmon-alerts-{hook.hook_name}",
        )
    url = hook.url
    if hook.kind == "webhook":
        assert url is not None  # the config validator requires it

        def render(alerts: Sequence[AlertDict]) -> bytes:
            return webhook_body(_single(alerts))

    elif hook.kind == "slack":
        assert url is not None

        def render(alerts: Sequence[AlertDict]) -> bytes:
            return encode(slack_payload(alerts))

    elif hook.kind == "pagerduty":
        url = url or PAGERDUTY_EVENTS_URL
        routing_key = hook.routing_key or ""

        def render(alerts: Sequence[AlertDict]) -> bytes:
            return encode(pagerduty_event(_single(alerts), routing_key, hook.source))

    elif hook.kind == "alertmanager":
        assert url is not None
        url = alertmanager_url(url)

        def render(alerts: Sequence[AlertDict]) -> bytes:
            return encode(
                alertmanager_body(
                    alerts, source=hook.source, labels=hook.labels, generator_url=hook.generator_url
                )
            )

    else:  # pragma: no cover - the config's Literal rules it out
        raise ValueError(f"unknown hook kind {hook.kind!r}")
    return HttpSender(url, render, timeout=hook.timeout_seconds, headers=hook.headers)
