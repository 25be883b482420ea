"""Frames as the tap writes them (tap-record schema 2): a request and its response in one record.

The tap holds a request until its response has been forwarded, then writes both as one record, at the
response's place in the connection's stream, numbered by one ``seq`` (``tap/framing.py``). A request
that is never answered goes alone. A gap the test data made in a connection's numbering (a lost
record) stays a gap of the same size.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from checks.routes import Route, RouteEntry, packed_entry, summary_entry
from checks.summaries import release_key, split_held
from codec.taprecord import CLOSE, REQ, RESP, TapFrame


def exchange_records(frames: list[TapFrame]) -> list[list[TapFrame]]:
    """``frames`` (in the order the tap saw them) as tap records, in the order the tap writes them.

    As ``tap/framing.py``'s ``Correlations`` pairs them: a connection's requests are held in order; a
    response takes the first held request with its correlation id, and the requests held before that
    one are orphans (a broker answers in order), written alone first; a response with no held request
    is written alone, marked ``lone``; requests still held at the connection's close or at the end are
    written alone (at a close, before it)."""
    records: list[list[TapFrame]] = []
    held: dict[str, list[TapFrame]] = {}
    for frame in frames:
        queue = held.setdefault(frame.conn, [])
        if frame.direction == REQ:
            queue.append(frame)
            continue
        if frame.direction != RESP:
            if frame.direction == CLOSE:
                # The tap writes the requests still held alone, before the close record.
                records.extend([request] for request in queue)
                queue.clear()
            records.append([frame])
            continue
        match = next((i for i, r in enumerate(queue) if r.correlation_id == frame.correlation_id), None)
        if match is None:
            records.append([replace(frame, lone=True)])
            continue
        records.extend([orphan] for orphan in queue[:match])
        records.append([queue[match], frame])
        del queue[: match + 1]
    for queue in held.values():
        records.extend([request] for request in queue)
    return _numbered(records)


def _numbered(records: list[list[TapFrame]]) -> list[list[TapFrame]]:
    """One ``seq`` per record and connection, from 1; a number the test data skipped (a lost record)
    skips one here too, at the first record written after it."""
    present: dict[str, set[int]] = {}
    for record in records:
        present.setdefault(record[0].conn, set()).update(f.seq for f in record)
    missing = {conn: sorted(set(range(min(seqs), max(seqs) + 1)) - seqs) for conn, seqs in present.items()}
    seq: dict[str, int] = {}
    out: list[list[TapFrame]] = []
    for record in records:
        conn = record[0].conn
        newest = max(f.seq for f in record)
        skipped = missing[conn]
        lost = 0
        while skipped and skipped[0] < newest:
            skipped.pop(0)
            lost += 1
        number = seq.get(conn, 0) + 1 + lost
        seq[conn] = number
        out.append([replace(f, seq=number) for f in record])
    return out


def flatten(records: list[list[TapFrame]]) -> list[TapFrame]:
    return [frame for record in records for frame in record]


def micro_batches(records: list[list[TapFrame]], cuts: list[int]) -> Iterator[dict[str, list[TapFrame]]]:
    """``records`` cut into micro-batches before the records numbered in ``cuts``: each non-empty
    batch's frames by connection (in the order connections first appear), each in sequence order."""
    bounds = [0, *sorted(set(cuts)), len(records)]
    for lo, hi in itertools.pairwise(bounds):
        per_conn: dict[str, list[TapFrame]] = defaultdict(list)
        for frame in flatten(records[lo:hi]):
            per_conn[frame.conn].append(frame)
        for mine in per_conn.values():
            mine.sort(key=lambda f: f.seq)
        if per_conn:
            yield per_conn


def released(held: list[Any], upto: int | None) -> tuple[list[Any], list[Any]]:
    """A test driver's buffered routes of one key (``checks.routes.Route``) split as the stage splits
    them (``checks.summaries.split_held``): those ``upto`` (ns; None: the end) passed, in release
    order, and those that wait."""
    return split_held(
        held,
        [release_key(r.frame) for r in held],
        [upto is None or r.at_ns <= upto for r in held],
        [r.summary is not None for r in held],
        [r.at_ns for r in held],
        [None if r.answer is None else release_key(r.answer) for r in held],
    )


def held_back(waiting: list[Any]) -> tuple[int, str, int] | None:
    """Where the first summary that waits starts: the keyed shard releases no answer it holds from
    there on (as ``streaming.stages.keyed_step`` advances it)."""
    return min((r.summary.first for r in waiting if r.summary is not None), default=None)


def entry_of(route: Route) -> RouteEntry:
    """``route`` as the router writes its entry (``streaming.router``), each frame packed on its own:
    what the stage reads back with ``RouteEntry.route``."""
    summary = route.summary
    if summary is None:
        return packed_entry(route)
    return summary_entry(route, summary.expand())


def as_built_before(routes: list[Route]) -> list[Route]:
    """``routes`` as a build before exchange routes wrote them: each answer a route of its own, at its
    time, nothing paired by the router, in release order (summaries as the routes they stand for)."""
    flat: list[Route] = []
    for r in routes:
        if r.summary is not None:
            flat += as_built_before(r.summary.expand())
            continue
        flat.append(Route(r.key, r.frame, r.at_ns, r.incomplete, r.request_only, paired=False))
        if r.answer is not None:
            flat.append(Route(r.key, r.answer, r.answer.ts_ns, r.answer_incomplete, paired=False))
    return sorted(flat, key=lambda r: release_key(r.frame))
