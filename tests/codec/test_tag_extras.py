"""``tag_extras``: whether a decoded message holds unknown tags or tagged-section anomalies anywhere,
its decoded nested payloads included.

The KIP-482 check skips its walk of every struct when the decode says there is nothing to find, and a
connection's key gets an exchange by its headers only when it says False, so the flag must never say
False where a ``_unknown_tags`` or ``_tag_anomalies`` key exists.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import assume, given, reject, settings
from hypothesis import strategies as st

import codec
from codec.api import REQUESTS_WITH_NESTED, RESPONSES_WITH_NESTED
from codec.nested import EmbeddedRequest, EmbeddedResponse, VersionedData
from codec.protocol import ApiKey
from tests.checks import test_groups as gr
from tests.checks.builders import Conversation
from tests.codec.strategies import ALL_MESSAGES, build_frame, decode_frame, messages, seeds


def _holds_extras(node: Any) -> bool:
    """The oracle: a plain walk of the decoded header and body, into the nested payloads decoded."""
    if isinstance(node, dict):
        if "_unknown_tags" in node or "_tag_anomalies" in node:
            return True
        return any(_holds_extras(v) for v in node.values())
    if isinstance(node, list):
        return any(_holds_extras(v) for v in node)
    if isinstance(node, VersionedData):
        return _holds_extras(node.value)
    if isinstance(node, EmbeddedRequest | EmbeddedResponse):
        inner = node.request if isinstance(node, EmbeddedRequest) else node.response
        return inner is not None and _holds_extras([inner.header, inner.body])
    return False


@pytest.mark.parametrize(("kind", "api_key", "version"), ALL_MESSAGES, ids=lambda v: str(v))
def test_the_flag_is_what_the_message_holds(kind: str, api_key: int, version: int) -> None:
    for seed in range(4):
        frame = build_frame(kind, api_key, version, seed * 7_919 + api_key * 31 + version)
        message = decode_frame(kind, frame, api_key, version)
        if message.tag_extras is None:  # nested payloads: the check walks as before
            continue
        assert message.tag_extras == _holds_extras([message.header, message.body]), (kind, api_key, version)


def test_the_flag_is_set_both_ways_across_the_catalogue() -> None:
    seen: set[bool | None] = set()
    for kind, api_key, version in ALL_MESSAGES:
        frame = build_frame(kind, api_key, version, api_key * 1_000 + version)
        seen.add(decode_frame(kind, frame, api_key, version).tag_extras)
    assert seen == {True, False, None}  # not vacuous: unknown tags occur, and nested payloads exist


def test_an_anomalous_tagged_section_sets_it() -> None:
    clean = codec.encode_request(
        ApiKey.API_VERSIONS, 3, 1, "c", {"ClientSoftwareName": "x", "ClientSoftwareVersion": "1"}
    )
    assert codec.decode_request(clean).tag_extras is False
    # The body's empty tagged section (its last byte) replaced by tag 5 twice: a duplicate.
    duplicated = clean[:-1] + b"\x02\x05\x00\x05\x00"
    message = codec.decode_request(duplicated)
    assert "_tag_anomalies" in message.body and message.tag_extras is True


def _consumer_join(version: int) -> tuple[bytes, bytes]:
    """A consumer JoinGroup exchange at ``version``, as wire bytes: its request and its answer (which
    names its protocol type from v7 on), each with a member's subscription."""
    member = [{"MemberId": "m", "GroupInstanceId": None, "Metadata": gr.subscription("orders")}]
    request, answer = gr.join(Conversation(conn="c"), 0, "m", 1, members=member, version=version)
    assert request.raw is not None and answer.raw is not None
    return request.raw, answer.raw


def test_decoded_nested_payloads_are_counted() -> None:
    """A request's nested payloads are decoded with it, and an answer's that name their protocol type:
    the flag covers them, evidence inside them included."""
    for version in (7, 9):
        raw_request, raw_answer = _consumer_join(version)
        request = codec.decode_request(raw_request)
        answer = codec.decode_response(raw_answer, ApiKey.JOIN_GROUP, version)
        assert isinstance(request.body["Protocols"][0]["Metadata"], VersionedData)
        assert isinstance(answer.body["Members"][0]["Metadata"], VersionedData)
        assert request.tag_extras is False and answer.tag_extras is False
    inner = codec.encode_request(ApiKey.METADATA, 12, 7, "inner", {"Topics": None})
    assert codec.decode_request(_envelope(inner)).tag_extras is False
    tagged_inner = next(
        frame
        for seed in range(200)
        if codec.decode_request(frame := build_frame("request", ApiKey.METADATA, 12, seed)).tag_extras
    )
    assert codec.decode_request(_envelope(tagged_inner)).tag_extras is True


def _envelope(inner: bytes) -> bytes:
    return codec.encode_request(
        ApiKey.ENVELOPE,
        0,
        1,
        "broker",
        {"RequestData": inner, "RequestPrincipal": b"", "ClientHostAddress": b""},
    )


def test_payloads_that_wait_for_the_request_leave_it_unknown() -> None:
    """An answer whose payloads only its request tells how to decode: unknown alone, known with it."""
    raw_request, raw_answer = _consumer_join(6)  # a v6 answer does not name its protocol type
    request = codec.decode_request(raw_request)
    alone = codec.decode_response(raw_answer, ApiKey.JOIN_GROUP, 6)
    assert alone.tag_extras is None and isinstance(alone.body["Members"][0]["Metadata"], bytes)
    paired = codec.decode_response(raw_answer, ApiKey.JOIN_GROUP, 6, request=request)
    assert paired.tag_extras is False and isinstance(paired.body["Members"][0]["Metadata"], VersionedData)
    inner = codec.encode_request(ApiKey.METADATA, 12, 7, "inner", {"Topics": None})
    inner_answer = codec.encode_response(ApiKey.METADATA, 12, 7, {"Brokers": [], "Topics": []})
    envelope = codec.decode_request(_envelope(inner))
    answer = codec.encode_response(ApiKey.ENVELOPE, 0, 1, {"ResponseData": inner_answer, "ErrorCode": 0})
    assert codec.decode_response(answer, ApiKey.ENVELOPE, 0).tag_extras is None
    assert codec.decode_response(answer, ApiKey.ENVELOPE, 0, request=envelope).tag_extras is False


def test_another_threads_decodes_do_not_leak_into_it() -> None:
    tagged = next(
        frame
        for seed in range(200)
        if codec.decode_request(frame := build_frame("request", ApiKey.METADATA, 12, seed)).tag_extras
    )
    clean = codec.encode_request(
        ApiKey.API_VERSIONS, 3, 1, "c", {"ClientSoftwareName": "x", "ClientSoftwareVersion": "1"}
    )
    stop = threading.Event()

    def noisy() -> None:
        while not stop.is_set():
            codec.decode_request(tagged)

    worker = threading.Thread(target=noisy)
    worker.start()
    try:
        flags = {codec.decode_request(clean).tag_extras for _ in range(3_000)}
    finally:
        stop.set()
        worker.join()
    assert flags == {False}


def _field_paths(node: Any, prefix: str = "", depth: int = 0) -> list[str]:
    """Dotted paths of a decoded body's fields (not its extras), into structs and arrays of structs."""
    out: list[str] = []
    if not isinstance(node, dict):
        return out
    for name, value in node.items():
        if name.startswith("_"):
            continue
        out.append(prefix + name)
        child = value[0] if isinstance(value, list) and value and isinstance(value[0], dict) else value
        if depth < 2 and isinstance(child, dict):
            out += _field_paths(child, f"{prefix}{name}.", depth + 1)
    return out


def _projected_decode(
    data: st.DataObject, message: tuple[str, int, int], frame: bytes, whole: codec.Request | codec.Response
) -> tuple[codec.Request | codec.Response, frozenset[str]]:
    """``frame`` decoded with a drawn projection of up to three of ``whole``'s field paths, and the paths."""
    kind, api_key, version = message
    paths = _field_paths(whole.body)
    chosen = frozenset(data.draw(st.lists(st.sampled_from(paths), max_size=3, unique=True)) if paths else [])
    if kind == "request":
        return codec.decode_request(frame, fields=chosen), chosen
    return codec.decode_response(frame, api_key, version, fields=chosen), chosen


@settings(max_examples=500, deadline=None)
@given(message=messages, seed=seeds, data=st.data())
def test_a_projected_decode_says_what_the_whole_decode_says(
    message: tuple[str, int, int], seed: int, data: st.DataObject
) -> None:
    """A projection skips fields without building them, not without reading their tagged sections: the
    flag a projected decode gives is the whole decode's, whatever the projection leaves out."""
    kind, api_key, version = message
    frame = build_frame(kind, api_key, version, seed)
    whole = decode_frame(kind, frame, api_key, version)
    assume(whole.tag_extras is not None)
    projected, chosen = _projected_decode(data, message, frame, whole)
    if projected.tag_extras is None:
        # Unknown, never wrong: nested payloads whose decode needs a field the projection left out
        # (a group answer's protocol type) wait for their request, as they would in a whole decode.
        nested = REQUESTS_WITH_NESTED if kind == "request" else RESPONSES_WITH_NESTED
        assert api_key in nested, (kind, api_key, version, sorted(chosen))
        return
    assert projected.tag_extras == whole.tag_extras, (kind, api_key, version, sorted(chosen))


def test_an_unknown_tag_in_a_skipped_struct_sets_a_projected_decodes_flag() -> None:
    """The case the property needs to be able to fail on, built by hand: a Produce answer whose only
    unknown tag sits in a partition's tagged section, decoded without its partitions."""
    body = {
        "Responses": [
            {
                "Name": "t",
                "PartitionResponses": [
                    {"Index": 0, "ErrorCode": 0, "BaseOffset": 1, "_unknown_tags": {90: b"\x01"}}
                ],
            }
        ],
        "ThrottleTimeMs": 0,
    }
    frame = codec.encode_response(ApiKey.PRODUCE, 9, 4, body)
    assert codec.decode_response(frame, ApiKey.PRODUCE, 9).tag_extras is True
    for fields in (frozenset({"ThrottleTimeMs"}), frozenset({"Responses.Name"})):
        assert codec.decode_response(frame, ApiKey.PRODUCE, 9, fields=fields).tag_extras is True, fields


@settings(max_examples=200, deadline=None)
@given(message=messages, seed=seeds, extra=st.binary(min_size=1, max_size=8), data=st.data())
def test_a_projected_decode_keeps_the_bytes_after_the_body(
    message: tuple[str, int, int], seed: int, extra: bytes, data: st.DataObject
) -> None:
    """Bytes after a body are the KIP-482 check's other evidence: a projected decode keeps them as the
    whole decode does."""
    kind, api_key, version = message
    frame = build_frame(kind, api_key, version, seed) + extra
    try:
        whole = decode_frame(kind, frame, api_key, version)
    except codec.DecodeError:
        reject()  # the extra bytes read as more of the body, and did not fit
    projected, chosen = _projected_decode(data, message, frame, whole)
    assert projected.body.get("_trailing") == whole.body.get("_trailing"), (
        kind,
        api_key,
        version,
        sorted(chosen),
    )
