"""Payloads that ride inside ``bytes`` fields: Envelope inner frames (KIP-590), the consumer protocol's
subscription and assignment, and Envelope principals.

A nested payload decodes leniently: a malformed one keeps its raw bytes and carries the ``error``
instead of failing the whole frame, because the outer frame is still valid Kafka (a custom assignor may
put anything in ``Metadata``). Every embedded value re-encodes to exactly its raw bytes.

This module holds the payload types and decodes the ``data`` messages (``codec.bodies``); the frame
decoder (``codec.api``, ``expand_request``/``expand_response``) puts them into a body, and decodes an
Envelope's inner frames itself.
"""

from __future__ import annotations

import struct
from typing import Any, ClassVar

from codec.bodies import data_max_version, decode_data
from codec.errors import DecodeError
from codec.messages import Request, Response

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
            known = min(version, data_max_version(self.message))
            self.version = version
            self.value = decode_data(self.message, known, raw, 2)
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
    """``EnvelopeRequest.RequestData``: a whole request frame with its own header (``codec.api`` decodes
    it when it expands the Envelope)."""

    __slots__ = ("request",)
    kind = "envelope_request"

    def __init__(self, raw: bytes, request: Request | None = None, error: DecodeError | None = None) -> None:
        super().__init__(raw)
        self.request = request
        self.error = error


class EmbeddedResponse(Embedded):
    """``EnvelopeResponse.ResponseData``: decodable once the inner request's API is known."""

    __slots__ = ("response",)
    kind = "envelope_response"

    def __init__(
        self, raw: bytes, response: Response | None = None, error: DecodeError | None = None
    ) -> None:
        super().__init__(raw)
        self.response = response
        self.error = error
