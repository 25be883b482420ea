"""The tap's native pieces (``kpmon_tapcore``, tap/native) held equal to their Python references, byte
for byte and decision for decision: under hypothesis, and over every captured frame of the test corpus
(tests/data/tap_frames.jsonl, tests/data/golden). The set-up builds the module wherever cargo is, so a
suite that skipped these would test nothing of what the tap runs: the first test says why it is not in
use."""

from __future__ import annotations

import itertools
import json
import os
import random
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

import codec
import codec.peek
import codec.taprecord as taprecord
from codec.api import request_spec
from codec.errors import DecodeError
from codec.native import disabled
from codec.protocol import ApiKey
from codec.samples import BodyBuilder
from codec.taprecord import Connection, Part
from deploy.tapcore import find_cargo
from tap import native_core
from tap.framing import (
    REBALANCE_WAITS,
    Correlations,
    FrameError,
    FrameSplitter,
    HeldBudget,
    HoldLimits,
    Pending,
    expects_response,
    starts_with_tls,
)
from tap.metrics import TapMetrics
from tests.codec.strategies import records_value

NATIVE, WHY = native_core.status()
needs_native = pytest.mark.skipif(NATIVE is None, reason=f"the native tap core is not in use: {WHY}")

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


def _corpus() -> list[tuple[str, int, int, bytes]]:
    """(direction, api key, api version, frame) of every captured frame."""
    out = []
    for line in (DATA / "tap_frames.jsonl").read_text().splitlines():
        f = json.loads(line)
        out.append((f["dir"], f["api_key"], f["api_version"], bytes.fromhex(f["hex"])))
    for path in sorted((DATA / "golden").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            f = json.loads(line)
            direction = "req" if f["direction"] == "request" else "resp"
            out.append((direction, f["api_key"], f["api_version"], bytes.fromhex(f["hex"])))
    return out


CORPUS = _corpus()
REQUESTS = [frame for direction, _, _, frame in CORPUS if direction == "req"]
RESPONSES = [frame for direction, _, _, frame in CORPUS if direction == "resp"]
PRODUCE_VERSIONS = list(range(0, 14))


def _produce(version: int, seed: int, acks: int) -> bytes:
    """A Produce request as the codec builds it, with these ``acks``."""
    rng = random.Random(seed)
    body = BodyBuilder(rng, unknown_tags=True, records=records_value).body(
        request_spec(ApiKey.PRODUCE), version
    )
    body["Acks"] = acks
    return codec.encode_request(ApiKey.PRODUCE, version, seed, "kpmon-test" * seed, body)


#: Produce requests of every version, acks -1, 0 and 1, client ids of several lengths.
PRODUCES = [_produce(v, seed, acks) for v in PRODUCE_VERSIONS for seed in range(3) for acks in (-1, 0, 1)]


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """What a call did: its result, or its exception's type and every attribute a caller reads."""
    try:
        return "ok", fn()
    except (DecodeError, FrameError) as exc:
        return "raised", (type(exc), str(exc), tuple(sorted(vars(exc).items())))


def test_the_set_up_build_is_what_runs() -> None:
    if disabled():
        assert NATIVE is None and native_core.core_name() == "python"
        return
    if find_cargo() is None:
        pytest.skip(
            "no cargo on this machine: the set-up cannot build the native core (Python reference runs)"
        )
    # `make setup` builds and installs it wherever cargo is: a stale or missing build says why here.
    assert NATIVE is not None, WHY
    assert native_core.core_name() == "native"


def test_the_metric_and_the_environment_say_which_core_runs() -> None:
    text = generate_latest(TapMetrics().registry).decode()
    assert f'kpmon_tap_core_info{{core="{native_core.core_name()}"}} 1.0' in text
    code = "from tap.native_core import status; m, why = status(); print(m is None, why)"
    env = {**os.environ, "KPMON_NATIVE": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True KPMON_NATIVE=0: the Python reference core"


def test_cargo_is_found_off_the_path_and_its_absence_stops_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rustup's ~/.cargo/bin is often missing from a CI shell's PATH; without cargo anywhere the set-up
    step says so and succeeds (the tap runs the reference)."""
    cargo = tmp_path / "home" / ".cargo" / "bin" / "cargo"
    cargo.parent.mkdir(parents=True)
    cargo.write_text("#!/bin/sh\n")
    cargo.chmod(0o755)
    for name in ("KPMON_CARGO", "CARGO_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert find_cargo() == str(cargo)
    cargo.unlink()
    assert find_cargo() is None
    env = {"PATH": "/nonexistent", "HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT), "KPMON_CARGO": ""}
    done = subprocess.run([sys.executable, "-m", "deploy.tapcore"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "cargo not found" in done.stdout and "Python reference" in done.stdout


def test_a_build_is_refused_beside_other_sources(tmp_path: Path) -> None:
    assert native_core.source_digest(tmp_path) is None
    assert native_core.verdict("abc", None) is None  # a wheel installed without its source tree
    digest = native_core.source_digest()
    assert digest is not None and native_core.verdict(digest, digest) is None
    assert "out of date" in str(native_core.verdict("abc", digest))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "lib.rs").write_text("// one")
    one = native_core.source_digest(tmp_path)
    (tmp_path / "src" / "lib.rs").write_text("// two")
    assert native_core.source_digest(tmp_path) != one


def test_a_build_unpacks_into_a_directory_of_its_own(tmp_path: Path) -> None:
    """``deploy.tapcore --into DIR``: a second checkout runs its own build without touching the
    environment it shares."""
    import zipfile

    from deploy.tapcore import unpack

    wheel = tmp_path / "kpmon_tapcore-0.1.0-cp311-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("kpmon_tapcore/kpmon_tapcore.abi3.so", b"module")
        zf.writestr("kpmon_tapcore/__init__.py", b"")
        zf.writestr("kpmon_tapcore-0.1.0.dist-info/RECORD", b"")
    unpack(wheel, tmp_path / "native")
    assert [p.name for p in (tmp_path / "native").iterdir()] == ["kpmon_tapcore.abi3.so"]
    assert (tmp_path / "native" / "kpmon_tapcore.abi3.so").read_bytes() == b"module"


# ----- framing ---------------------------------------------------------------------------------------


def _stream(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


def _feeding(splitter: Any, chunk: bytes | bytearray | memoryview) -> Callable[[], list[tuple[int, bytes]]]:
    return lambda: [tuple(f) for f in splitter.feed(chunk)]


def _split_both(
    data: bytes, points: list[int], retain: int, head: int, max_frame: int, kind: str
) -> tuple[list[Any], list[Any]]:
    assert NATIVE is not None
    runs = []
    for splitter in (FrameSplitter(retain, max_frame, head), NATIVE.FrameSplitter(retain, max_frame, head)):
        seen: list[Any] = []
        for a, b in itertools.pairwise(points):
            chunk: bytes | bytearray | memoryview = data[a:b]
            if kind == "bytearray":
                chunk = bytearray(chunk)
            elif kind == "memoryview":
                chunk = memoryview(bytearray(chunk))
            got = _outcome(_feeding(splitter, chunk))
            seen.append((got, splitter.mid_frame))
            if got[0] == "raised":
                break
        runs.append(seen)
    return runs[0], runs[1]


@needs_native
@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    garbage=st.binary(max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
    retain=st.integers(min_value=0, max_value=400),
    head=st.integers(min_value=0, max_value=400),
    max_frame=st.sampled_from([1 << 30, 200, 0]),
    kind=st.sampled_from(["bytes", "bytearray", "memoryview"]),
)
def test_framing_is_the_reference_s_under_any_chunking(
    payloads: list[bytes], garbage: bytes, cuts: list[int], retain: int, head: int, max_frame: int, kind: str
) -> None:
    """Frames, heads, ``mid_frame`` after every chunk and the ``FrameError`` (type and message) on a
    bad size: the stream may end in bytes that are no framing at all."""
    data = _stream(payloads) + garbage
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    python, native = _split_both(data, points, retain, head, max_frame, kind)
    assert native == python


@needs_native
@given(
    cuts=st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=40),
    retain=st.sampled_from([0, 64, 900_000]),
)
@settings(max_examples=30)
def test_framing_of_the_captured_frames(cuts: list[int], retain: int) -> None:
    data = _stream([frame for _, _, _, frame in CORPUS])
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    python, native = _split_both(data, points, retain, 128, 1 << 30, "bytes")
    assert native == python
    assert sum(len(frames) for (_, frames), _ in native) == len(CORPUS)


@needs_native
@given(st.binary(max_size=8))
def test_tls_is_recognised_alike(data: bytes) -> None:
    assert NATIVE is not None
    assert NATIVE.starts_with_tls(data) == starts_with_tls(data)


# ----- header peeks ----------------------------------------------------------------------------------


def _header(api_key: int, version: int, corr: int, client_id: bytes | None, rest: bytes) -> bytes:
    n = -1 if client_id is None else len(client_id)
    return struct.pack(">hhih", api_key, version, corr, n) + (client_id or b"") + rest


headers = st.builds(
    _header,
    st.integers(-(2**15), 2**15 - 1),
    st.integers(-(2**15), 2**15 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.none() | st.binary(max_size=12) | st.text(max_size=6).map(str.encode),
    st.binary(max_size=6),
)


@needs_native
@given(st.one_of(st.binary(max_size=24), headers, headers.map(lambda h: h[: len(h) // 2])))
@example(b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04\xed\xa0\x80\xff")  # a surrogate and a stray byte
@example(b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\xf0\x9f\x98")  # a truncated 4-byte sequence
def test_request_header_peeks_alike(buf: bytes) -> None:
    assert NATIVE is not None
    python = _outcome(lambda: tuple(codec.peek.peek_request_header(buf)))
    assert _outcome(lambda: NATIVE.peek_request_header(buf)) == python
    assert _outcome(lambda: NATIVE.peek_request_header(bytearray(buf))) == python
    correlation = _outcome(lambda: codec.peek.peek_correlation_id(buf))
    assert _outcome(lambda: NATIVE.peek_correlation_id(buf)) == correlation


@needs_native
def test_captured_headers_peek_alike() -> None:
    assert NATIVE is not None
    for frame in REQUESTS:
        assert NATIVE.peek_request_header(frame) == tuple(codec.peek.peek_request_header(frame))
    for frame in RESPONSES:
        assert NATIVE.peek_correlation_id(frame) == codec.peek.peek_correlation_id(frame)


def _produce_decisions(table: Any, head: bytes, api_key: int, version: int) -> None:
    assert table.expects_response(head, api_key, version) == expects_response(head, api_key, version), (
        api_key,
        version,
        head.hex(),
    )
    for body in range(0, min(len(head), 40) + 3):
        assert table.peek_produce_acks(head, version, body) == codec.peek.peek_produce_acks(
            head, version, body
        )


@needs_native
def test_captured_and_built_requests_expect_responses_alike() -> None:
    """Every captured request, and Produce requests of every version (acks -1, 0, 1...), whole and cut
    at every length (the tap's retained head may end anywhere)."""
    assert NATIVE is not None
    table = native_core.produce_table(NATIVE)
    for frame in REQUESTS:
        key, version = struct.unpack_from(">hh", frame)
        _produce_decisions(table, frame, key, version)
    acks = set()
    for frame in PRODUCES:
        key, version = struct.unpack_from(">hh", frame)
        acks.add(expects_response(frame, key, version))
        for cut in range(0, min(len(frame), 80)):
            _produce_decisions(table, frame[:cut], key, version)
        _produce_decisions(table, frame, key, version)
    assert acks == {True, False}  # the built frames include acks=0


@needs_native
@given(
    version=st.sampled_from([*PRODUCE_VERSIONS, 14, -1, 300]),
    client_id=st.none() | st.binary(max_size=6),
    tags=st.binary(max_size=8),
    transactional_id=st.binary(max_size=4),
    acks=st.integers(-(2**15), 2**15 - 1),
    tail=st.binary(max_size=4),
    key=st.sampled_from([ApiKey.PRODUCE, ApiKey.FETCH]),
)
def test_produce_acks_decide_alike(
    version: int,
    client_id: bytes | None,
    tags: bytes,
    transactional_id: bytes,
    acks: int,
    tail: bytes,
    key: int,
) -> None:
    """Produce requests put together from parts, tagged sections and string lengths included, often
    malformed: the reference and the native table agree on whether a response comes."""
    assert NATIVE is not None
    table = native_core.produce_table(NATIVE)
    head = _header(key, version, 7, client_id, tags + transactional_id + struct.pack(">h", acks) + tail)
    _produce_decisions(table, head, key, version)
    # A body offset far past the frame says nothing (and cannot overflow the native arithmetic).
    assert table.peek_produce_acks(head, version, 2**63 - 1) is None


# ----- correlations ----------------------------------------------------------------------------------

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "match", "expire", "peek", "drain"]),
        st.integers(0, 1),  # which connection
        st.integers(0, 12),  # correlation id
        st.integers(0, 30),  # held bytes (or: not held)
        st.sampled_from([ApiKey.PRODUCE, ApiKey.METADATA, ApiKey.JOIN_GROUP]),
    ),
    max_size=80,
)


@needs_native
@given(
    _OPS, st.integers(0, 6), st.integers(0, 60), st.integers(0, 80), st.integers(1, 50), st.integers(1, 200)
)
@example(  # a JoinGroup inside its rebalance bound does not stop the younger requests' expiry
    [("add", 0, 1, 10, ApiKey.JOIN_GROUP), ("add", 0, 2, 10, ApiKey.METADATA), ("expire", 0, 0, 0, 0)],
    6,
    60,
    80,
    1,
    100,
)
@settings(max_examples=300)
def test_correlations_decide_alike(
    ops: list[tuple[str, int, int, int, int]],
    max_in_flight: int,
    max_bytes: int,
    tap_bytes: int,
    max_age: int,
    rebalance_age: int,
) -> None:
    """Two connections sharing a tap's budget, driven by the same requests, responses, clock ticks and
    closes: every frame handed back (which one, why, in which order), every pairing, the counts."""
    assert NATIVE is not None
    limits = HoldLimits(max_in_flight, max_bytes, max_age, rebalance_age)
    budget, native_budget = HeldBudget(tap_bytes), NATIVE.HeldBudget(tap_bytes)
    python = [Correlations(limits, budget) for _ in range(2)]
    native = [native_core.correlations(NATIVE, limits, native_budget) for _ in range(2)]

    def pending_tuple(p: Pending | None) -> Any:
        return None if p is None else (p.api_key, p.api_version, p.forwarded_ns, p.sensitive, p.held)

    def released(out: list[Any]) -> list[tuple[Any, str]]:
        return [(u.held, u.reason) for u in out]

    now = 0
    want: Any
    got: Any
    for op, conn, corr, size, api in ops:
        now += 5
        c, n = python[conn], native[conn]
        if op == "add":
            part = None if size == 30 else Part("req", now, api, 9, corr, bytes(size))
            sensitive = size % 7 == 0
            want = released(c.add(corr, Pending(api, 9, now, sensitive, part)))
            got = n.add(corr, api, 9, now, part, 0 if part is None else size, sensitive)
        elif op == "match":
            found, orphans = c.match(corr)
            want = [pending_tuple(found), released(orphans)]
            got_found, got_orphans = n.match(corr)
            got = [got_found, got_orphans]
        elif op == "expire":
            want, got = released(c.expire(now)), n.expire(now)
        elif op == "peek":
            want, got = pending_tuple(c.peek(corr)), n.peek(corr)
        else:
            want, got = released(c.drain()), n.drain()
        assert got == want, (op, conn, corr)
        assert [t is w for t, w in zip(_helds(got), _helds(want), strict=True)] == [True] * len(_helds(want))
        assert (len(n), n.held_bytes, native_budget.held) == (len(c), c.held_bytes, budget.held)


def _helds(value: Any) -> list[Any]:
    """The held objects in a result, in order (the native core hands back the very objects)."""
    if isinstance(value, Part):
        return [value]
    if isinstance(value, list | tuple):
        return [h for item in value for h in _helds(item)]
    return []


@needs_native
def test_a_join_group_waits_for_its_rebalance_natively_too() -> None:
    assert NATIVE is not None
    c = native_core.correlations(NATIVE, HoldLimits(max_age_ns=100, max_rebalance_age_ns=1_000))
    held = [Part("req", 0, 11, 9, 1, b"x" * 10), Part("req", 10, 3, 12, 2, b"y" * 10)]
    c.add(1, ApiKey.JOIN_GROUP, 9, 0, held[0], 10)
    c.add(2, ApiKey.METADATA, 12, 10, held[1], 10)
    assert c.expire(150) == [(held[1], "held_age")]
    assert c.expire(999) == []
    assert c.expire(1_000) == [(held[0], "held_age")]
    assert {int(k) for k in REBALANCE_WAITS} == {ApiKey.JOIN_GROUP}


# ----- msgpack and schema-3 records --------------------------------------------------------------------

#: Lengths around every msgpack header boundary.
_EDGES = [0, 1, 15, 16, 31, 32, 255, 256, 65_535, 65_536]
_INT_EDGES = [s * (2**b) + d for b in (5, 7, 8, 15, 16, 31, 32, 63) for s in (1, -1) for d in (-1, 0, 1)] + [
    2**64 - 1
]
ints = st.integers(-(2**63), 2**64 - 1) | st.sampled_from([i for i in _INT_EDGES if -(2**63) <= i < 2**64])
texts = st.text(max_size=40) | st.sampled_from(_EDGES).map(lambda n: "é" * (n // 2) + "x" * (n % 2))
blobs = st.binary(max_size=40) | st.sampled_from(_EDGES).map(bytes)
scalars = st.none() | st.booleans() | ints | st.floats(allow_nan=False) | texts | blobs
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=18)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(texts | ints, inner, max_size=18)
    ),
    max_leaves=40,
)


@needs_native
@given(values)
@example(list(range(16)))
@example({str(i): i for i in range(16)})
@example([None] * 65_536)
def test_msgpack_writes_what_msgpack_python_writes(value: Any) -> None:
    assert NATIVE is not None
    assert NATIVE.packb(value) == msgpack.packb(value, use_bin_type=True)


@needs_native
@pytest.mark.parametrize("value", [2**64, -(2**63) - 1])
def test_ints_msgpack_cannot_hold_are_refused_alike(value: int) -> None:
    assert NATIVE is not None
    with pytest.raises(OverflowError):
        msgpack.packb(value, use_bin_type=True)
    with pytest.raises(OverflowError):
        NATIVE.packb(value)


connections = st.builds(
    Connection,
    texts,
    texts,
    texts,
    st.none() | ints.filter(lambda i: i < 2**63),
    st.none() | texts,
    texts,
    st.sampled_from(["full", "headers", "meta", "off"]),
)
#: A part's fields as the tap writes them (the native writer's types), or now and then of another type
#: that the reference packs all the same (an int past int64, a flag that is not a string).
parts = st.builds(
    Part,
    st.sampled_from(taprecord.DIRECTIONS),
    st.integers(0, 2**63 - 1) | ints,
    st.none() | st.integers(-(2**15), 2**15 - 1),
    st.none() | st.integers(-(2**15), 2**15 - 1),
    st.none() | st.integers(-(2**31), 2**31 - 1),
    st.none() | blobs | st.sampled_from([f for _, _, _, f in CORPUS]),
    st.lists(st.sampled_from(["sasl_token", "Password", "Tokens[].Value"]), max_size=3).map(tuple),
    st.dictionaries(st.sampled_from(["truncated", "orig_size", "header_error", "error"]), texts, max_size=3)
    | st.dictionaries(texts, texts | ints, max_size=2),
)
entries = st.lists(
    st.tuples(st.sampled_from(taprecord.KINDS), st.integers(0, 2**63 - 1), st.lists(parts, max_size=3)),
    max_size=20,
)


@needs_native
@given(
    connections,
    entries,
    st.sampled_from([0, 1, 127, 128, 2**40]),
    st.sampled_from([0, 0, 1, 1_700_000_000_000_000_000]),
)
def test_schema_3_records_are_the_reference_s_byte_for_byte(
    connection: Connection, flush: list[Any], lost: int, loss_ns: int
) -> None:
    assert NATIVE is not None
    static = taprecord.pack_static(connection)
    assert NATIVE.pack_static(connection) == static
    value = taprecord.pack_flush(static, flush, lost, loss_ns)
    assert NATIVE.pack_flush(static, flush, lost, loss_ns) == value
    assert NATIVE.pack_flush(static, flush, lost) == taprecord.pack_flush(static, flush, lost)
    # ...and what every reader reads (the native bytes are the reference's, so this is a sanity check).
    assert len(taprecord.parse_records(None, value)) == len(flush)


@needs_native
def test_a_flush_of_the_captured_frames_is_the_reference_s() -> None:
    """The corpus as one connection's exchanges: a request and its response per entry."""
    assert NATIVE is not None
    static = taprecord.pack_static(
        Connection("c-1", "127.0.0.1:5000", "127.0.0.1:9092", 1, "PLAINTEXT", "tap-a")
    )
    flush = [
        ("ex" if d == "req" else "resp", seq, [Part(d, 1_700_000_000_000_000_000 + seq, k, v, seq, frame)])
        for seq, (d, k, v, frame) in enumerate(CORPUS, start=1)
    ]
    assert NATIVE.pack_flush(static, flush) == taprecord.pack_flush(static, flush)
    assert NATIVE.pack_flush(static, flush, 3) == taprecord.pack_flush(static, flush, 3)
