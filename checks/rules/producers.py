"""Producer epochs and sequence numbers (KIP-98 idempotence and fencing), keyed by producer id.

One rule, ``producer``, keeps per producer id the newest epoch known and, per epoch and partition, the
sequence numbers the producer sent and the broker acknowledged. It reports:

``producer.stale_epoch_rejected`` (warning) / ``producer.stale_epoch_accepted`` (critical)
    A Produce whose batch epoch is older than the newest epoch known for that producer id *when the
    request was sent* (its ``ts_ns``). Staleness is judged in ``on_request``: the engine releases events
    in event-time order, so at that point every epoch made known before the send has been seen, and
    nothing after it. A zombie's write sent before the new instance's InitProducerId answer is therefore
    not stale even if its response arrives later. The broker's per-partition answer splits the two:
    PRODUCER_FENCED (90), INVALID_PRODUCER_EPOCH (47) or any other error means the write did not land
    (warning); no error means the broker appended a zombie's write (critical: fencing failed).

    An epoch becomes known when a broker confirms it: a successful InitProducerId answer, an EndTxn v5+
    answer (KIP-890 transactions v2 bump the epoch on every EndTxn and return it), a WriteTxnMarkers
    answer (the coordinator may bump the epoch when it aborts a timed-out transaction), or a Produce
    answered without error. A client's *request* never makes an epoch known on its own: a zombie or a
    forger cannot raise the bar for everybody else.

``producer.sequence_gap`` (warning)
    Per producer id, epoch and partition, a batch whose base sequence lies ahead of the end of every
    batch sent before it (sequences wrap at 2**31, as in the broker). Judged against what was *sent*,
    not what was acknowledged, so that several in-flight batches, or a batch answered
    OUT_OF_ORDER_SEQUENCE (45) because an earlier in-flight one failed, are not gaps. The broker's
    answer goes into the evidence: 45 confirms the gap, no error means the broker accepted it.

``producer.sequence_duplicate``
    A batch that re-sends sequence numbers the broker already acknowledged. An exact retry (same base
    sequence and count) that the broker deduplicated -- answered DUPLICATE_SEQUENCE (46), or without
    error at the original base offset -- is what a client does when a response is lost: ``info``. The
    same retry appended at a *different* offset means the log holds the records twice: ``critical``.
    A batch that overlaps acknowledged sequences with other boundaries: ``warning``. Re-sending
    sequences that were sent but never acknowledged (retries after retriable errors, batches split after
    MESSAGE_TOO_LARGE) is normal and silent.

Sequences start afresh with each epoch (KIP-360 bumps after errors, KIP-890 bumps per transaction), so
streams are keyed by epoch. The first batch seen on a stream is the baseline: the monitor may have
started mid-stream, so it never raises a gap. Writes judged stale skip the sequence checks (one alert
for a zombie write, not two).

State (JSON-compatible, per producer id): ``epoch``/``epoch_src``/``epoch_ts`` (newest known epoch),
``streams`` ("epoch|topic|partition" -> ``next`` sequence after everything sent, ``acked`` recent
acknowledged batches as [base, count, base offset]), and ``pending`` (decisions taken when a request
was sent, keyed "conn|correlation id|topic|partition|batch index", applied when its answer comes).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from checks.model import Exchange, Severity
from checks.rule import Rule, RuleContext, State
from codec.protocol import ApiKey, ErrorCode

#: Sequence numbers are non-negative int32s that wrap to 0 after 2**31 - 1 (as the broker computes them).
SEQ_MOD = 2**31
#: A difference below half the sequence space counts as "ahead"; above it, as "behind" (wrapped).
SEQ_HALF = 2**30
#: Acknowledged batches remembered per stream. The broker deduplicates against its last 5; a few more
#: lets the monitor recognise a late retry of an older batch.
ACKED_WINDOW = 16


# ---------------------------------------------------------------------------------------------------
# Shared helpers (also used by checks.rules.transactions).


def topic_key(topic: dict[str, Any]) -> str:
    """A topic's name, or ``id:<uuid>`` for versions that carry only ids (Produce v13, Fetch v13+)."""
    name = topic.get("Name", topic.get("Topic"))
    if name is not None:
        return str(name)
    topic_id = topic.get("TopicId")
    return f"id:{topic_id}" if topic_id is not None else ""


def record_batches(records: Any) -> list[Any]:
    """The batch headers of a ``records`` field (``codec.records.RecordBatches``), [] when absent."""
    if records is None:
        return []
    batches = getattr(records, "batches", None)
    return list(batches) if batches is not None else []


def produce_batches(ex: Exchange) -> Iterator[tuple[str, int, int, Any]]:
    """(topic, partition, index of the batch in the partition's records, batch) for every batch sent."""
    for topic in ex.req.body.get("TopicData") or []:
        tkey = topic_key(topic)
        for part in topic.get("PartitionData") or []:
            for i, batch in enumerate(record_batches(part.get("Records"))):
                yield tkey, int(part.get("Index", -1)), i, batch


def produce_answers(ex: Exchange) -> dict[str, dict[str, Any]]:
    """ "topic|partition" -> that partition's Produce answer (ErrorCode, BaseOffset, ...)."""
    out: dict[str, dict[str, Any]] = {}
    resp = ex.resp
    if resp is None:
        return out
    for topic in resp.body.get("Responses") or []:
        tkey = topic_key(topic)
        for part in topic.get("PartitionResponses") or []:
            out[f"{tkey}|{part.get('Index')}"] = part
    return out


def is_producing(batch: Any) -> bool:
    """A batch written by an idempotent or transactional producer (not a control batch)."""
    return int(getattr(batch, "producer_id", -1)) >= 0 and not bool(getattr(batch, "is_control", False))


def seq_add(seq: int, count: int) -> int:
    return (seq + count) % SEQ_MOD


def seq_ahead(a: int, b: int) -> int:
    """How far ``a`` lies ahead of ``b`` in wrapping sequence space (0 when equal, <0 when behind)."""
    d = (a - b) % SEQ_MOD
    return d if d < SEQ_HALF else d - SEQ_MOD


def seq_overlap(base_a: int, count_a: int, base_b: int, count_b: int) -> bool:
    """Whether [base_a, base_a + count_a) and [base_b, base_b + count_b) share a sequence (wrapping)."""
    return (base_a - base_b) % SEQ_MOD < count_b or (base_b - base_a) % SEQ_MOD < count_a


# ---------------------------------------------------------------------------------------------------


class ProducerRule(Rule):
    name = "producer"
    key_kind = "producer"
    api_keys = frozenset({ApiKey.PRODUCE, ApiKey.INIT_PRODUCER_ID, ApiKey.END_TXN, ApiKey.WRITE_TXN_MARKERS})

    def keys(self, ex: Exchange) -> list[str]:
        api = ex.api_key
        pids: list[int] = []
        if api == ApiKey.PRODUCE:
            pids = [int(b.producer_id) for _, _, _, b in produce_batches(ex) if is_producing(b)]
        elif api in (ApiKey.INIT_PRODUCER_ID, ApiKey.END_TXN):
            resp = ex.resp
            if resp is not None and resp.body.get("ProducerId") is not None:
                pids = [int(resp.body["ProducerId"])]
        elif api == ApiKey.WRITE_TXN_MARKERS:
            pids = [int(m.get("ProducerId", -1)) for m in ex.req.body.get("Markers") or []]
        # Ordered and unique: findings come out in a stable order.
        return [str(p) for p in dict.fromkeys(pids) if p >= 0]

    # -- events -----------------------------------------------------------------------------------

    def on_request(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        if ex.api_key != ApiKey.PRODUCE:
            return
        pid = int(key)
        known = int(state.get("epoch", -1))
        streams: dict[str, Any] = state.setdefault("streams", {})
        pending: dict[str, Any] = state.setdefault("pending", {})
        for topic, partition, index, batch in produce_batches(ex):
            if not is_producing(batch) or int(batch.producer_id) != pid:
                continue
            epoch = int(batch.producer_epoch)
            decision: dict[str, Any] = {}
            if 0 <= epoch < known:
                decision["stale"] = [known, state.get("epoch_src", ""), state.get("epoch_ts", 0)]
            else:
                expected = self._sent(streams, epoch, topic, partition, batch, ctx)
                if expected is not None:
                    decision["gap"] = expected
            if decision:
                pending[f"{ex.conn}|{ex.request.correlation_id}|{topic}|{partition}|{index}"] = decision
                ctx.trim(pending)

    def on_response(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        if ex.api_key == ApiKey.PRODUCE:
            self._produce_answered(state, key, ex, ctx)
            return
        resp = ex.resp
        if resp is None:
            return
        pid = int(key)
        if ex.api_key == ApiKey.INIT_PRODUCER_ID and resp.body.get("ErrorCode") == 0:
            self._learn(state, int(resp.body.get("ProducerEpoch", -1)), "InitProducerId", ex)
        elif ex.api_key == ApiKey.END_TXN and resp.body.get("ErrorCode") == 0 and ex.api_version >= 5:
            self._learn(state, int(resp.body.get("ProducerEpoch", -1)), "EndTxn", ex)
        elif ex.api_key == ApiKey.WRITE_TXN_MARKERS:
            written = {
                int(m.get("ProducerId", -1))
                for m in resp.body.get("Markers") or []
                if any(
                    p.get("ErrorCode") == 0 for t in m.get("Topics") or [] for p in t.get("Partitions") or []
                )
            }
            if pid in written:
                for marker in ex.req.body.get("Markers") or []:
                    if int(marker.get("ProducerId", -1)) == pid:
                        self._learn(state, int(marker.get("ProducerEpoch", -1)), "WriteTxnMarkers", ex)

    # -- helpers ----------------------------------------------------------------------------------

    @staticmethod
    def _learn(state: State, epoch: int, source: str, ex: Exchange) -> None:
        """A broker confirmed ``epoch``: from the answer's time on, older epochs are stale."""
        if epoch > int(state.get("epoch", -1)):
            ts = ex.response.ts_ns if ex.response is not None else ex.ts_ns
            state["epoch"], state["epoch_src"], state["epoch_ts"] = epoch, source, ts
            # Sequence state of epochs two or more behind is only zombie business: drop it.
            streams = state.get("streams", {})
            for skey in [s for s in streams if int(s.split("|", 1)[0]) < epoch - 1]:
                del streams[skey]

    @staticmethod
    def _sent(
        streams: dict[str, Any], epoch: int, topic: str, partition: int, batch: Any, ctx: RuleContext
    ) -> int | None:
        """Record a batch as sent; return the expected base sequence when it skips ahead of it."""
        base, count = int(batch.base_sequence), max(int(batch.record_count), 1)
        if base < 0:
            return None
        skey = f"{epoch}|{topic}|{partition}"
        stream = streams.get(skey)
        if stream is None:
            streams[skey] = {"next": seq_add(base, count), "acked": []}
            ctx.trim(streams)
            return None
        expected = int(stream["next"])
        end = seq_add(base, count)
        if seq_ahead(end, expected) > 0:
            stream["next"] = end
        return expected if seq_ahead(base, expected) > 0 else None

    def _produce_answered(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        pid = int(key)
        answers = produce_answers(ex)
        pending: dict[str, Any] = state.get("pending", {})
        streams: dict[str, Any] = state.setdefault("streams", {})
        for topic, partition, index, batch in produce_batches(ex):
            if not is_producing(batch) or int(batch.producer_id) != pid:
                continue
            epoch, base, count = int(batch.producer_epoch), int(batch.base_sequence), int(batch.record_count)
            answer = answers.get(f"{topic}|{partition}")
            error = None if answer is None else int(answer.get("ErrorCode", 0))
            # Only a partition's first batch has its base offset in the answer.
            offset = int(answer.get("BaseOffset", -1)) if answer is not None and index == 0 else -1
            decision = pending.pop(f"{ex.conn}|{ex.request.correlation_id}|{topic}|{partition}|{index}", {})
            evidence = {
                **ex.evidence(),
                "producer_id": pid,
                "producer_epoch": epoch,
                "topic": topic,
                "partition": partition,
                "base_sequence": base,
                "record_count": count,
                "transactional": bool(getattr(batch, "is_transactional", False)),
                "broker_error": error,
                "base_offset": offset,
            }
            if "stale" in decision:
                _report_stale(decision["stale"], error, evidence, ex, ctx)
                continue
            if error == 0 and epoch >= 0:
                # The broker appended a batch with this epoch: it is current (or newer) from now on.
                self._learn(state, epoch, "Produce", ex)
            if "gap" in decision:
                _report_gap(int(decision["gap"]), error, evidence, ex, ctx)
            stream = streams.get(f"{epoch}|{topic}|{partition}")
            if stream is not None and base >= 0:
                _check_duplicate(stream, error, evidence, ex, ctx)


def _report_stale(
    known: list[Any], error: int | None, evidence: dict[str, Any], ex: Exchange, ctx: RuleContext
) -> None:
    newest, source, since = int(known[0]), str(known[1]), int(known[2])
    evidence = {**evidence, "newest_epoch": newest, "newest_epoch_source": source, "newest_epoch_ts": since}
    pid, epoch = evidence["producer_id"], evidence["producer_epoch"]
    what = f"producer {pid} wrote to {evidence['topic']}-{evidence['partition']} with epoch {epoch}"
    if error == 0:
        ctx.emit(
            "producer.stale_epoch_accepted",
            Severity.CRITICAL,
            f"producer:{pid}",
            f"{what} after epoch {newest} was known ({source}), and the broker appended it: fencing failed",
            ex.ts_ns,
            evidence,
            conns=(ex.conn,),
        )
        return
    outcomes: dict[int | None, str] = {
        ErrorCode.PRODUCER_FENCED: "the broker fenced it (PRODUCER_FENCED)",
        ErrorCode.INVALID_PRODUCER_EPOCH: "the broker fenced it (INVALID_PRODUCER_EPOCH)",
        None: "no answer was seen, so whether it landed is unknown",
    }
    outcome = outcomes.get(error, f"the broker refused it (error {error})")
    ctx.emit(
        "producer.stale_epoch_rejected",
        Severity.WARNING,
        f"producer:{pid}",
        f"zombie write: {what} after epoch {newest} was known ({source}); {outcome}",
        ex.ts_ns,
        evidence,
        conns=(ex.conn,),
    )


def _report_gap(
    expected: int, error: int | None, evidence: dict[str, Any], ex: Exchange, ctx: RuleContext
) -> None:
    base = int(evidence["base_sequence"])
    missing = seq_ahead(base, expected)
    if error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER:
        outcome = "the broker confirmed it (OUT_OF_ORDER_SEQUENCE)"
    elif error == 0:
        outcome = "the broker accepted it"
    else:
        outcome = f"broker answer: {error}"
    ctx.emit(
        "producer.sequence_gap",
        Severity.WARNING,
        f"producer:{evidence['producer_id']}",
        f"producer {evidence['producer_id']} epoch {evidence['producer_epoch']} on "
        f"{evidence['topic']}-{evidence['partition']} sent base sequence {base} where {expected} was next: "
        f"{missing} sequence number(s) skipped; {outcome}",
        ex.ts_ns,
        {**evidence, "expected_sequence": expected, "missing": missing},
        conns=(ex.conn,),
    )


def _check_duplicate(
    stream: dict[str, Any], error: int | None, evidence: dict[str, Any], ex: Exchange, ctx: RuleContext
) -> None:
    """Compare an answered batch with the acknowledged ones of its stream, then remember it."""
    base, count, offset = (
        int(evidence["base_sequence"]),
        max(int(evidence["record_count"]), 1),
        evidence["base_offset"],
    )
    acked: list[list[int]] = stream["acked"]
    exact = next((a for a in acked if a[0] == base and a[1] == count), None)
    overlapping = exact or next((a for a in acked if seq_overlap(base, count, a[0], a[1])), None)
    where = (
        f"producer {evidence['producer_id']} epoch {evidence['producer_epoch']} on "
        f"{evidence['topic']}-{evidence['partition']}"
    )
    subject = f"producer:{evidence['producer_id']}"
    if overlapping is None:
        if error in (0, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
            acked.append([base, count, offset if error == 0 else -1])
            del acked[:-ACKED_WINDOW]
        if error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
            # The original write was not seen (before the monitor started, or on an untapped path).
            ctx.emit(
                "producer.sequence_duplicate",
                Severity.INFO,
                subject,
                f"{where}: the broker answered DUPLICATE_SEQUENCE for base sequence {base} (a retry it deduplicated)",
                ex.ts_ns,
                evidence,
                conns=(ex.conn,),
            )
        return
    original = {
        "base_sequence": overlapping[0],
        "record_count": overlapping[1],
        "base_offset": overlapping[2],
    }
    evidence = {**evidence, "original": original}
    if exact is not None:
        if error == 0 and offset >= 0 and exact[2] >= 0 and offset != exact[2]:
            severity = Severity.CRITICAL
            summary = (
                f"{where}: batch with base sequence {base}, acknowledged at offset {exact[2]}, was appended "
                f"again at offset {offset}: the log holds it twice"
            )
        else:
            severity = Severity.INFO
            outcome = {
                0: "deduplicated (answered with the original offset)",
                ErrorCode.DUPLICATE_SEQUENCE_NUMBER: "deduplicated (DUPLICATE_SEQUENCE)",
                None: "no answer seen",
            }.get(error, f"refused (error {error})")
            summary = f"{where}: retry of acknowledged base sequence {base}; {outcome}"
    else:
        severity = Severity.CRITICAL if error == 0 else Severity.WARNING
        outcome = "the broker appended it" if error == 0 else f"the broker refused it (error {error})"
        summary = (
            f"{where}: batch {base}..{seq_add(base, count - 1)} re-sends acknowledged sequences "
            f"{overlapping[0]}..{seq_add(overlapping[0], overlapping[1] - 1)} with other batch boundaries; "
            f"{outcome}"
        )
    ctx.emit("producer.sequence_duplicate", severity, subject, summary, ex.ts_ns, evidence, conns=(ex.conn,))


RULES: list[type[Rule]] = [ProducerRule]
