"""The tap record contract: the one module that knows how a tap-topic record maps to a frame.

The tap writes records with these header names (``tap/proxy.py``, ``tap/capture.py``); the checks
(``checks/``), the streaming job (``streaming/frames.py``, ``streaming/stages.py``), the DAGs and the
CLI read them through the functions here. docs/tap.md, "Tap records", describes the formats: every
reader reads schemas 1, 2 and 3 (``parse_records``).

Why in ``codec/``: it is the one package that the tap, the checks, the job and the CLI all depend on,
and the tap must stay installable without ``checks/`` or Spark. Parsing a record needs the codec
anyway (a frame's message is decoded here), and this module imports nothing outside ``codec/``.

Vocabulary: on the wire the headers keep their short names (``dir``, ``corr_id``; changing them would
change the tap topic format). In Python a frame's fields are ``TapFrame``'s attribute names
(``direction``, ``correlation_id``, ``partition``, ``offset``), and ``frame_to_dict`` writes those.
Two layouts spell some fields after their headers and are read as aliases by ``frame_from_dict``:
the JSON checker state of kpmon state format 1 (``STATE_KEYS``; no longer written: the engine's
format 2 keeps frames packed, ``frame_to_packed``) and the streaming job's tap-record rows
(``ROW_KEYS``; ``frame_of`` reads those rows' values, and only those, on the job's hot path).
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any, Final

import msgpack

from codec import facts
from codec.api import Request, Response, decode_request, decode_response
from codec.errors import DecodeError


class Header:
    """Tap record header names, exactly as on the wire. A namespace of plain ``str`` constants."""

    #: ``req``, ``resp``, ``open``, ``close``, ``blind`` or a tap event (``DIRECTIONS``).
    DIR: Final = "dir"
    #: Per-connection sequence number, from 1 (the ``open`` record); a gap means dropped records.
    SEQ: Final = "seq"
    #: The tap host's wall clock (ns) when it mirrored the frame: the checks' event time.
    TS_NS: Final = "ts_ns"
    API_KEY: Final = "api_key"
    API_VERSION: Final = "api_version"
    CORR_ID: Final = "corr_id"
    #: Comma-separated names of the redacted fields (``SASL_TOKEN`` for a raw SASL token).
    REDACTED: Final = "redacted"
    CONN: Final = "conn"
    CLIENT: Final = "client"
    BROKER: Final = "broker"
    BROKER_ID: Final = "broker_id"
    LISTENER: Final = "listener"
    TAP: Final = "tap"
    CAPTURE: Final = "capture"
    SCHEMA: Final = "schema"
    # Flags, present only when set.
    TRUNCATED: Final = "truncated"
    ORIG_SIZE: Final = "orig_size"
    REDACTION_FAILED: Final = "redaction_failed"
    CAPTURE_FALLBACK: Final = "capture_fallback"
    HEADER_ERROR: Final = "header_error"
    #: On a ``close`` after a failure.
    ERROR: Final = "error"


#: Every header name of a schema-1 record (tests check nothing else writes them).
HEADERS: Final = tuple(v for k, v in vars(Header).items() if k.isupper())
#: The schema a tap writes today: 2, one record per exchange, metadata packed in the value.
SCHEMA_VERSION: Final = "2"
#: The ``schema`` header of a schema-1 record (one record per frame, metadata in Kafka headers).
SCHEMA_1: Final = "1"

REQ: Final = "req"
RESP: Final = "resp"
OPEN: Final = "open"
CLOSE: Final = "close"
#: The tap cannot read this connection's frames from here on (it carries TLS the tap does not
#: terminate); its value is JSON with the ``side`` that sent it (``client`` or ``broker``).
BLIND: Final = "blind"
#: A tap started (or restarted): its earlier connections without a ``close`` ended, their loss unknown.
TAP_START: Final = "tap_start"
#: A tap worker died: the connections it served ended without their ``close``, their loss unknown.
WORKER_LOST: Final = "worker_lost"
#: Records about the tap itself, not a connection (``pack_tap_event``).
TAP_EVENTS: Final = (TAP_START, WORKER_LOST)
#: Values of the ``dir`` header, and of a schema-2 or 3 part's direction.
DIRECTIONS: Final = (REQ, RESP, OPEN, CLOSE, BLIND, *TAP_EVENTS)
#: The ``redacted`` entry of a raw SASL token (mirrored header-only).
SASL_TOKEN: Final = "sasl_token"


@dataclass(init=False)
class TapFrame:
    """One tap record: a request or response frame (decoded, or the error), or a lifecycle event.

    ``__init__`` is written out, in field order with the fields' defaults: mypyc compiles it, while
    the one ``dataclass`` would generate runs as Python, about 5x slower, for every frame and copy."""

    conn: str
    seq: int
    ts_ns: int
    #: ``req``, ``resp``, ``open`` or ``close`` (the ``dir`` header).
    direction: str
    api_key: int | None = None
    api_version: int | None = None
    correlation_id: int | None = None
    client: str = ""
    broker: str = ""
    broker_id: int | None = None
    listener: str | None = None
    #: Where the frame sits in the tap topic: the evidence a finding points at.
    partition: int = -1
    offset: int = -1
    message: Request | Response | None = None
    error: DecodeError | None = None
    capture: str = "full"
    #: The frame bytes as mirrored (None when not kept): the KIP-482 header check re-decodes them.
    raw: bytes | None = None
    #: How many of its connection's records the tap had lost when it wrote this one (its sink refused
    #: them, or their delivery failed): any at all makes the connection's findings incomplete.
    lost: int = 0
    #: A response the tap wrote as a record of its own (schema 2, kind ``resp``): its request was written
    #: alone before it (a bound was hit) or never seen, so it pairs with nothing (``checks.engine``).
    lone: bool = False
    #: Which of its record's entries the frame came from: a schema-3 record holds a connection's
    #: exchanges of one flush, so the record's offset alone no longer names one (0 in schemas 1 and 2).
    index: int = 0
    #: When its tap last may have lost records (``tap_loss_ns``) before it wrote this frame, if later
    #: than its connection's incarnation (which the connection id carries); 0 otherwise.
    loss_ns: int = 0

    def __init__(
        self,
        conn: str,
        seq: int,
        ts_ns: int,
        direction: str,
        api_key: int | None = None,
        api_version: int | None = None,
        correlation_id: int | None = None,
        client: str = "",
        broker: str = "",
        broker_id: int | None = None,
        listener: str | None = None,
        partition: int = -1,
        offset: int = -1,
        message: Request | Response | None = None,
        error: DecodeError | None = None,
        capture: str = "full",
        raw: bytes | None = None,
        lost: int = 0,
        lone: bool = False,
        index: int = 0,
        loss_ns: int = 0,
    ) -> None:
        self.conn = conn
        self.seq = seq
        self.ts_ns = ts_ns
        self.direction = direction
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client = client
        self.broker = broker
        self.broker_id = broker_id
        self.listener = listener
        self.partition = partition
        self.offset = offset
        self.message = message
        self.error = error
        self.capture = capture
        self.raw = raw
        self.lost = lost
        self.lone = lone
        self.index = index
        self.loss_ns = loss_ns

    def with_message(self, message: Request | Response | None) -> TapFrame:
        """A copy of this frame holding ``message`` instead (positional: this runs per routed frame)."""
        return TapFrame(
            self.conn, self.seq, self.ts_ns, self.direction, self.api_key, self.api_version,
            self.correlation_id, self.client, self.broker, self.broker_id, self.listener, self.partition,
            self.offset, message, self.error, self.capture, self.raw, self.lost, self.lone, self.index,
            self.loss_ns,
        )  # fmt: skip

    def at(self) -> list[int]:
        """Where the frame sits in the tap topic, as findings' ``offsets`` name it: partition and
        offset, and the entry's index within a schema-3 record when it is not the first (so ids of
        findings on frames of schemas 1 and 2, always index 0, stay what they were)."""
        if self.index:
            return [self.partition, self.offset, self.index]
        return [self.partition, self.offset]

    @property
    def request(self) -> Request | None:
        return self.message if isinstance(self.message, Request) else None

    @property
    def response(self) -> Response | None:
        return self.message if isinstance(self.message, Response) else None

    @property
    def client_host(self) -> str:
        return self.client.rsplit(":", 1)[0]

    def evidence(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "conn": self.conn,
            "seq": self.seq,
            "partition": self.partition,
            "offset": self.offset,
        }
        if self.index:
            out["index"] = self.index
        return out


# --- parsing a record -------------------------------------------------------------------------------


def header_text(value: bytes | str | None) -> str:
    """A header value as text: a null value is "", bytes are UTF-8 with undecodable bytes replaced."""
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def headers_dict(
    headers: Iterable[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None,
) -> dict[str, str]:
    """Record headers as a client library hands them over (pairs or a mapping, bytes) → ``{name: text}``."""
    if headers is None:
        return {}
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {key: header_text(value) for key, value in items}


def int_header(headers: Mapping[str, str], name: str) -> int | None:
    """A numeric header; None when missing, empty (the tap writes "" for unknown) or not a number."""
    value = headers.get(name)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        return None


#: Flag headers: any of them non-empty means the frame was mirrored header-only (``header_only``).
HEADER_ONLY_FLAGS: Final = (Header.TRUNCATED, Header.REDACTION_FAILED, Header.CAPTURE_FALLBACK)
#: Every header ``header_only`` reads: the flags, and ``redacted`` for the raw SASL token.
HEADER_ONLY_READS: Final = (*HEADER_ONLY_FLAGS, Header.REDACTED)


def header_only(headers: Mapping[str, str]) -> bool:
    """The tap mirrored this frame without its body: too large, a redaction it could not do (fail
    closed), a payload strip that fell back to ``meta``, or a raw SASL token. Not a decode error."""
    for name in HEADER_ONLY_FLAGS:
        if headers.get(name):
            return True
    return SASL_TOKEN in (headers.get(Header.REDACTED) or "").split(",")


def connection_of(conn: str | None, partition: int | None) -> str:
    """A record without the tap's ``conn`` header (not from a tap) still needs a connection to key by."""
    return conn or f"untracked-p{partition}"


def frame_from_headers(headers: Mapping[str, str], partition: int = -1, offset: int = -1) -> TapFrame:
    """The frame's tap metadata, not decoded (``decode_frame`` attaches the message)."""
    return TapFrame(
        conn=connection_of(headers.get(Header.CONN), partition),
        seq=int_header(headers, Header.SEQ) or 0,
        ts_ns=int_header(headers, Header.TS_NS) or 0,
        direction=headers.get(Header.DIR, ""),
        api_key=int_header(headers, Header.API_KEY),
        api_version=int_header(headers, Header.API_VERSION),
        correlation_id=int_header(headers, Header.CORR_ID),
        client=headers.get(Header.CLIENT, ""),
        broker=headers.get(Header.BROKER, ""),
        broker_id=int_header(headers, Header.BROKER_ID),
        listener=headers.get(Header.LISTENER) or None,
        partition=partition,
        offset=offset,
        capture=headers.get(Header.CAPTURE, "full"),
    )


def decode_frame(
    frame: TapFrame, value: bytes | None, truncated: bool = False, fields: Iterable[str] | None = None
) -> TapFrame:
    """Attach the decoded message (or the DecodeError) of ``value`` to a frame built from tap metadata.

    A record that does not follow the contract (no valid ``dir`` header: something else wrote it to
    the tap topic) becomes an undecodable request, so it is reported, not ignored.
    """
    if frame.direction not in DIRECTIONS:
        frame.error = DecodeError(f"not a tap record: {Header.DIR} header {frame.direction!r}", 0)
        frame.direction = REQ
        return frame
    if frame.direction not in (REQ, RESP):
        if frame.direction == BLIND or frame.direction in TAP_EVENTS:
            # Its JSON says which side sent what the tap cannot read (``checks.engine``), or what the
            # tap says about the event (``tap_event_info``).
            frame.raw = value
        return frame
    if frame.capture == "meta" or truncated:
        # Only the frame header was mirrored: keep the frame for gap accounting, skip decoding.
        return frame
    data = value or b""
    frame.raw = data
    try:
        if frame.direction == REQ:
            frame.message = decode_request(data, fields=fields)
            frame.api_key = frame.message.api_key
            frame.api_version = frame.message.api_version
            frame.correlation_id = frame.message.correlation_id
        else:
            if frame.api_key is None or frame.api_version is None:
                raise DecodeError("response record without api_key/api_version headers", 0)
            frame.message = decode_response(data, frame.api_key, frame.api_version, fields=fields)
    except DecodeError as exc:
        frame.error = exc
    return frame


# --- frames as dicts ----------------------------------------------------------------------------------

#: The metadata fields of a ``TapFrame`` (not ``message``/``error``: those are rebuilt from ``raw``).
FIELDS: Final = (
    "conn",
    "seq",
    "ts_ns",
    "direction",
    "api_key",
    "api_version",
    "correlation_id",
    "client",
    "broker",
    "broker_id",
    "listener",
    "partition",
    "offset",
    "capture",
)
_INT_FIELDS = frozenset(
    {"seq", "ts_ns", "api_key", "api_version", "correlation_id", "broker_id", "partition", "offset"}
)
#: ``TapFrame.lost`` in every layout that carries it: the tap-record rows' column, the key of
#: ``frame_to_dict`` (written only when not 0) and, by position, the last element of a packed frame.
#: Not one of ``FIELDS``: those are the packed frame's head, and only its tail may grow.
LOST: Final = "lost"
#: ``TapFrame.lone`` in the same layouts as ``LOST`` (written only when set; packed after ``lost``).
LONE: Final = "lone"
#: ``TapFrame.index`` in the same layouts (written only when not 0; packed after ``lone``).
INDEX: Final = "index"
#: ``TapFrame.loss_ns`` in the same layouts as ``LOST`` (written only when set; packed after ``index``).
LOSS_NS: Final = "loss_ns"
#: Saved checker state of format 1 (JSON, before ``checks.engine`` state format 2) and the tap-record
#: rows spell these fields after their headers.
STATE_KEYS: Final[Mapping[str, str]] = {"direction": Header.DIR, "correlation_id": Header.CORR_ID}
#: Columns of the streaming job's tap-record rows (``streaming.frames.FRAME_ROW_SCHEMA``).
ROW_KEYS: Final[Mapping[str, str]] = {
    **STATE_KEYS,
    "partition": "tap_partition",
    "offset": "tap_offset",
    "index": "tap_index",
}
#: Every other key a field may be found under in a saved dict, newest layout first.
KEY_ALIASES: Final[Mapping[str, tuple[str, ...]]] = {
    name: tuple(dict.fromkeys(layout[name] for layout in (STATE_KEYS, ROW_KEYS) if name in layout))
    for name in FIELDS
    if name in ROW_KEYS
}
_DEFAULTS: Final[Mapping[str, Any]] = {
    "conn": "",
    "seq": 0,
    "ts_ns": 0,
    "direction": "",
    "client": "",
    "broker": "",
    "partition": -1,
    "offset": -1,
    "capture": "full",
}


def frame_to_dict(frame: TapFrame, keys: Mapping[str, str] | None = None) -> dict[str, Any]:
    """JSON-ready metadata plus the mirrored bytes (``raw``, base64), under the field names, or under
    ``keys[field]`` for another layout (``STATE_KEYS``, the format-1 state layout)."""
    rename = keys or {}
    out: dict[str, Any] = {rename.get(name, name): getattr(frame, name) for name in FIELDS}
    out["raw"] = base64.b64encode(frame.raw).decode("ascii") if frame.raw is not None else None
    if frame.lost:
        out[LOST] = frame.lost
    if frame.lone:
        out[LONE] = True
    if frame.index:
        out[INDEX] = frame.index
    if frame.loss_ns:
        out[LOSS_NS] = frame.loss_ns
    return out


def _missing(value: Any) -> bool:
    # pandas hands Spark's null ints over as NaN floats.
    return value is None or (isinstance(value, float) and math.isnan(value))


def _lookup(data: Mapping[str, Any], name: str) -> Any:
    for key in (name, *KEY_ALIASES.get(name, ())):
        value = data.get(key)
        if not _missing(value):
            return value
    return None


def _count(value: Any) -> int:
    """A ``lost`` count as a row, a dict or a packed frame holds it: missing, null or NaN (pandas' null
    int) is 0; a float that pandas made of an int is that int."""
    if _missing(value):
        return 0
    return int(value)


def frame_from_dict(data: Mapping[str, Any], decode: bool = True) -> TapFrame:
    """A frame back from ``frame_to_dict`` output, saved state of any layout or a decoded-frame row.

    Field names are read first, then the older layouts' keys, so saved state written before the
    vocabulary was unified reads the same. With ``decode``, ``raw`` (base64) is decoded again: the
    bytes are the source of truth, a decoded message is never saved.
    """
    values: dict[str, Any] = {}
    for name in FIELDS:
        value = _lookup(data, name)
        if value is None:
            if name in _DEFAULTS:
                values[name] = _DEFAULTS[name]
            continue
        values[name] = int(value) if name in _INT_FIELDS else str(value)
    frame = TapFrame(**values)
    frame.lost = _count(data.get(LOST))
    frame.lone = data.get(LONE) is True
    frame.index = _count(data.get(INDEX))
    frame.loss_ns = _count(data.get(LOSS_NS))
    raw = data.get("raw")
    if not decode or not isinstance(raw, str):
        return frame
    return decode_frame(frame, base64.b64decode(raw))


# --- the streaming job's tap-record rows ------------------------------------------------------------------


#: The tap-record rows' columns a frame is read from, in ``frame_of``'s argument order.
ROW_COLUMNS: Final = (
    Header.CONN,
    Header.SEQ,
    Header.TS_NS,
    Header.DIR,
    Header.API_KEY,
    Header.API_VERSION,
    Header.CORR_ID,
    Header.CLIENT,
    Header.BROKER,
    Header.BROKER_ID,
    Header.LISTENER,
    ROW_KEYS["partition"],
    ROW_KEYS["offset"],
    Header.CAPTURE,
    LOST,
    LONE,
    "value",
    Header.TRUNCATED,
    ROW_KEYS["index"],
    LOSS_NS,
)


def frame_from_row(row: Mapping[str, Any]) -> TapFrame:
    """A tap-record row (``streaming.frames.FRAME_ROW_SCHEMA``: header names, ``ROW_KEYS``) to a frame,
    decoded, as ``frames_from_columns`` reads each of its rows."""
    return frame_of(*map(row.get, ROW_COLUMNS))


def frames_from_columns(columns: Mapping[str, Sequence[Any]], rows: int) -> list[TapFrame]:
    """The ``rows`` tap-record rows of ``columns`` (``ROW_COLUMNS``, each a column's values; a missing
    column is all null) to frames, decoded: the one decode of the streaming job (its ``mapInArrow``
    stage, ``streaming.bundles``). Column by column: a dict per row cost as much as reading it."""
    nulls = [None] * rows
    values = (columns.get(name, nulls) for name in ROW_COLUMNS)
    return [frame_of(*row) for row in zip(*values, strict=True)]


def frame_of(
    conn: Any,
    seq: Any,
    ts_ns: Any,
    direction: Any,
    api_key: Any,
    api_version: Any,
    corr: Any,
    client: Any,
    broker: Any,
    broker_id: Any,
    listener: Any,
    partition: Any,
    offset: Any,
    capture: Any,
    lost: Any,
    lone: Any,
    value: Any,
    truncated: Any,
    index: Any,
    loss_ns: Any,
) -> TapFrame:
    """One row's values (``ROW_COLUMNS``' order) to a frame, decoded, with ``frame_from_dict``'s
    defaults and conversions but none of its saved-state layouts: this runs for every frame of the
    stream. pandas hands Spark's null ints over as NaN floats, and NaN is the one value unequal to
    itself (``v != v``); written out per column, as a helper call per column cost more than the rest."""
    # Positional, in the dataclass's field order (its ``__init__`` binds keywords at twice the cost).
    frame = TapFrame(
        "" if conn is None or conn != conn else str(conn),
        0 if seq is None or seq != seq else int(seq),
        0 if ts_ns is None or ts_ns != ts_ns else int(ts_ns),
        "" if direction is None or direction != direction else str(direction),
        None if api_key is None or api_key != api_key else int(api_key),
        None if api_version is None or api_version != api_version else int(api_version),
        None if corr is None or corr != corr else int(corr),
        "" if client is None or client != client else str(client),
        "" if broker is None or broker != broker else str(broker),
        None if broker_id is None or broker_id != broker_id else int(broker_id),
        None if listener is None or listener != listener else str(listener),
        -1 if partition is None or partition != partition else int(partition),
        -1 if offset is None or offset != offset else int(offset),
        None,
        None,
        "full" if capture is None or capture != capture else str(capture),
        None,
        0 if lost is None or lost != lost else int(lost),
        lone is True,
        0 if index is None or index != index else int(index),
        0 if loss_ns is None or loss_ns != loss_ns else int(loss_ns),
    )
    return decode_frame(frame, None if value is None else bytes(value), truncated=bool(truncated))


# --- frames as packed lists (binary state) ---------------------------------------------------------------


#: A frame's ``FIELDS`` values, in order (one C call instead of a generator over the names).
_metadata: Final = attrgetter(*FIELDS)


def frame_to_packed(frame: TapFrame) -> list[Any]:
    """The metadata in ``FIELDS`` order, then what the frame holds, in the compact form binary state
    (``checks.engine`` state format 3) and the streaming job's routes keep: a decoded message as its
    facts (``codec.facts``, no bytes to decode again), a decode error as the error and the mirrored
    bytes (the KIP-482 check re-reads them, and those of a body decoded with bytes left over), then
    ``lost``. ``FIELDS`` and this list only ever grow at their end, so older packed frames stay
    readable (a frame packed before ``lost`` reads as 0)."""
    return [*_metadata(frame), *_held(frame, False)]


def _held(frame: TapFrame, in_run: bool) -> list[Any]:
    """What a packed frame holds after its metadata: its message packed on its own, or ``in_run`` the
    message itself, which ``facts.packb`` packs as its facts inside the run (``pack_run``), or in a
    run just the frame's bytes where decoding them again gives that message (``_bytes_in_run``)."""
    message = frame.message
    if message is not None:
        if in_run and _bytes_in_run(frame, message):
            return [frame.raw, None, None, frame.lost, frame.lone, frame.index, frame.loss_ns]
        # A body decoded with bytes left over keeps them: the KIP-482 check re-decodes it.
        raw = frame.raw if "_trailing" in message.body else None
        held: Any = message if in_run else facts.pack_message(message)
        return [raw, held, None, frame.lost, frame.lone, frame.index, frame.loss_ns]
    error = None if frame.error is None else facts.pack_error(frame.error)
    return [frame.raw, None, error, frame.lost, frame.lone, frame.index, frame.loss_ns]


#: The most bytes of a frame a run carries instead of its facts (``_bytes_in_run``). Below it the bytes
#: cost less to pack than the facts (a Produce exchange's about a third of walking its messages' facts
#: in ``facts.packb``) and, compressed, take less room; a larger frame is most often one carrying record
#: payloads (a ``full`` capture), which facts leave out.
RUN_BYTES_LIMIT: Final = 4096


def _bytes_in_run(frame: TapFrame, message: Request | Response) -> bool:
    """Whether a run carries ``frame`` as its bytes, decoded again only if the run is read
    (``frame_from_packed``): few enough bytes, and a message they decode to on their own. A response
    whose nested payloads needed its request (``tag_extras`` None) keeps its facts."""
    raw = frame.raw
    return raw is not None and len(raw) <= RUN_BYTES_LIMIT and message.tag_extras is not None


#: The ``FIELDS`` every frame of one connection shares, and those of its own, as a run keeps them.
RUN_SHARED: Final = ("conn", "client", "broker", "broker_id", "listener", "capture")
_RUN_OWN: Final = tuple(name for name in FIELDS if name not in RUN_SHARED)
_shared: Final = attrgetter(*RUN_SHARED)
_own: Final = attrgetter(*_RUN_OWN)
#: A run row's own fields followed by its connection's shared ones, back in ``FIELDS`` order.
_in_field_order: Final = itemgetter(*((*_RUN_OWN, *RUN_SHARED).index(name) for name in FIELDS))
#: A packed run's first value (``pack_run``); a list packed otherwise starts with something else.
RUN_LAYOUT: Final = 2


def pack_run(frames: Sequence[TapFrame], extras: Sequence[list[int]]) -> bytes | None:
    """Frames of one connection (a summary's originals) packed together: the fields they share
    (``RUN_SHARED``) once, then per frame its ``extras`` (plain numbers its caller keeps with it) and
    the rest of ``frame_to_packed``, its message's facts inside the run rather than packed on their
    own. None when the frames do not share those fields. ``run_of`` reads it back."""
    if not frames:
        return None
    shared = _shared(frames[0])
    rows: list[list[Any]] = []
    for frame, extra in zip(frames, extras, strict=True):
        if _shared(frame) != shared:
            return None
        rows.append([extra, *_own(frame), *_held(frame, True)])
    return facts.packb([RUN_LAYOUT, list(shared), rows])


def run_of(values: Any) -> tuple[list[TapFrame], list[list[int]]] | None:
    """``pack_run``'s frames and extras from its unpacked values (``facts.unpack_values``), or None
    when ``values`` are not a packed run."""
    if not isinstance(values, list) or len(values) != 3 or values[0] != RUN_LAYOUT:
        return None
    shared = tuple(values[1])
    own = len(_RUN_OWN)
    frames: list[TapFrame] = []
    extras: list[list[int]] = []
    for row in values[2]:
        # ``frame_to_packed``'s layout: ``FIELDS`` in order, then what the frame holds.
        packed = [*_in_field_order((*row[1 : own + 1], *shared)), *row[own + 1 :]]
        frames.append(frame_from_packed(packed))
        extras.append(row[0])
    return frames, extras


def frame_from_packed(values: Sequence[Any], decode: bool = True) -> TapFrame:
    """A frame back from ``frame_to_packed`` output, with no decoding (its message is unpacked from its
    facts). Frames packed before facts (state format 2) hold only their bytes: with ``decode``, those
    are decoded again."""
    count = len(FIELDS)
    if len(values) >= count:
        # Positional, in the dataclass's field order: ``FIELDS`` is that order with ``capture`` moved
        # after ``message`` and ``error`` (keywords cost twice as much, and this runs per routed frame).
        (
            conn,
            seq,
            ts_ns,
            direction,
            api,
            version,
            corr,
            client,
            broker,
            broker_id,
            listener,
            part,
            offset,
            capture,
        ) = values[:count]
        frame = TapFrame(
            conn, seq, ts_ns, direction, api, version, corr, client, broker, broker_id, listener, part, offset,
            None, None, capture,
        )  # fmt: skip
    else:
        frame = TapFrame(**{name: value for name, value in zip(FIELDS, values[:count], strict=False)})
    raw, packed, error, lost, lone, index, loss_ns = [*values[count:], *(None,) * 7][:7]
    frame.lost = lost if isinstance(lost, int) and not isinstance(lost, bool) and lost > 0 else 0
    frame.lone = lone is True
    frame.index = index if isinstance(index, int) and not isinstance(index, bool) and index > 0 else 0
    frame.loss_ns = (
        loss_ns if isinstance(loss_ns, int) and not isinstance(loss_ns, bool) and loss_ns > 0 else 0
    )
    if packed is not None:
        # Packed facts, or a run's message (``pack_run``), unpacked with the run as its values.
        if isinstance(packed, bytes):
            frame.message = facts.unpack_message(packed)
        elif isinstance(packed, list):
            frame.message = facts.message_of(*packed)
        else:
            raise facts.FactsError(f"not packed facts: a frame's message as {type(packed).__name__}")
        frame.raw = None if raw is None else bytes(raw)
        return frame
    if error is not None:
        frame.raw = None if raw is None else bytes(raw)
        frame.error = facts.unpack_error(error)
        return frame
    if not decode or raw is None:
        return frame
    return decode_frame(frame, bytes(raw))


def pack_frame(frame: TapFrame) -> bytes:
    """``frame_to_packed`` as bytes: a frame between the streaming job's router and its stage, no frame
    bytes to decode again."""
    return facts.packb(frame_to_packed(frame))


def unpack_frame(data: bytes) -> TapFrame:
    return frame_from_packed(msgpack.unpackb(data, raw=False))


# --- schema 2: one record per exchange, metadata packed in the value ------------------------------------
#
# A schema-2 record has no Kafka headers. Its key is the connection id, as in schema 1, and its value is
#
#     MAGIC (4 bytes) | meta length (uint32, big-endian) | meta (msgpack) | payload | payload ...
#
# ``meta`` is ``[kind, seq, static, parts, lost]``: ``kind`` is ``EXCHANGE`` (a request and its
# response), ``req``, ``resp`` (a frame without its partner), ``open`` or ``close``; ``seq`` numbers the
# connection's records from 1 in the order the tap writes them, so a dropped record is a gap and the
# frames of one exchange share a number; ``static`` is the connection's constant metadata, packed once
# per connection by the tap (``pack_static``), read once per distinct value by readers; ``parts`` is one
# ``[dir, ts_ns, api_key, api_version, corr_id, redacted, flags, length]`` per frame (or lifecycle
# event), whose ``length`` bytes follow in order. A frame's flags are those schema 1 sent as headers.
# ``lost`` counts the connection's records the tap lost before this one (its sink refused them, or
# their delivery failed): a gap says records are missing, ``lost`` that the tap knows it lost them,
# which is what makes the connection's findings incomplete. It is left out while 0, so records of
# connections that lost nothing are as they were before it (``[kind, seq, static, parts]``), and a
# reader ignores elements after it, as it ignores a part's after ``length``: the list grows at its end.
# After ``lost`` (then written even when 0) may come ``loss_ns`` (``TapFrame.loss_ns``): when the tap last
# may have lost records before it wrote this one, left out unless later than the connection's
# incarnation (its id carries that: ``incarnation_ns``), so only connections open across a loss carry it.
#
# MAGIC starts with 0xFF: a Kafka request starts with its int16 api key (< 256: a 0x00 byte), a
# lifecycle value with ``{``; only a schema-1 response whose correlation id is negative could begin
# the same way, and schema-1 records carry a ``dir`` header, which a schema-2 record never has.

#: The first bytes of every schema-2 value (the last one is the schema number).
MAGIC: Final = b"\xffKT\x02"
#: The kind of a record holding a request and its response.
EXCHANGE: Final = "ex"
#: Every record kind of schema 2.
KINDS: Final = (EXCHANGE, *DIRECTIONS)
_PREFIX: Final = struct.Struct(">4sI")
#: The connection's constant fields, in ``static``'s order.
STATIC_FIELDS: Final = ("conn", "client", "broker", "broker_id", "listener", "tap", "capture")


#: ``lost`` is below this (it fits a signed 64-bit integer).
_MAX_LOST: Final = 1 << 63


class RecordError(ValueError):
    """A value that claims schema 2 (it starts with ``MAGIC``) but does not follow it."""


@dataclass(frozen=True, slots=True)
class Part:
    """One frame (or lifecycle event) of a tap record, as mirrored: its metadata and bytes, not decoded."""

    direction: str
    ts_ns: int
    api_key: int | None
    api_version: int | None
    correlation_id: int | None
    value: bytes | None
    #: Names of the fields the tap blanked (``SASL_TOKEN`` for a raw SASL token).
    redacted: tuple[str, ...] = ()
    #: ``truncated``, ``orig_size``, ``redaction_failed``, ``capture_fallback``, ``header_error``,
    #: ``error`` (on a close after a failure): what schema 1 sent as flag headers.
    flags: Mapping[str, str] = field(default_factory=dict)

    @property
    def header_only(self) -> bool:
        """Mirrored without its body (too large, a redaction that could not be done, a fallback to
        ``meta``, a raw SASL token): not a decode error."""
        for name in HEADER_ONLY_FLAGS:
            if self.flags.get(name):
                return True
        return SASL_TOKEN in self.redacted


@dataclass(frozen=True, slots=True)
class Connection:
    """The constant metadata of a tapped connection."""

    conn: str
    client: str = ""
    broker: str = ""
    broker_id: int | None = None
    listener: str | None = None
    tap: str = ""
    capture: str = "full"


@dataclass(frozen=True, slots=True)
class TapRecord:
    """One tap-topic record of either schema, parsed but not decoded: what every reader starts from."""

    schema: int
    kind: str
    seq: int
    connection: Connection
    parts: tuple[Part, ...]
    #: The connection's records the tap had lost before this one (``TapFrame.lost``); 0 in schema 1.
    #: In schema 3, the entries it lost: each of a lost record's entries counts.
    lost: int = 0
    #: The entry's place in its schema-3 record (``TapFrame.index``); 0 in schemas 1 and 2.
    index: int = 0
    #: ``TapFrame.loss_ns``; 0 in schema 1.
    loss_ns: int = 0


def pack_static(connection: Connection) -> bytes:
    """The ``static`` element of a connection's records (the tap packs it once per connection)."""
    return msgpack.packb([getattr(connection, name) for name in STATIC_FIELDS], use_bin_type=True)


def _part_meta(p: Part) -> list[Any]:
    return [
        p.direction, p.ts_ns, p.api_key, p.api_version, p.correlation_id,
        ",".join(p.redacted), dict(p.flags) or None, len(p.value or b""),
    ]  # fmt: skip


def pack_record(
    kind: str, seq: int, static: bytes, parts: Sequence[Part], lost: int = 0, loss_ns: int = 0
) -> bytes:
    """A schema-2 record value; ``lost``: the connection's records the tap lost before this one;
    ``loss_ns``: ``TapFrame.loss_ns``."""
    meta: list[Any] = [kind, seq, static, [_part_meta(p) for p in parts]]
    if lost or loss_ns:
        meta.append(lost)
    if loss_ns:
        meta.append(loss_ns)
    packed = msgpack.packb(meta, use_bin_type=True)
    return b"".join((_PREFIX.pack(MAGIC, len(packed)), packed, *(p.value or b"" for p in parts)))


def is_schema_2(value: bytes | None) -> bool:
    return value is not None and value[:4] == MAGIC


#: What values of schemas 2 and 3 start with (the fourth byte is the schema number).
PACKED_PREFIX: Final = MAGIC[:3]


def is_packed(value: bytes | None) -> bool:
    """A value of schema 2 or 3 (metadata packed in the value, no Kafka headers)."""
    return value is not None and value[:4] in (MAGIC, MAGIC_3)


#: ``static`` values already read: a connection's records all carry the same bytes.
_STATICS: dict[bytes, Connection] = {}
_MAX_STATICS: Final = 65_536


def _static(data: bytes) -> Connection:
    found = _STATICS.get(data)
    if found is not None:
        return found
    values = msgpack.unpackb(data, raw=False)
    if not isinstance(values, list) or len(values) < len(STATIC_FIELDS):
        raise RecordError("connection metadata is not a list of its fields")
    conn, client, broker, broker_id, listener, tap, capture = values[: len(STATIC_FIELDS)]
    connection = Connection(
        str(conn or ""),
        str(client or ""),
        str(broker or ""),
        broker_id if isinstance(broker_id, int) else None,
        str(listener) if listener else None,
        str(tap or ""),
        str(capture or "full"),
    )
    if len(_STATICS) >= _MAX_STATICS:
        _STATICS.clear()
    _STATICS[data] = connection
    return connection


def _opt(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


#: A schema-2 part's metadata as ``read_record_2`` hands it over (``pack_record``'s list, checked):
#: direction, ts_ns, api key, api version, correlation id, redacted names, flags, size, then where its
#: bytes start in the value. Its ints are unchecked (``_opt`` reads them).
RawPart = tuple[str, Any, Any, Any, Any, Any, Any, int, int]


def _meta(value: bytes) -> tuple[list[Any], int]:
    """The msgpack list after a schema-2 or 3 prefix, and where the payloads start."""
    if len(value) < _PREFIX.size:
        raise RecordError("shorter than its prefix")
    _, length = _PREFIX.unpack_from(value)
    start = _PREFIX.size
    end = start + length
    if end > len(value):
        raise RecordError(f"metadata of {length} bytes overruns the {len(value)}-byte value")
    try:
        meta = msgpack.unpackb(memoryview(value)[start:end], raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise RecordError(f"unreadable metadata: {exc}") from exc
    if not isinstance(meta, list):
        raise RecordError("metadata is not a list")
    return meta, end


def _lost(lost: Any) -> int:
    # A count, and one that an int64 column (the job's rows) holds.
    if not isinstance(lost, int) or isinstance(lost, bool) or not 0 <= lost < _MAX_LOST:
        raise RecordError(f"bad count of lost records {lost!r}")
    return lost


def _loss_ns(loss_ns: Any) -> int:
    if not isinstance(loss_ns, int) or isinstance(loss_ns, bool) or not 0 <= loss_ns < _MAX_LOST:
        raise RecordError(f"bad time of a tap loss {loss_ns!r}")
    return loss_ns


def _raw_parts(raw_parts: list[Any], pos: int, total: int) -> tuple[list[RawPart], int]:
    """Parts' metadata checked, each with where its bytes start from ``pos``; and where they end."""
    parts: list[RawPart] = []
    for raw in raw_parts:
        if not isinstance(raw, list) or len(raw) < 8:
            raise RecordError("a frame's metadata is not a list of its fields")
        direction, ts_ns, api_key, api_version, corr, redacted, flags, size = raw[:8]
        if direction not in DIRECTIONS or not isinstance(size, int) or size < 0 or pos + size > total:
            raise RecordError(f"frame {len(parts)}: bad direction {direction!r} or length {size!r}")
        parts.append((direction, ts_ns, api_key, api_version, corr, redacted, flags, size, pos))
        pos += size
    return parts, pos


def read_record_2(value: bytes) -> tuple[str, int, Connection, list[RawPart], int, int]:
    """A schema-2 value's metadata (``is_schema_2``), checked against the layout but not turned into
    ``Part`` objects: the kind, ``seq``, the connection, each part's raw metadata with where its
    bytes are, ``lost`` and ``loss_ns`` (0 when the record has none). ``RecordError`` when it does
    not follow the schema. The one reader of the layout: ``parse_record_2`` builds on it, and the
    job's columnar read (``streaming.frames``) reads it so."""
    meta, end = _meta(value)
    if len(meta) < 4:
        raise RecordError("metadata is not a list of at least kind, seq, static and parts")
    kind, seq, static, raw_parts = meta[:4]
    try:
        connection = _static(static)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise RecordError(f"unreadable metadata: {exc}") from exc
    if kind not in KINDS or not isinstance(seq, int) or not isinstance(raw_parts, list):
        raise RecordError(f"unknown record kind {kind!r} or bad sequence number")
    lost = _lost(meta[4] if len(meta) > 4 else 0)
    loss_ns = _loss_ns(meta[5] if len(meta) > 5 else 0)
    parts, pos = _raw_parts(raw_parts, end, len(value))
    if pos != len(value):
        raise RecordError(f"{len(value) - pos} bytes after the last frame")
    return kind, seq, connection, parts, lost, loss_ns


def part_of(value: bytes, raw: RawPart) -> Part:
    """One part of ``read_record_2``'s output, with its bytes."""
    direction, ts_ns, api_key, api_version, corr, redacted, flags, size, pos = raw
    return Part(
        direction,
        _opt(ts_ns) or 0,
        _opt(api_key),
        _opt(api_version),
        _opt(corr),
        value[pos : pos + size],
        tuple(redacted.split(",")) if isinstance(redacted, str) and redacted else (),
        {str(k): str(v) for k, v in flags.items()} if isinstance(flags, dict) else {},
    )


def parse_record_2(value: bytes) -> TapRecord:
    """A schema-2 value (``is_schema_2``) parsed; ``RecordError`` when it does not follow the schema."""
    kind, seq, connection, parts, lost, loss_ns = read_record_2(value)
    parts_ = tuple(part_of(value, raw) for raw in parts)
    return TapRecord(2, kind, seq, connection, parts_, lost=lost, loss_ns=loss_ns)


# --- schema 3: one record per connection flush -----------------------------------------------------------
#
# A schema-3 record holds a connection's exchanges and lone frames of one flush, in the order the tap
# wrote them. Its key is the connection id; its value is
#
#     MAGIC_3 (4 bytes) | meta length (uint32, big-endian) | meta (msgpack) | payload | payload ...
#
# ``meta`` is ``[static, entries, lost, loss_ns]``: ``static`` as in schema 2, once per record instead
# of once per exchange; ``entries`` one ``[kind, seq, parts]`` per exchange, lone frame, lifecycle or
# tap event, each with the schema-2 meaning (``seq`` still numbers them one by one, so a lost record
# leaves a gap of all its entries); ``parts`` as in schema 2, their bytes following in order across all
# entries. ``lost`` counts the connection's entries the tap lost before this record and ``loss_ns`` is
# ``TapFrame.loss_ns`` of all its entries; both are left out while 0 (``lost`` is written when
# ``loss_ns`` is). A reader ignores elements after ``loss_ns``, and after an entry's ``parts``: both
# lists grow at their end.

#: The first bytes of every schema-3 value.
MAGIC_3: Final = b"\xffKT\x03"
#: One entry of a schema-3 record as ``pack_flush`` takes it: kind, ``seq`` and its parts.
Entry = tuple[str, int, Sequence[Part]]


def pack_flush(static: bytes, entries: Sequence[Entry], lost: int = 0, loss_ns: int = 0) -> bytes:
    """A schema-3 record value: a connection's ``entries`` of one flush; ``lost``: the connection's
    entries the tap lost before them; ``loss_ns``: ``TapFrame.loss_ns``."""
    meta: list[Any] = [static, [[kind, seq, [_part_meta(p) for p in parts]] for kind, seq, parts in entries]]
    if lost or loss_ns:
        meta.append(lost)
    if loss_ns:
        meta.append(loss_ns)
    packed = msgpack.packb(meta, use_bin_type=True)
    payloads = (p.value or b"" for _, _, parts in entries for p in parts)
    return b"".join((_PREFIX.pack(MAGIC_3, len(packed)), packed, *payloads))


def read_record_3(value: bytes) -> tuple[Connection, list[tuple[str, int, list[RawPart]]], int, int]:
    """A schema-3 value's metadata, checked against the layout: the connection, each entry's kind,
    ``seq`` and parts (as ``read_record_2`` gives them, with where their bytes are), ``lost`` and
    ``loss_ns``. ``RecordError`` when it does not follow the schema."""
    meta, end = _meta(value)
    if len(meta) < 2 or not isinstance(meta[1], list):
        raise RecordError("metadata is not a list of at least static and entries")
    try:
        connection = _static(meta[0])
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise RecordError(f"unreadable connection metadata: {exc}") from exc
    lost = _lost(meta[2] if len(meta) > 2 else 0)
    loss_ns = _loss_ns(meta[3] if len(meta) > 3 else 0)
    entries: list[tuple[str, int, list[RawPart]]] = []
    pos = end
    for entry in meta[1]:
        if not isinstance(entry, list) or len(entry) < 3:
            raise RecordError(f"entry {len(entries)} is not a list of kind, seq and parts")
        kind, seq, raw_parts = entry[:3]
        if (
            kind not in KINDS
            or not isinstance(seq, int)
            or isinstance(seq, bool)
            or not isinstance(raw_parts, list)
        ):
            raise RecordError(f"entry {len(entries)}: unknown kind {kind!r} or bad sequence number")
        parts, pos = _raw_parts(raw_parts, pos, len(value))
        entries.append((kind, seq, parts))
    if pos != len(value):
        raise RecordError(f"{len(value) - pos} bytes after the last frame")
    return connection, entries, lost, loss_ns


def entries_in(value: bytes | None) -> int:
    """How many entries a tap record holds (what its loss loses): a schema-3 record's entries, else 1."""
    if value is None or value[:4] != MAGIC_3:
        return 1
    try:
        return max(1, len(read_record_3(value)[1]))
    except RecordError:
        return 1


def parse_record_3(value: bytes) -> list[TapRecord]:
    """A schema-3 value as one ``TapRecord`` per entry, each holding the record's ``lost`` and ``loss_ns``."""
    connection, entries, lost, loss_ns = read_record_3(value)
    return [
        TapRecord(3, kind, seq, connection, tuple(part_of(value, raw) for raw in parts), lost, index, loss_ns)
        for index, (kind, seq, parts) in enumerate(entries)
    ]


def parse_records(
    headers: Mapping[str, str] | None, value: bytes | None, partition: int = -1
) -> list[TapRecord]:
    """The records one tap-topic record holds, in order: a ``dir`` header means schema 1 (one frame,
    metadata in headers), a value starting with ``MAGIC`` schema 2 (one exchange), with ``MAGIC_3``
    schema 3 (a connection's flush: one ``TapRecord`` per entry, ``index`` numbering them). Raises
    ``RecordError`` for a record of none of them or a broken value (readers turn that into a
    decode-error frame: ``frames_from_record``)."""
    headers = headers or {}
    direction = headers.get(Header.DIR)
    if direction is None and value is not None:
        if value[:4] == MAGIC:
            return [parse_record_2(value)]
        if value[:4] == MAGIC_3:
            return parse_record_3(value)
    if direction not in DIRECTIONS:
        raise RecordError(f"not a tap record: {Header.DIR} header {direction!r} and no schema-2 or 3 prefix")
    return [_parse_record_1(headers, value, partition)]


def _parse_record_1(headers: Mapping[str, str], value: bytes | None, partition: int) -> TapRecord:
    frame = frame_from_headers(headers, partition)
    flags = {name: headers[name] for name in _FLAG_HEADERS if headers.get(name)}
    redacted = headers.get(Header.REDACTED) or ""
    part = Part(
        frame.direction,
        frame.ts_ns,
        frame.api_key,
        frame.api_version,
        frame.correlation_id,
        value,
        tuple(redacted.split(",")) if redacted else (),
        flags,
    )
    connection = Connection(
        frame.conn, frame.client, frame.broker, frame.broker_id, frame.listener,
        headers.get(Header.TAP, ""), frame.capture,
    )  # fmt: skip
    return TapRecord(1, frame.direction, frame.seq, connection, (part,))


#: The flag headers of schema 1, kept as a part's ``flags``.
_FLAG_HEADERS: Final = (*HEADER_ONLY_FLAGS, Header.ORIG_SIZE, Header.HEADER_ERROR, Header.ERROR)


def record_frames(record: TapRecord, partition: int = -1, offset: int = -1) -> list[tuple[TapFrame, Part]]:
    """Each part of a record as a frame's tap metadata (not decoded) with the part it came from."""
    c = record.connection
    conn = connection_of(c.conn, partition)
    lone = record.schema >= 2 and record.kind == RESP
    return [
        (
            TapFrame(
                conn, record.seq, p.ts_ns, p.direction, p.api_key, p.api_version, p.correlation_id,
                c.client, c.broker, c.broker_id, c.listener, partition, offset, None, None, c.capture,
                None, record.lost, lone, record.index, record.loss_ns,
            ),
            p,
        )
        for p in record.parts
    ]  # fmt: skip


def record_time_ns(headers: Mapping[str, str] | None, value: bytes | None) -> int | None:
    """When the tap wrote a record (its last frame's clock): the order readers merge partitions in.
    None for a record of neither schema."""
    try:
        records = parse_records(headers, value)
    except RecordError:
        return None
    return max((part.ts_ns for record in records for part in record.parts), default=None)


def frames_from_record(
    headers: Mapping[str, str] | None,
    value: bytes | None,
    partition: int = -1,
    offset: int = -1,
    fields: Iterable[str] | None = None,
) -> list[TapFrame]:
    """Every frame of one tap record of either schema, decoded. Never raises for bad input: a record
    that follows no schema becomes one undecodable request on its connection (or on
    ``untracked-p<partition>``), so it is reported, not ignored."""
    try:
        records = parse_records(headers, value, partition)
    except RecordError as exc:
        conn = (headers or {}).get(Header.CONN)
        frame = TapFrame(connection_of(conn, partition), 0, 0, REQ, partition=partition, offset=offset)
        frame.error = DecodeError(str(exc), 0)
        return [frame]
    return [
        decode_frame(frame, part.value, truncated=part.header_only, fields=fields)
        for record in records
        for frame, part in record_frames(record, partition, offset)
    ]


# --- connection ids and tap events -------------------------------------------------------------------
#
# A connection id is ``<prefix>.<incarnation>-<n>``: ``prefix`` is the tap instance id (with ``-<worker>``
# in a worker process), ``n`` numbers the process's connections from 1, and ``incarnation`` is the
# tap-host clock, in milliseconds rounded up and written in base 36, of the newest event after which
# the process may have lost records: its start, or a loss it learnt of since (a worker of its tap died,
# its queue refused a record, a delivery failed). So ids are unique across restarts with any instance
# id, and a reader knows from the id alone, in any layout and with no state, that whatever a client sent
# before that time may be missing from the tap topic (``incarnation_ns``).
#
# Tap events are records about the tap itself (kinds ``TAP_EVENTS``): one part of that direction whose
# value is a JSON object, ``seq`` 1, no ``lost``, and as ``static`` a ``Connection`` whose ``conn`` names
# the connections concerned (``<prefix>.<incarnation>`` for a start, the dead worker's ``<prefix>`` for
# ``worker_lost``) and whose ``tap`` is the instance id. The record's key is that ``conn``.

_BASE36: Final = "0123456789abcdefghijklmnopqrstuvwxyz"
_CONNECTION_ID: Final = re.compile(r"\.([0-9a-z]{1,12})-[0-9]+\Z")


def incarnation(ts_ns: int) -> str:
    """The incarnation of a tap process whose latest start or loss was at ``ts_ns``."""
    number = -(-ts_ns // 1_000_000)
    out = ""
    while True:
        number, rest = divmod(number, 36)
        out = _BASE36[rest] + out
        if not number:
            return out


def connection_id(prefix: str, incarnation: str, number: int) -> str:
    return f"{prefix}.{incarnation}-{number}"


def tap_loss_ns(frame: TapFrame) -> int:
    """When the tap last may have lost records before it wrote ``frame`` (0: not known): whatever its
    clients sent before that may be missing from the tap topic, unless it came on this very connection
    (whose own losses ``TapFrame.lost`` counts)."""
    return max(frame.loss_ns, incarnation_ns(frame.conn))


def incarnation_ns(conn: str) -> int:
    """When the tap that opened ``conn`` last started or lost records before opening it (ns, rounded
    up to the millisecond); 0 for an id of another form (an older tap's, a capture's)."""
    found = _CONNECTION_ID.search(conn)
    return int(found.group(1), 36) * 1_000_000 if found else 0


def pack_tap_event(kind: str, conn: str, instance: str, ts_ns: int, info: Mapping[str, Any]) -> bytes:
    """A tap event's record value (``kind`` one of ``TAP_EVENTS``); its key is ``conn``."""
    static = pack_static(Connection(conn, tap=instance))
    body = json.dumps({"tap": instance, "connections": conn, **info}, default=str).encode()
    return pack_flush(static, [(kind, 1, (Part(kind, ts_ns, None, None, None, body),))])


def tap_event_info(frame: TapFrame) -> dict[str, Any]:
    """The JSON object of a tap event's frame (``raw``), {} when it has none or it is not an object."""
    try:
        info = json.loads(frame.raw or b"{}")
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}
