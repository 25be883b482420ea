"""``tap.flush.FlushBuffer``: a connection's entries gathered into schema-3 records by size, count and age."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from codec.taprecord import Entry, Part
from tap.flush import FlushBuffer, FlushLimits

LIMITS = FlushLimits(max_bytes=1_000, max_entries=4, max_age_ns=50)


def _part(size: int) -> Part:
    return Part("req", 0, 18, 3, 1, b"x" * size)


#: (bytes of the entry's one part, nanoseconds since the entry before)
steps = st.lists(st.tuples(st.integers(0, 1_500), st.integers(0, 80)), max_size=40)


@given(steps)
def test_every_entry_goes_out_once_in_order_and_within_the_bounds(plan: list[tuple[int, int]]) -> None:
    buffer = FlushBuffer(LIMITS)
    records: list[list[Entry]] = []
    now = 0
    for seq, (size, gap) in enumerate(plan, start=1):
        now += gap
        records += buffer.add("req", seq, [_part(size)], now)
        due = buffer.due_ns
        assert due is None or due > now - LIMITS.max_age_ns
    records.append(buffer.take())
    records = [r for r in records if r]
    assert [seq for r in records for _, seq, _ in r] == list(range(1, len(plan) + 1))
    for record in records:
        assert len(record) <= LIMITS.max_entries
        payload = sum(len(p.value or b"") for _, _, parts in record for p in parts)
        # Over the byte bound only when one entry alone is larger than it.
        assert payload <= LIMITS.max_bytes or len(record) == 1


def test_a_count_bound_flushes_at_once_and_an_age_bound_at_the_next_entry_or_the_timer() -> None:
    buffer = FlushBuffer(LIMITS)
    assert [buffer.add("req", s, [_part(1)], 0) for s in (1, 2, 3)] == [[], [], []]
    assert [[seq for _, seq, _ in r] for r in buffer.add("req", 4, [_part(1)], 0)] == [[1, 2, 3, 4]]
    assert buffer.due_ns is None and buffer.take() == []
    buffer.add("req", 5, [_part(1)], 100)
    assert buffer.due_ns == 150
    # An entry past the age bound sends the gathered ones first.
    assert [[seq for _, seq, _ in r] for r in buffer.add("req", 6, [_part(1)], 150)] == [[5]]
    assert buffer.due_ns == 200 and [seq for _, seq, _ in buffer.take()] == [6]


def test_an_entry_that_would_overfill_the_record_starts_the_next() -> None:
    buffer = FlushBuffer(LIMITS)
    assert buffer.add("req", 1, [_part(600)], 0) == []
    (first,) = buffer.add("req", 2, [_part(600)], 0)
    assert [seq for _, seq, _ in first] == [1] and len(buffer) == 1
