"""encode(decode(x)) == x for random valid bodies of every API and version."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

import codec
from tests.codec.strategies import ALL_MESSAGES, build_frame, decode_frame, messages, seeds


@pytest.mark.parametrize(("kind", "api_key", "version"), ALL_MESSAGES, ids=lambda v: str(v))
def test_every_api_version_round_trips(kind: str, api_key: int, version: int) -> None:
    for seed in range(4):
        frame = build_frame(kind, api_key, version, seed * 1_000_003 + api_key * 101 + version)
        decoded = decode_frame(kind, frame, api_key, version)
        assert codec.encode(decoded) == frame
        assert decoded.api_key == api_key
        if kind == "request":
            assert decoded.api_version == version


@settings(max_examples=400, deadline=None)
@given(message=messages, seed=seeds)
def test_round_trip_property(message: tuple[str, int, int], seed: int) -> None:
    kind, api_key, version = message
    frame = build_frame(kind, api_key, version, seed)
    first = decode_frame(kind, frame, api_key, version)
    again = codec.encode(first)
    assert again == frame
    assert decode_frame(kind, again, api_key, version).body == first.body


def test_table_covers_every_api_key_and_removed_versions() -> None:
    keys = codec.api_keys()
    assert keys == list(range(0, max(keys) + 1)), "api keys are contiguous in Kafka 4.4"
    # KIP-896: 4.0 removed these; the codec keeps them through the 3.9.2 definitions.
    assert codec.supported_versions(0)[0] == 0  # Produce v0-v2
    assert codec.supported_versions(1)[0] == 0  # Fetch v0-v3
    assert codec.api_name(0) == "Produce"
    assert codec.api_name(74) == "ListConfigResources"  # renamed from ListClientMetricsResources in 4.x
