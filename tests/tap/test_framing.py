"""Frame splitting under any chunking, correlation pruning, and legacy SASL token tracking."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codec.protocol import ApiKey
from codec.taprecord import Part
from tap.framing import (
    HEAD_BYTES,
    Correlations,
    FrameError,
    FrameSplitter,
    HeldBudget,
    HoldLimits,
    Pending,
    SaslState,
    Unpaired,
    starts_with_tls,
)


def _stream(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
    retain=st.integers(min_value=0, max_value=400),
    head=st.integers(min_value=0, max_value=400),
    mutable=st.booleans(),
)
def test_any_chunking_yields_the_same_frames(
    payloads: list[bytes], cuts: list[int], retain: int, head: int, mutable: bool
) -> None:
    data = _stream(payloads)
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    splitter = FrameSplitter(retain, head=head)
    frames = []
    reused = bytearray()
    for a, b in itertools.pairwise(points):
        if mutable:
            # A caller that reuses its buffer: what the splitter kept must not change with it.
            reused[:] = data[a:b]
            frames.extend(splitter.feed(reused))
            reused[:] = b"\xff" * len(reused)
        else:
            frames.extend(splitter.feed(data[a:b]))
    assert [f.size for f in frames] == [len(p) for p in payloads]
    # Whole when it may be mirrored whole; otherwise only the head its header needs.
    assert [f.head for f in frames] == [p if len(p) <= retain else p[: min(retain, head)] for p in payloads]
    assert all(isinstance(f.head, bytes) for f in frames)
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


def test_a_frame_too_large_to_mirror_keeps_its_head_not_retain_bytes() -> None:
    """A 1 MiB Fetch response with 900 KB retained for mirroring can only be mirrored as its header:
    the splitter keeps HEAD_BYTES of it, whether it comes in one chunk or many."""
    payload = bytes(range(256)) * 4096
    for chunk in (len(payload) + 4, 65536):
        splitter = FrameSplitter(900_001)
        data = struct.pack(">i", len(payload)) + payload
        out = []
        for at in range(0, len(data), chunk):
            out += splitter.feed(data[at : at + chunk])
        assert [(f.size, f.head) for f in out] == [(len(payload), payload[:HEAD_BYTES])]


def _held(corr: int, size: int = 10) -> Part:
    return Part("req", corr, 0, 9, corr, b"x" * size)


def test_correlations_hand_back_unanswered_older_requests() -> None:
    c = Correlations()
    for corr in (1, 2, 3):
        assert c.add(corr, Pending(0, 9, corr, held=_held(corr))) == []
    found, orphans = c.match(2)
    assert found is not None and found.api_key == 0 and found.held == _held(2)
    # corr 1 (acks=0) will never be answered: its frame goes out alone.
    assert orphans == [Unpaired(_held(1), "unanswered")]
    assert len(c) == 1 and c.held_bytes == 10
    assert c.match(1) == (None, [])
    found, orphans = c.match(3)
    assert found is not None and orphans == [] and c.held_bytes == 0


def test_correlations_cap_in_flight_requests() -> None:
    c = Correlations(HoldLimits(max_in_flight=3))
    evicted = [u for corr in range(10) for u in c.add(corr, Pending(1, 1, corr, held=_held(corr)))]
    assert len(c) == 3
    assert evicted == [Unpaired(_held(corr), "in_flight_cap") for corr in range(7)]


def test_correlations_bound_held_bytes_per_connection_and_per_tap() -> None:
    budget = HeldBudget(25)
    a = Correlations(HoldLimits(max_bytes=20), budget)
    b = Correlations(HoldLimits(max_bytes=20), budget)
    assert a.add(1, Pending(0, 9, 1, held=_held(1))) == []
    assert a.add(2, Pending(0, 9, 2, held=_held(2))) == []
    # Over the connection's bound: its oldest held frame goes out alone to make room.
    assert a.add(3, Pending(0, 9, 3, held=_held(3))) == [Unpaired(_held(1), "held_bytes")]
    # Over the tap's bound: the new frame itself cannot be held.
    assert b.add(7, Pending(0, 9, 7, held=_held(7))) == [Unpaired(_held(7), "held_bytes")]
    assert budget.held == 20
    # The entry stays: its response still learns its API and version, and goes out alone.
    found, _ = b.match(7)
    assert found is not None and found.held is None


def test_correlations_expire_and_drain() -> None:
    c = Correlations(HoldLimits(max_age_ns=100))
    c.add(1, Pending(0, 9, 0, held=_held(1)))
    c.add(2, Pending(0, 9, 50, held=_held(2)))
    assert c.expire(120) == [Unpaired(_held(1), "held_age")]
    found, _ = c.match(1)
    assert found is not None and found.held is None  # already written alone
    assert c.drain() == [Unpaired(_held(2), "closed")]
    assert len(c) == 0 and c.held_bytes == 0


def test_a_join_group_is_held_until_its_rebalance_can_have_ended() -> None:
    """The coordinator answers a JoinGroup when the rebalance completes: it is held past the usual age
    bound, up to its own, while younger requests behind it still go out at theirs."""
    c = Correlations(HoldLimits(max_age_ns=100, max_rebalance_age_ns=1_000))
    c.add(1, Pending(ApiKey.JOIN_GROUP, 9, 0, held=_held(1)))
    c.add(2, Pending(ApiKey.METADATA, 12, 10, held=_held(2)))
    assert c.expire(150) == [Unpaired(_held(2), "held_age")]
    assert c.expire(999) == []
    assert c.expire(1_000) == [Unpaired(_held(1), "held_age")]


_OPS = st.lists(
    st.tuples(st.sampled_from(["add", "match", "expire"]), st.integers(0, 12), st.integers(0, 30)),
    max_size=60,
)


@given(_OPS, st.integers(1, 6), st.integers(5, 60), st.integers(10, 80))
def test_every_held_frame_comes_back_exactly_once(
    ops: list[tuple[str, int, int]], max_in_flight: int, max_bytes: int, tap_bytes: int
) -> None:
    """Whatever the traffic and the bounds: each held request comes back once (in its exchange or
    alone), no bound is exceeded, and nothing stays counted once the connection is drained."""
    budget = HeldBudget(tap_bytes)
    c = Correlations(HoldLimits(max_in_flight, max_bytes, 40), budget)
    sent: list[Part] = []
    back: list[Part] = []
    now = 0
    for op, corr, size in ops:
        now += 5
        if op == "add":
            part = Part("req", now, 0, 9, corr, bytes(size))
            sent.append(part)
            back += [u.held for u in c.add(corr, Pending(0, 9, now, held=part))]
        elif op == "match":
            found, orphans = c.match(corr)
            back += [u.held for u in orphans]
            if found is not None and found.held is not None:
                back.append(found.held)
        else:
            back += [u.held for u in c.expire(now)]
        assert c.held_bytes <= max_bytes and budget.held <= tap_bytes and len(c) <= max_in_flight
    back += [u.held for u in c.drain()]
    assert sorted(back, key=id) == sorted(sent, key=id) and len({id(p) for p in back}) == len(sent)
    assert budget.held == 0 and c.held_bytes == 0


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


# ----- TLS where Kafka was expected ------------------------------------------------------------------


def _client_hello() -> bytes:
    """The first bytes a real TLS client (Python's ssl, OpenSSL) sends."""
    import ssl

    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="broker")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_a_tls_client_hello_is_recognised() -> None:
    hello = _client_hello()
    assert starts_with_tls(hello)
    assert not starts_with_tls(hello[:2])


@given(size=st.integers(0, 100 * 1024 * 1024), rest=st.binary(max_size=8))
def test_no_kafka_frame_a_broker_accepts_looks_like_tls(size: int, rest: bytes) -> None:
    # socket.request.max.bytes defaults to 100 MiB; a size prefix up to there never reads as TLS.
    assert not starts_with_tls(struct.pack(">i", size) + rest)
