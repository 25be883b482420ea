"""flex.* rules (KIP-482): header versions and tagged fields, on frames crafted from real encodings."""

from __future__ import annotations

import random
import uuid
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import codec
from checks.engine import Monitor
from checks.model import Finding
from checks.rule import Context
from checks.rules.flexible import FlexibleRule, has_tag_evidence, walk_tags
from checks.settings import ChecksSettings
from codec.samples import random_request_body, random_response_body
from codec.taprecord import TapFrame
from tests.checks.builders import SECOND, Conversation, arrival_order, shared_offsets

MS = 1_000_000
METADATA, API_VERSIONS = 3, 18
CLIENT_ID = "app"
#: api key, api version, correlation id, client id length + client id: where the header's tags start.
HEADER_END = 2 + 2 + 4 + 2 + len(CLIENT_ID)
METADATA_BODY = {"Topics": [{"Name": "orders", "TopicId": uuid.UUID(int=0)}], "AllowAutoTopicCreation": False}


def run(frames: list[TapFrame]) -> tuple[list[Finding], Monitor]:
    monitor = Monitor([FlexibleRule()], Context(ChecksSettings()))
    out = monitor.feed_all(frames)
    out.extend(monitor.flush())
    return out, monitor


def rules_of(findings: list[Finding]) -> list[str]:
    return [f.rule for f in findings]


def metadata_raw(version: int, corr: int = 7) -> bytes:
    body = {k: v for k, v in METADATA_BODY.items() if version >= 4 or k != "AllowAutoTopicCreation"}
    return codec.encode_request(METADATA, version, corr, CLIENT_ID, body)


def test_flexible_request_sent_with_header_v1() -> None:
    raw = metadata_raw(12)
    assert raw[HEADER_END] == 0  # the empty tagged-field section of request header v2
    wrong = raw[:HEADER_END] + raw[HEADER_END + 1 :]
    conv = Conversation()
    sent = conv.garbage("req", wrong, SECOND)
    # Read with header v2, the body is one byte off yet decodes, with bytes left over.
    assert sent.request is not None and "_trailing" in sent.request.body
    findings, _ = run([sent, conv.garbage("req", wrong, 2 * SECOND)])
    header = [f for f in findings if f.rule == "flex.header_version"]
    assert len(header) == 1  # once per connection, direction, api and version
    f = header[0]
    assert f.severity == "warning"
    assert f.evidence["header_version"] == 1 and f.evidence["expected_header_version"] == 2
    assert "Metadata v12 request uses request header v1" in f.summary


def test_non_flexible_request_sent_with_header_v2() -> None:
    raw = metadata_raw(8)
    wrong = raw[:HEADER_END] + b"\x00" + raw[HEADER_END:]
    conv = Conversation()
    findings, _ = run([conv.garbage("req", wrong, SECOND)])
    header = [f for f in findings if f.rule == "flex.header_version"]
    assert [(f.evidence["header_version"], f.evidence["expected_header_version"]) for f in header] == [(2, 1)]


def test_flexible_response_sent_with_header_v0() -> None:
    conv = Conversation()
    request = conv.request(METADATA, 12, METADATA_BODY, SECOND)
    body: dict[str, Any] = {"Brokers": [], "ClusterId": None, "ControllerId": 1, "Topics": []}
    raw = codec.encode_response(METADATA, 12, request.correlation_id or 0, body)
    assert raw[4] == 0  # response header v1's tagged-field section
    wrong = raw[:4] + raw[5:]
    answer = conv.raw_response(request, wrong, SECOND + MS)
    assert answer.error is not None  # undecodable as sent: judged through the engine's hook
    findings, _ = run([request, answer])
    assert "frame.decode_error" in rules_of(findings)
    header = [f for f in findings if f.rule == "flex.header_version"]
    assert len(header) == 1
    assert header[0].evidence["direction"] == "resp" and header[0].evidence["header_version"] == 0


def test_well_formed_and_plainly_broken_frames_are_not_header_faults() -> None:
    conv = Conversation()
    frames = [
        *conv.exchange(METADATA, 12, METADATA_BODY, {"Brokers": [], "ControllerId": 1, "Topics": []}, SECOND),
        *conv.exchange(
            METADATA, 8, METADATA_BODY, {"Brokers": [], "ControllerId": 1, "Topics": []}, 2 * SECOND
        ),
        conv.garbage("req", metadata_raw(12)[:-3], 3 * SECOND),
        conv.garbage("req", b"\x00\x03\x00\x0c\xff\xff", 4 * SECOND),
    ]
    findings, _ = run(frames)
    assert rules_of(findings) == ["frame.decode_error", "frame.decode_error"]


def test_unknown_and_out_of_order_header_tags() -> None:
    raw = metadata_raw(12)
    # Two tags in the request header, 7 before 3: both unknown to the codec, and not ascending.
    tags = bytes([2, 7, 1, ord("a"), 3, 1, ord("b")])
    crafted = raw[:HEADER_END] + tags + raw[HEADER_END + 1 :]
    conv = Conversation()
    findings, _ = run([conv.garbage("req", crafted, SECOND), conv.garbage("req", crafted, 2 * SECOND)])
    got = sorted((f.severity.value, f.evidence["tag"], f.evidence.get("problem", "")) for f in findings)
    assert got == [("info", 3, ""), ("info", 7, ""), ("warning", 3, "not ascending")]
    assert all(f.rule == "flex.tagged_fields" and f.evidence["path"] == "header" for f in findings)


def test_known_tag_with_wrong_size_in_body() -> None:
    conv = Conversation()
    request = conv.request(API_VERSIONS, 3, {"ClientSoftwareName": "x", "ClientSoftwareVersion": "1"}, SECOND)
    body = {
        "ErrorCode": 0,
        "ApiKeys": [{"ApiKey": 3, "MinVersion": 0, "MaxVersion": 12}],
        "ThrottleTimeMs": 0,
    }
    raw = codec.encode_response(API_VERSIONS, 3, request.correlation_id or 0, body)
    assert raw[-1] == 0
    # ZkMigrationReady (tag 3, a bool) declared 2 bytes long.
    crafted = raw[:-1] + bytes([1, 3, 2, 1, 0])
    findings, _ = run([request, conv.raw_response(request, crafted, SECOND + MS)])
    assert rules_of(findings) == ["flex.tagged_fields"]
    f = findings[0]
    assert f.severity == "warning" and f.evidence["tag"] == 3 and "declared size 2" in f.summary


def test_walk_tags_reaches_nested_structs() -> None:
    body = {
        "A": [{"B": {"_unknown_tags": {9: b"zz"}}}],
        "_tag_anomalies": [{"tag": 1, "offset": 3, "problem": "duplicate"}],
    }
    assert list(walk_tags(body)) == [
        ("anomaly", "", {"tag": 1, "offset": 3, "problem": "duplicate"}),
        ("unknown", "A[0].B", {"tag": 9, "size": 2}),
    ]


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_findings_independent_of_arrival_order(data: st.DataObject) -> None:
    a, b = Conversation(conn="ca"), Conversation(conn="cb")
    shared_offsets(a, b)
    raw = metadata_raw(12)
    tags = bytes([2, 7, 1, ord("a"), 3, 1, ord("b")])
    frames = [
        a.garbage("req", raw[:HEADER_END] + raw[HEADER_END + 1 :], SECOND),
        b.garbage("req", raw[:HEADER_END] + tags + raw[HEADER_END + 1 :], SECOND + 3 * MS),
        *a.exchange(
            METADATA, 12, METADATA_BODY, {"Brokers": [], "ControllerId": 1, "Topics": []}, 5 * SECOND
        ),
        b.garbage("req", metadata_raw(8)[:HEADER_END] + b"\x00" + metadata_raw(8)[HEADER_END:], 14 * SECOND),
        a.garbage("req", b"\x00\x03\x00\x0c\xff\xff", 20 * SECOND),
    ]
    expected = [f.to_dict() for f in run(frames)[0]]
    assert {f["rule"] for f in expected} == {
        "flex.header_version",
        "flex.tagged_fields",
        "frame.decode_error",
    }
    watermark = int(ChecksSettings().watermark_seconds * SECOND)
    jitters = data.draw(st.lists(st.integers(0, watermark - 1), min_size=len(frames), max_size=len(frames)))
    findings, monitor = run(arrival_order(frames, jitters))
    assert [f.to_dict() for f in findings] == expected
    assert monitor.stats.late_frames == 0


def test_fast_tag_check_agrees_with_the_walk_on_every_flexible_message() -> None:
    """The pre-check that skips the walk must never hide a finding (nor be vacuous: both outcomes occur)."""
    rng = random.Random(5)
    outcomes = {True: 0, False: 0}
    for api_key in sorted(codec.api_keys()):
        lo, hi = codec.supported_versions(api_key)
        for version in range(lo, hi + 1):
            if not codec.is_flexible(api_key, version):
                continue
            for _ in range(3):
                try:
                    raw = codec.encode_request(
                        api_key, version, 1, "c", random_request_body(api_key, version, rng)
                    )
                    request = codec.decode_request(raw)
                    raw = codec.encode_response(
                        api_key, version, 1, random_response_body(api_key, version, rng)
                    )
                    response = codec.decode_response(raw, api_key, version)
                except (codec.EncodeError, codec.DecodeError):
                    continue
                for body in (request.header, request.body, response.header, response.body):
                    found = bool(list(walk_tags(body)))
                    assert has_tag_evidence(body) == found, (api_key, version)
                    outcomes[found] += 1
    assert outcomes[True] > 50 and outcomes[False] > 50
