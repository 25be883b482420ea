"""Prometheus metrics for the tap.

Per-frame counts (frames, bytes, response errors, lone frames, truncations, latencies) are kept by
each connection's core (``tap.core``) as plain integers and read here at scrape time
(``CoreCollector``): the live connections' ``counters()`` plus the totals of those that closed. Nothing
on the per-frame path calls into prometheus_client.

Traffic series are labelled by API name (``api``, ``codec.protocol.ApiKey``: ``PRODUCE``, ``FETCH``...),
the broker the listener forwards to (``broker_id``) and its ``listener`` name, as Kroxylicious and Envoy
label theirs. Every label value comes from a bounded set: API names of the schema table (anything else
is ``other``), versions 0..63 (else ``other``), the configured listeners' broker ids and names (dynamic
listeners add at most ``max_dynamic_listeners``), fixed directions, reasons and results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from codec.protocol import ApiKey
from tap import native_core
from tap.core import LATENCY_BUCKETS, LATENCY_BUCKETS_NS, CoreCounters

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
        self.core = Gauge(
            "kpmon_tap_core_info",
            "Tap processes running each core: native (kpmon_tapcore) or python (the reference)",
            ["core"],
            registry=r,
        )
        self.core.labels(native_core.core_name()).set(1)
        self._listeners: dict[tuple[str, str], ListenerMetrics] = {}
        r.register(CoreCollector(self))

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


class CounterSource(Protocol):
    """What a live connection's counts are read from (a ``tap.core.TapCore``)."""

    def counters(self) -> CoreCounters: ...


class Totals:
    """Per-frame counts summed over cores (``CoreCounters`` as mutable plain data)."""

    __slots__ = ("errors", "frames", "latency", "lone", "truncated")

    def __init__(self) -> None:
        self.frames: dict[tuple[str, int | None, int | None], list[int]] = {}
        self.errors: dict[tuple[int, int], int] = {}
        self.lone: dict[str, int] = {}
        self.truncated = 0
        #: (api_key, broker) -> per-bucket counts (the last one +Inf), then the sum in ns.
        self.latency: dict[tuple[int, bool], list[int]] = {}

    def add(self, c: CoreCounters) -> None:
        for key, (n, nbytes) in c.frames.items():
            found = self.frames.setdefault(key, [0, 0])
            found[0] += n
            found[1] += nbytes
        for ekey, n in c.errors.items():
            self.errors[ekey] = self.errors.get(ekey, 0) + n
        for reason, n in c.lone.items():
            self.lone[reason] = self.lone.get(reason, 0) + n
        self.truncated += c.truncated
        for lkey, (buckets, total_ns) in c.latency.items():
            into = self.latency.setdefault(lkey, [0] * (len(LATENCY_BUCKETS_NS) + 2))
            for i, n in enumerate(buckets):
                into[i] += n
            into[-1] += total_ns

    def merge(self, other: Totals) -> None:
        for key, (n, nbytes) in other.frames.items():
            found = self.frames.setdefault(key, [0, 0])
            found[0] += n
            found[1] += nbytes
        for ekey, n in other.errors.items():
            self.errors[ekey] = self.errors.get(ekey, 0) + n
        for reason, n in other.lone.items():
            self.lone[reason] = self.lone.get(reason, 0) + n
        self.truncated += other.truncated
        for lkey, values in other.latency.items():
            into = self.latency.setdefault(lkey, [0] * len(values))
            for i, n in enumerate(values):
                into[i] += n


def _bucket(ns: int) -> int:
    for i, bound in enumerate(LATENCY_BUCKETS_NS):
        if ns <= bound:
            return i
    return len(LATENCY_BUCKETS_NS)


class ListenerMetrics:
    """One listener's view of :class:`TapMetrics`: its labels bound, the cores of its live
    connections (``attach``) and the per-frame totals of those that closed (``retire``)."""

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
        self._live: dict[bytes, CounterSource] = {}
        self.retired = Totals()

    def attach(self, key: bytes, core: CounterSource) -> None:
        """Count ``core``'s frames from now on (read at scrape time)."""
        self._live[key] = core

    def retire(self, key: bytes) -> None:
        """The connection closed: its counts join the listener's totals."""
        core = self._live.pop(key, None)
        if core is not None:
            self.retired.add(core.counters())

    def totals(self) -> Totals:
        """The retired totals plus every live core's counts, now."""
        out = Totals()
        out.merge(self.retired)
        for core in list(self._live.values()):
            out.add(core.counters())
        return out

    # Counts that did not go through a core (tools and tests that feed the series directly).
    def frame(self, direction: str, api_key: int | None, api_version: int | None, nbytes: int) -> None:
        found = self.retired.frames.setdefault((direction, api_key, api_version), [0, 0])
        found[0] += 1
        found[1] += nbytes

    def latency(self, api_key: int, broker: bool, seconds: float) -> None:
        ns = round(seconds * 1e9)
        into = self.retired.latency.setdefault((api_key, broker), [0] * (len(LATENCY_BUCKETS_NS) + 2))
        into[_bucket(ns)] += 1
        into[-1] += ns

    def response_error(self, api_key: int, code: int) -> None:
        key = (api_key, code)
        self.retired.errors[key] = self.retired.errors.get(key, 0) + 1

    def blind(self, side: str) -> None:
        self.metrics.blind_connections.labels(side, *self.where).inc()

    def closed(self, reason: str) -> None:
        child = self._closed.get(reason)
        (child or self.metrics.bad_connections.labels(reason, *self.where)).inc()


_LE = [floatToGoString(b) for b in LATENCY_BUCKETS] + ["+Inf"]


class CoreCollector:
    """The per-frame series, from the listeners' totals at scrape time."""

    def __init__(self, metrics: TapMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        where = list(LISTENER_LABELS)
        frames = CounterMetricFamily(
            "kpmon_tap_frames", "Frames forwarded", labels=["dir", "api", "api_version", *where]
        )
        nbytes = CounterMetricFamily(
            "kpmon_tap_bytes",
            "Frame bytes forwarded (incl. size prefix)",
            labels=["dir", "api", "api_version", *where],
        )
        errors = CounterMetricFamily(
            "kpmon_tap_response_errors", "Non-zero response error codes", labels=["api", "error_code", *where]
        )
        inside = HistogramMetricFamily(
            "kpmon_tap_inside_seconds",
            "Time a frame's bytes spend inside the tap before being written on",
            labels=["api", *where],
        )
        broker = HistogramMetricFamily(
            "kpmon_tap_broker_seconds", "Request forwarded to response received", labels=["api", *where]
        )
        lone: dict[str, int] = {}
        truncated = 0
        for listener in list(self.metrics._listeners.values()):
            t = listener.totals()
            w = listener.where
            traffic: dict[tuple[str, ...], list[int]] = {}
            for (direction, api, version), (n, size) in t.frames.items():
                sums = traffic.setdefault((direction, api_label(api), version_label(version)), [0, 0])
                sums[0] += n
                sums[1] += size
            for labels, (n, size) in traffic.items():
                frames.add_metric([*labels, *w], n)
                nbytes.add_metric([*labels, *w], size)
            codes: dict[tuple[str, str], int] = {}
            for (api, code), n in t.errors.items():
                # Error codes are Kafka's small, fixed set; clamp anything else.
                elabels = (api_label(api), str(code) if -1 <= code < 256 else "other")
                codes[elabels] = codes.get(elabels, 0) + n
            for elabels, n in codes.items():
                errors.add_metric([*elabels, *w], n)
            hists: dict[tuple[str, bool], list[int]] = {}
            for (api, is_broker), values in t.latency.items():
                into = hists.setdefault((api_label(api), is_broker), [0] * len(values))
                for i, n in enumerate(values):
                    into[i] += n
            for (label, is_broker), values in hists.items():
                cumulative, running = [], 0
                for le, n in zip(_LE, values[:-1], strict=True):
                    running += n
                    cumulative.append((le, float(running)))
                (broker if is_broker else inside).add_metric([label, *w], cumulative, values[-1] / 1e9)
            for reason, n in t.lone.items():
                lone[reason] = lone.get(reason, 0) + n
            truncated += t.truncated
        lone_family = CounterMetricFamily(
            "kpmon_tap_lone_frames",
            "Frames mirrored as a record of their own instead of in a request/response exchange, by reason",
            labels=["reason"],
        )
        for reason, n in lone.items():
            lone_family.add_metric([reason], n)
        yield from (frames, nbytes, errors, inside, broker, lone_family)
        yield CounterMetricFamily(
            "kpmon_tap_mirror_truncated", "Frames mirrored truncated to their header", value=truncated
        )
