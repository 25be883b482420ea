"""AlertHooks end to end against real HTTP receivers on loopback: payloads, outages, retries, restarts."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from streaming.hooks import AlertHooks, SpoolLockedError
from streaming.hooks.formatters import alert_payload
from tests.streaming.hooks.builders import CLUSTER, RUNBOOK, T0, alert
from tests.streaming.hooks.conftest import hooks_config
from tests.streaming.hooks.receiver import Received, Receiver, Reply, free_port

MakeHooks = Callable[..., AlertHooks]
MakeReceiver = Callable[..., Receiver]


def _sample(hooks: AlertHooks, name: str, **labels: str) -> float:
    return hooks.registry.get_sample_value(name, labels) or 0.0


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_payload_shapes_per_kind(make_hooks: MakeHooks, receivers: MakeReceiver) -> None:
    receiver = receivers().start()
    config = hooks_config(
        {"kind": "webhook", "url": f"{receiver.url}/hook", "headers": {"Authorization": "Bearer s3cret"}},
        {"kind": "slack", "url": f"{receiver.url}/slack", "max_per_second": 50},
        {"kind": "pagerduty", "url": f"{receiver.url}/pd", "routing_key": "R0UT1NG", "source": "kpmon-test"},
        {"kind": "alertmanager", "url": receiver.url, "labels": {"team": "kafka"}},
    )
    hooks = make_hooks(config)
    firing = alert("a1", severity="critical")
    resolved = alert("a2", status="resolved", last_seen=T0 + 5_000_000_000)
    hooks.publish([firing, resolved])
    assert hooks.flush(10.0)

    by_path: dict[str, list[Received]] = {}
    for request in receiver.requests:
        by_path.setdefault(request.path, []).append(request)
    assert set(by_path) == {"/hook", "/slack", "/pd", "/api/v2/alerts"}

    webhook = by_path["/hook"]
    assert [r.body for r in webhook] == [alert_payload(firing), alert_payload(resolved)]
    assert webhook[0].headers["Authorization"] == "Bearer s3cret"
    assert webhook[0].headers["Content-Type"] == "application/json"

    slack_ids = [
        b["elements"][0]["text"]
        for r in by_path["/slack"]
        for b in r.body["blocks"]
        if b["type"] == "context"
    ]
    assert slack_ids == ["id `a1`", "id `a2`"]
    assert all(set(r.body) == {"text", "blocks"} for r in by_path["/slack"])
    runbook = f"{RUNBOOK}#groupjoinprotocol_type_null"
    sections = [b for r in by_path["/slack"] for b in r.body["blocks"] if b["type"] == "section"]
    assert [b["accessory"]["url"] for b in sections] == [runbook, runbook]
    assert all(f"*Cluster:* {CLUSTER}" in b["text"]["text"] for b in sections)

    # Every receiver says which cluster and where the runbook is.
    assert all(r.body["cluster"] == CLUSTER and r.body["runbook_url"] == runbook for r in webhook)

    events = [r.body for r in by_path["/pd"]]
    assert [(e["event_action"], e["dedup_key"], e["routing_key"]) for e in events] == [
        ("trigger", "a1", "R0UT1NG"),
        ("resolve", "a2", "R0UT1NG"),
    ]
    assert events[0]["payload"]["severity"] == "critical" and events[0]["payload"]["source"] == "kpmon-test"
    assert events[0]["payload"]["group"] == CLUSTER and events[0]["payload"]["summary"].startswith(
        f"[CRITICAL] {CLUSTER}: "
    )
    assert events[0]["links"] == [{"href": runbook, "text": "Runbook: group.join.protocol_type_null"}]

    sent = [entry for r in by_path["/api/v2/alerts"] for entry in r.body]
    assert [(e["labels"]["alert_id"], e["labels"]["team"], "endsAt" in e) for e in sent] == [
        ("a1", "kafka", False),
        ("a2", "kafka", True),
    ]
    assert sent[1]["endsAt"] == "2025-11-13T02:13:25.000000Z"
    assert all(e["labels"]["cluster"] == CLUSTER for e in sent)
    assert all(e["annotations"]["runbook_url"] == runbook for e in sent)

    for name, stats in hooks.stats().items():
        assert stats == {
            "delivered": 2,
            "failed_attempts": 0,
            "retried": 0,
            "dropped": 0,
            "pending": 0,
            "suppressed": 0,
        }, name


def test_min_severity_and_dedup_per_hook(make_hooks: MakeHooks, receivers: MakeReceiver) -> None:
    receiver = receivers().start()
    config = hooks_config(
        {"kind": "webhook", "name": "all", "url": f"{receiver.url}/all"},
        {"kind": "webhook", "name": "pager", "url": f"{receiver.url}/pager", "min_severity": "critical"},
    )
    hooks = make_hooks(config)
    hooks.publish([alert("w", severity="warning"), alert("c", severity="critical")])
    hooks.publish([alert("w", severity="warning", count=2)])  # the next micro-batch updates it: no re-send
    assert hooks.flush(10.0)
    assert sorted((r.path, r.body["id"]) for r in receiver.requests) == [
        ("/all", "c"),
        ("/all", "w"),
        ("/pager", "c"),
    ]
    stats = hooks.stats()
    assert stats["all"]["suppressed"] == 1 and stats["pager"]["suppressed"] == 2


def test_receiver_down_at_first_gets_everything_when_it_returns(
    make_hooks: MakeHooks, receivers: MakeReceiver
) -> None:
    receiver = receivers()  # its port is reserved but nothing listens yet
    hooks = make_hooks(hooks_config({"kind": "webhook", "url": receiver.url}))
    hooks.publish([alert("a1"), alert("a2")])
    assert _wait(lambda: hooks.stats()["webhook"]["failed_attempts"] >= 3)
    assert not hooks.flush(0.05)
    receiver.start()
    assert hooks.flush(10.0)
    assert [r.body["id"] for r in receiver.requests] == ["a1", "a2"]
    stats = hooks.stats()["webhook"]
    assert stats["delivered"] == 2 and stats["retried"] >= 3 and stats["pending"] == 0
    labels = {"hook": "webhook", "kind": "webhook"}
    assert _sample(hooks, "kpmon_alert_hook_alerts_total", outcome="delivered", reason="", **labels) == 2
    assert _sample(hooks, "kpmon_alert_hook_requests_total", result="transient", **labels) >= 3
    assert _sample(hooks, "kpmon_alert_hook_pending", **labels) == 0
    assert _sample(hooks, "kpmon_alert_hook_delivery_seconds_count", **labels) == 2


def test_server_errors_are_retried_and_counted(make_hooks: MakeHooks, receivers: MakeReceiver) -> None:
    answers = iter([500, 503, 200])
    receiver = receivers(script=lambda _request: Reply(next(answers, 200))).start()
    hooks = make_hooks(hooks_config({"kind": "webhook", "url": receiver.url}))
    hooks.publish([alert("a1")])
    assert hooks.flush(10.0)
    assert [r.body["id"] for r in receiver.requests] == ["a1", "a1", "a1"]
    assert hooks.stats()["webhook"] == {
        "delivered": 1,
        "failed_attempts": 2,
        "retried": 2,
        "dropped": 0,
        "pending": 0,
        "suppressed": 0,
    }


def test_retry_after_is_respected(make_hooks: MakeHooks, receivers: MakeReceiver) -> None:
    times: list[float] = []

    def script(_request: Received) -> Reply:
        times.append(time.monotonic())
        return Reply(429, b"rate_limited", {"Retry-After": "1"}) if len(times) == 1 else Reply()

    receiver = receivers(script=script).start()
    hooks = make_hooks(hooks_config({"kind": "slack", "url": receiver.url}))
    hooks.publish([alert("a1")])
    assert hooks.flush(10.0)
    assert len(times) == 2 and times[1] - times[0] >= 0.9


def test_rejections_and_redirects_are_dropped_after_max_retries(
    make_hooks: MakeHooks, receivers: MakeReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    rejecting = receivers(script=lambda _r: Reply(400, b"invalid_payload")).start()
    redirecting = receivers(script=lambda _r: Reply(302, b"", {"Location": "http://127.0.0.1:9/"})).start()
    config = hooks_config(
        {"kind": "webhook", "name": "bad", "url": rejecting.url, "max_retries": 2},
        {"kind": "webhook", "name": "moved", "url": redirecting.url + "/secret-token", "max_retries": 1},
    )
    hooks = make_hooks(config)
    with caplog.at_level(logging.WARNING, logger="kpmon.alerts.hooks"):
        hooks.publish([alert("a1")])
        assert hooks.flush(10.0)
    assert len(rejecting.requests) == 2 and len(redirecting.requests) == 1
    stats = hooks.stats()
    assert stats["bad"]["dropped"] == 1 and stats["moved"]["dropped"] == 1
    assert any("answered 400: invalid_payload" in r.getMessage() for r in caplog.records)
    assert not any("secret-token" in r.getMessage() for r in caplog.records)  # URLs are redacted


def test_dead_hooks_never_block_publish_nor_the_others(
    make_hooks: MakeHooks, receivers: MakeReceiver
) -> None:
    good = receivers().start()
    # Accepts connections (the kernel's backlog) but never answers: every request runs into the timeout.
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(16)
    try:
        config = hooks_config(
            {
                "kind": "webhook",
                "name": "silent",
                "url": f"http://127.0.0.1:{blackhole.getsockname()[1]}",
                "timeout_seconds": 1.0,
            },
            {"kind": "webhook", "name": "refused", "url": f"http://127.0.0.1:{free_port()}"},
            {
                "kind": "kafka",
                "name": "nobroker",
                "cluster": {"bootstrap_servers": f"127.0.0.1:{free_port()}"},
                "timeout_seconds": 1.0,
            },
            {"kind": "webhook", "name": "good", "url": good.url},
        )
        hooks = make_hooks(config)
        slowest = 0.0
        for n in range(20):
            started = time.perf_counter()
            hooks.publish([alert(f"a{n}")])
            slowest = max(slowest, time.perf_counter() - started)
        # Not a benchmark: a publish that waited on any receiver would take the 1 s request timeout.
        assert slowest < 0.5, slowest
        assert good.wait_for(lambda requests: len(requests) == 20)
        assert _wait(
            lambda: all(hooks.stats()[n]["failed_attempts"] >= 1 for n in ("silent", "refused", "nobroker"))
        )
        assert not hooks.flush(0.1)
        stats = hooks.stats()
        assert stats["good"]["delivered"] == 20
        for name in ("silent", "refused", "nobroker"):
            assert stats[name]["delivered"] == 0 and stats[name]["pending"] == 20, name
        started = time.perf_counter()
        hooks.close(0.5)
        assert time.perf_counter() - started < 3.0
    finally:
        blackhole.close()


def test_pending_deliveries_survive_a_restart(
    tmp_path: Path, make_hooks: MakeHooks, receivers: MakeReceiver
) -> None:
    receiver = receivers()
    spool = tmp_path / "spool"
    config = hooks_config({"kind": "webhook", "url": receiver.url}, {"kind": "log"})
    first = make_hooks(config, spool)
    first.publish([alert("a1"), alert("a2"), alert("a1", status="resolved")])
    assert _wait(lambda: first.stats()["webhook"]["failed_attempts"] >= 1)
    first.close(0.1)
    assert (spool / "webhook.jsonl").exists() and not (spool / "log.jsonl").exists()

    spooled = [json.loads(line) for line in (spool / "webhook.jsonl").read_text().splitlines()]
    assert [entry["key"] for entry in spooled if entry["ns"] == "pending"] == [
        "a1|firing",
        "a2|firing",
        "a1|resolved",
    ]

    receiver.start()
    second = make_hooks(config, spool)
    assert second.flush(10.0)
    assert [(r.body["id"], r.body["status"]) for r in receiver.requests] == [
        ("a1", "firing"),
        ("a2", "firing"),
        ("a1", "resolved"),
    ]
    second.publish([alert("a2")])  # a replayed micro-batch after the restart: remembered, not re-sent
    assert second.flush(5.0)
    assert len(receiver.requests) == 3 and second.stats()["webhook"]["suppressed"] == 1
    second.close()

    third = make_hooks(config, spool)
    third.publish([alert("a1", status="resolved")])
    assert third.flush(5.0) and len(receiver.requests) == 3


def test_bounded_queue_counts_overflow(make_hooks: MakeHooks, caplog: pytest.LogCaptureFixture) -> None:
    config = hooks_config({"kind": "webhook", "url": f"http://127.0.0.1:{free_port()}", "max_pending": 2})
    hooks = make_hooks(config)
    with caplog.at_level(logging.ERROR, logger="kpmon.alerts.hooks"):
        hooks.publish([alert(f"a{n}") for n in range(5)])
    stats = hooks.stats()["webhook"]
    assert stats["pending"] == 2 and stats["dropped"] == 3
    assert sum("pending deliveries at the limit" in r.getMessage() for r in caplog.records) == 3
    assert (
        _sample(
            hooks,
            "kpmon_alert_hook_alerts_total",
            hook="webhook",
            kind="webhook",
            outcome="dropped",
            reason="overflow",
        )
        == 3
    )


def test_invalid_alerts_are_counted_not_raised(make_hooks: MakeHooks, receivers: MakeReceiver) -> None:
    receiver = receivers().start()
    hooks = make_hooks(hooks_config({"kind": "webhook", "url": receiver.url}))
    broken = alert("b")
    broken.status = "exploded"
    hooks.publish([alert("a1"), broken, object()])  # type: ignore[list-item]
    assert hooks.flush(10.0)
    assert [r.body["id"] for r in receiver.requests] == ["a1"]
    assert hooks.stats()["webhook"]["dropped"] == 2


def test_slack_bursts_are_coalesced_into_few_messages(make_hooks: MakeHooks, receivers: MakeReceiver) -> None:
    receiver = receivers().start()
    hooks = make_hooks(hooks_config({"kind": "slack", "url": receiver.url, "max_per_second": 5}))
    hooks.publish([alert("first")])
    assert receiver.wait_for(lambda requests: len(requests) == 1)
    hooks.publish([alert(f"b{n:02d}") for n in range(12)])
    assert hooks.flush(10.0)
    listed = [
        [b["elements"][0]["text"] for b in r.body["blocks"] if b["type"] == "context"]
        for r in receiver.requests
    ]
    assert [len(ids) for ids in listed] == [1, 10, 2]
    assert sorted(i for ids in listed for i in ids) == sorted(
        ["id `first`", *(f"id `b{n:02d}`" for n in range(12))]
    )


def test_alertmanager_resends_firing_until_resolved(make_hooks: MakeHooks, receivers: MakeReceiver) -> None:
    receiver = receivers().start()
    hooks = make_hooks(hooks_config({"kind": "alertmanager", "url": receiver.url, "resend_seconds": 0.2}))
    hooks.publish([alert("a1")])
    assert receiver.wait_for(lambda requests: len(requests) >= 3)
    assert all(
        r.body[0]["labels"]["alert_id"] == "a1" and "endsAt" not in r.body[0] for r in receiver.requests
    )
    hooks.publish([alert("a1", status="resolved", last_seen=T0 + 10**9)])
    assert receiver.wait_for(lambda requests: "endsAt" in requests[-1].body[0])
    settled = len(receiver.requests)
    time.sleep(0.5)
    assert len(receiver.requests) == settled


def test_log_hook_writes_one_json_line_per_alert(
    make_hooks: MakeHooks, caplog: pytest.LogCaptureFixture
) -> None:
    hooks = make_hooks(hooks_config({"kind": "log"}))
    with caplog.at_level(logging.INFO, logger="kpmon.alerts"):
        hooks.publish([alert("a1"), alert("a2", severity="critical")])
        assert hooks.flush(5.0)
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "kpmon.alerts"]
    assert [(line["event"], line["id"]) for line in lines] == [("kpmon.alert", "a1"), ("kpmon.alert", "a2")]


def test_one_owner_per_spool_and_a_private_registry(tmp_path: Path, make_hooks: MakeHooks) -> None:
    hooks = make_hooks(hooks_config({"kind": "log"}), tmp_path / "spool")
    assert hooks.registry is not REGISTRY
    with pytest.raises(SpoolLockedError):
        AlertHooks(hooks_config({"kind": "log"}), tmp_path / "spool")
    hooks.close()
    make_hooks(hooks_config({"kind": "log"}), tmp_path / "spool")


def test_publish_from_many_threads(make_hooks: MakeHooks, receivers: MakeReceiver) -> None:
    receiver = receivers().start()
    hooks = make_hooks(hooks_config({"kind": "alertmanager", "url": receiver.url, "max_per_second": 100}))

    def publisher(thread: int) -> None:
        for n in range(25):
            hooks.publish([alert(f"t{thread}-{n}")])

    threads = [threading.Thread(target=publisher, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert hooks.flush(10.0)
    sent = {entry["labels"]["alert_id"] for r in receiver.requests for entry in r.body}
    assert len(sent) == 100 and hooks.stats()["alertmanager"]["delivered"] == 100
