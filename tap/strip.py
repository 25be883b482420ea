"""The ``headers`` capture of a record-carrying frame, without decoding or re-encoding the frame.

``headers`` keeps every field of a Produce request or a Fetch/ShareFetch response and only strips
the record payloads (``codec.records.strip_payloads``: each batch keeps its header). Decoding the
whole message and encoding it again cost more than everything else the tap does with such a frame.
Instead, a plan compiled once per API, direction and version from the schema (``codec.schema``)
walks the frame, skipping every field by its wire size, and notes where each ``records`` field lies;
the value is then the frame's bytes between those fields, spliced with each stripped section and its
new length. The result is byte for byte what decoding, stripping and encoding gives
(tests/tap/test_strip.py checks every version against the codec); anything the walk does not
recognise raises ``DecodeError`` and ``capture`` falls back to the codec.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Union

from codec.api import request_spec, response_spec
from codec.errors import DecodeError
from codec.records import HEADER_SIZE, LOG_OVERHEAD, STRIPPED_LENGTH
from codec.schema import FIXED_FORMATS, FIXED_SIZES, FieldSpec
from codec.wire import read_uvarint, write_uvarint

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")

# A plan is a tuple of steps, each a tuple whose first item says what to skip:
#   (_FIXED, n)                 n bytes
#   (_SIZED, flexible, width)   a length-prefixed string/bytes (width 2 or 4 when not flexible)
#   (_RECORDS, flexible)        a records field: its span is noted
#   (_ARRAY, flexible, plan)    a count, then the plan once per element
#   (_STRUCT, plan)             a nullable struct (int8 marker), then the plan
#   (_TAGS,)                    a tagged-field section
_FIXED, _SIZED, _RECORDS, _ARRAY, _STRUCT, _TAGS = range(6)
Step = tuple[Union[int, bool, "Plan"], ...]
Plan = tuple[Step, ...]
#: (start of the length field, start of the data, end of the data, flexible)
Span = tuple[int, int, int, bool]

_plans: dict[tuple[int, bool, int], Plan] = {}


def _compile(fields: tuple[FieldSpec, ...], version: int, flexible: bool) -> Plan:
    steps: list[Step] = []

    def fixed(n: int) -> None:
        last = steps[-1] if steps else None
        if last is not None and last[0] == _FIXED and isinstance(last[1], int):
            steps[-1] = (_FIXED, last[1] + n)  # one skip for a run of fixed-width fields
        else:
            steps.append((_FIXED, n))

    for spec in fields:
        if not spec.present(version) or spec.tagged_at(version):
            continue
        flex = spec.flexible_at(version, flexible)
        element = spec.element
        if spec.is_array:
            if spec.is_struct:
                assert spec.fields is not None
                inner = _compile(spec.fields, version, flexible)
            else:
                inner = _compile_scalar(element, flex)
            steps.append((_ARRAY, flex, inner))
        elif spec.is_struct:
            assert spec.fields is not None
            inner = _compile(spec.fields, version, flexible)
            if spec.nullable_at(version):
                steps.append((_STRUCT, inner))
            else:
                steps.extend(inner)
        elif element in FIXED_FORMATS:
            fixed(FIXED_SIZES[FIXED_FORMATS[element]])
        elif element == "uuid":
            fixed(16)
        elif element == "records":
            steps.append((_RECORDS, flex))
        else:
            steps.extend(_compile_scalar(element, flex))
    if flexible:
        steps.append((_TAGS,))
    return tuple(steps)


def _compile_scalar(element: str, flexible: bool) -> Plan:
    if element in FIXED_FORMATS:
        return ((_FIXED, FIXED_SIZES[FIXED_FORMATS[element]]),)
    if element == "uuid":
        return ((_FIXED, 16),)
    if element == "string":
        return ((_SIZED, flexible, 2),)
    if element == "bytes":
        return ((_SIZED, flexible, 4),)
    if element == "records":
        return ((_RECORDS, flexible),)
    raise DecodeError(f"no wire size for type {element!r}", 0, what="strip plan")


def plan(api_key: int, request: bool, version: int) -> Plan:
    key = (api_key, request, version)
    found = _plans.get(key)
    if found is None:
        spec = request_spec(api_key) if request else response_spec(api_key)
        segment = spec.segment(version)
        if segment is None:
            raise DecodeError(f"no schema for version {version}", 0, what=spec.name)
        found = _plans[key] = _compile(segment.fields, version, segment.flexible_at(version))
    return found


def _walk(buf: bytes, pos: int, steps: Plan, spans: list[Span]) -> int:
    for step in steps:
        kind = step[0]
        if kind == _FIXED:
            pos += step[1]  # type: ignore[operator]
        elif kind == _SIZED:
            if step[1]:
                size, pos = read_uvarint(buf, pos)
                size -= 1
            elif step[2] == 2:
                size = _INT16.unpack_from(buf, pos)[0]
                pos += 2
            else:
                size = _INT32.unpack_from(buf, pos)[0]
                pos += 4
            if size > 0:
                pos += size
        elif kind == _RECORDS:
            at = pos
            if step[1]:
                size, pos = read_uvarint(buf, pos)
                size -= 1
            else:
                size = _INT32.unpack_from(buf, pos)[0]
                pos += 4
            if size > 0:
                if pos + size > len(buf):
                    raise DecodeError("records run past the frame", pos, what="strip")
                spans.append((at, pos, pos + size, bool(step[1])))
                pos += size
        elif kind == _ARRAY:
            if step[1]:
                count, pos = read_uvarint(buf, pos)
                count -= 1
            else:
                count = _INT32.unpack_from(buf, pos)[0]
                pos += 4
            inner: Plan = step[2]  # type: ignore[assignment]
            for _ in range(max(count, 0)):
                pos = _walk(buf, pos, inner, spans)
        elif kind == _STRUCT:
            present = buf[pos] != 0xFF  # int8 -1: null
            pos += 1
            if present:
                pos = _walk(buf, pos, step[1], spans)  # type: ignore[arg-type]
        else:  # tagged fields
            count, pos = read_uvarint(buf, pos)
            for _ in range(count):
                _, pos = read_uvarint(buf, pos)
                size, pos = read_uvarint(buf, pos)
                pos += size
        if pos > len(buf):
            raise DecodeError("field runs past the frame", pos, what="strip")
    return pos


def top_level_tags(frame: bytes, body: int, api_key: int, request: bool, version: int) -> list[int]:
    """The tags of a message's top-level tagged fields (none for a version that is not flexible),
    found by walking past every other field by its wire size: nothing is decoded. Raises
    ``DecodeError`` when the frame does not walk to its exact end."""
    steps = plan(api_key, request, version)
    if not steps or steps[-1][0] != _TAGS:
        return []
    tags: list[int] = []
    try:
        pos = _walk(frame, body, steps[:-1], [])
        count, pos = read_uvarint(frame, pos)
        for _ in range(count):
            tag, pos = read_uvarint(frame, pos)
            size, pos = read_uvarint(frame, pos)
            pos += size
            tags.append(tag)
    except (struct.error, IndexError) as exc:
        raise DecodeError(f"frame too short: {exc}", body, what="tags") from None
    if pos != len(frame):
        raise DecodeError(f"walk ended at {pos} of {len(frame)} bytes", pos, what="tags")
    return tags


_STRIPPED_LENGTH = _INT32.pack(STRIPPED_LENGTH)


def strip_v2_section(buf: bytes | memoryview, start: int, end: int) -> bytes | None:
    """``codec.records.strip_payloads(buf[start:end])`` for a section of magic-2 batches, read in
    place (copying the section first cost more than the stripping); None for anything else (legacy
    batches, a malformed entry), which the caller leaves to ``strip_payloads``. Each batch keeps its
    61-byte header with batchLength set to the header-only length; a cut-off tail keeps its header
    when it has one (tests/tap/test_strip.py compares the two on any section)."""
    out = bytearray()
    p = start
    while end - p >= LOG_OVERHEAD:
        length = _INT32.unpack_from(buf, p + 8)[0]
        q = p + LOG_OVERHEAD + length
        if q > end:
            break  # a partial tail (Fetch responses cut the last batch anywhere)
        if length < STRIPPED_LENGTH or buf[p + 16] != 2:
            return None
        out += buf[p : p + 8]
        out += _STRIPPED_LENGTH
        out += buf[p + LOG_OVERHEAD : p + HEADER_SIZE]
        p = q
    if end - p >= 17:
        if buf[p + 16] != 2:
            return None
        if end - p >= HEADER_SIZE:
            out += buf[p : p + 8]
            out += _STRIPPED_LENGTH
            out += buf[p + LOG_OVERHEAD : p + HEADER_SIZE]
    return bytes(out)


def strip_frame(
    frame: bytes, body: int, api_key: int, request: bool, version: int, strip: Callable[[bytes], bytes]
) -> bytes:
    """``frame`` (no size prefix; its body at offset ``body``) with every records field stripped
    (``strip_v2_section``, else ``strip(field)``). Raises ``DecodeError`` when the frame does not walk
    to its exact end."""
    spans: list[Span] = []
    try:
        end = _walk(frame, body, plan(api_key, request, version), spans)
    except (struct.error, IndexError) as exc:
        raise DecodeError(f"frame too short: {exc}", body, what="strip") from None
    if end != len(frame):
        raise DecodeError(f"walk ended at {end} of {len(frame)} bytes", end, what="strip")
    out = bytearray()
    prev = 0
    view = memoryview(frame)
    for at, start, stop, flexible in spans:
        out += view[prev:at]
        stripped = strip_v2_section(view, start, stop)
        if stripped is None:
            stripped = strip(frame[start:stop])
        if flexible:
            write_uvarint(out, len(stripped) + 1)
        else:
            out += _INT32.pack(len(stripped))
        out += stripped
        prev = stop
    out += view[prev:]
    return bytes(out)
