"""The per-connection tap core on its own (tap/core.py): bytes in, records and counters out, no I/O.

Every test runs on the reference (``PyTapCore``) and on the core ``new_core`` selects (the native one
when it is built and current), so both are held to the same behaviour.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import codec
from codec import taprecord
from codec.taprecord import Connection, TapRecord, pack_static, parse_records
from tap.core import (
    CoreSettings,
    FrameError,
    PyTapCore,
    TapCore,
    capture_slow,
    new_core,
    tables,
)
from tap.flush import FlushLimits
from tap.framing import HeldBudget, HoldLimits

CORPUS = Path(__file__).resolve().parents[1] / "data" / "tap_frames.jsonl"
STATIC = pack_static(
    Connection("tap-t.0-1", "127.0.0.1:1", "127.0.0.1:2", 1, "PLAINTEXT", "tap-t", "headers")
)
MakeCore = Callable[[CoreSettings], TapCore]
CORES: dict[str, MakeCore] = {
    "reference": lambda s: PyTapCore(tables(), s, STATIC, HeldBudget(1 << 40)),
    "selected": lambda s: new_core(s, STATIC),
}


@pytest.fixture(params=sorted(CORES))
def make(request: pytest.FixtureRequest) -> MakeCore:
    return CORES[request.param]


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def api_versions(corr: int) -> bytes:
    return framed(
        codec.encode_request(18, 3, corr, "c", {"ClientSoftwareName": "t", "ClientSoftwareVersion": "1"})
    )


def answer(corr: int, error: int = 0) -> bytes:
    """An ApiVersions response (header v0): the error code is read at a fixed offset."""
    return framed(struct.pack(">ih", corr, error))


def produce(corr: int, acks: int) -> bytes:
    body: dict[str, object] = {"TransactionalId": None, "Acks": acks, "TimeoutMs": 1000, "TopicData": []}
    return framed(codec.encode_request(0, 9, corr, "c", body))


class Driver:
    """What the adapter does with a core, minus the sockets: feed, resolve slow frames, take records."""

    def __init__(self, core: TapCore, core_settings: CoreSettings) -> None:
        self.core = core
        self.settings = core_settings
        self.values: list[bytes] = []
        self.slow: list[tuple[bool, int | None, int | None]] = []

    def feed(self, from_client: bool, data: bytes, wall: int = 1, mono: int = 1, inside: int = 1) -> int:
        core = self.core
        handled = core.feed(from_client, data, wall, mono, inside)
        while (slow := core.slow()) is not None:
            self.slow.append((slow.from_client, slow.api_key, slow.correlation_id))
            core.resolve(*capture_slow(slow, self.settings))
            handled += core.feed(from_client, b"", wall, mono, inside)
        self.take()
        return handled

    def take(self) -> None:
        while (record := self.core.take_record(0, 0)) is not None:
            self.values.append(record[0])

    def close(self, mono: int = 1) -> list[TapRecord]:
        self.core.drain(mono)
        self.take()
        last = self.core.flush(0, 0)
        if last is not None:
            self.values.append(last[0])
        return [r for v in self.values for r in parse_records(None, v)]


def _corpus_pairs() -> list[tuple[bytes, bytes]]:
    lines = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    pairs: list[tuple[bytes, bytes]] = []
    for i, req in enumerate(lines):
        if req["dir"] != "req":
            continue
        for resp in lines[i + 1 :]:
            same = (resp["source"], resp["api_key"], resp["corr_id"]) == (
                req["source"],
                req["api_key"],
                req["corr_id"],
            )
            if resp["dir"] == "resp" and same:
                pairs.append((framed(bytes.fromhex(req["hex"])), framed(bytes.fromhex(resp["hex"]))))
                break
    return pairs


PAIRS = _corpus_pairs()


@st.composite
def conversations(draw: st.DrawFn) -> list[tuple[bool, list[bytes]]]:
    """Runs of one direction's frames (each run cut into arbitrary chunks), in conversation order:
    requests pipelined ``depth`` deep, then their responses; real exchanges and frames of junk."""
    junk = st.binary(max_size=48).map(framed)
    pair = st.one_of(st.sampled_from(PAIRS), st.tuples(junk, junk))
    picked = draw(st.lists(pair, min_size=1, max_size=12))
    depth = draw(st.integers(1, 4))
    runs: list[tuple[bool, bytes]] = []
    for start in range(0, len(picked), depth):
        group = picked[start : start + depth]
        runs.append((True, b"".join(req for req, _ in group)))
        runs.append((False, b"".join(resp for _, resp in group)))
    out: list[tuple[bool, list[bytes]]] = []
    for from_client, data in runs:
        cuts = sorted(draw(st.sets(st.integers(1, max(len(data) - 1, 1)), max_size=6)))
        bounds = [0, *[c for c in cuts if c < len(data)], len(data)]
        out.append((from_client, [data[a:b] for a, b in itertools.pairwise(bounds)]))
    return out


def _play(make: MakeCore, core_settings: CoreSettings, runs: Sequence[tuple[bool, Sequence[bytes]]]) -> tuple:
    driver = Driver(make(core_settings), core_settings)
    for i, (from_client, chunks) in enumerate(runs):
        for chunk in chunks:
            driver.feed(from_client, chunk, wall=1_000 + i, mono=1_000_000 * i, inside=3)
    counters = driver.core.counters()
    records = driver.close(1_000_000 * len(runs))
    return driver.values, driver.slow, driver.core.seq, counters, records


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    runs=conversations(),
    policy=st.sampled_from(["full", "headers", "meta"]),
    max_entries=st.integers(1, 8),
    mirror=st.booleans(),
)
def test_any_chunking_gives_the_records_of_whole_runs(
    make: MakeCore, runs: list[tuple[bool, list[bytes]]], policy: str, max_entries: int, mirror: bool
) -> None:
    core_settings = CoreSettings(policy, mirror, flush=FlushLimits(max_entries=max_entries))  # type: ignore[arg-type]
    whole = [(from_client, [b"".join(chunks)]) for from_client, chunks in runs]
    assert _play(make, core_settings, runs) == _play(make, core_settings, whole)


def test_a_request_and_its_response_are_one_exchange(make: MakeCore) -> None:
    s = CoreSettings("full")
    d = Driver(make(s), s)
    assert d.feed(True, api_versions(7), wall=11, mono=100) == 1
    assert d.core.pending(7) == (18, 3)
    assert d.feed(False, answer(7), wall=12, mono=2_100) == 1
    assert d.core.pending(7) is None
    [record] = d.close()
    assert record.kind == taprecord.EXCHANGE and record.seq == 1
    req, resp = record.parts
    assert (req.direction, req.correlation_id, req.ts_ns, req.value) == ("req", 7, 11, api_versions(7)[4:])
    assert (resp.direction, resp.api_key, resp.api_version, resp.ts_ns) == ("resp", 18, 3, 12)
    counters = d.core.counters()
    assert counters.frames == {("req", 18, 3): (1, len(api_versions(7))), ("resp", 18, 3): (1, 10)}
    buckets, total = counters.latency[(18, True)]
    assert total == 2_000 and sum(buckets) == 1 and buckets[0] == 1  # 2 µs: the 10 µs bucket
    assert d.core.client_name == b"c"


def test_frames_that_cannot_pair_go_out_alone_with_their_reason(make: MakeCore) -> None:
    s = CoreSettings("full", hold_limits=HoldLimits(max_in_flight=2, max_age_ns=1_000))
    d = Driver(make(s), s)
    d.feed(True, produce(1, acks=0))  # never answered
    d.feed(True, b"".join(api_versions(c) for c in (2, 3, 4)))  # 2 evicted by the in-flight cap
    d.feed(False, answer(4, error=35) + answer(99))  # 3 orphaned by 4's answer; 99 answers nothing
    d.feed(True, b"\x00\x00\x00\x02\xff\xff")  # no Kafka request header
    d.feed(True, api_versions(5), mono=10)
    d.core.expire(10_000)  # 5 held past the age bound
    d.feed(True, api_versions(6), mono=20_000)
    records = d.close(20_000)  # 6 still held at close
    lone = [(r.kind, r.parts[0].correlation_id) for r in records if r.kind != taprecord.EXCHANGE]
    assert lone == [("req", 1), ("req", 2), ("req", 3), ("resp", 99), ("req", None), ("req", 5), ("req", 6)]
    assert [r.seq for r in records] == sorted(r.seq for r in records) == list(range(1, 9))
    counters = d.core.counters()
    assert counters.lone == {
        "no_response": 1, "in_flight_cap": 1, "unanswered": 1, "unknown_request": 1,
        "not_a_request": 1, "held_age": 1, "closed": 1,
    }  # fmt: skip
    assert counters.errors == {(18, 35): 1}
    assert counters.frames[("resp", None, None)] == (1, 10)


def test_flush_bounds_and_the_age_bound(make: MakeCore) -> None:
    s = CoreSettings("full", flush=FlushLimits(max_entries=3, max_age_ns=500))
    d = Driver(make(s), s)
    assert d.core.due_ns() is None
    d.feed(True, produce(1, acks=0), mono=1_000)
    assert d.core.due_ns() == 1_500 and not d.values
    d.feed(True, b"".join(produce(c, acks=0) for c in (2, 3, 4, 5)), mono=1_100)
    assert len(d.values) == 1 and taprecord.entries_in(d.values[0]) == 3  # the count bound
    assert d.core.due_ns() == 1_600
    d.feed(True, produce(6, acks=0), mono=1_700)  # past the age bound: the gathered ones go first
    assert [taprecord.entries_in(v) for v in d.values] == [3, 2]
    flushed = d.core.flush(4, 0)
    assert flushed is not None and flushed[1] == 1 and d.core.flush(0, 0) is None
    [last] = parse_records(None, flushed[0])
    assert (last.seq, last.lost) == (6, 4)


def test_slow_frames_are_resolved_in_order_and_redacted(make: MakeCore) -> None:
    s = CoreSettings("full")
    d = Driver(make(s), s)
    secret = framed(codec.encode_request(36, 2, 2, "c", {"AuthBytes": b"hunter2"}))
    chunk = api_versions(1) + secret + api_versions(3)
    core = d.core
    assert core.feed(True, chunk, 1, 1, 1) == 2  # stops at the secret-bearing frame
    slow = core.slow()
    assert slow is not None and (slow.api_key, slow.correlation_id, slow.complete) == (36, 2, True)
    assert core.pending(3) is None  # the frame after it waits
    core.resolve(*capture_slow(slow, s))
    assert core.slow() is None and core.feed(True, b"", 1, 1, 1) == 1
    records = d.close()
    assert [r.parts[0].correlation_id for r in records] == [1, 2, 3]
    assert all(b"hunter2" not in (p.value or b"") for r in records for p in r.parts)
    assert records[1].parts[0].redacted == ("AuthBytes",)
    assert core.counters().slow == 1


def test_a_sasl_v0_handshake_turns_the_next_frames_into_unmirrored_tokens(make: MakeCore) -> None:
    s = CoreSettings("full")
    d = Driver(make(s), s)
    d.feed(True, framed(codec.encode_request(17, 0, 1, "c", {"Mechanism": "PLAIN"})))
    d.feed(False, framed(struct.pack(">ih", 1, 0) + b"\x00\x00\x00\x00"))
    d.feed(True, framed(b"\x00user\x00hunter2"))
    d.feed(False, framed(b""))
    records = d.close()
    tokens = [r.parts[0] for r in records[1:]]
    assert [p.redacted for p in tokens] == [(taprecord.SASL_TOKEN,)] * 2
    assert all(p.value == b"" for p in tokens) and d.slow == [(True, 17, 1)]


@pytest.mark.parametrize("garbage", [struct.pack(">i", -5), struct.pack(">i", (1 << 30) + 1)])
def test_garbage_framing_raises_before_any_frame_of_the_chunk(make: MakeCore, garbage: bytes) -> None:
    s = CoreSettings("full")
    core = make(s)
    with pytest.raises(FrameError):
        core.feed(True, api_versions(1) + garbage + b"junk", 1, 1, 1)
    assert core.pending(1) is None and core.seq == 0
