"""The Prometheus endpoint: frame/byte counters, error codes, both latency histograms, bounded labels."""

from __future__ import annotations

import asyncio
import struct
import urllib.request

from codec.protocol import ApiKey
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
            [ListenerSpec("127.0.0.1", 0, "127.0.0.1", await broker.start(), 7, "INTERNAL")],
            MemoryMirror(max_frames=1000),
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
    # (The exposition sorts labels by name.)
    where = 'broker_id="7",listener="INTERNAL"'
    versions = 'api="API_VERSIONS",api_version="3",broker_id="7"'
    assert f'kpmon_tap_frames_total{{{versions},dir="req",listener="INTERNAL"}} 4.0' in text
    assert f'kpmon_tap_frames_total{{{versions},dir="resp",listener="INTERNAL"}} 4.0' in text
    assert (
        'kpmon_tap_frames_total{api="other",api_version="other",broker_id="7",dir="req",listener="INTERNAL"} 1.0'
        in text
    )
    assert (
        'kpmon_tap_response_errors_total{api="API_VERSIONS",broker_id="7",error_code="35",listener="INTERNAL"} 4.0'
        in text
    )
    assert f'kpmon_tap_broker_seconds_count{{api="API_VERSIONS",{where}}} 4.0' in text
    assert f'kpmon_tap_inside_seconds_count{{api="API_VERSIONS",{where}}}' in text
    assert f"kpmon_tap_active_connections{{{where}}} 0.0" in text
    assert f"kpmon_tap_connections_total{{{where}}} 1.0" in text
    assert "kpmon_tap_mirror_queue_depth " in text  # MemoryMirror keeps what it took: not 0
    assert "kpmon_tap_mirror_queue_capacity 1000.0" in text


def test_label_values_are_api_names_from_a_bounded_set() -> None:
    from codec.protocol import ApiKey
    from tap.metrics import api_label, version_label

    assert api_label(ApiKey.PRODUCE) == "PRODUCE" and api_label(ApiKey.API_VERSIONS) == "API_VERSIONS"
    assert {api_label(k) for k in range(-1000, 1000)} == {key.name for key in ApiKey} | {"other"}
    assert api_label(None) == "none"
    assert {version_label(v) for v in range(-5, 500)} == {str(v) for v in range(64)} | {"other"}


def test_each_listener_has_its_own_series() -> None:
    metrics = TapMetrics()
    metrics.listener(1, "CLIENT").frame("req", ApiKey.FETCH, 17, 100)
    metrics.listener(2, "CLIENT").frame("req", ApiKey.FETCH, 17, 50)
    metrics.listener(None, "PLAINTEXT").frame("req", None, None, 10)
    assert metrics.listener(1, "CLIENT") is metrics.listener(1, "CLIENT")
    get = metrics.registry.get_sample_value
    fetch = {"dir": "req", "api": "FETCH", "api_version": "17", "listener": "CLIENT"}
    assert get("kpmon_tap_bytes_total", {**fetch, "broker_id": "1"}) == 100
    assert get("kpmon_tap_bytes_total", {**fetch, "broker_id": "2"}) == 50
    none = {"dir": "req", "api": "none", "api_version": "none", "broker_id": "none", "listener": "PLAINTEXT"}
    assert get("kpmon_tap_frames_total", none) == 1


def test_per_frame_series_are_read_from_live_cores_and_kept_when_they_close() -> None:
    from tap.core import CoreSettings, PyTapCore, tables

    metrics = TapMetrics()
    listener = metrics.listener(3, "CLIENT")
    get = metrics.registry.get_sample_value
    labels = {"dir": "req", "api": "API_VERSIONS", "api_version": "3", "broker_id": "3", "listener": "CLIENT"}
    cores = [PyTapCore(tables(), CoreSettings(), b"\x90") for _ in range(2)]
    for n, core in enumerate(cores):
        listener.attach(str(n).encode(), core)
        core.feed(True, frame(api_versions_request(n)), 1, 1, 1)
    assert get("kpmon_tap_frames_total", labels) == 2
    listener.retire(b"0")
    cores[1].feed(True, frame(api_versions_request(5)), 1, 1, 1)
    assert get("kpmon_tap_frames_total", labels) == 3  # the closed one's count stays
    listener.retire(b"1")
    assert get("kpmon_tap_frames_total", labels) == 3
    inside = {"api": "API_VERSIONS", "broker_id": "3", "listener": "CLIENT", "le": "1e-05"}
    assert get("kpmon_tap_inside_seconds_bucket", inside) == 3
