"""producer.stale_epoch_* and producer.sequence_* on frames built through the real codec."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checks.engine import Monitor
from checks.model import Finding
from checks.rule import Context
from checks.rules.producers import ProducerRule
from checks.settings import ChecksSettings
from codec import taprecord
from codec.records import build_record_batch
from codec.taprecord import TapFrame
from tests.checks.builders import SECOND, Conversation, shared_offsets

MS = 1_000_000
PID = 4000
TOPIC = "orders"
FENCED, OUT_OF_ORDER, DUPLICATE, NOT_LEADER, TOO_LARGE = 90, 45, 46, 6, 10


def batch(epoch: int, seq: int, count: int = 1, pid: int = PID, txn: bool = False) -> bytes:
    return build_record_batch(
        [(None, b"v%d" % i) for i in range(count)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=txn,
    )


def produce(
    conv: Conversation,
    ts: int,
    parts: list[tuple[int, bytes]],
    txn_id: str | None = None,
    version: int = 9,
    topic: str = TOPIC,
) -> TapFrame:
    body: dict[str, Any] = {
        "TransactionalId": txn_id,
        "Acks": -1,
        "TimeoutMs": 30000,
        "TopicData": [{"Name": topic, "PartitionData": [{"Index": p, "Records": r} for p, r in parts]}],
    }
    return conv.request(0, version, body, ts)


def answer(
    conv: Conversation, req: TapFrame, ts: int, parts: list[tuple[int, int, int]], topic: str = TOPIC
) -> TapFrame:
    """``parts``: (partition, error code, base offset)."""
    return conv.response(
        req,
        {
            "Responses": [
                {
                    "Name": topic,
                    "PartitionResponses": [
                        {"Index": p, "ErrorCode": e, "BaseOffset": o} for p, e, o in parts
                    ],
                }
            ]
        },
        ts,
    )


def write(
    conv: Conversation,
    ts: int,
    epoch: int,
    seq: int,
    error: int = 0,
    offset: int = 0,
    count: int = 1,
    partition: int = 0,
) -> list[TapFrame]:
    req = produce(conv, ts, [(partition, batch(epoch, seq, count))])
    return [req, answer(conv, req, ts + 2 * MS, [(partition, error, offset)])]


def init_pid(
    conv: Conversation, ts: int, epoch: int, pid: int = PID, txn_id: str | None = "tx"
) -> list[TapFrame]:
    return conv.exchange(
        22,
        4,
        {"TransactionalId": txn_id, "TransactionTimeoutMs": 60000, "ProducerId": -1, "ProducerEpoch": -1},
        {"ErrorCode": 0, "ProducerId": pid, "ProducerEpoch": epoch},
        ts,
    )


def run(frames: list[TapFrame]) -> list[Finding]:
    monitor = Monitor([ProducerRule()], Context(ChecksSettings()))
    return monitor.feed_all(frames) + monitor.flush()


def rules(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.rule, f.severity.value) for f in findings]


def two_clients() -> tuple[Conversation, Conversation]:
    zombie = Conversation(conn="tap1-z", client="10.0.0.7:40000", client_id="zombie")
    fencer = Conversation(conn="tap1-f", client="10.0.0.8:40000", client_id="fencer")
    shared_offsets(zombie, fencer)
    return zombie, fencer


# -- stale epochs --------------------------------------------------------------------------------


def test_zombie_write_after_the_fence_rejected_is_a_warning() -> None:
    zombie, fencer = two_clients()
    frames = [
        *init_pid(zombie, 0, epoch=0),
        *write(zombie, 1 * SECOND, epoch=0, seq=0),
        *init_pid(fencer, 2 * SECOND, epoch=1),
        *write(zombie, 3 * SECOND, epoch=0, seq=1, error=FENCED),
    ]
    findings = run(frames)
    assert rules(findings) == [("producer.stale_epoch_rejected", "warning")]
    evidence = findings[0].evidence
    assert (evidence["producer_id"], evidence["producer_epoch"], evidence["newest_epoch"]) == (PID, 0, 1)
    assert evidence["broker_error"] == FENCED and evidence["topic"] == TOPIC and evidence["partition"] == 0
    assert evidence["newest_epoch_source"] == "InitProducerId"
    # Named after the transactional id the fenced InitProducerId carried; both clients in the evidence.
    assert findings[0].subject == "txn:tx"
    assert (evidence["transactional_id"], evidence["rpc"], evidence["client_id"]) == (
        "tx",
        "Produce v9",
        "zombie",
    )
    assert (evidence["newest_epoch_client"], evidence["newest_epoch_client_id"]) == (
        "10.0.0.8:40000",
        "fencer",
    )
    assert evidence["client"] == "10.0.0.7:40000"
    # Tap offsets of the zombie's request and response.
    assert evidence["offsets"] == [[0, frames[-2].offset], [0, frames[-1].offset]]


def test_zombie_write_the_broker_accepted_is_critical() -> None:
    zombie, fencer = two_clients()
    frames = [*init_pid(zombie, 0, epoch=3), *init_pid(fencer, 2 * SECOND, epoch=4)]
    frames += write(zombie, 3 * SECOND, epoch=3, seq=0, error=0, offset=77)
    assert rules(run(frames)) == [("producer.stale_epoch_accepted", "critical")]


def test_invalid_producer_epoch_counts_as_rejected() -> None:
    zombie, fencer = two_clients()
    frames = [*init_pid(fencer, 0, epoch=2), *write(zombie, 1 * SECOND, epoch=1, seq=0, error=47)]
    assert rules(run(frames)) == [("producer.stale_epoch_rejected", "warning")]


def test_write_sent_before_the_new_epoch_is_not_stale_even_if_answered_and_fed_later() -> None:
    zombie, fencer = two_clients()
    early = produce(zombie, 2 * SECOND - 5 * MS, [(0, batch(0, 0))])
    fence = init_pid(fencer, 2 * SECOND, epoch=1)
    late_answer = answer(zombie, early, 2 * SECOND + 500 * MS, [(0, 0, 10)])
    # Arrival order: the fence first, then the zombie's request and answer (all within the watermark).
    assert run([*fence, early, late_answer]) == []
    # Also while the InitProducerId is in flight: the epoch is only known once the broker answered it.
    zombie2, fencer2 = two_clients()
    init_req = fencer2.request(
        22,
        4,
        {"TransactionalId": "tx", "TransactionTimeoutMs": 60000, "ProducerId": -1, "ProducerEpoch": -1},
        SECOND,
    )
    mid = produce(zombie2, SECOND + 1 * MS, [(0, batch(0, 0))])
    init_resp = fencer2.response(
        init_req, {"ErrorCode": 0, "ProducerId": PID, "ProducerEpoch": 1}, SECOND + 2 * MS
    )
    assert run([init_req, init_resp, mid, answer(zombie2, mid, SECOND + 9 * MS, [(0, FENCED, -1)])]) == []


def test_end_txn_v5_bumps_the_epoch() -> None:
    conv = Conversation()
    end = conv.exchange(
        26,
        5,
        {"TransactionalId": "tx", "ProducerId": PID, "ProducerEpoch": 0, "Committed": True},
        {"ErrorCode": 0, "ProducerId": PID, "ProducerEpoch": 1},
        2 * SECOND,
    )
    before = write(conv, 1 * SECOND, epoch=0, seq=0)
    after_ok = write(conv, 3 * SECOND, epoch=1, seq=0)
    assert run([*before, *end, *after_ok]) == []
    stale = write(Conversation(conn="tap1-x"), 4 * SECOND, epoch=0, seq=1, error=FENCED)
    findings = run([*before, *end, *after_ok, *stale])
    assert rules(findings) == [("producer.stale_epoch_rejected", "warning")]
    assert findings[0].evidence["newest_epoch_source"] == "EndTxn"


def test_end_txn_before_v5_does_not_carry_an_epoch() -> None:
    conv = Conversation()
    end = conv.exchange(
        26,
        4,
        {"TransactionalId": "tx", "ProducerId": PID, "ProducerEpoch": 0, "Committed": True},
        {"ErrorCode": 0},
        2 * SECOND,
    )
    assert run([*write(conv, SECOND, 0, 0), *end, *write(conv, 3 * SECOND, 0, 1)]) == []


def test_write_txn_markers_with_a_bumped_epoch_fence_older_writes() -> None:
    coordinator = Conversation(conn="tap1-b", client="10.0.0.2:9093", client_id="broker-2")
    markers = coordinator.exchange(
        27,
        1,
        {
            "Markers": [
                {
                    "ProducerId": PID,
                    "ProducerEpoch": 5,
                    "TransactionResult": False,
                    "Topics": [{"Name": TOPIC, "PartitionIndexes": [0]}],
                    "CoordinatorEpoch": 1,
                }
            ]
        },
        {
            "Markers": [
                {
                    "ProducerId": PID,
                    "Topics": [{"Name": TOPIC, "Partitions": [{"PartitionIndex": 0, "ErrorCode": 0}]}],
                }
            ]
        },
        SECOND,
    )
    frames = [*markers, *write(Conversation(), 2 * SECOND, epoch=4, seq=3, error=FENCED)]
    assert rules(run(frames)) == [("producer.stale_epoch_rejected", "warning")]


def test_non_idempotent_batches_are_ignored() -> None:
    conv = Conversation()
    req = produce(conv, SECOND, [(0, batch(-1, -1, pid=-1))])
    assert run([req, answer(conv, req, SECOND + MS, [(0, 0, 1)])]) == []


# -- sequences -----------------------------------------------------------------------------------


def test_clean_in_flight_series_and_epoch_reset_raise_nothing() -> None:
    conv = Conversation()
    frames = [*init_pid(conv, 0, epoch=0, txn_id=None)]
    reqs = [produce(conv, SECOND + i * MS, [(0, batch(0, i * 5, 5))]) for i in range(5)]
    frames += reqs
    frames += [answer(conv, r, SECOND + 50 * MS + i * MS, [(0, 0, i * 5)]) for i, r in enumerate(reqs)]
    # KIP-360: the client bumps its epoch and restarts sequences at 0.
    bump = conv.exchange(
        22,
        4,
        {"TransactionalId": None, "TransactionTimeoutMs": 60000, "ProducerId": PID, "ProducerEpoch": 0},
        {"ErrorCode": 0, "ProducerId": PID, "ProducerEpoch": 1},
        2 * SECOND,
    )
    frames += [*bump, *write(conv, 3 * SECOND, epoch=1, seq=0, count=3, offset=25)]
    frames += write(conv, 3 * SECOND + 10 * MS, epoch=1, seq=3, count=2, offset=28)
    assert run(frames) == []


def test_gap_confirmed_by_the_broker() -> None:
    conv = Conversation()
    frames = [*write(conv, SECOND, 0, 0, count=2), *write(conv, 2 * SECOND, 0, 5, error=OUT_OF_ORDER)]
    findings = run(frames)
    assert rules(findings) == [("producer.sequence_gap", "warning")]
    evidence = findings[0].evidence
    assert (evidence["expected_sequence"], evidence["base_sequence"], evidence["missing"]) == (2, 5, 3)
    assert evidence["broker_error"] == OUT_OF_ORDER and "confirmed" in findings[0].summary


def test_gap_the_broker_accepted_is_reported_too() -> None:
    conv = Conversation()
    findings = run([*write(conv, SECOND, 0, 0), *write(conv, 2 * SECOND, 0, 2, offset=1)])
    assert rules(findings) == [("producer.sequence_gap", "warning")]
    assert "accepted" in findings[0].summary


def test_out_of_order_after_a_failed_in_flight_batch_is_not_a_gap() -> None:
    """Two in flight; the first fails (retriable), so the broker answers the second 45; both are retried."""
    conv = Conversation()
    a = produce(conv, SECOND, [(0, batch(0, 0, 5))])
    b = produce(conv, SECOND + MS, [(0, batch(0, 5, 5))])
    frames = [a, b, answer(conv, a, SECOND + 5 * MS, [(0, NOT_LEADER, -1)])]
    frames.append(answer(conv, b, SECOND + 6 * MS, [(0, OUT_OF_ORDER, -1)]))
    frames += write(conv, 2 * SECOND, 0, 0, count=5, offset=0)
    frames += write(conv, 2 * SECOND + 10 * MS, 0, 5, count=5, offset=5)
    assert run(frames) == []


def test_retry_the_broker_deduplicated_is_info_only() -> None:
    conv = Conversation()
    frames = [*write(conv, SECOND, 0, 0, count=3, offset=40)]
    # The answer was lost on the way to the client: it retries the same batch; the broker answers
    # with the original offset.
    frames += write(conv, 2 * SECOND, 0, 0, count=3, offset=40)
    frames += write(conv, 3 * SECOND, 0, 0, count=3, error=DUPLICATE, offset=-1)
    findings = run(frames)
    assert rules(findings) == [
        ("producer.sequence_duplicate", "info"),
        ("producer.sequence_duplicate", "info"),
    ]
    assert findings[0].evidence["original"]["base_offset"] == 40


def test_retry_without_a_seen_acknowledgement_is_silent() -> None:
    conv = Conversation()
    lost = produce(conv, SECOND, [(0, batch(0, 0, 3))])  # never answered (the connection dropped)
    other = Conversation(conn="tap1-c2", client="10.0.0.5:51001")
    assert run([lost, *write(other, 2 * SECOND, 0, 0, count=3, offset=12)]) == []


def test_duplicate_sequence_answer_without_the_original_is_info() -> None:
    conv = Conversation()
    assert rules(run(write(conv, SECOND, 0, 7, error=DUPLICATE, offset=-1))) == [
        ("producer.sequence_duplicate", "info")
    ]


def test_retry_appended_at_another_offset_is_critical() -> None:
    conv = Conversation()
    frames = [
        *write(conv, SECOND, 0, 0, count=3, offset=40),
        *write(conv, 2 * SECOND, 0, 0, count=3, offset=90),
    ]
    findings = run(frames)
    assert rules(findings) == [("producer.sequence_duplicate", "critical")]
    assert "twice" in findings[0].summary


def test_resend_of_acknowledged_sequences_with_other_boundaries() -> None:
    conv = Conversation()
    frames = [
        *write(conv, SECOND, 0, 0, count=4, offset=0),
        *write(conv, 2 * SECOND, 0, 2, count=4, error=45),
    ]
    assert rules(run(frames)) == [("producer.sequence_duplicate", "warning")]
    conv = Conversation()
    frames = [
        *write(conv, SECOND, 0, 0, count=4, offset=0),
        *write(conv, 2 * SECOND, 0, 2, count=4, offset=4),
    ]
    assert rules(run(frames)) == [("producer.sequence_duplicate", "critical")]


def test_split_batch_after_message_too_large_is_silent() -> None:
    conv = Conversation()
    frames = [*write(conv, SECOND, 0, 0, count=10, error=TOO_LARGE, offset=-1)]
    frames += write(conv, 2 * SECOND, 0, 0, count=5, offset=0)
    frames += write(conv, 2 * SECOND + 5 * MS, 0, 5, count=5, offset=5)
    frames += write(conv, 2 * SECOND + 10 * MS, 0, 10, count=1, offset=10)
    assert run(frames) == []


def test_sequences_wrap_around_at_int32_max() -> None:
    conv = Conversation()
    top = 2**31 - 3
    frames = [
        *write(conv, SECOND, 0, top, count=3, offset=0),
        *write(conv, 2 * SECOND, 0, 0, count=2, offset=3),
    ]
    frames += write(conv, 3 * SECOND, 0, 2, count=1, offset=5)
    assert run(frames) == []
    # Across the wrap, skipping is still a gap.
    conv = Conversation()
    frames = [
        *write(conv, SECOND, 0, top, count=3, offset=0),
        *write(conv, 2 * SECOND, 0, 4, count=1, error=45),
    ]
    findings = run(frames)
    assert rules(findings) == [("producer.sequence_gap", "warning")]
    assert findings[0].evidence["missing"] == 4


def test_streams_are_per_partition_and_per_epoch() -> None:
    conv = Conversation()
    frames = [
        *write(conv, SECOND, 0, 0, count=2, partition=0),
        *write(conv, SECOND + 10 * MS, 0, 0, count=2, partition=1),
    ]
    frames += write(conv, 2 * SECOND, 1, 0, partition=0)  # new epoch (not known yet): sequences restart
    assert run(frames) == []


def test_first_batch_seen_mid_stream_is_the_baseline() -> None:
    conv = Conversation()
    assert run([*write(conv, SECOND, 0, 500, count=2), *write(conv, 2 * SECOND, 0, 502)]) == []


def test_tap_gap_marks_sequence_findings_incomplete() -> None:
    conv = Conversation()
    frames = write(conv, SECOND, 0, 0, count=2)
    conv.lose(3)  # the tap lost records of this connection (e.g. a produce)
    frames += write(conv, 2 * SECOND, 0, 5, error=OUT_OF_ORDER)
    gap = [f for f in run(frames) if f.rule == "producer.sequence_gap"]
    assert len(gap) == 1 and gap[0].incomplete


def test_state_is_plain_json() -> None:
    import json

    monitor = Monitor([ProducerRule()], Context(ChecksSettings()))
    conv = Conversation()
    monitor.feed_all(
        [*init_pid(conv, 0, 0), *write(conv, SECOND, 0, 0), produce(conv, 2 * SECOND, [(0, batch(0, 5))])]
    )
    monitor.flush()
    json.dumps(monitor.snapshot())


def test_produce_v13_topic_ids_are_matched_with_their_answers() -> None:
    import uuid

    topic_id = uuid.UUID(int=0xFEED)
    zombie, fencer = two_clients()
    req = zombie.request(
        0,
        13,
        {
            "TransactionalId": None,
            "Acks": -1,
            "TimeoutMs": 30000,
            "TopicData": [{"TopicId": topic_id, "PartitionData": [{"Index": 2, "Records": batch(0, 0)}]}],
        },
        2 * SECOND,
    )
    resp = zombie.response(
        req,
        {
            "Responses": [
                {"TopicId": topic_id, "PartitionResponses": [{"Index": 2, "ErrorCode": 0, "BaseOffset": 5}]}
            ]
        },
        2 * SECOND + MS,
    )
    findings = run([*init_pid(fencer, SECOND, epoch=1), req, resp])
    assert rules(findings) == [("producer.stale_epoch_accepted", "critical")]
    assert (findings[0].evidence["topic"], findings[0].evidence["partition"]) == (f"id:{topic_id}", 2)


def test_state_stays_within_max_entries_per_key() -> None:
    monitor = Monitor([ProducerRule()], Context(ChecksSettings(max_entries_per_key=4)))
    conv = Conversation()
    frames: list[TapFrame] = []
    for partition in range(12):
        frames += write(conv, SECOND + partition * 10 * MS, 0, 0, partition=partition)
    monitor.feed_all(frames)
    monitor.flush()
    state = monitor.snapshot()[f"producer|{PID}"]
    assert len(state["streams"]) <= 4 and monitor.stats.evicted_entries >= 8


# -- fencing on every transactional RPC (KIP-98, KIP-890) -------------------------------------------

ADD_PARTITIONS, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28
INVALID_EPOCH = 47


def txn_rpc(
    conv: Conversation, api: int, version: int, ts: int, epoch: int, error: int, txn: str = "tx"
) -> list[TapFrame]:
    """One transactional RPC by ``conv`` with ``epoch``, answered with ``error``."""
    ids = {"TransactionalId": txn, "ProducerId": PID, "ProducerEpoch": epoch}
    if api == ADD_PARTITIONS and version <= 3:
        req: dict[str, Any] = {
            "V3AndBelowTransactionalId": txn,
            "V3AndBelowProducerId": PID,
            "V3AndBelowProducerEpoch": epoch,
            "V3AndBelowTopics": [{"Name": TOPIC, "Partitions": [0, 1]}],
        }
        parts = [{"PartitionIndex": p, "PartitionErrorCode": error} for p in (0, 1)]
        resp: dict[str, Any] = {"ResultsByTopicV3AndBelow": [{"Name": TOPIC, "ResultsByPartition": parts}]}
    elif api == ADD_PARTITIONS:
        # The batched form a partition leader sends its coordinator (KIP-890 verification), with a
        # second, current transaction in the same request.
        other = {"TransactionalId": "other", "ProducerId": PID + 1, "ProducerEpoch": 0}
        req = {
            "Transactions": [
                {**ids, "VerifyOnly": True, "Topics": [{"Name": TOPIC, "Partitions": [0]}]},
                {**other, "VerifyOnly": True, "Topics": [{"Name": TOPIC, "Partitions": [1]}]},
            ]
        }
        resp = {
            "ErrorCode": 0,
            "ResultsByTransaction": [
                {
                    "TransactionalId": t,
                    "TopicResults": [
                        {
                            "Name": TOPIC,
                            "ResultsByPartition": [{"PartitionIndex": p, "PartitionErrorCode": e}],
                        }
                    ],
                }
                for t, p, e in ((txn, 0, error), ("other", 1, 0))
            ],
        }
    elif api == ADD_OFFSETS:
        req, resp = {**ids, "GroupId": "g"}, {"ErrorCode": error}
    elif api == END_TXN:
        req, resp = {**ids, "Committed": True}, {"ErrorCode": error}
    else:
        req = {
            **ids,
            "GroupId": "g",
            "GenerationIdOrMemberEpoch": -1,
            "MemberId": "",
            "GroupInstanceId": None,
            "Topics": [{"Name": TOPIC, "Partitions": [{"PartitionIndex": 0, "CommittedOffset": 5}]}],
        }
        resp = {"Topics": [{"Name": TOPIC, "Partitions": [{"PartitionIndex": 0, "ErrorCode": error}]}]}
    return conv.exchange(api, version, req, resp, ts)


def test_librdkafka_zombie_fenced_on_add_partitions_v0() -> None:
    """The issue's case: the zombie's next AddPartitionsToTxn v0 (epoch 0) answered 47, no Produce."""
    zombie, fencer = two_clients()
    frames = [
        *init_pid(zombie, 0, epoch=0),
        *init_pid(fencer, SECOND, epoch=1),
        *txn_rpc(zombie, ADD_PARTITIONS, 0, 2 * SECOND, epoch=0, error=INVALID_EPOCH),
    ]
    findings = run(frames)
    assert rules(findings) == [("producer.stale_epoch_rejected", "warning")]
    finding = findings[0]
    ev = finding.evidence
    assert finding.subject == "txn:tx"
    assert (ev["rpc"], ev["broker_error"], ev["producer_epoch"], ev["newest_epoch"]) == (
        "AddPartitionsToTxn v0",
        INVALID_EPOCH,
        0,
        1,
    )
    assert (ev["client_id"], ev["client"], ev["newest_epoch_client_id"], ev["newest_epoch_client"]) == (
        "zombie",
        "10.0.0.7:40000",
        "fencer",
        "10.0.0.8:40000",
    )
    assert ev["transactional_id"] == "tx"
    for text in ("AddPartitionsToTxn v0", "'zombie'", "'fencer'", "INVALID_PRODUCER_EPOCH"):
        assert text in finding.summary


@pytest.mark.parametrize(
    ("api", "version"),
    [
        (ADD_PARTITIONS, 0),
        (ADD_PARTITIONS, 3),
        (ADD_PARTITIONS, 4),
        (ADD_PARTITIONS, 5),
        (ADD_OFFSETS, 0),
        (ADD_OFFSETS, 4),
        (TXN_OFFSET_COMMIT, 0),
        (TXN_OFFSET_COMMIT, 5),
        (END_TXN, 0),
        (END_TXN, 5),
    ],
)
def test_every_transactional_rpc_is_fenced(api: int, version: int) -> None:
    zombie, fencer = two_clients()
    fence = [*init_pid(zombie, 0, epoch=2), *init_pid(fencer, SECOND, epoch=3)]
    # Rejected: a warning naming the RPC. Accepted: critical.
    rejected = run([*fence, *txn_rpc(zombie, api, version, 2 * SECOND, epoch=2, error=FENCED)])
    assert rules(rejected) == [("producer.stale_epoch_rejected", "warning")]
    assert rejected[0].evidence["rpc"].endswith(f" v{version}")
    assert rejected[0].evidence["broker_error"] == FENCED
    zombie, fencer = two_clients()
    fence = [*init_pid(zombie, 0, epoch=2), *init_pid(fencer, SECOND, epoch=3)]
    accepted = run([*fence, *txn_rpc(zombie, api, version, 2 * SECOND, epoch=2, error=0)])
    assert rules(accepted) == [("producer.stale_epoch_accepted", "critical")]
    # The current epoch is not stale, whatever the answer.
    zombie, fencer = two_clients()
    fence = [*init_pid(zombie, 0, epoch=2), *init_pid(fencer, SECOND, epoch=3)]
    assert run([*fence, *txn_rpc(fencer, api, version, 2 * SECOND, epoch=3, error=FENCED)]) == []


def test_batched_add_partitions_judges_each_transaction_on_its_own() -> None:
    zombie, fencer = two_clients()
    leader = Conversation(conn="tap1-b", client="10.0.0.2:9093", client_id="broker-2")
    shared_offsets(zombie, leader)
    frames = [
        *init_pid(zombie, 0, epoch=0),
        *init_pid(fencer, SECOND, epoch=1),
        *txn_rpc(leader, ADD_PARTITIONS, 5, 2 * SECOND, epoch=0, error=INVALID_EPOCH),
    ]
    findings = run(frames)
    # Only producer PID's transaction is stale; the request's other transaction is current.
    assert rules(findings) == [("producer.stale_epoch_rejected", "warning")]
    ev = findings[0].evidence
    assert (ev["producer_id"], ev["verify_only"], ev["client_id"]) == (PID, True, "broker-2")


def test_rpc_sent_before_the_fence_is_answered_is_not_stale() -> None:
    zombie, fencer = two_clients()
    early = txn_rpc(zombie, ADD_OFFSETS, 3, SECOND - 5 * MS, epoch=0, error=FENCED)
    frames = [*init_pid(zombie, 0, epoch=0), early[0], *init_pid(fencer, SECOND, epoch=1), early[1]]
    assert run(frames) == []


def test_transactions_v2_commits_bump_the_epoch_without_false_fences() -> None:
    """Java 4.x with transactions v2: EndTxn v5 returns epoch + 1 each time; the next transaction uses it."""
    conv = Conversation()
    frames = [*init_pid(conv, 0, epoch=0)]
    for n in range(3):
        ts = (n + 1) * SECOND
        frames += txn_rpc(conv, TXN_OFFSET_COMMIT, 5, ts, epoch=n, error=0)
        frames += conv.exchange(
            END_TXN,
            5,
            {"TransactionalId": "tx", "ProducerId": PID, "ProducerEpoch": n, "Committed": True},
            {"ErrorCode": 0, "ProducerId": PID, "ProducerEpoch": n + 1},
            ts + 100 * MS,
        )
    assert run(frames) == []
    stale = txn_rpc(Conversation(conn="tap1-old", client_id="old"), ADD_OFFSETS, 4, 9 * SECOND, 1, FENCED)
    findings = run([*frames, *stale])
    assert rules(findings) == [("producer.stale_epoch_rejected", "warning")]
    assert findings[0].evidence["newest_epoch_source"] == "EndTxn"


@settings(max_examples=60, deadline=None)
@given(
    api=st.sampled_from([ADD_PARTITIONS, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT]),
    known=st.integers(0, 5),
    sent=st.integers(0, 6),
    error=st.sampled_from([0, FENCED, INVALID_EPOCH, 51]),
)
def test_fencing_verdict_depends_only_on_the_epoch_at_send_and_the_answer(
    api: int, known: int, sent: int, error: int
) -> None:
    version = {ADD_PARTITIONS: 3, ADD_OFFSETS: 3, END_TXN: 4, TXN_OFFSET_COMMIT: 3}[api]
    zombie, fencer = two_clients()
    frames = [
        *init_pid(fencer, 0, epoch=known),
        *txn_rpc(zombie, api, version, SECOND, epoch=sent, error=error),
    ]
    expected = []
    if sent < known:
        expected = (
            [("producer.stale_epoch_accepted", "critical")]
            if error == 0
            else [("producer.stale_epoch_rejected", "warning")]
        )
    assert rules(run(frames)) == expected


def test_end_txn_v5_retry_after_a_lost_answer_is_not_a_zombie() -> None:
    """KIP-890: the coordinator answers a retried EndTxn (sent with the epoch before its bump) with the
    bumped epoch; the client never saw the first answer."""
    conv = Conversation()
    ids = {"TransactionalId": "tx", "ProducerId": PID, "ProducerEpoch": 4, "Committed": True}
    bumped = {"ErrorCode": 0, "ProducerId": PID, "ProducerEpoch": 5}
    frames = [*init_pid(conv, 0, epoch=4)]
    frames += conv.exchange(END_TXN, 5, ids, bumped, SECOND)
    retry = Conversation(conn="tap1-c2")  # the first connection broke before the answer reached the client
    frames += retry.exchange(END_TXN, 5, ids, bumped, 2 * SECOND)
    assert run(frames) == []
    # The same EndTxn from two epochs back, or answered with another epoch, is still judged.
    stale = Conversation(conn="tap1-c3").exchange(END_TXN, 5, {**ids, "ProducerEpoch": 3}, bumped, 3 * SECOND)
    assert rules(run([*frames, *stale])) == [("producer.stale_epoch_accepted", "critical")]


# -- what a producer id's state holds ------------------------------------------------------------


def test_pending_exists_only_while_a_decision_waits_for_its_answer() -> None:
    """Each of 10k producer ids kept an empty ``pending`` dict: most of what its state cost."""
    zombie, fencer = two_clients()
    monitor = Monitor([ProducerRule()], Context(ChecksSettings()))
    findings: list[Finding] = []

    def state_after(frames: list[TapFrame]) -> dict[str, Any]:
        findings.extend(monitor.feed_all(frames) + monitor.flush())
        return monitor.states[("producer", str(PID))]

    healthy = state_after([*init_pid(zombie, 0, epoch=0), *write(zombie, SECOND, 0, 0)])
    assert "pending" not in healthy and healthy["epoch"] == 0
    # A gap is decided when the batch is sent and reported with its answer.
    gap = write(zombie, 2 * SECOND, 0, 5, error=OUT_OF_ORDER)
    assert list(state_after(gap[:1])["pending"].values()) == [{"gap": 1}]
    assert "pending" not in state_after(gap[1:])
    # So is a stale epoch on a transactional RPC.
    stale = txn_rpc(zombie, ADD_OFFSETS, 3, 4 * SECOND, epoch=0, error=FENCED)
    state_after(init_pid(fencer, 3 * SECOND, epoch=1))
    assert [d["stale"][0] for d in state_after(stale[:1])["pending"].values()] == [1]
    assert "pending" not in state_after(stale[1:])
    assert rules(findings) == [
        ("producer.sequence_gap", "warning"),
        ("producer.stale_epoch_rejected", "warning"),
    ]


def test_producers_on_one_partition_share_its_stream_key() -> None:
    monitor = Monitor([ProducerRule()], Context(ChecksSettings()))
    frames: list[TapFrame] = []
    for pid in (PID, PID + 1):
        conv = Conversation(conn=f"tap1-{pid}")
        req = conv.request(
            0,
            9,
            {
                "TransactionalId": None,
                "Acks": -1,
                "TimeoutMs": 30000,
                "TopicData": [
                    {"Name": TOPIC, "PartitionData": [{"Index": 0, "Records": batch(0, 0, pid=pid)}]}
                ],
            },
            SECOND,
        )
        frames += [req, answer(conv, req, SECOND + MS, [(0, 0, 0)])]
    monitor.feed_all(frames)
    monitor.flush()
    (a,), (b,) = (monitor.states[("producer", str(p))]["streams"] for p in (PID, PID + 1))
    assert a == b == f"0|{TOPIC}|0" and a is b


# -- tap losses ----------------------------------------------------------------------------------


def _after_loss(conn: str, loss_ns: int) -> Conversation:
    """A connection the tap opened after it may have lost records at ``loss_ns`` (its id says so)."""
    return Conversation(conn=taprecord.connection_id(conn, taprecord.incarnation(loss_ns), 1))


def test_a_gap_across_a_tap_loss_is_incomplete_info_naming_the_tap() -> None:
    """The batches between went through a connection the tap lost (a worker died): not the client's."""
    before, after = Conversation(conn="tap-h-0.a-1"), _after_loss("tap-h-1", 2 * SECOND)
    shared_offsets(before, after)
    frames = [*write(before, SECOND, 0, 0, count=2), *write(after, 3 * SECOND, 0, 6, offset=6)]
    findings = run(frames)
    assert rules(findings) == [("producer.sequence_gap", "info")]
    assert findings[0].incomplete and "tap may have lost records" in findings[0].summary
    assert "not evidence against the client or the broker" in findings[0].summary


def test_a_gap_no_tap_loss_explains_stays_a_warning() -> None:
    # The loss came before the stream's previous batch: that batch was seen, and so was everything after.
    early, late = Conversation(conn="tap-h-0.a-1"), _after_loss("tap-h-1", SECOND // 2)
    shared_offsets(early, late)
    frames = [*write(early, SECOND, 0, 0, count=2), *write(late, 3 * SECOND, 0, 6, offset=6)]
    assert rules(run(frames)) == [("producer.sequence_gap", "warning")]
    # On the connection the loss came before, the previous batch on it was seen after the loss.
    conv = _after_loss("tap-h-1", SECOND // 2)
    frames = [*write(conv, SECOND, 0, 0, count=2), *write(conv, 3 * SECOND, 0, 6, offset=6)]
    findings = run(frames)
    assert rules(findings) == [("producer.sequence_gap", "warning")] and not findings[0].incomplete


def test_a_gap_after_a_loss_on_a_connection_open_across_it_is_incomplete_info() -> None:
    """A client's stream moves to a connection the tap opened before it lost records (librdkafka's
    coordinator requests do): the records written after the loss carry it (``TapFrame.loss_ns``)."""
    before, after = Conversation(conn="tap-h-0.a-1"), Conversation(conn="tap-h-1.a-2")
    shared_offsets(before, after)
    later = write(after, 3 * SECOND, 0, 6, offset=6)
    for frame in later:
        frame.loss_ns = 2 * SECOND
    findings = run([*write(before, SECOND, 0, 0, count=2), *later])
    assert rules(findings) == [("producer.sequence_gap", "info")] and findings[0].incomplete
