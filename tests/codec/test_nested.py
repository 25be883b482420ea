"""Payloads inside bytes fields: consumer protocol, Envelope (KIP-590), principals."""

from __future__ import annotations

import struct

import codec
from codec.nested import ConsumerAssignment, ConsumerSubscription, EmbeddedRequest, EmbeddedResponse


def _subscription(version: int, topics: list[str]) -> bytes:
    body = {"Topics": topics, "UserData": None, "OwnedPartitions": [], "GenerationId": 4, "RackId": None}
    return struct.pack(">h", version) + codec.encode_data("ConsumerProtocolSubscription", version, body)


def test_join_group_consumer_metadata_decodes_per_version() -> None:
    for version in range(4):
        meta = _subscription(version, ["orders", "payments"])
        request_body = {
            "GroupId": "g",
            "SessionTimeoutMs": 10000,
            "RebalanceTimeoutMs": 10000,
            "MemberId": "",
            "GroupInstanceId": None,
            "ProtocolType": "consumer",
            "Protocols": [{"Name": "range", "Metadata": meta}],
            "Reason": None,
        }
        frame = codec.encode_request(11, 7, 1, "c", request_body)
        decoded = codec.decode_request(frame)
        sub = decoded.body["Protocols"][0]["Metadata"]
        assert isinstance(sub, ConsumerSubscription)
        assert sub.version == version and sub.error is None
        assert sub.value is not None and sub.value["Topics"] == ["orders", "payments"]
        assert codec.encode(decoded) == frame


def test_newer_consumer_protocol_version_reads_with_newest_known_layout() -> None:
    meta = struct.pack(">h", 9) + codec.encode_data(
        "ConsumerProtocolSubscription", 3, {"Topics": ["a"], "UserData": None, "OwnedPartitions": []}
    )
    sub = ConsumerSubscription(meta)
    assert sub.version == 9 and sub.value is not None and sub.value["Topics"] == ["a"]


def test_malformed_consumer_metadata_keeps_frame_decodable() -> None:
    body = {"GroupId": "g", "SessionTimeoutMs": 1, "MemberId": "", "ProtocolType": "consumer"}
    body["Protocols"] = [{"Name": "range", "Metadata": b"\x00\x01\xff"}]
    frame = codec.encode_request(11, 1, 1, "c", body)
    decoded = codec.decode_request(frame)
    sub = decoded.body["Protocols"][0]["Metadata"]
    assert sub.error is not None and bytes(sub) == b"\x00\x01\xff"
    assert codec.encode(decoded) == frame


def test_non_consumer_protocol_metadata_stays_bytes() -> None:
    body = {"GroupId": "g", "SessionTimeoutMs": 1, "MemberId": "", "ProtocolType": "connect"}
    body["Protocols"] = [{"Name": "sessioned", "Metadata": b"\x00\x01"}]
    decoded = codec.decode_request(codec.encode_request(11, 1, 1, "c", body))
    assert decoded.body["Protocols"][0]["Metadata"] == b"\x00\x01"


def test_sync_group_assignment_decodes_with_protocol_type_from_request() -> None:
    assignment = struct.pack(">h", 1) + codec.encode_data(
        "ConsumerProtocolAssignment",
        1,
        {"AssignedPartitions": [{"Topic": "t", "Partitions": [0, 1]}], "UserData": None},
    )
    request = codec.decode_request(
        codec.encode_request(
            14,
            3,
            1,
            "c",
            {
                "GroupId": "g",
                "GenerationId": 1,
                "MemberId": "m",
                "Assignments": [{"MemberId": "m", "Assignment": assignment}],
            },
        )
    )
    # SyncGroup v3 has no ProtocolType in either direction: without the group context it stays bytes.
    assert request.body["Assignments"][0]["Assignment"] == assignment
    response_v5 = codec.decode_response(
        codec.encode_response(
            14,
            5,
            1,
            {"ErrorCode": 0, "ProtocolType": "consumer", "ProtocolName": "range", "Assignment": assignment},
        ),
        14,
        5,
    )
    decoded = response_v5.body["Assignment"]
    assert isinstance(decoded, ConsumerAssignment)
    assert decoded.value is not None and decoded.value["AssignedPartitions"][0]["Partitions"] == [0, 1]


def test_envelope_inner_request_and_response_decode_recursively() -> None:
    inner = codec.encode_request(
        19, 7, 77, "adminclient-1", {"Topics": [], "ValidateOnly": False, "TimeoutMs": 5000}
    )
    principal = struct.pack(">h", 0) + codec.encode_data(
        "DefaultPrincipalData", 0, {"Type": "User", "Name": "alice", "TokenAuthenticated": False}
    )
    envelope = codec.encode_request(
        58,
        0,
        5,
        "broker-1",
        {"RequestData": inner, "RequestPrincipal": principal, "ClientHostAddress": b"\x7f\x00\x00\x01"},
    )
    request = codec.decode_request(envelope)
    wrapped = request.body["RequestData"]
    assert isinstance(wrapped, EmbeddedRequest) and wrapped.request is not None
    assert (wrapped.request.api_key, wrapped.request.api_version, wrapped.request.client_id) == (
        19,
        7,
        "adminclient-1",
    )
    assert request.body["RequestPrincipal"].value["Name"] == "alice"
    assert codec.encode(request) == envelope

    inner_response = codec.encode_response(19, 7, 77, {"ThrottleTimeMs": 0, "Topics": []})
    response_frame = codec.encode_response(58, 0, 5, {"ResponseData": inner_response, "ErrorCode": 0})
    response = codec.decode_response(response_frame, 58, 0, request=request)
    unwrapped = response.body["ResponseData"]
    assert isinstance(unwrapped, EmbeddedResponse) and unwrapped.response is not None
    assert unwrapped.response.correlation_id == 77
    assert codec.encode(response) == response_frame
    # Without the paired request the inner response cannot be typed, but stays lossless.
    alone = codec.decode_response(response_frame, 58, 0)
    assert alone.body["ResponseData"].response is None and codec.encode(alone) == response_frame
    # Paired later (the monitor decodes each frame on its own, then pairs it): typed once expanded.
    from codec.api import expand_response

    expand_response(alone, request)
    assert alone.body["ResponseData"].response is not None
    assert alone.body["ResponseData"].response.correlation_id == 77
    assert codec.encode(alone) == response_frame
