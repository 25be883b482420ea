"""Packed facts: a decoded message survives ``pack_message``/``unpack_message`` exactly, minus the
records of data batches, for every API and version, the golden frames of real clients and the tap
corpus; garbage is a typed error."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

import codec
from codec.facts import FactsError, pack_message, unpack_message
from codec.nested import Embedded, EmbeddedRequest, EmbeddedResponse, VersionedData
from codec.records import RecordBatch, RecordBatches, batch_headers
from tests.codec.strategies import ALL_MESSAGES, build_frame, decode_frame, messages, seeds

DATA = Path(__file__).resolve().parents[1] / "data"


def facts_view(value: Any) -> Any:
    """What the facts must preserve, as plain data: record sets as their batch headers."""
    if isinstance(value, dict):
        return {k: facts_view(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [facts_view(v) for v in value]
    if isinstance(value, RecordBatches):
        return ("records", batch_headers(value))
    if isinstance(value, VersionedData):
        return (value.kind, value.raw, str(value.error), value.version, facts_view(value.value))
    if isinstance(value, EmbeddedRequest):
        return (value.kind, value.raw, str(value.error), message_view(value.request))
    if isinstance(value, EmbeddedResponse):
        return (value.kind, value.raw, str(value.error), message_view(value.response))
    if isinstance(value, Embedded):
        raise AssertionError(f"unexpected nested payload {type(value).__name__}")
    return value


def message_view(message: codec.Request | codec.Response | None) -> Any:
    if message is None:
        return None
    # tag_extras is the decode's own hint for the KIP-482 check, not a fact: a restored message says None.
    fields = {f.name: getattr(message, f.name) for f in dataclasses.fields(message) if f.name != "tag_extras"}
    return (type(message).__name__, facts_view(fields))


def assert_round_trips(message: codec.Request | codec.Response) -> bytes:
    packed = pack_message(message)
    again = unpack_message(packed)
    assert message_view(again) == message_view(message)
    assert again.tag_extras is None
    assert pack_message(again) == packed
    return packed


@pytest.mark.parametrize(("kind", "api_key", "version"), ALL_MESSAGES, ids=lambda v: str(v))
def test_every_api_version_round_trips(kind: str, api_key: int, version: int) -> None:
    for seed in range(3):
        frame = build_frame(kind, api_key, version, seed * 1_000_003 + api_key * 101 + version)
        assert_round_trips(decode_frame(kind, frame, api_key, version))


@settings(max_examples=300, deadline=None)
@given(message=messages, seed=seeds)
def test_round_trip_property(message: tuple[str, int, int], seed: int) -> None:
    kind, api_key, version = message
    assert_round_trips(decode_frame(kind, build_frame(kind, api_key, version, seed), api_key, version))


def _corpus() -> list[tuple[str, dict[str, Any]]]:
    out = [("tap_frames", json.loads(line)) for line in (DATA / "tap_frames.jsonl").read_text().splitlines()]
    for path in sorted((DATA / "golden").glob("*.jsonl")):
        out += [(path.stem, json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    return out


def test_real_client_frames_round_trip() -> None:
    checked = 0
    for _source, record in _corpus():
        raw = bytes.fromhex(record["hex"])
        is_request = record.get("dir", record.get("direction")) in ("req", "request")
        try:
            if is_request:
                message: codec.Request | codec.Response = codec.decode_request(raw)
            else:
                message = codec.decode_response(raw, record["api_key"], record["api_version"])
        except codec.DecodeError:
            continue
        assert_round_trips(message)
        checked += 1
    assert checked > 50


def test_data_batches_lose_their_records_and_keep_their_headers() -> None:
    batch = codec.records.build_record_batch(
        [(b"k", b"v" * 4000)] * 5, producer_id=7, producer_epoch=2, base_sequence=10
    )
    body = {
        "TransactionalId": "tx",
        "Acks": -1,
        "TimeoutMs": 1000,
        "TopicData": [{"Name": "t", "PartitionData": [{"Index": 0, "Records": batch}]}],
    }
    raw = codec.encode_request(0, 9, 1, "c", body)
    request = codec.decode_request(raw)
    packed = assert_round_trips(request)
    assert len(packed) < len(raw) // 10
    (restored,) = unpack_message(packed).body["TopicData"][0]["PartitionData"][0]["Records"].batches
    assert isinstance(restored, RecordBatch)
    assert (restored.producer_id, restored.producer_epoch, restored.base_sequence, restored.record_count) == (
        7,
        2,
        10,
        5,
    )
    assert restored.payload_stripped


def test_control_batches_keep_their_markers() -> None:
    import struct

    from codec.control import COMMIT
    from codec.records import build_record_batch

    marker = build_record_batch(
        [(struct.pack(">hh", 0, COMMIT), struct.pack(">hi", 0, 4))],
        producer_id=9,
        producer_epoch=1,
        transactional=True,
        control=True,
    )
    records = RecordBatches.from_bytes(marker)
    response = codec.Response(1, 4, 1, {"CorrelationId": 1}, {"Records": records}, 0)
    again = unpack_message(pack_message(response)).body["Records"]
    markers = [m for b in again.batches for m in b.control_records()]
    assert markers == [m for b in records.batches for m in b.control_records()]
    assert [m.type for m in markers] == [COMMIT]


def test_uuids_and_unknown_tags_round_trip() -> None:
    topic_id = uuid.uuid4()
    message = codec.Response(
        3, 12, 5, {"CorrelationId": 5}, {"Topics": [{"TopicId": topic_id}], "_unknown_tags": {99: b"x"}}, 1
    )
    again = unpack_message(pack_message(message))
    assert again.body == message.body


@pytest.mark.parametrize("data", [b"", b"\x01\x02", b"\x93\x01\x02\x03", json.dumps([9] * 8).encode()])
def test_garbage_is_a_facts_error(data: bytes) -> None:
    with pytest.raises(FactsError):
        unpack_message(data)


def test_the_reused_packer_packs_as_packb_does_in_every_thread() -> None:
    """``facts.packb`` keeps one packer per thread: byte for byte what ``msgpack.packb`` makes, and a
    call that fails (a value facts cannot pack) leaves nothing behind for the next one."""
    import threading

    import msgpack

    from codec import facts

    messages = [
        decode_frame(kind, build_frame(kind, key, version, 7), key, version)
        for kind, key, version in ALL_MESSAGES[::7]
    ]
    expected = [
        msgpack.packb(facts._message_list(m), use_bin_type=True, default=facts._default) for m in messages
    ]
    assert [pack_message(m) for m in messages] == expected
    with pytest.raises(TypeError):
        facts.packb([1, object()])
    assert facts.packb([1, "a", b"b", None]) == msgpack.packb([1, "a", b"b", None], use_bin_type=True)
    results: list[list[bytes]] = []
    threads = [
        threading.Thread(target=lambda: results.append([pack_message(m) for m in messages])) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 4
