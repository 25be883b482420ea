"""Record batches v2: headers, records on demand, control batches, CRC, partial tails, stripping,
property tests, and a differential check against kafka-python's record code."""

from __future__ import annotations

import pickle
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codec.compression import Codec
from codec.control import ABORT, COMMIT
from codec.errors import DecodeError
from codec.message_set import build_message_set
from codec.records import (
    HEADER_SIZE,
    STRIPPED_LENGTH,
    RecordBatch,
    RecordBatches,
    batch_headers,
    build_record_batch,
    section,
    strip_payloads,
)

RECORDS: list[tuple[Any, ...]] = [
    (b"k1", b"v1"),
    (None, b"value without key"),
    (b"k3", None, [("h", b"hv"), ("null", None)]),
    (b"", b"", [], 5),
]


def one(raw: bytes) -> RecordBatch:
    (batch,) = RecordBatches.from_bytes(raw).batches
    assert isinstance(batch, RecordBatch)
    return batch


@pytest.mark.parametrize("codec", list(Codec))
def test_round_trip_every_codec(codec: Codec) -> None:
    raw = build_record_batch(RECORDS, base_offset=100, base_timestamp=1_700_000_000_000, compression=codec)
    batch = one(raw)
    assert batch.compression == codec and batch.compression_name == codec.name.lower()
    assert batch.base_offset == 100 and batch.magic == 2 and batch.record_count == 4
    assert batch.last_offset_delta == 3 and batch.last_offset == 103
    assert batch.max_timestamp == 1_700_000_000_005
    assert batch.batch_length == len(raw) - 12
    assert batch.crc_valid()
    recs = batch.records()
    assert [(r.key, r.value) for r in recs] == [(s[0], s[1]) for s in RECORDS]
    assert recs[2].headers == [("h", b"hv"), ("null", None)]
    assert [r.offset for r in recs] == [100, 101, 102, 103]
    assert recs[3].timestamp == 1_700_000_000_005 and recs[3].timestamp_delta == 5


def test_idempotent_and_transactional_attributes() -> None:
    batch = one(
        build_record_batch(
            [(None, b"v")], producer_id=9, producer_epoch=3, base_sequence=41, transactional=True
        )
    )
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (9, 3, 41)
    assert batch.is_transactional and not batch.is_control and not batch.has_delete_horizon
    assert batch.attributes == 0x10
    plain = one(build_record_batch([(None, b"v")]))
    assert (plain.producer_id, plain.producer_epoch, plain.base_sequence) == (-1, -1, -1)
    assert not plain.is_transactional


def test_timestamp_type_and_delete_horizon() -> None:
    batch = one(build_record_batch([(None, b"v")], timestamp_type=1, delete_horizon=True, base_timestamp=77))
    assert batch.timestamp_type == 1 and batch.has_delete_horizon and batch.delete_horizon == 77
    assert one(build_record_batch([(None, b"v")], base_timestamp=5)).delete_horizon is None


@pytest.mark.parametrize("kind", [ABORT, COMMIT, 7])
def test_control_batches(kind: int) -> None:
    value = struct.pack(">hi", 0, 12) if kind in (ABORT, COMMIT) else b""
    raw = build_record_batch(
        [(struct.pack(">hh", 0, kind), value)],
        producer_id=5,
        producer_epoch=1,
        transactional=True,
        control=True,
        base_offset=40,
    )
    batch = one(raw)
    assert batch.is_control and batch.is_transactional
    (rec,) = batch.control_records()
    assert rec.type == kind and rec.offset == 40
    if kind in (ABORT, COMMIT):
        assert rec.type_name == ("ABORT" if kind == ABORT else "COMMIT")
        assert rec.marker is not None and rec.marker.coordinator_epoch == 12
    else:
        assert rec.marker is None and rec.type_name == "UNKNOWN(7)"


def test_control_records_of_data_batch_is_empty_and_bad_keys_raise() -> None:
    assert one(build_record_batch([(None, b"v")])).control_records() == []
    bad = one(build_record_batch([(b"\x00", b"")], control=True))
    with pytest.raises(DecodeError):
        bad.control_records()
    no_marker = one(build_record_batch([(struct.pack(">hh", 0, COMMIT), b"\x00")], control=True))
    with pytest.raises(DecodeError):
        no_marker.control_records()


def test_crc_detects_corruption() -> None:
    raw = bytearray(build_record_batch(RECORDS))
    assert one(bytes(raw)).crc_valid()
    raw[-1] ^= 0xFF
    assert not one(bytes(raw)).crc_valid()
    raw = bytearray(build_record_batch(RECORDS))
    raw[17] ^= 0x01  # the crc itself
    assert not one(bytes(raw)).crc_valid()


def test_many_batches_and_equality() -> None:
    raw = b"".join(build_record_batch([(None, b"%d" % i)], base_offset=i) for i in range(10))
    parsed = RecordBatches.from_bytes(raw)
    assert len(parsed) == 10 and [b.base_offset for b in parsed] == list(range(10))
    assert bytes(parsed) == raw and parsed == RecordBatches.from_bytes(raw) and parsed == raw
    assert parsed.partial_tail == b""
    empty = RecordBatches.from_bytes(b"")
    assert len(empty) == 0 and empty.partial_tail == b""


@pytest.mark.parametrize("cut", [1, 11, 12, 20, 61, 70])
def test_partial_tail_is_not_an_error(cut: int) -> None:
    first = build_record_batch([(None, b"a" * 50)])
    second = build_record_batch([(None, b"b" * 50)], base_offset=1)
    parsed = RecordBatches.from_bytes(first + second[:cut])
    assert len(parsed) == 1 and parsed.partial_tail == second[:cut]
    assert bytes(parsed) == first + second[:cut]


def test_structural_errors() -> None:
    raw = bytearray(build_record_batch([(None, b"v")]))
    bad_magic = bytearray(raw)
    bad_magic[16] = 3
    with pytest.raises(DecodeError, match="magic"):
        RecordBatches.from_bytes(bytes(bad_magic))
    negative = bytearray(raw)
    negative[8:12] = struct.pack(">i", -5)
    with pytest.raises(DecodeError, match="negative"):
        RecordBatches.from_bytes(bytes(negative))
    short = bytes(raw[:8]) + struct.pack(">i", 20) + bytes(raw[12:32])
    with pytest.raises(DecodeError, match="shorter than a v2 header"):
        RecordBatches.from_bytes(short)


def _header_fields(batches: RecordBatches) -> list[tuple[Any, ...]]:
    return [
        (b.base_offset, b.producer_id, b.producer_epoch, b.base_sequence, b.record_count, b.attributes, b.raw)
        for b in batches
        if isinstance(b, RecordBatch)
    ]


@pytest.mark.parametrize("cut", [0, 30, 70])
def test_section_points_into_the_frame_and_parses_on_first_read(cut: int) -> None:
    first = build_record_batch(RECORDS, producer_id=7, producer_epoch=1, base_sequence=3, transactional=True)
    second = build_record_batch([(None, b"b" * 50)], base_offset=4)
    field = first + second + second[:cut]
    frame = b"head" + field + b"tail"
    lazy = section(frame, 4, 4 + len(field))
    eager = RecordBatches(field, [one(first), one(second)], second[:cut])
    assert lazy._batches is None and lazy._raw is None  # nothing parsed or copied yet
    assert _header_fields(lazy) == _header_fields(eager)
    assert lazy.partial_tail == second[:cut] and lazy == eager and bytes(lazy) == field
    assert [b.raw for b in lazy] == [first, second]
    assert repr(lazy) == repr(eager)


def _produce_with(records: bytes | None) -> tuple[bytes, Any]:
    import codec

    body = {
        "TransactionalId": None,
        "Acks": -1,
        "TimeoutMs": 1000,
        "TopicData": [{"Name": "t", "PartitionData": [{"Index": 0, "Records": records}]}],
    }
    frame = codec.encode_request(0, 9, 1, "c", body)
    return frame, codec.decode_request(frame).body["TopicData"][0]["PartitionData"][0]["Records"]


_BATCH = build_record_batch(RECORDS, producer_id=5)


#: ``RecordBatches``' state (compiled, the class has no ``__slots__`` to list).
_SECTION_SLOTS = ("_batches", "_buf", "_end", "_raw", "_start", "_tail_at")


@pytest.mark.parametrize(
    "field",
    [
        _BATCH,  # one whole batch: built by the generated decoder itself
        strip_payloads(_BATCH),  # a stripped header: 61 bytes, the smallest one-batch section
        _BATCH + _BATCH,
        _BATCH + _BATCH[:30],
        _BATCH[:70],
        build_message_set([(None, b"legacy")], magic=1),
        b"",
    ],
    ids=["one", "stripped", "two", "cut-tail", "cut", "legacy", "empty"],
)
def test_generated_decoders_build_the_records_section_does(field: bytes) -> None:
    """The generated decoders build a one-batch section in their loop; it is the object section()
    builds, slot for slot, and every other section is still section()'s."""
    frame, decoded = _produce_with(field)
    start = frame.index(field) if field else len(frame) - 3
    made = section(frame, start, start + len(field))
    if made._batches is None:
        assert decoded._buf is frame
        assert {s: getattr(decoded, s) for s in _SECTION_SLOTS} == {
            s: getattr(made, s) for s in _SECTION_SLOTS
        }
    assert decoded == made and bytes(decoded) == field
    assert [b.raw for b in decoded] == [b.raw for b in made]


def test_section_raw_before_batches_rebases_on_its_own_bytes() -> None:
    batch = build_record_batch(RECORDS, producer_id=9)
    frame = b"xx" + batch + batch[:20] + b"yy"
    lazy = section(frame, 2, 2 + len(batch) + 20)
    assert lazy.raw == batch + batch[:20]
    assert lazy.partial_tail == batch[:20]
    assert [b.producer_id for b in lazy] == [9]
    assert lazy.batches[0].raw == batch


def test_a_whole_frame_section_is_not_copied() -> None:
    batch = build_record_batch(RECORDS)
    lazy = section(batch, 0, len(batch))
    assert lazy.raw is batch and lazy.batches[0].raw is batch


def test_section_errors_are_raised_when_built() -> None:
    """Malformed lengths and magic bytes fail the decode of the field, as the eager parse did."""
    raw = bytearray(build_record_batch([(None, b"v")]))
    raw[16] = 3
    with pytest.raises(DecodeError, match="magic"):
        section(b"ab" + bytes(raw), 2, 2 + len(raw))
    legacy = build_message_set([(None, b"v")], magic=1)
    parsed = section(b"ab" + legacy, 2, 2 + len(legacy))
    assert parsed._batches is not None and len(parsed) == 1 and parsed.raw == legacy


def test_batch_headers_of_a_section_copy_no_data_batch() -> None:
    data = build_record_batch(RECORDS, producer_id=4, base_sequence=2)
    marker = build_record_batch(
        [(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x05")], control=True, base_offset=4
    )
    field = data + marker + data
    frame = b"pre" + field
    lazy = section(frame, 3, len(frame))
    headers = batch_headers(lazy)
    assert headers == batch_headers(RecordBatches.from_bytes(field))
    first, third = lazy.batches[0], lazy.batches[2]
    assert isinstance(first, RecordBatch) and isinstance(third, RecordBatch)
    assert first._raw is None and third._raw is None  # data batches not copied
    back = RecordBatches.from_bytes(headers)
    assert [b.payload_stripped for b in back] == [True, False, True]
    assert [(b.producer_id, b.base_sequence) for b in back] == [(4, 2), (-1, -1), (4, 2)]
    assert back.batches[1].raw == marker


def test_pickle_keeps_the_section_not_the_frame() -> None:
    batch = build_record_batch(RECORDS, producer_id=5)
    frame = b"z" * 10_000 + batch
    lazy = section(frame, 10_000, len(frame))
    assert len(pickle.dumps(lazy)) < len(batch) + 200
    again = pickle.loads(pickle.dumps(lazy))
    assert again == lazy and again.batches[0].producer_id == 5
    single = pickle.loads(pickle.dumps(section(frame, 10_000, len(frame)).batches[0]))
    assert single.raw == batch and single.producer_id == 5


def test_record_count_lies() -> None:
    raw = bytearray(build_record_batch(RECORDS))
    raw[57:61] = struct.pack(">i", 3)  # fewer than there are: bytes left over
    with pytest.raises(DecodeError, match="left after"):
        one(bytes(raw)).records()
    raw[57:61] = struct.pack(">i", 2_000_000_000)
    with pytest.raises(DecodeError, match="does not fit"):
        one(bytes(raw)).records()


def test_strip_payloads() -> None:
    batches = [
        build_record_batch(
            RECORDS, producer_id=3, producer_epoch=2, base_sequence=10, compression=Codec.ZSTD
        ),
        build_record_batch(
            [(b"k", b"v" * 1000)], base_offset=4, producer_id=3, producer_epoch=2, base_sequence=14
        ),
    ]
    stripped = strip_payloads(b"".join(batches))
    assert len(stripped) == 2 * HEADER_SIZE
    parsed = RecordBatches.from_bytes(stripped)
    for orig, got in zip(batches, parsed, strict=True):
        assert isinstance(got, RecordBatch)
        full = one(orig)
        assert got.batch_length == STRIPPED_LENGTH and got.payload_stripped and not full.payload_stripped
        for name in (
            "base_offset",
            "producer_id",
            "producer_epoch",
            "base_sequence",
            "record_count",
            "attributes",
        ):
            assert getattr(got, name) == getattr(full, name)
        with pytest.raises(DecodeError, match="stripped by capture policy"):
            got.records()
    assert strip_payloads(stripped) == stripped


def test_strip_payloads_partial_tail_and_legacy() -> None:
    v2 = build_record_batch([(None, b"x" * 100)])
    legacy = build_message_set([(b"k", b"v")], magic=1)
    out = strip_payloads(legacy + v2[:80])
    parsed = RecordBatches.from_bytes(out)
    assert len(parsed) == 2 and parsed.batches[0].payload_stripped and parsed.batches[1].payload_stripped
    assert strip_payloads(v2[:30]) == b""  # a tail with no complete header holds nothing worth keeping


def test_empty_batch_is_not_stripped() -> None:
    batch = one(build_record_batch([]))
    assert batch.batch_length == STRIPPED_LENGTH and not batch.payload_stripped and batch.records() == []


def test_build_helper_and_mixed_magic() -> None:
    built = RecordBatches.build([(None, b"v")], producer_id=1, producer_epoch=0, base_sequence=0)
    assert built.batches[0].producer_id == 1
    mixed = RecordBatches.from_bytes(build_message_set([(None, b"old")], magic=0) + bytes(built))
    assert [b.magic for b in mixed] == [0, 2]


# --- properties ---------------------------------------------------------------------------------

record_strategy = st.tuples(
    st.none() | st.binary(max_size=20),
    st.none() | st.binary(max_size=40),
    st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=3),
    st.integers(0, 10_000),
)
batch_kwargs = st.fixed_dictionaries(
    {
        "producer_id": st.integers(-1, 2**63 - 1),
        "producer_epoch": st.integers(-1, 2**15 - 1),
        "base_sequence": st.integers(-1, 2**31 - 1),
        "transactional": st.booleans(),
        "compression": st.sampled_from(list(Codec)),
        "base_offset": st.integers(0, 2**62),
        "base_timestamp": st.integers(-1, 2**50),
        "partition_leader_epoch": st.integers(-1, 2**31 - 1),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(record_strategy, max_size=8), batch_kwargs)
def test_build_then_parse_gives_same_fields(records: list[Any], kwargs: dict[str, Any]) -> None:
    batch = one(build_record_batch(records, **kwargs))
    for name in ("producer_id", "producer_epoch", "base_sequence", "compression", "base_offset"):
        assert getattr(batch, name) == kwargs[name]
    assert batch.is_transactional == kwargs["transactional"] and batch.record_count == len(records)
    assert batch.crc_valid()
    got = batch.records()
    assert [(r.key, r.value, r.headers, r.timestamp_delta) for r in got] == [
        (k, v, h, d) for k, v, h, d in records
    ]
    assert [r.offset for r in got] == [kwargs["base_offset"] + i for i in range(len(records))]


def _exercise(raw: bytes) -> None:
    """Everything a caller may do with a records value; only DecodeError may escape."""
    try:
        parsed = RecordBatches.from_bytes(raw)
    except DecodeError:
        return
    for batch in parsed:
        batch.crc_valid()
        for call in (batch.records, batch.control_records):
            try:
                call()
            except DecodeError:
                pass
    try:
        strip_payloads(raw)
    except DecodeError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(record_strategy, min_size=1, max_size=4), batch_kwargs, st.booleans(), st.data())
def test_mutations_raise_only_decode_error(
    records: list[Any], kwargs: dict[str, Any], control: bool, data: st.DataObject
) -> None:
    raw = bytearray(build_record_batch(records, control=control, **kwargs))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    _exercise(bytes(raw))
    _exercise(bytes(raw[:cut]))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_raises_only_decode_error(raw: bytes) -> None:
    _exercise(raw)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=120))
def test_garbage_behind_a_valid_header_raises_only_decode_error(tail: bytes) -> None:
    header = bytearray(build_record_batch([])[:HEADER_SIZE])
    header[8:12] = struct.pack(">i", STRIPPED_LENGTH + len(tail))
    header[57:61] = struct.pack(">i", 3)
    for codec in range(8):
        header[22] = codec
        _exercise(bytes(header) + tail)


# --- differential: kafka-python ------------------------------------------------------------------

kafka_record = pytest.importorskip("kafka.record.default_records")


def _kp_build(
    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]], codec: int
) -> bytes:
    builder = kafka_record.DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=True,
        producer_id=123,
        producer_epoch=4,
        base_sequence=55,
        batch_size=1 << 20,
    )
    for i, (ts, key, value, headers) in enumerate(records):
        builder.append(i, timestamp=ts, key=key, value=value, headers=headers)
    return bytes(builder.build())


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP])
def test_we_read_what_kafka_python_writes(codec: Codec) -> None:
    records = [
        (1_700_000_000_000, b"k", b"v", [("trace", b"abc")]),
        (1_700_000_000_010, None, b"x" * 300, []),
        (1_700_000_000_003, b"key", None, [("a", b""), ("b", b"2")]),
    ]
    raw = _kp_build(records, codec)
    batch = one(raw)
    kp = kafka_record.DefaultRecordBatch(raw)
    assert batch.crc_valid() and kp.validate_crc()
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (123, 4, 55)
    assert batch.is_transactional and batch.compression == codec and batch.record_count == 3
    assert batch.base_timestamp == kp.first_timestamp and batch.max_timestamp == kp.max_timestamp
    got = [(r.timestamp, r.key, r.value, r.headers, r.offset) for r in batch.records()]
    assert got == [(ts, k, v, h, i) for i, (ts, k, v, h) in enumerate(records)]


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP])
def test_kafka_python_reads_what_we_write(codec: Codec) -> None:
    raw = build_record_batch(
        RECORDS,
        producer_id=77,
        producer_epoch=2,
        base_sequence=9,
        transactional=True,
        compression=codec,
        base_offset=1000,
        base_timestamp=1_600_000_000_000,
    )
    kp = kafka_record.DefaultRecordBatch(raw)
    assert kp.validate_crc()
    assert (kp.producer_id, kp.producer_epoch, kp.base_sequence, kp.is_transactional) == (77, 2, 9, True)
    assert kp.compression_type == codec and kp.base_offset == 1000
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in kp]
    want = [
        (
            1000 + i,
            1_600_000_000_000 + (s[3] if len(s) > 3 else 0),
            s[0],
            s[1],
            list(s[2]) if len(s) > 2 else [],
        )
        for i, s in enumerate(RECORDS)
    ]
    assert got == want


@settings(max_examples=60, deadline=None)
@given(st.lists(record_strategy, max_size=5), batch_kwargs.filter(lambda k: k["compression"] in (0, 1)))
def test_kafka_python_reads_random_batches(records: list[Any], kwargs: dict[str, Any]) -> None:
    raw = build_record_batch(records, **kwargs)
    kp = kafka_record.DefaultRecordBatch(raw)
    assert kp.validate_crc()
    got = [(r.key, r.value, list(r.headers)) for r in kp]
    assert got == [(k, v, list(h)) for k, v, h, _ in records]


# --- golden bytes from the Java client ----------------------------------------------------------

#: Written by kafka-clients 4.4.0 (MemoryRecords.withTransactionalRecords: offset 3, pid 5000, epoch 2,
#: sequence 17, leader epoch 9; records (ts 1700000000000, "k1", "value-one", header h=hv) and
#: (ts +7, null, "value-two-value-two-value-two")), with snappy-java 1.1.10.7, lz4-java and zstd-jni.
JAVA_BATCHES = {
    Codec.NONE: "00000000000000030000006c00000009026c9f6fdc0010000000010000018bcfe568000000018bcfe568070000"
    "000000001388000200000011000000022c000000046b311276616c75652d6f6e6502026804687646000e02013a76616c"
    "75652d74776f2d76616c75652d74776f2d76616c75652d74776f00",
    Codec.GZIP: "00000000000000030000006b0000000902b5d275a10011000000010000018bcfe568000000018bcfe568070000"
    "000000001388000200000011000000021f8b08000000000000ffd361606060c936142a4bcc294dd5cdcf4b6562ca60c928"
    "7363e06362b482089694e7eb626131000066758e153b000000",
    Codec.SNAPPY: "000000000000000300000070000000090213b6a3940012000000010000018bcfe568000000018bcfe5680700"
    "000000000013880002000000110000000282534e415050590000000001000000010000002b3b702c000000046b311276"
    "616c75652d6f6e6502026804687646000e02013a09150c74776f2d4a0a000000",
    Codec.LZ4: "00000000000000030000006e0000000902c19d84150013000000010000018bcfe568000000018bcfe5680700000"
    "0000000138800020000001100000002" + "04224d186040822e000000f20e2c000000046b311276616c75652d6f6e6502"
    "026804687646000e02013a15004b74776f2d0a00502d74776f0000000000",
    Codec.ZSTD: "000000000000000300000069000000090252fd697d0014000000010000018bcfe568000000018bcfe568070000"
    "00000000138800020000001100000002" + "28b52ffd005864010024022c000000046b311276616c75652d6f6e650202"
    "6804687646000e02013a74776f2d0002002d8984c37402010000",
}
#: MemoryRecords.withEndTransactionMarker(offset 42, ts 1700000000100, leader epoch 9, pid 5000,
#: epoch 2, COMMIT, coordinator epoch 11).
JAVA_COMMIT = (
    "000000000000002a000000420000000902b693efb00030000000000000018bcfe568640000018bcfe5686400000000000013"
    "880002ffffffff000000012000000008000000010c00000000000b00"
)
JAVA_RECORDS = [
    (3, 1_700_000_000_000, b"k1", b"value-one", [("h", b"hv")]),
    (4, 1_700_000_000_007, None, b"value-two-value-two-value-two", []),
]


@pytest.mark.parametrize("codec", list(Codec))
def test_java_client_batches(codec: Codec) -> None:
    batch = one(bytes.fromhex(JAVA_BATCHES[codec]))
    assert batch.crc_valid() and batch.compression == codec
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (5000, 2, 17)
    assert batch.partition_leader_epoch == 9 and batch.is_transactional and not batch.is_control
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch.records()] == JAVA_RECORDS


def test_our_uncompressed_batch_is_byte_identical_to_the_java_clients() -> None:
    ours = build_record_batch(
        [(b"k1", b"value-one", [("h", b"hv")], 0), (None, b"value-two-value-two-value-two", [], 7)],
        producer_id=5000,
        producer_epoch=2,
        base_sequence=17,
        transactional=True,
        base_offset=3,
        partition_leader_epoch=9,
        base_timestamp=1_700_000_000_000,
    )
    assert ours.hex() == JAVA_BATCHES[Codec.NONE]


def test_java_commit_marker() -> None:
    batch = one(bytes.fromhex(JAVA_COMMIT))
    assert batch.is_control and batch.is_transactional and batch.crc_valid()
    (marker,) = batch.control_records()
    assert (marker.type, marker.type_name, marker.offset) == (COMMIT, "COMMIT", 42)
    assert marker.marker is not None and marker.marker.coordinator_epoch == 11


@pytest.mark.parametrize("codec", [Codec.SNAPPY, Codec.LZ4, Codec.ZSTD])
def test_java_framing_matches_ours(codec: Codec) -> None:
    """Our compressor's framing choices are the ones the Java client makes (xerial, independent lz4)."""
    from codec.compression import compress

    java = one(bytes.fromhex(JAVA_BATCHES[codec])).raw[HEADER_SIZE:]
    ours = compress(codec, b"x" * 100)
    if codec == Codec.SNAPPY:
        assert java[:16] == ours[:16]
    elif codec == Codec.LZ4:
        assert java[:4] == ours[:4] and java[4] & 0x20 and ours[4] & 0x20
    else:
        assert java[:4] == ours[:4]
