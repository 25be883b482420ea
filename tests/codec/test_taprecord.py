"""codec.taprecord: the tap record contract, its parse, its dict layouts, and that nobody else spells it."""

from __future__ import annotations

import ast
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import codec
from codec import taprecord
from codec.protocol import ApiKey
from codec.taprecord import (
    HEADERS,
    ROW_KEYS,
    STATE_KEYS,
    Header,
    TapFrame,
    decode_frame,
    frame_from_dict,
    frame_from_row,
    frame_to_dict,
    frames_from_record,
    header_only,
    headers_dict,
)
from tests.codec.strategies import ALL_MESSAGES, build_frame, messages, seeds

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("codec", "checks", "tap", "streaming", "kpconfig", "kpmon", "airflow_dags", "deploy")

#: The wire names of schema 1 (docs/tap.md). Changing one changes the tap topic format.
WIRE_NAMES = (
    "dir",
    "seq",
    "ts_ns",
    "api_key",
    "api_version",
    "corr_id",
    "redacted",
    "conn",
    "client",
    "broker",
    "broker_id",
    "listener",
    "tap",
    "capture",
    "schema",
    "truncated",
    "orig_size",
    "redaction_failed",
    "capture_fallback",
    "header_error",
    "error",
)


def _request_bytes(corr: int = 7) -> bytes:
    body = {"ClientSoftwareName": "kpmon-test", "ClientSoftwareVersion": "1.0"}
    return codec.encode_request(ApiKey.API_VERSIONS, 3, corr, "app", body)


def _headers(direction: str, **extra: str) -> dict[str, str]:
    return {
        Header.DIR: direction,
        Header.SEQ: "3",
        Header.TS_NS: "1700000000000000000",
        Header.API_KEY: str(int(ApiKey.API_VERSIONS)),
        Header.API_VERSION: "3",
        Header.CORR_ID: "7",
        Header.REDACTED: "",
        Header.CONN: "tap1-4",
        Header.CLIENT: "10.0.0.5:51000",
        Header.BROKER: "127.0.0.1:9092",
        Header.BROKER_ID: "1",
        Header.LISTENER: "PLAINTEXT",
        Header.TAP: "tap1",
        Header.CAPTURE: "full",
        Header.SCHEMA: taprecord.SCHEMA_VERSION,
        **extra,
    }


def test_the_wire_names_do_not_change() -> None:
    assert HEADERS == WIRE_NAMES
    assert taprecord.DIRECTIONS == ("req", "resp", "open", "close", "blind", "tap_start", "worker_lost")


def test_headers_to_frame_to_dict_to_frame() -> None:
    raw = _request_bytes()
    frame = frames_from_record(_headers("req"), raw, partition=2, offset=41)[0]
    assert frame.error is None and frame.request is not None
    assert (frame.conn, frame.seq, frame.ts_ns, frame.direction) == ("tap1-4", 3, 1700000000000000000, "req")
    assert (frame.api_key, frame.api_version, frame.correlation_id) == (ApiKey.API_VERSIONS, 3, 7)
    assert (frame.partition, frame.offset, frame.broker_id, frame.listener) == (2, 41, 1, "PLAINTEXT")

    data = json.loads(json.dumps(frame_to_dict(frame)))
    assert {"direction", "correlation_id", "partition", "offset", "raw"} <= set(data)
    assert not {Header.DIR, Header.CORR_ID, taprecord.LOST} & set(data)
    again = frame_from_dict(data)
    assert again.request is not None and again.request.body == frame.request.body
    assert _meta(again) == _meta(frame) and again.lost == 0
    frame.lost = 2
    assert frame_from_dict(json.loads(json.dumps(frame_to_dict(frame)))).lost == 2


def _meta(frame: TapFrame) -> dict[str, object]:
    return {name: getattr(frame, name) for name in taprecord.FIELDS}


def test_a_response_reads_its_api_from_the_headers() -> None:
    request = codec.decode_request(_request_bytes())
    body = {"ErrorCode": 0, "ApiKeys": [], "ThrottleTimeMs": 0}
    raw = codec.encode_response(request.api_key, request.api_version, request.correlation_id, body)
    frame = frames_from_record(_headers("resp"), raw)[0]
    assert frame.error is None and frame.response is not None
    missing = _headers("resp")
    del missing[Header.API_KEY]
    assert frames_from_record(missing, raw)[0].error is not None


def test_saved_state_keeps_the_format_1_keys_and_both_vocabularies_read() -> None:
    frame = frames_from_record(_headers("req"), _request_bytes(), 0, 5)[0]
    saved = frame_to_dict(frame, keys=STATE_KEYS)
    # Exactly the keys of the format-1 JSON state (no longer written; its layout stays readable).
    assert set(saved) == {
        "conn",
        "seq",
        "ts_ns",
        "dir",
        "api_key",
        "api_version",
        "corr_id",
        "client",
        "broker",
        "broker_id",
        "listener",
        "partition",
        "offset",
        "capture",
        "raw",
    }
    assert _meta(frame_from_dict(saved)) == _meta(frame)
    assert _meta(frame_from_dict(frame_to_dict(frame))) == _meta(frame)


def test_packed_frames_carry_facts_not_bytes() -> None:
    from codec.taprecord import FIELDS, frame_from_packed, frame_to_packed

    frame = frames_from_record(_headers("req"), _request_bytes(), 0, 5)[0]
    packed = frame_to_packed(frame)
    raw, facts, error, lost, lone, index, loss_ns = packed[len(FIELDS) :]
    assert raw is None and error is None and isinstance(facts, bytes) and lost == 0 and lone is False
    assert index == 0 and loss_ns == 0
    again = frame_from_packed(packed, decode=False)
    assert _meta(again) == _meta(frame) and again.message == frame.message and again.raw is None


@pytest.mark.parametrize("decoded", [True, False], ids=["facts", "error"])
def test_packed_frames_keep_lost_and_lone_after_their_tail(decoded: bool) -> None:
    """``lost`` and ``lone`` follow ``raw, packed, error`` at the packed list's end: a frame packed
    before them (that tail and nothing more) reads as 0 and not lone, one packed with them reads them."""
    from codec.taprecord import FIELDS, frame_from_packed, frame_to_packed

    value = _request_bytes() if decoded else _request_bytes()[:7]
    frame = frames_from_record(_headers("req"), value, 0, 5)[0]
    frame.lost, frame.lone, frame.index, frame.loss_ns = 4, True, 2, 7
    packed = frame_to_packed(frame)
    assert len(packed) == len(FIELDS) + 7 and packed[-4:] == [4, True, 2, 7]
    again = frame_from_packed(packed, decode=False)
    assert (again.lost, again.lone, again.index, again.loss_ns) == (4, True, 2, 7)
    older = frame_from_packed(packed[:-4], decode=False)
    assert (older.lost, older.lone, older.index, older.loss_ns) == (0, False, 0, 0)


def test_packed_frames_keep_every_field_where_it_was() -> None:
    """``frame_from_packed`` and ``frame_from_row`` build frames positionally, in ``TapFrame``'s field
    order: a reordered dataclass must fail here, not swap two fields silently."""
    from dataclasses import fields

    from codec.taprecord import FIELDS, frame_from_packed, frame_to_packed

    assert [f.name for f in fields(TapFrame)] == [
        *FIELDS[:-1], "message", "error", FIELDS[-1], "raw", taprecord.LOST, taprecord.LONE, taprecord.INDEX,
        taprecord.LOSS_NS,
    ]  # fmt: skip
    frame = TapFrame(
        "c-9", 1, 2, "close", 3, 4, 5, "client:1", "broker:2", 6, "lst", 7, 8, capture="meta", lost=9,
        lone=True, index=10, loss_ns=11,
    )  # fmt: skip
    assert frame_from_packed(frame_to_packed(frame)) == frame
    assert frame.with_message(None) == frame
    row = {
        "conn": "c-9", "seq": 1, "ts_ns": 2, "dir": "close", "api_key": 3, "api_version": 4, "corr_id": 5,
        "client": "client:1", "broker": "broker:2", "broker_id": 6, "listener": "lst",
        "tap_partition": 7, "tap_offset": 8, "capture": "meta", "lost": 9, "lone": True, "tap_index": 10,
        "loss_ns": 11,
    }  # fmt: skip
    assert frame_from_row(row) == frame


_small = st.integers(-(2**40), 2**40)


@given(
    own=st.lists(
        st.tuples(
            _small, _small, st.sampled_from(["req", "resp", "open"]), _small, _small, _small, _small, _small
        ),
        min_size=1,
        max_size=5,
    ),
    extras=st.lists(st.integers(0, 2**40), min_size=2, max_size=2),
    message=st.booleans(),
)
def test_a_run_reads_back_every_field_of_every_frame(
    own: list[tuple[int, int, str, int, int, int, int, int]], extras: list[int], message: bool
) -> None:
    """``pack_run`` keeps the fields a connection's frames share once and each frame's own beside its
    extras; ``run_of`` puts them back in ``FIELDS`` order: every field of every frame where it was."""
    from codec import facts
    from codec.taprecord import frame_to_packed, pack_run, run_of

    decoded = frames_from_record(_headers("req"), _request_bytes(), 0, 5)[0]
    broken = frames_from_record(_headers("req"), _request_bytes()[:7], 0, 5)[0]
    frames = [
        TapFrame(
            conn="c-9",
            client="client:1",
            broker="broker:2",
            broker_id=6,
            listener="lst",
            seq=seq,
            ts_ns=ts_ns,
            direction=direction,
            api_key=api,
            api_version=version,
            correlation_id=corr,
            partition=part,
            offset=offset,
            message=decoded.message if message else None,
            error=None if message else broken.error,
            capture="meta",
            raw=None if message else broken.raw,
            lost=i,
        )
        for i, (seq, ts_ns, direction, api, version, corr, part, offset) in enumerate(own)
    ]
    run = pack_run(frames, [extras] * len(frames))
    assert run is not None
    read = run_of(facts.unpack_values(run))
    assert read is not None
    again, read_extras = read
    assert [frame_to_packed(f) for f in again] == [frame_to_packed(f) for f in frames]
    assert read_extras == [extras] * len(frames)


def _decoded(direction: str, api_key: int | None, version: int | None, data: bytes) -> TapFrame:
    frame = decode_frame(TapFrame("c-1", 3, 5, direction, api_key, version, None, "client:1"), data)
    assert frame.message is not None and frame.error is None
    return frame


def _run_of_one(frame: TapFrame) -> tuple[TapFrame, bool]:
    """``frame`` packed alone as a run and read back, and whether the run carried it as its bytes."""
    from codec import facts
    from codec.taprecord import pack_run, run_of

    values = facts.unpack_values(pack_run([frame], [[0, 0]]) or b"")
    read = run_of(values)
    assert read is not None
    # The packed row's message slot (``_held``: bytes, message, error, lost, lone, index, loss_ns).
    return read[0][0], values[2][0][-6] is None


@settings(max_examples=300, deadline=None)
@given(message=messages, seed=seeds)
def test_a_run_carries_a_frame_as_its_bytes_where_they_decode_to_its_message(
    message: tuple[str, int, int], seed: int
) -> None:
    """A summary's originals travel as their frames' bytes where those are few and decode to the
    message on their own (``RUN_BYTES_LIMIT``; not a response whose nested payloads needed its
    request), and as their facts otherwise: either way the run reads back the frame it packed, its
    message's facts included, for every API and version."""
    from codec.taprecord import RUN_BYTES_LIMIT, frame_to_packed

    kind, api_key, version = message
    data = build_frame(kind, api_key, version, seed)
    frame = _decoded("req" if kind == "request" else "resp", api_key, version, data)
    read, as_bytes = _run_of_one(frame)
    assert frame_to_packed(read) == frame_to_packed(frame)
    assert frame.message is not None
    assert as_bytes == (len(data) <= RUN_BYTES_LIMIT and frame.message.tag_extras is not None)


def test_runs_carry_both_forms() -> None:
    """The property above is not vacuous: across the catalogue, frames go both as bytes and as facts."""
    forms = set()
    for kind, api_key, version in ALL_MESSAGES:
        data = build_frame(kind, api_key, version, api_key * 1_000 + version)
        forms.add(_run_of_one(_decoded("req" if kind == "request" else "resp", api_key, version, data))[1])
    assert forms == {True, False}


def test_a_frame_of_many_bytes_goes_as_its_facts() -> None:
    """A Produce carrying more than ``RUN_BYTES_LIMIT`` bytes of records (a ``full`` capture) goes as
    its facts, which leave the record payloads out."""
    from codec.records import build_record_batch
    from codec.taprecord import RUN_BYTES_LIMIT, frame_to_packed, pack_run

    batch = build_record_batch([(None, b"x" * RUN_BYTES_LIMIT)], producer_id=5, producer_epoch=1)
    body = {
        "TransactionalId": None,
        "Acks": -1,
        "TimeoutMs": 30000,
        "TopicData": [{"Name": "orders", "PartitionData": [{"Index": 0, "Records": batch}]}],
    }
    frame = _decoded("req", None, None, codec.encode_request(ApiKey.PRODUCE, 9, 11, "app", body))
    run = pack_run([frame], [[0, 0]])
    assert run is not None and len(run) < RUN_BYTES_LIMIT
    read, as_bytes = _run_of_one(frame)
    assert not as_bytes and frame_to_packed(read) == frame_to_packed(frame)


def test_values_that_are_not_a_run_read_as_none() -> None:
    from codec.taprecord import RUN_LAYOUT, run_of

    for values in (None, [], [RUN_LAYOUT], [[RUN_LAYOUT, [], []]], [1, [], []], {"a": 1}):
        assert run_of(values) is None


def test_a_packed_message_of_the_wrong_shape_is_a_facts_error() -> None:
    """A frame's message packed inside a run is read back with the shape check ``unpack_message`` makes."""
    from codec.facts import FactsError
    from codec.taprecord import FIELDS, frame_from_packed, frame_to_packed

    frame = frames_from_record(_headers("req"), _request_bytes(), 0, 5)[0]
    packed = frame_to_packed(frame)
    for wrong in ([1, 2], [9, 0, 0, 0, 0, {}, {}, None], "text", 7, 2.5, True):
        packed[len(FIELDS) + 1] = wrong
        with pytest.raises(FactsError):
            frame_from_packed(packed)


def test_packed_frames_from_state_format_2_are_decoded_again() -> None:
    from codec.taprecord import FIELDS, frame_from_packed

    frame = frames_from_record(_headers("req"), _request_bytes(), 0, 5)[0]
    format_2 = [*(getattr(frame, name) for name in FIELDS), frame.raw]
    assert frame_from_packed(format_2).message == frame.message
    assert frame_from_packed(format_2, decode=False).message is None


def test_packed_undecodable_frames_keep_their_error_and_bytes() -> None:
    from codec.taprecord import frame_from_packed, frame_to_packed

    frame = frames_from_record(_headers("req"), _request_bytes()[:7], 0, 5)[0]
    assert frame.error is not None
    again = frame_from_packed(frame_to_packed(frame), decode=False)
    assert str(again.error) == str(frame.error) and again.raw == frame.raw and again.message is None


def _spark_row(direction: str, value: object, **cells: object) -> dict[str, object]:
    """A tap-record row as pandas hands it over: nullable ints as floats, NaN for null."""
    return {
        Header.CONN: "tap1-4",
        Header.SEQ: 3.0,
        Header.TS_NS: 10,
        Header.DIR: direction,
        Header.CORR_ID: math.nan,
        Header.BROKER_ID: math.nan,
        Header.LISTENER: None,
        ROW_KEYS["partition"]: 4.0,
        ROW_KEYS["offset"]: 99,
        "value": value,
        **cells,
    }


def test_a_decoded_frame_row_reads_with_spark_nulls() -> None:
    row = _spark_row("resp", b"\x00", **{Header.API_KEY: 18.0, Header.API_VERSION: 3})
    frame = frame_from_dict(row, decode=False)
    assert (frame.seq, frame.api_key, frame.correlation_id, frame.broker_id) == (3, 18, None, None)
    assert (frame.partition, frame.offset, frame.listener, frame.capture) == (4, 99, None, "full")
    assert frame.message is None and frame.raw is None


#: A tap-record row's cells as Spark hands them over: the value, null, NaN for a null int, or a float int.
_INT_CELLS = st.one_of(
    st.integers(-(2**40), 2**40), st.none(), st.just(math.nan), st.integers(0, 99).map(float)
)
_TEXT_CELLS = st.one_of(st.text(max_size=6), st.none(), st.just(math.nan))
_ROW_INT_COLUMNS = (
    taprecord.LOST,
    Header.SEQ,
    Header.TS_NS,
    Header.API_KEY,
    Header.API_VERSION,
    Header.CORR_ID,
    Header.BROKER_ID,
    ROW_KEYS["partition"],
    ROW_KEYS["offset"],
)
_ROW_TEXT_COLUMNS = (Header.CONN, Header.CLIENT, Header.BROKER, Header.LISTENER, Header.CAPTURE)


@given(
    ints=st.fixed_dictionaries({name: _INT_CELLS for name in _ROW_INT_COLUMNS}),
    texts=st.fixed_dictionaries({name: _TEXT_CELLS for name in _ROW_TEXT_COLUMNS}),
    direction=st.sampled_from(["req", "resp", "open", "close", "bogus", None]),
    value=st.sampled_from([None, b"", b"\x00\x12", _request_bytes()]),
    truncated=st.sampled_from([None, False, True]),
)
def test_the_row_reader_reads_a_row_as_the_dict_reader_does(
    ints: dict[str, object],
    texts: dict[str, object],
    direction: str | None,
    value: bytes | None,
    truncated: bool | None,
) -> None:
    """``frame_from_row`` (the job's hot path) reads only the row layout, and reads it exactly as
    ``frame_from_dict`` reads any layout, then decodes the row's value."""
    row = {**ints, **texts, Header.DIR: direction, Header.TRUNCATED: truncated, "value": value}
    expected = decode_frame(frame_from_dict(row, decode=False), value, truncated=bool(truncated))
    frame = frame_from_row(row)
    assert _meta(frame) == _meta(expected) and frame.lost == expected.lost
    assert frame.message == expected.message and frame.raw == expected.raw
    assert str(frame.error) == str(expected.error)


def test_the_row_reader_decodes_a_request_from_its_own_header() -> None:
    row = _spark_row("req", bytearray(_request_bytes(corr=9)), **{Header.API_KEY: math.nan})
    frame = frame_from_row(row)
    assert frame.request is not None and frame.raw == _request_bytes(corr=9)
    assert (frame.api_key, frame.api_version, frame.correlation_id) == (ApiKey.API_VERSIONS, 3, 9)
    assert (frame.partition, frame.offset, frame.capture, frame.client) == (4, 99, "full", "")
    assert frame_from_row({**row, Header.TRUNCATED: True}).message is None


def test_the_field_name_wins_over_an_old_key() -> None:
    assert frame_from_dict({"direction": "resp", "dir": "req"}, decode=False).direction == "resp"


@pytest.mark.parametrize(
    "flag",
    [
        {Header.TRUNCATED: "1", Header.ORIG_SIZE: "5000000"},
        {Header.REDACTION_FAILED: "1"},
        {Header.CAPTURE_FALLBACK: "meta"},
        {Header.REDACTED: f"AuthBytes,{taprecord.SASL_TOKEN}"},
    ],
)
def test_header_only_records_are_not_decoded(flag: dict[str, str]) -> None:
    headers = _headers("req", **flag)
    assert header_only(headers)
    frame = frames_from_record(headers, b"\x00\x12")[0]
    assert frame.error is None and frame.message is None


def test_records_not_from_a_tap() -> None:
    frame = frames_from_record({}, b"junk", partition=3, offset=1)[0]
    assert frame.conn == "untracked-p3" and frame.direction == "req" and frame.error is not None
    assert headers_dict(None) == {}
    assert headers_dict([("dir", b"req"), ("x", None)]) == {"dir": "req", "x": ""}


def test_lifecycle_records_are_kept_undecoded() -> None:
    frame = frames_from_record(_headers("open"), b'{"tls": null}')[0]
    assert frame.direction == "open" and frame.message is None and frame.error is None


# --- nobody else spells the contract ------------------------------------------------------------------

#: Names that only mean something as tap record headers or their old dict keys.
CONTRACT_ONLY = {
    Header.CORR_ID,
    Header.ORIG_SIZE,
    Header.REDACTION_FAILED,
    Header.CAPTURE_FALLBACK,
    Header.HEADER_ERROR,
    taprecord.SASL_TOKEN,
    ROW_KEYS["partition"],
    ROW_KEYS["offset"],
}
#: Files that still spell some of them, and why (an entry that is no longer true fails, so it only shrinks).
#: Modules allowed to spell header names for now (none left: the job's column list went with the bundles).
KNOWN_LEFTOVERS: dict[str, set[str]] = {}


def _header_literals(tree: ast.AST) -> set[str]:
    """Contract-only string literals, and any header name read from a ``*headers*`` variable."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in CONTRACT_ONLY:
            found.add(node.value)
        receiver: ast.expr | None = None
        key: ast.expr | None = None
        if isinstance(node, ast.Subscript):
            receiver, key = node.value, node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            receiver, key = node.func.value, node.args[0] if node.args else None
        name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
        if (
            "header" in name
            and isinstance(key, ast.Constant)
            and isinstance(key.value, str)
            and key.value in HEADERS
        ):
            found.add(key.value)
    return found


def test_only_the_contract_module_spells_header_names() -> None:
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "codec/taprecord.py":
                continue
            hits = _header_literals(ast.parse(path.read_text(), rel))
            if hits:
                found[rel] = hits
    unexpected = {f: names - KNOWN_LEFTOVERS.get(f, set()) for f, names in found.items()}
    assert not {f: n for f, n in unexpected.items() if n}, "use codec.taprecord.Header"
    stale = {f: names - found.get(f, set()) for f, names in KNOWN_LEFTOVERS.items()}
    assert not {f: n for f, n in stale.items() if n}, "fixed: remove it from KNOWN_LEFTOVERS"


def test_the_scan_finds_a_header_read() -> None:
    assert _header_literals(ast.parse('headers.get("dir")\nself.headers["ts_ns"]\nx = "corr_id"')) == {
        "dir",
        "ts_ns",
        "corr_id",
    }


# --- schema 2: the count of lost records -------------------------------------------------------------


def _schema_2(meta: list[object], *values: bytes) -> bytes:
    """A schema-2 value with ``meta`` as given, to write what ``pack_record`` would not."""
    import struct

    import msgpack

    packed = msgpack.packb(meta, use_bin_type=True)
    return taprecord.MAGIC + struct.pack(">I", len(packed)) + packed + b"".join(values)


_CONNECTION = taprecord.Connection("tap-1-3", "10.0.0.5:51000", "127.0.0.1:9092", 1, "PLAINTEXT", "tap-1")


def _exchange(lost: int) -> bytes:
    request = taprecord.Part("req", 10, ApiKey.API_VERSIONS, 3, 7, _request_bytes())
    return taprecord.pack_record("req", 5, taprecord.pack_static(_CONNECTION), [request], lost)


def test_a_record_carries_how_many_records_of_its_connection_were_lost() -> None:
    record = taprecord.parse_records(None, _exchange(3))[0]
    assert (record.schema, record.seq, record.lost) == (2, 5, 3)
    frames = frames_from_record(None, _exchange(3), partition=1, offset=2)
    assert [(f.lost, f.seq, f.error) for f in frames] == [(3, 5, None)]
    assert [f.lost for f, _part in taprecord.record_frames(record)] == [3]


def test_a_record_that_lost_nothing_is_written_as_before_lost_was() -> None:
    """``lost`` is left out while 0: such a record is exactly the four-element layout, which reads 0."""
    import msgpack

    value = _exchange(0)
    length = int.from_bytes(value[4:8], "big")
    assert len(msgpack.unpackb(value[8 : 8 + length])) == 4
    assert taprecord.parse_records(None, value)[0].lost == 0
    assert frames_from_record(None, value)[0].lost == 0


def test_elements_after_lost_are_ignored() -> None:
    static = taprecord.pack_static(_CONNECTION)
    value = _schema_2(["open", 1, static, [["open", 5, None, None, None, "", None, 2]], 2, 3, "later"], b"{}")
    (record,) = taprecord.parse_records(None, value)
    assert (record.lost, record.loss_ns) == (2, 3)


@pytest.mark.parametrize("lost", [-1, 2**63, "3", 1.5, True, None, [1]])
def test_a_lost_count_that_is_not_a_count_breaks_the_record(lost: object) -> None:
    static = taprecord.pack_static(_CONNECTION)
    value = _schema_2(["open", 1, static, [["open", 5, None, None, None, "", None, 2]], lost], b"{}")
    with pytest.raises(taprecord.RecordError, match="lost"):
        taprecord.parse_records(None, value)
    (frame,) = frames_from_record(None, value, partition=2)
    assert frame.error is not None and frame.lost == 0


def test_a_schema_1_record_lost_nothing() -> None:
    assert taprecord.parse_records(_headers("req"), _request_bytes())[0].lost == 0
    assert frames_from_record(_headers("req"), _request_bytes())[0].lost == 0


# ----- schema 3: one record per connection flush ----------------------------------------------------------

_parts = st.builds(
    taprecord.Part,
    direction=st.sampled_from(taprecord.DIRECTIONS),
    ts_ns=st.integers(0, 2**62),
    api_key=st.none() | st.integers(0, 90),
    api_version=st.none() | st.integers(0, 20),
    correlation_id=st.none() | st.integers(-(2**31), 2**31 - 1),
    value=st.binary(max_size=40),
    redacted=st.lists(st.sampled_from(["AuthBytes", "Password"]), max_size=2, unique=True).map(tuple),
    flags=st.dictionaries(
        st.sampled_from(["truncated", "orig_size", "error"]), st.text(min_size=1, max_size=5)
    ),
)
_entries = st.lists(
    st.tuples(
        st.sampled_from(taprecord.KINDS), st.integers(1, 2**40), st.lists(_parts, min_size=1, max_size=3)
    ),
    min_size=1,
    max_size=6,
)


@given(entries=_entries, lost=st.integers(0, 2**62))
def test_a_flush_reads_back_as_its_entries(
    entries: list[tuple[str, int, list[taprecord.Part]]], lost: int
) -> None:
    value = taprecord.pack_flush(taprecord.pack_static(_CONNECTION), entries, lost)
    records = taprecord.parse_records(None, value)
    assert [(r.schema, r.kind, r.seq, list(r.parts), r.lost, r.index) for r in records] == [
        (3, kind, seq, [p if p.value else replace(p, value=b"") for p in parts], lost, i)
        for i, (kind, seq, parts) in enumerate(entries)
    ]
    assert all(r.connection == _CONNECTION for r in records)


@given(entries=_entries, cut=st.integers(1, 200))
def test_a_broken_flush_is_a_record_error_and_one_undecodable_frame(
    entries: list[tuple[str, int, list[taprecord.Part]]], cut: int
) -> None:
    value = taprecord.pack_flush(taprecord.pack_static(_CONNECTION), entries)
    broken = value[: max(4, len(value) - cut)] if cut < len(value) else value + b"x"
    with pytest.raises(taprecord.RecordError):
        taprecord.parse_records(None, broken)
    (frame,) = frames_from_record(None, broken, partition=4, offset=9)
    assert frame.error is not None and frame.conn == "untracked-p4"


def test_frames_of_a_flush_name_their_entry_and_findings_on_them_have_distinct_ids() -> None:
    from checks.model import Finding, Severity

    request = taprecord.Part("req", 10, ApiKey.API_VERSIONS, 3, 7, _request_bytes())
    static = taprecord.pack_static(_CONNECTION)
    value = taprecord.pack_flush(static, [("req", 5, [request]), ("req", 6, [request])], lost=2)
    frames = frames_from_record(None, value, partition=1, offset=40)
    assert [(f.seq, f.index, f.lost, f.offset, f.error) for f in frames] == [
        (5, 0, 2, 40, None),
        (6, 1, 2, 40, None),
    ]
    assert [f.at() for f in frames] == [[1, 40], [1, 40, 1]]
    ids = {Finding("r", Severity.WARNING, "s", "x", 0, {"offsets": [f.at()]}).id for f in frames}
    assert len(ids) == 2
    # The entry's index survives every layout a frame is kept in.
    second = frames[1]
    assert taprecord.frame_from_packed(taprecord.frame_to_packed(second)).index == 1
    assert taprecord.frame_from_dict(taprecord.frame_to_dict(second)).index == 1
    assert taprecord.record_time_ns(None, value) == 10


def test_a_flush_lists_its_connection_once() -> None:
    request = taprecord.Part("req", 10, ApiKey.API_VERSIONS, 3, 7, _request_bytes())
    static = taprecord.pack_static(_CONNECTION)
    one = taprecord.pack_flush(static, [("req", 5, [request])])
    many = taprecord.pack_flush(static, [("req", 5 + i, [request]) for i in range(64)])
    per_exchange = len(taprecord.pack_record("req", 5, static, [request]))
    assert (len(many) - len(one)) / 63 < per_exchange - len(static)


def test_a_connection_id_names_its_incarnation_to_the_millisecond_rounded_up() -> None:
    ts = 1_780_000_000_123_456_789
    conn = taprecord.connection_id("tap-host-1", taprecord.incarnation(ts), 7)
    assert conn.startswith("tap-host-1.") and conn.endswith("-7")
    assert taprecord.incarnation_ns(conn) == 1_780_000_000_124_000_000
    # Ids of another form (an older tap's, a capture's) carry no incarnation.
    for other in ("tap-host-1-7", "pcap-3", "tap.1a-2", "", "tap-x.k3xz9abc"):
        assert taprecord.incarnation_ns(other) < 1_000_000_000_000


def test_a_tap_event_reads_back_as_a_frame_with_what_the_tap_said() -> None:
    value = taprecord.pack_tap_event(
        taprecord.WORKER_LOST, "tap-h-0", "tap-h", 5_000, {"worker": 0, "pid": 9}
    )
    record = taprecord.parse_records(None, value)[0]
    assert (record.kind, record.seq, record.connection.conn, record.connection.tap) == (
        "worker_lost",
        1,
        "tap-h-0",
        "tap-h",
    )
    [frame] = frames_from_record(None, value, 3, 4)
    assert (frame.direction, frame.conn, frame.ts_ns, frame.error) == ("worker_lost", "tap-h-0", 5_000, None)
    assert taprecord.tap_event_info(frame) == {
        "tap": "tap-h",
        "connections": "tap-h-0",
        "worker": 0,
        "pid": 9,
    }
    # Through the binary state layout too (the job's routes and the stage's state).
    again = taprecord.frame_from_packed(taprecord.frame_to_packed(frame))
    assert taprecord.tap_event_info(again)["worker"] == 0


def test_a_record_carries_a_tap_loss_later_than_its_connection_and_reads_it_as_a_frame_field() -> None:
    static = taprecord.pack_static(_CONNECTION)
    part = taprecord.Part("open", 5, None, None, None, b"{}")
    value = taprecord.pack_record("open", 1, static, [part], 0, 9_000_000)
    record = taprecord.parse_records(None, value)[0]
    assert (record.lost, record.loss_ns) == (0, 9_000_000)
    [frame] = frames_from_record(None, value)
    assert frame.loss_ns == 9_000_000 and taprecord.tap_loss_ns(frame) == 9_000_000
    assert frame_from_dict(frame_to_dict(frame)).loss_ns == 9_000_000
    # Without one, the record is as before it, and the connection id's incarnation is the loss known.
    assert taprecord.pack_record("open", 1, static, [part]) == taprecord.pack_record(
        "open", 1, static, [part], 0, 0
    )
