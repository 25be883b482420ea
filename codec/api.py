"""The codec's public functions: frames (without their 4-byte size prefix) to typed values and back."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from codec.bodies import (
    COMPILED,
    BodyPlan,
    body_plan,
    decode_body,
    to_bytes,
    version_segment,
)
from codec.compiler import Decoder, Projection, normalize_projection
from codec.errors import DecodeError
from codec.messages import Request, Response
from codec.nested import (
    ConsumerAssignment,
    ConsumerSubscription,
    EmbeddedRequest,
    EmbeddedResponse,
    PrincipalData,
    VersionedData,
)
from codec.protocol import ApiKey, ErrorCode
from codec.schema import MessageSpec, Segment, load_table
from codec.wire import TAG_EXTRAS, EncodeError

#: Plain ints from ``codec.protocol``: compared on the decode path, where an enum member costs more.
API_VERSIONS = int(ApiKey.API_VERSIONS)
CONTROLLED_SHUTDOWN = int(ApiKey.CONTROLLED_SHUTDOWN)
UNSUPPORTED_VERSION = int(ErrorCode.UNSUPPORTED_VERSION)
ENVELOPE = int(ApiKey.ENVELOPE)
JOIN_GROUP = int(ApiKey.JOIN_GROUP)
SYNC_GROUP = int(ApiKey.SYNC_GROUP)
DESCRIBE_GROUPS = int(ApiKey.DESCRIBE_GROUPS)
CONSUMER = "consumer"
#: APIs whose requests / responses can carry a payload that ``expand_request``/``expand_response``
#: decode; decode plans skip the expansion call for every other API.
REQUESTS_WITH_NESTED = frozenset({ENVELOPE, JOIN_GROUP, SYNC_GROUP})
RESPONSES_WITH_NESTED = frozenset({ENVELOPE, JOIN_GROUP, SYNC_GROUP, DESCRIBE_GROUPS})

_HEAD = struct.Struct(">hh")
_INT16 = struct.Struct(">h")


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


def is_flexible(api_key: int, api_version: int) -> bool:
    spec = request_spec(api_key)
    return version_segment(spec, api_version, api_key).flexible_at(api_version)


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


def _headerversion_segment(name: str, version: int) -> Segment:
    return version_segment(load_table().by_name[name], version, None)


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


# Decode plans. Everything a decode needs that depends only on (api key, version, header version,
# projection) is resolved once and kept: the header and body decoders, the header version, whether
# the body can carry nested payloads. A decode call is then one dict lookup on the caller's projection
# object and one on the frame's first four bytes; no schema walk, no cache-key rebuild, no import.


@dataclass(frozen=True, slots=True, eq=False)
class RequestPlan:
    api_key: int
    api_version: int
    header_version: int
    header: Decoder
    body: BodyPlan
    #: The body can hold nested payloads to expand (Envelope, consumer protocol).
    expand: bool


@dataclass(frozen=True, slots=True, eq=False)
class ResponsePlan:
    api_key: int
    api_version: int
    header_version: int
    header: Decoder
    #: None only for an ApiVersions version this codec does not define: an error-35 answer to it
    #: still decodes, as v0 (``api_versions_v0``).
    body: BodyPlan | None
    expand: bool
    #: For ApiVersions v1+: the v0 body an UNSUPPORTED_VERSION answer is written with.
    api_versions_v0: BodyPlan | None


class FieldProjection:
    """A projection resolved once, with the decode plans built for it so far.

    ``decode_request``/``decode_response`` accept one as ``fields=``; build it once with
    :func:`projection` (any ``fields=`` value maps to the same object, so passing the frozenset of
    paths is nearly as cheap).
    """

    __slots__ = ("paths", "requests", "responses", "tree")

    def __init__(self, paths: frozenset[str] | None) -> None:
        self.paths = paths
        self.tree: Projection | None = None if paths is None else parse_projection(paths)
        #: The frame's first four bytes as one uint32 (api key, version) → plan; with an explicit
        #: header version the key is (that uint32, header version).
        self.requests: dict[Hashable, RequestPlan] = {}
        #: (api key, version) or (api key, version, header version) → plan.
        self.responses: dict[Hashable, ResponsePlan] = {}

    def __repr__(self) -> str:
        return f"FieldProjection({sorted(self.paths) if self.paths is not None else 'all fields'})"


_FULL = FieldProjection(None)
#: Caller's ``fields`` value (as given when hashable, else as a frozenset) → its FieldProjection.
#: Every ``fields=`` value seen, and every projection under itself: ``decode_request`` and
#: ``decode_response`` resolve None, a frozenset of paths and a projection in the same one lookup.
_projections: dict[Hashable, FieldProjection] = {None: _FULL, _FULL: _FULL}
_by_paths: dict[frozenset[str], FieldProjection] = {}
_REQUEST_KEY = struct.Struct(">I")
_INT16_RANGE = range(-(1 << 15), 1 << 15)


def projection(fields: Iterable[str] | FieldProjection | None) -> FieldProjection:
    """The resolved projection for ``fields`` (dotted paths; None = every field), cached."""
    if isinstance(fields, FieldProjection):
        return fields
    if fields is None:
        return _FULL
    # Frozensets and tuples are looked up as given (a frozenset caches its hash, so a caller that
    # keeps one pays almost nothing); sets and lists must be frozen first.
    key: Hashable
    if type(fields) is frozenset or type(fields) is tuple:
        key = fields
    else:
        key = fields = frozenset(fields)  # once: ``fields`` may be a one-shot iterator
    found = _projections.get(key)
    if found is None:
        paths = frozenset(fields)
        found = _by_paths.get(paths)
        if found is None:
            found = _by_paths[paths] = FieldProjection(paths)
            _projections[found] = found
        _projections[key] = found
    return found


def request_plan(
    api_key: int,
    api_version: int,
    fields: Iterable[str] | FieldProjection | None = None,
    header_version: int | None = None,
) -> RequestPlan:
    """The (cached) plan ``decode_request`` follows for this API, version and projection."""
    proj = projection(fields)
    if api_key not in _INT16_RANGE or api_version not in _INT16_RANGE:
        raise DecodeError(f"api key {api_key} / version {api_version} out of int16 range", 0, api_key)
    head = (api_key & 0xFFFF) << 16 | (api_version & 0xFFFF)
    key: Hashable = head if header_version is None else (head, header_version)
    plan = proj.requests.get(key)
    if plan is not None:
        return plan
    hv = request_header_version(api_key, api_version) if header_version is None else header_version
    header = _header_decoder("RequestHeader", hv)
    body = body_plan(request_spec(api_key), api_version, api_key, proj.tree)
    if body.projection is None and proj is not _FULL:
        # The projection keeps everything this version has: decode exactly as a full decode does.
        plan = request_plan(api_key, api_version, None, header_version)
    else:
        plan = RequestPlan(api_key, api_version, hv, header, body, api_key in REQUESTS_WITH_NESTED)
    proj.requests[key] = plan
    return plan


def response_plan(
    api_key: int,
    api_version: int,
    fields: Iterable[str] | FieldProjection | None = None,
    header_version: int | None = None,
) -> ResponsePlan:
    """The (cached) plan ``decode_response`` follows for this API, version and projection."""
    proj = projection(fields)
    key: Hashable = (
        (api_key, api_version) if header_version is None else (api_key, api_version, header_version)
    )
    plan = proj.responses.get(key)
    if plan is not None:
        return plan
    spec = response_spec(api_key)
    hv = response_header_version(api_key, api_version) if header_version is None else header_version
    header = _header_decoder("ResponseHeader", hv)
    v0: BodyPlan | None = None
    body: BodyPlan | None
    if api_key == API_VERSIONS and api_version > 0:
        v0 = body_plan(spec, 0, API_VERSIONS, proj.tree)
        body = body_plan(spec, api_version, api_key, proj.tree) if spec.segment(api_version) else None
    else:
        body = body_plan(spec, api_version, api_key, proj.tree)
    full_body = (body is None or body.projection is None) and (v0 is None or v0.projection is None)
    if full_body and proj is not _FULL:
        plan = response_plan(api_key, api_version, None, header_version)
    else:
        plan = ResponsePlan(api_key, api_version, hv, header, body, api_key in RESPONSES_WITH_NESTED, v0)
    proj.responses[key] = plan
    return plan


def kept_whole(api_key: int, api_version: int, response: bool, tree: Projection) -> Projection | None:
    """``tree`` (a projection of one side of an API) as a decode at ``api_version`` reads it: the
    fields that version has, None wherever it keeps every field of a struct (and None for the whole
    body when it keeps everything). Raises ``DecodeError`` for a version the codec does not define."""
    spec = response_spec(api_key) if response else request_spec(api_key)
    return normalize_projection(version_segment(spec, api_version, api_key).fields, api_version, tree)


def _header_decoder(name: str, version: int) -> Decoder:
    return COMPILED.decoder(_headerversion_segment(name, version), version, None, f"{name} v{version}")


def decode_request_header(
    buf: bytes | bytearray | memoryview, header_version: int | None = None
) -> tuple[dict[str, Any], int, int]:
    """(header dict, header version, offset of the body).

    ``header_version`` overrides the version the API version implies: the KIP-482 check uses it to
    tell a client that sent the wrong header version from a frame that is simply broken.
    """
    data = to_bytes(buf)
    if len(data) < 4:
        raise DecodeError(f"request frame of {len(data)} bytes has no header", 0, what="RequestHeader")
    api_key, api_version = _HEAD.unpack_from(data, 0)
    hv = request_header_version(api_key, api_version) if header_version is None else header_version
    try:
        header, pos = _header_decoder("RequestHeader", hv)(data, 0, len(data))
    except DecodeError as exc:
        raise exc.located(api_key, api_version, "RequestHeader") from None
    return header, hv, pos


def _new_request_plan(proj: FieldProjection, data: bytes, header_version: int | None) -> RequestPlan:
    api_key, api_version = _HEAD.unpack_from(data, 0)
    try:
        return request_plan(api_key, api_version, proj, header_version)
    except DecodeError:
        if header_version is not None:
            # With an explicit header version the header is read before the API is looked up, so a
            # frame whose header is broken too reports that first (as it did before plans existed).
            decode_request_header(data, header_version)
        raise


def decode_request(
    buf: bytes | bytearray | memoryview,
    fields: Iterable[str] | FieldProjection | None = None,
    header_version: int | None = None,
) -> Request:
    """Decode one request frame. ``fields`` (dotted paths, or a :func:`projection`) projects the body
    to just those fields."""
    data = buf if type(buf) is bytes else bytes(buf)
    if len(data) < 4:
        raise DecodeError(f"request frame of {len(data)} bytes has no header", 0, what="RequestHeader")
    try:
        # projection()'s commonest case inline, the same one lookup for a full and a projected decode.
        proj = _projections[fields]  # type: ignore[index]
    except (KeyError, TypeError):  # first seen, or unhashable (a set, a list)
        proj = projection(fields)
    (head,) = _REQUEST_KEY.unpack_from(data, 0)
    plan = proj.requests.get(head if header_version is None else (head, header_version))
    if plan is None:
        plan = _new_request_plan(proj, data, header_version)
    extras_before = TAG_EXTRAS.count
    try:
        header, pos = plan.header(data, 0, len(data))
    except DecodeError as exc:
        exc.locate(plan.api_key, plan.api_version, "RequestHeader")
        raise
    request = Request(
        plan.api_key,
        plan.api_version,
        header["CorrelationId"],
        header.get("ClientId"),
        header,
        decode_body(plan.body, data, pos),
        plan.header_version,
    )
    if plan.expand:
        expand_request(request)
    # A request's nested payloads are all decoded by now: the count covers them too.
    request.tag_extras = TAG_EXTRAS.count != extras_before
    return request


def decode_response(
    buf: bytes | bytearray | memoryview,
    api_key: int,
    api_version: int,
    fields: Iterable[str] | FieldProjection | None = None,
    request: Request | None = None,
    header_version: int | None = None,
) -> Response:
    """Decode one response frame to a request of ``api_key``/``api_version``.

    ``request``, the paired request when known, lets nested payloads that depend on it decode too
    (an Envelope's inner response; consumer-protocol assignments before JoinGroup v7).
    """
    data = buf if type(buf) is bytes else bytes(buf)
    try:
        # projection()'s commonest case inline, the same one lookup for a full and a projected decode.
        proj = _projections[fields]  # type: ignore[index]
    except (KeyError, TypeError):  # first seen, or unhashable (a set, a list)
        proj = projection(fields)
    plan = proj.responses.get(
        (api_key, api_version) if header_version is None else (api_key, api_version, header_version)
    )
    if plan is None:
        plan = response_plan(api_key, api_version, proj, header_version)
    extras_before = TAG_EXTRAS.count
    try:
        header, pos = plan.header(data, 0, len(data))
    except DecodeError as exc:
        exc.locate(api_key, api_version, "ResponseHeader")
        raise
    version = api_version
    if plan.api_versions_v0 is not None:
        body, version = _decode_api_versions(plan, data, pos)
    else:
        body = decode_body(plan.body, data, pos)  # type: ignore[arg-type]
    response = Response(
        api_key, version, header["CorrelationId"], header, body, plan.header_version, api_version
    )
    if plan.expand:
        expand_response(response, request)
    if not (plan.expand and _waits_for_request(response, request)):
        response.tag_extras = TAG_EXTRAS.count != extras_before
    return response


def _waits_for_request(response: Response, request: Request | None) -> bool:
    """Whether some of ``response``'s nested payloads can be decoded only with its request (an
    Envelope's inner response; a consumer protocol's payloads in a JoinGroup or SyncGroup answer that
    does not name its protocol type): its ``tag_extras`` stays unknown, as whoever decodes them later
    cannot tell what the rest of the decode saw."""
    if request is not None:
        return False
    body = response.body
    if response.api_key == ENVELOPE:
        data = body.get("ResponseData")
        return isinstance(data, EmbeddedResponse) and data.response is None and data.error is None
    return response.api_key in (JOIN_GROUP, SYNC_GROUP) and body.get("ProtocolType") is None


def _decode_api_versions(plan: ResponsePlan, data: bytes, pos: int) -> tuple[dict[str, Any], int]:
    # A broker that does not support the requested version answers with a v0 body and error 35
    # (UNSUPPORTED_VERSION). Its error code is the first field in every version, so read it first.
    if len(data) - pos >= 2 and _INT16.unpack_from(data, pos)[0] == UNSUPPORTED_VERSION:
        try:
            body = decode_body(plan.api_versions_v0, data, pos)  # type: ignore[arg-type]
        except DecodeError:
            pass
        else:
            if "_trailing" not in body:
                return body, 0
    if plan.body is None:
        version_segment(response_spec(API_VERSIONS), plan.api_version, API_VERSIONS)  # raises: not defined
    return decode_body(plan.body, data, pos), plan.api_version  # type: ignore[arg-type]


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
    COMPILED.encoder(_headerversion_segment("RequestHeader", hv), hv, f"RequestHeaderv{hv}")(head, out)
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
    COMPILED.encoder(_headerversion_segment("ResponseHeader", hv), hv, f"ResponseHeaderv{hv}")(head, out)
    _encode_body(response_spec(api_key), api_version, body, out, api_key)
    return bytes(out)


def _encode_body(
    spec: MessageSpec, version: int, body: Mapping[str, Any], out: bytearray, api_key: int
) -> None:
    try:
        seg = version_segment(spec, version, api_key)
    except DecodeError as exc:
        raise EncodeError(exc.reason) from None
    COMPILED.encoder(seg, version, f"{spec.name}v{version}")(body, out)
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


def supported_versions(api_key: int) -> tuple[int, int]:
    spec = request_spec(api_key)
    return spec.min_version, spec.max_version


def api_keys() -> list[int]:
    return sorted(load_table().requests)


def generated_source(decoder: Callable[..., Any]) -> str:
    """The Python source the codec generated for ``decoder`` (a plan's ``body.decoder`` or ``header``)
    and for every generated function it calls, root first; what ``kpmon codec dump`` prints."""
    return COMPILED.source(decoder)


def generated_constants(source: str) -> dict[str, Any]:
    """The shared constants (``_C<n>``: tagged-field readers, default values) ``source`` refers to."""
    names = sorted(set(_CONSTANT_NAME.findall(source)), key=lambda name: int(name[2:]))
    return {name: COMPILED.ns[name] for name in names if name in COMPILED.ns}


_CONSTANT_NAME = re.compile(r"\b_C\d+\b")


# Nested payloads: their types are ``codec.nested``'s; they are expanded here, because an Envelope's
# inner request and response are frames, decoded as every frame is.


def _embedded_request(raw: bytes) -> EmbeddedRequest:
    try:
        return EmbeddedRequest(raw, decode_request(raw))
    except DecodeError as exc:
        return EmbeddedRequest(raw, error=exc)


def _embedded_response(raw: bytes, inner_request: Request | None) -> EmbeddedResponse:
    """An Envelope's inner response, decodable once the inner request's API is known."""
    if inner_request is None:
        return EmbeddedResponse(raw)
    try:
        return EmbeddedResponse(raw, decode_response(raw, inner_request.api_key, inner_request.api_version))
    except DecodeError as exc:
        return EmbeddedResponse(raw, error=exc)


def _wrap(items: Any, key: str, cls: type[VersionedData]) -> None:
    if not isinstance(items, list):
        return
    for item in items:
        value = item.get(key) if isinstance(item, dict) else None
        if isinstance(value, bytes):
            item[key] = cls(value)


def expand_request(request: Request) -> None:
    """Decode the nested payloads of ``request``'s body in place (``decode_request`` does it)."""
    body = request.body
    if request.api_key == ENVELOPE:
        if isinstance(body.get("RequestData"), bytes):
            body["RequestData"] = _embedded_request(body["RequestData"])
        if isinstance(body.get("RequestPrincipal"), bytes):
            body["RequestPrincipal"] = PrincipalData(body["RequestPrincipal"])
    elif request.api_key == JOIN_GROUP and body.get("ProtocolType") == CONSUMER:
        _wrap(body.get("Protocols"), "Metadata", ConsumerSubscription)
    elif request.api_key == SYNC_GROUP and body.get("ProtocolType") == CONSUMER:
        _wrap(body.get("Assignments"), "Assignment", ConsumerAssignment)


def _protocol_type(body: dict[str, Any], request: Request | None) -> Any:
    if body.get("ProtocolType") is not None:
        return body["ProtocolType"]
    return request.body.get("ProtocolType") if request is not None else None


def expand_response(response: Response, request: Request | None) -> None:
    """Decode the nested payloads of ``response``'s body in place; with ``request``, the paired
    request, also those that need it (an Envelope's inner response, a consumer protocol's type)."""
    body = response.body
    key = response.api_key
    if key == ENVELOPE:
        data = body.get("ResponseData")
        if isinstance(data, EmbeddedResponse) and data.response is None and data.error is None:
            # Decoded before its request was known (a response frame on its own): now it is.
            data = data.raw
        if isinstance(data, bytes):
            inner = None
            if request is not None and isinstance(request.body.get("RequestData"), EmbeddedRequest):
                inner = request.body["RequestData"].request
            body["ResponseData"] = _embedded_response(data, inner)
    elif key == JOIN_GROUP and _protocol_type(body, request) == CONSUMER:
        _wrap(body.get("Members"), "Metadata", ConsumerSubscription)
    elif key == SYNC_GROUP and _protocol_type(body, request) == CONSUMER:
        value = body.get("Assignment")
        if isinstance(value, bytes):
            body["Assignment"] = ConsumerAssignment(value)
    elif key == DESCRIBE_GROUPS:
        for group in body.get("Groups") or ():
            if group.get("ProtocolType") == CONSUMER:
                _wrap(group.get("Members"), "MemberMetadata", ConsumerSubscription)
                _wrap(group.get("Members"), "MemberAssignment", ConsumerAssignment)
