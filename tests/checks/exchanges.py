"""Frames as the tap writes them (tap-record schema 2): a request and its response in one record.

The tap holds a request until its response has been forwarded, then writes both as one record, at the
response's place in the connection's stream, numbered by one ``seq`` (``tap/framing.py``). A request
that is never answered goes alone (acks=0 at once; others when the connection ends). A gap the test
data made in a connection's numbering (a lost record) stays a gap of the same size.
"""

from __future__ import annotations

from dataclasses import replace

from codec.taprecord import REQ, RESP, TapFrame


def exchange_records(frames: list[TapFrame]) -> list[list[TapFrame]]:
    """``frames`` (in the order the tap saw them) as tap records, in the order the tap writes them."""
    answered: set[int] = set()
    pending: dict[tuple[str, int | None], int] = {}
    partner: dict[int, int] = {}
    for i, frame in enumerate(frames):
        key = (frame.conn, frame.correlation_id)
        if frame.direction == REQ:
            pending[key] = i
        elif frame.direction == RESP and key in pending:
            request = pending.pop(key)
            partner[i] = request
            answered.add(request)
    # The tap writes records in the order its holds end; a request that gets no answer goes alone, but
    # not before the requests it followed on its connection (they are held until their answers come).
    records: list[list[TapFrame]] = []
    held: dict[str, list[int]] = {}
    waiting: dict[str, list[int]] = {}

    def write_ready(conn: str) -> None:
        queue = waiting.get(conn, [])
        holds = held.get(conn, [])
        while queue and (not holds or holds[0] > queue[0]):
            records.append([frames[queue.pop(0)]])

    for i, frame in enumerate(frames):
        conn = frame.conn
        if i in answered:
            held.setdefault(conn, []).append(i)
            continue
        if i in partner:
            held[conn].remove(partner[i])
            records.append([frames[partner[i]], frame])
            write_ready(conn)
            continue
        if frame.direction == REQ:
            waiting.setdefault(conn, []).append(i)
            write_ready(conn)
            continue
        records.append([frame])
    for conn in waiting:
        write_ready(conn)
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
