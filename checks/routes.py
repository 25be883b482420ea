"""A route: one frame the router sends on to one keyed shard, and the entry it travels as.

The router (``checks.sharding.Router``) makes routes, the keyed shard (``checks.sharding.KeyedShard``)
is fed them, and between the two, in the job, a route travels as a ``RouteEntry``: the frame packed
(``codec.taprecord.pack_frame``), its release time and its flags, in a bundle (``streaming.router``)
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
    #: again from ``frame``'s projected copy (which keeps every field they read). Never packed.
    asked: Exchange | None = field(default=None, compare=False, repr=False)

    def __init__(
        self,
        key: str,
        frame: TapFrame,
        at_ns: int,
        incomplete: bool = False,
        request_only: bool = False,
        summary: Summary | None = None,
        asked: Exchange | None = None,
    ) -> None:
        self.key = key
        self.frame = frame
        self.at_ns = at_ns
        self.incomplete = incomplete
        self.request_only = request_only
        self.summary = summary
        self.asked = asked


#: ``RouteEntry.flags``: the tap reported losing records of the frame's connection (the keyed shard's
#: findings about it are incomplete); a request whose answer this key will never get; a summary of a
#: run of routes (``checks.summaries``: ``frame`` then packs its kind, facts and original entries).
INCOMPLETE, REQUEST_ONLY, SUMMARY = 1, 2, 4


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
    #: ``INCOMPLETE`` | ``REQUEST_ONLY`` | ``SUMMARY``.
    flags: int

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
        return _plain_route(key, taprecord.unpack_frame(self.frame), self.at_ms, self.flags)


def _plain_route(key: str, frame: TapFrame, at_ms: int, flags: int) -> Route:
    """A route that is not a summary, from what its entry keeps of it."""
    return Route(key, frame, at_ms * _NS_PER_MS, bool(flags & INCOMPLETE), bool(flags & REQUEST_ONLY))


def _routes_of(entries: list[RouteEntry], key: str) -> list[Route]:
    return [entry.route(key) for entry in entries]


def _compressed_routes_of(originals: bytes, key: str) -> list[Route]:
    values = facts.unpack_values(bytes(cramjam.lz4.decompress_block(originals)))
    run = taprecord.run_of(values)
    if run is None:
        # Entries each packing its frame: a summary written by a build before runs (held in a checkpoint).
        return _routes_of([RouteEntry(*o) for o in values], key)
    frames, heads = run
    return [
        _plain_route(key, frame, at_ms, flags) for frame, (at_ms, flags) in zip(frames, heads, strict=True)
    ]


def _release_key(values: list[Any]) -> tuple[int, str, int]:
    ts_ns, conn, seq = values
    return (int(ts_ns), str(conn), int(seq))


def route_entry(route: Route, frame: bytes) -> RouteEntry:
    """``route`` as its entry, its frame already packed (``codec.taprecord.pack_frame``: once per
    projected frame)."""
    f = route.frame
    return RouteEntry(_release_ms(route), f.ts_ns, f.conn, f.seq, frame, _flags(route))


def _release_ms(route: Route) -> int:
    """``route.at_ns`` in ms, rounded up: a watermark that passes it passes the whole release time."""
    return -(-route.at_ns // _NS_PER_MS)


def _flags(route: Route) -> int:
    return (INCOMPLETE if route.incomplete else 0) | (REQUEST_ONLY if route.request_only else 0)


def summary_entry(route: Route, originals: list[Route]) -> RouteEntry:
    """A summary route (``checks.summaries``) as its entry, with ``originals``: the routes it stands for
    (``route.summary.expand()``)."""
    summary = route.summary
    assert summary is not None
    # The originals are most of a bundle's bytes and are read only when the shard cannot apply the
    # summary: their frames (one connection's) packed as one run, the connection's fields once and
    # each message's facts inside the run rather than packed on their own, then compressed (LZ4 block),
    # with the run's span beside them so an applied summary never reads them at all.
    heads = [[_release_ms(r), _flags(r)] for r in originals]
    run = taprecord.pack_run([r.frame for r in originals], heads)
    if run is None:
        run = facts.packb([route_entry(r, taprecord.pack_frame(r.frame)) for r in originals])
    blob = bytes(cramjam.lz4.compress_block(run))
    data = facts.packb([summary.kind, summary.facts.to_list(), blob, list(summary.first), list(summary.last)])
    f = route.frame
    return RouteEntry(_release_ms(route), f.ts_ns, f.conn, f.seq, data, SUMMARY)
