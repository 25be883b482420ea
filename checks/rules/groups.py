"""Consumer groups, keyed by group id: classic protocol consistency (KIP-559, ``GroupRule``) and the
member-epoch protocols -- KIP-848 consumer, KIP-932 share and KIP-1071 streams groups
(``GroupProtocolRule``, described on the class: member-epoch fencing, mixed protocols the broker
refuses, and which protocols serve each group id for the report).

``group.protocol_type_mismatch`` (warning)
    Members of one generation must agree on the protocol type and name, and KIP-559 put both into
    JoinGroup responses (v7+) and SyncGroup requests and responses (v5+) so that a proxy can check them
    without history. Reported when, within one generation:

    - a JoinGroup v7+ answer names another type than the request, or picks a protocol the member did
      not offer;
    - successful JoinGroup answers disagree with each other on type or protocol name;
    - a SyncGroup v5+ request or answer names another type or protocol than the generation's
      JoinGroup answers (or than each other);
    - a DescribeGroups answer shows a live (not Empty/Dead) group with another type than its newest
      generation's;
    - or the broker answered INCONSISTENT_GROUP_PROTOCOL (23) to a JoinGroup or SyncGroup.

    Type and protocol may legitimately change between generations (a group that emptied and was
    reused, a range -> cooperative-sticky migration), so only a newer generation replaces them.
    Null values (the fields are ignorable) are not compared.

``group.assignment_outside_subscription`` (warning)
    A decoded consumer-protocol assignment (leader's SyncGroup request, SyncGroup answer, DescribeGroups
    member) names topics the member did not subscribe to. Subscriptions come from the member's own
    JoinGroup request (recorded under the member id its answer assigned) and from the leader's JoinGroup
    answer, which lists every member's metadata. Regex subscriptions are resolved by the client, so the
    wire subscription already lists concrete topics. Assignment bytes that the codec left raw (SyncGroup
    before v5 carries no type) are decoded here once the group is known to be ``consumer``.
    Once per member, generation and set of extra topics.

State per group: ``gen``/``ptype``/``pname``/``src`` (the newest generation's agreed type and protocol
and where they were first seen), ``subs`` (member id -> {gen, topics}), ``reported`` (signatures).
For the report (``checks.report.group_rows``), what the frames showed of the membership: ``members``
(the members in the group: member id -> newest generation), ``n_seen``/``n_left``/``n_fenced``,
``synced_gen`` (the newest generation a SyncGroup was answered for), ``describe`` (the newest
DescribeGroups answer's state and member count) and ``last_ts`` (the newest membership answer). A
member leaves by LeaveGroup, and counts as fenced when a JoinGroup or SyncGroup is answered
UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID, or when the leader's JoinGroup answer for a newer generation
leaves it out (the classic Heartbeat is not routed here: its volume).
"""

from __future__ import annotations

from typing import Any

from checks.model import Exchange, Severity
from checks.rule import Rule, RuleContext, SharedValues, State
from codec.nested import ConsumerAssignment, ConsumerSubscription
from codec.protocol import ApiKey, ErrorCode

CONSUMER = "consumer"
RULE_MISMATCH = "group.protocol_type_mismatch"
RULE_OUTSIDE = "group.assignment_outside_subscription"


#: A member's subscription as ``subs`` holds it, by (generation, *topics): shared between members.
_SUBSCRIPTIONS: SharedValues[tuple[int | str, ...], dict[str, Any]] = SharedValues()


def first_report(state: State, sig: str, ctx: RuleContext) -> bool:
    """Whether ``sig`` is reported for the first time for this group (then remember it)."""
    reported: list[str] = state.setdefault("reported", [])
    if sig in reported:
        return False
    reported.append(sig)
    ctx.trim(reported)
    return True


def subscribed_topics(value: Any) -> list[str] | None:
    """Topics of a decoded consumer subscription, None when it is not one (or did not decode)."""
    if isinstance(value, ConsumerSubscription) and value.value is not None:
        return sorted({str(t) for t in value.value.get("Topics") or []})
    return None


def assigned_topics(value: Any) -> list[str] | None:
    """Topics of a consumer assignment; raw bytes are decoded here (SyncGroup before v5 has no type)."""
    if isinstance(value, bytes | bytearray) and value:
        value = ConsumerAssignment(bytes(value))
    if isinstance(value, ConsumerAssignment) and value.value is not None:
        return sorted({str(p.get("Topic")) for p in value.value.get("AssignedPartitions") or []})
    return None


def member_entry(state: State, member: str, fresh: dict[str, Any]) -> dict[str, Any]:
    """The ``members`` entry of ``member``, taken out of the dict (put it back with ``keep_member``); a
    member not seen before gets ``fresh`` and counts in ``n_seen``."""
    members: dict[str, Any] = state.setdefault("members", {})
    entry: dict[str, Any] | None = members.pop(member, None)
    if entry is None:
        state["n_seen"] = int(state.get("n_seen", 0)) + 1
        entry = fresh
    return entry


def keep_member(state: State, member: str, entry: dict[str, Any], ctx: RuleContext) -> None:
    """Put ``entry`` back, newest last, so trimming drops the members quiet longest."""
    members: dict[str, Any] = state.setdefault("members", {})
    members[member] = entry
    ctx.trim(members)


def member_gone(state: State, entry: dict[str, Any], how: str) -> None:
    """Count a member that left (``left``) or that the coordinator fenced or removed (``fenced``); a
    member still fenced is counted once (a fenced member that then leaves counts in both)."""
    if how == "fenced" and "fenced" in entry:
        return
    counter = "n_left" if how == "left" else "n_fenced"
    state[counter] = int(state.get(counter, 0)) + 1


#: Answers by which a classic coordinator says a member is no longer in the group.
CLASSIC_REMOVED = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID})


class GroupRule(Rule):
    name = "group"
    key_kind = "group"
    api_keys = frozenset({ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.DESCRIBE_GROUPS, ApiKey.LEAVE_GROUP})

    def keys(self, ex: Exchange) -> list[str]:
        if ex.api_key == ApiKey.DESCRIBE_GROUPS:
            return [str(g) for g in dict.fromkeys(ex.req.body.get("Groups") or [])]
        group = ex.req.body.get("GroupId")
        return [str(group)] if group is not None else []

    # -- events -------------------------------------------------------------------------------------

    def on_request(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        body = ex.req.body
        if ex.api_key == ApiKey.JOIN_GROUP and body.get("MemberId"):
            # A rejoin names its member id already: its subscription is known at send time.
            self._subscribe_from_request(state, str(body["MemberId"]), ex, ctx)
        elif ex.api_key == ApiKey.SYNC_GROUP:
            gen = int(body.get("GenerationId", -1))
            if ex.api_version >= 5:
                self._agree(
                    state,
                    key,
                    gen,
                    body.get("ProtocolType"),
                    body.get("ProtocolName"),
                    "SyncGroup request",
                    ex,
                    ctx,
                )
            if state.get("ptype") == CONSUMER or body.get("ProtocolType") == CONSUMER:
                for item in body.get("Assignments") or []:
                    self._check_assignment(
                        state,
                        key,
                        str(item.get("MemberId")),
                        gen,
                        item.get("Assignment"),
                        "SyncGroup request",
                        ex,
                        ctx,
                    )

    def on_response(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        resp = ex.resp
        if resp is None:
            return
        if ex.api_key == ApiKey.JOIN_GROUP:
            self._join_answered(state, key, ex, resp.body, ctx)
        elif ex.api_key == ApiKey.SYNC_GROUP:
            self._sync_answered(state, key, ex, resp.body, ctx)
        elif ex.api_key == ApiKey.DESCRIBE_GROUPS:
            for group in resp.body.get("Groups") or []:
                if str(group.get("GroupId")) == key:
                    self._described(state, key, ex, group, ctx)
        elif ex.api_key == ApiKey.LEAVE_GROUP:
            self._left(state, ex, resp.body, ctx)

    # -- membership, for the report ---------------------------------------------------------------

    def _member_at(self, state: State, member: str, gen: int, ex: Exchange, ctx: RuleContext) -> None:
        """``member`` answered as part of generation ``gen``."""
        entry = member_entry(state, member, {"gen": gen})
        entry["gen"] = max(int(entry.get("gen", -1)), gen)
        keep_member(state, member, entry, ctx)
        state["last_ts"] = ex.ts_ns

    def _removed(self, state: State, member: str, how: str, ex: Exchange, ctx: RuleContext) -> None:
        """``member`` left or was removed: counted, and forgotten (a classic member rejoins as new)."""
        member_gone(state, member_entry(state, member, {"gen": -1}), how)
        state["last_ts"] = ex.ts_ns

    def _left(self, state: State, ex: Exchange, body: dict[str, Any], ctx: RuleContext) -> None:
        if body.get("ErrorCode") != 0:
            return
        req = ex.req.body
        if req.get("MemberId"):  # v0-v2: one member
            self._removed(state, str(req["MemberId"]), "left", ex, ctx)
        for m in body.get("Members") or []:  # v3+ (KIP-345): each member's own answer
            if m.get("MemberId") and m.get("ErrorCode", 0) == 0:
                self._removed(state, str(m["MemberId"]), "left", ex, ctx)

    # -- JoinGroup ----------------------------------------------------------------------------------

    def _join_answered(
        self, state: State, key: str, ex: Exchange, body: dict[str, Any], ctx: RuleContext
    ) -> None:
        req = ex.req.body
        error = body.get("ErrorCode")
        if error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL:
            self._mismatch(
                state,
                key,
                f"broker answered INCONSISTENT_GROUP_PROTOCOL to a JoinGroup with type {req.get('ProtocolType')!r} "
                f"and protocols {[p.get('Name') for p in req.get('Protocols') or []]}"
                + (
                    f" (the group is {state.get('ptype')!r}/{state.get('pname')!r})"
                    if "ptype" in state
                    else ""
                ),
                ex,
                ctx,
                f"join23|{ex.conn}|{ex.request.correlation_id}",
            )
            return
        if error in CLASSIC_REMOVED and req.get("MemberId"):
            self._removed(state, str(req["MemberId"]), "fenced", ex, ctx)
        if error != 0:
            return
        gen = int(body.get("GenerationId", -1))
        if body.get("MemberId"):
            self._member_at(state, str(body["MemberId"]), gen, ex, ctx)
        listed = {str(m.get("MemberId")) for m in body.get("Members") or [] if m.get("MemberId")}
        if listed:
            # The leader's answer lists the whole generation: a member of an older one that is not in it
            # and did not leave was removed by the coordinator (its session or rebalance timed out).
            for member, entry in list((state.get("members") or {}).items()):
                if member not in listed and int(entry.get("gen", -1)) < gen:
                    self._removed(state, member, "fenced", ex, ctx)
            for member in sorted(listed):
                self._member_at(state, member, gen, ex, ctx)
        offered = [str(p.get("Name")) for p in req.get("Protocols") or []]
        rtype, rname = body.get("ProtocolType"), body.get("ProtocolName")
        if rtype is not None and rtype != req.get("ProtocolType"):
            self._mismatch(
                state,
                key,
                f"JoinGroup answer (generation {gen}) names type {rtype!r}, the request {req.get('ProtocolType')!r}",
                ex,
                ctx,
                f"jointype|{gen}|{rtype}|{req.get('ProtocolType')}",
            )
        if rname is not None and offered and rname not in offered:
            self._mismatch(
                state,
                key,
                f"JoinGroup answer (generation {gen}) picks protocol {rname!r}, which the member did not offer ({offered})",
                ex,
                ctx,
                f"joinname|{gen}|{rname}",
            )
        ptype = rtype if rtype is not None else req.get("ProtocolType")
        self._agree(state, key, gen, ptype, rname, "JoinGroup answer", ex, ctx)
        member = body.get("MemberId")
        if member:
            self._subscribe_from_request(state, str(member), ex, ctx, gen=gen, chosen=rname)
        for m in body.get("Members") or []:
            topics = subscribed_topics(m.get("Metadata"))
            if topics is not None and m.get("MemberId"):
                self._subscribe(state, str(m["MemberId"]), gen, topics, ctx)

    def _subscribe_from_request(
        self, state: State, member: str, ex: Exchange, ctx: RuleContext, gen: int = -1, chosen: Any = None
    ) -> None:
        protocols = ex.req.body.get("Protocols") or []
        picked = [p for p in protocols if p.get("Name") == chosen] or protocols
        topics: set[str] = set()
        known = False
        for p in picked:
            sub = subscribed_topics(p.get("Metadata"))
            if sub is not None:
                known = True
                topics.update(sub)
        if known:
            self._subscribe(state, member, gen, sorted(topics), ctx)

    def _subscribe(self, state: State, member: str, gen: int, topics: list[str], ctx: RuleContext) -> None:
        subs: dict[str, Any] = state.setdefault("subs", {})
        old = subs.pop(member, None)
        if gen < 0 and old is not None:
            gen = int(old["gen"])
        # Members of a generation mostly subscribe alike: equal entries are one shared (never mutated) dict.
        subs[member] = _SUBSCRIPTIONS.get((gen, *topics), {"gen": gen, "topics": topics})
        ctx.trim(subs)

    # -- SyncGroup ----------------------------------------------------------------------------------

    def _sync_answered(
        self, state: State, key: str, ex: Exchange, body: dict[str, Any], ctx: RuleContext
    ) -> None:
        req = ex.req.body
        gen = int(req.get("GenerationId", -1))
        error = body.get("ErrorCode")
        if error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL:
            self._mismatch(
                state,
                key,
                f"broker answered INCONSISTENT_GROUP_PROTOCOL to a SyncGroup (generation {gen}) with type "
                f"{req.get('ProtocolType')!r} and protocol {req.get('ProtocolName')!r}",
                ex,
                ctx,
                f"sync23|{ex.conn}|{ex.request.correlation_id}",
            )
            return
        if error in CLASSIC_REMOVED and req.get("MemberId"):
            self._removed(state, str(req["MemberId"]), "fenced", ex, ctx)
        if error != 0:
            return
        if req.get("MemberId"):
            self._member_at(state, str(req["MemberId"]), gen, ex, ctx)
            state["synced_gen"] = max(int(state.get("synced_gen", -1)), gen)
        if ex.api_version >= 5:
            for field in ("ProtocolType", "ProtocolName"):
                asked, answered = req.get(field), body.get(field)
                if asked is not None and answered is not None and asked != answered:
                    self._mismatch(
                        state,
                        key,
                        f"SyncGroup answer (generation {gen}) names {field} {answered!r}, the request {asked!r}",
                        ex,
                        ctx,
                        f"sync{field}|{gen}|{asked}|{answered}",
                    )
            self._agree(
                state,
                key,
                gen,
                body.get("ProtocolType"),
                body.get("ProtocolName"),
                "SyncGroup answer",
                ex,
                ctx,
            )
        if state.get("ptype") == CONSUMER or body.get("ProtocolType") == CONSUMER:
            member = req.get("MemberId")
            if member:
                self._check_assignment(
                    state, key, str(member), gen, body.get("Assignment"), "SyncGroup answer", ex, ctx
                )

    # -- DescribeGroups -----------------------------------------------------------------------------

    def _described(
        self, state: State, key: str, ex: Exchange, group: dict[str, Any], ctx: RuleContext
    ) -> None:
        if group.get("ErrorCode") == 0:
            state["describe"] = {
                "state": group.get("GroupState"),
                "members": len(group.get("Members") or []),
                "ts": ex.ts_ns,
            }
        if group.get("ErrorCode") != 0 or group.get("GroupState") in ("Empty", "Dead", ""):
            return
        ptype = group.get("ProtocolType")
        known = state.get("ptype")
        if ptype and known is not None and ptype != known:
            self._mismatch(
                state,
                key,
                f"DescribeGroups shows type {ptype!r} ({group.get('GroupState')}), generation "
                f"{state.get('gen')}'s members use {known!r}",
                ex,
                ctx,
                f"describe|{state.get('gen')}|{ptype}",
            )
        if ptype != CONSUMER:
            return
        for m in group.get("Members") or []:
            topics = subscribed_topics(m.get("MemberMetadata"))
            member = str(m.get("MemberId"))
            if topics is not None:
                self._subscribe(state, member, -1, topics, ctx)
            self._check_assignment(
                state, key, member, -1, m.get("MemberAssignment"), "DescribeGroups answer", ex, ctx
            )

    # -- shared -------------------------------------------------------------------------------------

    def _agree(
        self,
        state: State,
        key: str,
        gen: int,
        ptype: Any,
        pname: Any,
        where: str,
        ex: Exchange,
        ctx: RuleContext,
    ) -> None:
        """Compare with the generation's type and protocol; a newer generation replaces them."""
        known_gen = int(state.get("gen", -1))
        if gen > known_gen or "gen" not in state:
            state.update(gen=gen, ptype=ptype, pname=pname, src=f"{where} {ex.request.client}")
            return
        if gen < known_gen:
            return
        for field, value in (("ptype", ptype), ("pname", pname)):
            known = state.get(field)
            if value is None:
                continue
            if known is None:
                state[field] = value
                continue
            if value != known:
                label = "type" if field == "ptype" else "protocol"
                self._mismatch(
                    state,
                    key,
                    f"{where} (generation {gen}) names {label} {value!r}, but {state.get('src')} named {known!r}",
                    ex,
                    ctx,
                    f"agree|{gen}|{field}|{value}",
                )

    def _check_assignment(
        self,
        state: State,
        key: str,
        member: str,
        gen: int,
        assignment: Any,
        where: str,
        ex: Exchange,
        ctx: RuleContext,
    ) -> None:
        assigned = assigned_topics(assignment)
        sub = (state.get("subs") or {}).get(member)
        if assigned is None or sub is None:
            return
        extra = sorted(set(assigned) - set(sub["topics"]))
        if not extra:
            return
        sig = f"outside|{member}|{gen if gen >= 0 else sub['gen']}|{','.join(extra)}"
        if not first_report(state, sig, ctx):
            return
        ctx.emit(
            RULE_OUTSIDE,
            Severity.WARNING,
            f"group:{key}",
            f"{where} assigns member {member} topics {extra} it did not subscribe to (subscribed: {sub['topics']})",
            ex.ts_ns,
            {
                **ex.evidence(),
                "group": key,
                "member": member,
                "assigned": assigned,
                "subscribed": list(sub["topics"]),
            },
            conns=(ex.conn,),
        )

    def _mismatch(
        self, state: State, key: str, summary: str, ex: Exchange, ctx: RuleContext, sig: str
    ) -> None:
        if not first_report(state, sig, ctx):
            return
        ctx.emit(
            RULE_MISMATCH,
            Severity.WARNING,
            f"group:{key}",
            f"group {key}: {summary}",
            ex.ts_ns,
            {
                **ex.evidence(),
                "group": key,
                "generation": state.get("gen"),
                "group_protocol_type": state.get("ptype"),
                "group_protocol_name": state.get("pname"),
            },
            conns=(ex.conn,),
        )


# ---------------------------------------------------------------------------------------------------
# The group protocols after the classic one: KIP-848 consumer groups, KIP-932 share groups, KIP-1071
# streams groups.

RULE_FENCED_HEARTBEAT = "group.member_epoch_fenced"
RULE_MIXED_REJECTED = "group.mixed_protocol_rejected"

CLASSIC, KIP848, SHARE, STREAMS = "classic", "consumer", "share", "streams"
#: The heartbeat of each member-epoch protocol: the request that carries (member id, member epoch).
HEARTBEATS: dict[int, str] = {
    ApiKey.CONSUMER_GROUP_HEARTBEAT: KIP848,
    ApiKey.SHARE_GROUP_HEARTBEAT: SHARE,
    ApiKey.STREAMS_GROUP_HEARTBEAT: STREAMS,
}
DESCRIBES: dict[int, str] = {
    ApiKey.CONSUMER_GROUP_DESCRIBE: KIP848,
    ApiKey.SHARE_GROUP_DESCRIBE: SHARE,
    ApiKey.STREAMS_GROUP_DESCRIBE: STREAMS,
}
#: Classic membership requests: a successful one shows the group served under the classic protocol.
#: Only the rebalance requests, not the classic Heartbeat, nor ShareFetch/ShareAcknowledge (the share
#: group's data path): their volume would route the group's whole traffic to one key, and the
#: heartbeats already tell the protocol.
MEMBERSHIP: dict[int, str] = {ApiKey.JOIN_GROUP: CLASSIC, ApiKey.SYNC_GROUP: CLASSIC}
#: Answers that fence a member epoch: the member must rejoin with epoch 0 (or leave) before anything else.
FENCING_ERRORS = frozenset({ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID})
#: Answers that refuse a member because the group id is held by a group of another type.
MIXED_ERRORS = frozenset({ErrorCode.INCONSISTENT_GROUP_PROTOCOL, ErrorCode.GROUP_ID_NOT_FOUND})
#: Member epochs a client sends on purpose: 0 joins, -1 leaves, -2 leaves a static membership.
JOIN_EPOCH = 0


def group_protocol_label(protocols: Any) -> str:
    """``consumer``, ``classic+consumer`` (a KIP-848 online migration) ...: every protocol a group was
    seen answered under, in a fixed order."""
    order = (CLASSIC, KIP848, SHARE, STREAMS)
    seen = [p for p in order if p in (protocols or {})]
    return "+".join(seen) if seen else "?"


class GroupProtocolRule(Rule):
    """Which protocols serve a group id, and its members' epochs (KIP-848, KIP-932, KIP-1071), keyed by
    group id.

    ``group.member_epoch_fenced`` (warning)
        The group analogue of a zombie producer. After the coordinator answers a member's heartbeat
        FENCED_MEMBER_EPOCH (110) or UNKNOWN_MEMBER_ID (25) -- its epoch was bumped past, or it was
        removed -- the member must rejoin with epoch 0 (or leave with -1/-2). Reported when the same
        member id sends another heartbeat with a positive epoch that the coordinator has not handed it
        since, judged at send time (a heartbeat sent before the fencing answer arrived is not one).
        Once per member and fenced epoch. Incomplete and ``info`` when the tap may have lost records
        after the fencing answer and before the heartbeat: the rejoin may be among them
        (``RuleContext.tap_loss``).

    ``group.mixed_protocol_rejected`` (warning)
        One group id, members of two protocols, and the broker said no: a ConsumerGroupHeartbeat,
        ShareGroupHeartbeat or StreamsGroupHeartbeat answered INCONSISTENT_GROUP_PROTOCOL (23) or
        GROUP_ID_NOT_FOUND (69) (the id is held by a group of another type). The broker's error code is
        the ground truth (KIP-559's rule for proxies): what it allows -- KIP-848's online migration
        between classic and consumer members -- is reported by nothing. A classic JoinGroup or
        SyncGroup answered 23 is ``group.protocol_type_mismatch``'s. Once per member, protocol and
        error.

    State per group id: ``protocols`` (protocol -> tap time of its newest successful answer),
    ``members`` (member id -> ``proto``, ``epoch`` the coordinator last assigned, ``fenced``
    [epoch, error, ts, client id, client] of the last fencing answer; a member that left is dropped),
    ``describe`` (state, group epoch, assignor, member count and time of the newest describe answer)
    and ``reported``; for the report: ``n_seen``/``n_left``/``n_fenced``, ``max_epoch`` (the highest
    member epoch answered), ``group_epoch`` (the highest described), ``assignors`` (the
    ``ServerAssignor`` names members asked for) and ``last_ts`` (the newest membership answer).
    """

    name = "group_protocol"
    key_kind = "group"
    api_keys = frozenset({*HEARTBEATS, *DESCRIBES, *MEMBERSHIP})

    def keys(self, ex: Exchange) -> list[str]:
        if ex.api_key in DESCRIBES:
            return [str(g) for g in dict.fromkeys(ex.req.body.get("GroupIds") or [])]
        group = ex.req.body.get("GroupId")
        return [str(group)] if group else []

    def on_request(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        protocol = HEARTBEATS.get(ex.api_key)
        if protocol is None:
            return
        body = ex.req.body
        assignor = body.get("ServerAssignor")
        if assignor:
            asked: list[str] = state.setdefault("assignors", [])
            if assignor not in asked:
                asked.append(str(assignor))
                ctx.trim(asked)
        member, epoch = str(body.get("MemberId") or ""), int(body.get("MemberEpoch", JOIN_EPOCH))
        known = (state.get("members") or {}).get(member)
        if not member or known is None or epoch <= JOIN_EPOCH:
            return
        fenced = known.get("fenced")
        if fenced is None:
            return  # never fenced, or it rejoined since (a successful answer clears the fence)
        sig = f"fenced|{member}|{fenced[0]}"
        if not first_report(state, sig, ctx):
            return
        error_name = (
            "FENCED_MEMBER_EPOCH" if fenced[1] == ErrorCode.FENCED_MEMBER_EPOCH else "UNKNOWN_MEMBER_ID"
        )
        ctx.emit(
            RULE_FENCED_HEARTBEAT,
            Severity.WARNING,
            f"group:{key}",
            f"{protocol} group {key}: member {member} (client {ex.req.client_id!r} at {ex.request.client}) "
            f"heartbeats with epoch {epoch} after the coordinator answered {error_name} to its epoch "
            f"{fenced[0]}; it must rejoin with epoch 0",
            ex.ts_ns,
            {
                **ex.evidence(),
                "group": key,
                "protocol": protocol,
                "member_id": member,
                "member_epoch": epoch,
                "client_id": ex.req.client_id,
                "fenced_epoch": fenced[0],
                "fenced_error": fenced[1],
                "fenced_ts": fenced[2],
                "fenced_client_id": fenced[3],
                "fenced_client": fenced[4],
            },
            conns=(ex.conn,),
            # Its rejoin may have gone through a connection whose records the tap lost.
            tap_loss=ctx.tap_loss(ex.request, int(fenced[2])),
        )

    def on_response(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        resp = ex.resp
        if resp is None:
            return
        if ex.api_key in DESCRIBES:
            self._described(state, key, ex, resp.body)
        elif ex.api_key in HEARTBEATS:
            self._heartbeat_answered(state, key, ex, resp.body, ctx)
        elif resp.body.get("ErrorCode", 0) == 0:
            self._seen(state, MEMBERSHIP[ex.api_key], ex, ctx)

    # -- summaries (checks.summaries) -------------------------------------------------------------

    def summary_applies(self, state: State, key: str, kind: str, facts: Any, ctx: RuleContext) -> bool:
        """A run of one member's steady heartbeats (``checks.summaries.HeartbeatRun``) reports nothing
        and changes only the protocol's and the group's answer times and the member's place (newest
        last) when the member is known at the run's epoch, not fenced, and nothing it would add is new."""
        entry = (state.get("members") or {}).get(facts.member)
        return (
            entry is not None
            and "fenced" not in entry
            and int(entry.get("epoch", -1)) == facts.epoch
            and HEARTBEATS[facts.api] in (state.get("protocols") or {})
            and "last_ts" in state
            and int(state.get("max_epoch", -1)) >= facts.epoch
        )

    def on_summary(self, state: State, key: str, kind: str, facts: Any, ctx: RuleContext) -> None:
        answered = facts.times[-1]
        state["protocols"][HEARTBEATS[facts.api]] = answered
        keep_member(state, facts.member, member_entry(state, facts.member, {}), ctx)
        state["last_ts"] = answered

    # -- helpers ----------------------------------------------------------------------------------

    @staticmethod
    def _seen(state: State, protocol: str, ex: Exchange, ctx: RuleContext) -> None:
        protocols: dict[str, int] = state.setdefault("protocols", {})
        protocols[protocol] = ex.response.ts_ns if ex.response is not None else ex.ts_ns

    def _described(self, state: State, key: str, ex: Exchange, body: dict[str, Any]) -> None:
        for group in body.get("Groups") or []:
            if str(group.get("GroupId")) != key or group.get("ErrorCode", 0) != 0:
                continue
            state["describe"] = {
                "state": group.get("GroupState"),
                "epoch": group.get("GroupEpoch"),
                "assignor": group.get("AssignorName"),
                "members": len(group.get("Members") or []),
                "ts": ex.ts_ns,
            }
            if group.get("GroupEpoch") is not None:
                state["group_epoch"] = max(int(state.get("group_epoch", -1)), int(group["GroupEpoch"]))
            if group.get("GroupState") not in ("Empty", "Dead", None):
                protocols: dict[str, int] = state.setdefault("protocols", {})
                protocols.setdefault(DESCRIBES[ex.api_key], ex.ts_ns)

    def _heartbeat_answered(
        self, state: State, key: str, ex: Exchange, body: dict[str, Any], ctx: RuleContext
    ) -> None:
        protocol = HEARTBEATS[ex.api_key]
        req = ex.req.body
        error = int(body.get("ErrorCode", 0))
        sent_epoch = int(req.get("MemberEpoch", JOIN_EPOCH))
        # The coordinator names the member id in its answer (it generated it before KIP-1082).
        member = str(body.get("MemberId") or req.get("MemberId") or "")
        answered = ex.response.ts_ns if ex.response is not None else ex.ts_ns
        if error == 0:
            self._seen(state, protocol, ex, ctx)
            if not member:
                return
            entry = member_entry(state, member, {"proto": protocol, "epoch": -1})
            state["last_ts"] = answered
            if sent_epoch < JOIN_EPOCH:
                member_gone(state, entry, "left")  # counted, and forgotten
                return
            entry["epoch"] = int(body.get("MemberEpoch", entry.get("epoch", -1)))
            entry.pop("fenced", None)
            state["max_epoch"] = max(int(state.get("max_epoch", -1)), entry["epoch"])
            keep_member(state, member, entry, ctx)
        elif error in FENCING_ERRORS and member and sent_epoch > JOIN_EPOCH:
            entry = member_entry(state, member, {"proto": protocol, "epoch": sent_epoch})
            member_gone(state, entry, "fenced")  # kept, marked ``fenced``: it may rejoin with epoch 0
            entry["fenced"] = [sent_epoch, error, answered, ex.req.client_id or "", ex.request.client]
            keep_member(state, member, entry, ctx)
            state["last_ts"] = answered
        elif error in MIXED_ERRORS:
            self._mixed(state, key, protocol, member, error, ex, ctx)

    def _mixed(
        self,
        state: State,
        key: str,
        protocol: str,
        member: str,
        error: int,
        ex: Exchange,
        ctx: RuleContext,
    ) -> None:
        sig = f"mixed|{member or ex.request.client}|{protocol}|{error}"
        if not first_report(state, sig, ctx):
            return
        others = sorted(p for p in state.get("protocols") or {} if p != protocol)
        error_name = (
            "INCONSISTENT_GROUP_PROTOCOL"
            if error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
            else "GROUP_ID_NOT_FOUND"
        )
        held = f" (seen serving {', '.join(others)} members)" if others else ""
        ctx.emit(
            RULE_MIXED_REJECTED,
            Severity.WARNING,
            f"group:{key}",
            f"group {key}{held}: the broker answered {error_name} to a {ex.req.api_name} from client "
            f"{ex.req.client_id!r} at {ex.request.client}: a {protocol} member cannot join a group id "
            "held by another group type",
            ex.ts_ns,
            {
                **ex.evidence(),
                "group": key,
                "protocol": protocol,
                "member_id": member,
                "client_id": ex.req.client_id,
                "broker_error": error,
                "broker_message": ex.resp.body.get("ErrorMessage") if ex.resp is not None else None,
                "group_protocols": others,
            },
            conns=(ex.conn,),
        )


RULES: list[type[Rule]] = [GroupRule, GroupProtocolRule]
