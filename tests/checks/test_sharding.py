"""The sharded run (what the streaming job does) finds exactly what one monitor finds.

The driver below plays the streaming job's part in-process: micro-batches of tap records (a request
and its response in one, ``tests.checks.exchanges``) in arrival order; each batch routed with no state
(``Router``); each connection's own shard fed in seq order; routes buffered per key until the
watermark (newest event time minus the lateness) passes them, then fed in event-time order; every
shard's state saved as bytes and restored between micro-batches, as a state store would.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import checks
import codec
from checks.engine import STATE_FORMAT, STATE_MAGIC, Monitor, StateFormatError
from checks.model import Finding
from checks.routes import Route
from checks.settings import ChecksSettings
from checks.sharding import ConnectionShard, KeyedShard, Router, cached_plans, connection_row
from codec.protocol import ApiKey
from codec.taprecord import FIELDS, TapFrame, frame_from_packed, pack_frame, unpack_frame
from tests.checks import test_apiversions as av
from tests.checks import test_flexible as fl
from tests.checks import test_groups as gr
from tests.checks import test_producers as pr
from tests.checks import test_transactions as tx
from tests.checks.builders import SECOND, Conversation, arrival_order
from tests.checks.exchanges import (
    as_built_before,
    entry_of,
    exchange_records,
    flatten,
    held_back,
    micro_batches,
    released,
)
from tests.checks.test_envelope import envelope

CONFIG = ChecksSettings(watermark_seconds=2.0)
LATENESS_NS = int(CONFIG.watermark_seconds * 1e9)


def scenario() -> list[TapFrame]:
    """Every rule family at once, on interleaved connections, in event-time order."""
    frames: list[TapFrame] = []
    zombie, fencer = pr.two_clients()
    frames += [
        *pr.init_pid(zombie, 0, epoch=0),
        *pr.write(zombie, 1 * SECOND, epoch=0, seq=0),
        *pr.init_pid(fencer, 2 * SECOND, epoch=1),
        *pr.write(zombie, 3 * SECOND, epoch=0, seq=1, error=pr.FENCED),
        *pr.write(fencer, 4 * SECOND, epoch=1, seq=0),
        *pr.write(fencer, 5 * SECOND, epoch=1, seq=3),  # a sequence gap
    ]
    p = tx.Producer()
    frames += [*p.init(0, epoch=0, timeout_ms=5000), *p.add(SECOND, [0]), *p.produce(SECOND + 10_000_000, 0)]
    frames += p.end(30 * SECOND)  # hangs at 6 s, resolves at 30 s
    a, b = gr.two()
    frames += gr.healthy_rebalance(a, b, SECOND)
    frames += gr.join(b, 3 * SECOND, "", 0, ptype="connect", error=23, resp_type=None, chosen="")
    conv = Conversation(conn="tap1-av")
    frames += [
        conv.open(0),
        *av.handshake(conv, 1 * SECOND, {**av.STANDARD, "Metadata": (0, 9)}),
        *av.metadata(conv, 12, 2 * SECOND),
        conv.garbage("req", b"\x00\x03\x00", 7 * SECOND),
    ]
    frames += envelope(Conversation(conn="tap1-env", listener="PLAINTEXT", client_id="evil"), 8 * SECOND)
    gap = Conversation(conn="tap1-gap")
    frames += [*pr.init_pid(gap, 9 * SECOND, epoch=0, pid=777, txn_id=None)]
    gap.lose(3)  # the tap lost three records here
    frames += pr.write(gap, 10 * SECOND, epoch=0, seq=5, count=1)
    frames += pr.write(gap, 11 * SECOND, epoch=0, seq=9, count=1)
    frames += more_rules()
    frames.sort(key=lambda f: (f.ts_ns, f.conn, f.seq))
    return frames


def more_rules() -> list[TapFrame]:
    """The rest of the catalogue's families, each on connections of its own."""
    frames: list[TapFrame] = []
    outside = tx.Producer(name="outside", txn_id="outside-tx", pid=8100)
    frames += [*outside.init(12 * SECOND, epoch=0), *outside.add(13 * SECOND, [0])]
    frames += [*outside.produce(13 * SECOND + 10_000_000, 0), *outside.produce(13 * SECOND + 20_000_000, 2)]
    # Transactions end, so no hanging timer fires later than the rest of the scenario.
    frames += outside.end(13 * SECOND + 30_000_000)
    owner = tx.Producer(name="owner", txn_id="owner-tx", pid=8200)
    other = tx.Producer(name="other", txn_id="other-tx", pid=8200)
    frames += [
        *owner.init(14 * SECOND, epoch=0),
        *owner.add(15 * SECOND, [0]),
        *owner.end(15 * SECOND + 10_000_000),
    ]
    other.epoch = 0
    frames += [*other.add(16 * SECOND, [1]), *other.end(16 * SECOND + 10_000_000)]  # txn.pid_hijack
    dup = Conversation(conn="tap1-dup", client="10.0.0.9:40000")
    dup_req = pr.produce(dup, 17 * SECOND, [(3, pr.batch(0, 7, pid=9300))])
    frames += [dup_req, pr.answer(dup, dup_req, 17 * SECOND + 2_000_000, [(3, pr.DUPLICATE, -1)])]
    b1 = Conversation(conn="tap1-b1", broker="10.0.0.1:9092", broker_id=11)
    b2 = Conversation(conn="tap1-b2", broker="10.0.0.2:9092", broker_id=12)
    frames += av.handshake(b1, 18 * SECOND)
    frames += av.handshake(b2, 18 * SECOND + 1_000_000, {**av.STANDARD, "Fetch": (4, 16)})  # cluster_skew
    legacy = Conversation(conn="tap1-legacy", client_id="legacy")
    frames += av.handshake(legacy, 19 * SECOND, {**av.STANDARD, "Fetch": (0, 17)}, software="kafka-python")
    frames += legacy.exchange(
        av.FETCH,
        3,
        {"ReplicaId": -1, "MaxWaitMs": 1, "MinBytes": 1, "Topics": []},
        {},
        19 * SECOND + 1_000_000,
    )  # removed_in_4_0
    flex = Conversation(conn="tap1-flex", client_id=fl.CLIENT_ID)
    raw = fl.metadata_raw(12)
    frames.append(flex.garbage("req", raw[: fl.HEADER_END] + raw[fl.HEADER_END + 1 :], 20 * SECOND))
    tags = bytes([2, 7, 1, ord("a"), 3, 1, ord("b")])
    frames.append(flex.garbage("req", raw[: fl.HEADER_END] + tags + raw[fl.HEADER_END + 1 :], 21 * SECOND))
    return frames


def tap_loss() -> list[TapFrame]:
    """A zombie producer whose connection lost records at the tap before its stale write: the finding
    about that write is keyed by the transaction, far from the connection, and still incomplete."""
    zombie, fencer = pr.two_clients()
    frames = [
        *pr.init_pid(zombie, 0, epoch=0),
        *pr.write(zombie, 1 * SECOND, epoch=0, seq=0),
        *pr.init_pid(fencer, 2 * SECOND, epoch=1),
    ]
    zombie.lose(2)
    frames += [*pr.write(zombie, 3 * SECOND, epoch=0, seq=1), *pr.write(fencer, 4 * SECOND, epoch=1, seq=0)]
    return sorted(frames, key=lambda f: (f.ts_ns, f.conn, f.seq))


def with_headers_only() -> list[TapFrame]:
    """``scenario()``, requests known by their header alone and read-committed fetches the router
    judges itself (kept out of ``scenario()``, which the end-to-end and DAG tests replay with their own
    decode-error budgets)."""
    return sorted(
        scenario() + headers_only(22 * SECOND) + read_committed(), key=lambda f: (f.ts_ns, f.conn, f.seq)
    )


def read_committed() -> list[TapFrame]:
    """A read-committed consumer's fetches: one answered with a last stable offset above the high
    watermark, one whose abort marker the aborted list does not name (``txn.read_committed_inconsistent``)."""
    inconsistent = tx.fetch(b"", None, hw=50, lso=60)
    aborted = tx.fetch(tx.batch(0, 0, 2, offset=10) + tx.marker(0, 12), [])
    return [*inconsistent, *(replace(f, conn="consumer-2", offset=f.offset + 1000) for f in aborted)]


def headers_only(at: int) -> list[TapFrame]:
    """Requests known by their header alone, judged at both scopes: an undecodable Produce v2 (out of
    range here, and removed in 4.0: the cluster rule), an undecodable Metadata v99 (no codec defines it)
    and a header-only Fetch v3 (``meta`` capture, another software's connection)."""
    conv = Conversation(conn="tap1-undecodable", client_id="old-app")
    meta = Conversation(conn="tap1-meta", client_id="meta-app")
    return [
        conv.open(at),
        *av.handshake(conv, at + 1_000_000),
        conv.undecodable_request(av.PRODUCE, 2, b"\xff", at + 2_000_000),
        conv.undecodable_request(av.METADATA, 99, b"\x00\x00\x00\x00", at + 3_000_000),
        meta.open(at),
        meta.header_only_request(av.FETCH, 3, at + 4_000_000),
    ]


def single_run(frames: list[TapFrame]) -> list[Finding]:
    monitor = checks.new_monitor(CONFIG)
    return monitor.feed_all(frames) + monitor.flush()


def sharded_run(frames: list[TapFrame], cuts: list[int]) -> list[Finding]:
    """``frames`` as tap records (``exchange_records``), cut into micro-batches before the records
    numbered in ``cuts``, through the job's steps."""
    return sharded_records(exchange_records(frames), cuts)


def sharded_records(records: list[list[TapFrame]], cuts: list[int], before: bool = False) -> list[Finding]:
    """``before``: the routes as a build before exchange routes wrote them (``as_built_before``), as a
    checkpoint's held entries may still hold them."""
    conn_states: dict[str, bytes] = {}
    key_states: dict[str, bytes] = {}
    buffers: dict[str, list[Route]] = defaultdict(list)
    findings: list[Finding] = []
    max_ts = 0

    def release(key: str, upto: int | None) -> None:
        # A waiting summary holds back what sorts after its start, as in the stage.
        ready, buffers[key] = released(buffers[key], upto)
        shard = KeyedShard(CONFIG, key, key_states.get(key))
        # Routes cross a process boundary as bytes plus metadata (summaries too): decode them again,
        # as the job does.
        findings.extend(shard.feed(crossed(r) for r in ready))
        findings.extend(shard.advance(upto if upto is not None else max_ts, held_back(buffers[key])))
        key_states[key] = shard.export()

    for per_conn in micro_batches(records, cuts):
        max_ts = max(max_ts, *(f.ts_ns for mine in per_conn.values() for f in mine))
        for conn, mine in per_conn.items():
            router = Router(CONFIG)
            routes = router.route(mine)
            for route in as_built_before(routes) if before else routes:
                buffers[route.key].append(route)
            findings.extend(router.findings)
            shard = ConnectionShard(CONFIG, conn_states.get(conn))
            # The connection's own key gets its row (``connection_row``): frames cross as bytes too.
            row = connection_row(mine)
            row.frames = [unpack_frame(pack_frame(f)) for f in row.frames]
            findings.extend(shard.feed_row(row))
            conn_states[conn] = shard.export()
        watermark = max_ts - LATENESS_NS
        for key in list(buffers.keys() | key_states.keys()):
            release(key, watermark)
    for key in list(buffers.keys() | key_states.keys()):
        release(key, None)
    return findings


def crossed(route: Route) -> Route:
    """``route`` packed as the bundle carries it and read back (``streaming.rows``)."""
    return entry_of(route).route(route.key)


def single_records(records: list[list[TapFrame]]) -> list[Finding]:
    """The single monitor over the frames of ``records``, as the tap numbered them."""
    return single_run(flatten(records))


def summary(findings: list[Finding]) -> list[tuple[str, str, str, str, bool]]:
    return sorted((f.id, f.rule, f.subject, f.severity.value, f.incomplete) for f in findings)


def test_the_scenario_raises_every_family() -> None:
    found = single_run(scenario())
    rules = {f.rule for f in found}
    # The tap's loss on tap1-gap makes the finding on that connection's write incomplete, and no other.
    assert {(f.rule, f.subject) for f in found if f.incomplete} == {
        ("producer.stale_epoch_accepted", "txn:tx")
    }
    assert {
        "producer.stale_epoch_rejected",
        "producer.sequence_gap",
        "txn.hanging",
        "group.protocol_type_mismatch",
        "apiversions.out_of_range",
        "frame.decode_error",
        "envelope.untrusted_source",
        "tap.gap",
        "txn.produce_outside_txn",
        "txn.pid_hijack",
        "producer.sequence_duplicate",
        "apiversions.cluster_skew",
        "apiversions.removed_in_4_0",
        "flex.header_version",
        "flex.tagged_fields",
    } <= rules, sorted(rules)


def test_a_tap_loss_makes_keyed_findings_incomplete_in_every_micro_batching() -> None:
    """The loss is stamped on the zombie's later frames: the connection shard flags their routes, and
    the transaction's shard reports its finding incomplete, as the single monitor does."""
    frames = tap_loss()
    single = single_run(frames)
    assert [(f.rule, f.subject, f.incomplete) for f in single if f.rule.startswith(("producer", "tap"))] == [
        ("tap.gap", "conn:tap1-z", False),
        ("producer.stale_epoch_accepted", "txn:tx", True),
    ]
    for cuts in ([], *([cut] for cut in range(len(frames)))):
        assert summary(sharded_run(frames, cuts)) == summary(single)


def test_an_add_answered_in_a_later_micro_batch_than_its_request_blames_nobody() -> None:
    """A request and its answer in two records (schema 1, one frame a record) that the job reads in two
    micro-batches: the router pairs only within a batch, so the transaction's key never sees the
    AddPartitionsToTxn answer. The write after it is incomplete ``info``, not a client's fault; read
    whole, the same frames raise nothing."""
    p = tx.Producer()
    frames = [*p.init(0, epoch=0), *p.add(SECOND, [0]), *p.produce(SECOND + 10_000_000, 0)]
    frames += [*p.end(SECOND + 20_000_000), *p.add(2 * SECOND, [2]), *p.produce(2 * SECOND + 10_000_000, 2)]
    frames += p.end(2 * SECOND + 20_000_000)
    records = flatten_to_frames(exchange_records(frames))
    assert [f.rule for f in single_records(records) if f.rule.startswith("txn")] == []
    answer = max(
        i
        for i, r in enumerate(records)
        if r[0].api_key == ApiKey.ADD_PARTITIONS_TO_TXN and r[0].direction == "resp"
    )
    assert records[answer - 1][0].direction == "req"  # the second add's request: the cut falls between
    found = [f for f in sharded_records(records, [answer]) if f.rule.startswith("txn")]
    assert [(f.rule, f.severity.value, f.incomplete, f.evidence["partition"]) for f in found] == [
        ("txn.produce_outside_txn", "info", True, 2)
    ]
    for cut in range(len(records)):
        found = sharded_records(records, [cut])
        assert all(f.incomplete for f in found if f.rule.startswith("txn")), cut


def flatten_to_frames(records: list[list[TapFrame]]) -> list[list[TapFrame]]:
    """Each frame of ``records`` as a record of its own, as schema 1 writes them."""
    return [[frame] for record in records for frame in record]


def test_requests_known_by_their_header_reach_the_cluster_shard_once() -> None:
    """Undecodable and header-only requests: the connection shard reports the decode errors, the
    cluster shard judges their headers (KIP-896 removals) without a decode error of its own."""
    frames = headers_only(SECOND)
    single = single_run(frames)
    found = sorted((f.rule, f.subject) for f in single)
    assert found == [
        ("apiversions.no_handshake", "conn:tap1-meta"),
        ("apiversions.out_of_range", "conn:tap1-undecodable"),
        ("apiversions.out_of_range", "conn:tap1-undecodable"),
        ("apiversions.removed_in_4_0", "client:client.id="),
        ("apiversions.removed_in_4_0", "client:librdkafka/2.6.0"),
        ("frame.decode_error", "conn:tap1-undecodable"),
        ("frame.decode_error", "conn:tap1-undecodable"),
    ], found
    records = exchange_records(frames)
    assert summary(single_records(records)) == summary(single)
    for cuts in ([], list(range(len(records)))):
        assert summary(sharded_records(records, cuts)) == summary(single)
    routes = Router(CONFIG).route([f for f in frames if f.conn == "tap1-undecodable"])
    routed = [r for r in routes if r.frame.error is not None]
    # Both undecodable requests go to the cluster key as they came (error and bytes), request-only.
    assert [(r.key, r.frame.api_version, r.request_only) for r in routed] == [
        ("cluster|cluster", 2, True),
        ("cluster|cluster", 99, True),
    ]
    assert all(r.frame.message is None and r.frame.raw for r in routed)
    keyed = KeyedShard(CONFIG, "cluster|cluster")
    assert [f.rule for f in keyed.feed(routed)] == ["apiversions.removed_in_4_0"]
    assert keyed.ctx.stats.decode_errors == 0


def test_requests_of_api_keys_kafka_does_not_define_keep_no_routing_plan() -> None:
    """A header can carry any int16 api key; the plans kept stay bounded by the keys Kafka defines."""
    conv = Conversation(conn="tap1-hostile", client_id="fuzzer")
    unknown = [k for k in range(20_000, 20_200) if k not in {int(a) for a in ApiKey}]
    frames = [conv.open(SECOND), *av.handshake(conv, SECOND + 1_000_000)]
    frames += [conv.undecodable_request(k, 0, b"\x00", SECOND + 2_000_000 + i) for i, k in enumerate(unknown)]
    Router(CONFIG).route(frames[:3])
    before = cached_plans()
    Router(CONFIG).route(frames)
    assert cached_plans() == before
    # ...and they are still judged: each is a decode error of the connection.
    shard = ConnectionShard(CONFIG)
    shard.feed(frames)
    assert shard.ctx.stats.decode_errors >= len(unknown)


def test_an_envelope_routes_the_request_it_forwards() -> None:
    """KIP-590: the keyed rules see a forwarded request (here a transactional InitProducerId) as well
    as the Envelope, so stage one routes both, rule by rule: the cluster key on first use only, the
    transactional id with the request, and the producer id the forwarded answer assigns."""
    inner_body = {
        "TransactionalId": "fwd-tx",
        "TransactionTimeoutMs": 60000,
        "ProducerId": -1,
        "ProducerEpoch": -1,
    }
    inner = codec.encode_request(ApiKey.INIT_PRODUCER_ID, 4, 99, "fwd", inner_body)
    answer = {"ThrottleTimeMs": 0, "ErrorCode": 0, "ProducerId": 4242, "ProducerEpoch": 0}
    inner_resp = codec.encode_response(ApiKey.INIT_PRODUCER_ID, 4, 99, answer)
    req = {"RequestData": inner, "RequestPrincipal": b"", "ClientHostAddress": bytes([10, 0, 0, 5])}
    conv = Conversation(conn="tap1-fwd", listener="CONTROLLER")
    frames = conv.exchange(ApiKey.ENVELOPE, 0, req, {"ResponseData": inner_resp, "ErrorCode": 0}, SECOND)
    frames += conv.exchange(ApiKey.ENVELOPE, 0, req, {"ResponseData": inner_resp, "ErrorCode": 0}, 2 * SECOND)
    routes = [
        (r.key, r.frame.direction, r.request_only, r.answer and r.answer.direction)
        for r in Router(CONFIG).route(frames)
    ]
    # Each exchange is one route carrying its answer; the producer id's, which only the answer named,
    # goes at the answer's time.
    exchange = [("txn|fwd-tx", "req", False, "resp"), ("producer|4242", "req", False, "resp")]
    assert routes == [("cluster|cluster", "req", True, None), *exchange, *exchange]
    producer = [r for r in Router(CONFIG).route(frames) if r.key == "producer|4242"]
    assert all(r.at_ns == r.answer.ts_ns > r.frame.ts_ns for r in producer if r.answer is not None)
    records = exchange_records(frames)
    assert summary(sharded_records(records, [])) == summary(single_records(records))


def test_one_batch_matches_the_single_monitor() -> None:
    records = exchange_records(with_headers_only())
    assert summary(sharded_records(records, [])) == summary(single_records(records))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_any_micro_batching_and_arrival_order_matches(data: st.DataObject) -> None:
    records = exchange_records(with_headers_only())
    # Jitter below the lateness keeps the single monitor's answer fixed (its own property test).
    jitters = data.draw(st.lists(st.integers(0, LATENESS_NS // 2), max_size=len(records)))
    # A record arrives as a whole; within one connection the tap partition keeps record order.
    by_last = {id(record[-1]): record for record in records}
    arrived = [by_last[id(f)] for f in arrival_order([record[-1] for record in records], jitters)]
    cuts = data.draw(st.lists(st.integers(0, len(records)), max_size=12))
    assert summary(sharded_records(arrived, cuts)) == summary(single_records(records))


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_routes_held_from_a_build_before_exchange_routes_are_paired_by_the_shard(data: st.DataObject) -> None:
    """A checkpoint's held entries may come from a build whose router sent each answer as a route of
    its own: the keyed shard's engine pairs those, and finds what the single monitor finds."""
    records = exchange_records(with_headers_only())
    cuts = data.draw(st.lists(st.integers(0, len(records)), max_size=12))
    assert summary(sharded_records(records, cuts, before=True)) == summary(single_records(records))


def corpus_frames() -> list[TapFrame]:
    """tests/data/tap_frames.jsonl (real clients through the tap): one connection per client."""
    from codec.taprecord import frames_from_record

    frames: list[TapFrame] = []
    seqs: dict[str, int] = defaultdict(int)
    path = Path(__file__).resolve().parents[1] / "data" / "tap_frames.jsonl"
    for offset, line in enumerate(path.read_text().splitlines()):
        record = json.loads(line)
        conn = f"corpus-{record['source']}"
        headers = {
            "dir": record["dir"],
            "conn": conn,
            "seq": str(seqs[conn]),
            "ts_ns": str(SECOND + offset * 1_000_000),
            "api_key": str(record["api_key"]),
            "api_version": str(record["api_version"]),
            "corr_id": str(record["corr_id"]),
            "client": f"127.0.0.1:{40000 + len(seqs)}",
            "broker": "127.0.0.1:9092",
        }
        seqs[conn] += 1
        frames.append(frames_from_record(headers, bytes.fromhex(record["hex"]), 0, offset)[0])
    return frames


def test_real_captured_traffic_matches() -> None:
    frames = corpus_frames()
    assert len(frames) == 100 and not any(f.error for f in frames)
    records = exchange_records(frames)
    assert summary(sharded_records(records, list(range(0, len(records), 7)))) == summary(
        single_records(records)
    )


def test_state_survives_bytes_and_refuses_other_formats() -> None:
    monitor = checks.new_monitor(CONFIG)
    frames = scenario()
    monitor.feed_all(frames[: len(frames) // 2])
    saved = monitor.to_state()
    assert saved.startswith(STATE_MAGIC + bytes([STATE_FORMAT]))
    restored = Monitor.from_state(saved, checks.all_rules(), checks.Context(CONFIG))
    rest = frames[len(frames) // 2 :]
    expected = monitor.feed_all(rest) + monitor.flush()
    assert summary(restored.feed_all(rest) + restored.flush()) == summary(expected)
    newer = STATE_MAGIC + bytes([STATE_FORMAT + 1]) + saved[len(STATE_MAGIC) + 1 :]
    older_json = json.dumps({"format": 1, "states": []}).encode()
    for data, message in (
        (newer, "newer than this kpmon"),
        (older_json, "JSON text: format 1"),
        (saved[:-3], "corrupt"),
    ):
        with pytest.raises(StateFormatError, match=message):
            Monitor.from_state(data, checks.all_rules(), checks.Context(CONFIG))
    with pytest.raises(StateFormatError, match="format 1 was JSON"):
        ConnectionShard(CONFIG, json.dumps({"monitor": {"format": 1}}).encode())


def _as_format_2(saved: bytes) -> bytes:
    """``saved`` rewritten as state format 2 wrote it: held frames as their metadata and bytes."""
    body = msgpack.unpackb(saved[len(STATE_MAGIC) + 1 :], raw=False, strict_map_key=False)

    def bytes_only(packed: list[Any]) -> list[Any]:
        frame = frame_from_packed(packed)
        assert frame.message is not None
        return [*packed[: len(FIELDS)], codec.encode(frame.message)]

    body["conns"] = [[conn, seq, [bytes_only(p) for p in pending]] for conn, seq, pending in body["conns"]]
    body["heap"] = [bytes_only(p) for p in body["heap"]]
    assert body["heap"] or any(pending for _, _, pending in body["conns"]), "no held frame to migrate"
    return STATE_MAGIC + bytes([2]) + msgpack.packb(body, use_bin_type=True)


def test_state_format_2_is_migrated_on_resume() -> None:
    monitor = checks.new_monitor(CONFIG)
    frames = scenario()
    monitor.feed_all(frames[: len(frames) // 2])
    saved = monitor.to_state()
    old = _as_format_2(saved)
    assert old != saved and old[:5] == b"KPMS\x02"
    restored = Monitor.from_state(old, checks.all_rules(), checks.Context(CONFIG))
    rest = frames[len(frames) // 2 :]
    expected = monitor.feed_all(rest) + monitor.flush()
    assert expected, "the scenario must leave something to find after the resume"
    assert summary(restored.feed_all(rest) + restored.flush()) == summary(expected)


def test_keyed_state_is_dropped_when_nothing_is_left() -> None:
    zombie, _ = pr.two_clients()
    routes = Router(CONFIG).route(pr.init_pid(zombie, 0, epoch=0, txn_id=None))
    keys = {r.key for r in routes}
    assert f"producer|{pr.PID}" in keys
    keyed = KeyedShard(CONFIG, f"producer|{pr.PID}")
    keyed.feed([r for r in routes if r.key == f"producer|{pr.PID}"])
    assert not keyed.monitor.conns  # the exchange completed: no pairing state kept
    assert not keyed.empty  # but the producer's epoch is remembered
    assert KeyedShard(CONFIG, f"producer|{pr.PID}").empty


def test_a_removed_version_closed_by_a_4x_broker_matches_in_every_micro_batching() -> None:
    """``apiversions.removed_version_rejected`` is emitted when the connection closes: the connection's
    shard keeps the unanswered request across micro-batches until its close record comes."""
    frames = av.old_producer(av.BROKER_4X, answered=False, closed=True)
    expected = summary(single_run(frames))
    assert "apiversions.removed_version_rejected" in {rule for _, rule, *_ in expected}
    records = exchange_records(frames)
    for cut in range(len(records) + 1):
        assert summary(sharded_records(records, [cut])) == expected, cut
