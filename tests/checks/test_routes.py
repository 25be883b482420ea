"""A route's entry (``checks.routes``) reads back as the route it was written from: a summary's entry
with its span and the routes it stands for, packed as one run and compressed, and a summary's entry in
the layouts a checkpoint's held entries may still have (its originals as entries, listed or compressed)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import cramjam

from checks.routes import SUMMARY, Route, RouteEntry, route_entry
from checks.sharding import Router
from codec import facts
from codec.taprecord import pack_frame, pack_run
from tests.checks.exchanges import as_built_before, entry_of, exchange_records, flatten
from tests.checks.test_summaries import CONFIG, traffic


def _summary_route() -> Route:
    records = exchange_records(traffic(["next"] * 6 + ["pipeline"] * 3 + ["next"] * 4, [1, 2]))
    routes = Router(CONFIG).route(flatten(records))
    return next(r for r in routes if r.summary is not None)


def _packed(routes: list[Route]) -> list[tuple[Any, ...]]:
    return [
        (
            r.key,
            pack_frame(r.frame),
            r.at_ns,
            r.incomplete,
            r.request_only,
            r.paired,
            r.answer and pack_frame(r.answer),
            r.answer_incomplete,
        )
        for r in routes
    ]


def _assert_reads_as(read: Route, route: Route, originals: list[Route] | None = None) -> None:
    assert read.summary is not None and route.summary is not None
    assert (read.key, read.at_ns, read.frame.conn, read.frame.seq, read.frame.ts_ns) == (
        route.key,
        route.at_ns,
        route.frame.conn,
        route.frame.seq,
        route.frame.ts_ns,
    )
    assert (read.summary.kind, read.summary.first, read.summary.last) == (
        route.summary.kind,
        route.summary.first,
        route.summary.last,
    )
    assert read.summary.facts.to_list() == route.summary.facts.to_list()
    expected = route.summary.expand() if originals is None else originals
    assert _packed(read.summary.expand()) == _packed(expected)


def test_a_summary_entry_reads_back_as_its_summary_and_the_routes_it_stands_for() -> None:
    route = _summary_route()
    assert route.summary is not None and len(route.summary.expand()) == 19
    assert all(r.answer is not None and r.paired for r in route.summary.expand())
    _assert_reads_as(entry_of(route).route(route.key), route)


def test_summary_entries_in_the_layouts_of_builds_before_still_read() -> None:
    """Held entries in a checkpoint: a summary's originals as entries each packing its frame, in a plain
    list (before they were compressed) or compressed (before they were one run), each answer an entry
    of its own (before exchange routes)."""
    route = _summary_route()
    summary = route.summary
    assert summary is not None
    before = as_built_before(summary.expand())
    originals = [route_entry(r, pack_frame(r.frame)) for r in before]
    new = entry_of(route)
    span = [list(summary.first), list(summary.last)]
    compressed = facts.packb(
        [
            summary.kind,
            summary.facts.to_list(),
            bytes(cramjam.lz4.compress_block(facts.packb(originals))),
            *span,
        ]
    )
    listed = facts.packb([summary.kind, summary.facts.to_list(), originals])
    for layout in (compressed, listed):
        old = new._replace(frame=layout)
        assert old.flags == SUMMARY
        _assert_reads_as(RouteEntry(*old[:6]).route(route.key), route, before)
    # What the run is for: the connection's fields once, and no facts packed twice.
    assert len(new.frame) < len(compressed) * 0.9
    assert len(new.frame) * 3 < len(listed)


def test_a_summary_of_frames_of_different_connections_packs_each_frame() -> None:
    """``pack_run`` takes frames that share their connection's fields: others go as entries."""
    route = _summary_route()
    summary = route.summary
    assert summary is not None
    originals = summary.expand()
    originals[-1].frame = replace(originals[-1].frame, broker="10.9.9.9:9092")
    assert pack_run([r.frame for r in originals], [[0, 0]] * len(originals)) is None
    mixed = replace(route, summary=replace(summary, expand=lambda: originals))
    read = entry_of(mixed).route(route.key)
    _assert_reads_as(read, mixed)
    assert read.summary is not None and read.summary.expand()[-1].frame.broker == "10.9.9.9:9092"


def test_each_original_keeps_its_release_time_and_flags() -> None:
    """An original route's own ``at_ns`` (rounded up to the ms, as every entry keeps it), ``incomplete``
    and ``request_only`` travel with it in the summary's run."""
    route = _summary_route()
    summary = route.summary
    assert summary is not None
    originals = summary.expand()
    for i, original in enumerate(originals):
        original.at_ns += i * 1_000_000
        original.incomplete, original.request_only = i % 2 == 1, i % 3 == 1
        original.answer_incomplete = i % 4 == 1
    flagged = replace(route, summary=replace(summary, expand=lambda: originals))
    read = entry_of(flagged).route(route.key)
    _assert_reads_as(read, flagged)
    assert read.summary is not None
    expanded = read.summary.expand()
    assert [(r.incomplete, r.request_only, r.answer_incomplete) for r in expanded] == [
        (i % 2 == 1, i % 3 == 1, i % 4 == 1) for i in range(len(originals))
    ]
    assert [r.at_ns for r in expanded] == [-(-r.at_ns // 1_000_000) * 1_000_000 for r in originals]
