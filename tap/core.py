"""The per-connection tap core: the contract of both implementations, and the Python reference.

One core per tapped connection, sans-I/O: bytes in from either side, frames framed, requests paired
with responses by correlation id, the capture policy applied, entries gathered into schema-3 records
(``codec.taprecord.pack_flush``). No sockets, no clock reads, no asyncio, no metrics objects: time
comes in as arguments, metrics go out through ``counters()`` (read at scrape time), records through
``take_record``/``flush``. The adapter (``tap.proxy.TapConnection``) forwards the bytes itself.

Two implementations follow the ``TapCore`` protocol: ``PyTapCore`` here (the reference and the
fallback) and ``kpmon_tapcore.TapCore`` (Rust, ``tap/native``). ``new_core`` picks one
(``tap.native_core.status()``; ``KPMON_NATIVE=0`` selects the reference). Both produce byte-identical
records and equal counters for any input, and raise ``FrameError`` on the same inputs.

Protocol knowledge comes from ``CoreTables`` (``build_tables()``, made once per process from the
codec's schema): the native core has no hand-written per-API parsing. Frames that need the codec
(redaction, the SASL handshake's mechanism, Envelopes) are *slow*: the core stops at them, the
adapter captures them in Python (``capture_slow``) and hands the result back with ``resolve``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

import codec
import codec.peek
from codec import taprecord
from codec.errors import DecodeError
from codec.protocol import ApiKey
from codec.taprecord import Entry, Header, Part
from tap import strip
from tap.capture import (
    _RECORDS,
    CONFIG_VALUES,
    SECRETS,
    FrameInfo,
    Policy,
    capture,
    header_end,
    request_is_sensitive_envelope,
)
from tap.flush import FlushBuffer, FlushLimits
from tap.framing import (
    DEFAULT_MAX_FRAME,
    HEAD_BYTES,
    REBALANCE_WAITS,
    Correlations,
    FrameError,
    FrameSplitter,
    HeldBudget,
    HoldLimits,
    Pending,
    SaslState,
    Unpaired,
    WireFrame,
    expects_response,
)

__all__ = [
    "CoreCounters",
    "CoreSettings",
    "CoreTables",
    "FrameError",
    "PyTapCore",
    "SlowFrame",
    "TapCore",
    "build_tables",
    "capture_slow",
    "new_budget",
    "new_core",
]

_ENVELOPE, _SASL_HANDSHAKE, _PRODUCE = int(ApiKey.ENVELOPE), int(ApiKey.SASL_HANDSHAKE), int(ApiKey.PRODUCE)
_REQ, _RESP = taprecord.REQ, taprecord.RESP

#: APIs whose response error code sits at a fixed offset after the response header, from a version
#: on: (first version, offset into the body). Read on every such response; others are skipped.
ERROR_OFFSETS: Final[dict[int, tuple[int, int]]] = {
    ApiKey.SASL_HANDSHAKE: (0, 0),
    ApiKey.API_VERSIONS: (0, 0),
    ApiKey.SASL_AUTHENTICATE: (0, 0),
    ApiKey.INIT_PRODUCER_ID: (0, 4),  # ThrottleTimeMs, ErrorCode
    ApiKey.JOIN_GROUP: (2, 4),
    ApiKey.HEARTBEAT: (1, 4),
    ApiKey.LEAVE_GROUP: (1, 4),
    ApiKey.SYNC_GROUP: (1, 4),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 4),
    ApiKey.END_TXN: (0, 4),
}

#: The latency histograms' bucket bounds in seconds (``kpmon_tap_inside_seconds``,
#: ``kpmon_tap_broker_seconds``). 2 ms is the budget for latency the tap adds (docs/tap.md "Measured"):
#: a bucket edge there says on which side a tap's own time falls.
LATENCY_BUCKETS: Final = (
    0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0,
)  # fmt: skip
#: The same bounds in integer nanoseconds: what the cores compare observations with (``<=``).
LATENCY_BUCKETS_NS: Final = tuple(round(b * 1e9) for b in LATENCY_BUCKETS)
_ALL_VERSIONS: Final = (0, (1 << 15) - 1)


# --- the data the core is built from -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CoreTables:
    """Everything the core knows about Kafka's protocol, as plain data (ints, bools, tuples, dicts),
    built once per process by ``build_tables`` from the codec's schema table.

    Keys are ``int`` API keys and versions; ``request`` is True for a request, False for a response.
    """

    #: (api_key, api_version) -> request header version (0, 1 or 2: client id from v1, tags from v2).
    request_header_versions: dict[tuple[int, int], int]
    #: (api_key, api_version) -> response header version (0, or 1: tagged fields after the
    #: correlation id). A response whose (api, version) is absent has a 4-byte header.
    response_header_versions: dict[tuple[int, int], int]
    #: Produce version -> (compact strings?, how many strings precede ``Acks`` in the body), or None
    #: when a field of another type precedes it (then the request is taken to expect a response).
    #: What ``kpmon_tapcore.ProduceTable`` already takes (``codec.peek._acks_layout``).
    produce_acks: dict[int, tuple[bool, int] | None]
    #: api_key -> (first version, offset of the int16 error code after the response header).
    error_offsets: dict[int, tuple[int, int]]
    #: (api_key, request, api_version) -> the ``headers`` policy's strip plan (``tap.strip.plan``):
    #: nested tuples of steps, each ``(kind, ...)`` with kind 0 FIXED n, 1 SIZED flexible width,
    #: 2 RECORDS flexible, 3 ARRAY flexible plan, 4 STRUCT plan, 5 TAGS. Present for Produce requests
    #: and Fetch/ShareFetch responses; a walk that fails makes the frame slow.
    strip_plans: dict[tuple[int, bool, int], strip.Plan]
    #: (api_key, request) -> inclusive (first, last) version range of frames that need Python: the
    #: redacted APIs (secret fields, config values), Envelopes, and SaslHandshake v0 requests.
    slow: dict[tuple[int, bool], tuple[int, int]]
    #: API keys held up to ``HoldLimits.max_rebalance_age_ns`` (``tap.framing.REBALANCE_WAITS``).
    rebalance_waits: tuple[int, ...]
    #: Latency histogram bucket bounds, ns, ascending (``LATENCY_BUCKETS_NS``).
    latency_buckets_ns: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CoreSettings:
    """One tap's settings, as the core needs them (from ``tap.proxy.TapSettings``)."""

    #: ``full``, ``headers`` or ``meta`` (``tap.capture.capture``).
    capture: Policy = "headers"
    #: False: frames are only framed, paired and counted; no entry is gathered (seqs still advance).
    mirror: bool = True
    max_mirrored_frame_bytes: int = 900_000
    max_frame_bytes: int = DEFAULT_MAX_FRAME
    hold_limits: HoldLimits = field(default_factory=HoldLimits)
    flush: FlushLimits = field(default_factory=FlushLimits)

    @property
    def retain(self) -> int:
        """Bytes of a frame the splitter keeps: the whole frame when it may be mirrored whole."""
        if self.mirror and self.capture != "meta":
            return self.max_mirrored_frame_bytes + 1
        return HEAD_BYTES


def _versions(spec: object) -> list[int]:
    return list(spec.versions())  # type: ignore[attr-defined]


def build_tables() -> CoreTables:
    """The core's tables from the codec's schema table (once per process: ``tables()`` caches it)."""
    from codec.api import request_header_version, response_header_version
    from codec.peek import _acks_layout
    from codec.schema import load_table

    table = load_table()
    req_hv: dict[tuple[int, int], int] = {}
    resp_hv: dict[tuple[int, int], int] = {}
    for api, spec in table.requests.items():
        for v in _versions(spec):
            req_hv[(int(api), v)] = request_header_version(api, v)
            if api in table.responses:
                resp_hv[(int(api), v)] = response_header_version(api, v)
    produce = {v: _acks_layout(v) for v in _versions(table.requests[ApiKey.PRODUCE])}
    plans: dict[tuple[int, bool, int], strip.Plan] = {}
    for api, direction in _RECORDS:
        request = direction == "req"
        spec = table.requests[api] if request else table.responses[api]
        for v in _versions(spec):
            try:
                plans[(int(api), request, v)] = strip.plan(api, request, v)
            except DecodeError:
                continue  # a version the walk cannot skip: its frames are slow
    slow: dict[tuple[int, bool], tuple[int, int]] = {}
    for api, direction in (*SECRETS, *CONFIG_VALUES):
        slow[(int(api), direction == "req")] = _ALL_VERSIONS
    slow[(_ENVELOPE, True)] = _ALL_VERSIONS
    slow[(_ENVELOPE, False)] = _ALL_VERSIONS
    slow[(_SASL_HANDSHAKE, True)] = (0, 0)
    return CoreTables(
        request_header_versions=req_hv,
        response_header_versions=resp_hv,
        produce_acks=produce,
        error_offsets={int(k): v for k, v in ERROR_OFFSETS.items()},
        strip_plans=plans,
        slow=slow,
        rebalance_waits=tuple(sorted(int(api) for api in REBALANCE_WAITS)),
        latency_buckets_ns=LATENCY_BUCKETS_NS,
    )


_TABLES: list[CoreTables] = []


def tables() -> CoreTables:
    """This process's ``CoreTables`` (built on first use)."""
    if not _TABLES:
        _TABLES.append(build_tables())
    return _TABLES[0]


# --- what the core hands out ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SlowFrame:
    """A frame the core stopped at because it needs Python (``CoreTables.slow``, or a frame the
    native capture cannot handle). Everything before it is handled; nothing after it until
    ``resolve``. The frame is counted (frames, bytes, latency, error code) before it is handed out."""

    #: True for a request (client → broker), False for a response.
    from_client: bool
    #: The bytes the splitter kept of the frame (without the size prefix): the whole frame when it
    #: fits ``CoreSettings.retain``, else its first ``min(retain, HEAD_BYTES)`` bytes.
    head: bytes
    #: The frame's size as its prefix announced it.
    size: int
    api_key: int | None
    api_version: int | None
    correlation_id: int | None
    #: A response whose request was a sensitive Envelope (``Pending.sensitive``): header-only.
    sensitive: bool
    #: The tap's wall clock when the chunk that completed the frame arrived (``Part.ts_ns``).
    wall_ns: int

    @property
    def complete(self) -> bool:
        return len(self.head) == self.size


@dataclass(frozen=True, slots=True)
class CoreCounters:
    """A core's counts since it was made, read at scrape time (``tap.metrics``); plain data."""

    #: ("req"|"resp", api_key, api_version) -> (frames, bytes incl. the 4-byte size prefix). None for
    #: frames with no API: SASL tokens, requests whose header does not read, unmatched responses.
    frames: dict[tuple[str, int | None, int | None], tuple[int, int]] = field(default_factory=dict)
    #: (api_key, error_code) -> responses with that non-zero error code (``CoreTables.error_offsets``).
    errors: dict[tuple[int, int], int] = field(default_factory=dict)
    #: reason -> frames written as an entry of their own (``tap.framing.LONE_REASONS``,
    #: ``not_a_request``, ``unknown_request``, ``request_written``, ``exchange_too_large``,
    #: ``sasl_token``); only while mirroring.
    lone: dict[str, int] = field(default_factory=dict)
    #: Frames mirrored truncated to their header (``Header.TRUNCATED``).
    truncated: int = 0
    #: (api_key, broker) -> (count per bucket of ``latency_buckets_ns`` plus a last +Inf bucket, not
    #: cumulative; sum of the observations in ns). broker False: ``inside_ns`` per frame of a chunk;
    #: True: a response's ``mono_ns`` minus its request's.
    latency: dict[tuple[int, bool], tuple[tuple[int, ...], int]] = field(default_factory=dict)
    #: Bytes of requests held for their exchanges now.
    held_bytes: int = 0
    #: Frames handed to Python as ``SlowFrame``.
    slow: int = 0


class TapCore(Protocol):
    """One tapped connection's core, made as ``TapCore(tables, settings, static, budget)``
    (``CoreTables``, ``CoreSettings``, the connection's ``pack_static`` bytes, the tap's shared
    ``HeldBudget`` or None for no tap-wide bound). The adapter calls, per chunk read from either side::

        forward the chunk; n = core.feed(from_client, chunk, wall_ns, mono_ns, inside_ns)
        while (slow := core.slow()) is not None:
            core.resolve(*capture_slow(slow, settings)); core.feed(from_client, b"", ...)
        while (record := core.take_record(lost, loss_ns)) is not None: offer it

    Entries (exchanges, lone frames, lifecycle events) are numbered by ``seq`` in the order today's
    tap wrote them: per frame, first the held requests a bound or an orphaning releases, then the
    frame's own entry; per request, ``expire(mono_ns)`` after it is tracked.
    """

    @property
    def seq(self) -> int:
        """Entries numbered so far (a seq is taken even when mirroring is off)."""
        ...

    @property
    def client_name(self) -> bytes:
        """The client id of the first request that had one (UTF-8, errors replaced), else b""."""
        ...

    @property
    def mid_frame(self) -> bool:
        """Either direction's stream stopped inside a frame or a size prefix."""
        ...

    def feed(self, from_client: bool, data: bytes, wall_ns: int, mono_ns: int, inside_ns: int) -> int:
        """Frame ``data`` and handle each frame it completes, in order; returns how many frames it took
        up (a slow frame it stops at included, so the calls' sum is the frames seen).

        Raises ``FrameError`` (the stream is not Kafka framing: size < 0 or > ``max_frame_bytes``)
        before handling any frame of ``data``; the connection is then aborted. Stops at a slow frame
        (``slow()``): the frames after it stay buffered, and ``feed(from_client, b"", ...)`` after
        ``resolve`` carries on with them. Frames are stamped with the ``wall_ns``/``mono_ns``/
        ``inside_ns`` of the call whose ``data`` completed them.
        """
        ...

    def slow(self) -> SlowFrame | None:
        """The frame waiting for ``resolve``, or None."""
        ...

    def resolve(self, part: Part | None, mechanism: str | None = None, sensitive: bool = False) -> None:
        """Python's capture of the slow frame: ``part`` (None when mirroring is off); for a
        SaslHandshake v0 request the mechanism it names (None: unreadable), for an Envelope request
        whether its response must be hidden. The core counts ``part`` as truncated when its flags say
        so, then pairs and writes it exactly as a frame it captured itself."""
        ...

    def pending(self, correlation_id: int) -> tuple[int, int] | None:
        """(api_key, api_version) of the tracked request ``correlation_id`` (address rewriting reads
        it before the response is fed)."""
        ...

    def lifecycle(self, kind: str, part: Part | None, mono_ns: int) -> None:
        """An ``open``/``close``/``blind`` entry the adapter made (None when mirroring is off)."""
        ...

    def expire(self, mono_ns: int) -> None:
        """Write alone the held requests past the age bound (the tap's sweep of quiet connections)."""
        ...

    def drain(self, mono_ns: int) -> None:
        """The connection is closing: every held request goes out alone (reason ``closed``)."""
        ...

    def take_record(self, lost: int, loss_ns: int) -> tuple[bytes, int] | None:
        """The oldest record due by the size or count bound, packed with ``lost``/``loss_ns``
        (``pack_flush``), and how many entries it holds; None when none is due."""
        ...

    def flush(self, lost: int, loss_ns: int) -> tuple[bytes, int] | None:
        """Everything gathered as one record (the age bound passed, the connection closed, the tap
        stops); None when nothing is. Call after ``take_record`` returned None."""
        ...

    def due_ns(self) -> int | None:
        """When the oldest gathered entry reaches the age bound (``FlushBuffer.due_ns``)."""
        ...

    def counters(self) -> CoreCounters:
        """A copy of the counts (may be called from the metrics server's thread)."""
        ...


# --- the reference -------------------------------------------------------------------------------
class PyTapCore:
    """The reference ``TapCore``: ``tap.framing``, ``tap.capture``, ``tap.flush`` and
    ``codec.taprecord`` put together as the tap has always used them."""

    def __init__(
        self, tables: CoreTables, settings: CoreSettings, static: bytes, budget: HeldBudget | None = None
    ) -> None:
        self._tables = tables
        self._settings = settings
        self._static = static
        self._policy = settings.capture
        self._max_mirrored = settings.max_mirrored_frame_bytes
        self._mirror = settings.mirror
        retain = settings.retain
        self._req_split = FrameSplitter(retain, settings.max_frame_bytes)
        self._resp_split = FrameSplitter(retain, settings.max_frame_bytes)
        self._correlations = Correlations(settings.hold_limits, budget)
        self._sasl = SaslState()
        self._flush = FlushBuffer(settings.flush)
        self._due: deque[list[Entry]] = deque()
        #: Frames split but not handled yet (behind a slow frame): (request?, frame, wall, mono, inside).
        self._queue: deque[tuple[bool, WireFrame, int, int, int]] = deque()
        self._slow: SlowFrame | None = None
        #: What handling the slow frame needs after ``resolve``: its pending (responses) and mono_ns.
        self._slow_pending: Pending | None = None
        self._slow_mono = 0
        self._seq = 0
        self._client_name = b""
        self._frames: dict[tuple[str, int | None, int | None], list[int]] = {}
        self._errors: dict[tuple[int, int], int] = {}
        self._lone: dict[str, int] = {}
        self._truncated = 0
        self._latency: dict[tuple[int, bool], list[int]] = {}
        self._slow_count = 0

    # --- properties --------------------------------------------------------------------------
    @property
    def seq(self) -> int:
        return self._seq

    @property
    def client_name(self) -> bytes:
        return self._client_name

    @property
    def mid_frame(self) -> bool:
        return self._req_split.mid_frame or self._resp_split.mid_frame

    # --- input -------------------------------------------------------------------------------
    def feed(self, from_client: bool, data: bytes, wall_ns: int, mono_ns: int, inside_ns: int) -> int:
        if data:
            frames = (self._req_split if from_client else self._resp_split).feed(data)
            queue = self._queue
            for frame in frames:
                queue.append((from_client, frame, wall_ns, mono_ns, inside_ns))
        handled = 0
        queue = self._queue
        while queue and self._slow is None:
            request, frame, wall, mono, inside = queue.popleft()
            if request:
                self._on_request(frame, wall, mono, inside)
            else:
                self._on_response(frame, wall, mono, inside)
            handled += 1
        return handled

    def slow(self) -> SlowFrame | None:
        return self._slow

    def resolve(self, part: Part | None, mechanism: str | None = None, sensitive: bool = False) -> None:
        frame = self._slow
        if frame is None:
            raise RuntimeError("no slow frame to resolve")
        self._slow = None
        if part is not None and Header.TRUNCATED in part.flags:
            self._truncated += 1
        if frame.from_client:
            if frame.api_key == _SASL_HANDSHAKE and frame.api_version == 0:
                self._sasl.on_handshake_v0(mechanism)
            assert frame.api_key is not None and frame.api_version is not None
            assert frame.correlation_id is not None
            self._track(frame.head, frame.api_key, frame.api_version, frame.correlation_id, part,
                        sensitive, self._slow_mono)  # fmt: skip
        else:
            pending = self._slow_pending
            self._slow_pending = None
            assert pending is not None
            self._pair(pending, part, self._slow_mono)

    def pending(self, correlation_id: int) -> tuple[int, int] | None:
        found = self._correlations.peek(correlation_id)
        return None if found is None else (found.api_key, found.api_version)

    def lifecycle(self, kind: str, part: Part | None, mono_ns: int) -> None:
        if part is None:
            self._seq += 1
            return
        self._write(kind, (part,), mono_ns)

    def expire(self, mono_ns: int) -> None:
        self._write_unpaired(self._correlations.expire(mono_ns), mono_ns)

    def drain(self, mono_ns: int) -> None:
        self._write_unpaired(self._correlations.drain(), mono_ns)

    # --- output ------------------------------------------------------------------------------
    def take_record(self, lost: int, loss_ns: int) -> tuple[bytes, int] | None:
        if not self._due:
            return None
        entries = self._due.popleft()
        return taprecord.pack_flush(self._static, entries, lost, loss_ns), len(entries)

    def flush(self, lost: int, loss_ns: int) -> tuple[bytes, int] | None:
        entries = self._flush.take()
        if not entries:
            return None
        return taprecord.pack_flush(self._static, entries, lost, loss_ns), len(entries)

    def due_ns(self) -> int | None:
        return self._flush.due_ns

    def counters(self) -> CoreCounters:
        return CoreCounters(
            frames={k: (v[0], v[1]) for k, v in list(self._frames.items())},
            errors=dict(self._errors),
            lone=dict(self._lone),
            truncated=self._truncated,
            latency={k: (tuple(v[:-1]), v[-1]) for k, v in list(self._latency.items())},
            held_bytes=self._correlations.held_bytes,
            slow=self._slow_count,
        )

    # --- per frame ---------------------------------------------------------------------------
    def _count(self, direction: str, api_key: int | None, api_version: int | None, size: int) -> None:
        key = (direction, api_key, api_version)
        found = self._frames.get(key)
        if found is None:
            found = self._frames[key] = [0, 0]
        found[0] += 1
        found[1] += size + 4

    def _observe(self, api_key: int, broker: bool, ns: int) -> None:
        key = (api_key, broker)
        found = self._latency.get(key)
        bounds = self._tables.latency_buckets_ns
        if found is None:
            # One count per bucket, one for +Inf, then the sum.
            found = self._latency[key] = [0] * (len(bounds) + 2)
        i = 0
        for bound in bounds:
            if ns <= bound:
                break
            i += 1
        found[i] += 1
        found[-1] += ns

    def _on_request(self, frame: WireFrame, wall: int, mono: int, inside: int) -> None:
        if self._sasl.client_frame_is_token():
            self._count(_REQ, None, None, frame.size)
            self._write_lone(self._part(_REQ, frame, wall, None, None, None, sasl_token=True),
                             taprecord.SASL_TOKEN, mono)  # fmt: skip
            return
        try:
            peek = codec.peek.peek_request_header(frame.head)
        except DecodeError:
            # Not a Kafka request; the broker will judge it. Mirror it so checks can see it.
            self._count(_REQ, None, None, frame.size)
            self._write_lone(self._part(_REQ, frame, wall, None, None, None), "not_a_request", mono)
            return
        api_key, api_version = peek.api_key, peek.api_version
        self._count(_REQ, api_key, api_version, frame.size)
        self._observe(api_key, False, inside)
        if peek.client_id is not None and not self._client_name:
            self._client_name = peek.client_id.encode("utf-8", "replace")
        span = self._tables.slow.get((api_key, True))
        if (
            span is not None
            and span[0] <= api_version <= span[1]
            and (self._mirror or api_key == _SASL_HANDSHAKE)
        ):
            self._stop(True, frame, api_key, api_version, peek.correlation_id, False, wall, mono)
            return
        part = self._part(_REQ, frame, wall, api_key, api_version, peek.correlation_id)
        self._track(frame.head, api_key, api_version, peek.correlation_id, part, False, mono)

    def _track(
        self, head: bytes, api_key: int, api_version: int, corr: int, part: Part | None, sensitive: bool,
        mono: int,
    ) -> None:  # fmt: skip
        if api_key == _PRODUCE and not expects_response(head, api_key, api_version):
            # acks=0: the broker never answers, so the request is an entry of its own at once.
            self._write_lone(part, "no_response", mono)
            return
        pending = Pending(api_key, api_version, mono, sensitive, part)
        released = self._correlations.add(corr, pending)
        released += self._correlations.expire(mono)
        if released:
            self._write_unpaired(released, mono)

    def _on_response(self, frame: WireFrame, wall: int, mono: int, inside: int) -> None:
        if self._sasl.server_frame_is_token():
            self._count(_RESP, None, None, frame.size)
            self._write_lone(self._part(_RESP, frame, wall, None, None, None, sasl_token=True),
                             taprecord.SASL_TOKEN, mono)  # fmt: skip
            return
        corr: int | None = None
        pending: Pending | None = None
        if len(frame.head) >= 4:
            corr = codec.peek.peek_correlation_id(frame.head)
            pending, orphans = self._correlations.match(corr)
            if orphans:
                self._write_unpaired(orphans, mono)
        if pending is None:
            self._count(_RESP, None, None, frame.size)
            self._write_lone(self._part(_RESP, frame, wall, None, None, corr), "unknown_request", mono)
            return
        api_key, api_version = pending.api_key, pending.api_version
        self._count(_RESP, api_key, api_version, frame.size)
        self._observe(api_key, False, inside)
        self._observe(api_key, True, mono - pending.forwarded_ns)
        spot = self._tables.error_offsets.get(api_key)
        error_code: int | None = None
        if spot is not None and api_version >= spot[0]:
            try:
                pos = header_end(frame.head, FrameInfo("resp", frame.size, api_key, api_version)) + spot[1]
                if pos + 2 <= len(frame.head):
                    error_code = int.from_bytes(frame.head[pos : pos + 2], "big", signed=True)
            except DecodeError:
                error_code = None
            if error_code:
                key = (api_key, error_code)
                self._errors[key] = self._errors.get(key, 0) + 1
        if api_key == _SASL_HANDSHAKE:
            self._sasl.on_handshake_response(error_code)
        span = self._tables.slow.get((api_key, False))
        if self._mirror and (pending.sensitive or (span is not None and span[0] <= api_version <= span[1])):
            self._slow_pending = pending
            self._stop(False, frame, api_key, api_version, corr, pending.sensitive, wall, mono)
            return
        part = self._part(_RESP, frame, wall, api_key, api_version, corr, sensitive=pending.sensitive)
        self._pair(pending, part, mono)

    def _pair(self, pending: Pending, part: Part | None, mono: int) -> None:
        held = pending.held
        if held is None or part is None:
            # Its request already went out alone (a bound was hit): the response follows it alone.
            self._write_lone(part, "request_written", mono)
        elif len(held.value or b"") + len(part.value or b"") > self._max_mirrored:
            # Each frame fits a tap record; the two together might not.
            self._write_lone(held, "exchange_too_large", mono)
            self._write_lone(part, "exchange_too_large", mono)
        else:
            self._write(taprecord.EXCHANGE, (held, part), mono)

    def _stop(
        self, request: bool, frame: WireFrame, api_key: int, api_version: int, corr: int | None,
        sensitive: bool, wall: int, mono: int,
    ) -> None:  # fmt: skip
        self._slow_count += 1
        self._slow_mono = mono
        self._slow = SlowFrame(request, frame.head, frame.size, api_key, api_version, corr, sensitive, wall)

    # --- entries -----------------------------------------------------------------------------
    def _part(
        self, direction: str, frame: WireFrame, wall: int, api_key: int | None, api_version: int | None,
        corr: int | None, sasl_token: bool = False, sensitive: bool = False,
    ) -> Part | None:  # fmt: skip
        """The frame as it will be mirrored (None when mirroring is off)."""
        if not self._mirror:
            return None
        info = FrameInfo(
            "req" if direction == _REQ else "resp", frame.size, api_key, api_version, sasl_token, sensitive
        )
        cap = capture(frame.head, info, self._policy, self._max_mirrored)
        if Header.TRUNCATED in cap.flags:
            self._truncated += 1
        return Part(direction, wall, api_key, api_version, corr, cap.value, cap.redacted, cap.flags)

    def _write_lone(self, part: Part | None, reason: str, mono: int) -> None:
        if part is None:
            self._seq += 1
            return
        self._lone[reason] = self._lone.get(reason, 0) + 1
        self._write(part.direction, (part,), mono)

    def _write_unpaired(self, unpaired: list[Unpaired], mono: int) -> None:
        for item in unpaired:
            self._write_lone(item.held, item.reason, mono)

    def _write(self, kind: str, parts: Sequence[Part], mono: int) -> None:
        self._seq += 1  # taken even when the entry is not written, so a drop leaves a gap
        if not self._mirror:
            return
        self._due.extend(self._flush.add(kind, self._seq, parts, mono))


# --- choosing a core -----------------------------------------------------------------------------
def new_core(
    settings: CoreSettings,
    static: bytes,
    budget: HeldBudget | None = None,
    core_tables: CoreTables | None = None,
) -> TapCore:
    """A core for one connection: the native one when ``tap.native_core.status()`` allows, else the
    reference. ``static``: the connection's ``pack_static`` bytes; ``budget``: the tap's shared
    held-bytes budget (``new_budget``)."""
    from tap import native_core

    native, _ = native_core.status()
    found = tables() if core_tables is None else core_tables
    native_class = getattr(native, "TapCore", None)
    if native_class is not None:
        core: TapCore = native_class(found, settings, static, budget)
        return core
    return PyTapCore(found, settings, static, budget)


def new_budget(limit: int) -> HeldBudget:
    """The tap's held-bytes budget, of the kind the running core shares."""
    from tap import native_core

    native, _ = native_core.status()
    if native is not None and hasattr(native, "TapCore"):
        budget: HeldBudget = native.HeldBudget(limit)
        return budget
    return HeldBudget(limit)


# --- the slow path (Python, in the adapter) ------------------------------------------------------
def capture_slow(frame: SlowFrame, settings: CoreSettings) -> tuple[Part | None, str | None, bool]:
    """What ``TapCore.resolve`` takes for ``frame``: its mirrored part (None when mirroring is off),
    the SaslHandshake v0 mechanism, and whether an Envelope request's response must be hidden."""
    mechanism: str | None = None
    sensitive = False
    api_key = frame.api_key
    if frame.from_client:
        if api_key == _SASL_HANDSHAKE and frame.api_version == 0:
            try:
                mechanism = codec.decode_request(frame.head).body.get("Mechanism")
            except Exception:
                mechanism = None
        elif api_key == _ENVELOPE:
            sensitive = not frame.complete or request_is_sensitive_envelope(frame.head)
    if not settings.mirror:
        return None, mechanism, sensitive
    direction = _REQ if frame.from_client else _RESP
    info = FrameInfo(
        "req" if frame.from_client else "resp", frame.size, api_key, frame.api_version, False, frame.sensitive
    )
    cap = capture(frame.head, info, settings.capture, settings.max_mirrored_frame_bytes)
    part = Part(direction, frame.wall_ns, api_key, frame.api_version, frame.correlation_id, cap.value,
                cap.redacted, cap.flags)  # fmt: skip
    return part, mechanism, sensitive
