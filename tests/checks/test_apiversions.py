"""apiversions.* rules on frames built through the real codec."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import codec
from checks.engine import Monitor
from checks.model import Finding
from checks.rule import Context
from checks.rules.apiversions import (
    ApiVersionsClusterRule,
    ApiVersionsRule,
    coverage,
    fleet_matrix,
    removed_in_4_0,
)
from checks.settings import ChecksSettings
from codec.taprecord import TapFrame
from tests.checks.builders import SECOND, Conversation, arrival_order, shared_offsets

MS = 1_000_000
METADATA, FETCH, PRODUCE, API_VERSIONS, CREATE_TOPICS = 3, 1, 0, 18, 19


def run(frames: list[TapFrame]) -> tuple[list[Finding], Monitor]:
    monitor = Monitor([ApiVersionsRule(), ApiVersionsClusterRule()], Context(ChecksSettings()))
    out = monitor.feed_all(frames)
    out.extend(monitor.flush())
    return out, monitor


def ranges(**apis: tuple[int, int]) -> dict[str, Any]:
    """An ApiVersions answer advertising the named APIs (codec names: Metadata, JoinGroup...)."""
    table = {codec.api_name(key): key for key in codec.api_keys()}
    return {
        "ErrorCode": 0,
        "ApiKeys": [
            {"ApiKey": table[name], "MinVersion": lo, "MaxVersion": hi} for name, (lo, hi) in apis.items()
        ],
    }


STANDARD = {"ApiVersions": (0, 4), "Metadata": (0, 12), "Fetch": (4, 17), "Produce": (3, 12)}


def handshake(
    conv: Conversation, ts: int, adv: dict[str, tuple[int, int]] | None = None, software: str = "librdkafka"
) -> list[TapFrame]:
    req = {"ClientSoftwareName": software, "ClientSoftwareVersion": "2.6.0"}
    return conv.exchange(API_VERSIONS, 3, req, ranges(**(adv or STANDARD)), ts)


def metadata(conv: Conversation, version: int, ts: int) -> list[TapFrame]:
    return conv.exchange(METADATA, version, {"Topics": [], "AllowAutoTopicCreation": False}, {}, ts)


def rules_of(findings: list[Finding]) -> list[str]:
    return [f.rule for f in findings]


def test_in_range_requests_are_silent() -> None:
    conv = Conversation()
    frames = [conv.open(0), *handshake(conv, 1 * SECOND), *metadata(conv, 12, 2 * SECOND)]
    findings, _ = run(frames)
    assert findings == []


def test_out_of_range_against_this_connections_advertisement() -> None:
    conv = Conversation()
    frames = [
        conv.open(0),
        *handshake(conv, 1 * SECOND, {**STANDARD, "Metadata": (0, 9)}),
        *metadata(conv, 12, 2 * SECOND),
        *metadata(conv, 12, 3 * SECOND),  # the same api/version again: reported once
    ]
    findings, _ = run(frames)
    assert rules_of(findings) == ["apiversions.out_of_range"]
    f = findings[0]
    assert f.severity == "warning" and f.subject == f"conn:{conv.conn}"
    assert f.evidence["advertised"] == [0, 9] and f.evidence["api_version"] == 12
    assert "Metadata v12" in f.summary


def test_advertisement_is_per_connection() -> None:
    narrow, wide = Conversation(conn="c-narrow"), Conversation(conn="c-wide")
    shared_offsets(narrow, wide)
    frames = [
        narrow.open(0),
        wide.open(0),
        *handshake(narrow, 1 * SECOND, {**STANDARD, "Metadata": (0, 9)}),
        *handshake(wide, 1 * SECOND),
        *metadata(wide, 12, 2 * SECOND),
    ]
    findings, _ = run(frames)
    assert findings == []


def test_identical_advertisements_are_stored_once() -> None:
    """Connections to one broker share its ranges (memory per connection); different answers do not."""
    convs = [Conversation(conn=f"c{i}") for i in range(3)]
    shared_offsets(*convs)
    frames = [
        *handshake(convs[0], 1 * SECOND),
        *handshake(convs[1], 2 * SECOND),
        *handshake(convs[2], 3 * SECOND, {**STANDARD, "Metadata": (0, 9)}),
        *metadata(convs[2], 12, 4 * SECOND),
    ]
    findings, monitor = run(frames)
    stored = [monitor.states[("apiversions", c.conn)]["ranges"] for c in convs]
    assert stored[0] is stored[1] and stored[0] is not stored[2]
    assert stored[2][str(METADATA)] == [0, 9] and stored[0][str(METADATA)] == [0, 12]
    assert rules_of(findings) == ["apiversions.out_of_range"]


def test_api_not_advertised_at_all() -> None:
    conv = Conversation()
    frames = [
        conv.open(0),
        *handshake(conv, 1 * SECOND, {"ApiVersions": (0, 4)}),
        *metadata(conv, 1, 2 * SECOND),
    ]
    findings, _ = run(frames)
    assert rules_of(findings) == ["apiversions.out_of_range"]
    assert findings[0].evidence["advertised"] is None and "absent" in findings[0].summary


def test_v0_fallback_after_unsupported_version() -> None:
    conv = Conversation()
    first = conv.request(
        API_VERSIONS, 4, {"ClientSoftwareName": "x", "ClientSoftwareVersion": "1"}, 1 * SECOND
    )
    fallback = {"ErrorCode": 35, "ApiKeys": [{"ApiKey": API_VERSIONS, "MinVersion": 0, "MaxVersion": 2}]}
    frames = [
        conv.open(0),
        first,
        conv.response(first, fallback, 1 * SECOND + MS),
        # Only ApiVersions is judged until a full answer comes: Metadata here is no verdict.
        *metadata(conv, 4, 2 * SECOND),
        # Retrying above the fallback's range is out of range...
        *conv.exchange(API_VERSIONS, 3, {}, ranges(**STANDARD), 3 * SECOND),
    ]
    findings, _ = run(frames)
    assert rules_of(findings) == ["apiversions.out_of_range"]
    assert findings[0].evidence["advertised"] == [0, 2]

    conv = Conversation()
    first = conv.request(
        API_VERSIONS, 4, {"ClientSoftwareName": "x", "ClientSoftwareVersion": "1"}, 1 * SECOND
    )
    frames = [
        conv.open(0),
        first,
        conv.response(first, fallback, 1 * SECOND + MS),
        # ...retrying within it is what KIP-511 asks for; the full answer then governs.
        *conv.exchange(API_VERSIONS, 2, {}, ranges(**STANDARD), 2 * SECOND),
        *metadata(conv, 12, 3 * SECOND),
    ]
    findings, _ = run(frames)
    assert findings == []


def test_no_handshake_once_per_connection() -> None:
    conv = Conversation()
    frames = [conv.open(0), *metadata(conv, 9, 1 * SECOND), *metadata(conv, 9, 2 * SECOND)]
    findings, _ = run(frames)
    assert rules_of(findings) == ["apiversions.no_handshake"]
    assert findings[0].severity == "info"


def test_no_handshake_not_judged_mid_connection() -> None:
    # The monitor started after this connection opened: its ApiVersions may have gone unseen.
    conv = Conversation(seq=40)
    findings, _ = run([*metadata(conv, 9, 1 * SECOND)])
    assert findings == []


def test_removed_in_4_0_once_per_software_api_version_and_fleet_matrix() -> None:
    old, new = Conversation(conn="c-old", client_id="legacy"), Conversation(conn="c-new")
    shared_offsets(old, new)
    frames = [
        old.open(0),
        new.open(0),
        *handshake(old, 1 * SECOND, software="kafka-python"),
        *handshake(new, 1 * SECOND, software="librdkafka"),
        *old.exchange(
            FETCH, 3, {"ReplicaId": -1, "MaxWaitMs": 1, "MinBytes": 1, "Topics": []}, {}, 2 * SECOND
        ),
        *old.exchange(
            FETCH, 3, {"ReplicaId": -1, "MaxWaitMs": 1, "MinBytes": 1, "Topics": []}, {}, 3 * SECOND
        ),
        *metadata(new, 12, 2 * SECOND),
    ]
    findings, monitor = run(frames)
    # Fetch v3 is advertised by nobody here (STANDARD starts at v4), so also out of range.
    removed = [f for f in findings if f.rule == "apiversions.removed_in_4_0"]
    assert len(removed) == 1
    assert removed[0].subject == "client:kafka-python/2.6.0" and removed[0].severity == "info"
    state = monitor.states[("apiversions.cluster", "cluster")]
    rows = {(r.software, r.api_name, r.version): r for r in fleet_matrix(state)}
    fetch = rows[("kafka-python/2.6.0", "Fetch", 3)]
    # The matrix counts connections: two Fetch v3 requests on one connection are one use.
    assert fetch.count == 1 and fetch.removed_in_4_0
    assert not rows[("librdkafka/2.6.0", "Metadata", 12)].removed_in_4_0
    cells = {(c.api_key, c.version): c for c in coverage(state)}
    assert (
        cells[(FETCH, 3)].used == 1 and not cells[(FETCH, 3)].advertised and cells[(FETCH, 3)].removed_in_4_0
    )
    assert cells[(FETCH, 17)].advertised and cells[(FETCH, 17)].used == 0


def test_software_falls_back_to_client_id() -> None:
    conv = Conversation(client_id="old-app")
    frames = [conv.open(0), *conv.exchange(API_VERSIONS, 0, {}, ranges(**STANDARD), SECOND)]
    frames += conv.exchange(PRODUCE, 2, {"Acks": 1, "TimeoutMs": 1, "TopicData": []}, {}, 2 * SECOND)
    findings, _ = run(frames)
    removed = [f for f in findings if f.rule == "apiversions.removed_in_4_0"]
    assert [f.subject for f in removed] == ["client:client.id=old-app"]


def test_removed_in_4_0_table() -> None:
    assert removed_in_4_0(PRODUCE, 2) and not removed_in_4_0(PRODUCE, 3)
    assert removed_in_4_0(6, 0)  # UpdateMetadata: the whole API is gone
    assert not removed_in_4_0(METADATA, 0) and not removed_in_4_0(9999, 0)
    # Share-group v0 (KIP-932) was an unstable version in 3.9 and early access in 4.0; 4.1 dropped it.
    # Not a KIP-896 removal: a 4.0 broker serves it.
    assert not any(removed_in_4_0(api, 0) for api in (76, 77, 78, 79))


def test_cluster_skew_between_brokers() -> None:
    b1 = Conversation(conn="c1", broker="10.0.0.1:9092", broker_id=1)
    b2 = Conversation(conn="c2", broker="10.0.0.2:9092", broker_id=2)
    shared_offsets(b1, b2)
    frames = [
        *handshake(b1, 1 * SECOND),
        *handshake(b2, 2 * SECOND, {**STANDARD, "Fetch": (4, 16)}),
        *handshake(b2, 3 * SECOND, {**STANDARD, "Fetch": (4, 16)}),  # the same skew: once
    ]
    findings, _ = run(frames)
    assert rules_of(findings) == ["apiversions.cluster_skew"]
    f = findings[0]
    assert f.subject == "api:Fetch" and f.severity == "warning"
    assert f.evidence["ranges"] == {"broker:1": [4, 17], "broker:2": [4, 16]}


def test_no_skew_when_brokers_agree_or_one_broker_upgrades() -> None:
    b1 = Conversation(conn="c1", broker="10.0.0.1:9092", broker_id=1)
    b2 = Conversation(conn="c2", broker="10.0.0.2:9092", broker_id=2)
    shared_offsets(b1, b2)
    findings, _ = run([*handshake(b1, 1 * SECOND), *handshake(b2, 2 * SECOND)])
    assert findings == []
    # The same broker re-advertising (after its own upgrade) replaces its entry: no skew with itself.
    findings, _ = run(
        [*handshake(b1, 1 * SECOND), *handshake(b1, 2 * SECOND, {**STANDARD, "Fetch": (4, 18)})]
    )
    assert findings == []


def test_controller_skew_for_forwardable_apis() -> None:
    broker = Conversation(conn="c1", broker="10.0.0.1:9092", broker_id=1)
    ctrl = Conversation(conn="c9", broker="10.0.0.9:9093", broker_id=9, listener="CONTROLLER")
    shared_offsets(broker, ctrl)
    frames = [
        *handshake(broker, 1 * SECOND, {**STANDARD, "CreateTopics": (2, 7)}),
        *handshake(
            ctrl, 2 * SECOND, {"ApiVersions": (0, 4), "CreateTopics": (2, 6), "BrokerRegistration": (0, 4)}
        ),
    ]
    findings, _ = run(frames)
    assert rules_of(findings) == ["apiversions.cluster_skew"]
    assert findings[0].subject == "api:CreateTopics" and "controller" in findings[0].summary
    # Metadata is not forwardable: the controller not serving it is no skew.
    frames = [
        *handshake(broker, 3 * SECOND, {**STANDARD, "CreateTopics": (2, 6)}),
        *handshake(
            ctrl, 4 * SECOND, {"ApiVersions": (0, 4), "CreateTopics": (2, 7), "BrokerRegistration": (0, 4)}
        ),
    ]
    findings, _ = run(frames)
    assert findings == []


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_findings_independent_of_arrival_order(data: st.DataObject) -> None:
    a = Conversation(conn="ca", broker="10.0.0.1:9092", broker_id=1)
    b = Conversation(conn="cb", broker="10.0.0.2:9092", broker_id=2, client_id="legacy")
    shared_offsets(a, b)
    frames = [
        a.open(0),
        b.open(0),
        *handshake(a, 1 * SECOND, {**STANDARD, "Metadata": (0, 9)}),
        *metadata(b, 4, 1 * SECOND + 500 * MS),
        *handshake(b, 2 * SECOND, {**STANDARD, "Fetch": (4, 16)}),
        *metadata(a, 12, 3 * SECOND),
        *b.exchange(PRODUCE, 2, {"Acks": 1, "TimeoutMs": 1, "TopicData": []}, {}, 15 * SECOND),
        *metadata(a, 11, 30 * SECOND),
    ]
    expected = [f.to_dict() for f in run(frames)[0]]
    assert {f["rule"] for f in expected} == {
        "apiversions.out_of_range",
        "apiversions.no_handshake",
        "apiversions.cluster_skew",
        "apiversions.removed_in_4_0",
    }
    watermark = int(ChecksSettings().watermark_seconds * SECOND)
    jitters = data.draw(st.lists(st.integers(0, watermark - 1), min_size=len(frames), max_size=len(frames)))
    findings, monitor = run(arrival_order(frames, jitters))
    assert [f.to_dict() for f in findings] == expected
    assert monitor.stats.late_frames == 0


def test_no_handshake_judged_on_tap_numbering() -> None:
    """The tap's open record is seq 1, so a connection's first request is seq 2."""
    conv = Conversation(seq=1)
    findings, _ = run([conv.open(0), *metadata(conv, 12, SECOND)])
    assert rules_of(findings) == ["apiversions.no_handshake"]


# -- judged from the request header, whatever happened to the body -----------------------------------


def test_undecodable_version_beyond_the_codec_is_out_of_range_and_a_decode_error() -> None:
    """The issue's case: Metadata v99 after ApiVersions; the body cannot decode (no codec defines v99)."""
    conv = Conversation(client_id="old-client")
    bad = conv.undecodable_request(METADATA, 99, b"\x00\x00\x00\x00", 2 * SECOND)
    findings, _ = run([conv.open(0), *handshake(conv, 1 * SECOND), bad])
    # Both, as separate findings: the body is undecodable, and the version was never advertised.
    assert sorted(rules_of(findings)) == ["apiversions.out_of_range", "frame.decode_error"]
    (oor,) = [f for f in findings if f.rule == "apiversions.out_of_range"]
    ev = oor.evidence
    assert (ev["api_key"], ev["api_version"], ev["advertised"], ev["body"]) == (
        METADATA,
        99,
        [0, 12],
        "undecodable",
    )
    assert ev["correlation_id"] == bad.correlation_id and ev["offsets"] == [[0, bad.offset]]
    assert "Metadata v99" in oor.summary and "v0-v12" in oor.summary


def test_undecodable_body_of_a_removed_version_is_still_judged() -> None:
    conv = Conversation(client_id="legacy-app")
    bad = conv.undecodable_request(FETCH, 3, b"\xff", 2 * SECOND)
    findings, monitor = run([conv.open(0), *handshake(conv, 1 * SECOND), bad])
    assert sorted(rules_of(findings)) == [
        "apiversions.out_of_range",
        "apiversions.removed_in_4_0",
        "frame.decode_error",
    ]
    (removed,) = [f for f in findings if f.rule == "apiversions.removed_in_4_0"]
    assert removed.evidence["body"] == "undecodable" and removed.subject == "client:librdkafka/2.6.0"
    # The fleet matrix counts it like any other use.
    rows = fleet_matrix(monitor.states[("apiversions.cluster", "cluster")])
    assert [(r.api_key, r.version, r.count) for r in rows if r.api_key == FETCH] == [(FETCH, 3, 1)]


def test_header_only_capture_is_judged_from_the_header() -> None:
    conv = Conversation(client_id="meta-app")
    frames = [conv.open(0), conv.header_only_request(FETCH, 3, 1 * SECOND)]
    findings, _ = run(frames)
    # No ApiVersions answer was captured, so only the 4.0 readiness can be judged.
    assert rules_of(findings) == ["apiversions.no_handshake", "apiversions.removed_in_4_0"]
    assert findings[1].evidence["body"] == "not captured"
    assert findings[1].subject == "client:client.id="  # the client id was not mirrored either


def test_in_range_undecodable_request_is_only_a_decode_error() -> None:
    conv = Conversation()
    bad = conv.undecodable_request(METADATA, 12, b"\x7f", 2 * SECOND)
    findings, _ = run([conv.open(0), *handshake(conv, 1 * SECOND), bad])
    assert rules_of(findings) == ["frame.decode_error"]


def test_connections_of_one_client_software_share_its_label() -> None:
    convs = [Conversation(conn=f"tap1-{i}", client=f"10.0.0.{i}:5000") for i in range(3)]
    shared_offsets(*convs)
    frames = [
        f for i, c in enumerate(convs) for f in handshake(c, SECOND + i * MS, software=["a", "b", "a"][i])
    ]
    _, monitor = run(frames)
    labels = monitor.states[("apiversions.cluster", "cluster")]["conn_software"]
    assert labels == {"tap1-0": "a/2.6.0", "tap1-1": "b/2.6.0", "tap1-2": "a/2.6.0"}
    assert labels["tap1-0"] is labels["tap1-2"]


# -- apiversions.removed_version_rejected (KIP-896 in front of a 4.x broker) ------------------------

#: What 4.x brokers advertise for the two APIs: Fetch from v4 (0-3 removed), Produce still from v0
#: (KAFKA-18659: librdkafka's version probe), though v0-v2 were removed too. A 3.x broker: both from v0.
BROKER_4X = {**STANDARD, "Fetch": (4, 17), "Produce": (0, 12)}
BROKER_3X = {**STANDARD, "Fetch": (0, 16), "Produce": (0, 11)}
PRODUCE_V2 = {"Acks": 1, "TimeoutMs": 1000, "TopicData": []}


def old_producer(adv: dict[str, tuple[int, int]], answered: bool, closed: bool) -> list[TapFrame]:
    conv = Conversation(conn="c-old", client_id="old-app")
    frames = [conv.open(0), *handshake(conv, SECOND, adv)]
    if answered:
        frames += conv.exchange(PRODUCE, 2, PRODUCE_V2, {"Responses": []}, 2 * SECOND)
    else:
        frames.append(conv.request(PRODUCE, 2, PRODUCE_V2, 2 * SECOND))
    if closed:
        frames.append(conv.close(3 * SECOND))
    return frames


def test_a_removed_version_a_4x_broker_closes_on_is_a_warning() -> None:
    findings, _ = run(old_producer(BROKER_4X, answered=False, closed=True))
    (rejected,) = [f for f in findings if f.rule == "apiversions.removed_version_rejected"]
    assert rejected.severity.value == "warning" and rejected.subject == "conn:c-old"
    assert "KIP-896" in rejected.summary and "closed the connection" in rejected.summary
    assert rejected.ts_ns == 3 * SECOND and rejected.evidence["advertised"] == [0, 12]
    assert (rejected.evidence["api_key"], rejected.evidence["api_version"]) == (PRODUCE, 2)
    # Not out of range (still advertised); the fleet's readiness finding stays info beside it.
    assert {f.rule: f.severity.value for f in findings if f.rule != rejected.rule} == {
        "apiversions.removed_in_4_0": "info"
    }


def test_a_removed_version_stays_info_in_front_of_3x_or_when_answered_or_still_open() -> None:
    for adv, answered, closed in (
        (BROKER_3X, False, True),  # a 3.x broker: the client is only not ready for 4.0
        (BROKER_4X, True, True),  # answered: the broker did not close the connection on it
        (BROKER_4X, False, False),  # no close seen (yet)
    ):
        findings, _ = run(old_producer(adv, answered, closed))
        assert [f.rule for f in findings] == ["apiversions.removed_in_4_0"], (adv, answered, closed)
