"""Legacy message sets v0/v1: plain and compressed wrappers, CRC, stripping, adversarial input and a
differential check against kafka-python's legacy record code."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codec.compression import Codec
from codec.errors import DecodeError
from codec.message_set import LegacyMessage, build_message_set, parse_message_set
from codec.records import RecordBatches, strip_payloads

LEGACY_CODECS = [Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4]
MESSAGES = [(b"k0", b"v0", 1000), (None, b"v1", 1001), (b"k2", None, 1005)]


def legacy(raw: bytes) -> list[LegacyMessage]:
    out = []
    for entry in RecordBatches.from_bytes(raw):
        assert isinstance(entry, LegacyMessage)
        out.append(entry)
    return out


@pytest.mark.parametrize("magic", [0, 1])
def test_plain_messages(magic: int) -> None:
    raw = build_message_set(MESSAGES, magic=magic, base_offset=50)
    msgs = legacy(raw)
    assert [m.offset for m in msgs] == [50, 51, 52]
    assert [(m.key, m.value) for m in msgs] == [(k, v) for k, v, _ in MESSAGES]
    assert all(m.crc_valid() and m.magic == magic and m.record_count == 1 for m in msgs)
    if magic == 1:
        assert [m.timestamp for m in msgs] == [1000, 1001, 1005] and msgs[0].timestamp_type == 0
    else:
        assert msgs[0].timestamp is None and msgs[0].timestamp_type is None
    assert msgs[0].producer_id == -1 and not msgs[0].is_control and msgs[0].control_records() == []


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", LEGACY_CODECS[1:])
def test_compressed_wrapper(magic: int, codec: Codec) -> None:
    raw = build_message_set(MESSAGES, magic=magic, compression=codec, base_offset=200)
    (wrapper,) = legacy(raw)
    assert wrapper.compression == codec and wrapper.offset == 202 and wrapper.record_count is None
    inner = wrapper.messages()
    assert [m.offset for m in inner] == [200, 201, 202]
    recs = wrapper.records()
    assert [(r.offset, r.key, r.value) for r in recs] == [
        (200 + i, k, v) for i, (k, v, _) in enumerate(MESSAGES)
    ]
    if magic == 1:
        assert [r.timestamp for r in recs] == [1000, 1001, 1005]
        assert wrapper.timestamp == 1005


def test_v1_inner_offsets_are_relative_on_the_wire() -> None:
    (wrapper,) = legacy(build_message_set(MESSAGES, magic=1, compression=Codec.GZIP, base_offset=10))
    from codec.compression import decompress

    inner = parse_message_set(decompress(1, wrapper.value or b""))
    assert [m.offset for m in inner] == [0, 1, 2]


def test_log_append_time_wrapper_overrides_inner_timestamps() -> None:
    raw = build_message_set(MESSAGES, magic=1, compression=Codec.GZIP, timestamp_type=1)
    (wrapper,) = legacy(raw)
    assert wrapper.timestamp_type == 1
    assert {r.timestamp for r in wrapper.records()} == {1005}


def test_crc_corruption() -> None:
    raw = bytearray(build_message_set(MESSAGES[:1], magic=1))
    raw[-1] ^= 1
    (msg,) = legacy(bytes(raw))
    assert not msg.crc_valid()


def test_zstd_is_invalid_in_legacy_and_nested_compression_rejected() -> None:
    raw = bytearray(build_message_set(MESSAGES, magic=1, compression=Codec.GZIP))
    raw[17] = (raw[17] & ~0x07) | 4
    with pytest.raises(DecodeError):
        legacy(bytes(raw))[0].messages()
    inner = build_message_set(MESSAGES, magic=1, compression=Codec.GZIP)
    from codec.compression import compress
    from codec.message_set import encode_message

    nested = encode_message(0, 1, Codec.GZIP, 0, None, compress(Codec.GZIP, inner))
    with pytest.raises(DecodeError, match="nested"):
        legacy(nested)[0].messages()


def test_partial_tail_and_stripping() -> None:
    raw = build_message_set(MESSAGES, magic=1)
    parsed = RecordBatches.from_bytes(raw[:-3])
    assert len(parsed) == 2 and parsed.partial_tail
    stripped = strip_payloads(raw)
    msgs = legacy(stripped)
    assert len(stripped) == 3 * (12 + 14)
    assert [(m.offset, m.timestamp, m.payload_stripped) for m in msgs] == [
        (0, 1000, True),
        (1, 1001, True),
        (2, 1005, True),
    ]
    with pytest.raises(DecodeError, match="stripped"):
        msgs[0].key_value()
    v0 = strip_payloads(build_message_set(MESSAGES, magic=0))
    assert len(v0) == 3 * (12 + 6) and all(m.payload_stripped for m in legacy(v0))


def test_bad_sizes() -> None:
    raw = bytearray(build_message_set(MESSAGES[:1], magic=1))
    raw[8:12] = struct.pack(">i", 10)  # shorter than a v1 header
    with pytest.raises(DecodeError):
        RecordBatches.from_bytes(bytes(raw) + b"\x00" * 10)
    with pytest.raises(DecodeError):
        parse_message_set(b"\x00" * 11)


def _exercise(raw: bytes) -> None:
    try:
        parsed = RecordBatches.from_bytes(raw)
    except DecodeError:
        return
    for entry in parsed:
        entry.crc_valid()
        try:
            entry.records()
        except DecodeError:
            pass
    try:
        strip_payloads(raw)
    except DecodeError:
        pass


message_strategy = st.tuples(
    st.none() | st.binary(max_size=10), st.none() | st.binary(max_size=30), st.integers(0, 2**40)
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(message_strategy, min_size=1, max_size=4),
    st.sampled_from([0, 1]),
    st.sampled_from(LEGACY_CODECS),
    st.data(),
)
def test_mutations_raise_only_decode_error(
    messages: list[Any], magic: int, codec: Codec, data: st.DataObject
) -> None:
    good = build_message_set(messages, magic=magic, compression=codec)
    got = [(r.key, r.value) for m in legacy(good) for r in m.records()]
    assert got == [(k, v) for k, v, _ in messages]
    raw = bytearray(good)
    for _ in range(data.draw(st.integers(1, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    _exercise(bytes(raw))
    _exercise(bytes(raw[: data.draw(st.integers(0, len(raw)))]))


# --- differential: kafka-python ------------------------------------------------------------------

kp_legacy = pytest.importorskip("kafka.record.legacy_records")


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP])
def test_we_read_what_kafka_python_writes(magic: int, codec: Codec) -> None:
    builder = kp_legacy.LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    for i, (key, value, ts) in enumerate(MESSAGES):
        builder.append(i, timestamp=ts, key=key, value=value)
    raw = bytes(builder.build())
    recs = [r for m in legacy(raw) for r in m.records()]
    assert [(r.offset, r.key, r.value) for r in recs] == [(i, k, v) for i, (k, v, _) in enumerate(MESSAGES)]
    assert all(m.crc_valid() for m in legacy(raw))
    if magic == 1:
        assert [r.timestamp for r in recs] == [ts for *_, ts in MESSAGES]


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP])
def test_kafka_python_reads_what_we_write(magic: int, codec: Codec) -> None:
    raw = build_message_set(MESSAGES, magic=magic, compression=codec, base_offset=30)
    got = []
    p = 0
    while p < len(raw):
        (size,) = struct.unpack_from(">i", raw, p + 8)
        batch = kp_legacy.LegacyRecordBatch(raw[p : p + 12 + size], magic)
        assert batch.validate_crc()
        got += [(r.offset, r.key, r.value) for r in batch]
        p += 12 + size
    assert got == [(30 + i, k, v) for i, (k, v, _) in enumerate(MESSAGES)]


def test_magic0_lz4_with_the_old_clients_header_checksum() -> None:
    from codec.compression import compress, decompress, legacy_lz4_header

    raw = build_message_set(MESSAGES, magic=0, compression=Codec.LZ4)
    (wrapper,) = legacy(raw)
    with pytest.raises(DecodeError, match=r"(?i)checksum"):
        decompress(Codec.LZ4, wrapper.value or b"")
    assert [r.value for r in wrapper.records()] == [v for _, v, _ in MESSAGES]
    good = compress(Codec.LZ4, b"x" * 100)
    assert legacy_lz4_header(good) == good
    assert legacy_lz4_header(b"not lz4") == b"not lz4"
