"""The catalogue split into shards that a distributed engine can key its state by.

Three parts, all driving the same ``Monitor`` and rules as a single-process run:

1. **Router** (no state). A batch of one connection's frames in ``seq`` order (one connection, one tap
   partition): it pairs each request with its response within the batch (the tap writes both in one
   record) and decides where each exchange goes: a *route* per (key kind, state key) of every keyed
   rule, computed by that rule's own ``keys``.
2. **Connection shard** (one per tap connection, fed its frames in ``seq`` order, so it needs no
   event-time buffering): the connection-scoped rules (ApiVersions ranges, KIP-482, Envelope trust,
   read-committed fetches), tap gaps, decode errors and the frame counts.
3. **Keyed shard** (one per route key ``"<key kind>|<state key>"``: a group, a producer id, a
   transactional id, the cluster). It receives the routed frames of many connections, which a caller
   must hand over in event-time order once the watermark has passed them, and runs the rules of that
   key kind for that one key.

A route carries the frame's facts (``codec.facts``: the decoded message without the records of data
batches), so the parts can run in different processes and the frame is decoded only once. Routes are
only sent for the frames a rule needs: a request when it is sent, carrying its response (with the
request again, at the response's time, for keys that only the response revealed, such as the producer
id an InitProducerId response assigns). The router pairs an exchange once, as the tap wrote it, and
nothing after it pairs again: the keyed shard holds the answer until event time reaches it. A request
known only by its header (its body did not decode, or was mirrored header-only) goes on as it came,
with its decode error and bytes, to the keyed rules that judge headers (``Rule.judges_headers``: the
fleet matrix); the connection shard alone reports its decode error. A run of ordinary exchanges of a
key goes as one summary route (``checks.summaries``), which the keyed shard
applies or, where it cannot be exact, replaces by the routes it stands for.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cache, partial
from operator import attrgetter
from typing import Any

import msgpack

from checks.codes import ENVELOPE
from checks.engine import (
    ConnectionMeta,
    Dispatched,
    HeaderExchange,
    Monitor,
    StateFormatError,
    unwrap_envelope,
)
from checks.model import Exchange, Finding
from checks.projections import (
    ANSWER_KEYED,
    SUMMARY_APIS,
    TRANSITIONS,
    Transitions,
    project_for_connection,
    project_frame,
)
from checks.routes import Route
from checks.rule import KEY_TTL_FIELDS, Context, Rule
from checks.rules import all_rules
from checks.rules.apiversions import removed_in_4_0
from checks.settings import ChecksSettings
from checks.summaries import RUNS, Summary, expand_conflicts, release_key
from codec.api import expand_response
from codec.messages import Request, Response
from codec.protocol import ApiKey
from codec.taprecord import RESP, TapFrame, frame_from_packed, frame_to_packed

#: An answer a keyed shard holds until event time reaches it: (release key, arrival, request, answer,
#: whether the answer's connection was incomplete by then).
HeldAnswer = tuple[tuple[int, str, int], int, TapFrame, TapFrame, bool]

#: Key kinds whose rules see every request (the fleet matrix, one key for the whole cluster). Routing
#: all traffic to that key would funnel the stream through one task, so it gets each connection's first
#: use of each (api, version) only, plus ApiVersions exchanges in full: fleet counts become connections.
FIRST_USE_ONLY = frozenset({"cluster"})
#: How route keys are formed; state stored under another scheme's keys cannot be read by this one.
#: 1: "<rule name>|<key>"; 2: "<key kind>|<key>".
ROUTE_SCHEME = 2


def is_connection_scoped(rule: Rule) -> bool:
    return rule.key_kind == "conn"


def route_key(rule: Rule, key: str) -> str:
    """One shard per (key kind, key): rules of one kind (producer epochs and producer-id ownership)
    share a shard, so a frame they both need is routed, stored and decoded once."""
    return f"{rule.key_kind}|{key}"


def split_route_key(value: str) -> tuple[str, str]:
    rule, _, key = value.partition("|")
    return rule, key


def forms_route_key(value: str) -> bool:
    """Whether a rule of this build forms route keys of this one's kind (``KeyedShard`` serves it)."""
    return bool(_catalogue().kind_rule_objects.get(split_route_key(value)[0]))


def _stage_config(config: ChecksSettings) -> ChecksSettings:
    # Both stages are fed in order (by seq, or by the caller's event-time release), so the monitor's
    # own lateness buffer would only add delay.
    global _STAGE_CONFIG
    last = _STAGE_CONFIG
    if last is not None and last[0] is config:
        # A shard is made per connection or route key and call, always from the job's one settings
        # object: ``dataclasses.replace`` re-ran the settings' ``__init__`` and checks each time.
        return last[1]
    staged = replace(config, watermark_seconds=0.0)
    _STAGE_CONFIG = (config, staged)
    return staged


#: The last settings ``_stage_config`` was given and what it made of them (settings are frozen).
_STAGE_CONFIG: tuple[ChecksSettings, ChecksSettings] | None = None


@dataclass(frozen=True)
class _Catalogue:
    """The keyed rules as the router routes for them (rules keep no state of their own: one set serves
    every connection shard)."""

    #: The connection-scoped rules the connection shard runs.
    own_rules: tuple[Rule, ...]
    #: The connection-scoped rules that keep no state across exchanges: the router runs them
    #: (``Transitions.in_router``).
    router_rules: tuple[Rule, ...]
    keyed_rules: tuple[Rule, ...]
    #: Key kind -> the names of its rules: what a route to that kind keeps (``checks.projections``).
    kind_rules: dict[str, tuple[str, ...]]
    #: Key kind -> its rules, in catalogue order: what a keyed shard of that kind runs.
    kind_rule_objects: dict[str, tuple[Rule, ...]]
    #: Key kind -> the summaries all its rules accept (``Transitions.summaries``).
    kind_summaries: dict[str, frozenset[str]]


class UndeclaredTransitions(ValueError):
    """A rule of the catalogue does not declare its transitions (``checks.projections.TRANSITIONS``)."""


def check_transitions(rules: Iterable[Rule]) -> None:
    """Refuse rules that do not declare their transitions (``checks.projections.TRANSITIONS``): the
    stages would never send them a frame, a rule that cannot fire."""
    for rule in rules:
        declared = TRANSITIONS.get(rule.name)
        if declared is None:
            raise UndeclaredTransitions(
                f"rule {rule.name!r} declares no transitions: name the exchanges that can change its state "
                "in checks/projections.py TRANSITIONS, or the stages never send it any"
            )
        if rule.api_keys is not None and not declared.first_use and not rule.api_keys <= declared.apis:
            missing = sorted(int(k) for k in rule.api_keys - declared.apis)
            raise UndeclaredTransitions(f"rule {rule.name!r} looks at APIs {missing} it does not declare")
        if declared.in_router and (rule.key_kind != "conn" or rule.api_keys is None):
            raise UndeclaredTransitions(
                f"rule {rule.name!r}: only a connection-scoped rule of named APIs can be judged in the router"
            )
        if rule.api_keys is None and not (declared.headers or declared.first_use):
            raise UndeclaredTransitions(
                f"rule {rule.name!r} looks at every API but does not declare headers or first uses"
            )


@cache
def _catalogue() -> _Catalogue:
    rules = all_rules()
    check_transitions(rules)
    keyed_rules = tuple(r for r in rules if not is_connection_scoped(r))
    kind_rules: dict[str, tuple[Rule, ...]] = {}
    for rule in keyed_rules:
        kind_rules[rule.key_kind] = (*kind_rules.get(rule.key_kind, ()), rule)
    own = [r for r in rules if is_connection_scoped(r)]
    return _Catalogue(
        tuple(r for r in own if not TRANSITIONS[r.name].in_router),
        tuple(r for r in own if TRANSITIONS[r.name].in_router),
        keyed_rules,
        {kind: tuple(r.name for r in members) for kind, members in kind_rules.items()},
        kind_rules,
        {kind: _accepted(members) for kind, members in kind_rules.items()},
    )


def _accepted(rules: Iterable[Rule]) -> frozenset[str]:
    """The summary kinds that every one of ``rules`` naming their APIs accepts (``SUMMARY_APIS``)."""
    out: set[str] = set()
    for kind, apis in SUMMARY_APIS.items():
        naming = [r for r in rules if any(TRANSITIONS[r.name].names_api(api) for api in apis)]
        if naming and all(kind in TRANSITIONS[r.name].summaries for r in naming):
            out.add(kind)
    return frozenset(out)


#: One routing step of a plan: the rule, its route-key prefix (``route_key(rule, "")``), its key kind,
#: whether its routes are first-use-only (the request goes, its response does not).
_PlanStep = tuple[Rule, str, str, bool]
_PlanKey = tuple[int | None, bool, bool, int | None, bool]
#: Plans made so far, by ``_PlanKey`` (a plain dict: ``functools.cache`` with keyword arguments builds
#: its key from them on every call, and this is asked twice per frame).
_PLANS: dict[_PlanKey, tuple[_PlanStep, ...]] = {}
#: The API keys whose plans are kept. A request header can carry any int16 (a client's bug or a hostile
#: one), so a plan for a key Kafka does not define is made again each time instead of growing _PLANS.
_PLANNED_APIS = frozenset(int(k) for k in ApiKey)


def cached_plans() -> int:
    """How many routing plans are kept (bounded by the API keys Kafka defines)."""
    return len(_PLANS)


def _route_plan(
    api_key: int | None,
    header_only: bool,
    first_use: bool,
    outer: int | None = None,
    answered: bool = False,
) -> tuple[_PlanStep, ...]:
    """The keyed rules that route an exchange of ``api_key`` (None: of any API), in catalogue order,
    worked out once per API instead of filtering every rule for every frame. ``outer``: the API of
    the Envelope the exchange came in (what the first-use-only kinds go by); ``header_only``: only the
    rules that judge a request by its header; ``first_use``: the connection's first use of this (api,
    version), which the first-use-only kinds need (ApiVersions always goes to them); ``answered``:
    only the rules whose keys an answer of this API can add to (``checks.projections.ANSWER_KEYED``)."""
    plan_key = (api_key, header_only, first_use, outer, answered)
    plan = _PLANS.get(plan_key)
    if plan is not None:
        return plan
    outer = api_key if outer is None else outer
    out: list[_PlanStep] = []
    for rule in _catalogue().keyed_rules:
        if header_only and not rule.judges_headers:
            continue
        if api_key is not None and rule.api_keys is not None and api_key not in rule.api_keys:
            continue
        if api_key is not None and not TRANSITIONS[rule.name].names_api(api_key):
            continue
        if answered and api_key not in ANSWER_KEYED.get(rule.name, ()):
            continue
        first_use_only = rule.key_kind in FIRST_USE_ONLY and outer != ApiKey.API_VERSIONS
        if first_use_only and not first_use:
            continue
        out.append((rule, route_key(rule, ""), rule.key_kind, first_use_only))
    plan = tuple(out)
    if api_key is None or api_key in _PLANNED_APIS:
        _PLANS[plan_key] = plan
    return plan


def _meta(frame: TapFrame) -> ConnectionMeta:
    return ConnectionMeta(
        frame.conn,
        frame.client,
        frame.broker,
        frame.broker_id,
        frame.listener,
        frame.partition,
        frame.capture,
    )


@dataclass
class ConnectionRow:
    """What one batch sends a connection's own key: the frames some connection-scoped rule's
    transitions name (projected for the connection, ``project_for_connection``) and every other
    exchange by its headers, each list in seq order."""

    frames: list[TapFrame] = field(default_factory=list)
    exchanges: list[HeaderExchange] = field(default_factory=list)
    #: The connection the exchanges belong to (None: no exchanges).
    meta: ConnectionMeta | None = None

    def extend(self, other: ConnectionRow) -> None:
        """Add another batch part's row of the same connection (the stage gets one per source batch)."""
        self.frames += other.frames
        if other.exchanges:
            if self.meta is None:
                self.meta = other.meta
            if other.meta == self.meta:
                self.exchanges += other.exchanges
            else:  # never from one tap: the frames themselves, then
                assert other.meta is not None
                for exchange in other.exchanges:
                    self.frames.extend(exchange.frames(other.meta))

    @property
    def closed(self) -> bool:
        """Whether the row ends with the connection's close record (the last the tap writes)."""
        frames = sorted(self.frames, key=_SEQ)
        if not frames or frames[-1].direction != "close":
            return False
        # In feed order a header exchange of the same seq comes after the frame.
        return not self.exchanges or max(e.seq for e in self.exchanges) < frames[-1].seq

    @property
    def newest_ns(self) -> int | None:
        """The newest event time among the row's frames (None: an empty row)."""
        times = [f.ts_ns for f in self.frames]
        times += [max(e.request_ts_ns, e.response_ts_ns) for e in self.exchanges]
        return max(times, default=None)

    def feed_order(self) -> Iterator[TapFrame]:
        """Every frame of the row in seq order, header exchanges made into their two frames."""
        frames = sorted(self.frames, key=_SEQ)
        if not self.exchanges:
            yield from frames
            return
        meta = self.meta
        assert meta is not None
        made = (f for ex in sorted(self.exchanges, key=_SEQ) for f in ex.frames(meta))
        yield from heapq.merge(frames, made, key=_SEQ)


_SEQ = attrgetter("seq")


@cache
def _connection_transitions() -> Transitions:
    """The union of the connection-scoped rules' transitions."""
    own = [TRANSITIONS[rule.name] for rule in _catalogue().own_rules]
    return Transitions(
        apis=frozenset().union(*(t.apis for t in own)),
        removed_versions=any(t.removed_versions for t in own),
        tag_evidence=any(t.tag_evidence for t in own),
        headers=any(t.headers for t in own),
    )


def tap_answer(frames: Sequence[TapFrame], i: int) -> TapFrame | None:
    """The answer the tap wrote in one entry with the request ``frames[i]`` (schemas 2 and 3: the two
    come next to each other in seq order with one seq and entry index), or None. Reading the pair as
    the tap wrote it is the only pairing the stateless router does; frames written alone (schema 1, a
    bound hit) are paired by the engine (``checks.engine.Monitor``)."""
    if i + 1 >= len(frames):
        return None
    request, answer = frames[i], frames[i + 1]
    if request.direction != "req" or answer.direction != RESP or answer.lone:
        return None
    sent, got = request.message, answer.message
    if (
        not isinstance(sent, Request)
        or not isinstance(got, Response)
        or request.error is not None
        or answer.error is not None
        or answer.seq != request.seq
        or answer.index != request.index
        or answer.conn != request.conn
        or got.correlation_id != sent.correlation_id
    ):
        return None
    return answer


def _plain(frame: TapFrame) -> bool:
    """A decoded frame with no tagged-field evidence, no bytes left over, no loss stamped on it."""
    message = frame.message
    return (
        message is not None
        and frame.error is None
        and frame.lost == 0
        and message.tag_extras is False
        and "_trailing" not in message.body
    )


def connection_row(frames: Sequence[TapFrame]) -> ConnectionRow:
    """One connection's frames of a batch (seq order) as its key's row: an exchange the tap wrote as
    one entry (a request and its answer with one seq and entry index) that no connection-scoped rule
    names whole becomes a ``HeaderExchange``; every other frame goes as it is, projected."""
    # An exchange is the tap's pair: its request and answer come next to each other in seq order with
    # one seq and entry index (schemas 2 and 3); schema-1 frames have a seq each and go as they are.
    wanted = _connection_transitions()
    row = ConnectionRow()
    kept = row.frames
    i, count = 0, len(frames)
    while i < count:
        frame = frames[i]
        answer = tap_answer(frames, i) if wanted.headers and frame.api_key not in wanted.apis else None
        if answer is not None and _plain(frame):
            request = frame.message
            assert isinstance(request, Request)
            if (
                answer.loss_ns == frame.loss_ns
                and answer.api_key == frame.api_key
                and answer.api_version == frame.api_version
                and answer.correlation_id == frame.correlation_id
                and (frame.api_key, frame.api_version, frame.correlation_id)
                == (request.api_key, request.api_version, request.correlation_id)
                and _plain(answer)
                and not (wanted.removed_versions and removed_in_4_0(request.api_key, request.api_version))
            ):
                meta = _meta(frame)
                if row.meta is None:
                    row.meta = meta
                if meta == row.meta and _meta(answer) == meta:
                    response = answer.message
                    assert response is not None
                    exchange = HeaderExchange(
                        frame.seq, frame.ts_ns, answer.ts_ns, request.api_key, request.api_version,
                        request.correlation_id, request.client_id, request.header_version,
                        response.header_version, frame.offset, answer.offset, frame.index, frame.loss_ns,
                    )  # fmt: skip
                    row.exchanges.append(exchange)
                    i += 2
                    continue
        kept.append(project_for_connection(frame))
        i += 1
    return row


class ConnectionShard:
    """The connection-scoped rules of one connection (ApiVersions ranges, KIP-482, Envelope trust,
    read-committed fetches), fed its frames in record order; it also notices tap gaps, decode errors
    and unpaired answers, and counts the connection's frames. It routes nothing (``Router`` does)."""

    def __init__(self, config: ChecksSettings, saved: bytes | None = None) -> None:
        self.ctx = Context(_stage_config(config))
        own_rules = _catalogue().own_rules
        if saved:
            self.monitor = Monitor.from_state(
                _unpack(saved)["monitor"], own_rules, self.ctx, in_record_order=True
            )
        else:
            self.monitor = Monitor(own_rules, self.ctx, in_record_order=True)

    def feed(self, frames: Iterable[TapFrame]) -> list[Finding]:
        """Frames of this connection, in the order the tap wrote them (seq order)."""
        findings: list[Finding] = []
        feed = self.monitor.feed
        for frame in frames:
            findings.extend(feed(frame))
        return findings

    def feed_row(self, row: ConnectionRow) -> list[Finding]:
        """The connection's row of a batch (``connection_row``): its frames and header exchanges in seq
        order, exactly as the frames they came from (``Monitor.feed_header_exchange``)."""
        if not row.exchanges:
            return self.feed(sorted(row.frames, key=_SEQ))
        meta = row.meta
        assert meta is not None
        monitor = self.monitor
        findings: list[Finding] = []
        frames: list[TapFrame | HeaderExchange] = sorted(row.frames, key=_SEQ)
        exchanges: list[TapFrame | HeaderExchange] = sorted(row.exchanges, key=_SEQ)
        for item in heapq.merge(frames, exchanges, key=_SEQ):
            if isinstance(item, TapFrame):
                findings += monitor.feed(item)
                continue
            findings += monitor.feed_header_exchange(meta, item)
        return findings

    def export(self) -> bytes:
        return _pack({"monitor": self.monitor.to_state()})


class Router:
    """Where one connection's exchanges of one micro-batch go: a *route* per (key kind, state key) of
    every keyed rule, computed by that rule's own ``keys``. Keeps nothing from one batch to the next,
    so it runs where the tap records are read (the job's ``mapInArrow``), before any shuffle.

    Stateless routing has three consequences that the single monitor shares (docs/decisions.md, "One
    stateful stage"): the first-use-only kinds (the fleet matrix) get each connection's first use of
    an (api, version) *per batch*, and the rule counts a connection once itself; a frame's connection
    is *incomplete* when the tap stamped a loss on it (``TapFrame.lost``), not by a gap seen earlier;
    and a response is paired only with a request of the same batch: the tap writes both in one record
    (schema 2), so only a request and an answer it wrote as two lone records stay unpaired."""

    def __init__(self, config: ChecksSettings) -> None:
        self.ctx = Context(_stage_config(config))
        # Only the rules that keep no state across exchanges (``Transitions.in_router``): the monitor
        # pairs what the tap wrote alone, unwraps and returns what it dispatched; the connection's own
        # key (``ConnectionShard``) reports gaps, decode errors and counts.
        self.rules = _catalogue().router_rules
        self.monitor = Monitor(
            self.rules,
            self.ctx,
            record_dispatched=True,
            track_gaps=False,
            report_frames=False,
            in_record_order=True,
        )
        self._judged = frozenset(api for rule in self.rules for api in rule.api_keys or ())
        #: What the router's own rules found in the batches routed so far.
        self.findings: list[Finding] = []
        self.routes: list[Route] = []
        #: ``id`` of each route in ``routes``: those ``route`` has not projected yet (``_projected``).
        self._unprojected: set[int] = set()
        #: "conn|corr" -> the routes its request went to whole (its answer's keys), until the answer comes.
        self.sent: dict[str, list[Route]] = {}
        #: (conn, api, version) this batch already reported to the first-use-only rules.
        self.used: set[tuple[str, int, int]] = set()
        #: Answers this router could not pair (their request came in an earlier batch: a schema-1
        #: record, or a response the tap wrote alone): the entity keys never see them.
        self.unrouted_responses = 0

    def route(self, frames: Sequence[TapFrame]) -> list[Route]:
        """The routes of one connection's frames (seq order); a router serves one batch. An exchange
        the tap wrote as one entry is routed as the tap paired it (``tap_answer``); the engine pairs
        only the frames the tap wrote alone."""
        monitor = self.monitor
        i, count = 0, len(frames)
        while i < count:
            frame = frames[i]
            answer = tap_answer(frames, i)
            if answer is not None and self._route_pair(frame, answer):
                i += 2
                continue
            i += 1
            self.findings += monitor.feed(frame)
            answered = False
            # Route what the frame dispatched (nothing a rule does changes where an exchange goes).
            for event in monitor.take_dispatched():
                answered = answered or event.hook == "on_response"
                self._observe(event)
            if not answered and frame.direction == RESP and frame.message is not None:
                self.unrouted_responses += 1
        self.findings += monitor.take_findings()
        out, self.routes = self.routes, []
        self._unprojected.clear()
        return _projected(self._summarise(out))

    def _summarise(self, routes: list[Route]) -> list[Route]:
        """``routes`` with each run of ordinary exchanges of a key whose rules accept its summary
        replaced by one summary route (``checks.summaries``), where its first route was."""
        kinds = _catalogue().kind_summaries
        by_key: dict[str, list[int]] = {}
        # Keys of kinds that take no summary: each route's kind is looked up once per key, not per route.
        unsummarised: set[str] = set()
        for i, route in enumerate(routes):
            key = route.key
            indices = by_key.get(key)
            if indices is None:
                if key in unsummarised:
                    continue
                if not kinds.get(key.partition("|")[0]):
                    unsummarised.add(key)
                    continue
                indices = by_key[key] = []
            indices.append(i)
        if not by_key:
            return routes
        config = self.ctx.config
        replaced: dict[int, Route | None] = {}
        for key, indices in by_key.items():
            kind, state_key = split_route_key(key)
            ttl_ns = int(getattr(config, KEY_TTL_FIELDS[kind]) * 1e9)
            mine = [routes[i] for i in indices]
            found = [(s, m, run) for s in sorted(kinds[kind]) for m, run in RUNS[s](state_key, mine, ttl_ns)]
            for summary_kind, members, run in found:
                # A run holds whole exchanges: the routes carrying them, in their requests' order.
                originals = [mine[m] for m in members]
                first = originals[0].frame
                summary = Summary(
                    summary_kind,
                    run,
                    partial(list, originals),
                    release_key(first),
                    max(release_key(r.frame if r.answer is None else r.answer) for r in originals),
                )
                placeholder = TapFrame(first.conn, first.seq, first.ts_ns, "summary")
                at_ns = max(r.end_ns for r in originals)
                positions = sorted(indices[m] for m in members)
                replaced[positions[0]] = Route(key, placeholder, at_ns, summary=summary)
                replaced.update(dict.fromkeys(positions[1:]))
        out: list[Route] = []
        for i, route in enumerate(routes):
            if i in replaced:
                kept = replaced[i]
                if kept is not None:
                    out.append(kept)
            else:
                out.append(route)
        return out

    def _route_pair(self, request: TapFrame, response: TapFrame) -> bool:
        """Route an exchange the tap wrote as one entry, as the engine would dispatch it (request, then
        request and answer), without holding the request for its answer. False (nothing done) where
        the engine's pairing could tell otherwise: an acks=0 Produce (complete with no answer), or a
        connection with as many requests waiting as a key keeps (its trim would drop one)."""
        sent = request.message
        assert isinstance(sent, Request) and isinstance(response.message, Response)
        if sent.api_key == ApiKey.PRODUCE and sent.body.get("Acks") == 0:
            return False
        if self.rules and (sent.api_key in self._judged or sent.api_key == ENVELOPE):
            return False  # the router's own rules judge it (or what it forwards): through the engine
        limit = self.ctx.config.max_entries_per_key
        held = self.monitor.conns.get(request.conn)
        if (held is not None and len(held.pending) >= limit) or len(self.sent) >= limit:
            return False
        incomplete = self.ctx.incomplete_conns
        if request.lost > 0:
            incomplete.add(request.conn)
        # A request of the same correlation id the engine holds would have been replaced by this one.
        self.monitor.forget_request(request.conn, sent.correlation_id)
        asked = Exchange(request, None)
        kept = self._observe_request(
            Dispatched("on_request", asked, unwrap_envelope(asked) if asked.api_key == ENVELOPE else None)
        )
        if response.lost > 0:
            incomplete.add(response.conn)
        expand_response(response.message, sent)
        ex = Exchange(request, response)
        inner = unwrap_envelope(ex) if ex.api_key == ENVELOPE else None
        self._observe_answer(ex, inner, kept, response.conn in incomplete)
        return True

    def _keys(
        self,
        ex: Exchange,
        inner: Exchange | None,
        first_use: bool,
        header_only: bool = False,
        answered: bool = False,
    ) -> dict[str, _PlanStep]:
        """Route keys of ``ex``, each with the plan step that formed it (its kind, and whether it is a
        first-use-only route: the request goes there but its response will not); ``header_only``: of
        the rules that judge a request by its header; ``answered``: of the rules whose keys the answer
        can add to (the rest keep the request's)."""
        api_key = ex.api_key
        plan = _route_plan(api_key, header_only, first_use, None, answered)
        out: dict[str, _PlanStep] = {}
        if api_key != ENVELOPE or ex.request.request is None:
            for step in plan:
                prefix = step[1]
                for key in step[0].keys(ex):
                    out[prefix + key] = step
            return out
        # An Envelope routes its own exchange and the one it forwards (``inner``), rule by rule.
        exchanges = [(ex, {id(entry[0]) for entry in plan})]
        if inner is not None:
            inner_plan = _route_plan(inner.api_key, header_only, first_use, api_key, answered)
            exchanges.append((inner, {id(entry[0]) for entry in inner_plan}))
        for step in _route_plan(None, header_only, first_use, api_key, False):
            rule, prefix = step[0], step[1]
            for exchange, wanted in exchanges:
                if id(rule) in wanted:
                    for key in rule.keys(exchange):
                        out[prefix + key] = step
        return out

    def _route(
        self,
        key: str,
        kind: str,
        frame: TapFrame,
        at_ns: int,
        incomplete: bool,
        request_only: bool = False,
        asked: Exchange | None = None,
    ) -> Route:
        """Send ``frame`` on to ``key``'s shard (of ``kind``; ``asked``: ``Route.asked``); the route sent.
        It carries the frame whole until ``route`` has summarised the batch (``_projected``)."""
        sent = Route(key, frame, at_ns, incomplete, request_only, None, asked)
        self.routes.append(sent)
        self._unprojected.add(id(sent))
        return sent

    def _observe(self, event: Dispatched) -> None:
        """An exchange the engine dispatched: the request's route keys wait in ``sent`` for its answer."""
        if event.hook == "on_response":
            ex = event.exchange
            sent_key = f"{ex.conn}|{ex.request.correlation_id}"
            self._observe_answer(
                ex, event.inner, self.sent.pop(sent_key, None), ex.conn in self.ctx.incomplete_conns
            )
            return
        paired = self._observe_request(event)
        if paired:
            ex = event.exchange
            self.sent[f"{ex.conn}|{ex.request.correlation_id}"] = paired
            self.ctx.trim(self.sent)

    def _observe_request(self, event: Dispatched) -> list[Route] | None:
        """Route a request (``on_request``) or a request known by its header (``on_header``); its routes
        whose keys its answer goes to as well (None: the answer goes nowhere the request went)."""
        hook, ex, inner = event.hook, event.exchange, event.inner
        conn = ex.conn
        incomplete = conn in self.ctx.incomplete_conns
        use = (conn, ex.api_key, ex.api_version)
        first_use = use not in self.used
        if first_use:
            self.used.add(use)
        route = self._route
        if hook == "on_header":
            # Known by its header only: the frame goes on as it came (its decode error and bytes, or
            # nothing: no body to project; the client id is read from the bytes), the keyed shard
            # judges the header and reports no decode error of its own.
            frame = replace(ex.request, message=None)
            for key, step in self._keys(ex, inner, first_use, header_only=True).items():
                route(key, step[2], frame, ex.ts_ns, incomplete, request_only=True)
            return None
        paired: list[Route] = []
        request, ts_ns = ex.request, ex.ts_ns
        for key, step in self._keys(ex, inner, first_use).items():
            first_use_only = step[3]
            sent = route(key, step[2], request, ts_ns, incomplete, first_use_only, ex)
            if not first_use_only:
                paired.append(sent)
        return paired or None

    def _observe_answer(
        self, ex: Exchange, inner: Exchange | None, kept: list[Route] | None, incomplete: bool
    ) -> None:
        """Route an answer: to the keys its request went to (``kept``: its routes), and to those the
        answer adds, each paired with its request's route there (``pairs``)."""
        response = ex.response
        if response is None:
            # acks=0: the keyed shards complete the exchange themselves, as the monitor does.
            return
        # The request's route keys stand; only the rules whose keys an answer can add to look again
        # (a request whose keys were not kept: every rule). Not a first use: no first-use-only routes
        # (those go with the request alone).
        answered = self._keys(ex, inner, first_use=False, answered=kept is not None)
        kept_keys: set[str] = set()
        for asked in kept or ():
            # The kind of a kept key: its prefix (``route_key``).
            key = asked.key
            kept_keys.add(key)
            if id(asked) in self._unprojected:
                asked.answer = response
            else:
                # Its request was routed by an earlier ``route`` call, which projected it already.
                asked.answer = project_frame(response, _catalogue().kind_rules.get(key.partition("|")[0], ()))
            asked.answer_incomplete = incomplete
        request = ex.request
        for key, step in answered.items():
            if key not in kept_keys:
                sent = self._route(key, step[2], request, response.ts_ns, incomplete)
                sent.answer = response
                sent.answer_incomplete = incomplete


def _projected(routes: list[Route]) -> list[Route]:
    """``routes`` with each route's frame and answer pruned to its key kind's projection
    (``checks.projections``): one object per frame and kind, however many keys of the kind it goes to.
    A summary's originals stay whole: they travel as their frames' bytes where those are few
    (``checks.routes.summary_entry``), and a keyed shard projects them only if it reads them
    (``projected_originals``)."""
    kind_rules = _catalogue().kind_rules
    # (id(frame), kind) -> (frame, its projection): holding each frame keeps its id its own meanwhile.
    made: dict[tuple[int, str], tuple[TapFrame, TapFrame]] = {}

    def projection(frame: TapFrame, kind: str) -> TapFrame:
        done = made.get((id(frame), kind))
        if done is None:
            done = made[(id(frame), kind)] = (frame, project_frame(frame, kind_rules.get(kind, ())))
        return done[1]

    for route in routes:
        if route.summary is not None:
            continue
        kind = route.key.partition("|")[0]
        route.frame = projection(route.frame, kind)
        if route.answer is not None:
            route.answer = projection(route.answer, kind)
    return routes


def projected_originals(summary: Summary, key: str) -> list[Route]:
    """The routes ``summary`` stands for as a keyed shard of ``key`` is fed them: each frame and answer
    projected for the key's kind (``checks.projections``), as the router projects a route it sends
    on its own (``_projected``). Copies: the routes ``summary.expand`` gives may be the router's own."""
    rules = _catalogue().kind_rules.get(split_route_key(key)[0], ())
    return [
        replace(
            r,
            frame=project_frame(r.frame, rules),
            answer=None if r.answer is None else project_frame(r.answer, rules),
            summary=None,
            asked=None,
        )
        for r in summary.expand()
    ]


class KeyedShard:
    """One route key: the rules of one key kind, one state key, frames from any connection."""

    def __init__(self, config: ChecksSettings, key: str, saved: bytes | None = None) -> None:
        kind, state_key = split_route_key(key)
        rules = _catalogue().kind_rule_objects.get(kind)
        if not rules:
            raise KeyError(f"no rule keyed by {kind!r} (route key {key!r})")
        self.ctx = Context(_stage_config(config))
        # Only some of a connection's frames come here, so its seq numbers have holes by design: gaps
        # are judged by the connection shard, which flags its routes ``incomplete``. It also reports
        # the decode errors: an undecodable request routed here is judged by its header only.
        #: Answers whose requests were fed, until event time reaches them: a heap of (release key,
        #: arrival, request, answer, whether the answer's connection was incomplete by then).
        self.answers: list[HeldAnswer] = []
        self._arrivals = 0
        if saved:
            state = _unpack(saved)
            self.monitor = Monitor.from_state(
                state["monitor"], rules, self.ctx, only_key=state_key, track_gaps=False, report_frames=False
            )
            for request, answer, incomplete in state.get("answers") or ():
                self._hold(frame_from_packed(request), frame_from_packed(answer), bool(incomplete))
        else:
            self.monitor = Monitor(rules, self.ctx, only_key=state_key, track_gaps=False, report_frames=False)
        self.key = key
        #: Summaries this shard applied, and those it fed as their routes (not state: not saved).
        self.summaries_applied = 0
        self.summaries_expanded = 0

    def feed(self, routes: Iterable[Route]) -> list[Finding]:
        """Routed frames in event-time order (the caller releases them past its watermark). A route's
        answer is released where it sorts: before the first later route, or by ``advance``."""
        findings: list[Finding] = []
        monitor = self.monitor
        for route in expand_conflicts(self._pruning_originals(routes)):
            frame = route.frame
            summary = route.summary
            start = release_key(frame) if summary is None else summary.first
            if self.answers and self.answers[0][0] < start:
                findings += self._release_answers(start, None)
            self._mark_incomplete(frame.conn, route.incomplete)
            if summary is not None:
                # Checked against the state, or fed as the routes it stands for (``checks.summaries``);
                # an answer held here that sorts inside the run is one of the routes it would skip.
                inside = bool(self.answers) and self.answers[0][0] <= summary.last
                if not inside and monitor.apply_summary(summary):
                    self.summaries_applied += 1
                else:
                    self.summaries_expanded += 1
                    findings.extend(self.feed(summary.expand()))
                continue
            if route.paired:
                findings += monitor.feed_paired(frame)
                if route.answer is not None:
                    self._hold(frame, route.answer, route.answer_incomplete)
                continue
            # A route written before exchange routes: its answer is a route of its own, paired here.
            findings += monitor.feed(frame)
            if route.request_only and frame.correlation_id is not None:
                monitor.forget_request(frame.conn, frame.correlation_id)
            # Nothing to pair on this connection: keep the key's state from growing with every
            # connection that ever touched it (close events are not routed here).
            monitor.drop_idle_connection(frame.conn)
        return findings

    def _pruning_originals(self, routes: Iterable[Route]) -> list[Route]:
        """``routes`` with each summary's originals projected to this shard's kind as they are expanded
        (the router sends them whole: ``_projected``), so a run fed as its routes is fed what those
        routes would have carried on their own."""
        out: list[Route] = []
        for route in routes:
            summary = route.summary
            if summary is not None:
                route = replace(
                    route, summary=replace(summary, expand=partial(projected_originals, summary, self.key))
                )
            out.append(route)
        return out

    def _hold(self, request: TapFrame, answer: TapFrame, incomplete: bool) -> None:
        self._arrivals += 1
        heapq.heappush(self.answers, (release_key(answer), self._arrivals, request, answer, incomplete))

    def _release_answers(self, before: tuple[int, str, int] | None, upto_ns: int | None) -> list[Finding]:
        """Release the held answers that sort before ``before`` and whose time is ``upto_ns`` or
        earlier (None: no bound), in release order."""
        answers, findings = self.answers, []
        while answers:
            order = answers[0][0]
            if (before is not None and order >= before) or (upto_ns is not None and order[0] > upto_ns):
                break
            _order, _arrival, request, answer, lost = heapq.heappop(answers)
            self._mark_incomplete(answer.conn, lost)
            findings += self.monitor.feed_paired(answer, request)
        return findings

    def _mark_incomplete(self, conn: str, lost: bool) -> None:
        """Whether the findings about ``conn`` from here on are incomplete (its route's flag)."""
        if lost:
            self.ctx.incomplete_conns.add(conn)
        else:
            self.ctx.incomplete_conns.discard(conn)

    def advance(self, now_ns: int, before: tuple[int, str, int] | None = None) -> list[Finding]:
        """Event time reached ``now_ns``: the held answers due by then that sort before ``before``
        (the first route the caller still holds back, None: none) are released, and the timers due
        fire (hanging transactions)."""
        findings = self._release_answers(before, now_ns) if self.answers else []
        return findings + self.monitor.advance(now_ns)

    def next_timer_ns(self) -> int | None:
        return min(self.ctx.timers.values(), default=None)

    def next_answer_ns(self, after_ns: int) -> int | None:
        """When the first held answer later than ``after_ns`` is due (None: none is)."""
        return min((held[0][0] for held in self.answers if held[0][0] > after_ns), default=None)

    def expires_at_ns(self) -> int:
        """When this key's state has been idle for its TTL (by key kind, as the monitor's own sweep)."""
        rule = self.monitor.rules[0]
        ttl_ns = int(getattr(self.ctx.config, KEY_TTL_FIELDS[rule.key_kind]) * 1e9)
        return max(self.monitor.last_seen.values(), default=self.monitor.max_ts) + ttl_ns

    def export(self) -> bytes:
        state: dict[str, Any] = {"monitor": self.monitor.to_state()}
        if self.answers:
            state["answers"] = [
                [frame_to_packed(request), frame_to_packed(answer), lost]
                for _order, _arrival, request, answer, lost in sorted(self.answers)
            ]
        return _pack(state)

    @property
    def empty(self) -> bool:
        """Nothing left to remember: the caller may drop this key's stored state."""
        return self.monitor.empty and not self.answers


def _pack(state: dict[str, Any]) -> bytes:
    return msgpack.packb(state, use_bin_type=True)


def _unpack(saved: bytes) -> dict[str, Any]:
    """A shard's saved state; anything else (JSON text from before format 2) is a StateFormatError."""
    fresh = "start from a fresh checkpoint (kpmon run --fresh, or the redeploy DAG's allow_fresh_start)"
    if saved[:1] == b"{":
        raise StateFormatError(f"shard state in format 1 was JSON text, this build reads bytes: {fresh}")
    try:
        state = msgpack.unpackb(saved, raw=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise StateFormatError(f"not kpmon shard state ({exc}): {fresh}") from exc
    if not isinstance(state, dict) or not isinstance(state.get("monitor"), bytes):
        raise StateFormatError(f"not kpmon shard state: {fresh}")
    return state
