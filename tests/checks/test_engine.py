"""The monitor core: event-time ordering, pairing, acks=0, gaps, decode errors, TTL eviction, late frames."""

from __future__ import annotations

import sys
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

import checks
from checks.engine import Monitor
from checks.model import Exchange, Finding, Severity
from checks.rule import Context, Rule, RuleContext, State
from checks.settings import ChecksSettings
from codec.taprecord import TAP_START, WORKER_LOST, TapFrame, frames_from_record, pack_tap_event
from tests.checks.builders import SECOND, Conversation, shared_offsets

MS = 1_000_000
METADATA, PRODUCE = 3, 0
MD_REQ = {"Topics": [], "AllowAutoTopicCreation": False}
MD_RESP = {"Brokers": [], "ControllerId": 1, "Topics": []}


class Recorder(Rule):
    """Records every event it sees and reports each completed exchange (so incompleteness shows)."""

    name = "rec"
    key_kind = "conn"
    events: ClassVar[list[tuple[str, str, int | None, bool]]] = []

    def keys(self, ex: Exchange) -> list[str]:
        return [ex.conn]

    def on_request(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        self.events.append(("req", ex.conn, ex.request.correlation_id, ex.response is not None))
        state["n"] = int(state.get("n", 0)) + 1

    def on_response(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        self.events.append(("resp", ex.conn, ex.request.correlation_id, ex.response is not None))
        ctx.emit(
            "rec.seen", Severity.WARNING, f"conn:{ex.conn}", "seen", ex.ts_ns, ex.evidence(), conns=(ex.conn,)
        )


def monitor(**config: Any) -> Monitor:
    Recorder.events = []
    return Monitor([Recorder()], Context(ChecksSettings(**config)))


def md(conv: Conversation, ts: int) -> list[TapFrame]:
    return conv.exchange(METADATA, 9, MD_REQ, MD_RESP, ts)


def test_frames_are_released_in_event_time_order() -> None:
    a, b = Conversation(conn="ca"), Conversation(conn="cb")
    shared_offsets(a, b)
    frames = [*md(a, 1 * SECOND), *md(b, 2 * SECOND), *md(a, 3 * SECOND)]
    m = monitor()
    m.feed_all(reversed(frames))
    assert Recorder.events == []  # all within the watermark: still buffered
    m.flush()
    assert [(e[0], e[1]) for e in Recorder.events] == [
        ("req", "ca"),
        ("resp", "ca"),
        ("req", "cb"),
        ("resp", "cb"),
        ("req", "ca"),
        ("resp", "ca"),
    ]
    assert m.stats.late_frames == 0 and m.stats.exchanges == 3


def test_watermark_releases_frames_as_event_time_advances() -> None:
    conv = Conversation()
    m = monitor(watermark_seconds=5)
    m.feed_all(md(conv, 1 * SECOND))
    assert Recorder.events == []
    m.advance(7 * SECOND)
    assert [e[0] for e in Recorder.events] == ["req", "resp"]


def test_pairing_by_correlation_id_and_unpaired_responses() -> None:
    conv = Conversation()
    r1 = conv.request(METADATA, 9, MD_REQ, 1 * SECOND)
    r2 = conv.request(METADATA, 9, MD_REQ, 1 * SECOND + MS)
    a2 = conv.response(r2, MD_RESP, 1 * SECOND + 2 * MS)
    a1 = conv.response(r1, MD_RESP, 1 * SECOND + 3 * MS)
    stray = conv.response(r1, MD_RESP, 1 * SECOND + 4 * MS)  # r1 is already answered
    m = monitor()
    m.feed_all([r1, r2, a2, a1, stray])
    m.flush()
    assert Recorder.events == [
        ("req", conv.conn, r1.correlation_id, False),
        ("req", conv.conn, r2.correlation_id, False),
        ("resp", conv.conn, r2.correlation_id, True),
        ("resp", conv.conn, r1.correlation_id, True),
    ]
    assert m.stats.unpaired_responses == 1 and m.stats.exchanges == 2


def test_an_idle_connection_holds_no_pending_table() -> None:
    """A dict emptied by pops keeps its table: 10k idle connections held ~2 MiB of empty tables."""
    conv = Conversation()
    requests = [conv.request(METADATA, 9, MD_REQ, SECOND + i * MS) for i in range(6)]
    m = monitor()
    m.feed_all(requests)
    m.flush()
    pending = m.conns[conv.conn].pending
    assert len(pending) == 6 and sys.getsizeof(pending) > sys.getsizeof({})
    m.feed_all([conv.response(r, MD_RESP, 2 * SECOND + i * MS) for i, r in enumerate(requests)])
    m.flush()
    assert pending == {} and sys.getsizeof(pending) == sys.getsizeof({})
    assert m.stats.exchanges == 6 and len(Recorder.events) == 12


def test_acks_zero_produce_completes_without_response() -> None:
    conv = Conversation()
    req = conv.request(
        PRODUCE, 9, {"TransactionalId": None, "Acks": 0, "TimeoutMs": 1, "TopicData": []}, SECOND
    )
    m = monitor()
    m.feed(req)
    m.flush()
    assert Recorder.events == [
        ("req", conv.conn, req.correlation_id, False),
        ("resp", conv.conn, req.correlation_id, False),
    ]
    assert m.conns[conv.conn].pending == {}


def _run_gap_first(frames: list[TapFrame]) -> tuple[Monitor, list[Finding]]:
    """A monitor over ``frames`` and its findings by time, a gap before the rules' findings of its
    instant: a gap is reported as its record arrives (record order), the rules' findings as frames
    are released."""
    m = monitor()
    found = m.feed_all(frames) + m.flush()
    return m, sorted(found, key=lambda f: (f.ts_ns, f.rule != "tap.gap"))


def test_a_tap_loss_marks_the_connection_incomplete_until_it_closes() -> None:
    conv = Conversation()
    frames = md(conv, 1 * SECOND)
    conv.lose(3)  # the tap's mirror queue refused three records
    frames += md(conv, 2 * SECOND)
    frames.append(conv.close(3 * SECOND))
    other = Conversation(conn="c-other")
    shared_offsets(conv, other)
    frames += md(other, 4 * SECOND)
    m, findings = _run_gap_first(frames)
    assert [(f.rule, f.incomplete) for f in findings] == [
        ("rec.seen", False),
        ("tap.gap", False),
        ("rec.seen", True),
        ("rec.seen", False),
    ]
    assert findings[1].evidence["missing"] == 3 and "3 lost" in findings[1].summary
    assert "incomplete" in findings[2].summary
    assert m.stats.gaps == 1
    assert conv.conn not in m.ctx.incomplete_conns and ("rec", conv.conn) not in m.states


def test_a_gap_the_tap_did_not_report_is_a_tap_gap_and_leaves_findings_complete() -> None:
    """Records missing after the tap (retention, a reader's skip) show as a gap, which is reported;
    only the tap's own count of lost records marks the connection's findings incomplete."""
    conv = Conversation()
    frames = md(conv, 1 * SECOND)
    conv.seq += 3  # numbers missing, no count from the tap
    frames += md(conv, 2 * SECOND)
    m, findings = _run_gap_first(frames)
    assert [(f.rule, f.incomplete) for f in findings] == [
        ("rec.seen", False),
        ("tap.gap", False),
        ("rec.seen", False),
    ]
    assert findings[1].evidence["missing"] == 3 and "lost" not in findings[1].summary
    assert m.stats.gaps == 1 and conv.conn not in m.ctx.incomplete_conns


def test_a_loss_stamp_without_a_gap_marks_the_connection_incomplete() -> None:
    """The loss was before the frames this monitor sees (an earlier batch, another shard): the stamp
    alone makes the findings incomplete, from the frame that carries it on, and no gap is reported."""
    conv = Conversation()
    conv.lost = 2
    m = monitor()
    findings = m.feed_all(md(conv, 1 * SECOND)) + m.flush()
    assert [(f.rule, f.incomplete) for f in findings] == [("rec.seen", True)]
    assert m.stats.gaps == 0 and conv.conn in m.ctx.incomplete_conns


def test_the_frame_carrying_the_stamp_is_already_incomplete() -> None:
    """A response written after the tap lost a record completes its exchange with the connection
    already incomplete: the mark is taken before the frame is dispatched, as the gap's was."""
    conv = Conversation()
    request = conv.request(METADATA, 9, MD_REQ, 1 * SECOND)
    conv.lose(1)
    response = conv.response(request, MD_RESP, 2 * SECOND)
    assert (request.lost, response.lost) == (0, 1)
    m = monitor()
    findings = m.feed_all([request, response]) + m.flush()
    assert [(f.rule, f.incomplete) for f in findings] == [("tap.gap", False), ("rec.seen", True)]


def test_decode_errors_are_reported_and_counted() -> None:
    conv = Conversation()
    m = monitor()
    findings = m.feed_all([conv.garbage("req", b"\x00\x03\x00\x09\xff", SECOND)]) + m.flush()
    assert [f.rule for f in findings] == ["frame.decode_error"]
    assert m.stats.decode_errors == 1 and Recorder.events == []


def test_idle_keys_are_evicted_by_ttl_and_counted() -> None:
    idle, busy = Conversation(conn="c-idle"), Conversation(conn="c-busy")
    shared_offsets(idle, busy)
    m = monitor(connection_ttl_seconds=30, watermark_seconds=1)
    m.feed_all(md(idle, 1 * SECOND))
    m.feed_all(md(busy, 20 * SECOND))
    m.feed_all(md(busy, 25 * SECOND))
    assert ("rec", "c-idle") in m.states
    # Sweeps run every 10 s of event time: at 45 s the idle key is past its 30 s TTL, the busy one is not.
    m.feed_all(md(busy, 45 * SECOND))
    m.feed_all(md(busy, 70 * SECOND))
    m.flush()
    assert ("rec", "c-idle") not in m.states and ("rec", "c-busy") in m.states
    assert m.stats.evicted_keys == 1


def test_late_frames_are_processed_and_counted() -> None:
    a, b = Conversation(conn="ca"), Conversation(conn="cb")
    shared_offsets(a, b)
    m = monitor(watermark_seconds=5)
    m.feed_all(md(a, 1 * SECOND))
    m.feed_all(md(a, 30 * SECOND))
    m.feed_all(md(a, 60 * SECOND))  # the watermark (55 s) releases the 30 s frames
    late = md(b, 2 * SECOND)
    findings: list[Finding] = []
    for frame in late:
        findings += m.feed(frame)
    assert m.stats.late_frames == 2
    assert [(e[0], e[1]) for e in Recorder.events][-2:] == [("req", "cb"), ("resp", "cb")]
    assert [f.subject for f in findings] == ["conn:cb"]


class Alarm(Rule):
    """Each request sets (or, with ``cancel``, clears) a timer ``delay`` ms after it; timers are logged."""

    name = "alarm"
    key_kind = "conn"
    fired: ClassVar[list[tuple[str, int]]] = []

    def keys(self, ex: Exchange) -> list[str]:
        return [ex.conn]

    def on_request(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        delay = 3000 if ex.conn.endswith("-slow") else 1000
        state["n"] = int(state.get("n", 0)) + 1
        if ex.conn.endswith("-cancel") and state["n"] > 1:
            ctx.cancel_timer()
        else:
            ctx.set_timer(ex.ts_ns + delay * MS)

    def on_timer(self, state: State, key: str, now_ns: int, ctx: RuleContext) -> None:
        self.fired.append((key, now_ns))


def test_timers_fire_in_deadline_order_with_many_pending() -> None:
    """Many pending timers (one per open transaction, say): re-set, cancelled and restored ones too."""
    suffixes = ["-slow", "", "-cancel", ""]
    convs = [Conversation(conn=f"c{i:03d}{suffixes[i % 4]}") for i in range(200)]
    shared_offsets(*convs)
    frames = [f for i, c in enumerate(convs) for f in md(c, SECOND + i * 7 * MS)]
    # Every connection re-arms its timer once (the first deadline goes stale), or cancels it.
    frames += [f for i, c in enumerate(convs) for f in md(c, SECOND + (i * 7 + 50) * MS)]
    frames.sort(key=lambda f: f.ts_ns)
    expected = sorted(
        (
            (c.conn, SECOND + (i * 7 + 50 + (3000 if c.conn.endswith("-slow") else 1000)) * MS)
            for i, c in enumerate(convs)
            if not c.conn.endswith("-cancel")
        ),
        key=lambda kv: (kv[1], kv[0]),
    )
    Alarm.fired = []
    config = ChecksSettings(watermark_seconds=0.001)  # release (and arm) as frames come
    m = Monitor([Alarm()], Context(config))
    half = 3 * len(frames) // 4
    m.feed_all(frames[:half])
    assert len(m.ctx.timers) > 50 and Alarm.fired
    # Carry on in a fresh monitor restored from a snapshot: its timers come back as a plain dict.
    restored = Monitor.from_state(m.to_state(), [Alarm()], Context(config))
    restored.feed_all(frames[half:])
    restored.advance(10 * SECOND + 100 * SECOND)
    assert Alarm.fired == expected
    assert restored.ctx.timers == {} and restored.ctx.timer_heap == []


@pytest.mark.parametrize(
    "flag",
    [{"truncated": "1"}, {"redaction_failed": "1"}, {"capture_fallback": "meta"}, {"redacted": "sasl_token"}],
)
def test_header_only_records_are_not_decode_errors(flag: dict[str, str]) -> None:
    """Frames the tap mirrors without a body on purpose are counted, never reported as undecodable."""
    from codec.taprecord import frames_from_record

    headers = {"dir": "req", "conn": "c1", "seq": "2", "ts_ns": "5", "capture": "headers", **flag}
    frame = frames_from_record(headers, b"\x00\x11\x00", 0, 3)[0]
    assert frame.error is None and frame.message is None
    monitor = checks.new_monitor()
    assert monitor.feed_all([frame]) + monitor.flush() == []
    assert monitor.stats.header_only == 1


def test_pipelined_exchanges_in_record_order_are_neither_late_nor_gaps() -> None:
    """Schema-2 records: a request is written with its response, so a connection's frames come in
    record order (one seq per exchange) and a pipelined request is older than the response before it.
    A monitor told so (a connection shard) counts no late frame; one that is not counts the request
    it released after a newer frame."""
    conv = Conversation()
    first = conv.request(METADATA, 9, MD_REQ, 1 * SECOND)
    second = conv.request(METADATA, 9, MD_REQ, 2 * SECOND)
    answers = [conv.response(first, MD_RESP, 3 * SECOND), conv.response(second, MD_RESP, 4 * SECOND)]
    records = [(first, answers[0]), (second, answers[1])]
    for seq, pair in enumerate(records, start=1):
        for frame in pair:
            frame.seq = seq
    frames = [frame for pair in records for frame in pair]
    ordered = Monitor([Recorder()], Context(ChecksSettings(watermark_seconds=0)), in_record_order=True)
    Recorder.events = []
    ordered.feed_all(frames)
    assert ordered.stats.late_frames == 0 and ordered.stats.gaps == 0 and ordered.stats.exchanges == 2
    assert [e[0] for e in Recorder.events] == ["req", "resp", "req", "resp"]
    unordered = Monitor([Recorder()], Context(ChecksSettings(watermark_seconds=0)))
    unordered.feed_all(frames)
    assert unordered.stats.late_frames == 1 and unordered.stats.gaps == 0


def test_a_lone_response_pairs_with_nothing() -> None:
    """The tap wrote the request alone (a bound was hit) and then its answer alone: a reader that sees
    records a batch at a time cannot pair them, so no reader does; the answer is counted unpaired."""
    from dataclasses import replace

    conv = Conversation()
    request, response = md(conv, 1 * SECOND)
    m = monitor()
    m.feed_all([request, replace(response, lone=True)])
    m.flush()
    assert m.stats.exchanges == 0 and m.stats.unpaired_responses == 1
    paired = monitor()
    paired.feed_all([request, response])
    paired.flush()
    assert paired.stats.exchanges == 1 and paired.stats.unpaired_responses == 0


def test_a_tap_event_is_an_info_finding_that_names_the_tap() -> None:
    """A worker's death (a warning: records were lost) and a tap's start (info) are reported, where and
    when the tap may have lost records, about the tap: they blame no client or broker."""
    died = pack_tap_event(
        WORKER_LOST, "tap-h-0", "tap-h", 5 * SECOND, {"worker": 0, "pid": 77, "exitcode": -9}
    )
    started = pack_tap_event(TAP_START, "tap-h.lx0", "tap-h", 6 * SECOND, {"pid": 78})
    monitor = checks.new_monitor(ChecksSettings())
    frames = [*frames_from_record(None, died, 0, 1), *frames_from_record(None, started, 1, 1)]
    findings = monitor.feed_all(frames) + monitor.flush()
    assert [(f.rule, f.severity.value, f.subject) for f in findings] == [
        ("tap.worker_lost", "warning", "tap:tap-h"),
        ("tap.tap_start", "info", "tap:tap-h"),
    ]
    assert "worker 0 (pid 77, exit -9) died" in findings[0].summary
    assert monitor.stats.decode_errors == 0 and monitor.stats.header_only == 0


class _CountingDict(dict[Any, Any]):
    """A dict that counts the keys its iterator hands out."""

    handed = 0

    def __iter__(self) -> Any:
        for key in super().__iter__():
            type(self).handed += 1
            yield key


@given(
    size=st.integers(min_value=0, max_value=40),
    limit=st.integers(min_value=1, max_value=30),
    as_list=st.booleans(),
)
def test_trim_keeps_the_newest_entries_in_order(size: int, limit: int, as_list: bool) -> None:
    ctx = Context(ChecksSettings(max_entries_per_key=limit))
    items = [f"k{i}" for i in range(size)]
    container: dict[Any, Any] | list[Any] = list(items) if as_list else dict.fromkeys(items, 1)
    ctx.trim(container)
    kept = items[max(0, size - limit) :]
    assert list(container) == kept
    assert ctx.stats.evicted_entries == size - len(kept)


def test_trimming_a_full_container_reads_only_the_keys_it_drops() -> None:
    # A container held at its bound trims on every insert: reading all of it each time made the
    # cluster key's fleet matrix cost its whole size per new connection.
    ctx = Context(ChecksSettings(max_entries_per_key=1_000))
    container = _CountingDict.fromkeys(range(1_000), True)
    for new in range(1_000, 1_050):
        container[new] = True
        _CountingDict.handed = 0
        ctx.trim(container)
        assert _CountingDict.handed == 1
    assert list(container) == list(range(50, 1_050))
