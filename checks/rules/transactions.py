"""Transactions (KIP-98, KIP-890): the per-transactional-id state machine, producer id ownership, and
what read-committed consumers are told.

Three rules:

``txn`` (key: transactional id) follows InitProducerId -> AddPartitionsToTxn / AddOffsetsToTxn /
TxnOffsetCommit / transactional Produce -> EndTxn, and reports

- ``txn.produce_outside_txn`` (warning): a transactional batch for a partition the ongoing transaction
  has not added. With transactions v2 (KIP-890 part 2: Produce v12+ with EndTxn v5+, the default in
  Kafka 4.x) the client never sends AddPartitionsToTxn -- the partition leader adds the partition
  implicitly, broker to broker -- so a missing explicit add is normal there. **Decision:** flag only a
  producer that uses the explicit-add protocol: its Produce is below v12 (a client may not use v12+ in
  a transaction unless transactions v2 is on), or it sent a client-side AddPartitionsToTxn (v0-v3) in
  this transaction. A partition counts as added when an AddPartitionsToTxn answer (client v0-v3, or a
  broker's v4+ batched request, VerifyOnly or not) reported no error for it. The check runs when the
  Produce is answered, so an add answered after the Produce was sent (clock skew between taps) still
  counts. Two more guards against false positives: the monitor must have seen the transaction start at
  a boundary (InitProducerId or a completed EndTxn) -- otherwise it may have missed the adds -- and a
  batch with an epoch older than the transactional id's current one is a zombie write, which
  ``producer.stale_epoch_*`` already reports. Produce v13 names topics by id, which cannot be matched
  with AddPartitionsToTxn's names; such partitions are not judged (v13 implies implicit adds anyway).
  Reported when the transaction ends (EndTxn, a new InitProducerId) or hangs, with the Produce's time
  and evidence: incomplete and ``info`` when a frame of the transaction carried a tap loss later than
  its start (``RuleContext.tap_loss``), as the add may be among the records lost. A write to a partition
  the transaction asked to add, made before that add was answered, is a warning when the answer comes
  later (the client did not wait for it) and incomplete ``info`` when it never reaches the rule by the
  transaction's end: the tap writes an answer apart from its request when it held the request past its
  age bound, a reader pairs the two only within one micro-batch or not at all (a ``lone`` answer), so
  the add may have succeeded first. A partition never asked for, or refused, stays a warning.
  ``boundary`` in the state is when it began, ``loss`` the newest tap loss seen since, ``asked`` the
  adds requested and not answered yet, ``outside`` the writes waiting.
- ``txn.hanging`` (warning): a transaction still open past its timeout in event time. It opens with the
  first successful add, offsets add, transactional offset commit or transactional Produce (at that
  request's ``ts_ns``); the deadline is the TransactionTimeoutMs of the last InitProducerId (60 s when
  none was seen). It closes with a successful EndTxn or a new InitProducerId (which aborts an ongoing
  transaction), or with an EndTxn the coordinator answers PRODUCER_FENCED / INVALID_PRODUCER_EPOCH
  (it already aborted the transaction on timeout); the alert is then resolved. While an EndTxn is in
  flight at the deadline the check waits rather than fire. Requests from an older epoch than the
  transactional id's current one (a zombie) neither open nor end the current transaction.

``txn_pid`` (key: producer id) reports ``txn.pid_hijack`` (warning): a producer id used under a second
transactional id, or by a second client (client host + client id; not the port, which changes on
reconnect). Ownership is (re)bound by a successful InitProducerId answer -- a restarted instance of a
transactional producer legitimately gets the same producer id from another host -- and a request from
another client with an *older* epoch than the owner's is a zombie, not a hijack. Only client-sent APIs
count: AddPartitionsToTxn v4+ and WriteTxnMarkers come from brokers. Incomplete and ``info`` when the tap
may have lost records since the owner was bound (``since``): the rebinding answer may be among them.

``txn_read`` (key: connection) reports ``txn.read_committed_inconsistent`` on READ_COMMITTED Fetch
answers (IsolationLevel 1): LastStableOffset above HighWatermark (warning), or AbortedTransactions
disagreeing with the control batches in the same answer (critical: a read-committed consumer would
deliver aborted records, or drop committed ones). For each producer, an ABORT marker that closes
transactional data seen in the answer needs an aborted-transaction entry starting at or before that
data; a COMMIT marker must not close a transaction listed as aborted (an entry for the producer after
its previous marker, at or before the COMMIT).
"""

from __future__ import annotations

from typing import Any

from checks.codes import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    END_TXN,
    INIT_PRODUCER_ID,
    INVALID_PRODUCER_EPOCH,
    PRODUCE,
    PRODUCER_FENCED,
    TXN_OFFSET_COMMIT,
)
from checks.model import Exchange, Severity
from checks.rule import Rule, RuleContext, State
from checks.rules.producers import (
    ADD_PARTITIONS_BATCHED,
    produce_answers,
    produce_batches,
    record_batches,
    topic_key,
    txn_claims,
    txn_id_of,
)
from codec.control import ABORT, COMMIT
from codec.protocol import ApiKey
from codec.taprecord import tap_loss_ns

#: Kafka's default transaction.timeout.ms, used when the InitProducerId was not seen.
DEFAULT_TXN_TIMEOUT_MS = 60_000
READ_COMMITTED = 1
#: First Produce version with which a transactional producer relies on implicit adds (KIP-890 part 2).
PRODUCE_TXN_V2 = 12
NS_PER_MS = 1_000_000
#: Control record types (the key's second int16).


# ---------------------------------------------------------------------------------------------------


#: The RPCs of a transactional producer's life (KIP-98): what the txn and pid-ownership rules read.
TXN_RPCS = frozenset(
    {
        ApiKey.PRODUCE,
        ApiKey.INIT_PRODUCER_ID,
        ApiKey.ADD_PARTITIONS_TO_TXN,
        ApiKey.ADD_OFFSETS_TO_TXN,
        ApiKey.END_TXN,
        ApiKey.TXN_OFFSET_COMMIT,
    }
)


class TxnRule(Rule):
    name = "txn"
    key_kind = "txn"
    api_keys = TXN_RPCS

    def keys(self, ex: Exchange) -> list[str]:
        body = ex.req.body
        if ex.api_key == ADD_PARTITIONS_TO_TXN:
            if ex.api_version <= 3:
                ids = [txn_id_of(body.get("V3AndBelowTransactionalId"))]
            else:
                ids = [txn_id_of(t.get("TransactionalId")) for t in body.get("Transactions") or []]
        else:
            ids = [txn_id_of(body.get("TransactionalId"))]
        return [i for i in dict.fromkeys(ids) if i is not None]

    def on_request(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        if ex.api_key == END_TXN and not self._zombie(state, ex):
            state["ending"] = True
        elif ex.api_key == ADD_PARTITIONS_TO_TXN:
            if ex.api_version <= 3:
                state["explicit"] = True
            # Until its answer comes, whether these partitions were added is unknown.
            asked: dict[str, list[Any]] = state.setdefault("asked", {})
            for tp in _requested_partitions(key, ex):
                asked[tp] = [ex.conn, ex.req.correlation_id]
            ctx.trim(asked)

    def on_response(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        resp = ex.resp
        if resp is None:
            return
        api, body = ex.api_key, resp.body
        # The newest tap loss known on this id's frames: writes outside the transaction are judged
        # with it when the transaction ends, as the adds they lack may be among the records lost.
        loss = max(tap_loss_ns(ex.request), tap_loss_ns(ex.response) if ex.response is not None else 0)
        if loss > int(state.get("loss", 0)):
            state["loss"] = loss
        if api == INIT_PRODUCER_ID:
            if body.get("ErrorCode") == 0:
                # A new InitProducerId aborts whatever transaction this id had open.
                self._report_outside(state, key, ex.conn, ctx)
                self._close(state, key, ex, ctx)
                state["pid"], state["epoch"] = (
                    int(body.get("ProducerId", -1)),
                    int(body.get("ProducerEpoch", -1)),
                )
                state["timeout_ms"] = int(ex.req.body.get("TransactionTimeoutMs", DEFAULT_TXN_TIMEOUT_MS))
                state["boundary"] = _answered_ns(ex)
        elif api == END_TXN:
            if self._zombie(state, ex):
                return  # an older instance's EndTxn says nothing about the current transaction
            state["ending"] = False
            error = body.get("ErrorCode")
            if error == 0:
                self._report_outside(state, key, ex.conn, ctx)
                self._close(state, key, ex, ctx)
                state["boundary"] = _answered_ns(ex)
                if ex.api_version >= 5 and int(body.get("ProducerEpoch", -1)) >= 0:
                    state["pid"], state["epoch"] = int(body["ProducerId"]), int(body["ProducerEpoch"])
            elif error in (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH):
                # The coordinator already ended this transaction (it aborted it on timeout and bumped the
                # epoch, or another instance took over): it is not open any more.
                self._report_outside(state, key, ex.conn, ctx)
                self._close(state, key, ex, ctx)
            elif state.get("open"):
                # The transaction is still open: re-arm a deadline the in-flight EndTxn deferred.
                ctx.set_timer(int(state["deadline"]))
        elif api == ADD_PARTITIONS_TO_TXN:
            asked = state.get("asked")
            if asked:
                for tp in _requested_partitions(key, ex):
                    asked.pop(tp, None)
            for suspect in state.get("outside") or []:
                # A write made before this add was answered: the client did not wait for it.
                request = suspect[2].get("add_request")
                if request is not None and [request.get("conn"), request.get("correlation_id")] == [
                    ex.conn,
                    ex.req.correlation_id,
                ]:
                    request["answered"] = True
            added = self._added_partitions(key, ex)
            if added:
                self._open(state, ex, ctx)
                partitions: dict[str, int] = state.setdefault("added", {})
                partitions.update(dict.fromkeys(added, 1))
                ctx.trim(partitions)
        elif api == ADD_OFFSETS_TO_TXN:
            if body.get("ErrorCode") == 0:
                self._open(state, ex, ctx)
        elif api == TXN_OFFSET_COMMIT:
            errors = [p.get("ErrorCode") for t in body.get("Topics") or [] for p in t.get("Partitions") or []]
            if 0 in errors:
                self._open(state, ex, ctx)
        elif api == PRODUCE:
            self._produced(state, key, ex, ctx)

    def on_timer(self, state: State, key: str, now_ns: int, ctx: RuleContext) -> None:
        if not state.get("open") or state.get("hanging"):
            return
        if state.get("ending"):
            # The client asked to end it before the deadline; look again one timeout later.
            ctx.set_timer(now_ns + int(state.get("timeout_ms", DEFAULT_TXN_TIMEOUT_MS)) * NS_PER_MS)
            return
        state["hanging"] = True
        self._report_outside(state, key, (state.get("conns") or [""])[-1], ctx)
        timeout_ms = int(state.get("timeout_ms", DEFAULT_TXN_TIMEOUT_MS))
        evidence = {
            **state.get("open_evidence", {}),
            "transactional_id": key,
            "producer_id": state.get("pid", -1),
            "producer_epoch": state.get("epoch", -1),
            "opened_ts": state.get("start_ts"),
            "timeout_ms": timeout_ms,
            "added_partitions": list(state.get("added", {}))[:20],
        }
        ctx.emit(
            "txn.hanging",
            Severity.WARNING,
            f"txn:{key}",
            f"transaction of {key!r} (producer {state.get('pid', -1)}) still open {timeout_ms} ms after it "
            "began (its transaction timeout): the coordinator will abort it, and read-committed consumers "
            "of its partitions are held back until then",
            now_ns,
            evidence,
            conns=tuple(state.get("conns", [])),
        )

    # -- helpers ----------------------------------------------------------------------------------

    @staticmethod
    def _zombie(state: State, ex: Exchange) -> bool:
        """A request from an instance whose epoch is older than the transactional id's current one."""
        return int(ex.req.body.get("ProducerEpoch", -1)) < int(state.get("epoch", -1))

    @staticmethod
    def _open(state: State, ex: Exchange, ctx: RuleContext) -> None:
        conns: list[str] = state.setdefault("conns", [])
        if ex.conn not in conns:
            conns.append(ex.conn)
            del conns[:-4]
        if state.get("open"):
            return
        timeout_ms = int(state.get("timeout_ms", DEFAULT_TXN_TIMEOUT_MS))
        state.update(
            open=True,
            start_ts=ex.ts_ns,
            deadline=ex.ts_ns + timeout_ms * NS_PER_MS,
            open_evidence=ex.evidence(),
            hanging=False,
        )
        ctx.set_timer(int(state["deadline"]))

    @staticmethod
    def _close(state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        ts = ex.response.ts_ns if ex.response is not None else ex.ts_ns
        if state.get("hanging"):
            ctx.resolve("txn.hanging", f"txn:{key}", ts)
        if state.get("open"):
            ctx.cancel_timer()
        state.update(open=False, hanging=False, explicit=False, added={}, asked={}, conns=[])
        state.pop("open_evidence", None)

    @staticmethod
    def _added_partitions(key: str, ex: Exchange) -> list[str]:
        """The "topic|partition"s this answer reports as in the transaction ``key``."""
        resp = ex.resp
        if resp is None:
            return []
        body = resp.body
        if ex.api_version <= 3:
            results = body.get("ResultsByTopicV3AndBelow") or []
        else:
            if body.get("ErrorCode", 0) != 0:
                return []
            results = [
                topic
                for txn in body.get("ResultsByTransaction") or []
                if txn.get("TransactionalId") == key
                for topic in txn.get("TopicResults") or []
            ]
        return [
            f"{topic.get('Name')}|{part.get('PartitionIndex')}"
            for topic in results
            for part in topic.get("ResultsByPartition") or []
            if part.get("PartitionErrorCode") == 0
        ]

    def _produced(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        answers = produce_answers(ex)
        current_epoch = int(state.get("epoch", -1))
        explicit = ex.api_version < PRODUCE_TXN_V2 or bool(state.get("explicit"))
        added: dict[str, int] = state.get("added", {})
        asked: dict[str, list[Any]] = state.get("asked") or {}
        outside: list[tuple[str, int, Any, int | None, list[Any] | None]] = []
        for topic, partition, _index, batch, _pid, epoch, _base, _count in produce_batches(ex):
            if not getattr(batch, "is_transactional", False):
                continue
            if epoch < current_epoch:
                continue  # a zombie's write: producer.stale_epoch_* reports it; it is not this transaction
            answer = answers.get((topic, partition))
            error = None if answer is None else int(answer.get("ErrorCode", 0))
            tp = f"{topic}|{partition}"
            # Topic ids (Produce v13) cannot be matched with the names AddPartitionsToTxn carries.
            if explicit and state.get("boundary") and tp not in added and not topic.startswith("id:"):
                outside.append((topic, partition, batch, error, asked.get(tp)))
            if error == 0:
                self._open(state, ex, ctx)
                if ex.api_version >= PRODUCE_TXN_V2:
                    # Transactions v2: the leader added the partition implicitly.
                    added[tp] = 1
                    state["added"] = added
                    ctx.trim(added)
        conns = (ex.conn, *state.get("conns", []))
        for topic, partition, batch, error, request in outside:
            outcome = (
                "the broker appended it: the partition can hold an open transaction its coordinator "
                "never commits or aborts (a hanging transaction)"
                if error == 0
                else f"the broker refused it (error {error})"
            )
            evidence = {
                **ex.evidence(),
                "transactional_id": key,
                "producer_id": int(batch.producer_id),
                "producer_epoch": int(batch.producer_epoch),
                "topic": topic,
                "partition": partition,
                "base_sequence": int(batch.base_sequence),
                "broker_error": error,
                "added_partitions": list(added)[:20],
            }
            if request is None:
                what = "which its transaction never added with AddPartitionsToTxn"
            else:
                # Whether that answer ever comes is known when the transaction ends (``_report_outside``).
                evidence["add_request"] = {
                    "conn": request[0],
                    "correlation_id": request[1],
                    "answered": False,
                }
                what = (
                    f"before the AddPartitionsToTxn that asks to add it (correlation id {request[1]} on "
                    f"connection {request[0]}) was answered"
                )
            suspects: list[list[Any]] = state.setdefault("outside", [])
            suspects.append(
                [
                    f"transactional producer {key!r} wrote to {topic}-{partition}, {what}; {outcome}",
                    ex.ts_ns,
                    evidence,
                    ctx.incomplete(conns),
                ]
            )
            ctx.trim(suspects)

    @staticmethod
    def _report_outside(state: State, key: str, conn: str, ctx: RuleContext) -> None:
        """Report the transaction's writes outside it, now that it ended (or hangs): incomplete and
        ``info`` when a frame of it since it began carried a tap loss (``loss``), as the add may be
        among the records lost, or when the add it was written ahead of was never seen answered.
        ``conn``: the connection of the frame that ended it."""
        suspects = state.pop("outside", None)
        loss = int(state.pop("loss", 0))
        if not suspects:
            return
        tap_loss = (conn, loss) if loss > int(state.get("boundary") or 0) else None
        for summary, ts_ns, evidence, incomplete in suspects:
            severity = Severity.WARNING
            request = evidence.get("add_request")
            if request is not None and not request.get("answered"):
                # The answer never reached this rule (written apart from its request, and not paired):
                # the add may have succeeded before the write.
                severity, incomplete = Severity.INFO, True
                summary += (
                    " (incomplete: the monitor never saw that answer, so the partition may have been "
                    "added before the write: not evidence against the client or the broker)"
                )
            ctx.emit(
                "txn.produce_outside_txn",
                severity,
                f"txn:{key}",
                summary,
                int(ts_ns),
                evidence,
                tap_loss=tap_loss,
                incomplete=bool(incomplete),
            )


def _requested_partitions(key: str, ex: Exchange) -> list[str]:
    """The "topic|partition"s an AddPartitionsToTxn request asks to add to the transaction ``key``."""
    body = ex.req.body
    if ex.api_version <= 3:
        topics = body.get("V3AndBelowTopics") or []
    else:
        topics = [
            topic
            for txn in body.get("Transactions") or []
            if txn.get("TransactionalId") == key
            for topic in txn.get("Topics") or []
        ]
    return [f"{topic.get('Name')}|{p}" for topic in topics for p in topic.get("Partitions") or []]


def _answered_ns(ex: Exchange) -> int:
    """When an exchange was answered (its request's time when no answer was seen)."""
    return ex.response.ts_ns if ex.response is not None else ex.ts_ns


# ---------------------------------------------------------------------------------------------------


def _client_pids(ex: Exchange) -> tuple[tuple[int, int, str | None], ...]:
    """(producer id, epoch, transactional id) that a *client* request claims (kept in ``ex.memo``)."""
    found: tuple[tuple[int, int, str | None], ...] | None = ex.memo.get("client_pids")
    if found is not None:
        return found
    if ex.api_key == PRODUCE:
        txn = txn_id_of(ex.req.body.get("TransactionalId"))
        found = tuple((b[4], b[5], txn) for b in produce_batches(ex))
    elif ex.api_key == ADD_PARTITIONS_TO_TXN and ex.api_version >= ADD_PARTITIONS_BATCHED:
        found = ()  # v4+ is sent by brokers
    else:
        found = txn_claims(ex)
    ex.memo["client_pids"] = found
    return found


class PidOwnershipRule(Rule):
    name = "txn_pid"
    key_kind = "producer"
    api_keys = TXN_RPCS

    def keys(self, ex: Exchange) -> list[str]:
        if ex.api_key == INIT_PRODUCER_ID:
            resp = ex.resp
            pids = [int(resp.body.get("ProducerId", -1))] if resp is not None else []
        else:
            pids = [pid for pid, _, _ in _client_pids(ex)]
        return [str(p) for p in dict.fromkeys(pids) if p >= 0]

    @staticmethod
    def _client(ex: Exchange) -> str:
        return f"{ex.request.client_host}|{ex.req.client_id or ''}"

    def on_request(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        pid = int(key)
        client = self._client(ex)
        claim = next(((e, t) for p, e, t in _client_pids(ex) if p == pid), None)
        if claim is None:
            return
        epoch, txn = claim
        if "client" not in state:
            # First sight without an InitProducerId (the monitor started later): the first user owns it.
            state.update(client=client, txn=txn, epoch=epoch, since=ex.ts_ns)
            return
        owner_epoch = int(state.get("epoch", -1))
        if txn is not None and state.get("txn") is None:
            state["txn"] = txn
        if txn is not None and txn != state.get("txn"):
            self._report(state, pid, f"txn={txn}", ex, ctx, epoch, txn, client)
        elif client != state["client"]:
            # An older epoch from another client is an earlier instance still writing: a zombie, which
            # producer.stale_epoch_* reports.
            if epoch >= owner_epoch:
                self._report(state, pid, f"client={client}", ex, ctx, epoch, txn, client)
        elif epoch > owner_epoch:
            state["epoch"] = epoch

    def on_response(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        resp = ex.resp
        if resp is None or resp.body.get("ErrorCode") != 0:
            return
        if ex.api_key == END_TXN and ex.api_version >= 5 and self._client(ex) == state.get("client"):
            # Transactions v2: every EndTxn bumps the owner's epoch.
            state["epoch"] = max(int(state.get("epoch", -1)), int(resp.body.get("ProducerEpoch", -1)))
            return
        if ex.api_key != INIT_PRODUCER_ID:
            return
        pid, epoch = int(key), int(resp.body.get("ProducerEpoch", -1))
        txn = txn_id_of(ex.req.body.get("TransactionalId"))
        if state.get("txn") is not None and txn is not None and txn != state["txn"]:
            # The coordinator handed one producer id to two transactional ids.
            self._report(state, pid, f"txn={txn}", ex, ctx, epoch, txn, self._client(ex))
        # The coordinator (re)binds the producer id: a restarted instance may come from another host.
        state.update(
            client=self._client(ex),
            txn=txn if txn is not None else state.get("txn"),
            epoch=epoch,
            since=_answered_ns(ex),
        )

    def summary_applies(self, state: State, key: str, kind: str, facts: Any, ctx: RuleContext) -> bool:
        """A run of ordinary Produce exchanges (``checks.summaries.ProduceRun``) from the owner itself,
        under its transactional id, reports nothing and at most raises the owner's epoch."""
        return state.get("client") == facts.client and (
            facts.txn is None or state.get("txn") in (None, facts.txn)
        )

    def on_summary(self, state: State, key: str, kind: str, facts: Any, ctx: RuleContext) -> None:
        if facts.txn is not None and state.get("txn") is None:
            state["txn"] = facts.txn
        if facts.epoch > int(state.get("epoch", -1)):
            state["epoch"] = facts.epoch

    @staticmethod
    def _report(
        state: State,
        pid: int,
        what: str,
        ex: Exchange,
        ctx: RuleContext,
        epoch: int,
        txn: str | None,
        client: str,
    ) -> None:
        flagged: dict[str, int] = state.setdefault("flagged", {})
        if what in flagged:
            return  # one finding per intruding client or transactional id
        flagged[what] = 1
        ctx.trim(flagged)
        owner_txn, owner_client = state.get("txn"), state.get("client")
        if what.startswith("txn="):
            summary = (
                f"producer id {pid} used under transactional id {txn!r}, but it belongs to {owner_txn!r}"
            )
        else:
            summary = (
                f"producer id {pid} (epoch {epoch}) used by client {client!r}, but {owner_client!r} owns it "
                f"(epoch {state.get('epoch')})"
            )
        ctx.emit(
            "txn.pid_hijack",
            Severity.WARNING,
            f"producer:{pid}",
            summary,
            ex.ts_ns,
            {
                **ex.evidence(),
                "producer_id": pid,
                "producer_epoch": epoch,
                "transactional_id": txn,
                "owner_transactional_id": owner_txn,
                "client_identity": client,
                "owner_client_identity": owner_client,
                "owner_epoch": state.get("epoch"),
            },
            conns=(ex.conn,),
            # The InitProducerId that bound the id to this client may be among records the tap lost.
            tap_loss=ctx.tap_loss(ex.request, int(state.get("since") or 0)),
        )


# ---------------------------------------------------------------------------------------------------


def control_type(batch: Any) -> int | None:
    """ABORT (0) or COMMIT (1) for a control batch, None otherwise or when it cannot be read."""
    if not getattr(batch, "is_control", False):
        return None
    try:
        records = batch.control_records()
    except Exception:  # a stripped or truncated payload: the marker type is unknown
        return None
    for record in records or []:
        kind = getattr(record, "type", record)
        if isinstance(kind, str):
            return {"ABORT": ABORT, "COMMIT": COMMIT}.get(kind.upper())
        if isinstance(kind, int):
            return kind
        value = getattr(kind, "value", None)
        if isinstance(value, int):
            return value
    return None


class ReadCommittedRule(Rule):
    name = "txn_read"
    key_kind = "conn"
    api_keys = frozenset({ApiKey.FETCH})

    def keys(self, ex: Exchange) -> list[str]:
        return [ex.conn] if ex.req.body.get("IsolationLevel") == READ_COMMITTED else []

    def on_response(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        resp = ex.resp
        if resp is None:
            return
        for topic in resp.body.get("Responses") or []:
            tkey = topic_key(topic)
            for part in topic.get("Partitions") or []:
                self._partition(tkey, part, ex, ctx)

    def _partition(self, topic: str, part: dict[str, Any], ex: Exchange, ctx: RuleContext) -> None:
        index = int(part.get("PartitionIndex", -1))
        hw, lso = int(part.get("HighWatermark", -1)), int(part.get("LastStableOffset", -1))
        if hw >= 0 and lso >= 0 and lso > hw:
            ctx.emit(
                "txn.read_committed_inconsistent",
                Severity.WARNING,
                f"partition:{topic}-{index}",
                f"{topic}-{index}: LastStableOffset {lso} is above HighWatermark {hw}",
                ex.ts_ns,
                _partition_evidence(ex, topic, index, hw, lso),
                conns=(ex.conn,),
            )
        if part.get("ErrorCode", 0) != 0:
            return
        aborted = [
            (int(a.get("ProducerId", -1)), int(a.get("FirstOffset", -1)))
            for a in part.get("AbortedTransactions") or []
        ]
        # Per producer: first offset of transactional data since its last marker, and that marker's offset.
        open_data: dict[int, int] = {}
        last_marker: dict[int, int] = {}
        for batch in record_batches(part.get("Records")):
            pid, offset = int(getattr(batch, "producer_id", -1)), int(getattr(batch, "base_offset", -1))
            if pid < 0:
                continue
            if not getattr(batch, "is_control", False):
                if getattr(batch, "is_transactional", False):
                    open_data.setdefault(pid, offset)
                continue
            kind = control_type(batch)
            if kind is None:
                continue
            data_at = open_data.pop(pid, None)
            previous = last_marker.get(pid, -1)
            last_marker[pid] = offset
            listed = [f for p, f in aborted if p == pid and previous < f <= offset]
            problem = None
            if (
                kind == ABORT
                and data_at is not None
                and not any(f <= data_at for p, f in aborted if p == pid)
            ):
                problem = (
                    f"records of producer {pid} from offset {data_at} end in an ABORT marker at {offset}, but "
                    "AbortedTransactions does not list them: a read-committed consumer would deliver aborted records"
                )
            elif kind == COMMIT and listed:
                problem = (
                    f"the transaction of producer {pid} committed at offset {offset} is listed as aborted from "
                    f"offset {listed[0]}: a read-committed consumer would drop committed records"
                )
            if problem is not None:
                ctx.emit(
                    "txn.read_committed_inconsistent",
                    Severity.CRITICAL,
                    f"partition:{topic}-{index}",
                    f"{topic}-{index}: {problem}",
                    ex.ts_ns,
                    {
                        **_partition_evidence(ex, topic, index, hw, lso),
                        "producer_id": pid,
                        "marker": "ABORT" if kind == ABORT else "COMMIT",
                        "marker_offset": offset,
                        "data_offset": data_at,
                        "aborted_transactions": [[p, f] for p, f in aborted][:20],
                    },
                    conns=(ex.conn,),
                )


def _partition_evidence(ex: Exchange, topic: str, index: int, hw: int, lso: int) -> dict[str, Any]:
    """What every finding about one partition of a Fetch answer names (built only when one fires)."""
    return {
        **ex.evidence(),
        "topic": topic,
        "partition": index,
        "high_watermark": hw,
        "last_stable_offset": lso,
    }


RULES: list[type[Rule]] = [TxnRule, PidOwnershipRule, ReadCommittedRule]
