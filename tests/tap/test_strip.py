"""``headers`` capture by splicing (tap/strip.py): byte for byte what decoding, stripping and encoding
gives, for every version of every record-carrying message, and stripped sections equal to the codec's."""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import codec
from codec.api import request_spec, response_spec
from codec.errors import DecodeError
from codec.records import build_record_batch, strip_payloads
from codec.samples import random_request_body, random_response_body
from tap.capture import FrameInfo, _decode, _strip_records, capture, header_end
from tap.strip import strip_frame, strip_v2_section

RECORD_CARRIERS = [(0, True), (1, False), (78, False)]  # Produce requests, Fetch and ShareFetch responses


def _batches(rng: random.Random, cut: bool) -> bytes:
    out = b"".join(
        build_record_batch(
            [(b"k", rng.randbytes(rng.randrange(0, 300))) for _ in range(rng.randrange(1, 5))],
            base_offset=rng.randrange(0, 1 << 40),
            producer_id=rng.choice([-1, 7]),
            control=False,
        )
        for _ in range(rng.randrange(1, 4))
    )
    if cut:
        out += build_record_batch([(b"k", b"v" * 200)])[: rng.randrange(1, 120)]  # a Fetch cuts anywhere
    return out


def _fill_records(node: Any, rng: random.Random, cut: bool) -> None:
    if isinstance(node, list):
        for item in node:
            _fill_records(item, rng, cut)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "Records":
                # None stays None (only where the field is nullable does the sample hold one).
                node[key] = (
                    None if value is None else rng.choice([b"", _batches(rng, cut), _batches(rng, cut)])
                )
            elif isinstance(value, list | dict):
                _fill_records(value, rng, cut)


def _codec_way(frame: bytes, info: FrameInfo) -> bytes:
    message = _decode(frame, info)
    _strip_records(message.body, strip_payloads)
    return codec.encode(message)


def _frames(api_key: int, request: bool, seed: int) -> list[tuple[int, bytes]]:
    spec = request_spec(api_key) if request else response_spec(api_key)
    out = []
    for version in spec.versions():
        for attempt in range(100):  # a sample with at least one records field to strip
            rng = random.Random(seed * 100_000 + version * 100 + attempt)
            sample = random_request_body if request else random_response_body
            body = sample(api_key, version, rng)
            if "'Records'" in repr(body):
                break
        _fill_records(body, rng, cut=not request)
        if request:
            frame = codec.encode_request(api_key, version, 5, "client", body)
        else:
            frame = codec.encode_response(api_key, version, 5, body)
        out.append((version, frame))
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("api_key", "request_side"), RECORD_CARRIERS)
def test_splice_equals_decode_strip_encode_for_every_version(
    api_key: int, request_side: bool, seed: int
) -> None:
    spliced = 0  # frames whose payloads were stripped
    for version, frame in _frames(api_key, request_side, seed):
        info = FrameInfo("req" if request_side else "resp", len(frame), api_key, version)
        expected = _codec_way(frame, info)
        got = strip_frame(frame, header_end(frame, info), api_key, request_side, version, strip_payloads)
        assert got == expected, f"api {api_key} v{version}"
        assert capture(frame, info, "headers", 10**9).value == expected
        spliced += expected != frame
    assert spliced, "no version carried a payload to strip: the comparison proved nothing"


def test_a_frame_that_does_not_walk_to_its_end_is_refused() -> None:
    version, frame = _frames(1, False, 1)[-1]
    info = FrameInfo("resp", len(frame), 1, version)
    body = header_end(frame, info)
    with pytest.raises(DecodeError):
        strip_frame(frame + b"\x00", body, 1, False, version, strip_payloads)
    with pytest.raises(DecodeError):
        strip_frame(frame[:-3], body, 1, False, version, strip_payloads)


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=400), min_size=0, max_size=5),
    tail=st.integers(min_value=0, max_value=200),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_sections_strip_like_the_codec(sizes: list[int], tail: int, seed: int) -> None:
    rng = random.Random(seed)
    section = b"".join(build_record_batch([(None, rng.randbytes(n))]) for n in sizes)
    section += build_record_batch([(b"k", rng.randbytes(150))])[:tail]
    framed = b"pad" + section + b"pad"
    assert strip_v2_section(framed, 3, 3 + len(section)) == strip_payloads(section)


def test_sections_the_codec_must_judge_are_left_to_it() -> None:
    batch = build_record_batch([(b"k", b"v")])
    bad_magic = batch[:16] + b"\x01" + batch[17:]
    too_short = batch[:8] + struct.pack(">i", 10) + batch[12:22]
    for section in (bad_magic, too_short):
        assert strip_v2_section(section, 0, len(section)) is None
