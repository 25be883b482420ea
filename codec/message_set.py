"""Legacy message sets (magic 0 and 1), as written before Kafka 0.11.

Each entry: offset int64, message size int32 (bytes after itself), crc int32 (CRC-32 over magic..end),
magic int8, attributes int8 (bits 0-2 compression, bit 3 timestamp type in v1), timestamp int64 (v1
only), key and value (int32 length, -1 for null). A compressed message is a wrapper whose value is an
inner message set; in v1 the inner offsets are relative (0..n-1) and the wrapper carries the absolute
offset of the last inner message.

Only the fixed header is read eagerly; key, value and inner messages are decoded on demand.

Stripped format (the tap's ``headers`` capture policy): offset, crc, magic, attributes and (v1)
timestamp are kept, key and value are dropped, and the message size is rewritten to 6 (v0) or 14 (v1);
the crc is left unchanged and so no longer validates.

Magic-0 lz4 wrappers carry the old clients' wrong lz4 header checksum (KAFKA-3160); it is repaired
before decompressing, and ``build_message_set`` writes it the same wrong way.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

from codec.compression import Codec, codec_name, compress, decompress, legacy_lz4_header
from codec.errors import DecodeError
from codec.record import Record

#: The shortest message size (after the size field) per magic: a stripped message.
LEGACY_MIN_HEADER = {0: 6, 1: 14}
_FULL_MIN = {0: 14, 1: 22}
_ENTRY = struct.Struct(">qiIbb")  # offset, size, crc, magic, attributes
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_SIZE_AT = 8
_CRC_FROM = 16
TIMESTAMP_TYPE_BIT = 0x08


class LegacyMessage:
    """One magic-0/1 message (possibly a compressed wrapper) in a ``records`` field."""

    __slots__ = (
        "attributes",
        "compression",
        "compression_name",
        "crc",
        "magic",
        "message_size",
        "offset",
        "payload_stripped",
        "raw",
        "timestamp",
        "timestamp_type",
    )

    # Batch-header fields that legacy formats lack, so callers can treat both kinds alike.
    producer_id = -1
    producer_epoch = -1
    base_sequence = -1
    is_transactional = False
    is_control = False

    def __init__(self, raw: bytes, offset: int | None = None) -> None:
        stored_offset, self.message_size, self.crc, magic, attributes = _ENTRY.unpack_from(raw)
        self.raw = raw
        self.offset = stored_offset if offset is None else offset
        self.magic = magic
        self.attributes = attributes
        self.compression = attributes & 0x07
        self.compression_name = codec_name(self.compression)
        self.timestamp_type = (attributes & TIMESTAMP_TYPE_BIT) >> 3 if magic == 1 else None
        self.timestamp = _I64.unpack_from(raw, 18)[0] if magic == 1 else None
        self.payload_stripped = self.message_size == LEGACY_MIN_HEADER[magic]

    @property
    def base_offset(self) -> int:
        return self.offset

    @property
    def record_count(self) -> int | None:
        """1 for a plain message; None for a wrapper (counting would mean decompressing)."""
        return None if self.compression else 1

    def crc_valid(self) -> bool:
        return zlib.crc32(self.raw[_CRC_FROM:]) == self.crc

    def key_value(self) -> tuple[bytes | None, bytes | None]:
        if self.payload_stripped:
            raise DecodeError("record payload stripped by capture policy", len(self.raw), what="message set")
        b, n = self.raw, len(self.raw)
        p = 18 if self.magic == 0 else 26
        key, p = _bytes(b, p, n)
        value, p = _bytes(b, p, n)
        if p != n:
            raise DecodeError(f"{n - p} bytes left after the message value", p, what="message set")
        return key, value

    @property
    def key(self) -> bytes | None:
        return self.key_value()[0]

    @property
    def value(self) -> bytes | None:
        return self.key_value()[1]

    def messages(self, max_size: int | None = None) -> list[LegacyMessage]:
        """The inner messages with absolute offsets (decompressed), or [self] for a plain message."""
        if not self.compression:
            return [self]
        if self.compression > 3:
            raise DecodeError(f"codec {self.compression_name} is invalid for magic {self.magic}", 17)
        wrapped = self.value
        if wrapped is None:
            raise DecodeError("compressed wrapper message has a null value", 0, what="message set")
        if self.magic == 0 and self.compression == Codec.LZ4:
            wrapped = legacy_lz4_header(wrapped)
        inner = decompress(self.compression, wrapped, max_size, what="message set")
        out = parse_message_set(inner)
        if any(m.compression for m in out):
            raise DecodeError("nested compressed message", 0, what="message set")
        if self.magic == 1 and out:
            # v1 inner offsets are relative; the wrapper holds the last one's absolute offset. A
            # producer's wrapper (offset 0 or anything below the last relative offset) has no
            # absolute offsets yet, so like the Java client keep the relative ones then.
            shift = self.offset - out[-1].offset
            if shift >= 0:
                for m in out:
                    m.offset += shift
        return out

    def records(self, max_size: int | None = None) -> list[Record]:
        """The messages as ``Record`` objects (offset_delta 0, base_offset = the absolute offset)."""
        out = []
        # A LogAppendTime wrapper's timestamp overrides its inner messages' (as the Java client reads it).
        wrapper_ts = self.timestamp if self.compression and self.timestamp_type == 1 else None
        for m in self.messages(max_size):
            key, value = m.key_value()
            ts = wrapper_ts if wrapper_ts is not None else m.timestamp if m.timestamp is not None else -1
            out.append(Record(m.attributes, 0, 0, key, value, [], m.offset, ts))
        return out

    def control_records(self) -> list[Any]:
        return []

    def __repr__(self) -> str:
        return f"LegacyMessage(offset={self.offset}, magic={self.magic}, compression={self.compression_name})"


def _bytes(b: bytes, p: int, n: int) -> tuple[bytes | None, int]:
    if p + 4 > n:
        raise DecodeError("truncated length", p, what="message set")
    (size,) = _I32.unpack_from(b, p)
    p += 4
    if size < 0:
        return None, p
    if size > n - p:
        raise DecodeError(f"field of {size} bytes exceeds the {n - p} left", p - 4, what="message set")
    return b[p : p + size], p + size


def parse_legacy(raw: bytes, at: int = 0) -> LegacyMessage:
    """One complete entry (offset, size and the ``size`` bytes after it); ``DecodeError`` if malformed."""
    if len(raw) < _CRC_FROM + 1:
        raise DecodeError("truncated message header", at, what="message set")
    magic = raw[16]
    if magic not in LEGACY_MIN_HEADER:
        raise DecodeError(f"magic {magic} is not a legacy message", at + 16, what="message set")
    (size,) = _I32.unpack_from(raw, _SIZE_AT)
    if size < LEGACY_MIN_HEADER[magic] or size + 12 != len(raw):
        raise DecodeError(f"bad message size {size}", at + _SIZE_AT, what="message set")
    return LegacyMessage(raw)


def parse_message_set(raw: bytes) -> list[LegacyMessage]:
    """A complete legacy message set (as inside a wrapper): no partial tail allowed."""
    out = []
    p, n = 0, len(raw)
    while p < n:
        if n - p < 12:
            raise DecodeError("truncated message in message set", p, what="message set")
        (size,) = _I32.unpack_from(raw, p + _SIZE_AT)
        if size < 0 or size > n - p - 12:
            raise DecodeError(
                f"message size {size} exceeds the {n - p - 12} bytes left", p + 8, what="message set"
            )
        out.append(parse_legacy(raw[p : p + 12 + size], p))
        p += 12 + size
    return out


def strip_legacy(raw: bytes) -> bytes:
    """One entry in the stripped format (see the module docstring)."""
    size = LEGACY_MIN_HEADER[raw[16]]
    return raw[:_SIZE_AT] + _I32.pack(size) + raw[12 : 12 + size]


# --- building -----------------------------------------------------------------------------------


def encode_message(
    offset: int, magic: int, attributes: int, timestamp: int, key: bytes | None, value: bytes | None
) -> bytes:
    body = bytearray(struct.pack(">bb", magic, attributes))
    if magic == 1:
        body += _I64.pack(timestamp)
    for field in (key, value):
        if field is None:
            body += _I32.pack(-1)
        else:
            body += _I32.pack(len(field)) + field
    crc = zlib.crc32(body)
    return _I64.pack(offset) + _I32.pack(len(body) + 4) + struct.pack(">I", crc) + bytes(body)


def build_message_set(
    messages: Iterable[Sequence[Any]],
    magic: int = 1,
    compression: int = 0,
    base_offset: int = 0,
    timestamp: int = 0,
    timestamp_type: int = 0,
) -> bytes:
    """A legacy message set; ``messages`` are (key, value) or (key, value, timestamp)."""
    ts_bit = TIMESTAMP_TYPE_BIT if timestamp_type and magic == 1 else 0
    specs = list(messages)
    if not compression:
        return b"".join(
            encode_message(base_offset + i, magic, ts_bit, s[2] if len(s) > 2 else timestamp, s[0], s[1])
            for i, s in enumerate(specs)
        )
    inner = b"".join(
        encode_message(
            i if magic == 1 else base_offset + i, magic, 0, s[2] if len(s) > 2 else timestamp, s[0], s[1]
        )
        for i, s in enumerate(specs)
    )
    wrapper_ts = max((s[2] if len(s) > 2 else timestamp for s in specs), default=timestamp)
    last = base_offset + max(len(specs) - 1, 0)
    payload = compress(compression, inner)
    if magic == 0 and compression == Codec.LZ4:
        payload = legacy_lz4_header(payload, broken=True)  # as magic-0 era clients wrote it
    return encode_message(last, magic, compression | ts_bit, wrapper_ts, None, payload)
