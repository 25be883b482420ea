"""Compression codecs: round trips, both snappy framings, size caps and garbage input."""

from __future__ import annotations

import gzip
import os
import struct
import zlib

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codec.compression import (
    XERIAL_MAGIC,
    Codec,
    codec_name,
    compress,
    decompress,
    default_max_size,
)
from codec.errors import DecodeError

PAYLOADS = [b"", b"x", b"hello kafka" * 10, os.urandom(70_000), b"\x00" * 200_000]


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: f"{len(p)}B")
def test_round_trip(codec: Codec, payload: bytes) -> None:
    assert decompress(codec, compress(codec, payload)) == payload


def test_names() -> None:
    assert [codec_name(c) for c in range(6)] == ["none", "gzip", "snappy", "lz4", "zstd", "unknown(5)"]


def test_gzip_is_a_gzip_member_and_stdlib_gzip_reads_it() -> None:
    data = b"abc" * 1000
    out = compress(Codec.GZIP, data)
    assert out[:2] == b"\x1f\x8b"
    assert gzip.decompress(out) == data


def test_gzip_concatenated_members_and_zlib_stream() -> None:
    assert decompress(Codec.GZIP, gzip.compress(b"ab") + gzip.compress(b"cd")) == b"abcd"
    assert decompress(Codec.GZIP, zlib.compress(b"zlib")) == b"zlib"


def test_snappy_xerial_framing_as_the_java_client_writes_it() -> None:
    data = os.urandom(40_000) + b"z" * 40_000
    out = compress(Codec.SNAPPY, data)
    assert out[:8] == XERIAL_MAGIC
    assert struct.unpack_from(">ii", out, 8) == (1, 1)
    # 32 KiB blocks, each int32-length-prefixed raw snappy.
    p, blocks = 16, []
    while p < len(out):
        (n,) = struct.unpack_from(">i", out, p)
        blocks.append(bytes(cramjam.snappy.decompress_raw(out[p + 4 : p + 4 + n])))
        p += 4 + n
    assert b"".join(blocks) == data and len(blocks) == 3


def test_snappy_plain_raw_block_as_librdkafka_may_write_it() -> None:
    data = b"librdkafka" * 500
    assert decompress(Codec.SNAPPY, bytes(cramjam.snappy.compress_raw(data))) == data


def test_snappy_xerial_written_by_kafka_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """kafka-python's own xerial framing code, over raw snappy (python-snappy is not installed)."""
    import kafka.codec as kc

    class _RawSnappy:
        compress = staticmethod(lambda b: bytes(cramjam.snappy.compress_raw(bytes(b))))
        decompress = staticmethod(lambda b: bytes(cramjam.snappy.decompress_raw(bytes(b))))

    monkeypatch.setattr(kc, "snappy", _RawSnappy)
    data = b"golden" * 20_000
    framed = kc.snappy_encode(data)
    assert framed[:8] == XERIAL_MAGIC
    assert decompress(Codec.SNAPPY, framed) == data
    assert kc.snappy_decode(compress(Codec.SNAPPY, data)) == data


def test_lz4_frame_has_independent_blocks() -> None:
    out = compress(Codec.LZ4, b"a" * 100)
    assert out[:4] == b"\x04\x22\x4d\x18"
    assert out[4] & 0x20  # block independence, required by Kafka's Java reader


@pytest.mark.parametrize("codec", [c for c in Codec if c])
def test_cap_is_enforced(codec: Codec) -> None:
    bomb = compress(codec, b"\x00" * 1_000_000)
    with pytest.raises(DecodeError, match="exceeds the cap"):
        decompress(codec, bomb, max_size=10_000)
    assert decompress(codec, bomb, max_size=1_000_000) == b"\x00" * 1_000_000


def test_default_cap() -> None:
    assert default_max_size(10) == 1 << 20
    assert default_max_size(1 << 20) == 64 << 20
    assert default_max_size(100_000) == 25_600_000


def test_none_respects_cap() -> None:
    with pytest.raises(DecodeError):
        decompress(Codec.NONE, b"abc", max_size=2)


def test_unknown_codec() -> None:
    with pytest.raises(DecodeError, match="unknown compression codec"):
        decompress(6, b"abc")


@pytest.mark.parametrize("codec", [c for c in Codec if c])
def test_truncated_streams(codec: Codec) -> None:
    good = compress(codec, os.urandom(5000))
    for cut in (1, 5, 9, 17, len(good) // 2, len(good) - 1):
        try:
            decompress(codec, good[:cut])
        except DecodeError:
            pass


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([c for c in Codec if c]), st.binary(max_size=300))
def test_garbage_raises_only_decode_error(codec: Codec, data: bytes) -> None:
    try:
        decompress(codec, data, max_size=100_000)
    except DecodeError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([c for c in Codec if c]), st.binary(min_size=1, max_size=2000), st.data())
def test_mutated_streams_raise_only_decode_error(codec: Codec, payload: bytes, data: st.DataObject) -> None:
    good = bytearray(compress(codec, payload))
    i = data.draw(st.integers(0, len(good) - 1))
    good[i] ^= data.draw(st.integers(1, 255))
    try:
        out = decompress(codec, bytes(good), max_size=100_000)
    except DecodeError:
        return
    assert len(out) <= 100_000
