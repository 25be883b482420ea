"""Invariant-checker throughput and memory: every tracker (``checks.new_monitor()``) on pre-decoded frames.

Figures, not a timed test. The frames are a synthetic fleet's tap records, built with the codec's
encoder and decoded once before anything is timed (the trackers consume decoded frames). In the same
run, on the same frames, the codec's projected decode (only the fields the rules read) and its full
decode are timed: the target is trackers >= 5x the projected decode rate, so that the checks are never
the bottleneck of the streaming job. Rounds are interleaved (trackers, projected, full, next mix...) so
load drift on a shared machine hits all of them alike; the median round counts.

Peak memory comes from tracemalloc while 10 k producers, and separately 10 k consumer groups, are
tracked (with ``--quick``, fewer keys, scaled linearly to 10 k and marked as such).

    .venv/bin/python -m benchmarks.checks_bench            # ~3-4 minutes on 2 cores
    .venv/bin/python -m benchmarks.checks_bench --quick    # smoke run, ~30 seconds
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import struct
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import codec
from benchmarks.codec_bench import machine_info
from checks import new_monitor
from codec.api import Request, Response
from codec.records import RecordBatches, build_record_batch
from codec.taprecord import TapFrame

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "checks_bench.json"
TARGET_RATIO = 5.0

MS = 1_000_000
SECOND = 1_000_000_000

PRODUCE, FETCH, METADATA, OFFSET_COMMIT, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, SYNC_GROUP = (
    0,
    1,
    3,
    8,
    10,
    11,
    12,
    14,
)
API_VERSIONS, INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, END_TXN = 18, 22, 24, 26
OUT_OF_ORDER_SEQUENCE, INCONSISTENT_GROUP_PROTOCOL, PRODUCER_FENCED = 45, 23, 90

#: Per (direction, api key): the body fields the catalogue's rules read (ARCHITECTURE.md's projection
#: idea). APIs no rule reads beyond the header decode with an empty projection.
CHECK_FIELDS: dict[tuple[str, int], frozenset[str]] = {
    ("req", PRODUCE): frozenset(
        {
            "TransactionalId",
            "Acks",
            "TopicData.Name",
            "TopicData.TopicId",
            "TopicData.PartitionData.Index",
            "TopicData.PartitionData.Records",
        }
    ),
    ("resp", PRODUCE): frozenset(
        {
            "Responses.Name",
            "Responses.TopicId",
            "Responses.PartitionResponses.Index",
            "Responses.PartitionResponses.ErrorCode",
            "Responses.PartitionResponses.BaseOffset",
        }
    ),
    ("req", FETCH): frozenset({"IsolationLevel"}),
    ("resp", FETCH): frozenset(
        {
            "Responses.Topic",
            "Responses.TopicId",
            "Responses.Partitions.PartitionIndex",
            "Responses.Partitions.ErrorCode",
            "Responses.Partitions.HighWatermark",
            "Responses.Partitions.LastStableOffset",
            "Responses.Partitions.AbortedTransactions",
            "Responses.Partitions.Records",
        }
    ),
    ("req", JOIN_GROUP): frozenset({"GroupId", "MemberId", "ProtocolType", "Protocols"}),
    ("resp", JOIN_GROUP): frozenset(
        {"ErrorCode", "GenerationId", "ProtocolType", "ProtocolName", "MemberId", "Members"}
    ),
    ("req", SYNC_GROUP): frozenset(
        {"GroupId", "GenerationId", "MemberId", "ProtocolType", "ProtocolName", "Assignments"}
    ),
    ("resp", SYNC_GROUP): frozenset({"ErrorCode", "ProtocolType", "ProtocolName", "Assignment"}),
    ("req", API_VERSIONS): frozenset({"ClientSoftwareName", "ClientSoftwareVersion"}),
    ("resp", API_VERSIONS): frozenset({"ErrorCode", "ApiKeys"}),
    ("req", INIT_PRODUCER_ID): frozenset(
        {"TransactionalId", "TransactionTimeoutMs", "ProducerId", "ProducerEpoch"}
    ),
    ("resp", INIT_PRODUCER_ID): frozenset({"ErrorCode", "ProducerId", "ProducerEpoch"}),
    ("req", ADD_PARTITIONS_TO_TXN): frozenset(
        {
            "Transactions",
            "V3AndBelowTransactionalId",
            "V3AndBelowProducerId",
            "V3AndBelowProducerEpoch",
            "V3AndBelowTopics",
        }
    ),
    ("resp", ADD_PARTITIONS_TO_TXN): frozenset(
        {"ErrorCode", "ResultsByTransaction", "ResultsByTopicV3AndBelow"}
    ),
    ("req", END_TXN): frozenset({"TransactionalId", "ProducerId", "ProducerEpoch", "Committed"}),
    ("resp", END_TXN): frozenset({"ErrorCode", "ProducerId", "ProducerEpoch"}),
}

#: The synthetic brokers advertise what the codec knows, except Metadata above v12: the "faulty" mix
#: sends Metadata v13 to make ``apiversions.out_of_range`` fire.
ADVERTISED_CAPS = {METADATA: 12}


# ---------------------------------------------------------------------------------------------------
# Traffic


def _subscription(topics: Iterable[str]) -> bytes:
    body = {"Topics": list(topics), "UserData": None, "OwnedPartitions": [], "GenerationId": -1}
    return struct.pack(">h", 3) + codec.encode_data("ConsumerProtocolSubscription", 3, body)


def _assignment(topic: str, partitions: list[int]) -> bytes:
    body = {"AssignedPartitions": [{"Topic": topic, "Partitions": partitions}], "UserData": None}
    return struct.pack(">h", 3) + codec.encode_data("ConsumerProtocolAssignment", 3, body)


def _api_versions_answer() -> dict[str, Any]:
    keys = []
    for api in sorted(codec.api_keys()):
        lo, hi = codec.supported_versions(api)
        keys.append({"ApiKey": api, "MinVersion": lo, "MaxVersion": min(hi, ADVERTISED_CAPS.get(api, hi))})
    return {"ErrorCode": 0, "ApiKeys": keys, "ThrottleTimeMs": 0}


@dataclass
class Fleet:
    """Tap records of a synthetic fleet, decoded up front. Identical frame bytes share one decode."""

    rng: random.Random
    frames: list[TapFrame] = field(default_factory=list)
    _decoded: dict[tuple[bytes, int, int], Request | Response] = field(default_factory=dict)
    _conns: int = 0
    _offset: int = 0

    def conn(self, ts_ns: int, client_id: str, software: str = "apache-kafka-java") -> Conn:
        self._conns += 1
        return Conn(
            self,
            f"tap-bench-{self._conns}",
            f"10.1.{self._conns // 250}.{self._conns % 250}:5{self._conns % 1000:03d}",
            client_id,
            software,
            ts_ns,
        )

    def decode(self, raw: bytes, direction: str, api_key: int, version: int) -> Request | Response:
        key = (raw, api_key if direction == "resp" else -1, version)
        message = self._decoded.get(key)
        if message is None:
            if direction == "req":
                message = codec.decode_request(raw)
            else:
                message = codec.decode_response(raw, api_key, version)
            self._decoded[key] = message
        return message

    def add(self, frame: TapFrame) -> None:
        self._offset += 1
        frame.partition, frame.offset = 0, self._offset
        self.frames.append(frame)

    def arrival_order(self, jitter_ns: int = 500 * MS) -> list[TapFrame]:
        """Event-time order, each frame delayed by up to ``jitter_ns`` (tap partitions interleave)."""
        rng = random.Random(7)
        keyed = sorted(self.frames, key=lambda f: (f.ts_ns + rng.randrange(jitter_ns), f.conn, f.seq))
        return keyed


@dataclass
class Conn:
    fleet: Fleet
    conn_id: str
    client: str
    client_id: str
    software: str
    ts_ns: int
    seq: int = 0
    corr: int = 0

    def _frame(self, direction: str, **kw: Any) -> TapFrame:
        self.seq += 1
        frame = TapFrame(
            conn=self.conn_id,
            seq=self.seq,
            ts_ns=self.ts_ns,
            direction=direction,
            client=self.client,
            broker="10.0.0.1:9092",
            broker_id=1,
            listener="PLAINTEXT",
            **kw,
        )
        self.fleet.add(frame)
        return frame

    def open(self) -> None:
        self._frame("open")

    def close(self) -> None:
        self._frame("close")

    def exchange(
        self,
        api_key: int,
        version: int,
        request: dict[str, Any],
        response: dict[str, Any],
        latency_ns: int = 2 * MS,
        gap_ns: int = 50 * MS,
    ) -> None:
        self.corr += 1
        raw = codec.encode_request(api_key, version, self.corr, self.client_id, request)
        ids = {"api_key": api_key, "api_version": version, "correlation_id": self.corr}
        self._frame("req", message=self.fleet.decode(raw, "req", api_key, version), raw=raw, **ids)
        self.ts_ns += latency_ns
        raw = codec.encode_response(api_key, version, self.corr, response)
        self._frame("resp", message=self.fleet.decode(raw, "resp", api_key, version), raw=raw, **ids)
        self.ts_ns += gap_ns

    def handshake(self) -> None:
        software = {"ClientSoftwareName": self.software, "ClientSoftwareVersion": "3.9.0"}
        self.exchange(API_VERSIONS, 3, software, _API_VERSIONS_ANSWER)


_API_VERSIONS_ANSWER = _api_versions_answer()


def _records(pid: int, epoch: int, seq: int, txn: bool, count: int = 10) -> bytes:
    return build_record_batch(
        [(b"key-%d" % i, b"v" * 100) for i in range(count)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=txn,
    )


def _produce(topic: str, partition: int, records: bytes, txn_id: str | None) -> dict[str, Any]:
    return {
        "TransactionalId": txn_id,
        "Acks": -1,
        "TimeoutMs": 30000,
        "TopicData": [{"Name": topic, "PartitionData": [{"Index": partition, "Records": records}]}],
    }


def _produced(topic: str, partition: int, offset: int, error: int = 0) -> dict[str, Any]:
    part = {"Index": partition, "ErrorCode": error, "BaseOffset": offset if error == 0 else -1}
    return {"Responses": [{"Name": topic, "PartitionResponses": [part]}]}


@dataclass(frozen=True)
class Shape:
    """How many of each client the fleet has, and how busy each is."""

    idempotent: int
    produces: int
    transactional: int
    transactions: int
    groups: int
    fetches: int
    #: Inject violations (for findings/s): gaps, zombies, out-of-range versions, mixed-protocol groups.
    faulty: bool = False
    #: Every idempotent batch skips sequence numbers: a finding per Produce, for the cost of findings.
    storm: bool = False


def idempotent_producer(fleet: Fleet, index: int, shape: Shape, start: int) -> None:
    c = fleet.conn(start, f"orders-producer-{index}")
    c.open()
    c.handshake()
    topic = f"orders-{index % 20}"
    if shape.faulty and index % 10 == 3:
        c.exchange(METADATA, 13, {"Topics": [{"Name": topic}]}, {"Topics": []})
    c.exchange(
        METADATA,
        12,
        {"Topics": [{"Name": topic}], "AllowAutoTopicCreation": False},
        {
            "Brokers": [{"NodeId": 1, "Host": "10.0.0.1", "Port": 9092}],
            "Topics": [
                {
                    "Name": topic,
                    "Partitions": [
                        {"PartitionIndex": p, "LeaderId": 1, "ReplicaNodes": [1], "IsrNodes": [1]}
                        for p in range(6)
                    ],
                }
            ],
        },
    )
    pid = 10_000 + index
    c.exchange(
        INIT_PRODUCER_ID,
        5,
        {"TransactionalId": None, "TransactionTimeoutMs": 60000, "ProducerId": -1, "ProducerEpoch": -1},
        {"ErrorCode": 0, "ProducerId": pid, "ProducerEpoch": 0},
    )
    seqs = [0] * 6
    offsets = [0] * 6
    gappy = shape.storm or (shape.faulty and index % 5 == 0)
    for i in range(shape.produces):
        partition = i % 6
        if gappy and (shape.storm or i % 5 == 4):
            seqs[partition] += 3
        records = _records(pid, 0, seqs[partition], False)
        error = OUT_OF_ORDER_SEQUENCE if gappy and (shape.storm or i % 5 == 4) else 0
        c.exchange(
            PRODUCE,
            9,
            _produce(topic, partition, records, None),
            _produced(topic, partition, offsets[partition], error),
        )
        if error == 0:
            offsets[partition] += 10
        seqs[partition] += 10
    c.close()


def transactional_producer(fleet: Fleet, index: int, shape: Shape, start: int) -> None:
    c = fleet.conn(start, f"payments-txn-{index}")
    c.open()
    c.handshake()
    txn_id, pid, topic = f"payments-{index}", 50_000 + index, f"payments-{index % 10}"
    c.exchange(
        FIND_COORDINATOR,
        4,
        {"KeyType": 1, "CoordinatorKeys": [txn_id]},
        {"Coordinators": [{"Key": txn_id, "NodeId": 1, "Host": "10.0.0.1", "Port": 9092, "ErrorCode": 0}]},
    )
    init = {"TransactionalId": txn_id, "TransactionTimeoutMs": 60000, "ProducerId": -1, "ProducerEpoch": -1}
    c.exchange(INIT_PRODUCER_ID, 5, init, {"ErrorCode": 0, "ProducerId": pid, "ProducerEpoch": 0})
    zombie = shape.faulty and index % 5 == 1
    seqs, offsets = [0, 0, 0], [0, 0, 0]
    for t in range(shape.transactions):
        if zombie and t == shape.transactions // 2:
            # A second instance with the same transactional.id takes over; this one keeps writing.
            other = fleet.conn(c.ts_ns, f"payments-txn-{index}-b")
            other.open()
            other.exchange(INIT_PRODUCER_ID, 5, init, {"ErrorCode": 0, "ProducerId": pid, "ProducerEpoch": 1})
            other.close()
            c.ts_ns = other.ts_ns + 10 * MS
        fenced = zombie and t >= shape.transactions // 2
        partition = t % 3
        add = {
            "V3AndBelowTransactionalId": txn_id,
            "V3AndBelowProducerId": pid,
            "V3AndBelowProducerEpoch": 0,
            "V3AndBelowTopics": [{"Name": topic, "Partitions": [partition]}],
        }
        added = {
            "ResultsByTopicV3AndBelow": [
                {
                    "Name": topic,
                    "ResultsByPartition": [
                        {"PartitionIndex": partition, "PartitionErrorCode": PRODUCER_FENCED if fenced else 0}
                    ],
                }
            ]
        }
        c.exchange(ADD_PARTITIONS_TO_TXN, 3, add, added)
        for _ in range(2):
            records = _records(pid, 0, seqs[partition], True)
            error = PRODUCER_FENCED if fenced else 0
            c.exchange(
                PRODUCE,
                9,
                _produce(topic, partition, records, txn_id),
                _produced(topic, partition, offsets[partition], error),
            )
            seqs[partition] += 10
            offsets[partition] += 10
        end = {"TransactionalId": txn_id, "ProducerId": pid, "ProducerEpoch": 0, "Committed": True}
        c.exchange(END_TXN, 4, end, {"ErrorCode": PRODUCER_FENCED if fenced else 0})
    c.close()


def consumer_group(fleet: Fleet, index: int, shape: Shape, start: int) -> None:
    group, topic = f"billing-{index}", f"orders-{index % 20}"
    members = [fleet.conn(start + i * MS, f"billing-consumer-{index}-{i}", "librdkafka") for i in range(2)]
    ids = [f"{m.client_id}-{index:08x}" for m in members]
    subscription = _subscription([topic])
    for m in members:
        m.open()
        m.handshake()
        m.exchange(
            FIND_COORDINATOR,
            4,
            {"KeyType": 0, "CoordinatorKeys": [group]},
            {"Coordinators": [{"Key": group, "NodeId": 1, "Host": "10.0.0.1", "Port": 9092, "ErrorCode": 0}]},
        )
    for i, m in enumerate(members):
        join = {
            "GroupId": group,
            "SessionTimeoutMs": 45000,
            "RebalanceTimeoutMs": 300000,
            "MemberId": ids[i],
            "ProtocolType": "consumer",
            "Protocols": [{"Name": "range", "Metadata": subscription}],
        }
        answer: dict[str, Any] = {
            "ErrorCode": 0,
            "GenerationId": 1,
            "ProtocolType": "consumer",
            "ProtocolName": "range",
            "Leader": ids[0],
            "MemberId": ids[i],
            "Members": [],
        }
        if i == 0:
            answer["Members"] = [{"MemberId": mid, "Metadata": subscription} for mid in ids]
        m.exchange(JOIN_GROUP, 9, join, answer)
    assignments = {ids[0]: [0, 1, 2], ids[1]: [3, 4, 5]}
    for i, m in enumerate(members):
        sync = {
            "GroupId": group,
            "GenerationId": 1,
            "MemberId": ids[i],
            "ProtocolType": "consumer",
            "ProtocolName": "range",
            "Assignments": [
                {"MemberId": mid, "Assignment": _assignment(topic, parts)}
                for mid, parts in assignments.items()
            ]
            if i == 0
            else [],
        }
        m.exchange(
            SYNC_GROUP,
            5,
            sync,
            {
                "ErrorCode": 0,
                "ProtocolType": "consumer",
                "ProtocolName": "range",
                "Assignment": _assignment(topic, assignments[ids[i]]),
            },
        )
    if shape.faulty and index % 10 == 7:
        intruder = fleet.conn(members[0].ts_ns, f"connect-worker-{index}")
        intruder.open()
        join = {
            "GroupId": group,
            "SessionTimeoutMs": 10000,
            "RebalanceTimeoutMs": 10000,
            "MemberId": "w-1",
            "ProtocolType": "connect",
            "Protocols": [{"Name": "sessioned", "Metadata": b"\x00\x01"}],
        }
        intruder.exchange(
            JOIN_GROUP,
            9,
            join,
            {"ErrorCode": INCONSISTENT_GROUP_PROTOCOL, "GenerationId": -1, "MemberId": "w-1"},
        )
        intruder.close()
    pid = 10_000 + index % max(shape.idempotent, 1)
    for i, m in enumerate(members):
        offset = 0
        for f in range(shape.fetches):
            partition = assignments[ids[i]][f % 3]
            records = _records(pid, 0, offset, False)
            fetch = {
                "ReplicaId": -1,
                "MaxWaitMs": 500,
                "MinBytes": 1,
                "MaxBytes": 52428800,
                "IsolationLevel": 1,
                "Topics": [
                    {
                        "Topic": topic,
                        "Partitions": [
                            {"Partition": partition, "FetchOffset": offset, "PartitionMaxBytes": 1048576}
                        ],
                    }
                ],
            }
            fetched = {
                "ErrorCode": 0,
                "Responses": [
                    {
                        "Topic": topic,
                        "Partitions": [
                            {
                                "PartitionIndex": partition,
                                "ErrorCode": 0,
                                "HighWatermark": offset + 10,
                                "LastStableOffset": offset + 10,
                                "LogStartOffset": 0,
                                "AbortedTransactions": [],
                                "Records": records,
                            }
                        ],
                    }
                ],
            }
            m.exchange(FETCH, 12, fetch, fetched, latency_ns=5 * MS, gap_ns=100 * MS)
            offset += 10
            if f % 3 == 2:
                m.exchange(
                    HEARTBEAT, 4, {"GroupId": group, "GenerationId": 1, "MemberId": ids[i]}, {"ErrorCode": 0}
                )
            if f % 5 == 4:
                commit = {
                    "GroupId": group,
                    "GenerationIdOrMemberEpoch": 1,
                    "MemberId": ids[i],
                    "Topics": [
                        {
                            "Name": topic,
                            "Partitions": [{"PartitionIndex": partition, "CommittedOffset": offset}],
                        }
                    ],
                }
                m.exchange(
                    OFFSET_COMMIT,
                    8,
                    commit,
                    {
                        "Topics": [
                            {"Name": topic, "Partitions": [{"PartitionIndex": partition, "ErrorCode": 0}]}
                        ]
                    },
                )
    for m in members:
        m.close()


def build_fleet(shape: Shape, seed: int = 1) -> list[TapFrame]:
    """The fleet's tap records in arrival order; clients start staggered over a minute of event time."""
    fleet = Fleet(random.Random(seed))
    Make = Callable[[Fleet, int, Shape, int], None]
    clients: list[tuple[Make, int]] = []
    kinds: list[tuple[Make, int]] = [
        (idempotent_producer, shape.idempotent),
        (transactional_producer, shape.transactional),
        (consumer_group, shape.groups),
    ]
    for make, count in kinds:
        clients.extend((make, i) for i in range(count))
    for n, (make, index) in enumerate(clients):
        make(fleet, index, shape, SECOND + n * 60 * SECOND // max(len(clients), 1))
    return fleet.arrival_order()


MIXES: dict[str, Shape] = {
    # A data-plane-heavy fleet: idempotent and transactional producers, 2-member read-committed groups.
    "fleet": Shape(idempotent=200, produces=40, transactional=50, transactions=10, groups=100, fetches=40),
    # The same fleet with violations injected (sequence gaps, zombies, out-of-range, mixed groups).
    "faulty": Shape(
        idempotent=200, produces=40, transactional=50, transactions=10, groups=100, fetches=40, faulty=True
    ),
    # Every Produce answered OUT_OF_ORDER_SEQUENCE after a gap: one finding per Produce exchange.
    "finding_storm": Shape(
        idempotent=100, produces=100, transactional=0, transactions=0, groups=0, fetches=0, storm=True
    ),
}


def scaled(shape: Shape, factor: float) -> Shape:
    return Shape(
        idempotent=max(1, int(shape.idempotent * factor)) if shape.idempotent else 0,
        produces=shape.produces,
        transactional=int(shape.transactional * factor),
        transactions=shape.transactions,
        groups=int(shape.groups * factor),
        fetches=shape.fetches,
        faulty=shape.faulty,
        storm=shape.storm,
    )


# ---------------------------------------------------------------------------------------------------
# Measurements


def run_trackers(frames: list[TapFrame]) -> tuple[float, int, dict[str, int]]:
    """Seconds to feed every frame through a fresh monitor and flush it; findings and their rules."""
    gc.collect()
    monitor = new_monitor()
    start = time.perf_counter()
    findings = monitor.feed_all(frames)
    findings.extend(monitor.flush())
    elapsed = time.perf_counter() - start
    return elapsed, len(findings), dict(monitor.stats.findings)


def _decoders(frames: list[TapFrame], projected: bool) -> list[Callable[[], Any]]:
    calls: list[Callable[[], Any]] = []
    for f in frames:
        if f.raw is None or f.api_key is None or f.api_version is None:
            continue
        fields = CHECK_FIELDS.get((f.direction, f.api_key), frozenset()) if projected else None
        if f.direction == "req":
            calls.append(partial(codec.decode_request, f.raw, fields=fields))
        else:
            calls.append(partial(codec.decode_response, f.raw, f.api_key, f.api_version, fields=fields))
    return calls


def run_decode(calls: list[Callable[[], Any]]) -> float:
    gc.collect()
    start = time.perf_counter()
    for call in calls:
        call()
    return time.perf_counter() - start


def measure_mix(name: str, shape: Shape, reps: int) -> dict[str, Any]:
    built = time.perf_counter()
    frames = build_fleet(shape)
    build_seconds = time.perf_counter() - built
    records = len(frames)
    bytes_total = sum(len(f.raw or b"") for f in frames)
    projected, full = _decoders(frames, True), _decoders(frames, False)
    # Warm-up: the codec compiles its decoders per (message, version, projection) on first use.
    run_decode(projected[: len(projected) // 4])
    run_decode(full[: len(full) // 4])
    run_trackers(frames[: len(frames) // 4])
    rounds: dict[str, list[float]] = {"trackers": [], "projected": [], "full": []}
    findings, by_rule = 0, dict[str, int]()
    for _ in range(reps):
        seconds, findings, by_rule = run_trackers(frames)
        rounds["trackers"].append(seconds)
        rounds["projected"].append(run_decode(projected))
        rounds["full"].append(run_decode(full))
    med = {k: statistics.median(v) for k, v in rounds.items()}
    out: dict[str, Any] = {
        "shape": vars(shape),
        "records": records,
        "exchanges_approx": len(projected) // 2,
        "mirrored_bytes": bytes_total,
        "build_seconds": round(build_seconds, 2),
        "findings": findings,
        "findings_by_rule": by_rule,
        "rounds_seconds": {k: [round(x, 4) for x in v] for k, v in rounds.items()},
        "trackers_records_per_s": records / med["trackers"],
        "trackers_findings_per_s": findings / med["trackers"],
        "projected_decode_records_per_s": records / med["projected"],
        "full_decode_records_per_s": records / med["full"],
    }
    out["ratio_trackers_over_projected"] = (
        out["trackers_records_per_s"] / out["projected_decode_records_per_s"]
    )
    out["ratio_trackers_over_full"] = out["trackers_records_per_s"] / out["full_decode_records_per_s"]
    spread = (max(rounds["trackers"]) - min(rounds["trackers"])) / med["trackers"]
    out["trackers_spread"] = round(spread, 3)
    print(
        f"{name:>14} (built in {build_seconds:.0f}s): {records:>7,} records, {findings:>6,} findings | trackers {out['trackers_records_per_s']:>9,.0f} rec/s "
        f"{out['trackers_findings_per_s']:>9,.0f} findings/s | projected decode {out['projected_decode_records_per_s']:>9,.0f} rec/s "
        f"| full decode {out['full_decode_records_per_s']:>9,.0f} rec/s | trackers/projected {out['ratio_trackers_over_projected']:.2f}x",
        flush=True,
    )
    return out


def _parse_records(node: Any) -> None:
    """Parse every records field under ``node`` now. The codec parses batch headers on first read
    (docs/codec-records.md), and these input frames stay alive in the benchmark: headers parsed during
    the measurement would be counted as the monitor's memory although the input holds them."""
    if isinstance(node, RecordBatches):
        node.batches  # noqa: B018 - the read is the point
    elif isinstance(node, dict):
        for value in node.values():
            _parse_records(value)
    elif isinstance(node, list):
        for value in node:
            _parse_records(value)


def _memory(frames: list[TapFrame], closes: list[TapFrame]) -> dict[str, int]:
    """Bytes the monitor allocates while tracking ``frames`` (peak, and held after), then after ``closes``."""
    for frame in frames:
        if frame.message is not None:
            _parse_records(frame.message.body)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        monitor = new_monitor()
        monitor.feed_all(frames)
        monitor.flush()
        held, peak = tracemalloc.get_traced_memory()
        monitor.feed_all(closes)
        monitor.flush()
        gc.collect()
        after_close = tracemalloc.get_traced_memory()[0]
        keys = len(monitor.states)
    finally:
        tracemalloc.stop()
    return {
        "peak": peak - base,
        "held": held - base,
        "held_after_close": after_close - base,
        "state_keys": keys,
    }


def memory_producers(count: int) -> dict[str, Any]:
    """``count`` idempotent producers, each on its own connection: handshake, InitProducerId, 2 Produce."""
    fleet = Fleet(random.Random(3))
    for i in range(count):
        c = fleet.conn(SECOND + i * MS, "orders-producer")
        c.open()
        c.handshake()
        pid = 1_000_000 + i
        c.exchange(
            INIT_PRODUCER_ID,
            5,
            {"TransactionalId": None, "TransactionTimeoutMs": 60000, "ProducerId": -1, "ProducerEpoch": -1},
            {"ErrorCode": 0, "ProducerId": pid, "ProducerEpoch": 0},
        )
        for n in range(2):
            records = _records(pid, 0, n * 5, False, count=5)
            c.exchange(
                PRODUCE, 9, _produce("orders", i % 6, records, None), _produced("orders", i % 6, n * 5)
            )
        c.close()
    return _split_closes(fleet.frames)


def memory_groups(count: int) -> dict[str, Any]:
    """``count`` consumer groups of 2 members (a connection each): JoinGroup and SyncGroup per member."""
    fleet = Fleet(random.Random(4))
    shape = Shape(idempotent=1, produces=0, transactional=0, transactions=0, groups=0, fetches=0)
    for i in range(count):
        consumer_group(fleet, i, shape, SECOND + i * MS)
    return _split_closes(fleet.frames)


def _split_closes(frames: list[TapFrame]) -> dict[str, Any]:
    frames.sort(key=lambda f: (f.ts_ns, f.conn, f.seq))
    live = [f for f in frames if f.direction != "close"]
    closes = [f for f in frames if f.direction == "close"]
    last = max(f.ts_ns for f in live)
    for f in closes:
        # Every connection closes after all traffic: the first measurement sees them all open.
        f.ts_ns = last + SECOND
    result = _memory(live, closes)
    return {"frames": len(live), **result}


def measure_timer_scaling(shape: Shape, pending: int) -> dict[str, Any]:
    """The fleet mix with ``pending`` far-future timers armed (one per open transaction, say)."""
    frames = build_fleet(shape)
    out: dict[str, Any] = {"records": len(frames)}
    for armed in (0, pending):
        gc.collect()
        monitor = new_monitor()
        for i in range(armed):
            monitor.ctx.set_timer("txn", f"open-{i}", 10**18 + i)
        start = time.perf_counter()
        monitor.feed_all(frames)
        elapsed = time.perf_counter() - start
        out[f"records_per_s_with_{armed}_timers"] = len(frames) / elapsed
    ratio = out[f"records_per_s_with_{pending}_timers"] / out["records_per_s_with_0_timers"]
    out["ratio"] = ratio
    print(f"timers: {pending:,} armed -> {ratio:.2f}x the rate with none", flush=True)
    return out


def measure_memory(keys: int) -> dict[str, Any]:
    out: dict[str, Any] = {"keys_measured": keys, "scaled_to_10k": keys != 10_000}
    scale = 10_000 / keys
    for name, fn in (("producers", memory_producers), ("groups", memory_groups)):
        result = fn(keys)
        per = {k: int(v * scale) for k, v in result.items() if k in ("peak", "held", "held_after_close")}
        out[name] = {**result, "per_10k_bytes": per}
        print(
            f"memory per 10k {name:<9}: peak {per['peak'] / 2**20:7.1f} MiB, held with connections open "
            f"{per['held'] / 2**20:7.1f} MiB, after they close {per['held_after_close'] / 2**20:7.1f} MiB"
            + (f" (measured on {keys:,}, scaled)" if keys != 10_000 else ""),
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5, help="interleaved rounds per mix (median)")
    parser.add_argument("--scale", type=float, default=1.0, help="fleet size factor for the throughput mixes")
    parser.add_argument(
        "--memory-keys", type=int, default=10_000, help="producers / groups for the memory figures"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 1/5 fleet, 2 rounds, 2,000 keys")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.scale, args.memory_keys = 2, 0.2, 2_000
    started = time.time()
    machine = machine_info()
    mixes = {name: measure_mix(name, scaled(shape, args.scale), args.reps) for name, shape in MIXES.items()}
    timers = measure_timer_scaling(scaled(MIXES["fleet"], args.scale / 2), 10_000)
    memory = measure_memory(args.memory_keys)
    ratio = mixes["fleet"]["ratio_trackers_over_projected"]
    verdict = "met" if ratio >= TARGET_RATIO else "missed"
    print(
        f"target: trackers >= {TARGET_RATIO:.0f}x projected decode on the fleet mix: {ratio:.2f}x -> {verdict}"
    )
    report = {
        "benchmark": "checks_bench",
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "duration_seconds": round(time.time() - started, 1),
        "machine": machine,
        "load_average_after": list(__import__("os").getloadavg()),
        "settings": {
            "reps": args.reps,
            "scale": args.scale,
            "memory_keys": args.memory_keys,
            "quick": args.quick,
        },
        "check_fields": {f"{d}:{codec.api_name(k)}": sorted(v) for (d, k), v in CHECK_FIELDS.items()},
        "mixes": mixes,
        "memory": memory,
        "timer_scaling": timers,
        "target": {"ratio": TARGET_RATIO, "measured": ratio, "verdict": verdict},
    }
    if not args.no_write:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
