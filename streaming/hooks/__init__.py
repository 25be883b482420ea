"""Alert hooks: deliver ``checks.alerts.Alert`` objects to Kafka, webhooks, Slack, PagerDuty,
Alertmanager and the log, at least once, without ever stalling the caller (docs/alerting.md)."""

from streaming.hooks.service import AlertHooks
from streaming.hooks.spool import SpoolLockedError

__all__ = ["AlertHooks", "SpoolLockedError"]
