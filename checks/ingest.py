"""Tap records (the tap topic contract in ARCHITECTURE.md) to decoded ``Frame`` objects."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import codec
from checks.model import Frame
from codec.errors import DecodeError

#: Header names of the tap record contract.
DIRECTIONS = ("req", "resp", "open", "close")


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def headers_dict(
    headers: Iterable[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None],
) -> dict[str, str]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {key: _text(value) for key, value in items}


def frame_from_record(
    headers: Mapping[str, str],
    value: bytes | None,
    partition: int = -1,
    offset: int = -1,
    fields: Iterable[str] | None = None,
) -> Frame:
    """Decode one tap record. Never raises for bad frames: the error is kept on the Frame."""
    frame = Frame(
        conn=connection_of(headers.get("conn"), partition),
        seq=_int(headers.get("seq", "")) or 0,
        ts_ns=_int(headers.get("ts_ns", "")) or 0,
        direction=headers.get("dir", ""),
        api_key=_int(headers.get("api_key", "")),
        api_version=_int(headers.get("api_version", "")),
        correlation_id=_int(headers.get("corr_id", "")),
        client=headers.get("client", ""),
        broker=headers.get("broker", ""),
        broker_id=_int(headers.get("broker_id", "")),
        listener=headers.get("listener") or None,
        partition=partition,
        offset=offset,
        capture=headers.get("capture", "full"),
    )
    return decode_frame(frame, value, truncated=header_only(headers), fields=fields)


def header_only(headers: Mapping[str, str]) -> bool:
    """The tap mirrored this frame without its body: too large, a redaction it could not do (fail
    closed), a payload strip that fell back to ``meta``, or a raw SASL token. Not a decode error."""
    if headers.get("truncated") or headers.get("redaction_failed") or headers.get("capture_fallback"):
        return True
    return "sasl_token" in (headers.get("redacted") or "").split(",")


def connection_of(conn: str | None, partition: int) -> str:
    """A record without the tap's ``conn`` header (not from a tap) still needs a connection to key by."""
    return conn or f"untracked-p{partition}"


def decode_frame(
    frame: Frame, value: bytes | None, truncated: bool = False, fields: Iterable[str] | None = None
) -> Frame:
    """Attach the decoded message (or the DecodeError) of ``value`` to a frame built from tap metadata.

    A record that does not follow the tap record contract (no valid ``dir`` header: something else
    wrote it to the tap topic) becomes an undecodable request, so it is reported, not ignored.
    """
    if frame.direction not in DIRECTIONS:
        frame.error = DecodeError(f"not a tap record: dir header {frame.direction!r}", 0)
        frame.direction = "req"
        return frame
    if frame.direction not in ("req", "resp"):
        return frame
    if frame.capture == "meta" or truncated:
        # Only the frame header was mirrored: keep the frame for gap accounting, skip decoding.
        return frame
    data = value or b""
    frame.raw = data
    try:
        if frame.direction == "req":
            frame.message = codec.decode_request(data, fields=fields)
            frame.api_key = frame.message.api_key
            frame.api_version = frame.message.api_version
            frame.correlation_id = frame.message.correlation_id
        else:
            if frame.api_key is None or frame.api_version is None:
                raise DecodeError("response record without api_key/api_version headers", 0)
            frame.message = codec.decode_response(data, frame.api_key, frame.api_version, fields=fields)
    except DecodeError as exc:
        frame.error = exc
    return frame
