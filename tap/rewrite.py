"""Opt-in response rewriting (pure): broker addresses to the tap's, and ApiVersions clamped to the codec.

Only small control-plane responses are rewritten, so the tap can hold them whole. A broker id with
no configured tap listener goes to ``resolve`` (the tap opens a listener for it on the fly, see
tap/listeners.py); without one, or when it returns None, the broker keeps its own address.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

import codec
from codec.api import response_spec
from codec.errors import DecodeError
from codec.protocol import ApiKey
from codec.schema import FieldSpec
from tap.capture import FrameInfo, header_end
from tap.strip import top_level_tags

ADDRESS_APIS = frozenset({ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER})
#: Data-path responses that may carry ``NodeEndpoints`` (KIP-951 leader hints, share groups). They are
#: held only up to this size: the hints come with NOT_LEADER-style errors, in small responses, and a
#: large fetch response must keep streaming.
ENDPOINT_APIS = frozenset({ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE})
ENDPOINT_MAX_HELD = 1 << 20

Addresses = Mapping[int, tuple[str, int]]
#: (broker id, host, port as the broker reported them) -> the tap's address for it, or None.
Resolver = Callable[[int, str, int], tuple[str, int] | None]


def _swap(node: dict[str, Any], id_field: str, addresses: Addresses, resolve: Resolver | None) -> bool:
    node_id = node.get(id_field, -1)
    target = addresses.get(node_id)
    if target is None and resolve is not None and node_id >= 0 and node.get("Host"):
        target = resolve(node_id, node["Host"], node["Port"])
    if target is None or (node.get("Host"), node.get("Port")) == target:
        return False
    node["Host"], node["Port"] = target
    return True


def _rewrite_addresses(
    api_key: int, body: dict[str, Any], addresses: Addresses, resolve: Resolver | None
) -> bool:
    changed = False
    if api_key == ApiKey.METADATA:
        for broker in body.get("Brokers") or ():
            changed = _swap(broker, "NodeId", addresses, resolve) or changed
    elif api_key == ApiKey.DESCRIBE_CLUSTER:
        for broker in body.get("Brokers") or ():
            changed = _swap(broker, "BrokerId", addresses, resolve) or changed
    elif api_key in ENDPOINT_APIS:
        for endpoint in body.get("NodeEndpoints") or ():
            changed = _swap(endpoint, "NodeId", addresses, resolve) or changed
    elif api_key == ApiKey.FIND_COORDINATOR:
        if "Coordinators" in body:  # v4+: one entry per key
            for coordinator in body.get("Coordinators") or ():
                changed = _swap(coordinator, "NodeId", addresses, resolve) or changed
        elif body.get("ErrorCode", 0) == 0:
            changed = _swap(body, "NodeId", addresses, resolve)
    return changed


def _clamp(body: dict[str, Any]) -> bool:
    """Advertise only versions the codec (and so the monitor) understands; drop unknown APIs."""
    known = set(codec.api_keys())
    kept = []
    changed = False
    for entry in body.get("ApiKeys") or ():
        key = entry["ApiKey"]
        if key not in known:
            changed = True
            continue
        low, high = codec.supported_versions(key)
        new_min, new_max = max(entry["MinVersion"], low), min(entry["MaxVersion"], high)
        if new_min > new_max:
            changed = True
            continue
        if (new_min, new_max) != (entry["MinVersion"], entry["MaxVersion"]):
            entry["MinVersion"], entry["MaxVersion"] = new_min, new_max
            changed = True
        kept.append(entry)
    body["ApiKeys"] = kept
    return changed


def held_apis(rewrite_addresses: bool, clamp_api_versions: bool) -> frozenset[int]:
    apis: set[int] = set()
    if rewrite_addresses:
        apis |= ADDRESS_APIS | ENDPOINT_APIS
    if clamp_api_versions:
        apis.add(ApiKey.API_VERSIONS)
    return frozenset(apis)


@cache
def _endpoints_field(api_key: int, version: int) -> FieldSpec | None:
    """The response's ``NodeEndpoints`` field at ``version`` (None where the version has none)."""
    segment = response_spec(api_key).segment(version)
    if segment is None:
        return None
    return next((f for f in segment.fields if f.name == "NodeEndpoints" and f.present(version)), None)


def may_carry_endpoints(frame: bytes, api_key: int, version: int) -> bool:
    """Whether a data-path response (``ENDPOINT_APIS``) can hold broker addresses, known without
    decoding it: Produce and Fetch send KIP-951's ``NodeEndpoints`` as a top-level tagged field only
    with a leader change, so the rest pass as they are. A version with the field untagged (the share
    APIs) is decoded to see; a frame the walk cannot read is left to the codec."""
    field = _endpoints_field(api_key, version)
    if field is None:
        return False
    if not field.tagged_at(version):
        return True
    try:
        body = header_end(frame, FrameInfo("resp", len(frame), api_key, version))
        return field.tag in top_level_tags(frame, body, api_key, False, version)
    except DecodeError:
        return True


def rewrite_response(
    frame: bytes,
    api_key: int,
    api_version: int,
    addresses: Addresses,
    clamp: bool = False,
    resolve: Resolver | None = None,
) -> bytes | None:
    """The rewritten frame (no size prefix), or None to forward the original unchanged.

    A frame that does not decode is forwarded unchanged: the client must see what the broker said.
    """
    if api_key in ENDPOINT_APIS and not may_carry_endpoints(frame, api_key, api_version):
        return None
    try:
        message = codec.decode_response(frame, api_key, api_version)
    except codec.DecodeError:
        return None
    if api_key == ApiKey.API_VERSIONS:
        changed = clamp and _clamp(message.body)
    else:
        changed = _rewrite_addresses(api_key, message.body, addresses, resolve)
    if not changed:
        return None
    try:
        return codec.encode(message)
    except Exception:
        return None
