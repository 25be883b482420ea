"""The codec's public functions: frames (without their 4-byte size prefix) to typed values and back."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from codec.compiler import CompiledSchema, Projection
from codec.errors import DecodeError
from codec.schema import MessageSpec, Segment, load_table
from codec.wire import EncodeError

API_VERSIONS = 18
CONTROLLED_SHUTDOWN = 7
UNSUPPORTED_VERSION = 35

_HEAD = struct.Struct(">hh")
_INT16 = struct.Struct(">h")


@dataclass
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    #: Every header field, including tagged ones (``_unknown_tags`` for tags this codec does not know).
    header: dict[str, Any]
    body: dict[str, Any]
    header_version: int

    @property
    def api_name(self) -> str:
        return api_name(self.api_key)


@dataclass
class Response:
    api_key: int
    #: The version the body was decoded with; an ApiVersions error-35 answer is decoded (and re-encoded) as v0.
    api_version: int
    correlation_id: int
    header: dict[str, Any]
    body: dict[str, Any]
    header_version: int
    requested_version: int = field(default=-1)

    @property
    def api_name(self) -> str:
        return api_name(self.api_key)


_compiled = CompiledSchema()


def api_name(api_key: int) -> str:
    return load_table().api_name(api_key)


def request_spec(api_key: int) -> MessageSpec:
    spec = load_table().requests.get(api_key)
    if spec is None:
        raise DecodeError(f"unknown api key {api_key}", 0, api_key)
    return spec


def response_spec(api_key: int) -> MessageSpec:
    spec = load_table().responses.get(api_key)
    if spec is None:
        raise DecodeError(f"unknown api key {api_key}", 0, api_key)
    return spec


def _segment(spec: MessageSpec, version: int, api_key: int | None) -> Segment:
    seg = spec.segment(version)
    if seg is None:
        raise DecodeError(
            f"{spec.name} v{version} is not defined (known: v{spec.min_version}-v{spec.max_version})",
            0,
            api_key,
            version,
        )
    return seg


def is_flexible(api_key: int, api_version: int) -> bool:
    spec = request_spec(api_key)
    return _segment(spec, api_version, api_key).flexible_at(api_version)


def request_header_version(api_key: int, api_version: int) -> int:
    # ControlledShutdown v0 predates client ids: the only user of request header v0.
    if api_key == CONTROLLED_SHUTDOWN and api_version == 0:
        return 0
    return 2 if is_flexible(api_key, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    # ApiVersions responses always use header v0, so a client that does not yet know the broker's
    # versions can read the error code (KIP-511).
    if api_key == API_VERSIONS:
        return 0
    return 1 if is_flexible(api_key, api_version) else 0


def _header_segment(name: str, version: int) -> Segment:
    return _segment(load_table().by_name[name], version, None)


def _to_bytes(buf: bytes | bytearray | memoryview) -> bytes:
    return buf if type(buf) is bytes else bytes(buf)


@cache
def parse_projection(fields: frozenset[str]) -> Projection:
    """``{"TopicData.Name", "TopicData.PartitionData.Records"}`` → nested projection."""
    tree: dict[str, Any] = {}
    for path in sorted(fields):
        node = tree
        parts = path.split(".")
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if last:
                if part not in node:
                    node[part] = None
            else:
                child = node.get(part)
                if child is None:
                    child = node[part] = {}
                node = child
    return tree


def _projection(fields: Iterable[str] | None) -> Projection | None:
    if fields is None:
        return None
    return parse_projection(frozenset(fields))


def _decode_body(
    spec: MessageSpec,
    version: int,
    buf: bytes,
    pos: int,
    api_key: int | None,
    proj: Projection | None,
) -> dict[str, Any]:
    seg = _segment(spec, version, api_key)
    decoder = _compiled.decoder(seg, version, proj, f"{spec.name}v{version}")
    try:
        body, end = decoder(buf, pos, len(buf))
    except DecodeError as exc:
        raise exc.located(api_key, version, spec.name) from None
    except RecursionError:
        raise DecodeError("structure nested too deeply", pos, api_key, version, spec.name) from None
    if end > len(buf):
        raise DecodeError(
            f"{spec.name} runs {end - len(buf)} bytes past the frame", len(buf), api_key, version
        )
    if end < len(buf) and proj is None:
        # Bytes after the body: the broker ignores them; keep them so encode(decode(x)) == x.
        body["_trailing"] = buf[end:]
    return body


def decode_request_header(
    buf: bytes | bytearray | memoryview, header_version: int | None = None
) -> tuple[dict[str, Any], int, int]:
    """(header dict, header version, offset of the body).

    ``header_version`` overrides the version the API version implies: the KIP-482 check uses it to
    tell a client that sent the wrong header version from a frame that is simply broken.
    """
    data = _to_bytes(buf)
    if len(data) < 4:
        raise DecodeError(f"request frame of {len(data)} bytes has no header", 0, what="RequestHeader")
    api_key, api_version = _HEAD.unpack_from(data, 0)
    hv = request_header_version(api_key, api_version) if header_version is None else header_version
    seg = _header_segment("RequestHeader", hv)
    decoder = _compiled.decoder(seg, hv, None, f"RequestHeaderv{hv}")
    try:
        header, pos = decoder(data, 0, len(data))
    except DecodeError as exc:
        raise exc.located(api_key, api_version, "RequestHeader") from None
    return header, hv, pos


def decode_request(
    buf: bytes | bytearray | memoryview,
    fields: Iterable[str] | None = None,
    header_version: int | None = None,
) -> Request:
    """Decode one request frame. ``fields`` (dotted paths) projects the body to just those fields."""
    data = _to_bytes(buf)
    header, hv, pos = decode_request_header(data, header_version)
    api_key = header["RequestApiKey"]
    version = header["RequestApiVersion"]
    body = _decode_body(request_spec(api_key), version, data, pos, api_key, _projection(fields))
    request = Request(api_key, version, header["CorrelationId"], header.get("ClientId"), header, body, hv)
    from codec.nested import expand_request

    expand_request(request)
    return request


def decode_response(
    buf: bytes | bytearray | memoryview,
    api_key: int,
    api_version: int,
    fields: Iterable[str] | None = None,
    request: Request | None = None,
    header_version: int | None = None,
) -> Response:
    """Decode one response frame to a request of ``api_key``/``api_version``.

    ``request``, the paired request when known, lets nested payloads that depend on it decode too
    (an Envelope's inner response; consumer-protocol assignments before JoinGroup v7).
    """
    data = _to_bytes(buf)
    spec = response_spec(api_key)
    hv = response_header_version(api_key, api_version) if header_version is None else header_version
    seg = _header_segment("ResponseHeader", hv)
    try:
        header, pos = _compiled.decoder(seg, hv, None, f"ResponseHeaderv{hv}")(data, 0, len(data))
    except DecodeError as exc:
        raise exc.located(api_key, api_version, "ResponseHeader") from None
    proj = _projection(fields)
    version = api_version
    if api_key == API_VERSIONS and api_version > 0:
        body = _decode_api_versions(spec, api_version, data, pos, proj)
        version = body.pop("_decoded_as")
    else:
        body = _decode_body(spec, api_version, data, pos, api_key, proj)
    response = Response(api_key, version, header["CorrelationId"], header, body, hv, api_version)
    from codec.nested import expand_response

    expand_response(response, request)
    return response


def _decode_api_versions(
    spec: MessageSpec, version: int, data: bytes, pos: int, proj: Projection | None
) -> dict[str, Any]:
    # A broker that does not support the requested version answers with a v0 body and error 35
    # (UNSUPPORTED_VERSION). Its error code is the first field in every version, so read it first.
    if len(data) - pos >= 2 and _INT16.unpack_from(data, pos)[0] == UNSUPPORTED_VERSION:
        try:
            body = _decode_body(spec, 0, data, pos, API_VERSIONS, proj)
        except DecodeError:
            pass
        else:
            if "_trailing" not in body:
                body["_decoded_as"] = 0
                return body
    body = _decode_body(spec, version, data, pos, API_VERSIONS, proj)
    body["_decoded_as"] = version
    return body


def encode_request(
    api_key: int,
    api_version: int,
    correlation_id: int,
    client_id: str | None,
    body: Mapping[str, Any],
    header: Mapping[str, Any] | None = None,
) -> bytes:
    """Encode a request frame (no size prefix). ``header`` supplies extra header fields (tagged ones)."""
    hv = request_header_version(api_key, api_version)
    head: dict[str, Any] = dict(header or {})
    head.update(
        RequestApiKey=api_key, RequestApiVersion=api_version, CorrelationId=correlation_id, ClientId=client_id
    )
    out = bytearray()
    _compiled.encoder(_header_segment("RequestHeader", hv), hv, f"RequestHeaderv{hv}")(head, out)
    spec = request_spec(api_key)
    _encode_body(spec, api_version, body, out, api_key)
    return bytes(out)


def encode_response(
    api_key: int,
    api_version: int,
    correlation_id: int,
    body: Mapping[str, Any],
    header: Mapping[str, Any] | None = None,
) -> bytes:
    """Encode a response frame (no size prefix) answering a request of ``api_version``."""
    hv = response_header_version(api_key, api_version)
    head: dict[str, Any] = dict(header or {})
    head["CorrelationId"] = correlation_id
    out = bytearray()
    _compiled.encoder(_header_segment("ResponseHeader", hv), hv, f"ResponseHeaderv{hv}")(head, out)
    _encode_body(response_spec(api_key), api_version, body, out, api_key)
    return bytes(out)


def _encode_body(
    spec: MessageSpec, version: int, body: Mapping[str, Any], out: bytearray, api_key: int
) -> None:
    try:
        seg = _segment(spec, version, api_key)
    except DecodeError as exc:
        raise EncodeError(exc.reason) from None
    _compiled.encoder(seg, version, f"{spec.name}v{version}")(body, out)
    trailing = body.get("_trailing")
    if trailing:
        out += trailing


def encode(message: Request | Response) -> bytes:
    """Re-encode a decoded frame; ``encode(decode_request(x)) == x`` for every valid frame."""
    if isinstance(message, Request):
        return encode_request(
            message.api_key,
            message.api_version,
            message.correlation_id,
            message.client_id,
            message.body,
            header=message.header,
        )
    return encode_response(
        message.api_key, message.api_version, message.correlation_id, message.body, header=message.header
    )


def decode_data(name: str, version: int, buf: bytes | bytearray | memoryview, pos: int = 0) -> dict[str, Any]:
    """Decode a ``data`` message (ConsumerProtocolSubscription, EndTxnMarker...) body at ``version``."""
    data = _to_bytes(buf)
    spec = load_table().by_name.get(name)
    if spec is None:
        raise DecodeError(f"no message definition named {name}", pos, what=name)
    return _decode_body(spec, version, data, pos, None, None)


def encode_data(name: str, version: int, body: Mapping[str, Any]) -> bytes:
    spec = load_table().by_name[name]
    out = bytearray()
    seg = spec.segment(version)
    if seg is None:
        raise EncodeError(f"{name} v{version} is not defined")
    _compiled.encoder(seg, version, f"{name}v{version}")(body, out)
    trailing = body.get("_trailing")
    if trailing:
        out += trailing
    return bytes(out)


def supported_versions(api_key: int) -> tuple[int, int]:
    spec = request_spec(api_key)
    return spec.min_version, spec.max_version


def api_keys() -> list[int]:
    return sorted(load_table().requests)
