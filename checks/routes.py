"""A route: one frame the router sends on to one keyed shard, with its answer, and the entry it travels as.

The router (``checks.sharding.Router``) makes routes, the keyed shard (``checks.sharding.KeyedShard``)
is fed them, and between the two, in the job, a route travels as a ``RouteEntry``: the frame packed
(``codec.taprecord.pack_frame``), its release time and its flags, and the answer the router paired it
with (packed as the frame is, with its time and seq), in a bundle (``streaming.router``)
and then in its key's held entries (``streaming.stages``). ``route_entry`` and ``summary_entry`` write
an entry, ``RouteEntry.route`` reads one; a summary's entry carries the routes it stands for, packed
as one run of their connection's frames (``codec.taprecord.pack_run``) and read only when the keyed
shard cannot apply the summary (``Summary.expand``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, NamedTuple

import cramjam
import msgpack

from checks.model import Exchange
from checks.summaries import FACTS, Summary
from codec import facts, taprecord
from codec.taprecord import TapFrame

_NS_PER_MS: Final = 1_000_000
#: How route entries are written: 1, each answer an entry of its own, which the keyed shard pairs with
#: its request; 2, an answered request's entry carries the answer (``RouteEntry.answer``) and is flagged
#: ``PAIRED``. This build reads both (a checkpoint's held entries); a build of 1 cannot read 2.
ROUTE_ENTRY_FORMAT: Final = 2
READABLE_ROUTE_ENTRY_FORMATS: Final = frozenset({1, 2})


@dataclass(init=False)
class Route:
    """One frame sent on to one keyed shard. ``__init__`` is written out for mypyc to compile, as
    ``codec.taprecord.TapFrame``'s: one or more per routed frame."""

    key: str
    frame: TapFrame
    #: Event time of the frame that sent this route (a re-sent request travels with its response):
    #: what a caller's watermark must pass before the keyed shard may see it.
    at_ns: int
    #: The tap reported losing records of the connection: the keyed shard reports its findings incomplete.
    incomplete: bool = False
    #: A request whose response this shard will never get (first-use routes of the fleet matrix).
    request_only: bool = False
    #: A summary of a run of routes (``checks.summaries``): ``frame`` is then a placeholder with the
    #: run's first connection, seq and time (where it sorts).
    summary: Summary | None = None
    #: A request the router routed whole: the exchange it formed the keys from, whose ``memo`` holds
    #: what the keys derived from the request's body, so a summary reads those instead of deriving them
    #: again from ``frame``. Never packed.
    asked: Exchange | None = field(default=None, compare=False, repr=False)
    #: The router paired this request: its answer, if this key gets one, is ``answer``, and nothing
    #: after the router looks for it. False only for routes a build before exchange routes wrote (its
    #: answers travel as routes of their own, which the keyed shard pairs).
    paired: bool = True
    #: The request's answer, pruned as ``frame`` is: released where it sorts, ``answer.ts_ns``.
    answer: TapFrame | None = None
    #: The tap reported losing records of the answer's connection by the time of the answer.
    answer_incomplete: bool = False

    def __init__(
        self,
        key: str,
        frame: TapFrame,
        at_ns: int,
        incomplete: bool = False,
        request_only: bool = False,
        summary: Summary | None = None,
        asked: Exchange | None = None,
        paired: bool = True,
        answer: TapFrame | None = None,
        answer_incomplete: bool = False,
    ) -> None:
        self.key = key
        self.frame = frame
        self.at_ns = at_ns
        self.incomplete = incomplete
        self.request_only = request_only
        self.summary = summary
        self.asked = asked
        self.paired = paired
        self.answer = answer
        self.answer_incomplete = answer_incomplete

    @property
    def end_ns(self) -> int:
        """When the last frame this route carries is released: its answer's time, or ``at_ns``."""
        answer = self.answer
        return self.at_ns if answer is None or answer.ts_ns < self.at_ns else answer.ts_ns


#: ``RouteEntry.flags``: the tap reported losing records of the frame's connection (the keyed shard's
#: findings about it are incomplete); a request whose answer this key will never get; a summary of a
#: run of routes (``checks.summaries``: ``frame`` then packs its kind, facts and original entries);
#: the router paired the request (``Route.paired``); its answer comes with it (in a summary's run, as
#: the next frame); the tap had lost records of the connection by the time of that answer.
INCOMPLETE, REQUEST_ONLY, SUMMARY, PAIRED, ANSWERED, ANSWER_INCOMPLETE = 1, 2, 4, 8, 16, 32


class RouteEntry(NamedTuple):
    """A route as the bundle carries it and the entity entry keeps it until the watermark passes
    ``at_ms`` (msgpack writes it as a list)."""

    #: Event time (ms, rounded up) of the frame that sent the route: what the watermark must pass.
    at_ms: int
    ts_ns: int
    conn: str
    seq: int
    #: The frame as ``codec.taprecord.pack_frame`` made it, pruned to the key kind's projection.
    frame: bytes
    #: ``INCOMPLETE`` | ``REQUEST_ONLY`` | ``SUMMARY`` | ``PAIRED`` | ``ANSWERED`` | ``ANSWER_INCOMPLETE``.
    flags: int
    #: The request's answer: [ts_ns, seq, the answer packed as ``frame`` is], or None.
    answer: list[Any] | None = None

    @property
    def answer_order(self) -> tuple[int, str, int] | None:
        """Where the answer sorts in release order (ts_ns, conn, seq), or None."""
        answer = self.answer
        return None if answer is None else (answer[0], self.conn, answer[1])

    def route(self, key: str) -> Route:
        if self.flags & SUMMARY:
            kind, values, originals, *span = msgpack.unpackb(self.frame, raw=False)
            if span:
                first, last = (_release_key(s) for s in span)
                expand = partial(_compressed_routes_of, originals, key)
            else:
                # An entry written before the originals were compressed (a checkpoint's held entries).
                entries = [RouteEntry(*o) for o in originals]
                first = (entries[0].ts_ns, entries[0].conn, entries[0].seq)
                last = (entries[-1].ts_ns, entries[-1].conn, entries[-1].seq)
                expand = partial(_routes_of, entries, key)
            summary = Summary(kind, FACTS[kind].from_list(values), expand, first, last)
            placeholder = TapFrame(self.conn, self.seq, self.ts_ns, "summary")
            return Route(key, placeholder, self.at_ms * _NS_PER_MS, summary=summary)
        answer = self.answer
        return _plain_route(
            key,
            taprecord.unpack_frame(self.frame),
            self.at_ms,
            self.flags,
            None if answer is None else taprecord.unpack_frame(answer[2]),
        )


def _plain_route(key: str, frame: TapFrame, at_ms: int, flags: int, answer: TapFrame | None) -> Route:
    """A route that is not a summary, from what its entry keeps of it."""
    return Route(
        key,
        frame,
        at_ms * _NS_PER_MS,
        bool(flags & INCOMPLETE),
        bool(flags & REQUEST_ONLY),
        None,
        None,
        bool(flags & PAIRED),
        answer,
        bool(flags & ANSWER_INCOMPLETE),
    )


def _routes_of(entries: list[RouteEntry], key: str) -> list[Route]:
    return [entry.route(key) for entry in entries]


def _compressed_routes_of(originals: bytes, key: str) -> list[Route]:
    values = facts.unpack_values(bytes(cramjam.lz4.decompress_block(originals)))
    run = taprecord.run_of(values)
    if run is None:
        # Entries each packing its frame: a summary written by a build before runs (held in a checkpoint).
        return _routes_of([RouteEntry(*o) for o in values], key)
    frames, heads = run
    routes: list[Route] = []
    i = 0
    while i < len(frames):
        at_ms, flags = heads[i]
        # An answered request's answer is the run's next frame (``summary_entry``).
        answer = frames[i + 1] if flags & ANSWERED else None
        routes.append(_plain_route(key, frames[i], at_ms, flags, answer))
        i += 2 if answer is not None else 1
    return routes


def _release_key(values: list[Any]) -> tuple[int, str, int]:
    ts_ns, conn, seq = values
    return (int(ts_ns), str(conn), int(seq))


def route_entry(route: Route, frame: bytes, answer: bytes | None = None) -> RouteEntry:
    """``route`` as its entry, its frame and its answer (``route.answer``) already packed
    (``codec.taprecord.pack_frame``: once per projected frame)."""
    f = route.frame
    got = route.answer
    answered = None if got is None or answer is None else [got.ts_ns, got.seq, answer]
    return RouteEntry(_release_ms(route), f.ts_ns, f.conn, f.seq, frame, _flags(route), answered)


def _release_ms(route: Route) -> int:
    """``route.at_ns`` in ms, rounded up: a watermark that passes it passes the whole release time."""
    return -(-route.at_ns // _NS_PER_MS)


def _flags(route: Route) -> int:
    return (
        (INCOMPLETE if route.incomplete else 0)
        | (REQUEST_ONLY if route.request_only else 0)
        | (PAIRED if route.paired else 0)
        | (ANSWERED if route.answer is not None else 0)
        | (ANSWER_INCOMPLETE if route.answer_incomplete else 0)
    )


def summary_entry(route: Route, originals: list[Route]) -> RouteEntry:
    """A summary route (``checks.summaries``) as its entry, with ``originals``: the routes it stands for
    (``route.summary.expand()``)."""
    summary = route.summary
    assert summary is not None
    # The originals are most of a bundle's bytes and are read only when the shard cannot apply the
    # summary: their frames (one connection's, whole: the shard projects them if it reads them) packed
    # as one run, the connection's fields once and each frame's bytes (or, where those are many, its
    # message's facts) inside the run, then compressed (LZ4 block), with the run's span beside them so
    # an applied summary never reads them at all.
    # An answered request's answer follows it in the run, with no head of its own to keep.
    heads: list[list[int]] = []
    frames: list[TapFrame] = []
    for r in originals:
        heads.append([_release_ms(r), _flags(r)])
        frames.append(r.frame)
        if r.answer is not None:
            heads.append([])
            frames.append(r.answer)
    run = taprecord.pack_run(frames, heads)
    if run is None:
        run = facts.packb([packed_entry(r) for r in originals])
    blob = bytes(cramjam.lz4.compress_block(run))
    data = facts.packb([summary.kind, summary.facts.to_list(), blob, list(summary.first), list(summary.last)])
    f = route.frame
    return RouteEntry(_release_ms(route), f.ts_ns, f.conn, f.seq, data, SUMMARY)


def packed_entry(route: Route) -> RouteEntry:
    """``route`` as its entry, packing its frames here (a summary's originals that make no run; the
    router packs each projected frame once for all its routes instead)."""
    answer = route.answer
    return route_entry(
        route, taprecord.pack_frame(route.frame), None if answer is None else taprecord.pack_frame(answer)
    )
