"""The asyncio tap against a local fake broker: byte-exact forwarding, mirroring, failure modes."""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import Iterator

import pytest

import codec
from codec.taprecord import EXCHANGE
from tap.flush import FlushLimits
from tap.mirror import MemoryMirror
from tap.proxy import ListenerSpec, Tap, TapSettings
from tests.tap.helpers import FakeBroker, api_versions_request, frame, metric_sum, parsed, parts

#: Each entry a record of its own: what a test of per-record accounting needs.
ONE_PER_RECORD = FlushLimits(max_entries=1)


async def _start(sink: MemoryMirror, broker_port: int, **settings: object) -> tuple[Tap, int]:
    tap = Tap(
        [ListenerSpec("127.0.0.1", 0, "127.0.0.1", broker_port, 1)],
        sink,
        TapSettings(**settings),  # type: ignore[arg-type]
    )
    ((_, port),) = await tap.start()
    return tap, port


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


@pytest.fixture(autouse=True, params=["asyncio", "uvloop"])
def event_loop_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test runs on both loops: the tap uses uvloop in production, asyncio where it is missing."""
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    yield request.param
    asyncio.set_event_loop_policy(None)


def test_pipelined_requests_are_forwarded_exactly_and_mirrored_in_order() -> None:
    async def run() -> None:
        broker = FakeBroker()
        sink = MemoryMirror()
        tap, port = await _start(sink, await broker.start(), capture="full")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sent = hashlib.sha256()
        for corr in range(50):
            data = frame(api_versions_request(corr))
            sent.update(data)
            writer.write(data)
        await writer.drain()
        for corr in range(50):
            assert struct.unpack_from(">i", await _read_frame(reader))[0] == corr
        writer.close()
        await asyncio.sleep(0.1)
        assert broker.received.digest() == sent.digest()
        await tap.stop()
        await broker.stop()
        records = parsed(sink.records)
        # One record per exchange: open, 50 request/response pairs, close; numbered as written.
        assert [r.seq for r in records] == list(range(1, 53))
        assert records[0].kind == "open" and records[-1].kind == "close"
        exchanges = records[1:-1]
        assert {r.kind for r in exchanges} == {EXCHANGE}
        for corr, record in enumerate(exchanges):
            req, resp = record.parts
            assert (req.direction, resp.direction) == ("req", "resp")
            assert req.correlation_id == resp.correlation_id == corr
            assert codec.decode_request(req.value or b"").api_key == 18
            assert (resp.api_key, resp.api_version) == (18, 3)
            assert req.ts_ns <= resp.ts_ns
        assert len({r.connection.conn for r in records}) == 1
        assert {r.key for r in sink.records} == {records[0].connection.conn.encode()}

    asyncio.run(run())


def test_large_frame_streams_through_without_buffering() -> None:
    async def run() -> None:
        broker = FakeBroker()
        sink = MemoryMirror()
        tap, port = await _start(sink, await broker.start(), capture="full", max_mirrored_frame_bytes=1000)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        header = api_versions_request(99)
        big = header + b"z" * (120 * 1024 * 1024)
        writer.write(struct.pack(">i", len(big)))
        chunk = 1 << 20
        view = memoryview(big)
        for i in range(0, len(big), chunk):
            writer.write(view[i : i + chunk])
            await writer.drain()
        assert struct.unpack_from(">i", await _read_frame(reader))[0] == 99
        writer.close()
        await asyncio.sleep(0.1)
        assert broker.received_len == len(big) + 4
        await tap.stop()
        await broker.stop()
        req = next(p for _, p in parts(sink.records) if p.direction == "req")
        assert req.flags["truncated"] == "1" and req.header_only
        assert req.flags["orig_size"] == str(len(big))
        assert len(req.value or b"") < 100

    asyncio.run(run())


def test_garbage_connection_is_closed_and_others_continue() -> None:
    async def run() -> None:
        broker = FakeBroker()
        sink = MemoryMirror()
        tap, port = await _start(sink, await broker.start())
        good_r, good_w = await asyncio.open_connection("127.0.0.1", port)
        bad_r, bad_w = await asyncio.open_connection("127.0.0.1", port)
        bad_w.write(struct.pack(">i", -5) + b"junk")
        await bad_w.drain()
        assert await asyncio.wait_for(bad_r.read(), 5) == b""
        good_w.write(frame(api_versions_request(1)))
        await good_w.drain()
        assert struct.unpack_from(">i", await _read_frame(good_r))[0] == 1
        good_w.close()
        samples = metric_sum(
            tap.metrics.registry, "kpmon_tap_closed_connections_total", {"reason": "bad_request_frame"}
        )
        assert samples == 1
        await tap.stop()
        await broker.stop()

    asyncio.run(run())


def test_broker_death_disconnects_the_client() -> None:
    async def run() -> None:
        broker = FakeBroker()
        sink = MemoryMirror()
        tap, port = await _start(sink, await broker.start())
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(frame(api_versions_request(1)))
        await writer.drain()
        await _read_frame(reader)
        await broker.stop()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()  # the broker's FIN is passed on as a half-close; the client then closes
        await asyncio.sleep(0.05)
        close = parsed(sink.records)[-1]
        assert close.kind == "close"
        assert b"broker" in (close.parts[0].value or b"")
        await tap.stop()

    asyncio.run(run())


def test_unreachable_broker_closes_client_with_reason() -> None:
    async def run() -> None:
        sink = MemoryMirror()
        tap, port = await _start(sink, 1)  # nothing listens on port 1
        reader, _ = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        await asyncio.sleep(0.05)
        records = parsed(sink.records)
        assert records[0].kind == "open"
        assert "connect failed" in records[-1].parts[0].flags["error"]
        await tap.stop()

    asyncio.run(run())


def test_half_close_still_delivers_responses() -> None:
    async def run() -> None:
        broker = FakeBroker()
        sink = MemoryMirror()
        tap, port = await _start(sink, await broker.start())
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for corr in range(3):
            writer.write(frame(api_versions_request(corr)))
        writer.write_eof()
        got = [struct.unpack_from(">i", await _read_frame(reader))[0] for _ in range(3)]
        assert got == [0, 1, 2]
        assert await asyncio.wait_for(reader.read(), 5) == b""
        await tap.stop()
        await broker.stop()

    asyncio.run(run())


@pytest.mark.parametrize("max_frames", [0, 3])
def test_full_mirror_queue_drops_and_counts_without_affecting_traffic(max_frames: int) -> None:
    async def run() -> None:
        broker = FakeBroker()
        sink = MemoryMirror(max_frames=max_frames)
        # A record per entry, so the queue's bound counts entries here.
        tap, port = await _start(sink, await broker.start(), flush=ONE_PER_RECORD)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for corr in range(20):
            writer.write(frame(api_versions_request(corr)))
        await writer.drain()
        for corr in range(20):
            assert struct.unpack_from(">i", await _read_frame(reader))[0] == corr
        writer.close()
        await asyncio.sleep(0.05)
        await tap.stop()
        await broker.stop()
        drops = tap.metrics.registry.get_sample_value("kpmon_tap_mirror_drops_total")
        assert drops == 22 - max_frames  # open + 20 exchanges + close
        assert len(sink.records) == max_frames

    asyncio.run(run())


def test_records_after_a_refused_one_carry_how_many_were_lost() -> None:
    """The sink refuses records while full; every record the connection writes after one it refused
    says how many it has lost, so a reader knows the connection is incomplete without its gap."""

    async def run() -> None:
        broker = FakeBroker()
        sink = MemoryMirror(max_frames=2)
        tap, port = await _start(sink, await broker.start(), flush=ONE_PER_RECORD)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)

        async def exchange(corr: int) -> None:
            writer.write(frame(api_versions_request(corr)))
            await writer.drain()
            assert struct.unpack_from(">i", await _read_frame(reader))[0] == corr

        for corr in range(3):  # open and the first exchange fill the sink; it refuses the next two
            await exchange(corr)
        before = parsed(sink.take())
        await exchange(3)
        writer.close()
        await asyncio.sleep(0.05)
        await tap.stop()
        await broker.stop()
        after = parsed(sink.take())
        assert [(r.kind, r.seq, r.lost) for r in before] == [("open", 1, 0), (EXCHANGE, 2, 0)]
        assert [(r.kind, r.seq, r.lost) for r in after] == [(EXCHANGE, 5, 2), ("close", 6, 2)]
        assert tap.metrics.registry.get_sample_value("kpmon_tap_mirror_drops_total") == 2

    asyncio.run(run())


def test_sasl_v0_tokens_are_never_mirrored() -> None:
    password = b"hunter2-very-secret"

    async def run() -> None:
        # A fake broker speaking the SaslHandshake v0 flow: handshake response, then raw tokens.
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            req = await _read_frame(reader)
            corr = struct.unpack_from(">i", req, 4)[0]
            body = codec.encode_response(17, 0, corr, {"ErrorCode": 0, "Mechanisms": ["PLAIN"]})
            writer.write(frame(body))
            await _read_frame(reader)  # the PLAIN token
            writer.write(frame(b""))
            req = await _read_frame(reader)
            corr = struct.unpack_from(">i", req, 4)[0]
            writer.write(frame(struct.pack(">ih", corr, 0)))
            await writer.drain()
            await reader.read()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        sink = MemoryMirror()
        tap, port = await _start(sink, server.sockets[0].getsockname()[1], capture="full")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(frame(codec.encode_request(17, 0, 1, "c", {"Mechanism": "PLAIN"})))
        await _read_frame(reader)
        writer.write(frame(b"\x00alice\x00" + password))
        assert await _read_frame(reader) == b""
        writer.write(frame(api_versions_request(2)))
        await _read_frame(reader)
        writer.close()
        await asyncio.sleep(0.05)
        await tap.stop()
        server.close()
        for record in sink.records:
            assert password not in record.value and password not in record.key
        kinds = [(r.kind, p.redacted) for r, p in parts(sink.records)]
        # Raw tokens have no correlation id: each is a record of its own, body withheld.
        assert ("req", ("sasl_token",)) in kinds and ("resp", ("sasl_token",)) in kinds
        last = parsed(sink.records)[-2]
        assert last.kind == EXCHANGE and last.parts[0].api_key == 18

    asyncio.run(run())


def test_backpressure_bounds_tap_buffers_when_the_client_is_slow() -> None:
    total = 64 * 1024 * 1024
    expected = hashlib.sha256()

    async def run() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            req = await _read_frame(reader)
            corr = struct.pack(">i", struct.unpack_from(">i", req, 4)[0])
            head = struct.pack(">i", total) + corr
            writer.write(head)
            expected.update(head)
            sent = 4
            block = 0
            while sent < total:
                n = min(1 << 20, total - sent)
                chunk = bytes([block % 251]) * n  # varies per block, so reordering would show
                writer.write(chunk)
                expected.update(chunk)
                block += 1
                sent += n
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        sink = MemoryMirror()
        tap, port = await _start(sink, server.sockets[0].getsockname()[1], max_mirrored_frame_bytes=1000)
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 16)
        writer.write(frame(api_versions_request(5)))
        await writer.drain()
        await asyncio.sleep(1.0)  # the client reads nothing: the tap must stop reading the broker
        (conn,) = tap.connections.values()
        assert conn.client_t is not None
        buffered = conn.client_t.get_write_buffer_size()
        assert buffered <= tap.settings.write_buffer_high + (4 << 20)
        received = 0
        digest = hashlib.sha256()
        while received < total + 4:
            data = await reader.read(1 << 20)
            assert data
            digest.update(data)
            received += len(data)
        assert received == total + 4
        assert digest.digest() == expected.digest()  # broker-sent == client-received, byte for byte
        writer.close()
        await asyncio.sleep(0.05)
        await tap.stop()
        server.close()

    asyncio.run(run())


def test_a_connections_entries_go_out_as_few_records_and_the_close_at_once() -> None:
    """Schema 3: the open entry and 20 pipelined exchanges gather into one or a few records (64 entries
    or 50 ms bound them); each entry keeps its own ``seq``; the close entry goes out with the last
    record as soon as the connection closes, not after the age bound."""

    async def run() -> None:
        broker = FakeBroker()
        sink = MemoryMirror()
        tap, port = await _start(sink, await broker.start(), flush=FlushLimits(max_age_ns=60_000_000_000))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for corr in range(20):
            writer.write(frame(api_versions_request(corr)))
        await writer.drain()
        for _ in range(20):
            await _read_frame(reader)
        await asyncio.sleep(0.05)
        assert sink.records == []  # gathered: none of the bounds is reached yet
        writer.close()
        for _ in range(100):
            if sink.records:
                break
            await asyncio.sleep(0.01)
        entries = parsed(sink.records)
        assert len(sink.records) == 1
        assert [(e.kind, e.seq, e.index) for e in entries] == [
            ("open", 1, 0),
            *((EXCHANGE, seq, seq - 1) for seq in range(2, 22)),
            ("close", 22, 21),
        ]
        await tap.stop()
        await broker.stop()

    asyncio.run(run())


def test_an_idle_connections_entries_go_out_after_the_age_bound() -> None:
    async def run() -> None:
        broker = FakeBroker()
        sink = MemoryMirror()
        tap, port = await _start(sink, await broker.start(), flush=FlushLimits(max_age_ns=100_000_000))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(frame(api_versions_request(7)))
        await writer.drain()
        await _read_frame(reader)
        for _ in range(300):
            if sink.records:
                break
            await asyncio.sleep(0.01)
        assert [e.kind for e in parsed(sink.records)] == ["open", EXCHANGE]
        writer.close()
        await asyncio.sleep(0.05)
        await tap.stop()
        await broker.stop()
        assert [e.kind for e in parsed(sink.records)] == ["open", EXCHANGE, "close"]

    asyncio.run(run())


def test_a_refused_record_loses_every_entry_it_held() -> None:
    async def run() -> None:
        broker = FakeBroker()
        sink = MemoryMirror(max_frames=0)
        tap, port = await _start(sink, await broker.start(), flush=FlushLimits(max_entries=3))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for corr in range(2):  # open + 2 exchanges: one record of 3 entries, refused
            writer.write(frame(api_versions_request(corr)))
            await writer.drain()
            await _read_frame(reader)
        (conn,) = tap.connections.values()
        assert conn.records_lost == 3
        sink.max_frames = 10
        writer.close()
        await asyncio.sleep(0.05)
        await tap.stop()
        await broker.stop()
        assert [(e.kind, e.seq, e.lost) for e in parsed(sink.records)] == [("close", 4, 3)]

    asyncio.run(run())
