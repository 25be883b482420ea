"""Frame splitting under any chunking, correlation pruning, and legacy SASL token tracking."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tap.framing import Correlations, FrameError, FrameSplitter, Pending, SaslState


def _stream(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
    retain=st.integers(min_value=0, max_value=400),
)
def test_any_chunking_yields_the_same_frames(payloads: list[bytes], cuts: list[int], retain: int) -> None:
    data = _stream(payloads)
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    splitter = FrameSplitter(retain)
    frames = []
    for a, b in itertools.pairwise(points):
        frames.extend(splitter.feed(data[a:b]))
    assert [f.size for f in frames] == [len(p) for p in payloads]
    assert [f.head for f in frames] == [p[:retain] for p in payloads]
    assert not splitter.mid_frame


def test_partial_frame_is_mid_frame() -> None:
    splitter = FrameSplitter(10)
    assert splitter.feed(b"\x00\x00\x00\x05ab") == []
    assert splitter.mid_frame


@pytest.mark.parametrize("size", [-1, -(2**31), 2**30 + 1])
def test_absurd_sizes_are_refused(size: int) -> None:
    with pytest.raises(FrameError):
        FrameSplitter(10).feed(struct.pack(">i", size) + b"xx")


def test_large_frame_retains_only_its_head() -> None:
    splitter = FrameSplitter(16)
    chunk = b"y" * 65536
    out = splitter.feed(struct.pack(">i", 10 * len(chunk)))
    for _ in range(10):
        out += splitter.feed(chunk)
    assert len(out) == 1 and out[0].size == 655360 and out[0].head == b"y" * 16
    assert not out[0].complete


def test_correlations_drop_unanswered_older_requests() -> None:
    c = Correlations()
    for corr in (1, 2, 3):
        c.add(corr, Pending(0, 9, 0))
    found = c.match(2)
    assert found is not None and found.api_key == 0
    assert len(c) == 1  # corr 1 (acks=0) will never be answered
    assert c.match(1) is None
    assert c.match(3) is not None


def test_correlations_are_capped() -> None:
    c = Correlations(cap=3)
    for corr in range(10):
        c.add(corr, Pending(1, 1, 0))
    assert len(c) == 3


@pytest.mark.parametrize(("mechanism", "rounds"), [("PLAIN", 1), ("SCRAM-SHA-512", 2)])
def test_sasl_v0_tokens_then_requests(mechanism: str, rounds: int) -> None:
    s = SaslState()
    s.on_handshake_v0(mechanism)
    assert not s.client_frame_is_token()  # nothing raw before the handshake response
    s.on_handshake_response(0)
    for _ in range(rounds):
        assert s.client_frame_is_token()
        assert s.server_frame_is_token()
    assert not s.client_frame_is_token()
    assert not s.server_frame_is_token()


def test_unknown_mechanism_stays_raw() -> None:
    s = SaslState()
    s.on_handshake_v0("GSSAPI")
    s.on_handshake_response(0)
    assert all(s.client_frame_is_token() for _ in range(100))


def test_failed_handshake_is_not_raw() -> None:
    s = SaslState()
    s.on_handshake_v0("PLAIN")
    s.on_handshake_response(33)
    assert not s.client_frame_is_token()
