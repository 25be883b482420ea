"""The delivery core driven by a fake clock: no threads, no sockets, every decision checked."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.hooks.core import ACTIVE, DELIVERED, PENDING, Batch, DeliveryCore, Result, SpoolOp
from streaming.hooks.policy import Policy
from tests.streaming.hooks.builders import T0, payload

OK, TRANSIENT, PERMANENT = Result.OK, Result.TRANSIENT, Result.PERMANENT


class Driver:
    """Plays the worker: a fake monotonic clock, and the wall clock moving with it."""

    def __init__(self, policy: Policy, seed: int = 1) -> None:
        self.core = DeliveryCore(policy, random.Random(seed))
        self.now = 0.0

    @property
    def wall(self) -> int:
        return T0 + int(self.now * 1e9)

    def at(self, now: float) -> Driver:
        self.now = now
        return self

    def offer(self, *alerts: dict[str, Any]) -> None:
        for alert in alerts:
            self.core.offer(alert, self.now, self.wall)

    def take(self) -> Batch | None:
        return self.core.take(self.now, self.wall)

    def send(self, *results: Result, retry_after: float | None = None) -> Batch:
        batch = self.take()
        assert batch is not None, "expected a batch"
        outcome = list(results) if results else [OK] * len(batch.keys)
        if len(outcome) == 1 and len(batch.keys) > 1:
            outcome *= len(batch.keys)
        self.core.complete(batch, outcome, self.now, self.wall, error="test", retry_after=retry_after)
        return batch

    def wakeup(self) -> float | None:
        return self.core.wakeup(self.now, self.wall)

    @property
    def totals(self) -> dict[str, int]:
        return self.core.totals


def ids(batch: Batch | None) -> list[str]:
    assert batch is not None
    return [alert["id"] for alert in batch.alerts]


FAST = Policy(min_rank=0, backoff_initial=1.0, backoff_max=8.0, jitter=0.0, max_batch=100)


# ----- filtering and dedup ---------------------------------------------------------------------------------


def test_below_min_severity_is_suppressed() -> None:
    driver = Driver(replace(FAST, min_rank=1))
    driver.offer(payload("i", severity="info"), payload("w", severity="warning"))
    assert ids(driver.send()) == ["w"]
    effects = driver.core.drain()
    assert effects.counts[("suppressed", "below_min_severity")] == 1
    assert driver.totals["suppressed"] == 1 and driver.totals["delivered"] == 1


def test_delivered_alert_is_not_resent_unless_it_escalates() -> None:
    driver = Driver(FAST)
    driver.offer(payload("a", count=1))
    driver.send()
    driver.offer(payload("a", count=2))  # a replayed or updated alert: same id and status
    assert driver.take() is None and driver.core.idle
    driver.offer(payload("a", count=3, severity="critical"))
    batch = driver.send()
    assert batch.alerts[0]["severity"] == "critical"
    driver.offer(payload("a", count=4, severity="critical"), payload("a", severity="warning"))
    assert driver.take() is None
    assert driver.totals == {
        "delivered": 2,
        "failed_attempts": 0,
        "retried": 0,
        "dropped": 0,
        "suppressed": 3,
    }


def test_resolve_is_a_new_delivery_and_a_stale_firing_is_suppressed() -> None:
    driver = Driver(FAST)
    driver.offer(payload("a"))
    driver.send()
    driver.offer(payload("a", status="resolved"))
    assert [a["status"] for a in driver.send().alerts] == ["resolved"]
    driver.offer(payload("a"))  # a replay of the firing after the resolve went out
    assert driver.take() is None
    assert driver.core.drain().counts[("suppressed", "stale")] == 1


def test_pending_updates_coalesce_into_one_delivery() -> None:
    driver = Driver(replace(FAST, group_wait=1.0))
    driver.offer(payload("a", count=1))
    driver.at(0.5).offer(payload("a", count=5), payload("a", count=3, severity="info"))
    batch = driver.at(1.0).send()
    assert len(batch.alerts) == 1 and batch.alerts[0]["count"] == 5
    assert driver.totals["suppressed"] == 2


def test_escalation_while_in_flight_goes_out_after() -> None:
    driver = Driver(FAST)
    driver.offer(payload("a"))
    batch = driver.take()
    assert batch is not None
    driver.offer(payload("a", severity="critical"))
    driver.core.complete(batch, [OK], driver.now, driver.wall)
    assert [a["severity"] for a in driver.send().alerts] == ["critical"]
    assert driver.core.idle


def test_dedup_memory_is_bounded() -> None:
    driver = Driver(replace(FAST, dedup_memory=2))
    for name in "abc":
        driver.offer(payload(name))
        driver.send()
    assert list(driver.core.delivered) == ["b|firing", "c|firing"]
    ops = driver.core.drain().spool
    assert SpoolOp(DELIVERED, "a|firing", None) in ops
    driver.offer(payload("a"))  # forgotten: at-least-once, so it goes out again
    assert ids(driver.send()) == ["a"]


# ----- grouping and pacing ---------------------------------------------------------------------------------


def test_slack_pacing_coalesces_a_burst_instead_of_dropping() -> None:
    driver = Driver(replace(FAST, max_per_second=1.0, max_batch=10))
    driver.offer(payload("first"))
    assert ids(driver.send()) == ["first"]
    driver.at(0.1).offer(*(payload(f"b{i}") for i in range(25)))
    assert driver.take() is None
    assert driver.wakeup() == pytest.approx(1.0)
    sizes = []
    for second in (1.0, 2.0, 3.0):
        sizes.append(len(driver.at(second).send().alerts))
        assert driver.take() is None  # one message per second
    assert sizes == [10, 10, 5]
    assert driver.totals["delivered"] == 26 and driver.totals["dropped"] == 0


def test_burst_allows_back_to_back_requests() -> None:
    driver = Driver(replace(FAST, max_per_second=1.0, burst=3, max_batch=1))
    driver.offer(*(payload(f"a{i}") for i in range(4)))
    assert [len(driver.send().alerts) for _ in range(3)] == [1, 1, 1]
    assert driver.take() is None
    assert len(driver.at(1.0).send().alerts) == 1


def test_group_wait_gathers_a_burst() -> None:
    driver = Driver(replace(FAST, group_wait=2.0))
    driver.offer(payload("a"))
    driver.at(1.0).offer(payload("b"))
    assert driver.at(1.5).take() is None
    assert driver.wakeup() == pytest.approx(2.0)
    assert ids(driver.at(2.0).send()) == ["a", "b"]


def test_group_interval_holds_repeats_of_one_rule_and_subject() -> None:
    driver = Driver(replace(FAST, group_interval=10.0))
    driver.offer(payload("a"))
    driver.send()
    driver.at(1.0).offer(payload("a", status="resolved"))
    driver.at(2.0).offer(payload("b"), payload("c", subject="group:other"))
    assert ids(driver.send()) == ["c"]  # another subject is not held
    assert driver.take() is None
    assert driver.wakeup() == pytest.approx(10.0)
    batch = driver.at(10.0).send()
    assert [(a["id"], a["status"]) for a in batch.alerts] == [("a", "resolved"), ("b", "firing")]


# ----- failures --------------------------------------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    driver = Driver(FAST)
    driver.offer(payload("a"))
    delays = []
    for _ in range(6):
        driver.send(TRANSIENT)
        delays.append(driver.core.retry_at - driver.now)
        assert driver.take() is None
        driver.at(driver.core.retry_at)
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    driver.send(OK)
    assert driver.core.failures == 0 and driver.core.retry_at == 0.0
    assert driver.totals == {
        "delivered": 1,
        "failed_attempts": 6,
        "retried": 6,
        "dropped": 0,
        "suppressed": 0,
    }
    effects = driver.core.drain()
    assert effects.requests == {"transient": 6, "ok": 1}
    assert any("delivering again after 6 failed attempts" in note for _, note in effects.notes)


def test_jitter_shortens_delays_within_bounds() -> None:
    driver = Driver(replace(FAST, jitter=0.5, backoff_max=1000.0), seed=7)
    driver.offer(payload("a"))
    for failures in range(1, 9):
        driver.send(TRANSIENT)
        full = 2.0 ** (failures - 1)
        assert full * 0.5 <= driver.core.retry_at - driver.now <= full
        driver.at(driver.core.retry_at)


def test_retry_after_is_honoured() -> None:
    driver = Driver(FAST)
    driver.offer(payload("a"))
    driver.send(TRANSIENT, retry_after=30.0)
    assert driver.core.retry_at == pytest.approx(30.0)
    assert driver.wakeup() == pytest.approx(30.0)


def test_rejections_are_dropped_after_max_retries() -> None:
    driver = Driver(replace(FAST, max_rejections=3))
    driver.offer(payload("a"))
    for _ in range(3):
        driver.send(PERMANENT)
        driver.at(driver.core.retry_at)
    assert driver.core.idle
    assert driver.totals["dropped"] == 1 and driver.totals["retried"] == 2
    assert driver.core.drain().counts[("dropped", "rejected")] == 1


def test_partial_batch_failure_retries_only_the_failed() -> None:
    driver = Driver(FAST)
    driver.offer(payload("a"), payload("b"), payload("c"))
    driver.send(OK, TRANSIENT, OK)
    assert list(driver.core.pending) == ["b|firing"]
    assert ids(driver.at(1.0).send()) == ["b"]
    assert driver.totals["delivered"] == 3 and driver.totals["failed_attempts"] == 1


def test_pending_expires_after_max_age() -> None:
    driver = Driver(replace(FAST, max_age=100.0))
    driver.offer(payload("a"))
    driver.send(TRANSIENT)
    assert driver.wakeup() == pytest.approx(1.0)
    driver.core.retry_at = 1e9  # a dead receiver: nothing more is attempted
    assert driver.wakeup() == pytest.approx(100.0)
    driver.at(100.5).take()
    assert driver.core.idle and driver.core.drain().counts[("dropped", "expired")] == 1


def test_overflow_drops_the_oldest_least_severe_and_counts_it() -> None:
    driver = Driver(replace(FAST, max_pending=3))
    driver.offer(payload("i1", severity="info"), payload("w1"), payload("c1", severity="critical"))
    driver.offer(payload("w2"))
    assert sorted(driver.core.pending) == ["c1|firing", "w1|firing", "w2|firing"]
    driver.offer(payload("i2", severity="info"))  # the newcomer is the least important: refused
    assert "i2|firing" not in driver.core.pending
    driver.offer(payload("c2", severity="critical"))
    assert sorted(driver.core.pending) == ["c1|firing", "c2|firing", "w2|firing"]
    assert driver.totals["dropped"] == 3
    assert driver.core.drain().counts[("dropped", "overflow")] == 3


def test_overflow_never_evicts_what_is_in_flight() -> None:
    driver = Driver(replace(FAST, max_pending=1))
    driver.offer(payload("i1", severity="info"))
    assert driver.take() is not None
    driver.offer(payload("c1", severity="critical"))
    assert list(driver.core.pending) == ["i1|firing"]


def test_complete_checks_its_batch() -> None:
    driver = Driver(FAST)
    driver.offer(payload("a"))
    batch = driver.take()
    assert batch is not None
    with pytest.raises(ValueError, match="results"):
        driver.core.complete(batch, [OK, OK], 0.0, T0)
    with pytest.raises(ValueError, match="not in flight"):
        driver.core.complete(Batch(("x",), ({},)), [OK], 0.0, T0)


def test_abandoned_batch_stays_pending() -> None:
    driver = Driver(FAST)
    driver.offer(payload("a"))
    assert driver.take() is not None
    driver.core.abandon_in_flight()
    assert ids(driver.send()) == ["a"]


# ----- Alertmanager-style re-sends -------------------------------------------------------------------------

RESEND = replace(FAST, resend=60.0, max_batch=200)


def test_firing_alerts_are_resent_until_resolved() -> None:
    driver = Driver(RESEND)
    driver.offer(payload("a"))
    driver.send()
    driver.at(30.0).offer(payload("a", count=9))  # an update: not sent now (dedup), but re-sent with it
    assert driver.at(59.0).take() is None
    assert driver.wakeup() == pytest.approx(60.0)
    batch = driver.at(60.0).send()
    assert batch.alerts[0]["count"] == 9
    assert driver.wakeup() == pytest.approx(120.0)
    driver.at(100.0).offer(payload("a", status="resolved", count=9))
    assert [a["status"] for a in driver.send().alerts] == ["resolved"]
    assert driver.wakeup() is None
    assert driver.at(500.0).take() is None


def test_resend_set_is_bounded() -> None:
    driver = Driver(replace(RESEND, max_pending=2))
    driver.offer(payload("a"), payload("b"))
    driver.send()
    driver.offer(payload("c"))
    driver.send()
    assert list(driver.core.active) == ["b", "c"]
    assert driver.core.drain().counts[("dropped", "resend_overflow")] == 1
    assert ids(driver.at(60.0).send()) == ["b", "c"]  # "a" is no longer re-sent


def test_resolve_supersedes_an_unsent_firing_for_alertmanager() -> None:
    driver = Driver(RESEND)
    driver.offer(payload("a"))
    driver.send(TRANSIENT)  # Alertmanager is down
    driver.offer(payload("a", status="resolved"))
    batch = driver.at(1.0).send()
    assert [(a["id"], a["status"]) for a in batch.alerts] == [("a", "resolved")]
    assert driver.core.drain().counts[("suppressed", "superseded")] == 1


def test_other_hooks_keep_the_firing_before_its_resolve() -> None:
    driver = Driver(FAST)
    driver.offer(payload("a"))
    driver.send(TRANSIENT)
    driver.offer(payload("a", status="resolved"))
    assert [a["status"] for a in driver.at(1.0).send().alerts] == ["firing", "resolved"]


def test_spool_effects_follow_the_lifecycle() -> None:
    driver = Driver(RESEND)
    driver.offer(payload("a"))
    driver.send()
    driver.offer(payload("a", status="resolved"))
    ops = driver.core.drain().spool
    kinds = [(op.namespace, op.key, op.value is None) for op in ops]
    assert kinds == [
        (ACTIVE, "a", False),
        (PENDING, "a|firing", False),
        (PENDING, "a|firing", True),
        (DELIVERED, "a|firing", False),
        (ACTIVE, "a", True),
        (PENDING, "a|resolved", False),
    ]
    unspooled = Driver(replace(FAST, spooled=False))
    unspooled.offer(payload("a"))
    unspooled.send()
    assert unspooled.core.drain().spool == []


def test_restore_resumes_pending_dedup_and_resends() -> None:
    first = Driver(RESEND)
    first.offer(payload("done"), payload("active"))
    first.send()
    first.offer(payload("later"), payload("done", status="resolved"))
    spooled: dict[str, dict[str, Any]] = {}
    for op in first.core.drain().spool:
        space = spooled.setdefault(op.namespace, {})
        if op.value is None:
            space.pop(op.key, None)
        else:
            space[op.key] = op.value
    second = Driver(RESEND)
    second.core.restore(spooled, 0.0)
    second.offer(payload("active"))  # the restarted job re-publishes: already delivered
    batch = second.send()
    assert [(a["id"], a["status"]) for a in batch.alerts] == [
        ("later", "firing"),
        ("done", "resolved"),
        ("active", "firing"),
    ]
    assert second.totals["suppressed"] == 1


def test_wakeup_is_none_when_idle() -> None:
    assert Driver(FAST).wakeup() is None


# ----- property: nothing offered is lost -------------------------------------------------------------------

_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("offer"),
            st.sampled_from(["a", "b", "c", "d"]),
            st.sampled_from(["firing", "resolved"]),
            st.sampled_from(["info", "warning", "critical"]),
        ),
        st.tuples(st.just("take")),
        st.tuples(
            st.just("complete"), st.lists(st.sampled_from([OK, TRANSIENT, PERMANENT]), min_size=1, max_size=4)
        ),
        st.tuples(st.just("tick"), st.floats(min_value=0.0, max_value=5.0)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(_ops, st.booleans(), st.floats(min_value=0.0, max_value=3.0))
def test_every_accepted_alert_is_delivered_eventually(ops: list[Any], resend: bool, interval: float) -> None:
    policy = replace(
        FAST,
        max_per_second=2.0,
        max_batch=3,
        group_interval=interval,
        resend=30.0 if resend else None,
        max_rejections=10_000,
    )
    driver = Driver(policy)
    offered: dict[tuple[str, str], int] = {}
    delivered: dict[tuple[str, str], int] = {}
    ranks = {"info": 0, "warning": 1, "critical": 2}

    def record(batch: Batch, results: list[Result]) -> None:
        for alert, result in zip(batch.alerts, results, strict=True):
            if result is OK:
                key = (alert["id"], alert["status"])
                delivered[key] = max(delivered.get(key, -1), ranks[alert["severity"]])

    for op in ops:
        if op[0] == "offer":
            _, name, status, severity = op
            if status == "firing" and (name, "resolved") in offered:
                continue  # AlertBook never re-fires an id after its resolve
            driver.offer(payload(name, status=status, severity=severity))
            key = (name, status)
            offered[key] = max(offered.get(key, -1), ranks[severity])
        elif op[0] == "take":
            if driver.core.in_flight is None:
                driver.take()
        elif op[0] == "complete":
            batch = driver.core.in_flight
            if batch is not None:  # offers between take and complete: updates while in flight
                results = (op[1] * len(batch.keys))[: len(batch.keys)]
                driver.core.complete(batch, results, driver.now, driver.wall)
                record(batch, results)
        else:
            driver.now += op[1]
    for _ in range(1000):
        if driver.core.idle:
            break
        if driver.core.in_flight is not None:
            batch = driver.core.in_flight
            driver.core.complete(batch, [OK] * len(batch.keys), driver.now, driver.wall)
            record(batch, [OK] * len(batch.keys))
            continue
        wake = driver.wakeup()
        driver.now = max(driver.now, wake if wake is not None else driver.now)
        batch = driver.take()
        if batch is not None:
            driver.core.complete(batch, [OK] * len(batch.keys), driver.now, driver.wall)
            record(batch, [OK] * len(batch.keys))
    assert driver.core.idle
    assert driver.totals["dropped"] == 0
    for key, rank in offered.items():
        superseded = resend and key[1] == "firing" and (key[0], "resolved") in offered
        if not superseded:
            assert delivered.get(key, -1) >= rank, key
