"""The value of a ``records`` field: record batches (magic 2) and legacy message sets (magic 0/1).

``RecordBatches.from_bytes`` reads batch headers only, one precompiled struct unpack per batch,
because the streaming path runs it on every Produce and Fetch partition. Records are decoded, and
decompressed, only when ``RecordBatch.records()`` is called. See docs/codec-records.md.

Stripped format (the tap's ``headers`` capture policy, ``strip_payloads``): each v2 batch keeps its
61-byte header unchanged except batchLength, rewritten to 49 (the header-only length), and loses its
records section; the CRC is left as it was, so it no longer validates. Legacy messages: see
``codec.message_set``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import crc32c as _crc32c

from codec.compression import codec_name, compress, decompress
from codec.control import ControlRecord, decode_control
from codec.errors import DecodeError
from codec.message_set import LEGACY_MIN_HEADER, LegacyMessage, parse_legacy, strip_legacy
from codec.record import Record

#: baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
#: baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount.
HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
#: batchLength counts the bytes after itself.
LOG_OVERHEAD = 12
STRIPPED_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49
_CRC_FROM = 21  # attributes onwards
_LENGTH = struct.Struct(">i")
_CRC = struct.Struct(">I")

TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40
#: Precomputed: the header parse runs on every Produce/Fetch partition.
_CODEC_NAMES = tuple(codec_name(i) for i in range(8))


class RecordBatch:
    """A magic-2 batch header; records are decoded on demand.

    The header is one struct unpack; the flags and the codec name derive from ``attributes`` when read.
    ``raw`` (the batch's bytes) is sliced from the buffer it was read from only when first asked for.
    """

    __slots__ = (
        "_buf",
        "_end",
        "_raw",
        "_start",
        "attributes",
        "base_offset",
        "base_sequence",
        "base_timestamp",
        "batch_length",
        "crc",
        "last_offset_delta",
        "magic",
        "max_timestamp",
        "partition_leader_epoch",
        "producer_epoch",
        "producer_id",
        "record_count",
    )
    _raw: bytes | None

    def __init__(self, raw: bytes, fields: tuple[int, ...], start: int = 0, end: int | None = None) -> None:
        """``fields`` is ``HEADER.unpack_from(raw, start)``; the batch is ``raw[start:end]``."""
        (
            self.base_offset,
            self.batch_length,
            self.partition_leader_epoch,
            self.magic,
            self.crc,
            self.attributes,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.record_count,
        ) = fields
        self._buf = raw
        self._start = start
        self._end = len(raw) if end is None else end
        self._raw = raw if start == 0 and end is None else None

    @property
    def raw(self) -> bytes:
        raw = self._raw
        if raw is None:
            buf = self._buf
            raw = buf if self._start == 0 and self._end == len(buf) else buf[self._start : self._end]
            # Keep only the batch's own bytes from now on, not the frame it was read from.
            self._raw = self._buf = raw
            self._start, self._end = 0, len(raw)
        return raw

    @property
    def compression(self) -> int:
        return self.attributes & 0x07

    @property
    def compression_name(self) -> str:
        return _CODEC_NAMES[self.attributes & 0x07]

    @property
    def timestamp_type(self) -> int:
        return (self.attributes & TIMESTAMP_TYPE_BIT) >> 3

    @property
    def is_transactional(self) -> bool:
        return self.attributes & TRANSACTIONAL_BIT != 0

    @property
    def is_control(self) -> bool:
        return self.attributes & CONTROL_BIT != 0

    @property
    def has_delete_horizon(self) -> bool:
        return self.attributes & DELETE_HORIZON_BIT != 0

    @property
    def payload_stripped(self) -> bool:
        return self.batch_length == STRIPPED_LENGTH and self.record_count > 0

    @property
    def delete_horizon(self) -> int | None:
        """When the delete-horizon bit is set, baseTimestamp carries the delete horizon instead."""
        return self.base_timestamp if self.attributes & DELETE_HORIZON_BIT else None

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    def crc_valid(self) -> bool:
        """CRC-32C over attributes..end matches the stored crc."""
        return _crc32c.crc32c(self.raw[_CRC_FROM:]) == self.crc

    def records(self, max_size: int | None = None) -> list[Record]:
        """The batch's records, decompressed when needed (``max_size`` caps the decompressed size)."""
        if self.payload_stripped:
            raise DecodeError("record payload stripped by capture policy", HEADER_SIZE, what="record batch")
        section = self.raw[HEADER_SIZE:]
        compression = self.attributes & 0x07
        if compression:
            section = decompress(compression, section, max_size, what="record batch")
        return _parse_records(section, self.record_count, self.base_offset, self.base_timestamp)

    def control_records(self) -> list[ControlRecord]:
        """The control records (transaction markers) of a control batch; [] for a data batch."""
        if not self.is_control:
            return []
        return [decode_control(r.key, r.value, r.offset) for r in self.records()]

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        # Pickle the batch's bytes, not the whole frame it may still point into.
        return _batch_of, (self.raw,)

    def __repr__(self) -> str:
        return (
            f"RecordBatch(base_offset={self.base_offset}, producer_id={self.producer_id}, "
            f"producer_epoch={self.producer_epoch}, base_sequence={self.base_sequence}, "
            f"record_count={self.record_count}, attributes={self.attributes:#x})"
        )


def _batch_of(raw: bytes) -> RecordBatch:
    return RecordBatch(raw, HEADER.unpack_from(raw, 0))


class RecordBatches:
    """The decoded value of a ``records`` field; compares and serialises as its raw bytes.

    Built by :func:`section` (the codec, for every Produce and Fetch partition) or
    :meth:`from_bytes`. A section of magic-2 batches is checked when it is built (every batch length
    and magic byte, so malformed input still fails the decode), but its batch headers are parsed on
    the first access to ``batches`` (or iteration, ``len``), and ``raw`` is sliced from the frame only
    when asked for: until then the value points into the frame's bytes.
    """

    __slots__ = ("_batches", "_buf", "_end", "_raw", "_start", "_tail_at")
    _raw: bytes | None
    _batches: list[RecordBatch | LegacyMessage] | None

    def __init__(
        self, raw: bytes, batches: list[RecordBatch | LegacyMessage] | None, partial_tail: bytes
    ) -> None:
        self._raw = self._buf = raw
        self._start, self._end = 0, len(raw)
        self._batches = batches
        self._tail_at = len(raw) - len(partial_tail)

    @classmethod
    def from_bytes(cls, raw: bytes) -> RecordBatches:
        raw = bytes(raw)
        return section(raw, 0, len(raw))

    @property
    def raw(self) -> bytes:
        raw = self._raw
        if raw is None:
            buf, start = self._buf, self._start
            raw = buf if start == 0 and self._end == len(buf) else buf[start : self._end]
            if self._batches is None:
                # Not parsed yet: from now on point into the section's own bytes, not the frame's.
                self._buf, self._tail_at = raw, self._tail_at - start
                self._start, self._end = 0, len(raw)
            self._raw = raw
        return raw

    @property
    def batches(self) -> list[RecordBatch | LegacyMessage]:
        batches = self._batches
        if batches is None:
            # section() checked every length and magic byte: each batch is a whole magic-2 batch.
            buf, p, stop = self._buf, self._start, self._tail_at
            batches = []
            unpack, length_at = HEADER.unpack_from, _LENGTH.unpack_from
            while p < stop:
                end = p + LOG_OVERHEAD + length_at(buf, p + 8)[0]
                batches.append(RecordBatch(buf, unpack(buf, p), p, end))
                p = end
            self._batches = batches
        return batches

    @property
    def partial_tail(self) -> bytes:
        """Bytes after the last whole batch (Fetch responses may cut a batch anywhere)."""
        return self._buf[self._tail_at : self._end]

    @staticmethod
    def build(records: Sequence[Any], **kwargs: Any) -> RecordBatches:
        return RecordBatches.from_bytes(build_record_batch(records, **kwargs))

    def __bytes__(self) -> bytes:
        return self.raw

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordBatches):
            return self.raw == other.raw
        if isinstance(other, bytes | bytearray):
            return self.raw == bytes(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.raw)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[RecordBatch | LegacyMessage]:
        return iter(self.batches)

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        # Pickle the section's bytes, not the whole frame it may still point into.
        return RecordBatches.from_bytes, (self.raw,)

    def __repr__(self) -> str:
        tail = self._end - self._tail_at
        tail_text = f", partial_tail={tail}B" if tail else ""
        return f"RecordBatches({self._end - self._start}B, {len(self.batches)} batches{tail_text})"


def lazy_section(buf: bytes, start: int, end: int, tail: int) -> RecordBatches:
    """``buf[start:end]`` as a section whose whole magic-2 batches end at ``tail``, checked by the
    caller and parsed on first read, pointing into ``buf`` (no copy)."""
    rb = RecordBatches(buf, None, b"")
    rb._start = start
    rb._end = end
    rb._tail_at = tail
    rb._raw = None
    return rb


def section(buf: bytes, start: int, end: int) -> RecordBatches:
    """The records field ``buf[start:end]``, without copying it (the codec calls this per partition).

    The generated decoders build the first branch's case (one whole magic-2 batch) themselves, in
    their partition loop, from :func:`one_batch_source`: a change here must be made there too (both
    are in this module, and tests/codec/test_records.py compares the two).

    A section of whole magic-2 batches (plus a cut-off tail) is only checked here; its headers are
    parsed when first read. Anything else (legacy message sets, a malformed length or magic byte) is
    parsed now by :func:`_parse_section`, which raises the ``DecodeError``.
    """
    size = end - start
    # The commonest section by far (every Produce partition): exactly one whole magic-2 batch.
    if size >= HEADER_SIZE and buf[start + 16] == 2 and _length_at(buf, start + 8)[0] == size - LOG_OVERHEAD:
        tail = end
    else:
        tail = _scan(buf, start, end)
        if tail < 0:
            return _parse_section(buf[start:end])
    return lazy_section(buf, start, end, tail)


_length_at = _LENGTH.unpack_from
#: ``(batchLength,)`` at an offset: the generated decoders' copy of ``section``'s test.
batch_length_at = _length_at


def one_batch_source(target: str) -> tuple[str, str]:
    """``section``'s commonest case as Python source for the generated decoders (``codec.compiler``),
    which test for it in their partition loop instead of calling ``section``: the call and its own test
    were about a fifth of what a partition's records field cost. Reads ``b``, ``p``, ``e`` and ``n``
    (the field's bytes, its start, end and size) and the names ``_lazy`` (:func:`lazy_section`) and
    ``_blen`` (:data:`batch_length_at`). Returns (the test, the statement that builds ``target``)."""
    test = f"n >= {HEADER_SIZE} and b[p + 16] == 2 and _blen(b, p + 8)[0] == n - {LOG_OVERHEAD}"
    return test, f"{target} = _lazy(b, p, e, e)"


def _scan(buf: bytes, p: int, end: int) -> int:
    """Where the whole magic-2 batches from ``p`` end (a cut-off tail may follow), or -1 when an entry
    is not a well-formed magic-2 batch."""
    while end - p >= LOG_OVERHEAD:
        (length,) = _length_at(buf, p + 8)
        q = p + LOG_OVERHEAD + length
        if q > end:
            break  # a partial tail (a negative length never gets here: q < end)
        if length < STRIPPED_LENGTH or buf[p + 16] != 2:
            return -1
        p = q
    return p


def _parse_section(raw: bytes) -> RecordBatches:
    """Parse every batch header of ``raw`` now: legacy message sets and malformed sections."""
    batches: list[RecordBatch | LegacyMessage] = []
    p, n = 0, len(raw)
    unpack, length_at = HEADER.unpack_from, _LENGTH.unpack_from
    while p < n:
        if n - p < LOG_OVERHEAD:
            break  # Fetch responses may cut the last batch anywhere
        (length,) = length_at(raw, p + 8)
        end = p + LOG_OVERHEAD + length
        if length < 0:
            raise DecodeError(f"negative batch length {length}", p + 8, what="record batch")
        if end > n:
            break
        if length < 5:
            raise DecodeError(
                f"batch length {length} is too short to hold a magic byte", p + 8, what="records"
            )
        magic = raw[p + 16]
        if magic == 2:
            if length < STRIPPED_LENGTH:
                raise DecodeError(
                    f"batch length {length} is shorter than a v2 header", p + 8, what="record batch"
                )
            batches.append(RecordBatch(raw, unpack(raw, p), p, end))
        elif magic in (0, 1):
            if length < LEGACY_MIN_HEADER[magic]:
                raise DecodeError(
                    f"message size {length} too short for magic {magic}", p + 8, what="message set"
                )
            batches.append(parse_legacy(raw[p:end], p))
        else:
            raise DecodeError(f"unknown magic byte {magic}", p + 16, what="records")
        p = end
    return RecordBatches(raw, batches, raw[p:])


def strip_payloads(raw: bytes) -> bytes:
    """``raw`` with every batch's records (and legacy key/value) dropped; see the module docstring."""
    parsed = RecordBatches.from_bytes(raw)
    out = bytearray()
    for batch in parsed.batches:
        if isinstance(batch, RecordBatch):
            _stripped_v2_into(out, batch._buf, batch._start)  # no copy of the batch's payload
        else:
            out += strip_legacy(batch.raw)
    tail = parsed.partial_tail
    if len(tail) >= 17 and tail[16] == 2:
        out += _stripped_v2(tail) if len(tail) >= HEADER_SIZE else b""
    elif len(tail) >= 17 and tail[16] in (0, 1):
        out += strip_legacy(tail) if len(tail) >= LEGACY_MIN_HEADER[tail[16]] + LOG_OVERHEAD else b""
    return bytes(out)


def batch_headers(records: RecordBatches) -> bytes:
    """``records`` as the facts the checks read: every batch header, the records of control batches
    (their transaction markers), and no data payloads. ``RecordBatches.from_bytes`` reads it back with
    the same batch headers (data batches marked ``payload_stripped``)."""
    out = bytearray()
    for batch in records.batches:
        if isinstance(batch, RecordBatch):
            if batch.attributes & CONTROL_BIT:
                out += batch.raw
            else:
                # Straight from the buffer the batch points into: a data batch's bytes are never
                # copied just to keep their first 61.
                _stripped_v2_into(out, batch._buf, batch._start)
        else:
            out += strip_legacy(batch.raw)
    return bytes(out)


_STRIPPED_LENGTH_BYTES = _LENGTH.pack(STRIPPED_LENGTH)


def _stripped_v2(raw: bytes) -> bytes:
    return raw[:8] + _STRIPPED_LENGTH_BYTES + raw[LOG_OVERHEAD:HEADER_SIZE]


def _stripped_v2_into(out: bytearray, buf: bytes, start: int) -> None:
    out += buf[start : start + 8]
    out += _STRIPPED_LENGTH_BYTES
    out += buf[start + LOG_OVERHEAD : start + HEADER_SIZE]


# --- varints ------------------------------------------------------------------------------------


def _varint(b: bytes, p: int, end: int, max_bytes: int) -> tuple[int, int]:
    """A zigzag varint at ``p``, and the position after it."""
    shift = result = 0
    for i in range(max_bytes):
        if p + i >= end:
            raise DecodeError("truncated varint", p, what="record")
        byte = b[p + i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), p + i + 1
        shift += 7
    raise DecodeError("varint too long", p, what="record")


def _write_varint(out: bytearray, value: int) -> None:
    z = (value << 1) ^ (value >> 63)
    z &= (1 << 64) - 1
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)


def _bytes_field(b: bytes, p: int, end: int, what: str) -> tuple[bytes | None, int]:
    n, p = _varint(b, p, end, 5)
    if n < 0:
        return None, p
    if n > end - p:
        raise DecodeError(f"{what} of {n} bytes exceeds the {end - p} left in the record", p, what="record")
    return b[p : p + n], p + n


def _parse_records(b: bytes, count: int, base_offset: int, base_timestamp: int) -> list[Record]:
    n = len(b)
    # Every record takes at least 7 bytes, so a count beyond that is a lie, not a reason to loop.
    if count < 0 or count > n:
        raise DecodeError(f"record count {count} does not fit in {n} bytes", 0, what="record batch")
    out: list[Record] = []
    p = 0
    for _ in range(count):
        size, p = _varint(b, p, n, 5)
        end = p + size
        if size < 0 or end > n:
            raise DecodeError(f"record length {size} exceeds the {n - p} bytes left", p, what="record")
        if p >= end:
            raise DecodeError("empty record", p, what="record")
        attributes = b[p]
        ts_delta, q = _varint(b, p + 1, end, 10)
        off_delta, q = _varint(b, q, end, 5)
        key, q = _bytes_field(b, q, end, "key")
        value, q = _bytes_field(b, q, end, "value")
        nheaders, q = _varint(b, q, end, 5)
        if nheaders < 0 or nheaders > end - q:
            raise DecodeError(f"header count {nheaders} does not fit in the record", q, what="record")
        headers: list[tuple[str, bytes | None]] = []
        for _ in range(nheaders):
            hkey, q = _bytes_field(b, q, end, "header key")
            if hkey is None:
                raise DecodeError("null header key", q, what="record")
            try:
                name = hkey.decode()
            except UnicodeDecodeError:
                raise DecodeError("header key is not UTF-8", q, what="record") from None
            hval, q = _bytes_field(b, q, end, "header value")
            headers.append((name, hval))
        if q != end:
            raise DecodeError(f"record declared {size} bytes but used {q - p}", p, what="record")
        out.append(Record(attributes, ts_delta, off_delta, key, value, headers, base_offset, base_timestamp))
        p = end
    if p != n:
        raise DecodeError(f"{n - p} bytes left after {count} records", p, what="record batch")
    return out


# --- building -----------------------------------------------------------------------------------

RecordSpec = Sequence[Any]
"""(key, value), (key, value, headers) or (key, value, headers, timestamp_delta)."""


def encode_records(records: Iterable[RecordSpec]) -> tuple[bytes, int, int]:
    """The uncompressed records section, the record count and the largest timestamp delta."""
    out = bytearray()
    count = max_delta = 0
    for i, spec in enumerate(records):
        key, value = spec[0], spec[1]
        headers: Sequence[tuple[str, bytes | None]] = spec[2] if len(spec) > 2 and spec[2] else ()
        ts_delta = int(spec[3]) if len(spec) > 3 else 0
        body = bytearray(b"\x00")
        _write_varint(body, ts_delta)
        _write_varint(body, i)
        for field in (key, value):
            if field is None:
                _write_varint(body, -1)
            else:
                _write_varint(body, len(field))
                body += field
        _write_varint(body, len(headers))
        for hkey, hval in headers:
            encoded = hkey.encode()
            _write_varint(body, len(encoded))
            body += encoded
            if hval is None:
                _write_varint(body, -1)
            else:
                _write_varint(body, len(hval))
                body += hval
        _write_varint(out, len(body))
        out += body
        count += 1
        max_delta = max(max_delta, ts_delta)
    return bytes(out), count, max_delta


def build_record_batch(
    records: Iterable[RecordSpec],
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
    compression: int = 0,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    base_timestamp: int = 0,
    timestamp_type: int = 0,
    delete_horizon: bool = False,
) -> bytes:
    """A valid magic-2 batch (correct batchLength and CRC-32C)."""
    section, count, max_delta = encode_records(records)
    if compression:
        section = compress(compression, section)
    attributes = (
        compression
        | (TIMESTAMP_TYPE_BIT if timestamp_type else 0)
        | (TRANSACTIONAL_BIT if transactional else 0)
        | (CONTROL_BIT if control else 0)
        | (DELETE_HORIZON_BIT if delete_horizon else 0)
    )
    header = bytearray(
        HEADER.pack(
            base_offset,
            STRIPPED_LENGTH + len(section),
            partition_leader_epoch,
            2,
            0,
            attributes,
            max(count - 1, 0),
            base_timestamp,
            base_timestamp + max_delta,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
    )
    crc = _crc32c.crc32c(bytes(header[_CRC_FROM:]) + section)
    _CRC.pack_into(header, 17, crc)
    return bytes(header) + section
