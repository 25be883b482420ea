"""Shared hypothesis strategies and frame builders for the codec tests."""

from __future__ import annotations

import random
from collections.abc import Iterator

from hypothesis import strategies as st

import codec
from codec.api import request_spec, response_spec
from codec.samples import BodyBuilder

#: Every (kind, api_key, version) the schema table defines.
ALL_MESSAGES: list[tuple[str, int, int]] = [
    (kind, key, version)
    for key in codec.api_keys()
    for kind, spec in (("request", request_spec(key)), ("response", response_spec(key)))
    for version in spec.versions()
]


def records_value(rng: random.Random) -> bytes | None:
    """A records field: empty, or one or two real v2 batches (with and without compression)."""
    from codec.records import build_record_batch

    pick = rng.random()
    if pick < 0.3:
        return b""
    count = rng.randint(1, 2)
    out = b""
    for i in range(count):
        records = [
            (rng.randbytes(rng.randint(0, 4)) or None, rng.randbytes(rng.randint(0, 20))) for _ in range(3)
        ]
        out += build_record_batch(
            records,
            producer_id=rng.randint(-1, 1000),
            producer_epoch=rng.randint(-1, 5),
            base_sequence=rng.randint(-1, 100),
            base_offset=i * 10,
            compression=rng.choice([0, 1]),
        )
    return out


def build_frame(kind: str, api_key: int, version: int, seed: int, unknown_tags: bool = True) -> bytes:
    rng = random.Random(seed)
    builder = BodyBuilder(rng, unknown_tags=unknown_tags, records=records_value)
    if kind == "request":
        body = builder.body(request_spec(api_key), version)
        return codec.encode_request(api_key, version, rng.randint(-(2**31), 2**31 - 1), "kpmon-test", body)
    body = builder.body(response_spec(api_key), version)
    return codec.encode_response(api_key, version, rng.randint(0, 2**31 - 1), body)


def decode_frame(kind: str, frame: bytes, api_key: int, version: int) -> codec.Request | codec.Response:
    if kind == "request":
        return codec.decode_request(frame)
    return codec.decode_response(frame, api_key, version)


def iter_frames(seeds: int) -> Iterator[tuple[str, int, int, bytes]]:
    for kind, key, version in ALL_MESSAGES:
        for seed in range(seeds):
            yield kind, key, version, build_frame(kind, key, version, seed * 7919 + key * 131 + version)


messages = st.sampled_from(ALL_MESSAGES)
seeds = st.integers(min_value=0, max_value=2**32 - 1)
