"""Prometheus metrics for the tap.

Traffic series are labelled by API name (``api``, ``codec.protocol.ApiKey``: ``PRODUCE``, ``FETCH``...),
the broker the listener forwards to (``broker_id``) and its ``listener`` name, as Kroxylicious and Envoy
label theirs. Every label value comes from a bounded set: API names of the schema table (anything else
is ``other``), versions 0..63 (else ``other``), the configured listeners' broker ids and names (dynamic
listeners add at most ``max_dynamic_listeners``), fixed directions, reasons and results.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from codec.protocol import ApiKey
from tap import native_core

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

#: Why the tap closes a connection (``kpmon_tap_closed_connections_total{reason}``).
CLOSE_REASONS = ("broker_unreachable", "bad_request_frame", "bad_response_frame", "no_broker_identity")
#: The labels every traffic series of one listener carries.
LISTENER_LABELS = ("broker_id", "listener")
_API_NAMES = {int(key): key.name for key in ApiKey}


def api_label(api_key: int | None) -> str:
    """The ``api`` label: the API's name, ``none`` for frames with no API (SASL tokens, garbage),
    ``other`` for a number no Kafka API has (bounded: a client sending random keys adds one series)."""
    if api_key is None:
        return "none"
    return _API_NAMES.get(api_key, "other")


def version_label(api_version: int | None) -> str:
    if api_version is None:
        return "none"
    return str(api_version) if 0 <= api_version < 64 else "other"


class TapMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        where = list(LISTENER_LABELS)
        self.frames = Counter(
            "kpmon_tap_frames", "Frames forwarded", ["dir", "api", "api_version", *where], registry=r
        )
        self.bytes = Counter(
            "kpmon_tap_bytes",
            "Frame bytes forwarded (incl. size prefix)",
            ["dir", "api", "api_version", *where],
            registry=r,
        )
        self.errors = Counter(
            "kpmon_tap_response_errors",
            "Non-zero response error codes",
            ["api", "error_code", *where],
            registry=r,
        )
        self.connections = Gauge("kpmon_tap_active_connections", "Open client connections", where, registry=r)
        self.connections_total = Counter(
            "kpmon_tap_connections", "Accepted client connections", where, registry=r
        )
        self.bad_connections = Counter(
            "kpmon_tap_closed_connections", "Connections the tap closed", ["reason", *where], registry=r
        )
        self.blind_connections = Counter(
            "kpmon_tap_blind_connections",
            "Connections relayed unread: one side spoke TLS that the tap does not terminate (side: "
            "client or broker); the monitor sees none of their frames",
            ["side", *where],
            registry=r,
        )
        self.queue_depth = Gauge(
            "kpmon_tap_mirror_queue_depth", "Tap records waiting to be produced", registry=r
        )
        self.queue_capacity = Gauge(
            "kpmon_tap_mirror_queue_capacity",
            "Tap records the mirror queue holds before it drops (tap.queue_max_frames)",
            registry=r,
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
        self.lone_frames = Counter(
            "kpmon_tap_lone_frames",
            "Frames mirrored as a record of their own instead of in a request/response exchange, by reason",
            ["reason"],
            registry=r,
        )
        self.truncated = Counter(
            "kpmon_tap_mirror_truncated", "Frames mirrored truncated to their header", registry=r
        )
        self.tap_latency = Histogram(
            "kpmon_tap_inside_seconds",
            "Time a frame's bytes spend inside the tap before being written on",
            ["api", *where],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.broker_latency = Histogram(
            "kpmon_tap_broker_seconds",
            "Request forwarded to response received",
            ["api", *where],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.core = Gauge(
            "kpmon_tap_core_info",
            "Tap processes running each core: native (kpmon_tapcore) or python (the reference)",
            ["core"],
            registry=r,
        )
        self.core.labels(native_core.core_name()).set(1)
        self._listeners: dict[tuple[str, str], ListenerMetrics] = {}

    def set_depth_source(self, fn: Callable[[], int]) -> None:
        self.queue_depth.set_function(lambda: float(fn()))

    def listener(self, broker_id: int | None, listener_name: str) -> ListenerMetrics:
        """The metrics of connections through one listener (one per broker id and listener name)."""
        key = ("none" if broker_id is None else str(broker_id), listener_name)
        found = self._listeners.get(key)
        if found is None:
            found = self._listeners[key] = ListenerMetrics(self, *key)
        return found

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        start_http_server(port, addr=addr, registry=self.registry)


class ListenerMetrics:
    """One listener's view of :class:`TapMetrics`: its labels bound, and label children cached (the hot
    path does a dict lookup per frame, not a ``labels()`` call)."""

    def __init__(self, metrics: TapMetrics, broker_id: str, listener: str) -> None:
        self.metrics = metrics
        self.where = (broker_id, listener)
        self.connections = metrics.connections.labels(*self.where)
        self.connections_total = metrics.connections_total.labels(*self.where)
        self.connections.set(0)
        for side in ("client", "broker"):
            metrics.blind_connections.labels(side, *self.where)
        # At zero from the first connection on, so rate() and the dashboard see them before any event.
        self._closed = {
            reason: metrics.bad_connections.labels(reason, *self.where) for reason in CLOSE_REASONS
        }
        self._frame_children: dict[tuple[str, int | None, int | None], tuple[Counter, Counter]] = {}
        self._latency_children: dict[tuple[int | None, bool], Histogram] = {}

    def frame(self, direction: str, api_key: int | None, api_version: int | None, nbytes: int) -> None:
        key = (direction, api_key, api_version)
        children = self._frame_children.get(key)
        if children is None:
            labels = (direction, api_label(api_key), version_label(api_version), *self.where)
            children = (self.metrics.frames.labels(*labels), self.metrics.bytes.labels(*labels))
            self._frame_children[key] = children
        children[0].inc()
        children[1].inc(nbytes)

    def latency(self, api_key: int | None, broker: bool, seconds: float) -> None:
        key = (api_key, broker)
        child = self._latency_children.get(key)
        if child is None:
            hist = self.metrics.broker_latency if broker else self.metrics.tap_latency
            child = hist.labels(api_label(api_key), *self.where)
            self._latency_children[key] = child
        child.observe(seconds)

    def response_error(self, api_key: int, code: int) -> None:
        # Error codes are Kafka's small, fixed set; clamp anything else.
        label = str(code) if -1 <= code < 256 else "other"
        self.metrics.errors.labels(api_label(api_key), label, *self.where).inc()

    def blind(self, side: str) -> None:
        self.metrics.blind_connections.labels(side, *self.where).inc()

    def closed(self, reason: str) -> None:
        child = self._closed.get(reason)
        (child or self.metrics.bad_connections.labels(reason, *self.where)).inc()
