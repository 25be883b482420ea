"""The job's two stateful stages as pure steps: tap records in, the single monitor's findings out."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest

from codec.taprecord import TapFrame
from streaming.frames import frame_row
from streaming.pages import DictPageBackend, PagedBucketStore
from streaming.stages import (
    PASS_KEY,
    STAGE_ROW_FIELDS,
    Buffered,
    DictBucketStore,
    LocalStages,
    buffered_of,
    combine_rows,
    connection_bucket,
    connection_bucket_expired,
    connection_step,
    keyed_step,
)
from tests.checks.test_sharding import (
    CONFIG,
    LATENESS_NS,
    corpus_frames,
    headers_only,
    scenario,
    single_run,
    summary,
    with_headers_only,
)

NS_PER_MS = 1_000_000
SECOND_NS = 1_000 * NS_PER_MS


def tap_record(frame: TapFrame) -> tuple[dict[str, str], bytes | None, int, int]:
    """The tap record a frame was mirrored as (the tap topic contract's headers)."""
    headers = {
        "dir": frame.direction,
        "conn": frame.conn,
        "seq": str(frame.seq),
        "ts_ns": str(frame.ts_ns),
        "client": frame.client,
        "broker": frame.broker,
        "capture": frame.capture,
    }
    if frame.listener:
        headers["listener"] = frame.listener
    if frame.broker_id is not None:
        headers["broker_id"] = str(frame.broker_id)
    # The tap names every frame's api, version and correlation id (read from the frame's first bytes):
    # what an undecodable or header-only request is judged by.
    for name, value in (
        ("api_key", frame.api_key),
        ("api_version", frame.api_version),
        ("corr_id", frame.correlation_id),
    ):
        if value is not None:
            headers[name] = str(value)
    return headers, frame.raw, frame.partition, frame.offset


def run_stages(frames: list[TapFrame], batch_size: int) -> list[dict[str, Any]]:
    """Micro-batches through both stages, with the watermark Spark would compute; the final rows."""
    conn_state: dict[str, bytes | None] = {}
    key_state: dict[str, bytes | None] = {}
    buffers: dict[str, list[Buffered]] = defaultdict(list)
    out: list[dict[str, Any]] = []
    watermark_ms = 0
    max_ts = 0
    batches = [frames[i : i + batch_size] for i in range(0, len(frames), batch_size)] + [[]]
    for n, batch in enumerate(batches):
        last = n == len(batches) - 1
        if last:
            # End of input: let the watermark pass everything, as a long idle stream eventually does.
            watermark_ms = max_ts // NS_PER_MS + 1
        rows_by_conn: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for frame in batch:
            row = frame_row(*tap_record(frame))
            rows_by_conn[row["conn"]].append(row)
        for conn, rows in rows_by_conn.items():
            result = connection_step(CONFIG, conn_state.get(conn), rows, watermark_ms)
            conn_state[conn] = result.state
            for r in result.rows:
                assert r["event_ms"] > watermark_ms, "stage one must emit rows after the watermark"
                if r["route_key"] == PASS_KEY:
                    out.append(r)
                else:
                    buffers[r["route_key"]].append(
                        Buffered(r["at_ms"], r["ts_ns"], r["conn"], r["seq"], r["frame"], r["flags"])
                    )
        for key in list(buffers.keys() | key_state.keys()):
            keyed = keyed_step(CONFIG, key, key_state.get(key), buffers[key], watermark_ms)
            key_state[key], buffers[key] = keyed.state, keyed.buffer
            out.extend(keyed.rows)
        max_ts = max([max_ts, *(f.ts_ns for f in batch)])
        # Spark moves the watermark after the batch: newest event time minus the lateness.
        watermark_ms = max(watermark_ms, (max_ts - LATENESS_NS) // NS_PER_MS)
    return out


def paged_store() -> PagedBucketStore:
    """The job's paged bucket store over memory, with pages so small that buckets split as they grow."""
    return PagedBucketStore(DictPageBackend(), entries_per_page=2)


def run_bucketed(
    frames: list[TapFrame], batch_size: int, buckets: int, paged: bool = False
) -> tuple[list[dict[str, Any]], int]:
    """``run_stages`` through the bucketed steps the job's processors run; the rows and the Python calls.
    ``paged``: each bucket's state kept in the job's pages (``streaming.pages``), read back from their
    bytes at every call, instead of a dict."""
    stages = LocalStages(CONFIG, buckets, paged_store if paged else DictBucketStore)
    out: list[dict[str, Any]] = []
    watermark_ms = 0
    max_ts = 0
    batches = [frames[i : i + batch_size] for i in range(0, len(frames), batch_size)] + [[]]
    for n, batch in enumerate(batches):
        if n == len(batches) - 1:
            watermark_ms = max_ts // NS_PER_MS + 1
        routed = stages.stage_one([frame_row(*tap_record(frame)) for frame in batch], watermark_ms)
        assert all(r["event_ms"] > watermark_ms for r in routed), "stage one emits rows after the watermark"
        out.extend(stages.stage_two(routed, watermark_ms))
        max_ts = max([max_ts, *(f.ts_ns for f in batch)])
        watermark_ms = max(watermark_ms, (max_ts - LATENESS_NS) // NS_PER_MS)
    return out, stages.calls


def findings_of(rows: list[dict[str, Any]]) -> list[tuple[str, str, str, str, bool]]:
    from checks.model import Finding

    return summary([Finding.from_dict(json.loads(r["payload"])) for r in rows if r["kind"] == "finding"])


def test_stages_find_what_one_monitor_finds() -> None:
    frames = with_headers_only()
    expected = summary(single_run(frames))
    for batch_size in (1, 5, 1000):
        assert findings_of(run_stages(frames, batch_size)) == expected


def test_requests_known_by_their_header_through_the_stages() -> None:
    """Undecodable out-of-range requests and a header-only one, as tap records: both stages together
    find what one monitor finds, the KIP-896 removal included, and each decode error once."""
    frames = headers_only(SECOND_NS)
    expected = summary(single_run(frames))
    assert [f[1] for f in expected].count("frame.decode_error") == 2
    assert "apiversions.removed_in_4_0" in {f[1] for f in expected}
    for batch_size in (1, 100):
        assert findings_of(run_stages(frames, batch_size)) == expected
        assert findings_of(run_bucketed(frames, batch_size, 4)[0]) == expected


def test_real_traffic_through_the_stages() -> None:
    frames = corpus_frames()
    assert findings_of(run_stages(frames, 9)) == summary(single_run(frames))


def test_aggregates_count_frames_and_errors() -> None:
    frames = scenario()
    rows = run_stages(frames, 1000)
    aggs = [json.loads(r["payload"]) for r in rows if r["kind"] == "agg"]
    wire = [f for f in frames if f.direction in ("req", "resp")]
    assert sum(a["frames"] for a in aggs) == len(wire)
    assert sum(a["decode_errors"] for a in aggs) == sum(1 for f in wire if f.error is not None) >= 1
    failed_writes = sum(
        1
        for f in wire
        if f.api_key == 0
        and f.response is not None
        and any(p["ErrorCode"] for t in f.response.body["Responses"] for p in t["PartitionResponses"])
    )
    produce_answers = [a for a in aggs if a["dir"] == "resp" and a["api_key"] == 0]
    assert (
        sum(a["error_responses"] for a in produce_answers) == failed_writes >= 2
    )  # fenced zombie, duplicate


#: Engine counters that describe the frames themselves: the connection shard counts each frame once.
FRAME_COUNTERS = ("frames", "exchanges", "unpaired_responses", "decode_errors", "header_only")


def _counted(rows: list[dict[str, Any]]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for r in rows:
        if r["kind"] == "stat":
            for name, n in json.loads(r["payload"]).items():
                totals[name] += n
    return {name: totals[name] for name in FRAME_COUNTERS}


@pytest.mark.parametrize("frames", [corpus_frames(), with_headers_only(), headers_only(SECOND_NS)])
def test_stage_counters_count_each_frame_once(frames: list[TapFrame]) -> None:
    """The per-batch counters (``kpmon_stream_engine_events_total``) match one monitor's: a frame routed
    on to stage two is not counted again there."""
    import checks

    monitor = checks.new_monitor(CONFIG)
    monitor.feed_all(frames)
    monitor.flush()
    expected = {name: getattr(monitor.stats, name) for name in FRAME_COUNTERS}
    assert expected["frames"] == len(frames) and expected["exchanges"] > 0
    assert _counted(run_stages(frames, 7)) == expected
    assert _counted(run_bucketed(frames, 7, 4)[0]) == expected


def test_join_group_answer_without_protocol_type_is_counted() -> None:
    from tests.checks import test_groups as gr
    from tests.checks.builders import SECOND, Conversation

    frames = gr.join(Conversation(), SECOND, "m-a", 1, resp_type=None)
    rows = run_stages(frames, 10)
    aggs = [json.loads(r["payload"]) for r in rows if r["kind"] == "agg"]
    assert sum(a["null_protocol_type"] for a in aggs) == 1


def test_a_record_that_is_not_from_a_tap_is_a_decode_error() -> None:
    row = frame_row({}, b"hello", 3, 42)
    result = connection_step(CONFIG, None, [row], 0)
    findings = [json.loads(r["payload"]) for r in result.rows if r["kind"] == "finding"]
    assert [f["rule"] for f in findings] == ["frame.decode_error"]
    assert findings[0]["evidence"]["offsets"] == [[3, 42]]
    assert "not a tap record" in findings[0]["summary"]


#: The tap record's numeric headers (``streaming.frames.FRAME_ROW_SCHEMA``'s integer columns).
NUMERIC_HEADERS = ("seq", "ts_ns", "api_key", "api_version", "corr_id", "broker_id")


def through_local_stages(
    headers: dict[str, str], value: bytes | None, partition: int, offset: int
) -> list[Any]:
    stages = LocalStages(CONFIG, 2)
    routed = stages.stage_one([frame_row(headers, value, partition, offset)], 0)
    out = stages.stage_two(routed, 0) + stages.stage_two([], 2**62)
    return [(r["kind"], json.loads(r["payload"])) for r in out if r["kind"] != "route"]


@pytest.mark.parametrize("direction", ["req", "resp"])
def test_out_of_range_numeric_headers_go_through_the_stages_as_non_numeric_ones(direction: str) -> None:
    """A header its column cannot hold reads as null, as one that is not a number: stage one reads a
    null seq and ts_ns as 0 (``frame_from_row``) and judges the record by what it has. A request is
    decoded from its own bytes; a response without its api key and version is a counted decode error."""
    frame = next(f for f in scenario() if f.direction == direction and f.error is None)
    headers, value, partition, offset = tap_record(frame)
    beyond = through_local_stages(
        {**headers, **dict.fromkeys(NUMERIC_HEADERS, str(2**70))}, value, partition, offset
    )
    assert beyond == through_local_stages(
        {**headers, **dict.fromkeys(NUMERIC_HEADERS, "x")}, value, partition, offset
    )
    for bound in ("2147483648", "-2147483649"):  # int32's: a sequence or clock holds them, an api key not
        assert through_local_stages(
            {**headers, "api_key": bound}, value, partition, offset
        ) == through_local_stages({**headers, "api_key": "x"}, value, partition, offset)
    aggs = [payload for kind, payload in beyond if kind == "agg"]
    assert sum(a["frames"] for a in aggs) == 1
    decode_errors = [p for kind, p in beyond if kind == "finding" and p["rule"] == "frame.decode_error"]
    if direction == "resp":
        assert [a["decode_errors"] for a in aggs] == [1]
        assert len(decode_errors) == 1 and decode_errors[0]["evidence"]["offsets"] == [[partition, offset]]
    else:
        assert [(a["decode_errors"], a["api_key"]) for a in aggs] == [(0, frame.api_key)]
        assert decode_errors == []


def test_a_closed_connection_leaves_no_state() -> None:
    frames = [f for f in scenario() if f.conn == "tap1-av"]
    from tests.checks.builders import Conversation

    closing = Conversation(conn="tap1-av", seq=frames[-1].seq + 1)
    rows = [frame_row(*tap_record(f)) for f in [*frames, closing.close(frames[-1].ts_ns + 1)]]
    assert connection_step(CONFIG, None, rows[:-1], 0).state is not None
    assert connection_step(CONFIG, None, rows, 0).state is None


def test_a_route_key_no_rule_forms_is_dropped_and_counted() -> None:
    buffered = [Buffered(1, 1, "c", 1, b"{}", 0)]
    result = keyed_step(CONFIG, "apiversions.cluster|cluster", b"{}", buffered, 10)
    assert result.state is None and result.buffer == [] and result.next_timer_ms is None
    assert [json.loads(r["payload"]) for r in result.rows] == [{"unknown_route_keys": 1, "dropped_routes": 1}]


@pytest.mark.parametrize("paged", [False, True], ids=["dict", "paged"])
@pytest.mark.parametrize("buckets", [1, 3, 16])
def test_bucketed_stages_find_what_one_monitor_finds(buckets: int, paged: bool) -> None:
    frames = with_headers_only()
    expected = summary(single_run(frames))
    for batch_size in (1, 7, 1000):
        rows, _ = run_bucketed(frames, batch_size, buckets, paged)
        assert findings_of(rows) == expected


@pytest.mark.parametrize("paged", [False, True], ids=["dict", "paged"])
def test_bucketed_real_traffic(paged: bool) -> None:
    frames = corpus_frames()
    rows, _ = run_bucketed(frames, 9, 4, paged)
    assert findings_of(rows) == summary(single_run(frames))


def test_a_batch_makes_a_call_per_bucket_not_per_key() -> None:
    frames = scenario()
    connections = len({f.conn for f in frames})
    _, calls = run_bucketed(frames, len(frames), 2)
    # One batch with everything, one empty batch that moves the watermark: at most 2 buckets x 2 stages
    # of input calls, plus timers.
    assert connections > 4 and calls <= 2 * 2 * 2


def test_an_idle_connection_expires_by_the_bucket_timer() -> None:
    frames = [f for f in scenario() if f.conn == "tap1-av"]
    store = DictBucketStore()
    rows = [frame_row(*tap_record(f)) for f in frames]
    result = connection_bucket(CONFIG, store, rows, 0, None)
    assert list(store.entries) == ["tap1-av"] and result.timer_ms is not None
    ttl_ms = int(CONFIG.connection_ttl_seconds * 1000)
    early = connection_bucket_expired(store, result.timer_ms - 1)
    assert early.rows == [] and early.timer_ms == result.timer_ms and list(store.entries) == ["tap1-av"]
    late = connection_bucket_expired(store, result.timer_ms)
    assert store.entries == {} and late.timer_ms is None
    assert [json.loads(r["payload"]) for r in late.rows] == [{"evicted_keys": 1}]
    assert result.timer_ms >= max(f.ts_ns for f in frames) // NS_PER_MS + ttl_ms


def test_a_bucket_keeps_an_earlier_armed_timer() -> None:
    frames = [f for f in scenario() if f.conn == "tap1-av"]
    rows = [frame_row(*tap_record(f)) for f in frames]
    assert connection_bucket(CONFIG, DictBucketStore(), rows, 0, 5).timer_ms == 5


def test_a_bucket_call_sends_one_row_per_route_key_and_aggregate() -> None:
    frames = scenario()
    rows = [frame_row(*tap_record(f)) for f in frames]
    result = connection_bucket(CONFIG, DictBucketStore(), rows, 0, None)
    per_conn = [
        connection_step(CONFIG, None, [r for r in rows if r["conn"] == c], 0).rows
        for c in dict.fromkeys(r["conn"] for r in rows)
    ]
    separate = [r for conn_rows in per_conn for r in conn_rows]
    assert all(tuple(r) == STAGE_ROW_FIELDS for r in separate + result.rows), "stage-row columns"
    # The bucket sums aggregates and counters before encoding them: the same rows as combining the
    # connections' own (encoded) rows.
    assert result.rows == combine_rows(separate)
    routes = [r for r in result.rows if r["kind"] == "route"]
    aggs = [json.loads(r["payload"]) for r in result.rows if r["kind"] == "agg"]
    stats = [json.loads(r["payload"]) for r in result.rows if r["kind"] == "stat"]
    assert len({r["route_key"] for r in routes}) == len(routes) < sum(r["kind"] == "route" for r in separate)
    assert sum(len(buffered_of(r)) for r in routes) == sum(r["kind"] == "route" for r in separate)
    assert len({(a["dir"], a["api_key"], a["api_version"]) for a in aggs}) == len(aggs)
    assert sum(a["frames"] for a in aggs) == sum(1 for f in frames if f.direction in ("req", "resp"))
    assert len(stats) == 1 and stats[0]["frames"] == len(frames)
    assert all(r["event_ms"] > 0 for r in result.rows)


def batch_findings(stages: LocalStages, frames: list[TapFrame], watermark_ms: int) -> list[Any]:
    """One micro-batch through both stages with Spark's watermark ``watermark_ms``: its findings."""
    routed = stages.stage_one([frame_row(*tap_record(f)) for f in frames], watermark_ms)
    return findings_of(stages.stage_two(routed, watermark_ms))


def test_the_batch_clock_releases_in_the_batch_whose_data_passed_the_routes() -> None:
    """Spark's watermark is 0 in the first batch; the batch's own newest event time minus the lateness
    passes every routed frame of the scenario, so stage two releases them all in that batch: every
    finding comes out of it, not one batch later."""
    frames = with_headers_only()
    newest = max(f.ts_ns for f in frames)
    expected = single_run(frames)
    assert max(f.ts_ns for f in expected) <= newest - LATENESS_NS
    assert batch_findings(LocalStages(CONFIG, 4), frames, 0) == summary(expected)


def test_the_batch_clock_fires_keys_that_got_no_routes_this_batch() -> None:
    """Routes waiting from an earlier batch are released when this batch's clock passes them, though
    their key got nothing new: the bucket's timer would only fire a batch later."""
    frames = with_headers_only()
    cut = 17_500 * NS_PER_MS
    first = [f for f in frames if f.ts_ns <= cut]
    later = [f for f in frames if f.ts_ns > cut]
    stages = LocalStages(CONFIG, 4)
    found = batch_findings(stages, first, 0)
    # The producer's duplicate at 17 s waits: the first batch's clock is 2 s before its newest frame.
    assert not any(rule == "producer.sequence_duplicate" for _, rule, *_ in found)
    assert not any(f.conn == "tap1-dup" for f in later), "the key gets no routes in the second batch"
    found += batch_findings(stages, later, (cut - LATENESS_NS) // NS_PER_MS)
    assert sorted(found) == summary(single_run(frames))
