"""The native tap core (``kpmon_tapcore.TapCore``) held to the Python reference (``tap.core.PyTapCore``):
the same calls give the same answers, byte for byte. Records, seqs, counters, the frames handed to
Python and the ``FrameError`` cases are compared over real captures (tests/data) and frames the codec
builds for every API, cut into chunks anywhere, with garbage, every capture policy and mirroring off,
and bounds small enough that every hold and flush limit is hit."""

from __future__ import annotations

import itertools
import json
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import codec
from codec import taprecord
from codec.api import request_spec, response_spec
from codec.protocol import ApiKey
from codec.samples import BodyBuilder
from tap import native_core, strip
from tap.capture import FrameInfo, header_end
from tap.core import CoreCounters, CoreSettings, PyTapCore, SlowFrame, TapCore, capture_slow, tables
from tap.flush import FlushLimits
from tap.framing import FrameError, HeldBudget, HoldLimits
from tests.codec.strategies import records_value

NATIVE, WHY = native_core.status()
pytestmark = pytest.mark.skipif(NATIVE is None, reason=f"the native tap core is not in use: {WHY}")

DATA = Path(__file__).resolve().parents[1] / "data"
STATIC = taprecord.pack_static(taprecord.Connection("kpmon-test.0-1", "127.0.0.1:5", "b:9092", 1, "L", "t"))
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
#: APIs whose records the headers policy strips: the native core may hand such a frame to Python
#: where the reference strips it itself (a section that is not all magic-2 batches).
_STRIPPED = {(int(ApiKey.PRODUCE), True), (int(ApiKey.FETCH), False), (int(ApiKey.SHARE_FETCH), False)}

#: One conversation: (from_client, frame bytes) in the order they cross the tap.
Frames = list[tuple[bool, bytes]]


class Raw(bytes):
    """Bytes fed as they are, not framed: a stream that is not Kafka framing."""


def _framed(frame: bytes) -> bytes:
    return frame if isinstance(frame, Raw) else _INT32.pack(len(frame)) + frame


@cache
def captured() -> Frames:
    """The corpus of captured frames, in their captured order (requests before their responses)."""
    out: Frames = []
    for line in (DATA / "tap_frames.jsonl").read_text().splitlines():
        f = json.loads(line)
        out.append((f["dir"] == "req", bytes.fromhex(f["hex"])))
    for path in sorted((DATA / "golden").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            f = json.loads(line)
            out.append((f["direction"] == "request", bytes.fromhex(f["hex"])))
    return out


def _exchange(
    api_key: int, version: int, corr: int, seed: int, acks: int | None = None
) -> tuple[bytes, bytes]:
    rng = random.Random(seed)
    builder = BodyBuilder(rng, unknown_tags=True, records=records_value)
    body = builder.body(request_spec(api_key), version)
    if acks is not None:
        body["Acks"] = acks
    request = codec.encode_request(api_key, version, corr, "kpmon-test" * (seed % 3), body)
    response = codec.encode_response(api_key, version, corr, builder.body(response_spec(api_key), version))
    return request, response


@cache
def built() -> list[tuple[int, bytes, bytes]]:
    """(api key, request, response) the codec builds: each API's first and last version, every version
    of the record-carrying APIs, and the redacted APIs (they go to Python)."""
    out = []
    corr = 1000
    for api_key in codec.api_keys():
        versions = list(request_spec(api_key).versions())
        if api_key in (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.SHARE_FETCH):
            picked = versions
        else:
            picked = sorted({versions[0], versions[-1]})
        for version in picked:
            corr += 1
            request, response = _exchange(api_key, version, corr, corr)
            out.append((int(api_key), request, response))
            if api_key == ApiKey.PRODUCE:
                # acks=0: never answered, so written alone at once.
                corr += 1
                request, response = _exchange(api_key, version, corr, corr, acks=0)
                out.append((int(api_key), request, response))
    return out


def _sasl_v0(corr: int, mechanism: str = "PLAIN", error: int = 0) -> Frames:
    """A SaslHandshake v0: then, when it succeeded, raw tokens with no Kafka header each way (one
    round for PLAIN, two for SCRAM, the rest of the connection for a mechanism the tap does not know)."""
    request = codec.encode_request(ApiKey.SASL_HANDSHAKE, 0, corr, "c", {"Mechanism": mechanism})
    response = codec.encode_response(
        ApiKey.SASL_HANDSHAKE, 0, corr, {"ErrorCode": error, "Mechanisms": ["PLAIN"]}
    )
    return [(True, request), (False, response), (True, b"\x00user\x00secret"), (False, b"")]


def _legacy(frame: bytes) -> bytes:
    """A Produce request whose first batch says magic 1: the native strip leaves it to Python (and
    the reference falls back to the codec)."""
    version = _INT16.unpack_from(frame, 2)[0]
    spans: list[strip.Span] = []
    info = FrameInfo("req", len(frame), ApiKey.PRODUCE, version)
    strip._walk(frame, header_end(frame, info), strip.plan(ApiKey.PRODUCE, True, version), spans)
    if not spans or spans[0][2] - spans[0][1] < 17:
        return frame
    at = spans[0][1] + 16
    return frame[:at] + b"\x01" + frame[at + 1 :]


def conversation(rng: random.Random, garbage: bool) -> Frames:
    """Exchanges pipelined a few at a time; some unanswered, some answered twice or out of order, some
    acks=0 produces; a SASL v0 handshake; garbage frames when asked."""
    pool = built()
    out: Frames = []
    corr = 1
    for _ in range(rng.randint(1, 12)):
        batch = []
        for _ in range(rng.randint(1, 4)):
            pick = rng.random()
            if pick < 0.05:
                mechanism = rng.choice(("PLAIN", "scram-sha-256", "GSSAPI"))
                out.extend(_sasl_v0(corr, mechanism, rng.choice((0, 0, 58))))
                corr += 1
                continue
            api_key, request, response = rng.choice(pool)
            if api_key == ApiKey.PRODUCE and rng.random() < 0.3:
                request = _legacy(request)
            batch.append((request, response))
            out.append((True, request))
        if rng.random() < 0.1:
            rng.shuffle(batch)  # answered out of order: the earlier requests become orphans
        for _, response in batch:
            if rng.random() < 0.85:
                out.append((False, response))
            if rng.random() < 0.03:
                out.append((False, response))
        if garbage and rng.random() < 0.3:
            out.append((rng.random() < 0.5, rng.randbytes(rng.randint(0, 12))))
        if garbage and rng.random() < 0.05:
            bad = rng.choice((-1, -(1 << 31), (1 << 30) + 1))
            out.append((rng.random() < 0.5, Raw(_INT32.pack(bad) + rng.randbytes(3))))
    return out


@dataclass
class Run:
    """Everything a core said while driven through one script."""

    log: list[Any]
    slow: list[SlowFrame]
    counters: CoreCounters


def drive(
    core: TapCore,
    core_settings: CoreSettings,
    frames: Frames,
    cuts: Callable[[int], list[int]],
    rng_seed: int,
) -> Run:
    """Feed ``frames`` in chunks (``cuts(n)``: where to cut n bytes), resolving each slow frame as the
    adapter does, taking records as they fall due, with the clocks, expiry sweeps and losses a seeded
    random source picks; then close as the adapter does."""
    rng = random.Random(rng_seed)
    log: list[Any] = []
    slow: list[SlowFrame] = []
    lost = 0
    wall = 1_700_000_000_000_000_000
    mono = 10**12

    def take() -> None:
        nonlocal lost
        while (found := core.take_record(lost, 7 if lost else 0)) is not None:
            log.append(("record", found))
            if rng.random() < 0.2:
                lost += found[1]
        log.append(("due", core.due_ns()))

    opened = taprecord.Part(taprecord.OPEN, wall, None, None, None, b"{}")
    core.lifecycle(taprecord.OPEN, opened if core_settings.mirror else None, mono)
    if rng.random() < 0.2:
        core.lifecycle(taprecord.BLIND, None, mono)  # a part the adapter did not make: a seq only
    stopped = False
    for from_client, frame in frames:
        data = _framed(frame)
        points = [0, *sorted(cuts(len(data))), len(data)]
        for a, b in itertools.pairwise(points):
            if a == b:
                continue
            wall += rng.randint(0, 5_000)
            mono += rng.choice((1, 1_000, 100_000, 3_000_000, 70_000_000))
            inside = rng.choice((0, 9_000, 1_500_000, 40_000_000_000))
            try:
                handled = core.feed(from_client, data[a:b], wall, mono, inside)
                while (frame_slow := core.slow()) is not None:
                    slow.append(frame_slow)
                    core.resolve(*capture_slow(frame_slow, core_settings))
                    handled += core.feed(frame_slow.from_client, b"", wall, mono, inside)
            except FrameError as exc:
                log.append(("raised", str(exc)))
                stopped = True
                break
            log.append(("fed", handled, core.seq, core.mid_frame, core.client_name))
            if from_client and len(frame) >= 8:
                # What address rewriting looks up before a response is fed.
                log.append(("pending", core.pending(_INT32.unpack_from(frame, 4)[0])))
            take()
            if rng.random() < 0.1:
                core.expire(mono)
                take()
            if rng.random() < 0.05:
                log.append(("flush", core.flush(lost, 0)))
        if stopped:
            break
    core.drain(mono)
    close = taprecord.Part(taprecord.CLOSE, wall, None, None, None, b'{"r":1}', (), {"error": "x"})
    core.lifecycle(taprecord.CLOSE, close if core_settings.mirror else None, mono)
    take()
    log.append(("flush", core.flush(lost, 3)))
    log.append(("end", core.seq, core.mid_frame, core.client_name, core.due_ns()))
    return Run(log, slow, core.counters())


def _settings(policy: str, mirror: bool, small: bool) -> CoreSettings:
    base = CoreSettings(capture=policy, mirror=mirror)  # type: ignore[arg-type]
    if not small:
        return base
    return replace(
        base,
        max_mirrored_frame_bytes=700,
        hold_limits=HoldLimits(max_in_flight=3, max_bytes=900, max_age_ns=50_000_000,
                               max_rebalance_age_ns=200_000_000),
        flush=FlushLimits(max_bytes=2_000, max_entries=5, max_age_ns=60_000_000),
    )  # fmt: skip


POLICIES = st.sampled_from([("headers", True), ("full", True), ("meta", True), ("headers", False)])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=POLICIES,
    small=st.booleans(),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    garbage=st.booleans(),
    piece=st.sampled_from([0, 1, 3, 17, 200]),
)
def test_the_cores_agree_on_built_conversations(
    policy: tuple[str, bool], small: bool, seed: int, garbage: bool, piece: int
) -> None:
    frames = conversation(random.Random(seed), garbage)

    def fresh() -> Callable[[int], list[int]]:
        rng = random.Random(seed + 1)  # the same cuts for each core

        def cuts(n: int) -> list[int]:
            if piece == 0:
                return []
            return [rng.randrange(n) for _ in range(min(64, rng.randint(0, max(1, n // piece))))]

        return cuts

    assert_alike_both(_settings(policy[0], policy[1], small), frames, fresh, seed)


def assert_alike_both(
    core_settings: CoreSettings,
    frames: Frames,
    fresh_cuts: Callable[[], Callable[[int], list[int]]],
    seed: int,
) -> None:
    """``assert_alike`` with a cut source replayed from its start for each core."""
    assert NATIVE is not None
    # With the small bounds, a tap-wide held-bytes budget too, of each core's own kind.
    small = core_settings.hold_limits.max_in_flight < HoldLimits().max_in_flight
    runs = [
        drive(make(tables(), core_settings, STATIC, budget(1_200) if small else None), core_settings, frames,
              fresh_cuts(), seed)
        for make, budget in ((PyTapCore, HeldBudget), (NATIVE.TapCore, NATIVE.HeldBudget))
    ]  # fmt: skip
    _compare(*runs)


def _compare(ref: Run, native: Run) -> None:
    assert native.log == ref.log
    assert replace(native.counters, slow=0) == replace(ref.counters, slow=0)
    extra = list(native.slow)
    for frame in ref.slow:
        while extra and extra[0] != frame:
            skipped = extra.pop(0)
            assert (skipped.api_key, skipped.from_client) in _STRIPPED, skipped
        assert extra, f"the native core did not stop at {frame}"
        extra.pop(0)
    assert all((f.api_key, f.from_client) in _STRIPPED for f in extra)
    assert native.counters.slow == len(native.slow)


@settings(max_examples=40, deadline=None)
@given(
    policy=POLICIES,
    small=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=40),
    seed=st.integers(min_value=0, max_value=1000),
)
def test_the_cores_agree_on_the_captures_under_any_chunking(
    policy: tuple[str, bool], small: bool, cuts: list[int], seed: int
) -> None:
    """The captured frames as one stream per direction, cut at the drawn offsets."""
    frames = captured()

    def fresh() -> Callable[[int], list[int]]:
        # The same offsets for each frame, taken modulo its length: cuts anywhere, identical per core.
        return lambda n: [c % n for c in cuts]

    assert_alike_both(_settings(policy[0], policy[1], small), frames, fresh, seed)


@pytest.mark.parametrize("policy", ["headers", "full", "meta", "off"])
def test_the_cores_agree_on_every_built_frame_byte_by_byte(policy: str) -> None:
    """Every built exchange, each frame fed a byte at a time for the first ones, whole after."""
    frames: Frames = []
    for _, request, response in built():
        frames += [(True, request), (False, response)]
    frames += _sasl_v0(7)
    frames += [(True, _legacy(request)) for api, request, _ in built() if api == ApiKey.PRODUCE]
    settings_ = _settings("headers" if policy == "off" else policy, policy != "off", small=False)

    def fresh() -> Callable[[int], list[int]]:
        seen = [0]

        def cuts(n: int) -> list[int]:
            seen[0] += 1
            return list(range(1, n)) if seen[0] <= 20 else []

        return cuts

    assert_alike_both(settings_, frames, fresh, 1)


@pytest.mark.parametrize(
    "stream",
    [
        _INT32.pack(-1),
        _INT32.pack(1 << 31 - 1),
        b"\x00\x00\x00\x02ab" + _INT32.pack(-5) + b"\x00",
        b"\xff\xff",
    ],
)
@pytest.mark.parametrize("from_client", [True, False])
def test_garbage_raises_alike(stream: bytes, from_client: bool) -> None:
    assert NATIVE is not None
    core_settings = CoreSettings(max_frame_bytes=1 << 20)
    outcomes = []
    for make in (PyTapCore, NATIVE.TapCore):
        core = make(tables(), core_settings, STATIC)
        seen: list[Any] = []
        for cut in range(len(stream) + 1):
            core = make(tables(), core_settings, STATIC)
            try:
                seen.append(("ok", core.feed(from_client, stream[:cut], 1, 1, 0), core.mid_frame))
                seen.append(("ok", core.feed(from_client, stream[cut:], 1, 1, 0), core.mid_frame))
            except FrameError as exc:
                seen.append(("raised", type(exc), str(exc)))
        outcomes.append((seen, core.counters(), core.seq))
    assert outcomes[0] == outcomes[1]


@settings(max_examples=50, deadline=None)
@given(
    client_ids=st.lists(st.binary(max_size=12), min_size=1, max_size=3),
    policy=POLICIES,
)
def test_client_ids_that_are_not_utf8_are_named_alike(
    client_ids: list[bytes], policy: tuple[str, bool]
) -> None:
    """The first client id names the connection, undecodable bytes replaced as Python replaces them."""
    frames: Frames = []
    for corr, client_id in enumerate(client_ids):
        body = b"\x00" * 4  # an ApiVersions v3 request's empty compact strings and tags
        header = struct.pack(">hhih", ApiKey.API_VERSIONS, 3, corr, len(client_id)) + client_id + b"\x00"
        frames.append((True, header + body))
    assert_alike_both(_settings(*policy, small=False), frames, lambda: lambda n: [], 0)


def test_counters_read_while_the_core_works_never_find_it_borrowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The metrics thread reads ``counters()`` while the event loop feeds: Python code run inside one
    call (making the counters, reading a part) may let the other in. Here that code calls the other
    method itself, the worst interleaving, deterministically."""
    assert NATIVE is not None
    core_settings = CoreSettings()
    core = NATIVE.TapCore(tables(), core_settings, STATIC)
    request, _ = built()[0][1:]
    seen: list[int] = []

    class Counting(CoreCounters):
        def __init__(self, **fields: Any) -> None:
            super().__init__(**fields)
            seen.append(core.feed(True, _framed(request), 1, 1, 0))  # the loop gets in mid-read

    import tap.core

    monkeypatch.setattr(tap.core, "CoreCounters", Counting)
    assert isinstance(core.counters(), Counting) and seen == [1]
    monkeypatch.undo()

    class Flags(dict[str, str]):
        def items(self) -> Any:
            seen.append(core.counters().frames[("req", ApiKey.SASL_HANDSHAKE, 0)][0])  # a scrape mid-resolve
            return super().items()

    handshake = _sasl_v0(5)[0][1]
    assert core.feed(True, _framed(handshake), 2, 2, 0) == 1
    frame_slow = core.slow()
    assert frame_slow is not None
    part, mechanism, sensitive = capture_slow(frame_slow, core_settings)
    assert part is not None
    core.resolve(replace(part, flags=Flags(part.flags)), mechanism, sensitive)
    assert seen == [1, 1] and core.slow() is None


@pytest.mark.parametrize("make", ["reference", "native"])
def test_resolve_without_a_slow_frame_is_refused_and_any_buffer_feeds(make: str) -> None:
    assert NATIVE is not None
    # Any: the protocol takes bytes, as the adapter passes; both cores read any buffer.
    core: Any = (PyTapCore if make == "reference" else NATIVE.TapCore)(tables(), CoreSettings(), STATIC)
    with pytest.raises(RuntimeError, match="no slow frame to resolve"):
        core.resolve(None)
    request = _framed(built()[0][1])
    assert core.feed(True, bytearray(request[:5]), 1, 1, 0) == 0
    assert core.feed(True, memoryview(request)[5:], 1, 1, 0) == 1


@settings(max_examples=60, deadline=None)
@given(
    chunks=st.lists(st.tuples(st.booleans(), st.binary(max_size=40)), max_size=12),
    policy=POLICIES,
)
def test_the_cores_agree_on_garbage(chunks: list[tuple[bool, bytes]], policy: tuple[str, bool]) -> None:
    """Any bytes from either side: frames of junk, sizes past the bound, or a FrameError, alike."""
    core_settings = replace(_settings(*policy, small=True), max_frame_bytes=64)
    frames: Frames = [(from_client, Raw(data)) for from_client, data in chunks]
    assert_alike_both(core_settings, frames, lambda: lambda n: [n // 3], 0)
