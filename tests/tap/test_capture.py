"""Capture policies and redaction, on bytes alone: secrets never leave in any policy or version."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import codec
from codec.samples import random_request_body, random_response_body
from tap.capture import SECRETS, Captured, Direction, FrameInfo, capture, header_end

MARKER = b"s3cr3t-MARKER-pw"
POLICIES = ("full", "headers", "meta")


def _plant(node: Any, parts: list[str]) -> int:
    """Put MARKER at ``parts``; returns how many places got it."""
    name, rest = parts[0], parts[1:]
    if name.endswith("[]"):
        return sum(_plant(item, rest) for item in node[name[:-2]] or [])
    if rest:
        return _plant(node[name], rest)
    node[name] = MARKER
    return 1


def _secret_frame(api_key: int, direction: Direction, version: int, seed: int) -> bytes:
    rng = random.Random(seed)
    for _ in range(200):
        if direction == "req":
            body = random_request_body(api_key, version, rng)
        else:
            body = random_response_body(api_key, version, rng)
        planted = sum(_plant(body, path.split(".")) for path in SECRETS[(api_key, direction)])
        if planted:
            break
    else:
        pytest.skip("no body with a secret-bearing element")
    if direction == "req":
        return codec.encode_request(api_key, version, 42, "client", body)
    return codec.encode_response(api_key, version, 42, body)


CASES = [
    (api_key, direction, version)
    for (api_key, direction) in SECRETS
    for version in range(codec.supported_versions(api_key)[0], codec.supported_versions(api_key)[1] + 1)
]


@pytest.mark.parametrize(("api_key", "direction", "version"), CASES)
@pytest.mark.parametrize("policy", POLICIES)
def test_secrets_never_leave(api_key: int, direction: Direction, version: int, policy: str) -> None:
    frame = _secret_frame(api_key, direction, version, seed=api_key * 100 + version)
    assert MARKER in frame
    info = FrameInfo(direction, len(frame), api_key, version)
    out = capture(frame, info, policy, 900_000)  # type: ignore[arg-type]
    assert MARKER not in out.value
    assert out.redacted == SECRETS[(api_key, direction)]
    if policy != "meta":
        # The redacted frame still decodes, so checks keep everything but the secret.
        if direction == "req":
            assert codec.decode_request(out.value).api_key == api_key
        else:
            codec.decode_response(out.value, api_key, version)


@settings(max_examples=200, deadline=None)
@given(tail=st.binary(max_size=64), policy=st.sampled_from(POLICIES))
def test_undecodable_secret_frame_fails_closed(tail: bytes, policy: str) -> None:
    frame = codec.encode_request(36, 2, 7, "c", {"AuthBytes": MARKER})[:12] + MARKER + tail
    out = capture(frame, FrameInfo("req", len(frame), 36, 2), policy, 900_000)  # type: ignore[arg-type]
    assert MARKER not in out.value
    assert "AuthBytes" in out.redacted


@given(token=st.binary(max_size=200), policy=st.sampled_from(POLICIES))
def test_raw_sasl_tokens_are_never_mirrored(token: bytes, policy: str) -> None:
    out = capture(token, FrameInfo("req", len(token), sasl_token=True), policy, 900_000)  # type: ignore[arg-type]
    assert out.value == b"" and out.redacted == ("sasl_token",)


def _api_versions() -> bytes:
    return codec.encode_request(18, 3, 5, "cli", {"ClientSoftwareName": "x", "ClientSoftwareVersion": "1"})


def test_full_keeps_ordinary_frames_unchanged() -> None:
    frame = _api_versions()
    assert capture(frame, FrameInfo("req", len(frame), 18, 3), "full", 900_000) == Captured(frame)


def test_meta_keeps_the_header_only() -> None:
    frame = _api_versions()
    out = capture(frame, FrameInfo("req", len(frame), 18, 3), "meta", 900_000)
    assert out.value == frame[: codec.decode_request_header(frame)[2]]
    assert codec.decode_request_header(out.value)[0]["ClientId"] == "cli"


def test_too_big_frames_are_truncated_and_flagged() -> None:
    frame = _api_versions()
    out = capture(frame, FrameInfo("req", len(frame), 18, 3), "full", 10)
    assert out.flags == {"truncated": "1", "orig_size": str(len(frame))}
    assert out.value == frame[: header_end(frame, FrameInfo("req", len(frame)))]


def test_partial_head_is_truncated() -> None:
    frame = _api_versions()
    out = capture(frame[:16], FrameInfo("req", 10_000_000, 18, 3), "full", 900_000)
    assert out.flags["truncated"] == "1" and out.flags["orig_size"] == "10000000"


def test_flexible_response_header_end() -> None:
    frame = codec.encode_response(
        36, 2, 9, {"ErrorCode": 0, "ErrorMessage": None, "AuthBytes": b"x", "SessionLifetimeMs": 0}
    )
    assert header_end(frame, FrameInfo("resp", len(frame), 36, 2)) == 5
    assert header_end(frame, FrameInfo("resp", len(frame), 36, 0)) == 4


def test_headers_policy_without_strip_falls_back_or_strips() -> None:
    # Produce requests in the headers policy either carry stripped batches or fall back to meta;
    # they never carry the payload.
    rng = random.Random(3)
    body = random_request_body(0, 9, rng)
    frame = codec.encode_request(0, 9, 1, "p", body)
    out = capture(frame, FrameInfo("req", len(frame), 0, 9), "headers", 900_000)
    assert len(out.value) <= len(frame)
