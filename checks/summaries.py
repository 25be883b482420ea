"""Exact summaries of runs of ordinary exchanges: what the router sends an entity key instead of them.

Most of an entity key's exchanges change nothing a rule could report on: an idempotent producer's
next Produce continues its sequence, is answered without error at the epoch already known, and only
moves the stream's ``next``, its acknowledged window and the touch times. The router
(``checks.sharding.Router``) collapses each *run* of such exchanges of one connection and one batch
into one summary route (``Summary``): the facts the rules need to end in the state those exchanges
would have left, plus the original routes to fall back on. The exchanges are the routes that carry
their answers (the router paired them as it routed them): a run pairs nothing itself, and holds each
of its exchanges whole. A rule accepts a summary kind by declaring it
(``checks.projections.Transitions.summaries``); a key kind gets a summary kind only when every rule of
it that looks at the summarised API does (``checks.projections.SUMMARY_APIS``).

The router cannot see other connections or earlier batches, so a summary is *checked* where it is
applied (``checks.engine.Monitor.apply_summary``, in the keyed shard): the key's state must be what the run was built on
(the stream's ``next`` is the run's first base sequence or the stream is new and fits the state's
bound, the epoch known is the run's, nothing it acknowledged overlaps the run, ...: each rule's
``summary_applies``), and no other route of the key
may fall inside the run's span in release order (``expand_conflicts``). Otherwise the keyed shard
feeds the original routes, so the findings and the state are the same either way, always.

Runs (``produce_runs``): per producer-id key, the Produce exchanges of one connection in a batch
whose batches for that producer id all continue their stream contiguously from an earlier exchange of
the same batch (a stream's first batch in the batch is taken to continue the key's state, or to start
the stream, and the keyed shard checks which), answered without error, one epoch, client id and
transactional id; in release order, a run is a stretch of such exchanges' routes with no other route
of the key between, each exchange wholly inside it (pipelined requests), consecutive frames closer
than the key's TTL. Runs of a group member's steady heartbeats (``heartbeat_runs``: answered without
error at the positive epoch sent, no assignor asked for) touch only answer times and the member's
place among those kept.

A caller holding routes until its watermark passes them holds a summary until its last route's time,
and with it every route of the key that sorts after its first, and every summary whose run may end
after that (``split_held``, which ``streaming.stages.keyed_step`` calls): the shard then sees together
whatever could fall inside the run.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

from checks.codes import PRODUCE
from checks.model import Exchange
from checks.projections import HEARTBEAT_RUN, PRODUCE_RUN, SUMMARY_APIS
from checks.rules.groups import JOIN_EPOCH
from checks.rules.producers import (
    ACKED_WINDOW,
    SEQ_HALF,
    SEQ_MOD,
    produce_answers,
    produce_batches,
    seq_add,
    seq_ahead,
)
from codec.taprecord import REQ, TapFrame

_E = TypeVar("_E")


def split_held(
    held: Sequence[_E],
    orders: Sequence[Any],
    due: Sequence[bool],
    summaries: Sequence[bool],
    release_ns: Sequence[int],
    answers: Sequence[Any] | None = None,
) -> tuple[list[_E], list[_E]]:
    """One key's held routes: those that go now, in release order, and those that wait, as held.
    Per route, in ``held``'s order: its release order, whether its caller's watermark passed it,
    whether it is a summary, its release time (ns) and where its answer sorts (``answers``; None: it
    carries none): plain values, so the stage and the tests' drivers call this alike.

    A route goes when it is due and ends before every summary still waiting starts: a later route may
    fall inside that summary's run. A frame ends where it sorts, a route with its answer where the
    answer sorts; a summary's run ends at its release time at the latest. A due summary waits too while
    a route that is not due sorts inside its run (a request sent again is released with its answer,
    after the requests around it), and then holds what sorts after its start as any waiting summary
    does."""
    if answers is None:
        answers = [None] * len(held)
    # (at + 1, "", 0): no route released at ``at`` sorts after it.
    ends = [
        (at + 1, "", 0) if s else (o if a is None else a)
        for o, s, at, a in zip(orders, summaries, release_ns, answers, strict=True)
    ]
    pending = [o for o, d in zip(orders, due, strict=True) if not d]
    waits = [
        not d or (s and any(o < p < end for p in pending))
        for o, d, s, end in zip(orders, due, summaries, ends, strict=True)
    ]
    hold = min((o for o, w, s in zip(orders, waits, summaries, strict=True) if s and w), default=None)
    # A due summary whose run reaches past a waiting summary's start waits, and its own start then
    # holds what sorts after it: until no more summaries wait.
    while hold is not None:
        newly = [
            i
            for i, (w, s, end) in enumerate(zip(waits, summaries, ends, strict=True))
            if s and not w and not end < hold
        ]
        if not newly:
            break
        for i in newly:
            waits[i] = True
        hold = min(hold, *(orders[i] for i in newly))
    going = sorted(
        (o, i)
        for i, (o, w, end) in enumerate(zip(orders, waits, ends, strict=True))
        if not w and (hold is None or end < hold)
    )
    picked = {i for _, i in going}
    return [held[i] for _, i in going], [entry for i, entry in enumerate(held) if i not in picked]


@dataclass
class ProduceRun:
    """What a run of ordinary Produce exchanges of one producer id did to its state."""

    conn: str
    #: The client's identity as ``txn_pid`` keeps it (client host and client id).
    client: str
    #: The requests' transactional id (None for an idempotent producer).
    txn: str | None
    epoch: int
    #: Per stream the run wrote: [topic, partition, first base sequence, next sequence after the run,
    #: time of the run's last request to it, the acknowledged batches it added (the last
    #: ``ACKED_WINDOW``, each [base, count, base offset])].
    streams: list[list[Any]]
    #: The requests' correlation ids (a decision pending under one would be taken by the run).
    corrs: list[int]
    #: Release times (ns) of the run's frames, ascending: the engine's sweep and touch times.
    times: list[int]
    #: The most requests of the run waiting for their answers at once.
    open_most: int

    def to_list(self) -> list[Any]:
        return [
            self.conn,
            self.client,
            self.txn,
            self.epoch,
            self.streams,
            self.corrs,
            self.times,
            self.open_most,
        ]

    @classmethod
    def from_list(cls, values: Sequence[Any]) -> ProduceRun:
        return cls(*values)


@dataclass
class HeartbeatRun:
    """What a run of one group member's steady heartbeats (answered without error at the epoch it
    sent, with no assignor asked for) did to its group's state: only touch times and its place among
    the members kept (newest last)."""

    conn: str
    #: The heartbeat's API (KIP-848, KIP-932 or KIP-1071).
    api: int
    member: str
    epoch: int
    corrs: list[int]
    times: list[int]
    open_most: int

    def to_list(self) -> list[Any]:
        return [self.conn, self.api, self.member, self.epoch, self.corrs, self.times, self.open_most]

    @classmethod
    def from_list(cls, values: Sequence[Any]) -> HeartbeatRun:
        return cls(*values)


#: Summary kind -> its facts' class.
FACTS: Final[dict[str, type[ProduceRun] | type[HeartbeatRun]]] = {
    PRODUCE_RUN: ProduceRun,
    HEARTBEAT_RUN: HeartbeatRun,
}


@dataclass
class Summary:
    """A summary route's content: its kind, its facts, and the routes it stands for (``expand``: made
    on demand, as the stage keeps them packed), their frames whole, as the router decoded them: the
    keyed shard projects them for its kind if it feeds them (``checks.sharding.projected_originals``)."""

    kind: str
    facts: ProduceRun | HeartbeatRun
    expand: Callable[[], list[Any]]
    #: (ts_ns, conn, seq) of the run's first and last route in release order: its span.
    first: tuple[int, str, int]
    last: tuple[int, str, int]


def release_key(frame: TapFrame) -> tuple[int, str, int]:
    """The order a keyed shard is fed in (as the single monitor releases frames)."""
    return (frame.ts_ns, frame.conn, frame.seq)


#: A batch of a run for its producer id: topic, partition, base sequence, record count (at least 1),
#: base offset (-1 but for a partition's first batch: the answer gives only that one's).
_Batch = tuple[str, int, int, int, int]
#: (epoch, client id, transactional id): what every exchange of one run shares.
_Signature = tuple[int, str, str | None]


class _RequestRoute(Protocol):
    """What ``_ordinary`` reads of a request's route (``checks.routes.Route``, whose module imports this one)."""

    frame: TapFrame
    asked: Exchange | None


def _ordinary(
    pid: int, request: _RequestRoute, response: TapFrame, ends: dict[tuple[int, str, int], int]
) -> tuple[_Signature, list[_Batch]] | None:
    """The signature and batches of a Produce exchange (its request's route, and its response) that
    only continues its streams (None: an exchange the key must get whole). ``ends``: each stream's end
    after the requests before this one in the batch, updated as the rule updates ``next``."""
    ex = Exchange(request.frame, response)
    if ex.api_key != PRODUCE or ex.req.body.get("Acks") == 0 or ex.resp is None:
        return None
    answers = produce_answers(ex)
    # The router's own walk of the request where it made one for the keys (``Route.asked``).
    walked = ex if request.asked is None else request.asked
    ok = True
    epochs: set[int] = set()
    batches: list[_Batch] = []
    for topic, partition, index, _batch, batch_pid, epoch, base, count in produce_batches(walked):
        if batch_pid != pid:
            continue
        epochs.add(epoch)
        count = max(count, 1)
        if base < 0 or epoch < 0:
            ok = False
            continue
        skey = (epoch, topic, partition)
        expected = ends.get(skey)
        end = seq_add(base, count)
        # A stream's first batch in the batch continues what the key's state expects, or starts the
        # stream: the keyed shard checks which (``Rule.summary_applies``).
        if (expected is not None and base != expected) or count >= SEQ_HALF:
            ok = False
        if expected is None or seq_ahead(end, expected) > 0:
            ends[skey] = end
        answer = answers.get((topic, partition))
        if answer is None or int(answer.get("ErrorCode", 0)) != 0:
            ok = False
            continue
        batches.append(
            (topic, partition, base, count, int(answer.get("BaseOffset", -1)) if index == 0 else -1)
        )
    if not ok or len(epochs) != 1:
        return None
    txn = ex.req.body.get("TransactionalId")
    return (epochs.pop(), ex.req.client_id or "", txn if isinstance(txn, str) and txn else None), batches


class _Carried:
    """The frames one key's routes carry (an answered request's route carries its answer too), each
    with the route carrying it, and the exchanges among them (frame indices: request, answer): the
    answered routes whose connection lost no records by then."""

    def __init__(self, routes: Sequence[Any]) -> None:
        self.frames: list[TapFrame] = []
        self.carrier: list[int] = []
        self.exchanges: list[tuple[int, int]] = []
        for i, route in enumerate(routes):
            self.frames.append(route.frame)
            self.carrier.append(i)
            answer = route.answer
            if answer is not None:
                self.frames.append(answer)
                self.carrier.append(i)
                if not (route.incomplete or route.answer_incomplete):
                    self.exchanges.append((len(self.frames) - 2, len(self.frames) - 1))

    def routes_of(self, members: list[int]) -> list[int]:
        """The routes carrying ``members`` (frame indices, release order), in their requests' order."""
        return list(dict.fromkeys(self.carrier[m] for m in members))


def _segments(
    frames: Sequence[TapFrame], pairs: list[tuple[int, int]], signature: dict[int, Any]
) -> list[list[int]]:
    """The runs among ``frames``: stretches, in release order, of the frames of candidate exchanges
    (``pairs`` whose indices ``signature`` maps to what the exchanges of one run share) with one
    signature and no other frame between, each exchange wholly inside one."""
    exchange_of: dict[int, tuple[int, int]] = {}
    for pair in pairs:
        if pair[0] in signature:
            exchange_of[pair[0]] = exchange_of[pair[1]] = pair
    order = sorted(range(len(frames)), key=lambda i: release_key(frames[i]))
    while True:
        segment_of: dict[int, int] = {}
        segment, last_sig = 0, None
        for i in order:
            sig = signature.get(i)
            if sig is None:
                segment, last_sig = segment + 1, None
                continue
            if sig != last_sig:
                segment, last_sig = segment + 1, sig
            segment_of[i] = segment
        # An exchange split by another route is no part of a run (its routes go whole).
        split = {ex for ex in set(exchange_of.values()) if len({segment_of[i] for i in ex}) > 1}
        if not split:
            break
        for ex in split:
            for i in ex:
                signature.pop(i, None)
                exchange_of.pop(i, None)
    members = [i for i in order if i in segment_of]
    return [list(group) for _, group in itertools.groupby(members, key=segment_of.__getitem__)]


def produce_runs(pid: str, routes: Sequence[Any], ttl_ns: int) -> list[tuple[list[int], ProduceRun]]:
    """The runs among one connection's ``routes`` (``checks.routes.Route``s, routing order) to the
    producer-id key ``pid``, made of the exchanges the routes carry whole (a request with its answer,
    as the router paired them): per run the indices of its routes (their requests' release order) and
    its summary."""
    key_pid = int(pid)
    carried = _Carried(routes)
    frames = carried.frames
    ends: dict[tuple[int, str, int], int] = {}
    signature: dict[int, _Signature] = {}  # frame index -> its exchange's signature
    batches: dict[int, list[_Batch]] = {}  # frame index -> its exchange's batches
    for req, resp in carried.exchanges:
        found = _ordinary(key_pid, routes[carried.carrier[req]], frames[resp], ends)
        if found is not None:
            signature[req] = signature[resp] = found[0]
            batches[req] = batches[resp] = found[1]
    runs: list[tuple[list[int], ProduceRun]] = []
    for members in _segments(frames, carried.exchanges, signature) if signature else []:
        run = _run_facts(
            [frames[i] for i in members], [batches[i] for i in members], signature[members[0]], ttl_ns
        )
        if run is not None:
            runs.append((carried.routes_of(members), run))
    return runs


def _run_facts(
    frames: list[TapFrame], batches: list[list[_Batch]], signature: _Signature, ttl_ns: int
) -> ProduceRun | None:
    """The summary of a run's frames (release order) and their exchanges' batches; None when the
    engine would sweep within it."""
    timing = _timing(frames, ttl_ns)
    if timing is None:
        return None
    streams: dict[tuple[str, int], list[Any]] = {}
    for frame, sent in zip(frames, batches, strict=True):
        for topic, partition, base, count, offset in sent:
            stream = streams.get((topic, partition))
            if frame.direction == REQ:
                if stream is None:
                    stream = streams[(topic, partition)] = [topic, partition, base, base, 0, []]
                stream[3], stream[4] = seq_add(base, count), frame.ts_ns
                continue
            assert stream is not None
            acked: list[list[int]] = stream[5]
            acked.append([base, count, offset])
            del acked[:-ACKED_WINDOW]
    if any((stream[3] - stream[2]) % SEQ_MOD >= SEQ_HALF for stream in streams.values()):
        return None  # half the sequence space in one run: "ahead" and "behind" would blur
    epoch, client_id, txn = signature
    first = frames[0]
    client = f"{first.client_host}|{client_id}"
    return ProduceRun(first.conn, client, txn, epoch, list(streams.values()), *timing)


def _timing(frames: list[TapFrame], ttl_ns: int) -> tuple[list[int], list[int], int] | None:
    """A run's correlation ids, release times and most requests open at once; None when two of its
    frames lie further apart than the key's TTL (the engine's sweep would drop the key between)."""
    times = [f.ts_ns for f in frames]
    if any(b - a > ttl_ns for a, b in itertools.pairwise(times)):
        return None
    corrs: list[int] = []
    open_now = open_most = 0
    for frame in frames:
        if frame.direction == REQ:
            assert frame.correlation_id is not None
            corrs.append(frame.correlation_id)
            open_now += 1
            open_most = max(open_most, open_now)
        else:
            open_now -= 1
    return corrs, times, open_most


def _steady(request: TapFrame, response: TapFrame) -> tuple[int, str, int] | None:
    """(API, member id, epoch) of a heartbeat that only touches its group's state: a member's, at a
    positive epoch the answer repeats without error, asking for no assignor (None otherwise)."""
    ex = Exchange(request, response)
    resp = ex.resp
    if ex.api_key not in SUMMARY_APIS[HEARTBEAT_RUN] or resp is None:
        return None
    body, answer = ex.req.body, resp.body
    member = str(body.get("MemberId") or "")
    epoch = body.get("MemberEpoch")
    if (
        not member
        or not isinstance(epoch, int)
        or epoch <= JOIN_EPOCH
        or body.get("ServerAssignor")
        or answer.get("ErrorCode", 0) != 0
        or answer.get("MemberEpoch") != epoch
        or answer.get("MemberId") not in (None, "", member)
    ):
        return None
    return (ex.api_key, member, epoch)


def heartbeat_runs(group: str, routes: Sequence[Any], ttl_ns: int) -> list[tuple[list[int], HeartbeatRun]]:
    """``produce_runs`` for the steady heartbeats of one member to the group key ``group``."""
    carried = _Carried(routes)
    frames = carried.frames
    signature: dict[int, tuple[int, str, int]] = {}
    for req, resp in carried.exchanges:
        found = _steady(frames[req], frames[resp])
        if found is not None:
            signature[req] = signature[resp] = found
    runs: list[tuple[list[int], HeartbeatRun]] = []
    for members in _segments(frames, carried.exchanges, signature) if signature else []:
        run_frames = [frames[i] for i in members]
        timing = _timing(run_frames, ttl_ns)
        if timing is not None:
            api, member, epoch = signature[members[0]]
            run = HeartbeatRun(run_frames[0].conn, api, member, epoch, *timing)
            runs.append((carried.routes_of(members), run))
    return runs


#: Summary kind -> how the router finds its runs among one connection's routes to one key (the key's
#: state key, its routes, the key kind's TTL).
RUNS: Final[dict[str, Callable[[str, Sequence[Any], int], list[tuple[list[int], Any]]]]] = {
    PRODUCE_RUN: produce_runs,
    HEARTBEAT_RUN: heartbeat_runs,
}


def expand_conflicts(routes: Iterable[Any]) -> list[Any]:
    """``routes`` (release order) with every summary that another route falls inside replaced by the
    routes it stands for: applied whole, it would be out of order with that route (with its request,
    or with the answer it carries)."""
    out = list(routes)
    spans = [(r.summary.first, r.summary.last, i) for i, r in enumerate(out) if r.summary is not None]
    if not spans:
        return out
    keys = [r.summary.first if r.summary is not None else release_key(r.frame) for r in out]
    answers = [None if r.summary is not None or r.answer is None else release_key(r.answer) for r in out]
    expand: set[int] = set()
    for first, last, i in spans:
        for j, route in enumerate(out):
            if j == i:
                continue
            other = route.summary
            if other is not None:
                inside = other.first <= last and first <= other.last
            else:
                answer = answers[j]
                inside = first <= keys[j] <= last or (answer is not None and first <= answer <= last)
            if inside:
                expand.add(i)
                break
    if not expand:
        return out
    flat: list[Any] = []
    for i, route in enumerate(out):
        flat.extend(route.summary.expand() if i in expand else [route])
    flat.sort(key=lambda r: r.summary.first if r.summary is not None else release_key(r.frame))
    return flat
