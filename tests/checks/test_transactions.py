"""txn.* rules (and their interplay with producer.*) on frames built through the real codec."""

from __future__ import annotations

import struct
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from checks.engine import Monitor
from checks.model import Finding
from checks.rule import Context
from checks.rules import all_rules
from checks.rules.producers import ProducerRule
from checks.rules.transactions import PidOwnershipRule, ReadCommittedRule, TxnRule
from checks.settings import ChecksSettings
from codec.records import build_record_batch
from codec.taprecord import TapFrame
from tests.checks.builders import SECOND, Conversation, arrival_order, shared_offsets

MS = 1_000_000
PID = 7000
TX = "payments-tx"
TOPIC = "payments"
FENCED = 90


def batch(epoch: int, seq: int, count: int = 1, pid: int = PID, txn: bool = True, offset: int = 0) -> bytes:
    return build_record_batch(
        [(None, b"v%d" % i) for i in range(count)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=txn,
        base_offset=offset,
    )


def marker(kind: int, offset: int, pid: int = PID, epoch: int = 0) -> bytes:
    """A control batch: key (version, type: 0 ABORT, 1 COMMIT), value (version, coordinator epoch)."""
    return build_record_batch(
        [(struct.pack(">hh", 0, kind), struct.pack(">hi", 0, 0))],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=-1,
        transactional=True,
        control=True,
        base_offset=offset,
    )


def rules() -> list[Any]:
    return [ProducerRule(), TxnRule(), PidOwnershipRule(), ReadCommittedRule()]


def run(frames: list[TapFrame], until: int | None = None) -> tuple[list[Finding], Monitor]:
    monitor = Monitor(rules(), Context(ChecksSettings()))
    findings = monitor.feed_all(frames)
    if until is not None:
        findings += monitor.advance(until)
    return findings + monitor.flush(), monitor


def summary(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.rule, f.severity.value) for f in findings]


class Producer:
    """A transactional client: one connection to the coordinator, one to the partition leader."""

    def __init__(self, name: str = "app", host: str = "10.0.0.5", txn_id: str = TX, pid: int = PID) -> None:
        self.coord = Conversation(conn=f"{name}-coord", client=f"{host}:50001", client_id=name)
        self.leader = Conversation(conn=f"{name}-leader", client=f"{host}:50002", client_id=name)
        shared_offsets(self.coord, self.leader)
        self.txn_id, self.pid, self.epoch = txn_id, pid, 0
        self.seq: dict[int, int] = {}

    def init(self, ts: int, epoch: int, timeout_ms: int = 60000) -> list[TapFrame]:
        self.epoch = epoch
        self.seq = {}
        return self.coord.exchange(
            22,
            4,
            {
                "TransactionalId": self.txn_id,
                "TransactionTimeoutMs": timeout_ms,
                "ProducerId": -1,
                "ProducerEpoch": -1,
            },
            {"ErrorCode": 0, "ProducerId": self.pid, "ProducerEpoch": epoch},
            ts,
        )

    def add(self, ts: int, partitions: list[int], error: int = 0) -> list[TapFrame]:
        return self.coord.exchange(
            24,
            3,
            {
                "V3AndBelowTransactionalId": self.txn_id,
                "V3AndBelowProducerId": self.pid,
                "V3AndBelowProducerEpoch": self.epoch,
                "V3AndBelowTopics": [{"Name": TOPIC, "Partitions": partitions}],
            },
            {
                "ResultsByTopicV3AndBelow": [
                    {
                        "Name": TOPIC,
                        "ResultsByPartition": [
                            {"PartitionIndex": p, "PartitionErrorCode": error} for p in partitions
                        ],
                    }
                ]
            },
            ts,
        )

    def produce(
        self,
        ts: int,
        partition: int,
        version: int = 9,
        error: int = 0,
        epoch: int | None = None,
        offset: int = 0,
    ) -> list[TapFrame]:
        seq = self.seq.get(partition, 0)
        self.seq[partition] = seq + 2
        epoch = self.epoch if epoch is None else epoch
        req = self.leader.request(
            0,
            version,
            {
                "TransactionalId": self.txn_id,
                "Acks": -1,
                "TimeoutMs": 30000,
                "TopicData": [
                    {
                        "Name": TOPIC,
                        "PartitionData": [{"Index": partition, "Records": batch(epoch, seq, 2, self.pid)}],
                    }
                ],
            },
            ts,
        )
        resp = self.leader.response(
            req,
            {
                "Responses": [
                    {
                        "Name": TOPIC,
                        "PartitionResponses": [
                            {"Index": partition, "ErrorCode": error, "BaseOffset": offset}
                        ],
                    }
                ]
            },
            ts + 2 * MS,
        )
        return [req, resp]

    def offsets(self, ts: int) -> list[TapFrame]:
        frames = self.coord.exchange(
            25,
            3,
            {
                "TransactionalId": self.txn_id,
                "ProducerId": self.pid,
                "ProducerEpoch": self.epoch,
                "GroupId": "g",
            },
            {"ErrorCode": 0},
            ts,
        )
        frames += self.coord.exchange(
            28,
            3,
            {
                "TransactionalId": self.txn_id,
                "GroupId": "g",
                "ProducerId": self.pid,
                "ProducerEpoch": self.epoch,
                "Topics": [
                    {
                        "Name": "in",
                        "Partitions": [{"PartitionIndex": 0, "CommittedOffset": 5, "CommittedMetadata": ""}],
                    }
                ],
            },
            {"Topics": [{"Name": "in", "Partitions": [{"PartitionIndex": 0, "ErrorCode": 0}]}]},
            ts + 5 * MS,
        )
        return frames

    def end(self, ts: int, commit: bool = True, version: int = 3, error: int = 0) -> list[TapFrame]:
        resp: dict[str, Any] = {"ErrorCode": error}
        if version >= 5 and error == 0:
            self.epoch += 1
            self.seq = {}
            resp.update(ProducerId=self.pid, ProducerEpoch=self.epoch)
        return self.coord.exchange(
            26,
            version,
            {
                "TransactionalId": self.txn_id,
                "ProducerId": self.pid,
                "ProducerEpoch": self.epoch,
                "Committed": commit,
            },
            resp,
            ts,
        )


def markers(ts: int, commit: bool, epoch: int, partitions: list[int], pid: int = PID) -> list[TapFrame]:
    broker = Conversation(
        conn=f"broker-coord-{ts}", client="10.0.1.1:9093", client_id="broker-1", listener="BROKER"
    )
    return broker.exchange(
        27,
        1,
        {
            "Markers": [
                {
                    "ProducerId": pid,
                    "ProducerEpoch": epoch,
                    "TransactionResult": commit,
                    "Topics": [{"Name": TOPIC, "PartitionIndexes": partitions}],
                    "CoordinatorEpoch": 0,
                }
            ]
        },
        {
            "Markers": [
                {
                    "ProducerId": pid,
                    "Topics": [
                        {
                            "Name": TOPIC,
                            "Partitions": [{"PartitionIndex": p, "ErrorCode": 0} for p in partitions],
                        }
                    ],
                }
            ]
        },
        ts,
    )


def clean_v1_transactions() -> list[TapFrame]:
    """Two transactions of the explicit-add protocol (transactions v1): a commit and an abort."""
    p = Producer()
    frames = [*p.init(0, epoch=0, timeout_ms=10000)]
    frames += p.add(SECOND, [0, 1])
    frames += p.produce(SECOND + 10 * MS, 0)
    frames += p.produce(SECOND + 20 * MS, 1)
    frames += p.offsets(SECOND + 30 * MS)
    frames += p.end(SECOND + 50 * MS, commit=True)
    frames += markers(SECOND + 60 * MS, True, 0, [0, 1])
    frames += p.add(2 * SECOND, [0])
    frames += p.produce(2 * SECOND + 10 * MS, 0)
    frames += p.end(2 * SECOND + 50 * MS, commit=False)
    frames += markers(2 * SECOND + 60 * MS, False, 0, [0])
    return frames


# -- clean traffic ------------------------------------------------------------------------------


def test_clean_explicit_add_transactions_raise_nothing() -> None:
    findings, _ = run(clean_v1_transactions(), until=500 * SECOND)
    assert findings == []


def test_clean_transactions_v2_without_add_partitions_raise_nothing() -> None:
    p = Producer()
    frames = [*p.init(0, epoch=0, timeout_ms=10000)]
    for i in range(3):
        t = (i + 1) * SECOND
        frames += p.produce(t, 0, version=12)
        frames += p.produce(t + 10 * MS, 1, version=12)
        frames += p.offsets(t + 20 * MS)
        frames += p.end(t + 50 * MS, commit=i != 1, version=5)  # bumps the epoch every time
        frames += markers(t + 60 * MS, i != 1, p.epoch, [0, 1])
    findings, _ = run(frames, until=500 * SECOND)
    assert findings == []


def test_the_catalogue_includes_these_rules() -> None:
    names = {r.name for r in all_rules()}
    assert {"producer", "txn", "txn_pid", "txn_read"} <= names


# -- txn.produce_outside_txn --------------------------------------------------------------------


def test_write_to_a_partition_never_added_is_flagged() -> None:
    p = Producer()
    frames = [*p.init(0, epoch=0), *p.add(SECOND, [0]), *p.produce(SECOND + 10 * MS, 0)]
    frames += p.produce(SECOND + 20 * MS, 2)
    # Judged when the transaction ends: a tap loss until then could explain the missing add.
    assert run(frames)[0] == []
    findings, _ = run([*frames, *p.end(SECOND + 30 * MS)])
    assert summary(findings) == [("txn.produce_outside_txn", "warning")]
    assert findings[0].ts_ns == SECOND + 20 * MS
    evidence = findings[0].evidence
    assert (evidence["topic"], evidence["partition"], evidence["producer_id"]) == (TOPIC, 2, PID)
    assert evidence["added_partitions"] == [f"{TOPIC}|0"] and findings[0].subject == f"txn:{TX}"


def test_partitions_are_added_per_transaction() -> None:
    p = Producer()
    frames = [
        *p.init(0, epoch=0),
        *p.add(SECOND, [0]),
        *p.produce(SECOND + 10 * MS, 0),
        *p.end(SECOND + 20 * MS),
    ]
    frames += p.produce(2 * SECOND, 0)  # the next transaction did not add it again
    frames += p.end(2 * SECOND + 10 * MS)
    assert summary(run(frames)[0]) == [("txn.produce_outside_txn", "warning")]


def test_failed_add_does_not_count() -> None:
    p = Producer()
    frames = [*p.init(0, epoch=0), *p.add(SECOND, [0], error=51), *p.produce(SECOND + 10 * MS, 0, error=48)]
    findings, _ = run([*frames, *p.end(SECOND + 20 * MS)])
    assert summary(findings) == [("txn.produce_outside_txn", "warning")]
    assert "refused" in findings[0].summary


def test_transactions_v2_producer_that_also_adds_explicitly_is_checked() -> None:
    p = Producer()
    frames = [*p.init(0, epoch=0), *p.add(SECOND, [0]), *p.produce(SECOND + 10 * MS, 1, version=12)]
    frames += p.init(SECOND + 20 * MS, epoch=1)  # a new InitProducerId ends the transaction too
    assert summary(run(frames)[0]) == [("txn.produce_outside_txn", "warning")]


def test_broker_side_add_partitions_counts_as_added() -> None:
    p = Producer()
    leader = Conversation(
        conn="broker-leader", client="10.0.1.2:9093", client_id="broker-2", listener="BROKER"
    )
    verify = leader.exchange(
        24,
        5,
        {
            "Transactions": [
                {
                    "TransactionalId": TX,
                    "ProducerId": PID,
                    "ProducerEpoch": 0,
                    "VerifyOnly": True,
                    "Topics": [{"Name": TOPIC, "Partitions": [3]}],
                }
            ]
        },
        {
            "ErrorCode": 0,
            "ResultsByTransaction": [
                {
                    "TransactionalId": TX,
                    "TopicResults": [
                        {
                            "Name": TOPIC,
                            "ResultsByPartition": [{"PartitionIndex": 3, "PartitionErrorCode": 0}],
                        }
                    ],
                }
            ],
        },
        SECOND + MS // 2,
    )
    produce = p.produce(SECOND, 3)
    frames = [*p.init(0, epoch=0), *p.add(SECOND - 100 * MS, [0]), produce[0], *verify, produce[1]]
    assert run(frames)[0] == []


def test_no_boundary_seen_means_no_judgement() -> None:
    """The monitor started mid-transaction: it may have missed the adds."""
    p = Producer()
    assert run(p.produce(SECOND, 4))[0] == []


def test_zombie_write_is_reported_as_stale_epoch_only() -> None:
    zombie = Producer(name="zombie", host="10.0.0.7")
    fencer = Producer(name="fencer", host="10.0.0.8")
    frames = [*zombie.init(0, epoch=0), *zombie.add(SECOND, [0]), *zombie.produce(SECOND + 10 * MS, 0)]
    frames += fencer.init(2 * SECOND, epoch=1)
    frames += zombie.produce(3 * SECOND, 0, error=FENCED)
    frames += zombie.end(3 * SECOND + 10 * MS, error=FENCED)
    frames += fencer.add(4 * SECOND, [0])
    frames += fencer.produce(4 * SECOND + 10 * MS, 0)
    frames += fencer.end(4 * SECOND + 20 * MS)
    findings, _ = run(frames, until=500 * SECOND)
    # The zombie's Produce and its EndTxn are both fenced: one finding each, naming the RPC.
    assert summary(findings) == [("producer.stale_epoch_rejected", "warning")] * 2
    assert [f.evidence["rpc"].split()[0] for f in findings] == ["Produce", "EndTxn"]
    assert {f.subject for f in findings} == {f"txn:{TX}"}


# -- txn.hanging ---------------------------------------------------------------------------------


def test_transaction_open_past_its_timeout_hangs_then_resolves() -> None:
    p = Producer()
    frames = [*p.init(0, epoch=0, timeout_ms=10000), *p.add(SECOND, [0]), *p.produce(SECOND + 10 * MS, 0)]
    frames += p.end(30 * SECOND)
    monitor = Monitor(rules(), Context(ChecksSettings()))
    findings = monitor.feed_all(frames) + monitor.flush()
    assert summary(findings) == [("txn.hanging", "warning")]
    hanging = findings[0]
    assert hanging.ts_ns == 11 * SECOND and hanging.subject == f"txn:{TX}"
    assert hanging.evidence["timeout_ms"] == 10000 and hanging.evidence["offsets"]
    assert monitor.ctx.resolved == [("txn.hanging", f"txn:{TX}", 30 * SECOND + MS)]


def test_hanging_fires_on_event_time_alone() -> None:
    p = Producer()
    frames = [*p.init(0, epoch=0, timeout_ms=5000), *p.add(SECOND, [0])]
    findings, _ = run(frames, until=100 * SECOND)
    assert summary(findings) == [("txn.hanging", "warning")]


def test_default_timeout_when_init_was_not_seen() -> None:
    p = Producer()
    frames = p.add(SECOND, [0])
    assert run(frames, until=60 * SECOND)[0] == []
    assert summary(run(frames, until=62 * SECOND + 11 * SECOND)[0]) == [("txn.hanging", "warning")]


def test_committed_in_time_does_not_hang() -> None:
    p = Producer()
    frames = [*p.init(0, epoch=0, timeout_ms=5000), *p.add(SECOND, [0]), *p.end(5 * SECOND)]
    assert run(frames, until=100 * SECOND)[0] == []


def test_end_txn_in_flight_at_the_deadline_waits() -> None:
    p = Producer()
    frames = [*p.init(0, epoch=0, timeout_ms=5000), *p.add(SECOND, [0])]
    end_req = p.coord.request(
        26, 3, {"TransactionalId": TX, "ProducerId": PID, "ProducerEpoch": 0, "Committed": True}, 5 * SECOND
    )
    end_resp = p.coord.response(end_req, {"ErrorCode": 0}, 7 * SECOND)
    assert run([*frames, end_req, end_resp], until=100 * SECOND)[0] == []


def test_a_new_init_producer_id_closes_the_open_transaction() -> None:
    p = Producer()
    frames = [*p.init(0, epoch=0, timeout_ms=5000), *p.add(SECOND, [0]), *p.init(2 * SECOND, epoch=1)]
    assert run(frames, until=100 * SECOND)[0] == []


def test_timed_out_transaction_resolves_when_the_coordinator_fences_its_end_txn() -> None:
    p = Producer()
    frames = [*p.init(0, epoch=0, timeout_ms=3000), *p.add(SECOND, [0]), *p.produce(SECOND + 10 * MS, 0)]
    frames += p.end(20 * SECOND, error=FENCED)
    monitor = Monitor(rules(), Context(ChecksSettings()))
    findings = monitor.feed_all(frames) + monitor.flush()
    assert summary(findings) == [("txn.hanging", "warning")]
    assert monitor.ctx.resolved == [("txn.hanging", f"txn:{TX}", 20 * SECOND + MS)]


def test_a_zombie_end_txn_neither_ends_nor_defers_the_current_transaction() -> None:
    zombie = Producer(name="zombie", host="10.0.0.7")
    fencer = Producer(name="fencer", host="10.0.0.8")
    frames = [*zombie.init(0, epoch=0), *fencer.init(SECOND, epoch=1, timeout_ms=5000)]
    frames += fencer.add(2 * SECOND, [0])
    frames += zombie.end(3 * SECOND, error=FENCED)
    findings, _ = run(frames, until=100 * SECOND)
    # The zombie's EndTxn is a fenced stale epoch; the fencer's transaction still hangs on time.
    assert summary(findings) == [("producer.stale_epoch_rejected", "warning"), ("txn.hanging", "warning")]
    assert findings[1].ts_ns == 7 * SECOND


# -- txn.pid_hijack ------------------------------------------------------------------------------


def test_producer_id_under_a_second_transactional_id() -> None:
    owner = Producer()
    other = Producer(name="other", txn_id="other-tx")
    frames = [*owner.init(0, epoch=0), *owner.add(SECOND, [0]), *owner.end(SECOND + 10 * MS)]
    other.epoch = 0
    frames += other.add(2 * SECOND, [1])
    findings, _ = run(frames)
    assert summary(findings) == [("txn.pid_hijack", "warning")]
    evidence = findings[0].evidence
    assert (evidence["transactional_id"], evidence["owner_transactional_id"]) == ("other-tx", TX)
    assert findings[0].subject == f"producer:{PID}"


def test_producer_id_from_another_client_with_a_current_epoch() -> None:
    owner = Producer()
    intruder = Producer(name="intruder", host="10.6.6.6")
    frames = [*owner.init(0, epoch=2), *owner.add(SECOND, [0]), *owner.produce(SECOND + 10 * MS, 0)]
    intruder.epoch = 2
    frames += intruder.produce(2 * SECOND, 0, offset=9)
    frames += intruder.produce(3 * SECOND, 0, offset=11)  # one finding per intruder
    findings, _ = run(frames)
    assert [f.rule for f in findings if f.rule == "txn.pid_hijack"] == ["txn.pid_hijack"]
    hijack = next(f for f in findings if f.rule == "txn.pid_hijack")
    assert hijack.evidence["client_identity"] == "10.6.6.6|intruder"
    assert hijack.evidence["owner_client_identity"] == "10.0.0.5|app"


def test_restart_on_another_host_and_reconnects_are_not_hijacks() -> None:
    first = Producer(name="app", host="10.0.0.5")
    restarted = Producer(name="app", host="10.0.0.9")
    frames = [*first.init(0, epoch=0), *first.add(SECOND, [0]), *first.produce(SECOND + 10 * MS, 0)]
    frames += first.end(SECOND + 20 * MS)
    frames += restarted.init(2 * SECOND, epoch=1)
    frames += restarted.add(3 * SECOND, [0])
    frames += restarted.produce(3 * SECOND + 10 * MS, 0)
    # Same client on a new ephemeral port.
    reconnected = Conversation(conn="app-leader-2", client="10.0.0.9:50999", client_id="app")
    req = reconnected.request(
        0,
        9,
        {
            "TransactionalId": TX,
            "Acks": -1,
            "TimeoutMs": 30000,
            "TopicData": [{"Name": TOPIC, "PartitionData": [{"Index": 0, "Records": batch(1, 2, 2)}]}],
        },
        4 * SECOND,
    )
    frames += [req]
    frames += restarted.end(5 * SECOND)
    assert run(frames)[0] == []


def test_coordinator_handing_one_producer_id_to_two_transactional_ids() -> None:
    a = Producer(name="a", txn_id="tx-a")
    b = Producer(name="b", host="10.0.0.6", txn_id="tx-b")
    findings, _ = run([*a.init(0, epoch=0), *b.init(SECOND, epoch=0)])
    assert summary(findings) == [("txn.pid_hijack", "warning")]


# -- txn.read_committed_inconsistent --------------------------------------------------------------


def fetch(
    records: bytes, aborted: list[tuple[int, int]] | None, hw: int = 100, lso: int = 100, isolation: int = 1
) -> list[TapFrame]:
    consumer = Conversation(conn="consumer", client="10.0.0.20:41000", client_id="reader")
    return consumer.exchange(
        1,
        12,
        {
            "ReplicaId": -1,
            "MaxWaitMs": 500,
            "MinBytes": 1,
            "IsolationLevel": isolation,
            "Topics": [
                {
                    "Topic": TOPIC,
                    "Partitions": [{"Partition": 0, "FetchOffset": 10, "PartitionMaxBytes": 1 << 20}],
                }
            ],
        },
        {
            "Responses": [
                {
                    "Topic": TOPIC,
                    "Partitions": [
                        {
                            "PartitionIndex": 0,
                            "ErrorCode": 0,
                            "HighWatermark": hw,
                            "LastStableOffset": lso,
                            "AbortedTransactions": None
                            if aborted is None
                            else [{"ProducerId": p, "FirstOffset": f} for p, f in aborted],
                            "Records": records,
                        }
                    ],
                }
            ]
        },
        SECOND,
    )


def test_last_stable_offset_above_high_watermark() -> None:
    findings, _ = run(fetch(b"", None, hw=50, lso=60))
    assert summary(findings) == [("txn.read_committed_inconsistent", "warning")]
    assert findings[0].subject == f"partition:{TOPIC}-0"
    assert run(fetch(b"", None, hw=60, lso=50))[0] == []
    assert run(fetch(b"", None, hw=50, lso=-1))[0] == []
    assert run(fetch(b"", None, hw=50, lso=60, isolation=0))[0] == []


def test_aborted_data_listed_and_marked_is_consistent() -> None:
    records = batch(0, 0, 2, offset=10) + marker(0, 12) + batch(0, 2, 2, offset=13) + marker(1, 15)
    assert run(fetch(records, [(PID, 10)]))[0] == []


def test_abort_marker_without_an_aborted_entry() -> None:
    records = batch(0, 0, 2, offset=10) + marker(0, 12)
    findings, _ = run(fetch(records, []))
    assert summary(findings) == [("txn.read_committed_inconsistent", "critical")]
    assert findings[0].evidence["marker"] == "ABORT" and findings[0].evidence["data_offset"] == 10


def test_commit_marker_for_a_transaction_listed_as_aborted() -> None:
    records = batch(0, 0, 2, offset=10) + marker(1, 12)
    findings, _ = run(fetch(records, [(PID, 10)]))
    assert summary(findings) == [("txn.read_committed_inconsistent", "critical")]
    assert findings[0].evidence["marker"] == "COMMIT"
    # A listed abort of an earlier transaction of the same producer is fine.
    records = batch(0, 0, 2, offset=10) + marker(0, 12) + batch(0, 2, 1, offset=13) + marker(1, 14)
    assert run(fetch(records, [(PID, 10)]))[0] == []


def test_read_uncommitted_fetches_are_not_checked() -> None:
    records = batch(0, 0, 2, offset=10) + marker(0, 12)
    assert run(fetch(records, [], isolation=0))[0] == []


# -- order independence --------------------------------------------------------------------------


def scenario() -> list[TapFrame]:
    """A mixed capture with findings from several rules, on several connections."""
    frames = clean_v1_transactions()
    zombie = Producer(name="zombie", host="10.0.0.7", txn_id="z-tx", pid=PID + 1)
    fencer = Producer(name="fencer", host="10.0.0.8", txn_id="z-tx", pid=PID + 1)
    frames += zombie.init(0, epoch=0, timeout_ms=3000)
    frames += zombie.add(100 * MS, [0])
    frames += zombie.produce(200 * MS, 0)
    frames += zombie.produce(300 * MS, 2)  # outside the transaction
    frames += fencer.init(SECOND, epoch=1)
    frames += zombie.produce(SECOND + 1 * MS, 0, error=FENCED)  # stale: sent after the fence
    frames += fencer.add(SECOND + 50 * MS, [0])  # never ends: hangs
    frames += fetch(batch(0, 0, 2, offset=10) + marker(0, 12), [])
    return frames


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_arrival_order_within_the_watermark_gives_the_same_findings(data: st.DataObject) -> None:
    frames = scenario()
    expected, _ = run(frames, until=100 * SECOND)
    assert {f.rule for f in expected} >= {
        "txn.produce_outside_txn",
        "producer.stale_epoch_rejected",
        "txn.hanging",
        "txn.read_committed_inconsistent",
    }
    lateness = int(ChecksSettings().watermark_seconds * SECOND)
    delays = data.draw(st.lists(st.integers(0, lateness - 1), min_size=len(frames), max_size=len(frames)))
    # Arrival order sorted by ts + delay (delay < watermark): no frame arrives after one that is more
    # than the watermark newer than it; a connection's frames keep their order (one tap partition).
    arrival = arrival_order(frames, delays)
    got, _ = run(arrival, until=100 * SECOND)
    # Gaps are reported as records arrive, the rules' findings as frames are released: the same set.
    assert sorted(f.id for f in got) == sorted(f.id for f in expected)
    assert [f.to_dict() for f in got if f.rule != "tap.gap"] == [
        f.to_dict() for f in expected if f.rule != "tap.gap"
    ]


def test_a_write_outside_whose_add_the_tap_may_have_lost_is_incomplete_info() -> None:
    """The add went through a worker that died before mirroring it; the transaction's end comes on a
    connection whose records carry that loss (``TapFrame.loss_ns``): incomplete, ``info``."""
    p = Producer()
    frames = [*p.init(0, epoch=0), *p.add(SECOND, [0]), *p.produce(SECOND + 10 * MS, 0)]
    frames += p.produce(SECOND + 20 * MS, 2)
    end = p.end(SECOND + 40 * MS)
    for frame in end:
        frame.loss_ns = SECOND + 30 * MS
    findings, _ = run([*frames, *end])
    assert [(f.rule, f.severity.value, f.incomplete) for f in findings] == [
        ("txn.produce_outside_txn", "info", True)
    ]
    assert "tap may have lost records" in findings[0].summary


def test_a_write_after_an_add_whose_answer_was_never_paired_is_incomplete_info() -> None:
    """The tap held the AddPartitionsToTxn past its age bound and wrote it alone, so its answer came as
    a ``lone`` record no reader pairs: the add may have succeeded, and the write to that partition is
    incomplete ``info``. A partition the transaction never asked for is still a warning."""
    p = Producer()
    frames = p.init(0, epoch=0)
    add_request, add_answer = p.add(SECOND, [2])
    frames += [add_request, replace(add_answer, lone=True)]
    frames += [*p.produce(SECOND + 10 * MS, 2), *p.produce(SECOND + 20 * MS, 1), *p.end(SECOND + 30 * MS)]
    findings, _ = run(frames)
    assert sorted((f.evidence["partition"], f.severity.value, f.incomplete) for f in findings) == [
        (1, "warning", False),
        (2, "info", True),
    ]
    unanswered = next(f for f in findings if f.evidence["partition"] == 2)
    assert unanswered.evidence["add_request"] == {"conn": "app-coord", "correlation_id": 2, "answered": False}
    assert "never saw that answer" in unanswered.summary
    # An answer that comes after the write: the client did not wait for its add, a warning.
    q = Producer()
    frames = q.init(0, epoch=0)
    add_request, add_answer = q.add(SECOND, [2])
    frames += [add_request, *q.produce(SECOND + 10 * MS, 2), replace(add_answer, ts_ns=SECOND + 20 * MS)]
    findings, _ = run([*frames, *q.end(SECOND + 30 * MS)])
    assert summary(findings) == [("txn.produce_outside_txn", "warning")]
    assert findings[0].evidence["add_request"]["answered"] is True
