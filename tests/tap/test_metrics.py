"""The Prometheus endpoint: frame/byte counters, error codes, both latency histograms, bounded labels."""

from __future__ import annotations

import asyncio
import struct
import urllib.request

from tap.metrics import TapMetrics
from tap.mirror import MemoryMirror
from tap.proxy import ListenerSpec, Tap, TapSettings
from tests.tap.conftest import free_port
from tests.tap.helpers import FakeBroker, api_versions_request, frame


def test_metrics_endpoint_reports_traffic() -> None:
    metrics = TapMetrics()
    port = free_port()
    metrics.serve(port, "127.0.0.1")

    async def run() -> None:
        broker = FakeBroker(reply=struct.pack(">h", 35))  # UNSUPPORTED_VERSION
        tap = Tap(
            [ListenerSpec("127.0.0.1", 0, "127.0.0.1", await broker.start())],
            MemoryMirror(),
            TapSettings(),
            metrics,
        )
        ((_, tport),) = await tap.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", tport)
        for corr in range(4):
            writer.write(frame(api_versions_request(corr)))
        # An absurd api key/version is folded into "other", keeping label cardinality bounded.
        writer.write(frame(struct.pack(">hhih", 999, 999, 9, -1)))
        await writer.drain()
        for _ in range(5):
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            await reader.readexactly(size)
        writer.close()
        await asyncio.sleep(0.05)
        await tap.stop()
        await broker.stop()

    asyncio.run(run())
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'kpmon_tap_frames_total{api_key="18",api_version="3",dir="req"} 4.0' in text
    assert 'kpmon_tap_frames_total{api_key="18",api_version="3",dir="resp"} 4.0' in text
    assert 'kpmon_tap_frames_total{api_key="other",api_version="other",dir="req"} 1.0' in text
    assert 'kpmon_tap_response_errors_total{api_key="18",error_code="35"} 4.0' in text
    assert 'kpmon_tap_broker_seconds_count{api_key="18"} 4.0' in text
    assert 'kpmon_tap_inside_seconds_count{api_key="18"}' in text
    assert "kpmon_tap_active_connections 0.0" in text
    assert "kpmon_tap_mirror_queue_depth" in text


def test_metrics_bind_loopback_unless_configured() -> None:
    from kpmon.config import load_config
    from tests.tap.harness import accepts

    config = load_config(environ={})
    assert config.tap.metrics_host == "127.0.0.1"
    port = free_port()
    TapMetrics().serve(port)  # the default
    assert accepts("127.0.0.1", port) and not accepts("127.0.0.2", port)
    wide = free_port()
    TapMetrics().serve(wide, "0.0.0.0")  # what an operator opts into with tap.metrics_host
    assert accepts("127.0.0.2", wide)
