"""Prometheus metrics for the tap. Label values are bounded: api keys and versions are small ints
(anything outside 0..127 / 0..63 is folded to "other"), directions and reasons are fixed sets."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

#: 2 ms is the issue's budget for latency the tap adds (docs/tap.md "Measured"): a bucket edge there
#: lets the histogram say on which side a tap's own time falls.
_LATENCY_BUCKETS = (
    0.00001,
    0.00005,
    0.0001,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.05,
    0.1,
    0.5,
    1.0,
    5.0,
    30.0,
)


def _api_label(value: int | None, limit: int) -> str:
    if value is None:
        return "none"
    return str(value) if 0 <= value < limit else "other"


class TapMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.frames = Counter(
            "kpmon_tap_frames", "Frames forwarded", ["dir", "api_key", "api_version"], registry=r
        )
        self.bytes = Counter(
            "kpmon_tap_bytes",
            "Frame bytes forwarded (incl. size prefix)",
            ["dir", "api_key", "api_version"],
            registry=r,
        )
        self.errors = Counter(
            "kpmon_tap_response_errors",
            "Non-zero response error codes",
            ["api_key", "error_code"],
            registry=r,
        )
        self.connections = Gauge("kpmon_tap_active_connections", "Open client connections", registry=r)
        self.connections_total = Counter("kpmon_tap_connections", "Accepted client connections", registry=r)
        self.bad_connections = Counter(
            "kpmon_tap_closed_connections", "Connections the tap closed", ["reason"], registry=r
        )
        self.queue_depth = Gauge(
            "kpmon_tap_mirror_queue_depth", "Tap records waiting to be produced", registry=r
        )
        self.drops = Counter("kpmon_tap_mirror_drops", "Tap records dropped (queue full)", registry=r)
        self.delivery_errors = Counter(
            "kpmon_tap_mirror_delivery_errors", "Tap records the producer failed to deliver", registry=r
        )
        self.rewritten = Counter(
            "kpmon_tap_rewritten", "Responses rewritten (addresses, clamped versions)", registry=r
        )
        self.dynamic_listeners = Counter(
            "kpmon_tap_dynamic_listeners",
            "Listeners opened on the fly for new broker ids (result: opened, retargeted, failed)",
            ["result"],
            registry=r,
        )
        self.truncated = Counter(
            "kpmon_tap_mirror_truncated", "Frames mirrored truncated to their header", registry=r
        )
        self.tap_latency = Histogram(
            "kpmon_tap_inside_seconds",
            "Time a frame's bytes spend inside the tap before being written on",
            ["api_key"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.broker_latency = Histogram(
            "kpmon_tap_broker_seconds",
            "Request forwarded to response received",
            ["api_key"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._frame_children: dict[tuple[str, int | None, int | None], tuple[Counter, Counter]] = {}
        self._latency_children: dict[tuple[int | None, bool], Histogram] = {}

    def set_depth_source(self, fn: Callable[[], int]) -> None:
        self.queue_depth.set_function(lambda: float(fn()))

    def frame(self, direction: str, api_key: int | None, api_version: int | None, nbytes: int) -> None:
        key = (direction, api_key, api_version)
        children = self._frame_children.get(key)
        if children is None:
            labels = (direction, _api_label(api_key, 128), _api_label(api_version, 64))
            children = (self.frames.labels(*labels), self.bytes.labels(*labels))
            self._frame_children[key] = children
        children[0].inc()
        children[1].inc(nbytes)

    def latency(self, api_key: int | None, broker: bool, seconds: float) -> None:
        key = (api_key, broker)
        child = self._latency_children.get(key)
        if child is None:
            hist = self.broker_latency if broker else self.tap_latency
            child = hist.labels(_api_label(api_key, 128))
            self._latency_children[key] = child
        child.observe(seconds)

    def response_error(self, api_key: int, code: int) -> None:
        # Error codes are Kafka's small, fixed set; clamp anything else.
        label = str(code) if -1 <= code < 256 else "other"
        self.errors.labels(_api_label(api_key, 128), label).inc()

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
