"""Message bodies: the decode plan of one message version under one projection, run by ``codec.api``
for frames and here for ``data`` messages (no header: the consumer protocol, EndTxnMarker...), which
the nested payloads (``codec.nested``) decode.

Every generated decoder and encoder lives in one compiled schema, ``COMPILED``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from codec.compiler import CompiledSchema, Decoder, Projection, normalize_projection, projection_key
from codec.errors import DecodeError
from codec.schema import MessageSpec, Segment, load_table
from codec.wire import EncodeError

COMPILED = CompiledSchema()


def version_segment(spec: MessageSpec, version: int, api_key: int | None) -> Segment:
    seg = spec.segment(version)
    if seg is None:
        raise DecodeError(
            f"{spec.name} v{version} is not defined (known: v{spec.min_version}-v{spec.max_version})",
            0,
            api_key,
            version,
        )
    return seg


def to_bytes(buf: bytes | bytearray | memoryview) -> bytes:
    return buf if type(buf) is bytes else bytes(buf)


@dataclass(frozen=True, slots=True, eq=False)
class BodyPlan:
    """How to decode one message version's body under one projection."""

    message: str
    api_key: int | None
    version: int
    #: The projection after normalising it against this version's fields: None = a full decode
    #: (also when the caller's projection keeps every field), and then the plan is the full one.
    projection: Projection | None
    decoder: Decoder


#: (id(segment), version, projection key) → body plan, shared by every projection normalising to it.
_body_plans: dict[tuple[int, int, Any], BodyPlan] = {}


def body_plan(spec: MessageSpec, version: int, api_key: int | None, tree: Projection | None) -> BodyPlan:
    seg = version_segment(spec, version, api_key)
    normal = normalize_projection(seg.fields, version, tree)
    key = (id(seg), version, projection_key(normal))
    plan = _body_plans.get(key)
    if plan is None:
        decoder = COMPILED.decoder(seg, version, normal, f"{spec.name} v{version}")
        plan = _body_plans[key] = BodyPlan(spec.name, api_key, version, normal, decoder)
    return plan


def decode_body(plan: BodyPlan, buf: bytes, pos: int) -> dict[str, Any]:
    size = len(buf)
    try:
        body, end = plan.decoder(buf, pos, size)
    except DecodeError as exc:
        # Annotated in place and re-raised, so the traceback keeps the generated decoder's frames.
        exc.locate(plan.api_key, plan.version, plan.message)
        raise
    except RecursionError:
        raise DecodeError(
            "structure nested too deeply", pos, plan.api_key, plan.version, plan.message
        ) from None
    if end != size:
        if end > size:
            raise DecodeError(
                f"{plan.message} runs {end - size} bytes past the frame", size, plan.api_key, plan.version
            )
        # Bytes after the body: the broker ignores them; kept so encode(decode(x)) == x, and kept by a
        # projected decode too, since they are the KIP-482 check's evidence whatever else it reads.
        body["_trailing"] = buf[end:]
    return body


def decode_data(name: str, version: int, buf: bytes | bytearray | memoryview, pos: int = 0) -> dict[str, Any]:
    """Decode a ``data`` message (ConsumerProtocolSubscription, EndTxnMarker...) body at ``version``."""
    data = to_bytes(buf)
    plan = _data_plans.get((name, version))
    if plan is None:
        spec = load_table().by_name.get(name)
        if spec is None:
            raise DecodeError(f"no message definition named {name}", pos, what=name)
        plan = _data_plans[(name, version)] = body_plan(spec, version, None, None)
    return decode_body(plan, data, pos)


_data_plans: dict[tuple[str, int], BodyPlan] = {}


def data_max_version(name: str) -> int:
    """The newest version of a ``data`` message this codec knows."""
    return _data_max_versions(name)


@cache
def _data_max_versions(name: str) -> int:
    return load_table().by_name[name].max_version


def encode_data(name: str, version: int, body: Mapping[str, Any]) -> bytes:
    spec = load_table().by_name[name]
    out = bytearray()
    seg = spec.segment(version)
    if seg is None:
        raise EncodeError(f"{name} v{version} is not defined")
    COMPILED.encoder(seg, version, f"{name}v{version}")(body, out)
    trailing = body.get("_trailing")
    if trailing:
        out += trailing
    return bytes(out)
