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
