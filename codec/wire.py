"""Variable-length primitives shared by the generated code: unsigned varints and tagged sections."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from codec.errors import DecodeError

TagReader = Callable[[bytes, int, int], tuple[Any, int]]


class EncodeError(ValueError):
    """A body that cannot be encoded at the requested version (wrong type, missing non-nullable value)."""


def read_uvarint(b: bytes, p: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (Kafka's lengths and tags are 32-bit)."""
    result = 0
    shift = 0
    start = p
    while True:
        if p >= len(b):
            raise DecodeError("varint runs past the end of the frame", start)
        byte = b[p]
        p += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, p
        shift += 7
        if shift > 28:
            raise DecodeError("varint longer than 5 bytes", start)


def write_uvarint(w: bytearray, value: int) -> None:
    if value < 0:
        raise EncodeError(f"unsigned varint cannot hold {value}")
    while value >= 0x80:
        w.append((value & 0x7F) | 0x80)
        value >>= 7
    w.append(value)


class TagExtras(threading.local):
    """Per thread: ``count`` of the tagged sections read so far that held ``_unknown_tags`` or
    ``_tag_anomalies``. A decode reads it before and after (``TAG_EXTRAS.count``) to tell whether its
    message holds any, so the KIP-482 check need not walk every struct of every flexible frame."""

    # A class attribute, so a thread that never counted reads 0 without a failed lookup (a getattr
    # default pays for an AttributeError every time: more than the rest of a small frame's decode).
    count = 0


TAG_EXTRAS = TagExtras()


def read_tagged_section(
    b: bytes, p: int, limit: int, known: Mapping[int, tuple[str, TagReader]], keep_unknown: bool = True
) -> tuple[dict[str, Any], dict[str, Any], int]:
    """Read a tagged-field section: (known values by name, extra body keys, new position).

    Extra keys are ``_unknown_tags`` ({tag: raw bytes}, kept so re-encoding is lossless) and
    ``_tag_anomalies`` (tags out of order or repeated, known tags whose value does not fill the declared
    size): KIP-482 well-formedness evidence that the checks report on, without failing the decode.
    ``known`` is every tag known at the struct's version; a projected decode keeps no unknown tags
    (``keep_unknown=False``) but counts them in ``TAG_EXTRAS`` all the same.
    """
    start = p
    count, p = read_uvarint(b, p)
    if count * 2 > limit - p:
        raise DecodeError(f"tagged section claims {count} fields with {limit - p} bytes left", start)
    values: dict[str, Any] = {}
    unknown: dict[int, bytes] = {}
    anomalies: list[dict[str, Any]] = []
    unknown_seen = False
    last = -1
    seen: set[int] = set()
    for _ in range(count):
        at = p
        tag, p = read_uvarint(b, p)
        size, p = read_uvarint(b, p)
        end = p + size
        if end > limit:
            raise DecodeError(f"tagged field {tag} size {size} exceeds the {limit - p} bytes left", at)
        if tag in seen:
            anomalies.append({"tag": tag, "offset": at, "problem": "duplicate"})
        elif tag < last:
            anomalies.append({"tag": tag, "offset": at, "problem": "not ascending"})
        seen.add(tag)
        last = max(last, tag)
        entry = known.get(tag)
        if entry is not None:
            name, reader = entry
            value, used = reader(b, p, end)
            if used > end:
                raise DecodeError(f"tagged field {tag} ({name}) overruns its declared size {size}", at)
            if used < end:
                anomalies.append(
                    {"tag": tag, "offset": at, "problem": f"declared size {size}, value used {used - p}"}
                )
            values[name] = value
        else:
            unknown_seen = True
            if keep_unknown:
                unknown[tag] = b[p:end]
        p = end
    extras: dict[str, Any] = {}
    if unknown:
        extras["_unknown_tags"] = unknown
    if anomalies:
        extras["_tag_anomalies"] = anomalies
    if unknown_seen or anomalies:
        TAG_EXTRAS.count += 1
    return values, extras, p


def skip_tagged_section(b: bytes, p: int, limit: int, known: Mapping[int, tuple[str, TagReader]]) -> int:
    """Step over a tagged-field section (a projection skips its struct): ``read_tagged_section``
    without the values, which still counts the section in ``TAG_EXTRAS`` when it holds what that
    would report (so a projected decode's ``tag_extras`` is the whole decode's) and raises what it
    raises."""
    if b[p] == 0:
        return p + 1
    return read_tagged_section(b, p, limit, known, False)[2]


def uuid_bytes(value: Any) -> bytes:
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, bytes | bytearray) and len(value) == 16:
        return bytes(value)
    if isinstance(value, str):
        return uuid.UUID(value).bytes
    raise EncodeError(f"not a uuid: {value!r}")
