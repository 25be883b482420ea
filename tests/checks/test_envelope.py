"""envelope.untrusted_source (KIP-590) on frames built through the real codec."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

import codec
from checks.engine import Monitor
from checks.model import Finding
from checks.rule import Context
from checks.rules.envelope import EnvelopeRule
from checks.settings import ChecksSettings
from codec.taprecord import TapFrame
from tests.checks.builders import SECOND, Conversation, arrival_order, shared_offsets

MS = 1_000_000
ENVELOPE, BROKER_REGISTRATION, CREATE_TOPICS = 58, 62, 19
INNER_BODY = {"Topics": [], "timeoutMs": 30000, "validateOnly": False}


def run(frames: list[TapFrame], config: ChecksSettings | None = None) -> tuple[list[Finding], Monitor]:
    monitor = Monitor([EnvelopeRule()], Context(config or ChecksSettings()))
    out = monitor.feed_all(frames)
    out.extend(monitor.flush())
    return out, monitor


def envelope(conv: Conversation, ts: int) -> list[TapFrame]:
    inner = codec.encode_request(CREATE_TOPICS, 7, 99, "admin-cli", INNER_BODY)
    inner_resp = codec.encode_response(CREATE_TOPICS, 7, 99, {"ThrottleTimeMs": 0, "Topics": []})
    req = {"RequestData": inner, "RequestPrincipal": b"", "ClientHostAddress": bytes([10, 0, 0, 5])}
    return conv.exchange(ENVELOPE, 0, req, {"ResponseData": inner_resp, "ErrorCode": 0}, ts)


def registration(conv: Conversation, ts: int) -> list[TapFrame]:
    body = {
        "BrokerId": 2,
        "ClusterId": "c",
        "IncarnationId": uuid.UUID(int=7),
        "Listeners": [],
        "Features": [],
        "Rack": None,
        "IsMigratingZkBroker": False,
        "LogDirs": [],
        "PreviousBrokerEpoch": -1,
    }
    return conv.exchange(BROKER_REGISTRATION, 4, body, {"ErrorCode": 0, "BrokerEpoch": 10}, ts)


def test_envelope_from_client_listener_is_critical() -> None:
    conv = Conversation(listener="PLAINTEXT", client_id="evil")
    frames = [*envelope(conv, SECOND), *envelope(conv, 2 * SECOND)]
    findings, _ = run(frames)
    assert [f.rule for f in findings] == ["envelope.untrusted_source"] * 2  # every attempt counts
    f = findings[0]
    assert f.severity == "critical" and f.subject == f"conn:{conv.conn}"
    assert "CreateTopics v7" in f.summary and f.evidence["inner_client_id"] == "admin-cli"


def test_broker_listener_is_trusted() -> None:
    findings, _ = run(envelope(Conversation(listener="CONTROLLER"), SECOND))
    assert findings == []
    findings, _ = run(envelope(Conversation(listener="replication"), SECOND))
    assert findings == []


def test_broker_client_address_is_trusted() -> None:
    config = ChecksSettings(broker_client_addresses=("10.0.0.7",))
    findings, _ = run(envelope(Conversation(listener="PLAINTEXT", client="10.0.0.7:40000"), SECOND), config)
    assert findings == []
    config = ChecksSettings(broker_client_addresses=("10.0.0.7:40000",))
    findings, _ = run(envelope(Conversation(listener="PLAINTEXT", client="10.0.0.7:40000"), SECOND), config)
    assert findings == []
    findings, _ = run(envelope(Conversation(listener="PLAINTEXT", client="10.0.0.8:40000"), SECOND), config)
    assert len(findings) == 1


def test_prior_broker_registration_makes_the_connection_a_broker() -> None:
    conv = Conversation(listener="PLAINTEXT")
    findings, _ = run([*registration(conv, SECOND), *envelope(conv, 2 * SECOND)])
    assert findings == []
    # Registration on another connection does not vouch for this one; nor does a later one.
    other = Conversation(conn="c-other", listener="PLAINTEXT")
    shared_offsets(conv, other)
    findings, _ = run(
        [*registration(other, SECOND), *envelope(conv, 2 * SECOND), *registration(conv, 3 * SECOND)]
    )
    assert [f.rule for f in findings] == ["envelope.untrusted_source"]


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_findings_independent_of_arrival_order(data: st.DataObject) -> None:
    client = Conversation(conn="c-client", listener="PLAINTEXT")
    broker = Conversation(conn="c-broker", listener="PLAINTEXT", client="10.0.0.2:41000")
    shared_offsets(client, broker)
    frames = [
        *registration(broker, SECOND),
        *envelope(broker, SECOND + 2 * MS),
        *envelope(client, SECOND + 1 * MS),
        *envelope(client, 12 * SECOND),
        *envelope(broker, 13 * SECOND),
    ]
    expected = [f.to_dict() for f in run(frames)[0]]
    assert [f["subject"] for f in expected] == ["conn:c-client", "conn:c-client"]
    watermark = int(ChecksSettings().watermark_seconds * SECOND)
    jitters = data.draw(st.lists(st.integers(0, watermark - 1), min_size=len(frames), max_size=len(frames)))
    findings, monitor = run(arrival_order(frames, jitters))
    assert [f.to_dict() for f in findings] == expected
    assert monitor.stats.late_frames == 0


def test_inner_request_is_checked_by_every_rule_but_counted_once_in_the_fleet() -> None:
    from checks.rules.apiversions import ApiVersionsClusterRule
    from checks.rules.flexible import FlexibleRule

    conv = Conversation(listener="CONTROLLER")
    inner = codec.encode_request(
        CREATE_TOPICS, 7, 99, "admin-cli", INNER_BODY, header={"_unknown_tags": {5: b"x"}}
    )
    inner_resp = codec.encode_response(CREATE_TOPICS, 7, 99, {"ThrottleTimeMs": 0, "Topics": []})
    req = {"RequestData": inner, "RequestPrincipal": b"", "ClientHostAddress": bytes([10, 0, 0, 5])}
    frames = conv.exchange(ENVELOPE, 0, req, {"ResponseData": inner_resp, "ErrorCode": 0}, SECOND)
    monitor = Monitor([EnvelopeRule(), FlexibleRule(), ApiVersionsClusterRule()], Context(ChecksSettings()))
    findings = monitor.feed_all(frames) + monitor.flush()
    assert [f.rule for f in findings] == ["envelope.inner_flex.tagged_fields"]
    assert findings[0].evidence["tag"] == 5 and "envelope" in findings[0].evidence
    used = monitor.states[("apiversions.cluster", "cluster")]["used"]
    assert used == {"client.id=app": {str(ENVELOPE): {"0": 1}}}


def test_rules_see_the_inner_response_of_an_envelope() -> None:
    """KIP-590: the monitor decodes each frame on its own, then pairs it; the Envelope's inner answer
    must be typed by then, so rules judge the forwarded request's response, not only the request."""
    from checks.model import Exchange
    from checks.rule import Rule, RuleContext, State

    seen: list[tuple[int, int | None]] = []

    class Inner(Rule):
        name = "inner"
        key_kind = "conn"

        def keys(self, ex: Exchange) -> list[str]:
            return [ex.conn]

        def on_response(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
            if ex.envelope is not None:
                seen.append((ex.api_key, None if ex.resp is None else ex.resp.correlation_id))

    request, response = envelope(Conversation(listener="PLAINTEXT"), SECOND)
    assert response.message is not None
    # As the tap topic's reader has it: the response frame decoded on its own, without its request.
    response.message = codec.decode_response(codec.encode(response.message), ENVELOPE, 0)
    monitor = Monitor([Inner()], Context(ChecksSettings()))
    monitor.feed_all([request, response])
    monitor.flush()
    assert seen == [(CREATE_TOPICS, 99)]


def test_no_finding_about_an_inner_exchange_takes_an_id_declared_outside_envelopes() -> None:
    """``checks.alerts.OUTSIDE_ENVELOPES`` drops ids from the gate and the runbook: a forwarded request at a
    version Kafka 4.0 removed must break the rules it can, and never report the fleet's count inside."""
    from checks import new_monitor
    from checks.alerts import ENVELOPE_INNER_PREFIX, OUTSIDE_ENVELOPES

    conv = Conversation(listener="PLAINTEXT")
    produce = {"Acks": 1, "TimeoutMs": 1000, "TopicData": []}
    inner = codec.encode_request(0, 2, 99, "rogue", produce)
    inner_resp = codec.encode_response(0, 2, 99, {"Responses": [], "ThrottleTimeMs": 0})
    req = {"RequestData": inner, "RequestPrincipal": b"", "ClientHostAddress": bytes([10, 0, 0, 5])}
    frames = conv.exchange(ENVELOPE, 0, req, {"ResponseData": inner_resp, "ErrorCode": 0}, SECOND)
    monitor = new_monitor()
    rules = {f.rule for f in monitor.feed_all(frames) + monitor.flush()}
    assert "envelope.untrusted_source" in rules  # the inner exchange was unwrapped and judged
    assert not {ENVELOPE_INNER_PREFIX + r for r in OUTSIDE_ENVELOPES} & rules
