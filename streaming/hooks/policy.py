"""A hook's delivery policy: its config with the kind's defaults filled in, as plain numbers for the core."""

from __future__ import annotations

from dataclasses import dataclass

from checks.model import SEVERITY_RANK
from kpconfig.model import HookConfig


@dataclass(frozen=True)
class KindDefaults:
    #: Requests per second (None: unlimited; requests are sequential anyway).
    max_per_second: float | None
    max_batch: int
    resend_seconds: float | None = None
    #: Pending deliveries are spooled to disk (pointless for the log hook: it cannot fail).
    spooled: bool = True


# Slack allows about one message per second per incoming webhook; PagerDuty's Events API throttles
# around 120 events a minute per integration key; Alertmanager wants firing alerts re-sent well inside
# its resolve_timeout (5 min by default).
KIND_DEFAULTS: dict[str, KindDefaults] = {
    "kafka": KindDefaults(max_per_second=None, max_batch=500),
    "webhook": KindDefaults(max_per_second=None, max_batch=1),
    "slack": KindDefaults(max_per_second=1.0, max_batch=10),
    "pagerduty": KindDefaults(max_per_second=2.0, max_batch=1),
    "alertmanager": KindDefaults(max_per_second=2.0, max_batch=200, resend_seconds=60.0),
    "log": KindDefaults(max_per_second=None, max_batch=1000, spooled=False),
}


@dataclass(frozen=True)
class Policy:
    min_rank: int = 1
    max_per_second: float | None = None
    burst: int = 1
    max_batch: int = 1
    group_wait: float = 0.0
    group_interval: float = 0.0
    resend: float | None = None
    backoff_initial: float = 0.5
    backoff_max: float = 60.0
    backoff_multiplier: float = 2.0
    jitter: float = 0.5
    max_rejections: int = 5
    max_pending: int = 10_000
    max_age: float = 24 * 3600.0
    dedup_memory: int = 10_000
    spooled: bool = True

    @property
    def supersede_on_resolve(self) -> bool:
        """Receivers that track state by re-sends (Alertmanager) only need the resolve, not a stale trigger."""
        return self.resend is not None


def policy_for(hook: HookConfig) -> Policy:
    defaults = KIND_DEFAULTS[hook.kind]
    return Policy(
        min_rank=SEVERITY_RANK[hook.min_severity],
        max_per_second=hook.max_per_second if hook.max_per_second is not None else defaults.max_per_second,
        burst=hook.burst,
        max_batch=hook.max_batch or defaults.max_batch,
        group_wait=hook.group_wait_seconds,
        group_interval=hook.group_interval_seconds,
        resend=hook.resend_seconds if hook.resend_seconds is not None else defaults.resend_seconds,
        backoff_initial=hook.backoff_initial_seconds,
        backoff_max=hook.backoff_max_seconds,
        backoff_multiplier=hook.backoff_multiplier,
        jitter=hook.jitter,
        max_rejections=hook.max_retries,
        max_pending=hook.max_pending,
        max_age=hook.max_age_seconds,
        dedup_memory=hook.dedup_memory,
        spooled=defaults.spooled,
    )
