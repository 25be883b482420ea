"""Bad input raises DecodeError, and nothing else, with a location; no allocation beyond the input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import codec
from codec import DecodeError
from tests.codec.strategies import build_frame, decode_frame, messages, seeds


@settings(max_examples=600, deadline=None)
@given(message=messages, seed=seeds, data=st.data())
def test_mutated_frames_raise_only_decode_error(
    message: tuple[str, int, int], seed: int, data: st.DataObject
) -> None:
    kind, api_key, version = message
    frame = bytearray(build_frame(kind, api_key, version, seed))
    mutation = data.draw(st.sampled_from(["truncate", "flip", "insert", "lengths"]))
    if mutation == "truncate":
        frame = frame[: data.draw(st.integers(0, max(0, len(frame) - 1)))]
    elif mutation == "flip" and frame:
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(frame) - 1))
            frame[i] = data.draw(st.integers(0, 255))
    elif mutation == "insert":
        i = data.draw(st.integers(0, len(frame)))
        frame[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    elif len(frame) >= 8:
        # Overwrite an aligned word with a huge or negative length: the classic allocation bomb.
        i = data.draw(st.integers(4, len(frame) - 4))
        frame[i : i + 4] = struct.pack(">i", data.draw(st.sampled_from([2**31 - 1, -2, 0x7FFF0000, 65535])))
    try:
        decode_frame(kind, bytes(frame), api_key, version)
    except DecodeError as exc:
        assert 0 <= exc.offset <= len(frame)
        assert exc.reason


@settings(max_examples=300, deadline=None)
@given(garbage=st.binary(max_size=200), api_key=st.integers(-5, 100), version=st.integers(-2, 20))
def test_garbage_raises_only_decode_error(garbage: bytes, api_key: int, version: int) -> None:
    for call in (
        lambda: codec.decode_request(garbage),
        lambda: codec.decode_response(garbage, api_key, version),
    ):
        try:
            call()
        except DecodeError:
            pass


def test_error_carries_api_version_offset_and_reason() -> None:
    frame = build_frame("request", 0, 9, seed=1)
    with pytest.raises(DecodeError) as info:
        codec.decode_request(frame[:20])
    err = info.value
    assert (err.api_key, err.api_version) == (0, 9)
    assert 0 < err.offset <= 20
    assert "api_key=0" in str(err) and "v9" in str(err)


def test_huge_array_length_is_rejected_before_looping() -> None:
    # Metadata v1 request: Topics is an int32-length array; claim 2^31-1 entries with 0 bytes behind it.
    frame = codec.encode_request(3, 1, 1, "c", {"Topics": []})
    bad = frame[:-4] + struct.pack(">i", 2**31 - 1)
    with pytest.raises(DecodeError, match="exceeds"):
        codec.decode_request(bad)


def test_unknown_api_key_and_version() -> None:
    with pytest.raises(DecodeError, match="unknown api key"):
        codec.decode_request(struct.pack(">hhih", 999, 0, 1, -1))
    with pytest.raises(DecodeError, match="not defined"):
        codec.decode_request(struct.pack(">hhih", 18, 99, 1, -1))


def test_deep_nesting_and_tag_bombs_do_not_hang() -> None:
    # A tagged section claiming 2^28 fields must fail fast on the size check.
    frame = bytearray(
        codec.encode_request(18, 3, 1, "c", {"ClientSoftwareName": "a", "ClientSoftwareVersion": "b"})
    )
    frame[-1:] = b"\xff\xff\xff\x7f"
    with pytest.raises(DecodeError):
        codec.decode_request(bytes(frame))
