"""A decoded message, packed: the facts a frame carries once it has been decoded.

The streaming job decodes each frame once (in its router, ``streaming.router``) and from then on moves
the decoded message, not the frame bytes: the frames and routes it bundles for the stateful stage, the
requests a connection is waiting on, and buffered frames in saved state all hold ``pack_message``
output, which ``unpack_message`` turns back into the same
``Request``/``Response`` with no decoding. What is left out is what no check reads and what makes
frames big: the records of data batches (their headers stay; control batches stay whole, their
markers are facts). Everything else round-trips exactly: header, body, unknown tags, the codec's
KIP-482 evidence, decoded nested payloads (Envelope, consumer protocol) and their decode errors.

The layout is msgpack: ``[direction, api_key, api_version, correlation_id, header_version, header,
body, client_id | requested_version]`` with extension types for the values msgpack has no type for.
Numbers of the extension types and the list layout only ever grow, so packed facts written by an
older build stay readable (``FACTS_FORMAT`` names the layout).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any, Final

import msgpack

from codec.api import Request, Response
from codec.errors import DecodeError
from codec.nested import (
    ConsumerAssignment,
    ConsumerSubscription,
    Embedded,
    EmbeddedRequest,
    EmbeddedResponse,
    PrincipalData,
    VersionedData,
)
from codec.records import RecordBatches, batch_headers

FACTS_FORMAT: Final = 1

_REQUEST, _RESPONSE = 0, 1
# msgpack extension type codes.
_UUID, _RECORDS, _EMBEDDED, _ERROR = 1, 2, 3, 4
#: Nested payload classes by their ``kind`` (what an ``_EMBEDDED`` extension names).
_EMBEDDED_KINDS: Final[dict[str, type[Embedded]]] = {
    cls.kind: cls
    for cls in (
        ConsumerSubscription,
        ConsumerAssignment,
        PrincipalData,
        EmbeddedRequest,
        EmbeddedResponse,
    )
}


class FactsError(ValueError):
    """Bytes that are not packed facts of a layout this build reads."""


def pack_message(message: Request | Response) -> bytes:
    """The decoded ``message`` as bytes ``unpack_message`` restores without decoding."""
    return packb(_message_list(message))


_packers = threading.local()


def packb(values: Any) -> bytes:
    """``values`` (plain values and the facts' extension types) as msgpack, exactly as
    ``msgpack.packb(values, use_bin_type=True, default=...)`` packs them, with this thread's packer.

    Every decoded frame is packed this way at least twice on its way to the stateful stage (its
    connection's copy, each routed copy, then the bundle that holds them), and
    ``msgpack.packb`` builds a new ``Packer`` (and its buffer) per call, which cost about as much as
    packing a small frame. A packer is not thread-safe, hence one per thread; it cannot re-enter
    itself either, so nested payloads (``_default``) are packed with ``msgpack.packb``. On an error the
    packer drops what it had packed, so a failed call leaves it clean."""
    packer = getattr(_packers, "packer", None)
    if packer is None:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True, default=_default)
    return packer.pack(values)


def unpack_message(data: bytes) -> Request | Response:
    return _message_of(unpack_values(data))


def unpack_values(data: bytes) -> Any:
    """``packb`` output back as values, the facts' extension types restored (a message packed inside
    them reads as its values: ``message_of``)."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)
    except (ValueError, msgpack.UnpackException) as exc:
        raise FactsError(f"not packed facts: {exc}") from exc


def pack_error(error: DecodeError) -> list[Any]:
    """A decode error as plain values (``unpack_error`` restores it with the same text)."""
    return [error.reason, error.offset, error.api_key, error.api_version, error.what]


def unpack_error(values: list[Any]) -> DecodeError:
    reason, offset, api_key, api_version, what = values[:5]
    return DecodeError(reason, offset, api_key, api_version, what)


def _message_list(message: Request | Response) -> list[Any]:
    if isinstance(message, Request):
        extra: Any = message.client_id
        direction = _REQUEST
    else:
        extra = message.requested_version
        direction = _RESPONSE
    return [
        direction,
        message.api_key,
        message.api_version,
        message.correlation_id,
        message.header_version,
        message.header,
        message.body,
        extra,
    ]


def message_of(*values: Any) -> Request | Response:
    """A message back from the values its facts hold, in their order (``unpack_values`` reads a message
    packed inside another value, as ``packb`` packs a ``Request`` or ``Response``, as these values)."""
    if len(values) < 8 or values[0] not in (_REQUEST, _RESPONSE):
        raise FactsError("not packed facts: expected a message's values")
    direction, api_key, api_version, correlation_id, header_version, header, body, extra = values[:8]
    if direction == _REQUEST:
        return Request(api_key, api_version, correlation_id, extra, header, body, header_version)
    return Response(api_key, api_version, correlation_id, header, body, header_version, extra)


def _message_of(values: Any) -> Request | Response:
    if not isinstance(values, list):
        raise FactsError("not packed facts: expected a message list")
    return message_of(*values)


def _default(value: Any) -> Any:
    if isinstance(value, (Request, Response)):
        # A message inside a packed value (``codec.taprecord.pack_run``): its facts, inline.
        return _message_list(value)
    # Records first: every Produce holds them. Built as the tuple they are: ``ExtType``'s own
    # constructor checks its arguments in Python, and these are known good.
    if isinstance(value, RecordBatches):
        return _ext((_RECORDS, batch_headers(value)))
    if isinstance(value, uuid.UUID):
        return _ext((_UUID, value.bytes))
    if isinstance(value, Embedded):
        return _ext((_EMBEDDED, _pack(_embedded_list(value))))
    if isinstance(value, DecodeError):
        return _ext((_ERROR, _pack(pack_error(value))))
    raise TypeError(f"cannot pack {type(value).__name__} as facts")


def _ext(code_and_data: tuple[int, bytes]) -> msgpack.ExtType:
    ext: msgpack.ExtType = tuple.__new__(msgpack.ExtType, code_and_data)
    return ext


def _pack(values: Any) -> bytes:
    return msgpack.packb(values, use_bin_type=True, default=_default)


def _embedded_list(value: Embedded) -> list[Any]:
    if isinstance(value, VersionedData):
        inner: Any = [value.version, value.value]
    elif isinstance(value, EmbeddedRequest):
        inner = None if value.request is None else _message_list(value.request)
    elif isinstance(value, EmbeddedResponse):
        inner = None if value.response is None else _message_list(value.response)
    else:
        inner = None
    return [value.kind, value.raw, value.error, inner]


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _UUID:
        return uuid.UUID(bytes=data)
    if code == _RECORDS:
        return RecordBatches.from_bytes(data)
    if code == _EMBEDDED:
        return _embedded_of(_unpack(data))
    if code == _ERROR:
        return unpack_error(_unpack(data))
    return msgpack.ExtType(code, data)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)


def _embedded_of(values: list[Any]) -> Embedded:
    kind, raw, error, inner = values
    cls = _EMBEDDED_KINDS.get(kind)
    if cls is None:
        raise FactsError(f"not packed facts: unknown nested payload kind {kind!r}")
    # Built without __init__: the constructors decode ``raw``, and the decoded value is right here.
    value = cls.__new__(cls)
    value.raw = raw
    value.error = error
    if isinstance(value, VersionedData):
        value.version, value.value = inner
    elif isinstance(value, EmbeddedRequest):
        value.request = None if inner is None else _message_of(inner)  # type: ignore[assignment]
    elif isinstance(value, EmbeddedResponse):
        value.response = None if inner is None else _message_of(inner)  # type: ignore[assignment]
    return value
