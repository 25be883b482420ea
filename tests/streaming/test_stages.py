"""The job's router and stateful stage as pure steps: tap records in, the single monitor's findings out."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from typing import Any

import pytest

from checks.routes import RouteEntry
from codec.protocol import ApiKey
from codec.taprecord import EXCHANGE, Connection, Part, TapFrame, pack_record, pack_static
from streaming.frames import frame_row
from streaming.pages import DictPageBackend, PagedBucketStore
from streaming.router import header_exchanges, route_rows, stage_rows
from streaming.rows import OutputRow, conn_key, read_connection_row
from streaming.stages import (
    DictBucketStore,
    LocalStages,
    keyed_step,
    monitor_bucket,
    monitor_bucket_expired,
)
from tests.checks import test_groups as gr
from tests.checks.builders import Conversation
from tests.checks.exchanges import exchange_records, flatten
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


def schema_2_record(record: list[TapFrame]) -> tuple[dict[str, str], bytes, int, int]:
    """A tap record (``tests.checks.exchanges``) as the tap writes it: schema 2, one exchange or one
    frame, with its connection's count of lost records."""
    first = record[0]
    c = Connection(first.conn, first.client, first.broker, first.broker_id, first.listener, "", first.capture)
    parts = [Part(f.direction, f.ts_ns, f.api_key, f.api_version, f.correlation_id, f.raw) for f in record]
    kind = EXCHANGE if len(record) == 2 else first.direction
    return {}, pack_record(kind, first.seq, pack_static(c), parts, first.lost), first.partition, first.offset


def rows_of(frames: list[TapFrame]) -> list[dict[str, Any]]:
    """The job's rows of ``frames``, with their records' ``lost`` and ``lone`` (schema-2 columns)."""
    return [{**frame_row(*tap_record(frame)), "lost": frame.lost, "lone": frame.lone} for frame in frames]


def paged_store() -> PagedBucketStore:
    """The job's paged bucket store over memory, with pages so small that buckets split as they grow."""
    return PagedBucketStore(DictPageBackend(), entries_per_page=2)


def run_bucketed(
    frames: list[TapFrame], batch_size: int, buckets: int, paged: bool = False, partitions: int = 1
) -> tuple[list[OutputRow], int]:
    """``frames`` as tap records (``exchange_records``), ``batch_size`` records a micro-batch, through
    the router and the stage with the watermark Spark would compute; the rows and the Python calls.
    ``paged``: each bucket's state kept in the job's pages (``streaming.pages``), read back from their
    bytes at every call, instead of a dict."""
    records = exchange_records(frames)
    stages = LocalStages(CONFIG, buckets, paged_store if paged else DictBucketStore, partitions)
    out: list[OutputRow] = []
    watermark_ms = 0
    max_ts = 0
    batches = [flatten(records[i : i + batch_size]) for i in range(0, len(records), batch_size)] + [[]]
    for n, batch in enumerate(batches):
        if n == len(batches) - 1:
            # End of input: let the watermark pass everything, as a long idle stream eventually does.
            watermark_ms = max_ts // NS_PER_MS + 1
        out.extend(stages.batch(rows_of(batch), watermark_ms))
        max_ts = max([max_ts, *(f.ts_ns for f in batch)])
        # Spark moves the watermark after the batch: newest event time minus the lateness.
        watermark_ms = max(watermark_ms, (max_ts - LATENESS_NS) // NS_PER_MS)
    return out, stages.calls


def expected_of(frames: list[TapFrame]) -> list[tuple[str, str, str, str, bool]]:
    """The single monitor's findings over ``frames`` as the tap writes them."""
    return summary(single_run(flatten(exchange_records(frames))))


def findings_of(rows: list[OutputRow]) -> list[tuple[str, str, str, str, bool]]:
    from checks.model import Finding

    return summary([Finding.from_dict(json.loads(r.payload)) for r in rows if r.kind == "finding"])


@pytest.mark.parametrize("partitions", [1, 3])
def test_stages_find_what_one_monitor_finds(partitions: int) -> None:
    frames = with_headers_only()
    expected = expected_of(frames)
    for batch_size in (1, 5, 1000):
        assert findings_of(run_bucketed(frames, batch_size, 4, partitions=partitions)[0]) == expected


def test_requests_known_by_their_header_through_the_stages() -> None:
    """Undecodable out-of-range requests and a header-only one, as tap records: the router and the stage
    find what one monitor finds, the KIP-896 removal included, and each decode error once."""
    frames = headers_only(SECOND_NS)
    expected = expected_of(frames)
    assert [f[1] for f in expected].count("frame.decode_error") == 2
    assert "apiversions.removed_in_4_0" in {f[1] for f in expected}
    for batch_size in (1, 100):
        assert findings_of(run_bucketed(frames, batch_size, 4)[0]) == expected


def test_a_removed_version_closed_by_a_4x_broker_through_the_stages() -> None:
    """``apiversions.removed_version_rejected`` comes from the connection's close record: the stage
    keeps the unanswered request in the connection's entry until the close comes."""
    from tests.checks.test_apiversions import BROKER_4X, old_producer

    frames = old_producer(BROKER_4X, answered=False, closed=True)
    expected = expected_of(frames)
    assert "apiversions.removed_version_rejected" in {f[1] for f in expected}
    for batch_size in (1, 2, 100):
        assert findings_of(run_bucketed(frames, batch_size, 4)[0]) == expected


def test_real_traffic_through_the_stages() -> None:
    frames = corpus_frames()
    assert findings_of(run_bucketed(frames, 9, 4)[0]) == expected_of(frames)


def payloads(rows: list[OutputRow], kind: str) -> list[dict[str, Any]]:
    return [json.loads(r.payload) for r in rows if r.kind == kind]


def test_aggregates_count_frames_and_errors() -> None:
    frames = scenario()
    aggs = payloads(run_bucketed(frames, 1000, 4)[0], "agg")
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


#: Engine counters that describe the frames themselves: each connection's own key counts each frame once.
FRAME_COUNTERS = ("frames", "exchanges", "unpaired_responses", "decode_errors", "header_only")


def _counted(rows: list[OutputRow]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for payload in payloads(rows, "stat"):
        for name, n in payload.items():
            totals[name] += n
    return {name: totals[name] for name in FRAME_COUNTERS}


# Not the corpus: it files several real connections under one id per client library, so correlation ids
# repeat while in flight, which no real connection does, and which request an answer pairs with then
# depends on whether frames are seen by clock (the single monitor) or by record (the connection's key).
@pytest.mark.parametrize("frames", [with_headers_only(), headers_only(SECOND_NS)])
def test_stage_counters_count_each_frame_once(frames: list[TapFrame]) -> None:
    """The per-batch counters (``kpmon_stream_engine_events_total``) match one monitor's: a frame routed
    on to an entity key is not counted again there."""
    import checks

    monitor = checks.new_monitor(CONFIG)
    monitor.feed_all(flatten(exchange_records(frames)))
    monitor.flush()
    expected = {name: getattr(monitor.stats, name) for name in FRAME_COUNTERS}
    assert expected["frames"] == len(frames) and expected["exchanges"] > 0
    assert _counted(run_bucketed(frames, 7, 4)[0]) == expected


def test_join_group_answer_without_protocol_type_is_counted() -> None:
    from tests.checks import test_groups as gr
    from tests.checks.builders import SECOND, Conversation

    frames = gr.join(Conversation(), SECOND, "m-a", 1, resp_type=None)
    aggs = payloads(run_bucketed(frames, 10, 2)[0], "agg")
    assert sum(a["null_protocol_type"] for a in aggs) == 1


def test_a_record_that_is_not_from_a_tap_is_a_decode_error() -> None:
    row = frame_row({}, b"hello", 3, 42)
    findings = payloads(LocalStages(CONFIG, 2).batch([row], 0), "finding")
    assert [f["rule"] for f in findings] == ["frame.decode_error"]
    assert findings[0]["evidence"]["offsets"] == [[3, 42]]
    assert "not a tap record" in findings[0]["summary"]


def test_bytes_no_rule_reads_are_still_decoded_and_a_bad_one_is_a_decode_error() -> None:
    """The job decodes each body whole, not with the fields its consumers declare (docs/decisions.md,
    "Decode once, in stage one"): a Metadata answer naming a broker host that is not UTF-8 is reported
    as undecodable, though no rule reads a Metadata answer's body and a decode projected to what they
    read would accept it."""
    body = {"Brokers": [{"NodeId": 1, "Host": "broker-a", "Port": 9092, "Rack": None}], "Topics": []}
    request, answer = Conversation().exchange(
        ApiKey.METADATA, 12, {"Topics": [], "AllowAutoTopicCreation": False}, body, NS_PER_MS
    )
    assert answer.raw is not None and b"broker-a" in answer.raw
    broken = replace(answer, raw=answer.raw.replace(b"broker-a", b"\xffroker-a"))

    def rules(frames: list[TapFrame]) -> list[str]:
        stages = LocalStages(CONFIG, 2)
        rows = [frame_row(*tap_record(f)) for f in frames]
        out = stages.batch(rows, 0) + stages.batch([], 2**62)
        return sorted(json.loads(r.payload)["rule"] for r in out if r.kind == "finding")

    assert rules([request, broken]) == sorted([*rules([request, answer]), "frame.decode_error"])


#: The tap record's numeric headers (``streaming.frames.FRAME_ROW_SCHEMA``'s integer columns).
NUMERIC_HEADERS = ("seq", "ts_ns", "api_key", "api_version", "corr_id", "broker_id")


def through_local_stages(
    headers: dict[str, str], value: bytes | None, partition: int, offset: int
) -> list[Any]:
    stages = LocalStages(CONFIG, 2)
    out = stages.batch([frame_row(headers, value, partition, offset)], 0) + stages.batch([], 2**62)
    return [(r.kind, json.loads(r.payload)) for r in out]


@pytest.mark.parametrize("direction", ["req", "resp"])
def test_out_of_range_numeric_headers_go_through_the_stages_as_non_numeric_ones(direction: str) -> None:
    """A header its column cannot hold reads as null, as one that is not a number: the router reads a
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


def one_bucket(frames: list[TapFrame], store: DictBucketStore, watermark_ms: int, armed: int | None) -> Any:
    """Every frame's bundle of one source batch, through one bucket (a single-bucket stage)."""
    routed = route_rows(CONFIG, rows_of(frames), 1)
    return monitor_bucket(CONFIG, store, list(routed.bundles.values()), watermark_ms, armed)


def test_a_closed_connection_leaves_no_state() -> None:
    frames = [f for f in scenario() if f.conn == "tap1-av"]
    from tests.checks.builders import Conversation

    closing = Conversation(conn="tap1-av", seq=frames[-1].seq + 1)
    store = DictBucketStore()
    one_bucket(frames, store, 0, None)
    assert conn_key("tap1-av") in store.entries
    one_bucket([closing.close(frames[-1].ts_ns + 1)], store, 0, None)
    assert conn_key("tap1-av") not in store.entries


def test_a_route_key_no_rule_forms_is_dropped_and_counted() -> None:
    buffered = [RouteEntry(1, 1, "c", 1, b"{}", 0)]
    result = keyed_step(CONFIG, "apiversions.cluster|cluster", b"{}", buffered, 10)
    assert result.state is None and result.buffer == [] and result.next_timer_ms is None
    assert result.rows == [] and result.counts == {"unknown_route_keys": 1, "dropped_routes": 1}


@pytest.mark.parametrize("paged", [False, True], ids=["dict", "paged"])
@pytest.mark.parametrize("buckets", [1, 3, 16])
def test_bucketed_stages_find_what_one_monitor_finds(buckets: int, paged: bool) -> None:
    frames = with_headers_only()
    expected = expected_of(frames)
    for batch_size in (1, 7, 1000):
        rows, _ = run_bucketed(frames, batch_size, buckets, paged)
        assert findings_of(rows) == expected


@pytest.mark.parametrize("paged", [False, True], ids=["dict", "paged"])
def test_bucketed_real_traffic(paged: bool) -> None:
    frames = corpus_frames()
    rows, _ = run_bucketed(frames, 9, 4, paged)
    assert findings_of(rows) == expected_of(frames)


def test_a_batch_makes_a_call_per_bucket_not_per_key() -> None:
    frames = scenario()
    connections = len({f.conn for f in frames})
    _, calls = run_bucketed(frames, len(frames), 2)
    # One batch with everything, one empty batch that moves the watermark: at most 2 buckets of input
    # calls, plus timers.
    assert connections > 4 and calls <= 2 * 2


def test_an_idle_connection_expires_by_the_bucket_timer() -> None:
    frames = [f for f in scenario() if f.conn == "tap1-av"]
    store = DictBucketStore()
    key = conn_key("tap1-av")
    result = one_bucket(frames, store, 0, None)
    assert result.timer_ms is not None
    expiry = store.entries[key][-1]
    ttl_ms = int(CONFIG.connection_ttl_seconds * 1000)
    assert expiry >= max(f.ts_ns for f in frames) // NS_PER_MS + ttl_ms
    early = monitor_bucket_expired(CONFIG, store, expiry - 1)
    assert key in store.entries and early.timer_ms is not None and early.timer_ms <= expiry
    assert "evicted_keys" not in {name for p in payloads(early.rows, "stat") for name in p}
    late = monitor_bucket_expired(CONFIG, store, expiry)
    assert key not in store.entries
    assert sum(p.get("evicted_keys", 0) for p in payloads(late.rows, "stat")) >= 1


def test_a_bucket_keeps_an_earlier_armed_timer() -> None:
    frames = [f for f in scenario() if f.conn == "tap1-av"]
    # Armed after the batch clock's watermark (so not swept now) and before every new timer.
    armed = max(f.ts_ns for f in frames) // NS_PER_MS
    assert one_bucket(frames, DictBucketStore(), 0, armed).timer_ms == armed


def test_a_source_batch_sends_one_bundle_per_bucket_and_one_row_per_aggregate() -> None:
    frames = scenario()
    routed = route_rows(CONFIG, rows_of(flatten(exchange_records(frames))), 4)
    assert sorted(routed.bundles) == [0, 1, 2, 3], "every bucket gets the batch clock"
    assert {b.newest_ms for b in routed.bundles.values()} == {max(f.ts_ns for f in frames) // NS_PER_MS}
    conns = [key for b in routed.bundles.values() for key in b.conns]
    assert sorted(conns) == sorted(conn_key(c) for c in {f.conn for f in frames})
    rows = [read_connection_row(packed) for b in routed.bundles.values() for packed in b.conns.values()]
    assert sum(len(list(row.feed_order())) for row in rows) == len(frames)
    # The exchanges no connection-scoped rule names whole travel by their headers only.
    assert sum(len(row.exchanges) for row in rows) > 0
    route_keys = [key for b in routed.bundles.values() for key in b.routes]
    assert len(route_keys) == len(set(route_keys)) > 4
    aggs = payloads(routed.passed, "agg")
    assert len({(a["dir"], a["api_key"], a["api_version"]) for a in aggs}) == len(aggs)
    assert sum(a["frames"] for a in aggs) == sum(1 for f in frames if f.direction in ("req", "resp"))


def test_a_source_batchs_counters_say_what_its_bundles_hand_the_stage() -> None:
    """``stage.rows_per_wire_frame`` (issue 35) as the job reports it: per source batch, the requests and
    responses routed (not the tap's events) and what the bundles it returned hand the stateful stage."""
    frames = scenario()
    assert any(f.direction not in ("req", "resp") for f in frames), "a tap event the count leaves out"
    routed = route_rows(CONFIG, rows_of(flatten(exchange_records(frames))), 4)
    [counted] = payloads(routed.passed, "stat")
    bundles = routed.bundles.values()
    assert counted["wire_frames"] == sum(1 for f in frames if f.direction in ("req", "resp"))
    assert counted["stage_rows"] == sum(stage_rows(b) for b in bundles) > 0
    assert counted["stage_header_exchanges"] == sum(header_exchanges(b) for b in bundles) > 0


def batch_findings(stages: LocalStages, frames: list[TapFrame], watermark_ms: int) -> list[Any]:
    """One micro-batch with Spark's watermark ``watermark_ms``: its findings."""
    return findings_of(stages.batch(rows_of(frames), watermark_ms))


def test_the_batch_clock_releases_in_the_batch_whose_data_passed_the_routes() -> None:
    """Spark's watermark is 0 in the first batch; the batch's own newest event time minus the lateness
    passes every routed frame of the scenario, so the stage releases them all in that batch: every
    finding comes out of it, not one batch later."""
    frames = flatten(exchange_records(with_headers_only()))
    newest = max(f.ts_ns for f in frames)
    expected = single_run(frames)
    assert max(f.ts_ns for f in expected) <= newest - LATENESS_NS
    assert batch_findings(LocalStages(CONFIG, 4), frames, 0) == summary(expected)


def test_the_batch_clock_fires_keys_that_got_no_routes_this_batch() -> None:
    """Routes waiting from an earlier batch are released when this batch's clock passes them, though
    their key got nothing new: the bucket's timer would only fire a batch later."""
    records = exchange_records(with_headers_only())
    cut = 17_500 * NS_PER_MS
    first = flatten([r for r in records if r[-1].ts_ns <= cut])
    later = flatten([r for r in records if r[-1].ts_ns > cut])
    stages = LocalStages(CONFIG, 4)
    found = batch_findings(stages, first, 0)
    # The producer's duplicate at 17 s waits: the first batch's clock is 2 s before its newest frame.
    assert not any(rule == "producer.sequence_duplicate" for _, rule, *_ in found)
    assert not any(f.conn == "tap1-dup" for f in later), "the key gets no routes in the second batch"
    found += batch_findings(stages, later, (cut - LATENESS_NS) // NS_PER_MS)
    assert sorted(found) == summary(single_run(flatten(records)))


def test_an_answer_whose_request_came_in_an_earlier_batch_is_counted_not_routed() -> None:
    """A schema-1 record (a tap not yet upgraded) holds one frame: a response whose request was in an
    earlier micro-batch reaches its connection's key, which pairs it, but the router, which keeps
    nothing between batches, cannot route it; it is counted, and nothing is found that was not."""
    from tests.checks import test_producers as pr

    zombie, _ = pr.two_clients()
    request, response = pr.init_pid(zombie, SECOND_NS, epoch=0, txn_id=None)
    stages = LocalStages(CONFIG, 4)
    out = stages.batch(rows_of([request]), 0)
    out += stages.batch(rows_of([response]), 0)
    out += stages.batch([], 2**62)
    counted = _counted_all(out)
    assert counted["unrouted_responses"] == 1
    assert counted["exchanges"] == 1 and "unpaired_responses" not in counted
    assert [f["rule"] for f in payloads(out, "finding")] == ["apiversions.no_handshake"]
    # In one batch the same two frames are routed: nothing is counted unrouted.
    together = LocalStages(CONFIG, 4)
    both = together.batch(rows_of([request, response]), 0) + together.batch([], 2**62)
    assert "unrouted_responses" not in _counted_all(both)


def _counted_all(rows: list[OutputRow]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for payload in payloads(rows, "stat"):
        for name, n in payload.items():
            totals[name] += n
    return dict(totals)


def test_summaries_through_the_stages_find_what_one_monitor_finds() -> None:
    """Runs of ordinary Produce exchanges and of steady heartbeats travel as summary entries
    (``checks.summaries``), held and applied by the stage, or fed as their routes where another route
    falls inside them: the single monitor's findings in every micro-batching."""
    from checks.routes import SUMMARY
    from tests.checks.test_summaries import group_traffic, traffic

    producer = ["next"] * 5 + ["pipeline", "twin", "next", "fence", "next", "next", "gap", "next", "retry"]
    producer += ["other", "next", "pipeline", "error", "next", "next", "partition", "next", "next", "zombie"]
    producer += ["next", "next"]
    frames = sorted(
        traffic(producer, [1, 2])
        + group_traffic(["beat"] * 4 + ["beat2", "fence", "beat", "beat", "rejoin", "beat", "beat2", "beat"]),
        key=lambda f: (f.ts_ns, f.conn, f.seq),
    )
    expected = expected_of(frames)
    assert {"producer.stale_epoch_accepted", "producer.sequence_gap", "group.member_epoch_fenced"} <= {
        rule for _, rule, *_ in expected
    }
    routed = route_rows(CONFIG, rows_of(flatten(exchange_records(frames))), 4)
    entries = [RouteEntry(*e) for b in routed.bundles.values() for es in b.routes.values() for e in es]
    assert {"tap1-app", "tap1-m1"} <= {e.conn for e in entries if e.flags & SUMMARY}
    for batch_size in (1, 3, 7, 1000):
        assert findings_of(run_bucketed(frames, batch_size, 4)[0]) == expected, batch_size


def test_a_waiting_summary_holds_back_the_routes_that_may_fall_inside_it() -> None:
    """A zombie's run of writes spans the fence by another instance, and the batch clock passes the
    fence before the run's end: released alone, the fence would be judged before the run's first write,
    which was sent before it. The stage holds it with the summary, sees it inside and feeds the routes."""
    from tests.checks import test_producers as pr

    zombie, fencer = pr.two_clients()
    frames = [*pr.init_pid(zombie, 0, epoch=0, txn_id=None), *pr.write(zombie, SECOND_NS, epoch=0, seq=0)]
    frames += pr.write(zombie, 2 * SECOND_NS, epoch=0, seq=1)
    frames += pr.init_pid(fencer, 2 * SECOND_NS + SECOND_NS // 2, epoch=1, txn_id=None)
    frames += [
        *pr.write(zombie, 3 * SECOND_NS, epoch=0, seq=2),
        *pr.write(zombie, 6 * SECOND_NS, epoch=0, seq=3),
    ]
    frames.sort(key=lambda f: (f.ts_ns, f.conn, f.seq))
    expected = expected_of(frames)
    assert [rule for _, rule, *_ in expected if rule.startswith("producer")] == [
        "producer.stale_epoch_accepted"
    ] * 2
    assert findings_of(run_bucketed(frames, 1000, 4)[0]) == expected


def test_an_answer_held_past_the_batch_clock_is_released_by_its_keys_timer() -> None:
    """A JoinGroup answered three seconds after it was sent (a rebalance waits for its members): the
    first batch's clock passes the request, not the answer, which the group's key holds. No later
    batch brings that key anything, yet the answer's finding comes out when a clock passes it."""
    joining = Conversation(conn="tap1-join", client_id="member")
    request, answer = gr.join(joining, 10 * SECOND_NS, "m-a", 1, resp_type="connect")
    answer = replace(answer, ts_ns=13 * SECOND_NS)
    other = Conversation(conn="tap1-other", client_id="other")
    later = other.exchange(3, 12, {"Topics": None}, {"Brokers": [], "Topics": []}, 20 * SECOND_NS)
    records = exchange_records([request, answer]) + exchange_records(later)
    stages = LocalStages(CONFIG, 4)
    first = batch_findings(stages, flatten(records[:1]), 0)
    assert not any(rule == "group.protocol_type_mismatch" for _, rule, *_ in first)
    found = first + batch_findings(stages, flatten(records[1:]), (13 * SECOND_NS - LATENESS_NS) // NS_PER_MS)
    assert [rule for _, rule, *_ in found if rule.startswith("group.")] == ["group.protocol_type_mismatch"]
    assert sorted(found) == summary(single_run(flatten(records)))
