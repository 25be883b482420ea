"""Hot-path peeks at frame headers: what the tap needs to route and annotate, without a full decode."""

from __future__ import annotations

import struct
from typing import NamedTuple

from codec.errors import DecodeError

_REQUEST_FIXED = struct.Struct(">hhih")
_INT32 = struct.Struct(">i")


class RequestHeaderPeek(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    #: Offset of the first byte after the client id (where the tagged fields or the body start).
    end: int


def peek_request_header(buf: bytes | bytearray | memoryview) -> RequestHeaderPeek:
    """Read api key, version, correlation id and client id from a request frame (no size prefix).

    Every request header version (v0 has no client id, but no client has sent v0 since Kafka 0.8)
    starts with these fields; in header v2 the client id keeps its int16 length (not compact).
    """
    if len(buf) < 8:
        raise DecodeError(f"request header needs 8 bytes, frame has {len(buf)}", 0, what="RequestHeader")
    if len(buf) < 10:
        api_key, api_version, corr = struct.unpack_from(">hhi", buf, 0)
        return RequestHeaderPeek(api_key, api_version, corr, None, 8)
    api_key, api_version, corr, n = _REQUEST_FIXED.unpack_from(buf, 0)
    if n < 0:
        return RequestHeaderPeek(api_key, api_version, corr, None, 10)
    end = 10 + n
    if end > len(buf):
        raise DecodeError(
            f"client id length {n} exceeds the {len(buf) - 10} bytes left",
            8,
            api_key,
            api_version,
            "RequestHeader",
        )
    client_id = bytes(buf[10:end]).decode("utf-8", errors="replace")
    return RequestHeaderPeek(api_key, api_version, corr, client_id, end)


def peek_correlation_id(buf: bytes | bytearray | memoryview) -> int:
    """The correlation id of a response frame (no size prefix)."""
    if len(buf) < 4:
        raise DecodeError(f"response header needs 4 bytes, frame has {len(buf)}", 0, what="ResponseHeader")
    corr: int = _INT32.unpack_from(buf, 0)[0]
    return corr


_INT16 = struct.Struct(">h")
#: Per Produce version: whether strings are compact (flexible), and how many strings precede ``Acks``
#: (None: a field of another type does, so the peek cannot skip it cheaply).
_ACKS_LAYOUTS: dict[int, tuple[bool, int] | None] = {}


def _acks_layout(api_version: int) -> tuple[bool, int] | None:
    """The Produce request body's fields before ``Acks`` at ``api_version``, from the schema table."""
    if api_version in _ACKS_LAYOUTS:
        return _ACKS_LAYOUTS[api_version]
    from codec.protocol import ApiKey
    from codec.schema import load_table

    spec = load_table().requests.get(ApiKey.PRODUCE)
    segment = spec.segment(api_version) if spec is not None else None
    layout: tuple[bool, int] | None = None
    if segment is not None:
        strings = 0
        for field in segment.fields:
            if not field.present(api_version) or field.tagged_at(api_version):
                continue
            if field.name == "Acks":
                layout = (segment.flexible_at(api_version), strings)
                break
            if field.type != "string":
                break
            strings += 1
    if -(1 << 15) <= api_version < (1 << 15):
        _ACKS_LAYOUTS[api_version] = layout
    return layout


def peek_produce_acks(buf: bytes | bytearray | memoryview, api_version: int, body: int) -> int | None:
    """A Produce request's ``Acks``, read at the body offset ``body`` (after the request header) without
    decoding the rest: the tap must know at once whether a response will ever come. None when the
    bytes do not say (too short, a layout the peek does not skip)."""
    layout = _acks_layout(api_version)
    if layout is None:
        return None
    compact, strings = layout
    pos = body
    for _ in range(strings):
        if compact:
            length = shift = 0
            while True:
                if pos >= len(buf) or shift > 28:
                    return None
                byte = buf[pos]
                pos += 1
                length |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    break
                shift += 7
            pos += max(length - 1, 0)
        else:
            if pos + 2 > len(buf):
                return None
            pos += 2 + max(_INT16.unpack_from(buf, pos)[0], 0)
    if pos + 2 > len(buf):
        return None
    acks: int = _INT16.unpack_from(buf, pos)[0]
    return acks
