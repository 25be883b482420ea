"""The monitor core: order frames by event time, pair requests with responses, route to rules.

``Monitor.feed`` takes frames in arrival order, which across tap partitions is only roughly event-time
order. Frames wait in a buffer until the watermark (the newest ``ts_ns`` seen minus the configured
lateness) passes them, and are then released in (ts_ns, conn, seq) order. So any arrival order within
the lateness bound gives the same event sequence, and therefore the same findings. A frame older than
the watermark is processed at once and counted as late.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import msgpack

from checks.codes import ENVELOPE, PRODUCE
from checks.model import Exchange, Finding, Severity
from checks.projections import SUMMARY_APIS
from checks.rule import KEY_TTL_FIELDS, Context, Rule, RuleContext, State, StateKey, Stats, iso_time
from checks.summaries import HeartbeatRun, Summary
from codec.api import Request, Response, expand_response
from codec.errors import DecodeError
from codec.nested import EmbeddedRequest, EmbeddedResponse
from codec.peek import peek_request_header
from codec.taprecord import (
    TAP_EVENTS,
    WORKER_LOST,
    TapFrame,
    frame_from_packed,
    frame_to_packed,
    tap_event_info,
)

_SWEEP_EVERY_NS = 10 * 1_000_000_000

#: Saved monitor state: ``STATE_MAGIC``, one byte of format, then a msgpack map (``Monitor.to_state``).
#: Format 1 was JSON text (kpmon before the bucketed stages); it is refused with a clear message.
#: Format 2 kept held frames as their bytes, format 3 as their facts (``codec.facts``); format 2 is
#: still read (its frames are decoded once more on restore), so a resume migrates it.
STATE_MAGIC = b"KPMS"
STATE_FORMAT = 3
READABLE_STATE_FORMATS = frozenset({2, 3})


class StateFormatError(ValueError):
    """Saved monitor state this build cannot read (a newer format, an older one, or corrupt bytes)."""


class _ConnState:
    __slots__ = ("last_seq", "pending")

    def __init__(self, last_seq: int = -1) -> None:
        self.last_seq = last_seq
        self.pending: dict[int, TapFrame] = {}

    def answered(self, correlation_id: int) -> TapFrame | None:
        """The request ``correlation_id`` answers, no longer pending (None when none was)."""
        pending = self.pending
        request = pending.pop(correlation_id, None)
        if not pending:
            # A dict emptied by pops keeps its table (~200 bytes): an idle connection gives it back.
            pending.clear()
        return request


@dataclass(slots=True, init=False)
class Dispatched:
    """An exchange the monitor handed its rules: what ``Monitor.take_dispatched`` returns (as h11
    returns events), so a caller acts on it after the call instead of being called back during it.
    Made per exchange, so its ``__init__`` is written out (compiled; docs/decisions.md) and it is not
    frozen (a frozen dataclass's stores go through ``object.__setattr__``): nothing changes it."""

    #: ``on_request`` or ``on_response`` for a top-level exchange; ``on_header`` for a request known
    #: only by its header (undecodable or captured header-only).
    hook: str
    exchange: Exchange
    #: The exchange an Envelope forwards, unwrapped once by the monitor (None: not an Envelope, or
    #: its inner frames did not decode).
    inner: Exchange | None = None

    def __init__(self, hook: str, exchange: Exchange, inner: Exchange | None = None) -> None:
        self.hook = hook
        self.exchange = exchange
        self.inner = inner


class ConnectionMeta(NamedTuple):
    """What every frame of one connection shares (its header exchanges carry it once)."""

    conn: str
    client: str
    broker: str
    broker_id: int | None
    listener: str | None
    partition: int
    capture: str


class HeaderExchange(NamedTuple):
    """An exchange no connection-scoped rule's transitions name whole (``checks.projections``): what its
    connection's key needs of it is its headers, times and place, packed without its bodies. The tap
    wrote the pair as one entry (``seq`` and ``index`` are both frames'), so nothing pairs it again.
    ``frames`` makes the two header-level frames the connection's rules read
    (``Monitor.feed_header_exchange``)."""

    seq: int
    request_ts_ns: int
    response_ts_ns: int
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    request_header_version: int
    response_header_version: int
    request_offset: int
    response_offset: int
    entry: int
    loss_ns: int

    def frames(self, meta: ConnectionMeta) -> tuple[TapFrame, TapFrame]:
        conn, client, broker, broker_id, listener, partition, capture = meta
        api, version, corr = self.api_key, self.api_version, self.correlation_id
        request = Request(api, version, corr, self.client_id, {}, {}, self.request_header_version, False)
        response = Response(api, version, corr, {}, {}, self.response_header_version, -1, False)
        return (
            TapFrame(
                conn, self.seq, self.request_ts_ns, "req", api, version, corr, client, broker, broker_id,
                listener, partition, self.request_offset, request, None, capture, None, 0, False, self.entry,
                self.loss_ns,
            ),
            TapFrame(
                conn, self.seq, self.response_ts_ns, "resp", api, version, corr, client, broker, broker_id,
                listener, partition, self.response_offset, response, None, capture, None, 0, False, self.entry,
                self.loss_ns,
            ),
        )  # fmt: skip


class Monitor:
    """Feeds frames through every rule. Sans-I/O: no clocks, sockets or threads.

    ``only_key`` restricts every rule to that one state key: a shard of the catalogue that sees only
    the frames routed to it (the streaming job keys its state stores this way); such a shard sees a
    subset of each connection's frames, so it turns ``track_gaps`` off. With ``record_dispatched``, the
    monitor keeps every exchange it dispatches (``take_dispatched``), which is how a connection shard
    learns where to route frames.
    """

    def __init__(
        self,
        rules: Sequence[Rule],
        ctx: Context,
        *,
        only_key: str | None = None,
        record_dispatched: bool = False,
        track_gaps: bool = True,
        report_frames: bool = True,
        in_record_order: bool = False,
    ) -> None:
        self.rules = list(rules)
        self.ctx = ctx
        self.only_key = only_key
        #: What was dispatched since the last ``take_dispatched`` (None: not recorded).
        self.dispatched: list[Dispatched] | None = [] if record_dispatched else None
        self.track_gaps = track_gaps
        #: Count the frames and exchanges, report undecodable frames and count header-only ones and
        #: unpaired answers. Off in a keyed shard and in the router: the connection shard does all of it
        #: for every frame, and a keyed shard gets a frame only for the rules that judge it (counted
        #: there too, the job's frame counters would count a routed frame again).
        self.report_frames = report_frames
        #: The caller feeds one connection's frames in the order the tap wrote them (a connection
        #: shard). A record is written when its last frame has passed, so a pipelined request can be
        #: older than the response before it: that is not a late frame.
        self.in_record_order = in_record_order
        self.states: dict[StateKey, State] = {}
        self.last_seen: dict[StateKey, int] = {}
        self.conns: dict[str, _ConnState] = {}
        self._heap: list[tuple[int, str, int, int, TapFrame]] = []
        self._tiebreak = 0
        self.max_ts = 0
        self.released_ts = 0
        self._next_sweep = 0
        self._ttl_ns = {kind: int(getattr(ctx.config, attr) * 1e9) for kind, attr in KEY_TTL_FIELDS.items()}
        self._rules_by_name = {r.name: r for r in self.rules}
        #: (api key, hook) -> (rule, whether it overrides the hook) for the rules that look at that API
        #: (``Rule.api_keys``), filled as APIs are seen. A rule that does not override a hook still
        #: gets its keys' state and last-seen time (as if it had been called), but no call.
        self._rules_by_api: dict[tuple[int, str], list[tuple[Rule, bool]]] = {}
        self._lateness_ns = int(ctx.config.watermark_seconds * 1e9)

    @property
    def stats(self) -> Stats:
        return self.ctx.stats

    @property
    def watermark_ns(self) -> int:
        return self.max_ts - self._lateness_ns

    def feed(self, frame: TapFrame) -> list[Finding]:
        """Accept one frame; return the findings that became final because of it."""
        ctx = self.ctx
        if self.report_frames:
            ctx.stats.frames += 1
        if self.track_gaps:
            self._check_seq(frame)
        ts = frame.ts_ns
        if ts < self.released_ts or (not self._lateness_ns and not self._heap):
            # A late frame, or no lateness (the stages' shards, fed in order): the frame would be
            # pushed and popped again at once, so it is released as it comes.
            self._release_as_fed(frame)
        else:
            self._tiebreak += 1
            heapq.heappush(self._heap, (ts, frame.conn, frame.seq, self._tiebreak, frame))
            if ts > self.max_ts:
                self.max_ts = ts
            self._drain(self.max_ts - self._lateness_ns)
        if not ctx.findings:
            return []
        out, ctx.findings = ctx.findings, []
        return out

    def feed_paired(self, frame: TapFrame, request: TapFrame | None = None) -> list[Finding]:
        """``feed`` of a frame whose pairing was done before it came (a keyed shard fed the router's
        exchanges): a request that waits here for no answer (its answer, if any, comes with
        ``request`` set), or an answer with the ``request`` it answers. No request is held and none is
        looked up. For a monitor with no lateness (the stages' shards), which releases as it is fed."""
        if self._lateness_ns or self._heap:
            raise ValueError("feed_paired releases as it is fed: for a monitor with no lateness")
        self._release_as_fed(frame, request, False)
        return self.take_findings()

    def _release_as_fed(self, frame: TapFrame, request: TapFrame | None = None, pairs: bool = True) -> None:
        """Release ``frame`` now, as ``_drain`` would: a late frame as it is, an in-order one moving
        event time to it and firing the timers due by then (``_release``'s ``request`` and ``pairs``)."""
        if frame.ts_ns < self.released_ts:
            if not self.in_record_order:
                self.ctx.stats.late_frames += 1
            self._release(frame, request, pairs)
            return
        if frame.ts_ns > self.max_ts:
            self.max_ts = frame.ts_ns
        self._release(frame, request, pairs)
        self._fire_timers(self.max_ts)

    def feed_header_exchange(self, meta: ConnectionMeta, header: HeaderExchange) -> list[Finding]:
        """``feed`` of an exchange's request and answer known by their headers (a connection shard's
        ``HeaderExchange``: no rule's transitions name it whole), without making the frames where no
        rule needs them: each rule's ``on_quiet`` applies what its hook would, or says the hook must
        run, and only then are the two frames made (``HeaderExchange.frames``). Exactly ``feed`` of both
        frames in every effect (state, last-seen times, sweeps, pending requests, counters, findings)."""
        conn, seq = meta.conn, header.seq
        held = self.conns.get(conn)
        if (
            self._heap
            or self._lateness_ns
            or not (self.in_record_order and self.report_frames and self.track_gaps)
            or self.only_key is not None
            or self.dispatched is not None
            or (held is not None and (len(held.pending) >= self.ctx.config.max_entries_per_key))
            or (held is not None and held.last_seq >= 0 and seq > held.last_seq + 1)
        ):
            request, answer = header.frames(meta)
            return self.feed(request) + self.feed(answer)
        made: tuple[TapFrame, TapFrame] | None = None
        api_key, corr = header.api_key, header.correlation_id
        api = (api_key, header.api_version, corr)
        for hook, ts in (("on_request", header.request_ts_ns), ("on_response", header.response_ts_ns)):
            self.ctx.stats.frames += 1
            state = self.conns.get(conn)
            if state is None:
                state = self.conns[conn] = _ConnState()
            if seq > state.last_seq:
                state.last_seq = seq
            if ts < self.released_ts:
                fire = False
            else:
                fire = True
                if ts > self.max_ts:
                    self.max_ts = ts
                if ts > self.released_ts:
                    self.released_ts = ts
                    self._fire_timers(ts)
                    if ts >= self._next_sweep:
                        self._sweep(ts)
            if hook == "on_request":
                # Held and answered at once: only a request held before with this id is gone.
                state.answered(corr)
            else:
                self.ctx.stats.exchanges += 1
            rules = self._rules_by_api.get((api_key, hook))
            if rules is None:
                rules = self._rules_for(api_key, hook)
            for rule, overrides in rules:
                skey: StateKey = (rule.name, conn)
                rule_state = self.states.get(skey)
                if rule_state is None:
                    rule_state = self.states[skey] = {}
                self.last_seen[skey] = ts
                if overrides and not rule.on_quiet(rule_state, hook, seq, api):
                    if made is None:
                        made = header.frames(meta)
                    ex = Exchange(made[0], made[1] if hook == "on_response" else None)
                    assert rule.keys(ex) == [conn], f"{rule.name} keys a header exchange by its connection"
                    self._call(rule, conn, hook, ex, None)
            if fire:
                self._fire_timers(self.max_ts)
        return self.take_findings()

    def push(self, frame: TapFrame) -> None:
        """Buffer a frame until the watermark passes it (no draining: restoring saved state uses this)."""
        self._tiebreak += 1
        heapq.heappush(self._heap, (frame.ts_ns, frame.conn, frame.seq, self._tiebreak, frame))
        self.max_ts = max(self.max_ts, frame.ts_ns)

    def feed_all(self, frames: Iterable[TapFrame]) -> list[Finding]:
        out: list[Finding] = []
        for frame in frames:
            out.extend(self.feed(frame))
        return out

    def advance(self, now_ns: int) -> list[Finding]:
        """Event time moved on without frames (an idle stream): release what the watermark passed."""
        self.max_ts = max(self.max_ts, now_ns)
        self._drain(self.watermark_ns)
        return self.take_findings()

    def flush(self) -> list[Finding]:
        """Release everything buffered (end of a capture, or a graceful stop)."""
        self._drain(None)
        return self.take_findings()

    def take_dispatched(self) -> list[Dispatched]:
        """The exchanges dispatched since the last call, in order (``record_dispatched``)."""
        out = self.dispatched or []
        if self.dispatched is not None:
            self.dispatched = []
        return out

    def take_findings(self) -> list[Finding]:
        out, self.ctx.findings = self.ctx.findings, []
        return out

    def _drain(self, upto: int | None) -> None:
        heap, pop, release = self._heap, heapq.heappop, self._release
        if upto is None:
            while heap:
                release(pop(heap)[-1])
            return
        while heap and heap[0][0] <= upto:
            release(pop(heap)[-1])
        self._fire_timers(upto)

    def _release(self, frame: TapFrame, request: TapFrame | None = None, pairs: bool = True) -> None:
        """Release ``frame`` to the rules. ``pairs``: this monitor pairs answers with the requests it
        holds; otherwise it holds none, and an answer comes with its ``request`` (``feed_paired``)."""
        ts = frame.ts_ns
        if ts > self.released_ts:
            self.released_ts = ts
            self._fire_timers(ts)
            if ts >= self._next_sweep:
                self._sweep(ts)
        conn: _ConnState | None = None
        if pairs:
            conn = self.conns.get(frame.conn)
            if conn is None:
                conn = self.conns[frame.conn] = _ConnState()
        if frame.lost > 0:
            # The tap says it lost records of this connection: from this frame on, until the connection
            # closes, its findings may be wrong for want of them. A gap alone does not say so (the
            # records may be missing after the tap, or be a shard's by design), and the count needs
            # no memory of earlier frames, so a stateless router can tell it too.
            self.ctx.incomplete_conns.add(frame.conn)
        direction = frame.direction
        if direction == "close":
            self._close(frame)
            return
        if direction == "open":
            return
        if direction == "blind":
            if self.report_frames:
                self._blind(frame)
            return
        if direction in TAP_EVENTS:
            if self.report_frames:
                self._tap_event(frame)
            return
        if frame.error is not None:
            if self.report_frames:
                self._decode_error(frame)
            self._header_only_request(frame)
            return
        if frame.message is None:
            # Captured header-only (``meta`` policy, or truncated as too large): only the header's facts.
            if self.report_frames:
                self.stats.header_only += 1
            self._header_only_request(frame)
            return
        if direction == "req":
            self._on_request(frame, conn)
        elif direction == "resp":
            if conn is not None:
                self._on_response(frame, conn)
            elif request is not None:
                self._on_answer(request, frame)

    def _on_request(self, frame: TapFrame, conn: _ConnState | None) -> None:
        """A request's hook; ``conn``: where it waits for its answer (None: it waits nowhere here)."""
        request = frame.request
        if request is None:
            return
        if conn is not None:
            conn.pending[request.correlation_id] = frame
            self.ctx.trim(conn.pending)
        exchange = Exchange(frame, None)
        self._dispatch("on_request", exchange)
        if request.api_key == PRODUCE and request.body.get("Acks") == 0:
            # acks=0: no response will ever come, so the exchange completes now.
            if conn is not None:
                conn.answered(request.correlation_id)
            self._complete(exchange)

    def _on_response(self, frame: TapFrame, conn: _ConnState) -> None:
        response = frame.response
        if response is None:
            return
        request_frame = conn.answered(response.correlation_id)
        # A lone response: the tap wrote its request alone before it (a bound was hit), so no reader
        # that sees records one batch at a time could pair them; none does (docs/decisions.md).
        if request_frame is None or request_frame.request is None or frame.lone:
            if self.report_frames:
                self.stats.unpaired_responses += 1
            return
        self._on_answer(request_frame, frame)

    def _on_answer(self, request_frame: TapFrame, frame: TapFrame) -> None:
        """The answer ``frame`` to ``request_frame``, however they were paired."""
        request, response = request_frame.request, frame.response
        if request is None or response is None:
            return
        # Nested payloads that need the request (Envelope inner responses, pre-v7 JoinGroup metadata).
        expand_response(response, request)
        self._complete(Exchange(request_frame, frame))

    def _header_only_request(self, frame: TapFrame) -> None:
        """A request known only by its header: the rules that judge headers alone still see it.

        Recorded as dispatched ``on_header`` (``ex.req`` is the header, ``ex.request.message`` the only
        thing added to the frame as it came): a shard routes it to the keyed rules that judge headers.
        """
        request = header_request(frame)
        if request is None:
            return
        exchange = Exchange(replace(frame, message=request), None)
        if self.dispatched is not None:
            self.dispatched.append(Dispatched("on_header", exchange))
        for rule in self.rules:
            if not rule.judges_headers or (
                rule.api_keys is not None and request.api_key not in rule.api_keys
            ):
                continue
            for key in rule.keys(exchange):
                if self.only_key is None or key == self.only_key:
                    self._call(rule, key, "on_request", exchange, None)

    def _complete(self, exchange: Exchange) -> None:
        if self.report_frames:
            self.stats.exchanges += 1
        self._dispatch("on_response", exchange)

    def _rules_for(self, api_key: int, hook: str) -> list[tuple[Rule, bool]]:
        """The rules that take ``api_key``'s exchanges and whether each overrides ``hook``, found once
        per API and hook (the callers look in ``_rules_by_api`` first)."""
        rules = self._rules_by_api[(api_key, hook)] = [
            (r, getattr(type(r), hook) is not getattr(Rule, hook))
            for r in self.rules
            if r.api_keys is None or api_key in r.api_keys
        ]
        return rules

    def _dispatch(self, hook: str, exchange: Exchange, envelope: Exchange | None = None) -> None:
        """Call every rule's ``hook`` for every key of ``exchange``; ``envelope``: the Envelope the
        exchange was unwrapped from (KIP-590), whose findings the rules' ids are prefixed for.

        The hot loop of the whole monitor (once per rule per frame): the rules that look at an API,
        and whether each overrides ``hook``, are found once per API and hook, not for every frame."""
        api_key = exchange.api_key
        # An Envelope's inner exchange is unwrapped once: for its rules here and for the caller.
        inner = unwrap_envelope(exchange) if api_key == ENVELOPE else None
        if self.dispatched is not None and envelope is None:
            self.dispatched.append(Dispatched(hook, exchange, inner))
        rules = self._rules_by_api.get((api_key, hook))
        if rules is None:
            rules = self._rules_for(api_key, hook)
        only_key = self.only_key
        call = self._call
        for rule, overrides in rules:
            for key in rule.keys(exchange):
                if only_key is None or key == only_key:
                    if overrides:
                        call(rule, key, hook, exchange, envelope)
                    else:
                        self._touch(rule.name, key, exchange)
        if inner is not None:
            self._dispatch(hook, inner, exchange)

    def _touch(self, rule: str, key: str, exchange: Exchange) -> None:
        """Make the state of (rule, key) if new, and set its last-seen time to ``exchange``'s."""
        skey: StateKey = (rule, key)
        if skey not in self.states:
            self.states[skey] = {}
        self.last_seen[skey] = exchange.seen_ns

    def _call(self, rule: Rule, key: str, hook: str, exchange: Exchange, envelope: Exchange | None) -> None:
        name = rule.name
        skey: StateKey = (name, key)
        state = self.states.get(skey)
        if state is None:
            state = self.states[skey] = {}
        self.last_seen[skey] = exchange.seen_ns
        getattr(rule, hook)(state, key, exchange, RuleContext(self.ctx, name, key, envelope))

    def _fire_timers(self, now_ns: int) -> None:
        """Fire timers due by ``now_ns``, in (deadline, rule, key) order.

        Called for nearly every frame, so it must not scan all timers: with one timer per open
        transaction, a scan made throughput fall with the number of open transactions (20x slower at
        10 k). The context keeps a heap next to the ``timers`` dict, which stays authoritative: heap
        entries whose deadline no longer matches (cancelled, re-set, dropped) are skipped.
        """
        ctx = self.ctx
        timers = ctx.timers
        heap = ctx.timer_heap
        if not timers:
            heap.clear()
            return
        if ctx.timer_heap_for is not timers or not len(timers) <= len(heap) <= 2 * len(timers) + 64:
            # Out of step (timers restored from a snapshot, or set directly), or mostly stale entries.
            heap[:] = sorted((deadline, rule, key) for (rule, key), deadline in timers.items())
            ctx.timer_heap_for = timers
        if heap[0][0] > now_ns:
            return
        due: list[tuple[int, str, str]] = []
        while heap and heap[0][0] <= now_ns:
            due.append(heapq.heappop(heap))
        # Timers set by these callbacks fire on a later call, never in this one.
        for deadline, rule_name, key in due:
            skey = (rule_name, key)
            if timers.get(skey) != deadline:
                continue
            del timers[skey]
            rule = self._rules_by_name.get(skey[0])
            state = self.states.get(skey)
            if rule is None or state is None:
                continue
            rule.on_timer(state, key, deadline, RuleContext(ctx, rule_name, key))

    def _close(self, frame: TapFrame) -> None:
        for rule in self.rules:
            skey = (rule.name, frame.conn)
            state = self.states.get(skey)
            if state is None:
                continue
            if rule.on_close(
                state, frame.conn, frame.conn, frame.ts_ns, RuleContext(self.ctx, rule.name, frame.conn)
            ):
                self._drop(skey)
        self.conns.pop(frame.conn, None)
        self.ctx.incomplete_conns.discard(frame.conn)

    def _check_seq(self, frame: TapFrame) -> None:
        """Gaps in a connection's numbering, in the order its records arrive (one tap partition keeps
        it): the tap numbers records as it writes them, and a request held for its answer is written
        after records whose frames came later, so its clock would put its number out of order."""
        conn = self.conns.get(frame.conn)
        if conn is None:
            conn = self.conns[frame.conn] = _ConnState()
        seq, last_seq = frame.seq, conn.last_seq
        if seq > last_seq:
            if last_seq >= 0 and seq > last_seq + 1:
                self._gap(frame, last_seq)
            conn.last_seq = seq

    def _gap(self, frame: TapFrame, last_seq: int) -> None:
        missing = frame.seq - last_seq - 1
        self.stats.gaps += 1
        self.ctx.emit(
            "tap.gap",
            Severity.WARNING,
            f"conn:{frame.conn}",
            f"{missing} record(s) missing on connection {frame.conn} (seq {last_seq + 1}..{frame.seq - 1})"
            + (f"; the tap reports {frame.lost} lost" if frame.lost else ""),
            frame.ts_ns,
            {**frame.evidence(), "missing": missing, "offsets": [frame.at()]},
        )

    def _blind(self, frame: TapFrame) -> None:
        """The tap saw TLS it does not terminate on this connection: every later frame is opaque."""
        try:
            side = str(json.loads(frame.raw or b"{}").get("side", "client"))
        except (ValueError, AttributeError):
            side = "client"
        fix = (
            "the broker speaks TLS: set broker_tls (and broker_cafile) on that tap listener"
            if side == "broker"
            else "the client speaks TLS: set tls_certfile and tls_keyfile on that tap listener"
        )
        self.ctx.emit(
            "tap.blind",
            Severity.WARNING,
            f"conn:{frame.conn}",
            f"the tap relays connection {frame.conn} (listener {frame.listener or '?'}, broker "
            f"{frame.broker or '?'}) as TLS it cannot read, so none of its frames are checked; {fix}",
            frame.ts_ns,
            {
                **frame.evidence(),
                "client": frame.client,
                "broker": frame.broker,
                "listener": frame.listener,
                "side": side,
                "offsets": [frame.at()],
            },
        )

    def _tap_event(self, frame: TapFrame) -> None:
        """The tap says it may have lost records: a finding about the tap, so the report and the alerts
        show when and where; the findings this loss can explain say so themselves (``RuleContext.tap_loss``).
        A worker's death is a warning (records were lost); a start is ``info`` (whether the run before
        it ended cleanly is unknown)."""
        info = tap_event_info(frame)
        tap = info.get("tap") or "?"
        when = iso_time(frame.ts_ns)
        evidence = {**frame.evidence(), **info, "offsets": [[frame.partition, frame.offset]]}
        after = "Findings that may rest on those records are incomplete and at most info."
        if frame.direction == WORKER_LOST:
            self.ctx.emit(
                "tap.worker_lost",
                Severity.WARNING,
                f"tap:{tap}",
                f"tap {tap}: worker {info.get('worker', '?')} (pid {info.get('pid', '?')}, exit "
                f"{info.get('exitcode', '?')}) died at {when}; the connections it served ({frame.conn}.*) "
                "ended without their close record, and what it had not mirrored yet is lost (how much is "
                f"unknown). {after}",
                frame.ts_ns,
                evidence,
            )
            return
        self.ctx.emit(
            "tap.tap_start",
            Severity.INFO,
            f"tap:{tap}",
            f"tap {tap} started at {when} (connections {frame.conn}-*); connections of its earlier runs "
            "that have no close record ended with that run, and what it had not mirrored is lost (how "
            f"much is unknown). {after}",
            frame.ts_ns,
            evidence,
        )

    def _decode_error(self, frame: TapFrame) -> None:
        self.stats.decode_errors += 1
        error = frame.error
        self.ctx.emit(
            "frame.decode_error",
            Severity.WARNING,
            f"conn:{frame.conn}",
            f"undecodable {frame.direction} frame"
            + (f" (api {frame.api_key} v{frame.api_version})" if frame.api_key is not None else "")
            + (f": {error.reason} at byte {error.offset}" if error else ""),
            frame.ts_ns,
            {
                **frame.evidence(),
                "client": frame.client,
                "broker": frame.broker,
                "api_key": frame.api_key,
                "api_version": frame.api_version,
                "correlation_id": frame.correlation_id,
                "offsets": [frame.at()],
            },
        )
        # Rules that can explain an undecodable frame (the KIP-482 header-version check defines
        # ``on_undecodable``) see it too, keyed by its connection: nothing else about it is known.
        for rule in self.rules:
            hook = getattr(rule, "on_undecodable", None)
            if hook is None:
                continue
            skey = (rule.name, frame.conn)
            state = self.states.setdefault(skey, {})
            self.last_seen[skey] = frame.ts_ns
            hook(state, frame.conn, frame, RuleContext(self.ctx, rule.name, frame.conn))

    def _sweep(self, now_ns: int) -> None:
        self._next_sweep = now_ns + _SWEEP_EVERY_NS
        for skey, seen in list(self.last_seen.items()):
            rule = self._rules_by_name.get(skey[0])
            if rule is None:
                continue
            if (
                seen < now_ns - self._ttl_ns.get(rule.key_kind, self._ttl_ns["conn"])
                and skey not in self.ctx.timers
            ):
                self._drop(skey)
                self.stats.evicted_keys += 1

    def _drop(self, skey: StateKey) -> None:
        self.states.pop(skey, None)
        self.last_seen.pop(skey, None)
        self.ctx.timers.pop(skey, None)

    # -- saved state ------------------------------------------------------------------------------

    def to_state(self) -> bytes:
        """Everything this monitor needs to carry on after a restart (not its statistics: those are
        deltas), as compact versioned bytes. Held frames are kept as their tap metadata and facts
        (``codec.taprecord.frame_to_packed``): restoring them decodes nothing."""
        body = {
            "states": [[rule, key, state] for (rule, key), state in self.states.items()],
            "last_seen": [[rule, key, ts] for (rule, key), ts in self.last_seen.items()],
            "conns": [
                [conn, cs.last_seq, [frame_to_packed(f) for f in cs.pending.values()]]
                for conn, cs in self.conns.items()
            ],
            "heap": [frame_to_packed(entry[-1]) for entry in self._heap],
            "timers": [[rule, key, deadline] for (rule, key), deadline in self.ctx.timers.items()],
            "incomplete": sorted(self.ctx.incomplete_conns),
            "max_ts": self.max_ts,
            "released_ts": self.released_ts,
            "next_sweep": self._next_sweep,
        }
        return STATE_MAGIC + bytes([STATE_FORMAT]) + msgpack.packb(body, use_bin_type=True)

    @classmethod
    def from_state(
        cls,
        data: bytes,
        rules: Sequence[Rule],
        ctx: Context,
        *,
        only_key: str | None = None,
        record_dispatched: bool = False,
        track_gaps: bool = True,
        report_frames: bool = True,
        in_record_order: bool = False,
    ) -> Monitor:
        """A monitor with ``rules`` that carries on from ``to_state`` output."""
        body = _read_state(data)
        monitor = cls(
            rules,
            ctx,
            only_key=only_key,
            record_dispatched=record_dispatched,
            track_gaps=track_gaps,
            report_frames=report_frames,
            in_record_order=in_record_order,
        )
        monitor.states = {(rule, key): state for rule, key, state in body["states"]}
        monitor.last_seen = {(rule, key): ts for rule, key, ts in body["last_seen"]}
        for conn, last_seq, pending in body["conns"]:
            cs = monitor.conns[conn] = _ConnState(last_seq=last_seq)
            for packed in pending:
                frame = frame_from_packed(packed)
                if frame.correlation_id is not None:
                    cs.pending[frame.correlation_id] = frame
        for packed in body["heap"]:
            monitor.push(frame_from_packed(packed))
        ctx.timers = {(rule, key): deadline for rule, key, deadline in body["timers"]}
        ctx.incomplete_conns = set(body["incomplete"])
        monitor.max_ts, monitor.released_ts = body["max_ts"], body["released_ts"]
        monitor._next_sweep = body["next_sweep"]
        return monitor

    @property
    def empty(self) -> bool:
        """Nothing left to remember: no rule state, held frame, pending request or timer."""
        return not self.states and not self.conns and not self._heap and not self.ctx.timers

    def apply_summary(self, summary: Summary) -> bool:
        """Apply a summary (``checks.summaries``) to this keyed shard's monitor exactly as feeding the
        routes it stands for would, or change nothing and return False (the caller feeds those routes)."""
        key = self.only_key
        if key is None:
            return False
        run = summary.facts
        ctx = self.ctx
        rules = self.rules
        times = run.times
        api = run.api if isinstance(run, HeartbeatRun) else PRODUCE
        if (
            api not in SUMMARY_APIS.get(summary.kind, ())
            or ctx.timers
            or self._heap
            or self._lateness_ns
            or times[0] < self.released_ts
            or run.open_most > ctx.config.max_entries_per_key
        ):
            return False
        held = self.conns.get(run.conn)
        if held is not None and held.pending:
            return False
        # The rules that look at the run's API: each must accept it; the others are not called.
        touched = [r for r in rules if r.api_keys is None or api in r.api_keys]
        states = []
        contexts = []
        for rule in touched:
            state = self.states.get((rule.name, key))
            rule_ctx = RuleContext(ctx, rule.name, key)
            if state is None or not rule.summary_applies(state, key, summary.kind, run, rule_ctx):
                return False
            states.append(state)
            contexts.append(rule_ctx)
        # The engine's sweeps at the run's release times must drop nothing: before the run's first frame
        # the key's touch times are its own, after it the touched rules' are the run's.
        released, next_sweep = self.released_ts, self._next_sweep
        ttl = int(getattr(ctx.config, KEY_TTL_FIELDS[rules[0].key_kind]) * 1e9) if rules else 0
        names = {r.name for r in touched}
        untouched = [seen for (name, _key), seen in self.last_seen.items() if name not in names]
        before = min(self.last_seen.values(), default=None)
        for i, ts in enumerate(times):
            if ts <= released:
                continue
            released = ts
            if ts >= next_sweep:
                seen = before if i == 0 else min([times[i - 1], *untouched])
                if seen is not None and seen < ts - ttl:
                    return False
                next_sweep = ts + _SWEEP_EVERY_NS
        for rule, state, rule_ctx in zip(touched, states, contexts, strict=True):
            rule.on_summary(state, key, summary.kind, run, rule_ctx)
            self.last_seen[(rule.name, key)] = times[-1]
        self.released_ts, self._next_sweep = released, next_sweep
        self.max_ts = max(self.max_ts, times[-1])
        ctx.timer_heap.clear()
        if held is not None:
            del self.conns[run.conn]
        return True

    def forget_request(self, conn: str, correlation_id: int) -> None:
        """Stop waiting for the answer to a request (a shard that will never be sent it)."""
        held = self.conns.get(conn)
        if held is not None:
            held.answered(correlation_id)

    def drop_idle_connection(self, conn: str) -> None:
        """Forget a connection with no request waiting (a shard that never sees its close)."""
        held = self.conns.get(conn)
        if held is not None and not held.pending:
            del self.conns[conn]

    def snapshot(self) -> dict[str, Any]:
        """Rule state as plain data (what a state store would keep)."""
        return {f"{rule}|{key}": state for (rule, key), state in self.states.items()}


def header_request(frame: TapFrame) -> Request | None:
    """The request header of a request frame whose body is unknown, as a ``Request`` with an empty body.

    The api key and version are the tap's (it read them from the frame's first four bytes, which every
    request has); the client id is read from the mirrored bytes when they are there. None for responses,
    and for records the tap could not place (no api key: SASL tokens, records not from a tap).
    """
    if frame.direction != "req" or frame.api_key is None or frame.api_version is None:
        return None
    client_id: str | None = None
    if frame.raw is not None:
        try:
            peeked = peek_request_header(frame.raw)
        except DecodeError:
            peeked = None
        if peeked is not None and (peeked.api_key, peeked.api_version) == (frame.api_key, frame.api_version):
            client_id = peeked.client_id
    corr = frame.correlation_id if frame.correlation_id is not None else -1
    return Request(frame.api_key, frame.api_version, corr, client_id, {}, {}, -1)


def unwrap_envelope(exchange: Exchange) -> Exchange | None:
    data = exchange.req.body.get("RequestData")
    if not isinstance(data, EmbeddedRequest) or data.request is None:
        return None
    outer = exchange.request
    inner_request = TapFrame(
        conn=outer.conn,
        seq=outer.seq,
        ts_ns=outer.ts_ns,
        direction="req",
        api_key=data.request.api_key,
        api_version=data.request.api_version,
        correlation_id=data.request.correlation_id,
        client=outer.client,
        broker=outer.broker,
        broker_id=outer.broker_id,
        listener=outer.listener,
        partition=outer.partition,
        offset=outer.offset,
        message=data.request,
        capture=outer.capture,
        index=outer.index,
        loss_ns=outer.loss_ns,
    )
    inner_response = None
    resp = exchange.resp
    if exchange.response is not None and resp is not None:
        wrapped = resp.body.get("ResponseData")
        if isinstance(wrapped, EmbeddedResponse) and wrapped.response is not None:
            r = exchange.response
            inner_response = TapFrame(
                conn=r.conn,
                seq=r.seq,
                ts_ns=r.ts_ns,
                direction="resp",
                api_key=data.request.api_key,
                api_version=data.request.api_version,
                correlation_id=wrapped.response.correlation_id,
                client=r.client,
                broker=r.broker,
                broker_id=r.broker_id,
                listener=r.listener,
                partition=r.partition,
                offset=r.offset,
                message=wrapped.response,
                capture=r.capture,
                index=r.index,
                loss_ns=r.loss_ns,
            )
    # ``envelope`` marks the exchange as unwrapped, so rules can tell it from the connection's own traffic.
    return Exchange(inner_request, inner_response, envelope=exchange.request)


def _read_state(data: bytes) -> dict[str, Any]:
    if not data.startswith(STATE_MAGIC):
        old = " (JSON text: format 1, written before the bucketed stages)" if data[:1] == b"{" else ""
        raise StateFormatError(
            f"not kpmon monitor state{old}; this build reads format {STATE_FORMAT}: start from a fresh "
            "checkpoint (kpmon run --fresh, or the redeploy DAG's allow_fresh_start)"
        )
    version = data[len(STATE_MAGIC)] if len(data) > len(STATE_MAGIC) else None
    if version not in READABLE_STATE_FORMATS:
        raise StateFormatError(
            f"monitor state format {version!r}; this build reads formats "
            f"{', '.join(map(str, sorted(READABLE_STATE_FORMATS)))} only"
            + (
                " (the state is newer than this kpmon)"
                if version is not None and version > STATE_FORMAT
                else ""
            )
        )
    try:
        body = msgpack.unpackb(data[len(STATE_MAGIC) + 1 :], raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise StateFormatError(f"corrupt monitor state: {exc}") from exc
    if not isinstance(body, dict):
        raise StateFormatError("corrupt monitor state: not a map")
    return body
