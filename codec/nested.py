"""Payloads that ride inside ``bytes`` fields: Envelope inner frames (KIP-590), the consumer protocol's
subscription and assignment, and Envelope principals.

A nested payload decodes leniently: a malformed one keeps its raw bytes and carries the ``error``
instead of failing the whole frame, because the outer frame is still valid Kafka (a custom assignor may
put anything in ``Metadata``). Every embedded value re-encodes to exactly its raw bytes.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, ClassVar

import codec.api as _api  # circular (api imports this module): only used at call time
from codec.errors import DecodeError
from codec.protocol import ApiKey

if TYPE_CHECKING:
    from codec.api import Request, Response

#: Plain ints from ``codec.protocol`` (compared per decoded frame).
ENVELOPE = int(ApiKey.ENVELOPE)
JOIN_GROUP = int(ApiKey.JOIN_GROUP)
SYNC_GROUP = int(ApiKey.SYNC_GROUP)
DESCRIBE_GROUPS = int(ApiKey.DESCRIBE_GROUPS)
CONSUMER = "consumer"
#: APIs whose requests / responses can carry a payload that ``expand_request``/``expand_response``
#: decode; decode plans skip the expansion call for every other API.
REQUESTS_WITH_NESTED = frozenset({ENVELOPE, JOIN_GROUP, SYNC_GROUP})
RESPONSES_WITH_NESTED = frozenset({ENVELOPE, JOIN_GROUP, SYNC_GROUP, DESCRIBE_GROUPS})

_INT16 = struct.Struct(">h")


class Embedded:
    """A decoded payload that keeps its bytes; ``bytes(x)`` is what was on the wire."""

    __slots__ = ("error", "raw")
    kind: ClassVar[str] = "embedded"

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.error: DecodeError | None = None

    def __bytes__(self) -> bytes:
        return self.raw

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Embedded):
            return type(other) is type(self) and other.raw == self.raw
        if isinstance(other, bytes | bytearray):
            return self.raw == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.raw)

    def __repr__(self) -> str:
        state = f"error={self.error}" if self.error else f"{len(self.raw)} bytes"
        return f"<{type(self).__name__} {state}>"


class VersionedData(Embedded):
    """A ``data`` message serialized as an int16 version followed by that version's body."""

    __slots__ = ("value", "version")
    message: ClassVar[str] = ""

    def __init__(self, raw: bytes) -> None:
        super().__init__(raw)
        self.version: int | None = None
        self.value: dict[str, Any] | None = None
        if not raw:
            return
        try:
            if len(raw) < 2:
                raise DecodeError("version prefix needs 2 bytes", 0, what=self.message)
            version = _INT16.unpack_from(raw, 0)[0]
            if version < 0:
                raise DecodeError(f"negative version {version}", 0, what=self.message)
            # Newer versions only append fields, so read them with the newest layout we know (as Kafka does).
            known = min(version, _api.data_max_version(self.message))
            self.version = version
            self.value = _api.decode_data(self.message, known, raw, 2)
        except DecodeError as exc:
            self.error = exc


class ConsumerSubscription(VersionedData):
    __slots__ = ()
    kind = "consumer_subscription"
    message = "ConsumerProtocolSubscription"


class ConsumerAssignment(VersionedData):
    __slots__ = ()
    kind = "consumer_assignment"
    message = "ConsumerProtocolAssignment"


class PrincipalData(VersionedData):
    __slots__ = ()
    kind = "principal"
    message = "DefaultPrincipalData"


class EmbeddedRequest(Embedded):
    """``EnvelopeRequest.RequestData``: a whole request frame with its own header."""

    __slots__ = ("request",)
    kind = "envelope_request"

    def __init__(self, raw: bytes) -> None:
        super().__init__(raw)
        self.request: Request | None = None
        try:
            self.request = _api.decode_request(raw)
        except DecodeError as exc:
            self.error = exc


class EmbeddedResponse(Embedded):
    """``EnvelopeResponse.ResponseData``: decodable once the inner request's API is known."""

    __slots__ = ("response",)
    kind = "envelope_response"

    def __init__(self, raw: bytes, inner_request: Request | None) -> None:
        super().__init__(raw)
        self.response: Response | None = None
        if inner_request is None or raw is None:
            return
        try:
            self.response = _api.decode_response(raw, inner_request.api_key, inner_request.api_version)
        except DecodeError as exc:
            self.error = exc


def _wrap(items: Any, key: str, cls: type[VersionedData]) -> None:
    if not isinstance(items, list):
        return
    for item in items:
        value = item.get(key) if isinstance(item, dict) else None
        if isinstance(value, bytes):
            item[key] = cls(value)


def expand_request(request: Request) -> None:
    body = request.body
    if request.api_key == ENVELOPE:
        if isinstance(body.get("RequestData"), bytes):
            body["RequestData"] = EmbeddedRequest(body["RequestData"])
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
            body["ResponseData"] = EmbeddedResponse(data, inner)
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
