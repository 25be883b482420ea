"""``tag_extras``: whether a decoded message holds unknown tags or tagged-section anomalies anywhere.

The KIP-482 check skips its walk of every struct when the decode says there is nothing to find, so the
flag must never say False where a ``_unknown_tags`` or ``_tag_anomalies`` key exists.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import codec
from codec.protocol import ApiKey
from tests.codec.strategies import ALL_MESSAGES, build_frame, decode_frame


def _holds_extras(node: Any) -> bool:
    """The oracle: a plain walk of the decoded header and body."""
    if isinstance(node, dict):
        if "_unknown_tags" in node or "_tag_anomalies" in node:
            return True
        return any(_holds_extras(v) for v in node.values())
    if isinstance(node, list):
        return any(_holds_extras(v) for v in node)
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


def test_nested_payloads_leave_it_unknown() -> None:
    inner = codec.encode_request(ApiKey.METADATA, 12, 7, "inner", {"Topics": None})
    frame = codec.encode_request(
        ApiKey.ENVELOPE,
        0,
        1,
        "broker",
        {"RequestData": inner, "RequestPrincipal": b"", "ClientHostAddress": b""},
    )
    assert codec.decode_request(frame).tag_extras is None


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
