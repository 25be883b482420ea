"""Kafka's record compression codecs, with bounded decompression.

Codec ids are the three low bits of a batch's (or legacy wrapper message's) attributes:
0 none, 1 gzip, 2 snappy, 3 lz4 (frame format), 4 zstd.

Every decompression is capped: a payload that would expand beyond ``max_size`` raises
``DecodeError`` before (snappy, gzip) or as soon as (lz4, zstd: fixed-size output buffer) the cap is
hit, so a zip bomb in a captured frame cannot exhaust the streaming job's memory.

Snappy comes in two framings on the wire: the Java client writes xerial's stream format
(``\\x82SNAPPY\\x00``, int32 version, int32 compatible version, then int32-length-prefixed raw snappy
blocks); librdkafka may write one plain raw snappy block. Both are read; ``compress`` writes xerial
like the Java client.
"""

from __future__ import annotations

import enum
import struct
import zlib

import cramjam

from codec.errors import DecodeError

MIB = 1 << 20
#: Hard ceiling on one decompressed payload.
MAX_DECOMPRESSED = 64 * MIB
#: Expansion allowed relative to the compressed size; the 1 MiB floor keeps small but legitimately
#: very compressible batches (repeated values) readable.
RATIO = 256
FLOOR = MIB

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")
_XERIAL_BLOCK = 32 * 1024
_I32 = struct.Struct(">i")


class Codec(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


def codec_name(codec_id: int) -> str:
    """``none``/``gzip``/``snappy``/``lz4``/``zstd``, or ``unknown(n)`` for the reserved ids 5-7."""
    try:
        return Codec(codec_id).name.lower()
    except ValueError:
        return f"unknown({codec_id})"


def default_max_size(compressed_len: int) -> int:
    """The default decompression cap for a payload of ``compressed_len`` bytes."""
    return min(MAX_DECOMPRESSED, max(FLOOR, RATIO * compressed_len))


def decompress(codec_id: int, data: bytes, max_size: int | None = None, what: str = "compression") -> bytes:
    """``data`` decompressed with ``codec_id``; ``DecodeError`` when corrupt or larger than ``max_size``."""
    cap = default_max_size(len(data)) if max_size is None else max(max_size, 0)
    if codec_id == Codec.NONE:
        if len(data) > cap:
            raise DecodeError(f"payload of {len(data)} bytes exceeds the cap of {cap}", 0, what=what)
        return bytes(data)
    if codec_id == Codec.GZIP:
        return _gunzip(data, cap, what)
    if codec_id == Codec.SNAPPY:
        return _unsnappy(data, cap, what)
    if codec_id in (Codec.LZ4, Codec.ZSTD):
        return _into_buffer(codec_id, data, cap, what)
    raise DecodeError(f"unknown compression codec {codec_id}", 0, what=what)


def compress(codec_id: int, data: bytes) -> bytes:
    """``data`` compressed the way the Java client writes it (gzip member, xerial snappy, lz4 frame)."""
    if codec_id == Codec.NONE:
        return bytes(data)
    if codec_id == Codec.GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()
    if codec_id == Codec.SNAPPY:
        out = bytearray(_XERIAL_HEADER.pack(XERIAL_MAGIC, 1, 1))
        for i in range(0, len(data), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(data[i : i + _XERIAL_BLOCK]))
            out += _I32.pack(len(block)) + block
        return bytes(out)
    if codec_id == Codec.LZ4:
        # Independent blocks: Kafka's Java reader (KafkaLZ4BlockInputStream) rejects linked ones.
        lz = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
        lz.compress(data)
        return bytes(lz.finish())
    if codec_id == Codec.ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown compression codec {codec_id}")


def _too_big(cap: int, what: str) -> DecodeError:
    return DecodeError(f"decompressed size exceeds the cap of {cap} bytes", 0, what=what)


def _gunzip(data: bytes, cap: int, what: str) -> bytes:
    out = bytearray()
    rest = bytes(data)
    # Java's GZIPInputStream reads concatenated members, so a producer may legally send several.
    while True:
        d = zlib.decompressobj(47)  # 32 + 15: accept gzip or zlib headers
        try:
            chunk = d.decompress(rest, cap - len(out) + 1)
        except zlib.error as e:
            raise DecodeError(f"gzip: {e}", 0, what=what) from None
        out += chunk
        if len(out) > cap or d.unconsumed_tail:
            raise _too_big(cap, what)
        if not d.eof:
            raise DecodeError("gzip: truncated stream", len(data) - len(rest), what=what)
        rest = d.unused_data
        if not rest.strip(b"\x00"):
            return bytes(out)


def _unsnappy(data: bytes, cap: int, what: str) -> bytes:
    if data[:8] != XERIAL_MAGIC:
        return _snappy_block(data, cap, 0, what)
    if len(data) < _XERIAL_HEADER.size:
        raise DecodeError("snappy: truncated xerial header", 0, what=what)
    out = bytearray()
    p, n = _XERIAL_HEADER.size, len(data)
    while p < n:
        if p + 4 > n:
            raise DecodeError("snappy: truncated xerial block length", p, what=what)
        (size,) = _I32.unpack_from(data, p)
        p += 4
        if size < 0 or size > n - p:
            raise DecodeError(
                f"snappy: xerial block of {size} bytes exceeds the {n - p} left", p - 4, what=what
            )
        out += _snappy_block(data[p : p + size], cap - len(out), p, what)
        p += size
    return bytes(out)


def _snappy_block(block: bytes, cap: int, at: int, what: str) -> bytes:
    try:
        # The raw format declares its length up front, so the cap is checked before allocating.
        size = cramjam.snappy.decompress_raw_len(block)
    except Exception as e:
        raise DecodeError(f"snappy: {e}", at, what=what) from None
    if size > cap:
        raise _too_big(cap, what)
    try:
        return bytes(cramjam.snappy.decompress_raw(block))
    except Exception as e:
        raise DecodeError(f"snappy: {e}", at, what=what) from None


def _into_buffer(codec_id: int, data: bytes, cap: int, what: str) -> bytes:
    # A fixed output buffer is the cap: cramjam fails instead of growing past it.
    buf = bytearray(cap + 1)
    name = codec_name(codec_id)
    try:
        if codec_id == Codec.LZ4:
            n = cramjam.lz4.decompress_into(data, buf)
        else:
            n = cramjam.zstd.decompress_into(data, buf)
    except Exception as e:
        if "whole buffer" in str(e):
            raise _too_big(cap, what) from None
        raise DecodeError(f"{name}: {e}", 0, what=what) from None
    if n > cap:
        raise _too_big(cap, what)
    del buf[n:]
    return bytes(buf)


# --- magic-0 lz4 (KAFKA-3160) ----------------------------------------------------------------------

_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _xxh32_short(data: bytes) -> int:
    """xxHash32 (seed 0) of fewer than 16 bytes: all an lz4 frame descriptor needs."""
    h = (_P5 + len(data)) & _M32
    p = 0
    while p + 4 <= len(data):
        h = (_rotl((h + int.from_bytes(data[p : p + 4], "little") * _P3) & _M32, 17) * _P4) & _M32
        p += 4
    for byte in data[p:]:
        h = (_rotl((h + byte * _P5) & _M32, 11) * _P1) & _M32
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    return h ^ (h >> 16)


def legacy_lz4_header(data: bytes, broken: bool = False) -> bytes:
    """An lz4 frame with its header checksum byte rewritten.

    Magic-0 messages were written by clients whose lz4 header checksum also covered the 4 magic bytes
    (KAFKA-3160), which standard lz4 readers reject. ``broken=False`` repairs such a frame (and leaves a
    correct one unchanged); ``broken=True`` produces the old clients' variant, for tests. Input that is
    not an lz4 frame is returned unchanged so the decompressor reports it.
    """
    if len(data) < 7 or data[:4] != _LZ4_MAGIC:
        return data
    end = 6 + (8 if data[4] & 0x08 else 0) + (4 if data[4] & 0x01 else 0)
    if len(data) <= end:
        return data
    covered = data[:end] if broken else data[4:end]
    return data[:end] + bytes([(_xxh32_short(covered) >> 8) & 0xFF]) + data[end + 1 :]
