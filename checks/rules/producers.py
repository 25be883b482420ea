"""Producer epochs and sequence numbers (KIP-98 idempotence and fencing), keyed by producer id.

One rule, ``producer``, keeps per producer id the newest epoch known and, per epoch and partition, the
sequence numbers the producer sent and the broker acknowledged. It reports:

``producer.stale_epoch_rejected`` (warning) / ``producer.stale_epoch_accepted`` (critical)
    A request carrying a producer id and epoch -- Produce, AddPartitionsToTxn (v0-v3 from the client,
    v4+ batched from a partition leader verifying a write, KIP-890), AddOffsetsToTxn, TxnOffsetCommit,
    EndTxn -- whose epoch is older than the newest epoch known for that producer id *when the request
    was sent* (its ``ts_ns``). Staleness is judged in ``on_request``: the engine releases events in
    event-time order, so at that point every epoch made known before the send has been seen, and
    nothing after it. A zombie's request sent before the new instance's InitProducerId answer is
    therefore not stale even if its response arrives later. The broker's answer splits the two:
    PRODUCER_FENCED (90), INVALID_PRODUCER_EPOCH (47) or any other error means it was refused
    (warning); no error means the broker accepted a zombie's request (critical: fencing failed). A
    Produce is judged per batch, a batched AddPartitionsToTxn per transaction, the others per request.
    Subject and evidence name the transactional id, the RPC, and both clients: the stale request's and
    the one whose answer made the newer epoch known. InitProducerId is not judged (KIP-588: a producer
    whose transaction timed out re-initialises with the epoch it had), nor an EndTxn v5+ retried with
    the epoch just before its own bump and answered with the bumped epoch (KIP-890: a lost answer).

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
    answer goes into the evidence: 45 confirms the gap, no error means the broker accepted it. When the
    stream's previous batch came on another connection, and the tap may have lost records after it was
    sent and before it wrote this one (``RuleContext.tap_loss``: a worker or the tap died, its queue
    overflowed), the skipped batches most likely went through records the tap lost: the gap is then
    incomplete, ``info``, and says so.

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

State (JSON-compatible, per producer id): ``epoch``/``epoch_src``/``epoch_ts``/``epoch_client``
(newest known epoch, and the answer and client it came from), ``txn`` (its transactional id),
``streams`` ("epoch|topic|partition" -> ``next`` sequence after everything sent, ``acked`` recent
acknowledged batches as [base, count, base offset], ``at`` and ``via`` when and on which connection
its latest batch was sent), and ``pending`` (only while decisions taken when a
request was sent wait for its answer, keyed "conn|correlation id|topic|partition|batch index" for Produce and
"conn|correlation id|txn|claim index" for the other RPCs, applied when its answer comes).
"""

from __future__ import annotations

from typing import Any

from checks.codes import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    DUPLICATE_SEQUENCE_NUMBER,
    END_TXN,
    INIT_PRODUCER_ID,
    INVALID_PRODUCER_EPOCH,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    PRODUCE,
    PRODUCER_FENCED,
    TXN_OFFSET_COMMIT,
    WRITE_TXN_MARKERS,
)
from checks.model import Exchange, Severity
from checks.rule import Rule, RuleContext, SharedValues, State
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


#: A batch a Produce request carries from an idempotent or transactional producer (``is_producing``):
#: (topic, partition, index of the batch in the partition's records, batch, producer id, epoch, base
#: sequence, record count).
ProducedBatch = tuple[str, int, int, Any, int, int, int, int]


def produce_batches(ex: Exchange) -> tuple[ProducedBatch, ...]:
    """Every batch of a Produce request that a producer id wrote (``is_producing``), in request order.

    Walked once per exchange: the producer and transaction rules each read them several times (keys,
    request, answer), so the walk is kept in ``ex.memo`` and shared. Read-only."""
    found: tuple[ProducedBatch, ...] | None = ex.memo.get("produce_batches")
    if found is None:
        out: list[ProducedBatch] = []
        for topic in ex.req.body.get("TopicData") or []:
            tkey = topic_key(topic)
            for part in topic.get("PartitionData") or []:
                batches = record_batches(part.get("Records"))
                if not batches:
                    continue
                partition = int(part.get("Index", -1))
                for i, batch in enumerate(batches):
                    if is_producing(batch):
                        out.append(
                            (
                                tkey,
                                partition,
                                i,
                                batch,
                                int(batch.producer_id),
                                int(batch.producer_epoch),
                                int(batch.base_sequence),
                                int(batch.record_count),
                            )
                        )
        found = ex.memo["produce_batches"] = tuple(out)
    return found


def produce_answers(ex: Exchange) -> dict[tuple[str, int], dict[str, Any]]:
    """(topic, partition) -> that partition's Produce answer (ErrorCode, BaseOffset, ...); kept in
    ``ex.memo`` like ``produce_batches``. Read-only."""
    found: dict[tuple[str, int], dict[str, Any]] | None = ex.memo.get("produce_answers")
    if found is None:
        found = ex.memo["produce_answers"] = {}
        resp = ex.resp
        if resp is not None:
            for topic in resp.body.get("Responses") or []:
                tkey = topic_key(topic)
                for part in topic.get("PartitionResponses") or []:
                    found[(tkey, part.get("Index"))] = part
    return found


#: The RPCs besides Produce that carry a producer id and epoch, and that a broker fences (KIP-98, KIP-890).
FENCED_TXN_RPCS = frozenset(
    {ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.TXN_OFFSET_COMMIT, ApiKey.END_TXN}
)
#: AddPartitionsToTxn v4+ is the batched form brokers send (KIP-890 part 1 verification).
ADD_PARTITIONS_BATCHED = 4


def txn_id_of(value: Any) -> str | None:
    """A transactional id field's value, None when absent or empty."""
    return value if isinstance(value, str) and value else None


def txn_claims(ex: Exchange) -> tuple[tuple[int, int, str | None], ...]:
    """(producer id, epoch, transactional id) of every transaction a non-Produce transactional request
    names, in request order: one for AddOffsetsToTxn, TxnOffsetCommit, EndTxn and AddPartitionsToTxn
    v0-v3, one per transaction for the batched AddPartitionsToTxn v4+. Kept in ``ex.memo``."""
    found: tuple[tuple[int, int, str | None], ...] | None = ex.memo.get("txn_claims")
    if found is None:
        found = ex.memo["txn_claims"] = _txn_claims(ex)
    return found


def _txn_claims(ex: Exchange) -> tuple[tuple[int, int, str | None], ...]:
    body, api = ex.req.body, ex.api_key
    if api == ADD_PARTITIONS_TO_TXN:
        if ex.api_version >= ADD_PARTITIONS_BATCHED:
            return tuple(
                (
                    int(t.get("ProducerId", -1)),
                    int(t.get("ProducerEpoch", -1)),
                    txn_id_of(t.get("TransactionalId")),
                )
                for t in body.get("Transactions") or []
            )
        return (
            (
                int(body.get("V3AndBelowProducerId", -1)),
                int(body.get("V3AndBelowProducerEpoch", -1)),
                txn_id_of(body.get("V3AndBelowTransactionalId")),
            ),
        )
    if api in FENCED_TXN_RPCS:
        return (
            (
                int(body.get("ProducerId", -1)),
                int(body.get("ProducerEpoch", -1)),
                txn_id_of(body.get("TransactionalId")),
            ),
        )
    return ()


def txn_claim_error(ex: Exchange, index: int) -> int | None:
    """The broker's answer to claim ``index`` of ``txn_claims``: 0 when anything it asked for was done,
    else its (first fencing, else first) error code; None when no answer was seen."""
    resp = ex.resp
    if resp is None:
        return None
    body, api = resp.body, ex.api_key
    if api in (ADD_OFFSETS_TO_TXN, END_TXN):
        return int(body.get("ErrorCode", 0))
    if api == TXN_OFFSET_COMMIT:
        codes = [
            int(p.get("ErrorCode", 0)) for t in body.get("Topics") or [] for p in t.get("Partitions") or []
        ]
    elif ex.api_version < ADD_PARTITIONS_BATCHED:
        codes = [
            int(p.get("PartitionErrorCode", 0))
            for t in body.get("ResultsByTopicV3AndBelow") or []
            for p in t.get("ResultsByPartition") or []
        ]
    else:
        top = int(body.get("ErrorCode", 0))
        if top != 0:
            return top
        claims = txn_claims(ex)
        txn = claims[index][2] if index < len(claims) else None
        codes = [
            int(p.get("PartitionErrorCode", 0))
            for r in body.get("ResultsByTransaction") or []
            if r.get("TransactionalId") == txn
            for t in r.get("TopicResults") or []
            for p in t.get("ResultsByPartition") or []
        ]
    if not codes or 0 in codes:
        return 0
    fencing = [c for c in codes if c in (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH)]
    return (fencing or codes)[0]


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
    api_keys = frozenset(
        {ApiKey.PRODUCE, ApiKey.INIT_PRODUCER_ID, ApiKey.WRITE_TXN_MARKERS, *FENCED_TXN_RPCS}
    )

    def keys(self, ex: Exchange) -> list[str]:
        api = ex.api_key
        pids: list[int] = []
        if api == PRODUCE:
            pids = [b[4] for b in produce_batches(ex)]
        elif api in FENCED_TXN_RPCS:
            pids = [pid for pid, _, _ in txn_claims(ex)]
        if api in (INIT_PRODUCER_ID, END_TXN):
            # EndTxn v5+ may answer with a new producer id (epoch exhaustion, KIP-890).
            resp = ex.resp
            if resp is not None and resp.body.get("ProducerId") is not None:
                pids.append(int(resp.body["ProducerId"]))
        elif api == WRITE_TXN_MARKERS:
            pids = [int(m.get("ProducerId", -1)) for m in ex.req.body.get("Markers") or []]
        # Ordered and unique: findings come out in a stable order.
        return [str(p) for p in dict.fromkeys(pids) if p >= 0]

    # -- events -----------------------------------------------------------------------------------

    def on_request(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        pid = int(key)
        known = int(state.get("epoch", -1))
        txn = _request_txn_id(ex)
        if txn is not None:
            state["txn"] = txn
        if ex.api_key in FENCED_TXN_RPCS:
            for index, (claim_pid, epoch, _txn) in enumerate(txn_claims(ex)):
                if claim_pid == pid and 0 <= epoch < known:
                    _pend(
                        state,
                        f"{ex.conn}|{ex.request.correlation_id}|txn|{index}",
                        {"stale": _known(state)},
                        ctx,
                    )
            return
        if ex.api_key != PRODUCE:
            return
        streams: dict[str, Any] = state.setdefault("streams", {})
        for topic, partition, index, _batch, batch_pid, epoch, base, count in produce_batches(ex):
            if batch_pid != pid:
                continue
            decision: dict[str, Any] = {}
            if 0 <= epoch < known:
                decision["stale"] = _known(state)
            else:
                sent = self._sent(streams, epoch, topic, partition, base, count, ex, ctx)
                if sent is not None:
                    expected, since, via = sent
                    decision["gap"] = expected
                    # The batches between may have gone through another connection whose records the
                    # tap lost (this one's own losses make its findings incomplete already).
                    loss = None if since is None or via == ex.conn else ctx.tap_loss(ex.request, since)
                    if loss is not None:
                        decision["tap_loss"] = list(loss)
            if decision:
                _pend(
                    state, f"{ex.conn}|{ex.request.correlation_id}|{topic}|{partition}|{index}", decision, ctx
                )

    def on_response(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        if ex.api_key == PRODUCE:
            self._produce_answered(state, key, ex, ctx)
            return
        if ex.api_key in FENCED_TXN_RPCS:
            self._txn_rpc_answered(state, key, ex, ctx)
        resp = ex.resp
        if resp is None:
            return
        pid = int(key)
        if ex.api_key == INIT_PRODUCER_ID and resp.body.get("ErrorCode") == 0:
            txn = _request_txn_id(ex)
            if txn is not None:
                state["txn"] = txn
            self._learn(state, int(resp.body.get("ProducerEpoch", -1)), "InitProducerId", ex)
        elif (
            ex.api_key == END_TXN
            and resp.body.get("ErrorCode") == 0
            and ex.api_version >= 5
            and int(resp.body.get("ProducerId", -1)) == pid
        ):
            self._learn(state, int(resp.body.get("ProducerEpoch", -1)), "EndTxn", ex)
        elif ex.api_key == WRITE_TXN_MARKERS:
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

    # -- summaries (checks.summaries) -------------------------------------------------------------

    def summary_applies(self, state: State, key: str, kind: str, facts: Any, ctx: RuleContext) -> bool:
        """A run of ordinary Produce exchanges (``checks.summaries.ProduceRun``) changes only its
        streams' ``next``, ``acked``, ``at`` and ``via`` when: its epoch is the one known (none is
        stale, none teaches a newer one), each stream it continues expects the run's first base
        sequence (no gap) and holds nothing acknowledged that overlaps the run (no duplicate), the
        streams it starts fit in the state's bound (starting one trims none), and no decision waits on
        its connection (an answer of the run would take it)."""
        if int(state.get("epoch", -1)) != facts.epoch:
            return False
        pending = state.get("pending")
        if pending and any(k.startswith(f"{facts.conn}|") for k in pending):
            return False
        streams = state.get("streams") or {}
        started = 0
        for topic, partition, first, after, _at, _acked in facts.streams:
            stream = streams.get(f"{facts.epoch}|{topic}|{partition}")
            if stream is None:
                started += 1
                continue
            if int(stream["next"]) != first:
                return False
            span = (after - first) % SEQ_MOD
            if any(seq_overlap(first, span, a[0], a[1]) for a in stream["acked"]):
                return False
        return len(streams) + started <= ctx.config.max_entries_per_key

    def on_summary(self, state: State, key: str, kind: str, facts: Any, ctx: RuleContext) -> None:
        if facts.txn is not None:
            state["txn"] = facts.txn
        streams: dict[str, Any] = state.setdefault("streams", {})
        for topic, partition, _first, after, at, acked in facts.streams:
            skey = f"{facts.epoch}|{topic}|{partition}"
            stream = streams.get(skey)
            if stream is None:
                # Started by the run's first request to it (``_sent``), in the order the run started them.
                stream = streams[_STREAM_KEYS.share(skey)] = {"next": after, "acked": [], "at": at}
                stream["via"] = facts.conn
            else:
                stream["next"], stream["at"], stream["via"] = after, at, facts.conn
            window: list[list[int]] = stream["acked"]
            window.extend([list(a) for a in acked])
            del window[:-ACKED_WINDOW]
        _unpend(state)

    # -- helpers ----------------------------------------------------------------------------------

    def _txn_rpc_answered(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        """Judge the stale claims of an AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit or EndTxn."""
        pid = int(key)
        pending: dict[str, Any] = state.get("pending") or {}
        for index, (claim_pid, epoch, txn) in enumerate(txn_claims(ex)):
            decision = pending.pop(f"{ex.conn}|{ex.request.correlation_id}|txn|{index}", None)
            if claim_pid != pid or decision is None or _end_txn_retry(ex, epoch, decision["stale"]):
                continue
            evidence = {
                **_stale_evidence(ex, pid, epoch, txn or state.get("txn")),
                "broker_error": txn_claim_error(ex, index),
            }
            if ex.api_key == ADD_PARTITIONS_TO_TXN and ex.api_version >= ADD_PARTITIONS_BATCHED:
                verify = [t.get("VerifyOnly") for t in ex.req.body.get("Transactions") or []]
                evidence["verify_only"] = bool(verify[index]) if index < len(verify) else None
            _report_stale(decision["stale"], evidence["broker_error"], evidence, ex, ctx)
        _unpend(state)

    @staticmethod
    def _learn(state: State, epoch: int, source: str, ex: Exchange) -> None:
        """A broker confirmed ``epoch``: from the answer's time on, older epochs are stale."""
        if epoch > int(state.get("epoch", -1)):
            ts = ex.response.ts_ns if ex.response is not None else ex.ts_ns
            state["epoch"], state["epoch_src"], state["epoch_ts"] = epoch, source, ts
            state["epoch_client"] = [ex.request.client, ex.req.client_id or ""]
            # Sequence state of epochs two or more behind is only zombie business: drop it.
            streams = state.get("streams", {})
            for skey in [s for s in streams if int(s.split("|", 1)[0]) < epoch - 1]:
                del streams[skey]

    @staticmethod
    def _sent(
        streams: dict[str, Any],
        epoch: int,
        topic: str,
        partition: int,
        base: int,
        count: int,
        ex: Exchange,
        ctx: RuleContext,
    ) -> tuple[int, int | None, str | None] | None:
        """Record a batch ``ex`` sent; when it skips ahead of the expected base sequence, return that,
        and when and on which connection the stream's previous batch was sent (None in state kept
        before those were)."""
        count = max(count, 1)
        if base < 0:
            return None
        skey = f"{epoch}|{topic}|{partition}"
        stream = streams.get(skey)
        if stream is None:
            streams[_STREAM_KEYS.share(skey)] = {
                "next": seq_add(base, count),
                "acked": [],
                "at": ex.ts_ns,
                "via": ex.conn,
            }
            ctx.trim(streams)
            return None
        expected = int(stream["next"])
        since, via = stream.get("at"), stream.get("via")
        stream["at"], stream["via"] = ex.ts_ns, ex.conn
        end = seq_add(base, count)
        if seq_ahead(end, expected) > 0:
            stream["next"] = end
        return (expected, since, via) if seq_ahead(base, expected) > 0 else None

    def _produce_answered(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        pid = int(key)
        answers = produce_answers(ex)
        pending: dict[str, Any] = state.get("pending") or {}
        streams: dict[str, Any] = state.setdefault("streams", {})
        for topic, partition, index, batch, batch_pid, epoch, base, count in produce_batches(ex):
            if batch_pid != pid:
                continue
            answer = answers.get((topic, partition))
            error = None if answer is None else int(answer.get("ErrorCode", 0))
            # Only a partition's first batch has its base offset in the answer.
            offset = int(answer.get("BaseOffset", -1)) if answer is not None and index == 0 else -1
            decision = (
                pending.pop(f"{ex.conn}|{ex.request.correlation_id}|{topic}|{partition}|{index}", None)
                if pending
                else None
            )
            # The evidence is built only when a finding fires: most answered batches raise none.
            batch_facts = (ex, state, pid, topic, partition, batch, epoch, base, count, error, offset)
            if decision is not None and "stale" in decision:
                _report_stale(decision["stale"], error, _batch_evidence(*batch_facts), ex, ctx)
                continue
            if error == 0 and epoch >= 0:
                # The broker appended a batch with this epoch: it is current (or newer) from now on.
                self._learn(state, epoch, "Produce", ex)
            if decision is not None and "gap" in decision:
                loss = decision.get("tap_loss")
                _report_gap(
                    int(decision["gap"]),
                    error,
                    _batch_evidence(*batch_facts),
                    ex,
                    ctx,
                    None if loss is None else (str(loss[0]), int(loss[1])),
                )
            if base >= 0:
                stream = streams.get(f"{epoch}|{topic}|{partition}")
                if stream is not None:
                    _check_duplicate(stream, error, base, count, offset, batch_facts, ex, ctx)
        _unpend(state)


#: Stream keys (``epoch|topic|partition``): producers writing to the same partitions at the same epoch
#: hold one string, not one each.
_STREAM_KEYS: SharedValues[str, str] = SharedValues()


def _pend(state: State, key: str, decision: dict[str, Any], ctx: RuleContext) -> None:
    """Keep a decision taken at send time until the answer comes. ``pending`` exists only while some
    decision waits: nearly every request leaves none, and an empty dict per producer id is most of
    what a producer's state would cost."""
    pending: dict[str, Any] | None = state.get("pending")
    if pending is None:
        pending = state["pending"] = {}
    pending[key] = decision
    ctx.trim(pending)


def _unpend(state: State) -> None:
    """Drop ``pending`` once no decision waits in it (``_pend`` makes it again)."""
    if "pending" in state and not state["pending"]:
        del state["pending"]


def _batch_evidence(
    ex: Exchange,
    state: State,
    pid: int,
    topic: str,
    partition: int,
    batch: Any,
    epoch: int,
    base: int,
    count: int,
    error: int | None,
    offset: int,
) -> dict[str, Any]:
    """The evidence of a finding about one answered Produce batch."""
    return {
        **_stale_evidence(ex, pid, epoch, _request_txn_id(ex) or state.get("txn")),
        "topic": topic,
        "partition": partition,
        "base_sequence": base,
        "record_count": count,
        "transactional": bool(getattr(batch, "is_transactional", False)),
        "broker_error": error,
        "base_offset": offset,
    }


def _end_txn_retry(ex: Exchange, epoch: int, known: list[Any]) -> bool:
    """A retried EndTxn v5+ whose first answer bumped the epoch (KIP-890 transactions v2): the client
    did not get that answer and sent the same EndTxn again with the epoch before the bump, and the
    coordinator recognised the retry and answered it with the bumped epoch. Not a zombie."""
    resp = ex.resp
    return (
        ex.api_key == END_TXN
        and ex.api_version >= 5
        and resp is not None
        and resp.body.get("ErrorCode") == 0
        and str(known[1]) == "EndTxn"
        and epoch == int(known[0]) - 1
        and int(resp.body.get("ProducerEpoch", -1)) == int(known[0])
    )


def _request_txn_id(ex: Exchange) -> str | None:
    """The transactional id a Produce, InitProducerId or transactional RPC names (v4+ AddPartitionsToTxn
    names one per transaction: see ``txn_claims``)."""
    if ex.api_key == ADD_PARTITIONS_TO_TXN:
        ids = [txn for _, _, txn in txn_claims(ex) if txn is not None]
        return ids[0] if len(ids) == 1 else None
    return txn_id_of(ex.req.body.get("TransactionalId"))


def _known(state: State) -> list[Any]:
    """The newest known epoch with where it came from, as a pending decision keeps it."""
    client, client_id = state.get("epoch_client") or ["", ""]
    return [state.get("epoch", -1), state.get("epoch_src", ""), state.get("epoch_ts", 0), client, client_id]


def _stale_evidence(ex: Exchange, pid: int, epoch: int, txn: str | None) -> dict[str, Any]:
    return {
        **ex.evidence(),
        "rpc": f"{ex.req.api_name} v{ex.api_version}",
        "client_id": ex.req.client_id,
        "transactional_id": txn,
        "producer_id": pid,
        "producer_epoch": epoch,
    }


def _report_stale(
    known: list[Any], error: int | None, evidence: dict[str, Any], ex: Exchange, ctx: RuleContext
) -> None:
    newest, source, since = int(known[0]), str(known[1]), int(known[2])
    # Decisions pending in state saved before the source client was kept have three elements.
    src_client, src_client_id = (str(known[3]), str(known[4])) if len(known) >= 5 else ("", "")
    evidence = {
        **evidence,
        "newest_epoch": newest,
        "newest_epoch_source": source,
        "newest_epoch_ts": since,
        "newest_epoch_client": src_client,
        "newest_epoch_client_id": src_client_id,
    }
    pid, epoch, txn = evidence["producer_id"], evidence["producer_epoch"], evidence.get("transactional_id")
    subject = f"txn:{txn}" if txn else f"producer:{pid}"
    who = f"producer {pid}" + (f" (transactional id {txn!r})" if txn else "")
    sender = f"client {evidence.get('client_id')!r} at {ex.request.client}"
    known_by = f"{source} answered to {src_client_id!r} at {src_client}" if src_client else source
    if ex.api_key == PRODUCE:
        what = f"{who} wrote to {evidence['topic']}-{evidence['partition']} with epoch {epoch} ({sender})"
        landed = "the broker appended it"
    else:
        what = f"{who} sent {evidence['rpc']} with epoch {epoch} ({sender})"
        landed = "the broker accepted it"
    if error == 0:
        ctx.emit(
            "producer.stale_epoch_accepted",
            Severity.CRITICAL,
            subject,
            f"{what} after epoch {newest} was known ({known_by}), and {landed}: fencing failed",
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
        subject,
        f"zombie: {what} after epoch {newest} was known ({known_by}); {outcome}",
        ex.ts_ns,
        evidence,
        conns=(ex.conn,),
    )


def _report_gap(
    expected: int,
    error: int | None,
    evidence: dict[str, Any],
    ex: Exchange,
    ctx: RuleContext,
    tap_loss: tuple[str, int] | None = None,
) -> None:
    base = int(evidence["base_sequence"])
    missing = seq_ahead(base, expected)
    if error == OUT_OF_ORDER_SEQUENCE_NUMBER:
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
        tap_loss=tap_loss,
    )


def _check_duplicate(
    stream: dict[str, Any],
    error: int | None,
    base: int,
    count: int,
    offset: int,
    batch_facts: tuple[Any, ...],
    ex: Exchange,
    ctx: RuleContext,
) -> None:
    """Compare an answered batch with the acknowledged ones of its stream, then remember it.
    ``batch_facts``: the arguments of ``_batch_evidence``, called only when a finding fires."""
    count = max(count, 1)
    acked: list[list[int]] = stream["acked"]
    exact = overlapping = None
    for a in acked:
        if a[0] == base and a[1] == count:
            exact = overlapping = a
            break
    else:
        for a in acked:
            # ``seq_overlap`` inlined: every answered batch is compared with up to ACKED_WINDOW.
            if (base - a[0]) % SEQ_MOD < a[1] or (a[0] - base) % SEQ_MOD < count:
                overlapping = a
                break
    if overlapping is None:
        if error == 0 or error == DUPLICATE_SEQUENCE_NUMBER:
            acked.append([base, count, offset if error == 0 else -1])
            del acked[:-ACKED_WINDOW]
        if error == DUPLICATE_SEQUENCE_NUMBER:
            # The original write was not seen (before the monitor started, or on an untapped path).
            evidence = _batch_evidence(*batch_facts)
            ctx.emit(
                "producer.sequence_duplicate",
                Severity.INFO,
                f"producer:{evidence['producer_id']}",
                f"{_where(evidence)}: the broker answered DUPLICATE_SEQUENCE for base sequence {base} (a retry it deduplicated)",
                ex.ts_ns,
                evidence,
                conns=(ex.conn,),
            )
        return
    evidence = _batch_evidence(*batch_facts)
    where = _where(evidence)
    subject = f"producer:{evidence['producer_id']}"
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


def _where(evidence: dict[str, Any]) -> str:
    return (
        f"producer {evidence['producer_id']} epoch {evidence['producer_epoch']} on "
        f"{evidence['topic']}-{evidence['partition']}"
    )


RULES: list[type[Rule]] = [ProducerRule]
