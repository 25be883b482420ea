"""Prometheus metrics of the alert hooks, on a registry the caller owns (a fresh one by default)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


class HookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.alerts = Counter(
            "kpmon_alert_hook_alerts",
            "Alerts per hook by outcome (delivered, retried, dropped, suppressed) and reason",
            ["hook", "kind", "outcome", "reason"],
            registry=registry,
        )
        self.requests = Counter(
            "kpmon_alert_hook_requests",
            "Requests (or producer batches) to receivers by result (ok, transient, permanent)",
            ["hook", "kind", "result"],
            registry=registry,
        )
        self.pending = Gauge(
            "kpmon_alert_hook_pending", "Deliveries waiting or in flight", ["hook", "kind"], registry=registry
        )
        self.latency = Histogram(
            "kpmon_alert_hook_delivery_seconds",
            "From publish to the receiver's acknowledgement (across restarts: from first spooled)",
            ["hook", "kind"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.spool_errors = Counter(
            "kpmon_alert_hook_spool_errors",
            "Spool writes that failed (deliveries then survive only in memory)",
            ["hook", "kind"],
            registry=registry,
        )

    def register_hook(self, hook: str, kind: str) -> None:
        """Create the common series at zero so dashboards and rate() see them before the first event."""
        for outcome in ("delivered", "retried"):
            self.alerts.labels(hook, kind, outcome, "")
        for result in ("ok", "transient", "permanent"):
            self.requests.labels(hook, kind, result)
        self.pending.labels(hook, kind).set(0)
        self.latency.labels(hook, kind)
        self.spool_errors.labels(hook, kind)
