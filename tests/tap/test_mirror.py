"""The Kafka mirror with its cluster down: traffic is unaffected, drops and delivery errors are counted,
and a connection counts its records whose delivery failed."""

from __future__ import annotations

import asyncio
import struct
import time

from tap.flush import FlushLimits
from tap.metrics import TapMetrics
from tap.mirror import KafkaMirror, MirrorRecord
from tap.proxy import ListenerSpec, Tap, TapSettings
from tests.tap.helpers import FakeBroker, api_versions_request, frame


def test_offer_never_blocks_and_drops_when_full() -> None:
    errors: list[str] = []
    mirror = KafkaMirror(
        "127.0.0.1:1", "t", max_frames=5, max_bytes=1 << 20, on_error=errors.append, message_timeout_ms=500
    )
    try:
        # Offered with nothing to deliver to: the queue takes what fits and refuses the rest at once
        # (how long an offer takes is the tap benchmark's figure, not a test's).
        accepted = [mirror.offer(MirrorRecord(b"k", b"v" * 100)) for _ in range(50)]
        assert accepted.count(True) == 5
        deadline = time.monotonic() + 10
        while len(errors) < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(errors) == 5  # timed out in the queue: reported, never retried forever
    finally:
        mirror.close(0.1)


def test_traffic_flows_with_the_tap_topic_cluster_down() -> None:
    async def run() -> None:
        broker = FakeBroker()
        metrics = TapMetrics()
        sink = KafkaMirror(
            "127.0.0.1:1",
            "kpmon.tap",
            max_frames=10,
            max_bytes=1 << 20,
            on_error=lambda e: metrics.delivery_errors.inc(),
        )
        tap = Tap(
            [ListenerSpec("127.0.0.1", 0, "127.0.0.1", await broker.start())],
            sink,
            TapSettings(flush=FlushLimits(max_entries=1)),  # a record per entry: the drops count entries
            metrics,
        )
        ((_, port),) = await tap.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for corr in range(500):
            writer.write(frame(api_versions_request(corr)))
            await writer.drain()
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            assert struct.unpack_from(">i", await reader.readexactly(size))[0] == corr
        writer.close()
        await asyncio.sleep(0.05)
        await tap.stop()
        await broker.stop()
        sink.close(0.1)
        # open + 500 exchanges + close, of which the queue took 10.
        assert metrics.registry.get_sample_value("kpmon_tap_mirror_drops_total") == 502 - 10
        assert metrics.registry.get_sample_value("kpmon_tap_mirror_queue_depth") is not None

    asyncio.run(run())


def test_a_failed_delivery_counts_as_lost_on_its_connection() -> None:
    """Records the sink took but could not deliver lose every entry they held, as refused ones do:
    the connection stamps the count of lost entries on what it writes next."""

    async def run() -> None:
        broker = FakeBroker()
        failed: list[str] = []
        sink = KafkaMirror(
            "127.0.0.1:1", "kpmon.tap", max_frames=100, max_bytes=1 << 20, on_error=failed.append,
            message_timeout_ms=300,
        )  # fmt: skip
        tap = Tap([ListenerSpec("127.0.0.1", 0, "127.0.0.1", await broker.start())], sink, TapSettings())
        ((_, port),) = await tap.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(frame(api_versions_request(0)))
        await writer.drain()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        assert struct.unpack_from(">i", await reader.readexactly(size))[0] == 0
        (conn,) = tap.connections.values()
        assert conn.records_lost == 0  # taken by the sink: not lost yet
        # Nothing is there to deliver to: the open entry and the exchange expire in the queue, in one
        # record (or two, when the exchange came after the open record's age bound).
        deadline = time.monotonic() + 10
        while conn.records_lost < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert conn.records_lost == 2 and len(failed) in (1, 2)
        writer.close()
        await asyncio.sleep(0.05)
        await tap.stop()
        await broker.stop()
        sink.close(0.1)

    asyncio.run(run())
