"""The delivery logic of one hook, sans I/O: what to send, when, and what to remember.

The core never touches the network, the disk or a clock. The worker feeds it alert dicts and the time
(``now``: monotonic seconds for scheduling; ``wall_ns``: wall-clock nanoseconds for ages that must survive
a restart), asks it for the next batch, sends that batch, and reports per-alert results. Everything the
worker must do in return (spool writes, counters, log lines) comes back as :class:`Effects`.

Semantics, per hook:

- alerts below ``min_rank`` are suppressed;
- an (id, status) already delivered is not sent again unless its severity rose; a firing alert whose id
  was already resolved is stale (a replayed batch) and suppressed;
- an (id, status) already pending is updated in place (coalesced), not queued twice;
- a batch waits ``group_wait`` after its oldest alert, at most ``max_batch`` alerts, paced by a token bucket;
  a (rule, subject) notified less than ``group_interval`` ago waits, so a flapping rule coalesces;
- one request at a time; after a failed request the hook backs off exponentially with jitter;
- transient failures are retried until ``max_age``; rejections (permanent) ``max_rejections`` times;
- at most ``max_pending`` pending deliveries: overflow drops the oldest of the lowest severity, counted;
- with ``resend`` set, firing alerts are re-sent every ``resend`` seconds until their resolve.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from checks.model import SEVERITY_RANK
from streaming.hooks.formatters import AlertDict
from streaming.hooks.pacing import TokenBucket, backoff_delay
from streaming.hooks.policy import Policy

#: Spool namespaces.
PENDING = "pending"
DELIVERED = "delivered"
ACTIVE = "active"


class Result(Enum):
    OK = "ok"
    #: Worth retrying as is: unreachable, timeout, 5xx, 408/429.
    TRANSIENT = "transient"
    #: The receiver rejected the request (4xx): retried a few times only.
    PERMANENT = "permanent"


@dataclass(frozen=True)
class SpoolOp:
    namespace: str
    key: str
    #: None deletes the key.
    value: dict[str, Any] | None


@dataclass
class Effects:
    """What the worker must do after a core call: write the spool, count, log."""

    spool: list[SpoolOp] = field(default_factory=list)
    #: (outcome, reason) → number of alerts; outcomes: delivered, retried, dropped, suppressed.
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    #: Requests by result ("ok", "transient", "permanent").
    requests: dict[str, int] = field(default_factory=dict)
    #: Seconds from first queued to delivered, per delivered alert (not for re-sends).
    latencies: list[float] = field(default_factory=list)
    #: (level, message) lines to log; levels are logging's names.
    notes: list[tuple[str, str]] = field(default_factory=list)

    def count(self, outcome: str, reason: str = "", n: int = 1) -> None:
        if n:
            self.counts[outcome, reason] = self.counts.get((outcome, reason), 0) + n


@dataclass
class Pending:
    key: str
    alert: AlertDict
    seq: int
    #: Wall-clock ns when first queued: the age limit and the latency count from here, across restarts.
    created_ns: int
    #: Monotonic time from which the group wait counts as elapsed.
    ready_at: float
    failures: int = 0
    rejections: int = 0
    in_flight: bool = False
    #: Created by the re-send timer: not spooled (the active set is), not subject to grouping.
    resend: bool = False

    @property
    def rank(self) -> int:
        return SEVERITY_RANK[self.alert["severity"]]

    @property
    def group(self) -> tuple[str, str]:
        return str(self.alert["rule"]), str(self.alert.get("subject", ""))

    def spooled(self) -> dict[str, Any]:
        return {"alert": self.alert, "created_ns": self.created_ns}


@dataclass(frozen=True)
class Batch:
    keys: tuple[str, ...]
    #: Snapshots: an alert updated while its request is in flight is compared against what was sent.
    alerts: tuple[AlertDict, ...]


def delivery_key(alert: AlertDict) -> str:
    return f"{alert['id']}|{alert['status']}"


class DeliveryCore:
    def __init__(self, policy: Policy, rng: random.Random | None = None) -> None:
        self.policy = policy
        self.rng = rng or random.Random()
        self.pending: dict[str, Pending] = {}
        #: Delivered (id|status) → severity rank sent, oldest first (bounded by ``dedup_memory``).
        self.delivered: OrderedDict[str, int] = OrderedDict()
        #: Firing alerts to re-send (only with ``policy.resend``): id → latest alert dict.
        self.active: dict[str, AlertDict] = {}
        self.next_resend: dict[str, float] = {}
        self.last_notified: dict[tuple[str, str], float] = {}
        self.bucket = TokenBucket(policy.max_per_second, policy.burst)
        self.in_flight: Batch | None = None
        self.failures = 0
        self.retry_at = 0.0
        self.totals: dict[str, int] = {
            "delivered": 0,
            "failed_attempts": 0,
            "retried": 0,
            "dropped": 0,
            "suppressed": 0,
        }
        self._seq = 0
        self._effects = Effects()

    # ----- bookkeeping -------------------------------------------------------------------------------

    def drain(self) -> Effects:
        """The effects accumulated since the last drain."""
        effects, self._effects = self._effects, Effects()
        return effects

    def _count(self, outcome: str, reason: str = "", n: int = 1) -> None:
        self._effects.count(outcome, reason, n)
        self.totals[outcome] = self.totals.get(outcome, 0) + n

    def _spool(self, namespace: str, key: str, value: dict[str, Any] | None) -> None:
        if self.policy.spooled:
            self._effects.spool.append(SpoolOp(namespace, key, value))

    def _note(self, level: str, message: str) -> None:
        self._effects.notes.append((level, message))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    @property
    def idle(self) -> bool:
        """Nothing pending and nothing in flight (the active re-send set does not count)."""
        return not self.pending and self.in_flight is None

    def count_dropped(self, reason: str, count: int) -> None:
        """Alerts the worker could not even offer (invalid, published after close): counted, not lost silently."""
        self._count("dropped", reason, count)

    def abandon_in_flight(self) -> None:
        """Forget the in-flight batch without a result (the worker hit a bug): its alerts stay pending."""
        if self.in_flight is not None:
            for key in self.in_flight.keys:
                item = self.pending.get(key)
                if item is not None:
                    item.in_flight = False
            self.in_flight = None

    # ----- restore -----------------------------------------------------------------------------------

    def restore(self, spooled: dict[str, dict[str, dict[str, Any]]], now: float) -> None:
        """Reload what a previous process spooled: pending deliveries (in their order), the delivered
        memory and the active set. Re-sends of active alerts are due at once: the receiver may have
        timed them out while this process was down."""
        for key, value in spooled.get(DELIVERED, {}).items():
            self.delivered[key] = int(value.get("rank", 0))
        for key, value in spooled.get(PENDING, {}).items():
            alert = value["alert"]
            self.pending[key] = Pending(key, alert, self._next_seq(), int(value["created_ns"]), now)
        if self.policy.resend is not None:
            for alert_id, value in spooled.get(ACTIVE, {}).items():
                self.active[alert_id] = value
                self.next_resend[alert_id] = now

    # ----- offer -------------------------------------------------------------------------------------

    def offer(self, alert: AlertDict, now: float, wall_ns: int) -> None:
        """Take one published alert (already validated: severity and status are known values)."""
        policy = self.policy
        rank = SEVERITY_RANK[alert["severity"]]
        if rank < policy.min_rank:
            self._count("suppressed", "below_min_severity")
            return
        key = delivery_key(alert)
        alert_id = str(alert["id"])
        resolved_key = f"{alert_id}|resolved"
        if alert["status"] == "firing" and (resolved_key in self.delivered or resolved_key in self.pending):
            self._count("suppressed", "stale")
            return
        if policy.resend is not None:
            self._track_active(alert, alert_id, now)
        sent_rank = self.delivered.get(key)
        if sent_rank is not None and rank <= sent_rank:
            self._count("suppressed", "duplicate")
            return
        existing = self.pending.get(key)
        if existing is not None:
            if rank >= existing.rank:
                existing.alert = alert
                if not existing.resend:
                    self._spool(PENDING, key, existing.spooled())
            self._count("suppressed", "coalesced")
            return
        item = Pending(key, alert, self._next_seq(), wall_ns, now + policy.group_wait)
        if len(self.pending) >= policy.max_pending and not self._make_room(item):
            return
        self.pending[key] = item
        self._spool(PENDING, key, item.spooled())

    def _track_active(self, alert: AlertDict, alert_id: str, now: float) -> None:
        if alert["status"] == "firing":
            if alert_id not in self.active:
                if len(self.active) >= self.policy.max_pending:
                    # Bounded like the queue: the oldest firing alert stops being re-sent (the receiver
                    # then times it out), which is counted and logged.
                    oldest = next(iter(self.active))
                    del self.active[oldest]
                    self.next_resend.pop(oldest, None)
                    self._spool(ACTIVE, oldest, None)
                    self._count("dropped", "resend_overflow")
                    self._note(
                        "error",
                        f"too many firing alerts to re-send ({self.policy.max_pending}): stopped re-sending {oldest}",
                    )
                self.next_resend[alert_id] = now + (self.policy.resend or 0.0)
            self.active[alert_id] = alert
            self._spool(ACTIVE, alert_id, alert)
            return
        if self.active.pop(alert_id, None) is not None:
            self.next_resend.pop(alert_id, None)
            self._spool(ACTIVE, alert_id, None)
        firing = self.pending.get(f"{alert_id}|firing")
        if firing is not None and not firing.in_flight and self.policy.supersede_on_resolve:
            # The resolve carries startsAt too: the receiver learns of the alert and its end at once.
            self._remove(firing)
            self._count("suppressed", "superseded")

    def _make_room(self, incoming: Pending) -> bool:
        """Evict the oldest pending delivery of the lowest severity, or refuse ``incoming`` if it is that one."""
        candidates = [item for item in self.pending.values() if not item.in_flight]
        victim = min([*candidates, incoming], key=lambda item: (item.rank, item.seq))
        self._count("dropped", "overflow")
        self._note(
            "error",
            f"pending deliveries at the limit ({self.policy.max_pending}): dropped "
            f"{victim.alert['rule']} {victim.key} ({victim.alert['severity']})",
        )
        if victim is incoming:
            return False
        self._remove(victim)
        return True

    def _remove(self, item: Pending) -> None:
        del self.pending[item.key]
        if not item.resend:
            self._spool(PENDING, item.key, None)

    # ----- take --------------------------------------------------------------------------------------

    def _held_until(self, item: Pending) -> float:
        """When grouping lets ``item`` go: its (rule, subject) was notified less than group_interval ago."""
        if item.resend or item.failures or self.policy.group_interval <= 0:
            return 0.0
        last = self.last_notified.get(item.group)
        return 0.0 if last is None else last + self.policy.group_interval

    def _expire(self, wall_ns: int) -> None:
        limit = self.policy.max_age * 1e9
        for item in [item for item in self.pending.values() if not item.in_flight]:
            if wall_ns - item.created_ns > limit:
                self._remove(item)
                self._count("dropped", "expired")
                self._note(
                    "error",
                    f"gave up on {item.alert['rule']} {item.key} after {self.policy.max_age:.0f}s pending",
                )

    def _queue_resends(self, now: float, wall_ns: int) -> None:
        for alert_id, due in list(self.next_resend.items()):
            key = f"{alert_id}|firing"
            if due == float("inf") and key not in self.pending:
                # Its last delivery was dropped (expired, rejected): keep the re-send cycle going.
                self.next_resend[alert_id] = due = now + (self.policy.resend or 0.0)
            if due > now or len(self.pending) >= self.policy.max_pending:
                continue
            if key not in self.pending:
                item = Pending(key, self.active[alert_id], self._next_seq(), wall_ns, now, resend=True)
                self.pending[key] = item
            # The next re-send is scheduled when this one is delivered.
            self.next_resend[alert_id] = float("inf")

    def take(self, now: float, wall_ns: int) -> Batch | None:
        """The next request to send, if one may go now; its alerts are in flight until :meth:`complete`."""
        self._expire(wall_ns)
        if self.policy.resend is not None:
            self._queue_resends(now, wall_ns)
        if self.in_flight is not None or now < self.retry_at or not self.pending:
            return None
        eligible = [
            item for item in self.pending.values() if not item.in_flight and self._held_until(item) <= now
        ]
        if not eligible or min(item.ready_at for item in eligible) > now:
            return None
        if not self.bucket.take(now):
            return None
        chosen = sorted(eligible, key=lambda item: item.seq)[: self.policy.max_batch]
        for item in chosen:
            item.in_flight = True
        self.in_flight = Batch(tuple(item.key for item in chosen), tuple(item.alert for item in chosen))
        return self.in_flight

    def wakeup(self, now: float, wall_ns: int) -> float | None:
        """The earliest time :meth:`take` may return a batch, or a timer fires; None: nothing to wait for."""
        times: list[float] = [due for due in self.next_resend.values() if due != float("inf")]
        waiting = [item for item in self.pending.values() if not item.in_flight]
        if waiting:
            if self.in_flight is None:
                earliest = min(max(item.ready_at, self._held_until(item)) for item in waiting)
                times.append(max(earliest, self.retry_at, self.bucket.ready_at(now)))
            # Ages count on the wall clock (they survive restarts); convert the remaining time to ``now``.
            oldest = min(item.created_ns for item in waiting)
            times.append(now + max(0.0, (oldest + self.policy.max_age * 1e9 - wall_ns) / 1e9))
        return min(times) if times else None

    # ----- complete ----------------------------------------------------------------------------------

    def complete(
        self,
        batch: Batch,
        results: list[Result],
        now: float,
        wall_ns: int,
        *,
        error: str = "",
        retry_after: float | None = None,
    ) -> None:
        """Record the outcome of ``batch``: one result per alert, in order."""
        if batch is not self.in_flight:
            raise ValueError("complete() for a batch that is not in flight")
        if len(results) != len(batch.keys):
            raise ValueError(f"{len(results)} results for a batch of {len(batch.keys)}")
        self.in_flight = None
        failed = 0
        for key, sent, result in zip(batch.keys, batch.alerts, results, strict=True):
            item = self.pending.get(key)
            if item is None:
                continue
            item.in_flight = False
            if result is Result.OK:
                self._delivered(item, sent, now, wall_ns)
                continue
            failed += 1
            if result is Result.PERMANENT:
                item.rejections += 1
                if item.rejections >= self.policy.max_rejections:
                    self._remove(item)
                    self._count("dropped", "rejected")
                    self._note(
                        "error",
                        f"receiver rejected {item.alert['rule']} {item.key} {item.rejections} times: dropped ({error})",
                    )
                    continue
            item.failures += 1
            self._count("retried")
        ok = len(results) - failed
        if ok:
            self._effects.requests["ok"] = self._effects.requests.get("ok", 0) + 1
        if not failed:
            if self.failures:
                self._note("info", f"delivering again after {self.failures} failed attempts")
            self.failures = 0
            self.retry_at = 0.0
            return
        self.failures += 1
        self.totals["failed_attempts"] += 1
        outcome = "permanent" if Result.PERMANENT in results else "transient"
        self._effects.requests[outcome] = self._effects.requests.get(outcome, 0) + 1
        policy = self.policy
        delay = backoff_delay(
            self.failures,
            initial=policy.backoff_initial,
            maximum=policy.backoff_max,
            multiplier=policy.backoff_multiplier,
            jitter=policy.jitter,
            rng=self.rng,
        )
        if retry_after is not None:
            # The receiver said when (HTTP Retry-After); an hour bounds a silly value.
            delay = max(delay, min(retry_after, 3600.0))
        self.retry_at = now + delay
        self._note(
            "warning",
            f"delivery of {failed} alert(s) failed ({error or outcome}); attempt {self.failures}, "
            f"{len(self.pending)} pending, retry in {delay:.2f}s",
        )

    def _delivered(self, item: Pending, sent: AlertDict, now: float, wall_ns: int) -> None:
        self._count("delivered")
        if not item.resend:
            self._effects.latencies.append(max(0.0, (wall_ns - item.created_ns) / 1e9))
        if self.policy.group_interval > 0:
            self.last_notified[item.group] = now
            self._prune_groups(now)
        alert_id = str(sent["id"])
        if self.policy.resend is not None and alert_id in self.active and sent["status"] == "firing":
            self.next_resend[alert_id] = now + self.policy.resend
        sent_rank = SEVERITY_RANK[sent["severity"]]
        if item.rank > sent_rank:
            # Escalated while in flight: the higher severity still has to go out.
            item.ready_at = now
            return
        self._remove(item)
        if item.resend:
            return
        self._remember(item.key, sent_rank)

    def _remember(self, key: str, rank: int) -> None:
        if self.policy.dedup_memory <= 0:
            return
        self.delivered[key] = rank
        self.delivered.move_to_end(key)
        self._spool(DELIVERED, key, {"rank": rank})
        while len(self.delivered) > self.policy.dedup_memory:
            old, _ = self.delivered.popitem(last=False)
            self._spool(DELIVERED, old, None)

    def _prune_groups(self, now: float) -> None:
        if len(self.last_notified) > 4 * max(1, len(self.pending)) + 1000:
            horizon = now - self.policy.group_interval
            self.last_notified = {group: t for group, t in self.last_notified.items() if t > horizon}
