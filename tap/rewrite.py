"""Opt-in response rewriting (pure): broker addresses to the tap's, and ApiVersions clamped to the codec.

Only small control-plane responses are rewritten, so the tap can hold them whole. A broker id with
no configured tap listener goes to ``resolve`` (the tap opens a listener for it on the fly, see
tap/listeners.py); without one, or when it returns None, the broker keeps its own address.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import codec
from codec.protocol import ApiKey

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
