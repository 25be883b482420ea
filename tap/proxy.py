"""The asyncio adapter: one listening port per broker, bytes forwarded unchanged both ways.

Uses the Protocol/Transport API (no StreamReader): every chunk is written on to the other side
before anything else happens to it, then the connection's sans-I/O core (tap/core.py) frames it. Mirroring
only ever *offers* a record to a bounded sink, so a slow or dead tap-topic cluster cannot slow
the traffic. Backpressure is end to end: when one side's write buffer passes its high-water mark,
the other side stops reading until it drains.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import os
import socket
import ssl
import struct
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

from codec import taprecord
from codec.taprecord import Header
from tap.capture import Policy
from tap.core import CoreSettings, TapCore, capture_slow, new_budget, new_core
from tap.flush import FlushLimits
from tap.framing import DEFAULT_MAX_FRAME, FrameError, HoldLimits, starts_with_tls
from tap.listeners import (
    DynamicListeners,
    ListenerSpec,
    NoBrokerIdentity,
    broker_context,
    client_address,
    client_common_name,
)
from tap.metrics import TapMetrics
from tap.mirror import MirrorRecord, MirrorSink, NullMirror
from tap.rewrite import ENDPOINT_APIS, ENDPOINT_MAX_HELD, held_apis, rewrite_response

log = logging.getLogger("kpmon.tap")

_INT32 = struct.Struct(">i")
#: Rewritten responses are held whole; anything bigger than this is forwarded untouched.
_MAX_HELD = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TapSettings:
    capture: Policy = "headers"
    #: False turns mirroring off entirely (benchmark baseline): frames are only counted.
    mirror: bool = True
    max_mirrored_frame_bytes: int = 900_000
    max_frame_bytes: int = DEFAULT_MAX_FRAME
    instance_id: str = field(default_factory=lambda: f"tap-{uuid.uuid4().hex[:8]}")
    #: Connection ids are ``<connection_prefix>.<incarnation>-<n>`` (``codec.taprecord.connection_id``);
    #: default prefix: the instance id. Each worker process gets its own (tap/workers.py).
    connection_prefix: str | None = None
    write_buffer_high: int = 4 * 1024 * 1024
    connect_timeout: float = 10.0
    #: Rewrite broker addresses in Metadata/FindCoordinator/DescribeCluster to the tap's listeners.
    rewrite_broker_addresses: bool = False
    #: Clamp ApiVersions responses to the versions the codec knows.
    clamp_api_versions: bool = False
    #: When rewriting: open a listener on the fly for a broker id that has none (tap/listeners.py)...
    dynamic_listeners: bool = True
    #: ...on a port of this inclusive range (None: an ephemeral port), at most this many.
    dynamic_listener_ports: tuple[int, int] | None = None
    max_dynamic_listeners: int = 256
    #: Bounds on the requests each connection holds until their responses complete the exchange.
    hold_limits: HoldLimits = field(default_factory=HoldLimits)
    #: Bytes of held requests across every connection of the tap.
    max_held_bytes: int = 256 * 1024 * 1024
    #: When a connection's gathered entries are written as one tap record (schema 3).
    flush: FlushLimits = field(default_factory=FlushLimits)

    def core(self) -> CoreSettings:
        """What each connection's core (``tap.core``) needs of these settings."""
        return CoreSettings(
            self.capture,
            self.mirror,
            self.max_mirrored_frame_bytes,
            self.max_frame_bytes,
            self.hold_limits,
            self.flush,
        )


def _tls_info(transport: asyncio.BaseTransport) -> dict[str, object] | None:
    """Protocol, cipher and peer certificate subject of a TLS transport (None for plaintext)."""
    obj = transport.get_extra_info("ssl_object")
    if obj is None:
        return None
    cipher = obj.cipher()
    peer = obj.getpeercert() or {}
    subject = ",".join("=".join(part) for rdn in peer.get("subject", ()) for part in rdn)
    return {"version": obj.version(), "cipher": cipher[0] if cipher else None, "peer": subject or None}


def parse_hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected host:port, got {text!r}")
    return host.strip("[]"), int(port)


class _Side(asyncio.Protocol):
    """One TCP side of a tapped connection; all logic lives in ``TapConnection``."""

    def __init__(self, conn: TapConnection, client: bool) -> None:
        self.conn = conn
        self.client = client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.client:
            # uvloop's transports implement asyncio.Transport without subclassing it.
            self.conn.client_made(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        if self.client:
            self.conn.client_data(data)
        else:
            self.conn.broker_data(data)

    def eof_received(self) -> bool:
        return self.conn.eof(self.client)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.lost(self.client, exc)

    def pause_writing(self) -> None:
        self.conn.pause(not self.client)

    def resume_writing(self) -> None:
        self.conn.resume(not self.client)


class TapConnection:
    """One client connection and its broker connection, with framing state for both directions."""

    def __init__(self, tap: Tap, spec: ListenerSpec, conn_id: str) -> None:
        self.tap = tap
        self.spec = spec
        self.metrics = tap.metrics.listener(spec.broker_id, spec.listener_name)
        self.conn_id = conn_id
        self.key = conn_id.encode()
        settings = tap.settings
        self.mirror = settings.mirror
        #: The connection's framing, pairing, capture and record gathering (made in ``client_made``,
        #: when the connection's metadata is known).
        self.core: TapCore
        #: This connection's entries the tap lost so far (its sink refused their record, or its
        #: delivery failed), stamped on every record it writes after them.
        self.records_lost = 0
        #: The timer of the age bound of the entries gathered for the connection's next record.
        self._flush_timer: asyncio.TimerHandle | None = None
        #: The tap's incarnation when it opened this connection (its id carries it): a later one is
        #: stamped on the records it writes (``TapFrame.loss_ns``).
        self.incarnation_ns = tap.incarnation_ns
        self.client_t: asyncio.Transport | None = None
        self.broker_t: asyncio.Transport | None = None
        self.pending: list[bytes] = []
        self.client_eof = False
        self.broker_eof = False
        self.closed = False
        self.close_reason = "client closed"
        self.close_error = False
        #: Each side's stream is checked once, at its start, for TLS the tap does not terminate.
        self.client_started = False
        self.broker_started = False
        #: The side that sent TLS the tap cannot read (``client`` or ``broker``): from then on the
        #: connection is relayed as opaque bytes, unframed.
        self.blind: str | None = None
        self.client_addr = "?"
        # Response rewriting (opt-in): frames of these APIs are held whole, rewritten, re-framed.
        self.hold_apis = held_apis(settings.rewrite_broker_addresses, settings.clamp_api_versions)
        self._resolve = (
            functools.partial(tap.dynamic.resolve, spec)
            if settings.rewrite_broker_addresses and settings.dynamic_listeners
            else None
        )
        self._rbuf = bytearray()
        self._rleft = 0
        self._rhold = -1

    # --- lifecycle -------------------------------------------------------------------------
    def client_made(self, transport: asyncio.Transport) -> None:
        self.client_t = transport
        peer = transport.get_extra_info("peername")
        self.client_addr = f"{peer[0]}:{peer[1]}" if peer else "?"
        transport.set_write_buffer_limits(high=self.tap.settings.write_buffer_high)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        spec = self.spec
        static = taprecord.pack_static(
            taprecord.Connection(
                self.conn_id,
                self.client_addr,
                spec.broker,
                spec.broker_id,
                spec.listener_name,
                self.tap.settings.instance_id,
                self.tap.settings.capture,
            )
        )
        self.core = new_core(self.tap.core_settings, static, self.tap.held)
        self.metrics.attach(self.key, self.core)
        self.metrics.connections.inc()
        self.metrics.connections_total.inc()
        self.tap.connections[self.key] = self
        # The open record goes first, so it gets seq 1 even if requests arrive before the broker
        # connection exists (uvloop may deliver data in the same tick as connection_made).
        self._mirror_lifecycle(taprecord.OPEN, {"tls": _tls_info(transport)})
        # Hold the client until the broker side exists; what arrives meanwhile is kept in order.
        transport.pause_reading()
        self.tap.spawn(self._connect())

    def _broker_ssl(self) -> ssl.SSLContext | None:
        if not self.spec.broker_identities:
            return self.spec.broker_ssl
        obj = self.client_t.get_extra_info("ssl_object") if self.client_t is not None else None
        return broker_context(self.spec, client_common_name(obj.getpeercert() if obj is not None else None))

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            broker_ssl = self._broker_ssl()
        except NoBrokerIdentity as exc:
            self.close_reason = str(exc)
            self.close_error = True
            self.metrics.closed("no_broker_identity")
            self._shutdown()
            return
        try:
            transport, _ = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Side(self, client=False),
                    self.spec.broker_host,
                    self.spec.broker_port,
                    ssl=broker_ssl,
                    server_hostname=self.spec.broker_host if broker_ssl else None,
                ),
                self.tap.settings.connect_timeout,
            )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            self.close_reason = f"broker connect failed: {exc}"
            self.close_error = True
            self.metrics.closed("broker_unreachable")
            self._shutdown()
            return
        if self.closed:
            transport.close()
            return
        self.broker_t = transport
        if self.spec.broker_ssl is not None:
            self.tap.log_event("broker_tls", conn=self.conn_id, tls=_tls_info(transport))
        transport.set_write_buffer_limits(high=self.tap.settings.write_buffer_high)
        for chunk in self.pending:
            transport.write(chunk)
        self.pending.clear()
        if self.client_eof and transport.can_write_eof():
            transport.write_eof()
        if self.client_t is not None and not self.client_t.is_closing():
            self.client_t.resume_reading()

    def eof(self, from_client: bool) -> bool:
        # Half-close: pass the FIN on and keep reading the other way until it closes too.
        if from_client:
            self.client_eof = True
            other = self.broker_t
        else:
            self.broker_eof = True
            self.close_reason = "broker closed"
            other = self.client_t
        if other is not None and not other.is_closing() and other.can_write_eof():
            other.write_eof()
        if self.client_eof and self.broker_eof:
            self._shutdown()
            return False
        return True

    def lost(self, from_client: bool, exc: Exception | None) -> None:
        if not self.closed:
            if exc is not None:
                self.close_reason = f"{'client' if from_client else 'broker'} error: {exc}"
                self.close_error = True
            elif not from_client:
                self.close_reason = "broker closed"
        self._shutdown()

    def _shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        # close() flushes what is buffered first, so the client still gets every byte the broker sent.
        for t in (self.client_t, self.broker_t):
            if t is not None:
                t.close()
        self.metrics.connections.dec()
        self.tap.connections.pop(self.key, None)
        # Requests still waiting for their responses go out alone, before the close record.
        self.core.drain(time.monotonic_ns())
        info: dict[str, object] = {"reason": self.close_reason, "frames": self.core.seq}
        if self.close_error:
            info["error"] = self.close_reason
        if self.blind is not None:
            info["blind"] = self.blind
        elif self.core.mid_frame:
            info["mid_frame"] = True
        self._mirror_lifecycle(taprecord.CLOSE, info)
        self._flush_now()
        self.metrics.retire(self.key)
        self.tap.log_event("close", conn=self.conn_id, **info)

    def _abort(self, reason: str, label: str) -> None:
        self.close_reason = reason
        self.close_error = True
        self.metrics.closed(label)
        self.tap.log_event("bad_frame", conn=self.conn_id, reason=reason)
        for t in (self.client_t, self.broker_t):
            if t is not None:
                t.abort()
        self._shutdown()

    # --- backpressure ----------------------------------------------------------------------
    def pause(self, client: bool) -> None:
        t = self.client_t if client else self.broker_t
        if t is not None and not t.is_closing():
            t.pause_reading()

    def resume(self, client: bool) -> None:
        t = self.client_t if client else self.broker_t
        if t is not None and not t.is_closing():
            t.resume_reading()

    # --- data ------------------------------------------------------------------------------
    def _go_blind(self, side: str) -> None:
        """TLS the tap does not terminate: relay the rest unread, and say so in the log, the metrics
        and the tap topic (``tap.blind``), since the monitor sees nothing of this connection."""
        self.blind = side
        fix = (
            "set broker_tls on the listener"
            if side == "broker"
            else "set tls_certfile and tls_keyfile on the listener"
        )
        log.warning(
            "tap listener %s:%s (%s, broker %s): the %s speaks TLS that the tap does not terminate; "
            "connection %s is relayed unread and the monitor is blind to it: %s",
            self.spec.listen_host, self.spec.listen_port, self.spec.listener_name, self.spec.broker,
            side, self.conn_id, fix,
        )  # fmt: skip
        self.metrics.blind(side)
        self._mirror_lifecycle(taprecord.BLIND, {"side": side})

    @property
    def seq(self) -> int:
        """Entries numbered so far on this connection."""
        return self.core.seq

    @property
    def client_name(self) -> bytes:
        return self.core.client_name

    # The per-chunk path: stamp, forward, feed the core, offer what is due. It makes no Python call
    # of its own unless a frame is slow, a record is due or the flush timer must be armed.
    def client_data(self, data: bytes) -> None:
        if not self.client_started:
            self.client_started = True
            if self.blind is None and starts_with_tls(data):
                self._go_blind("client")
        if self.blind is not None:
            if self.broker_t is None:
                self.pending.append(data)
            else:
                self.broker_t.write(data)
            return
        # Frames are stamped with when their bytes reached the tap, before they are forwarded: the
        # answer a client then sends through another worker is always stamped later.
        wall = time.time_ns()
        t0 = time.monotonic_ns()
        if self.broker_t is None:
            self.pending.append(data)
        else:
            self.broker_t.write(data)
        mono = time.monotonic_ns()
        core = self.core
        try:
            core.feed(True, data, wall, mono, mono - t0)
        except FrameError as exc:
            self._abort(f"client sent garbage: {exc}", "bad_request_frame")
            return
        if core.slow() is not None:
            self._resolve_slow(True, wall, mono, mono - t0)
        since = self.tap.incarnation_ns
        record = core.take_record(self.records_lost, since if since > self.incarnation_ns else 0)
        if record is not None:
            self._offer(record)
        if self._flush_timer is None and self.mirror and not self.closed:
            self._arm_due(mono)

    def broker_data(self, data: bytes) -> None:
        if not self.broker_started:
            self.broker_started = True
            if self.blind is None and starts_with_tls(data):
                self._go_blind("broker")
        if self.blind is not None:
            assert self.client_t is not None
            self.client_t.write(data)
            return
        wall = time.time_ns()
        t0 = time.monotonic_ns()
        assert self.client_t is not None
        if self.hold_apis:
            self._forward_responses(data)
        else:
            self.client_t.write(data)
        mono = time.monotonic_ns()
        core = self.core
        try:
            core.feed(False, data, wall, mono, mono - t0)
        except FrameError as exc:
            self._abort(f"broker sent garbage: {exc}", "bad_response_frame")
            return
        if core.slow() is not None:
            self._resolve_slow(False, wall, mono, mono - t0)
        since = self.tap.incarnation_ns
        record = core.take_record(self.records_lost, since if since > self.incarnation_ns else 0)
        if record is not None:
            self._offer(record)
        if self._flush_timer is None and self.mirror and not self.closed:
            self._arm_due(mono)

    def _resolve_slow(self, from_client: bool, wall: int, mono: int, inside: int) -> None:
        """Capture in Python the frames the core stops at (redaction, SASL handshakes, Envelopes)."""
        core = self.core
        settings = self.tap.core_settings
        while (frame := core.slow()) is not None:
            core.resolve(*capture_slow(frame, settings))
            core.feed(from_client, b"", wall, mono, inside)

    def _forward_responses(self, data: bytes) -> None:
        """Stream responses through, except frames of ``hold_apis``: those are held and rewritten."""
        out = self.client_t
        assert out is not None
        view = memoryview(data)
        pos, end = 0, len(view)
        while pos < end:
            if self._rleft:
                n = min(self._rleft, end - pos)
                out.write(view[pos : pos + n])
                pos += n
                self._rleft -= n
                continue
            if self._rhold >= 0:
                take = view[pos : pos + self._rhold - len(self._rbuf)]
                self._rbuf += take
                pos += len(take)
                if len(self._rbuf) == self._rhold:
                    out.write(self._rewrite(bytes(self._rbuf)))
                    self._rbuf.clear()
                    self._rhold = -1
                continue
            # At a frame start: the size, then (if the frame has one) the correlation id.
            need = (4 if len(self._rbuf) < 4 else 8) - len(self._rbuf)
            take = view[pos : pos + need]
            self._rbuf += take
            pos += len(take)
            if len(self._rbuf) < 4:
                break
            size = _INT32.unpack_from(self._rbuf, 0)[0]
            if size < 4 or len(self._rbuf) == 8:
                pending = self.core.pending(_INT32.unpack_from(self._rbuf, 4)[0]) if size >= 4 else None
                limit = (
                    ENDPOINT_MAX_HELD if pending is not None and pending[0] in ENDPOINT_APIS else _MAX_HELD
                )
                if pending is not None and pending[0] in self.hold_apis and size <= limit:
                    self._rhold = 4 + size
                else:
                    out.write(bytes(self._rbuf))
                    self._rleft = 4 + size - len(self._rbuf)
                    self._rbuf.clear()

    def _rewrite(self, framed: bytes) -> bytes:
        pending = self.core.pending(_INT32.unpack_from(framed, 4)[0])
        if pending is None:
            return framed
        new = rewrite_response(
            framed[4:],
            pending[0],
            pending[1],
            self.tap.addresses,
            self.tap.settings.clamp_api_versions,
            self._resolve,
        )
        if new is None:
            return framed
        self.tap.metrics.rewritten.inc()
        return _INT32.pack(len(new)) + new

    # --- mirroring -------------------------------------------------------------------------
    def expire_held(self, now_ns: int) -> None:
        """Write alone the requests held past the age bound (``Tap``'s sweep, for quiet connections)."""
        self.core.expire(now_ns)
        self._take_due(now_ns)

    def _loss_ns(self) -> int:
        since = self.tap.incarnation_ns
        return since if since > self.incarnation_ns else 0

    def _offer(self, record: tuple[bytes, int] | None) -> None:
        """Offer ``record`` and every other one due to the sink; a refused one loses its entries."""
        while record is not None:
            value, entries = record
            if not self.tap.offer(MirrorRecord(self.key, value)):
                self.records_lost += entries
            record = self.core.take_record(self.records_lost, self._loss_ns())

    def _take_due(self, now_ns: int) -> None:
        self._offer(self.core.take_record(self.records_lost, self._loss_ns()))
        if self._flush_timer is None and self.mirror and not self.closed:
            self._arm_due(now_ns)

    def _arm_due(self, now_ns: int) -> None:
        due = self.core.due_ns()
        if due is not None:
            self._arm_flush(due - now_ns)

    def _flush_due(self) -> None:
        self._flush_timer = None
        due = self.core.due_ns()
        if due is None:
            return
        wait = due - time.monotonic_ns()
        if wait > 0:
            # Records went out since the timer was armed: wait for the oldest entry gathered after them.
            self._arm_flush(wait)
            return
        self._offer(self.core.flush(self.records_lost, self._loss_ns()))

    def _arm_flush(self, wait_ns: int) -> None:
        self._flush_timer = asyncio.get_running_loop().call_later(max(wait_ns, 0) / 1e9, self._flush_due)

    def _flush_now(self) -> None:
        """Write what is gathered at once (the connection closed, or the tap stops)."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        self._offer(self.core.take_record(self.records_lost, self._loss_ns()))
        self._offer(self.core.flush(self.records_lost, self._loss_ns()))

    def _mirror_lifecycle(self, direction: str, info: dict[str, object]) -> None:
        part: taprecord.Part | None = None
        if self.mirror:
            flags = {Header.ERROR: str(info["error"])} if info.get("error") else {}
            value = json.dumps({"client": self.client_addr, "broker": self.spec.broker, **info}).encode()
            part = taprecord.Part(direction, time.time_ns(), None, None, None, value, (), flags)
        now = time.monotonic_ns()
        self.core.lifecycle(direction, part, now)
        self._take_due(now)


class Tap:
    """The proxy tap: ``await start()``, then ``await stop()``."""

    def __init__(
        self,
        listeners: list[ListenerSpec],
        sink: MirrorSink | None = None,
        settings: TapSettings | None = None,
        metrics: TapMetrics | None = None,
    ) -> None:
        self.listeners = listeners
        self.sink: MirrorSink = sink or NullMirror()
        self.settings = settings or TapSettings()
        self.metrics = metrics or TapMetrics()
        self.metrics.set_depth_source(self.sink.depth)
        self.metrics.queue_capacity.set(self.sink.capacity())
        #: Open connections by their record key (the connection id): the sink reports a failed
        #: delivery by the record's key.
        self.connections: dict[bytes, TapConnection] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.sink.watch_failures(self._delivery_failed)
        #: Bytes of requests held for their exchange records, over every connection.
        self.held = new_budget(self.settings.max_held_bytes)
        self.core_settings = self.settings.core()
        #: Configured broker id -> the tap's address for it (for address rewriting).
        self.addresses: dict[int, tuple[str, int]] = {}
        #: Listeners opened on the fly for broker ids with no configured one (rewriting only).
        self.dynamic = DynamicListeners(
            self._serve_dynamic,
            self._own_addresses,
            self.settings.dynamic_listener_ports,
            self.settings.max_dynamic_listeners,
            self._dynamic_event,
        )
        self.servers: list[asyncio.Server] = []
        self.bound: list[tuple[str, int]] = []
        self._ids = itertools.count(1)
        #: The incarnation new connections' ids carry: this process's start, or the newest loss since.
        self.incarnation_ns = 0
        self.incarnation = ""
        self.note_loss(time.time_ns())
        self._tasks: set[asyncio.Task[None]] = set()
        self._unserved: set[socket.socket] = set()
        self._stopping = False

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def offer(self, record: MirrorRecord) -> bool:
        """Hand ``record`` to the sink; False (counted) when the sink refused it."""
        if self.sink.offer(record):
            return True
        self.metrics.drops.inc()
        self.note_loss(time.time_ns())
        return False

    @property
    def prefix(self) -> str:
        return self.settings.connection_prefix or self.settings.instance_id

    def note_loss(self, ts_ns: int) -> None:
        """Records may be missing from ``ts_ns`` on (this process started, lost a record, or learnt that
        a worker of its tap died): connections opened from now on carry a new incarnation in their ids,
        which tells readers that what their clients sent before it may be missing."""
        at = -(-ts_ns // 1_000_000) * 1_000_000  # the incarnation's precision: ms, rounded up
        if at > self.incarnation_ns:
            self.incarnation_ns, self.incarnation = at, taprecord.incarnation(at)

    def announce(self) -> None:
        """Write this tap's start record: readers then know its earlier runs' connections without a
        ``close`` ended with it, their loss unknown (a single-process tap; tap/workers.py writes its own)."""
        if not self.settings.mirror:
            return
        conn = f"{self.prefix}.{self.incarnation}"
        value = taprecord.pack_tap_event(
            taprecord.TAP_START, conn, self.settings.instance_id, time.time_ns(), {"pid": os.getpid()}
        )
        self.offer(MirrorRecord(conn.encode(), value))
        self.log_event("tap_start", connections=conn)

    def _delivery_failed(self, key: bytes | None, value: bytes | None) -> None:
        """A record the sink accepted was not delivered: every entry it held is lost. Called on the
        sink's own thread, so the count is taken on the event loop's, where the connection writes."""
        loop = self._loop
        if loop is None or key is None:
            return
        entries = taprecord.entries_in(value)
        try:
            loop.call_soon_threadsafe(self._count_lost, key, entries)
        except RuntimeError:
            # The loop has closed: the tap has stopped, and no record is left to carry the count.
            pass

    def _count_lost(self, key: bytes, entries: int) -> None:
        self.note_loss(time.time_ns())
        conn = self.connections.get(key)
        # A connection closed since has written its last record: nothing would carry the count.
        if conn is not None:
            conn.records_lost += entries

    def log_event(self, event: str, **fields: object) -> None:
        if log.isEnabledFor(logging.INFO):
            log.info(json.dumps({"event": event, "tap": self.settings.instance_id, **fields}, default=str))

    def _accept(self, spec: ListenerSpec) -> asyncio.Protocol:
        conn_id = taprecord.connection_id(self.prefix, self.incarnation, next(self._ids))
        conn = TapConnection(self, spec, conn_id)
        return _Side(conn, client=True)

    async def _sweep_held(self) -> None:
        """Requests held past their age bound on connections with no traffic go out alone."""
        period = max(self.settings.hold_limits.max_age_ns / 1e9 / 4, 0.05)
        while not self._stopping:
            await asyncio.sleep(period)
            now = time.monotonic_ns()
            for conn in list(self.connections.values()):
                conn.expire_held(now)

    async def start(self) -> list[tuple[str, int]]:
        loop = self._loop = asyncio.get_running_loop()
        if self.settings.mirror:
            self.spawn(self._sweep_held())
        for spec in self.listeners:
            server = await loop.create_server(
                functools.partial(self._accept, spec),
                spec.listen_host,
                spec.listen_port,
                reuse_address=True,
                ssl=spec.server_ssl,
            )
            self.servers.append(server)
            addr = server.sockets[0].getsockname()
            self.bound.append((addr[0], addr[1]))
            if spec.broker_id is not None:
                self.addresses[spec.broker_id] = client_address(spec, addr[1])
            self.log_event("listen", listen=f"{addr[0]}:{addr[1]}", broker=spec.broker)
        return self.bound

    def start_adopted(self, bound: list[tuple[str, int]]) -> None:
        """Start without listening: another process accepts (tap/workers.py) and hands each connection
        over with ``adopt``. ``bound`` is where each of ``listeners`` listens there."""
        self._loop = asyncio.get_running_loop()
        if self.settings.mirror:
            self.spawn(self._sweep_held())
        self.bound = list(bound)
        for spec, (_, port) in zip(self.listeners, bound, strict=True):
            if spec.broker_id is not None:
                self.addresses[spec.broker_id] = client_address(spec, port)

    def adopt(self, sock: socket.socket, spec: ListenerSpec) -> None:
        """Serve a client connection accepted elsewhere, as if this tap's listener for ``spec`` had."""
        if self._stopping:
            sock.close()
            return

        async def serve() -> None:
            try:
                await asyncio.get_running_loop().connect_accepted_socket(
                    functools.partial(self._accept, spec), sock, ssl=spec.server_ssl
                )
            except (OSError, ssl.SSLError, TimeoutError) as exc:
                sock.close()
                self.log_event("adopt_failed", broker=spec.broker, error=str(exc))

        self.spawn(serve())

    def _own_addresses(self) -> list[tuple[str, int]]:
        return [*self.addresses.values(), *self.bound]

    def _serve_dynamic(self, spec: ListenerSpec, sock: socket.socket) -> None:
        """Start accepting on a socket ``DynamicListeners`` bound (it already queues connections)."""
        if self._stopping:
            sock.close()
            return
        self._unserved.add(sock)
        broker_id = spec.broker_id
        assert broker_id is not None

        def factory() -> asyncio.Protocol:
            # Looked up per connection: the broker's address may have moved since the listener opened.
            return self._accept(self.dynamic.specs[broker_id])

        async def serve() -> None:
            try:
                server = await asyncio.get_running_loop().create_server(
                    factory, sock=sock, ssl=spec.server_ssl
                )
            except (OSError, RuntimeError) as exc:
                # Clients already given this address get a refused connection, as from a dead broker;
                # later responses leave the broker at its own address.
                sock.close()
                self.dynamic.specs.pop(broker_id, None)
                self.dynamic.failed.add(broker_id)
                self._dynamic_event("dynamic_listener_failed", broker_id=broker_id, reason=str(exc))
                return
            finally:
                self._unserved.discard(sock)
            if self._stopping:
                server.close()
                return
            self.servers.append(server)

        self.spawn(serve())

    def _dynamic_event(self, event: str, **fields: object) -> None:
        result = {"dynamic_listener": "opened", "dynamic_listener_retarget": "retargeted"}.get(
            event, "failed"
        )
        self.metrics.dynamic_listeners.labels(result).inc()
        if result == "failed":
            log.warning(json.dumps({"event": event, "tap": self.settings.instance_id, **fields}, default=str))
        else:
            self.log_event(event, **fields)

    async def stop(self) -> None:
        self._stopping = True
        for sock in list(self._unserved):
            sock.close()
        for server in self.servers:
            server.close()
        for conn in list(self.connections.values()):
            conn.close_reason = "tap stopping"
            conn._shutdown()
        for server in self.servers:
            await server.wait_closed()
        for task in list(self._tasks):
            task.cancel()


def install_uvloop() -> bool:
    """Use uvloop when available (measured slightly faster for relaying); KPMON_NO_UVLOOP=1 opts out."""
    if os.environ.get("KPMON_NO_UVLOOP"):
        return False
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
