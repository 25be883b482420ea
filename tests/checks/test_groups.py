"""group.* rules (KIP-559) on frames built through the real codec."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import codec
from checks.engine import Monitor
from checks.model import Finding
from checks.report import group_rows
from checks.rule import Context
from checks.rules.groups import GroupProtocolRule, GroupRule, group_protocol_label
from checks.settings import ChecksSettings
from codec.taprecord import TapFrame
from tests.checks.builders import SECOND, Conversation, arrival_order, shared_offsets

MS = 1_000_000
JOIN, SYNC, DESCRIBE = 11, 14, 15
GROUP = "g1"


def run(frames: list[TapFrame]) -> tuple[list[Finding], Monitor]:
    monitor = Monitor([GroupRule()], Context(ChecksSettings()))
    out = monitor.feed_all(frames)
    out.extend(monitor.flush())
    return out, monitor


def subscription(*topics: str) -> bytes:
    body = {
        "Topics": list(topics),
        "UserData": None,
        "OwnedPartitions": [],
        "GenerationId": -1,
        "RackId": None,
    }
    return struct.pack(">h", 3) + codec.encode_data("ConsumerProtocolSubscription", 3, body)


def assignment(*topics: str) -> bytes:
    body = {"AssignedPartitions": [{"Topic": t, "Partitions": [0]} for t in topics], "UserData": None}
    return struct.pack(">h", 3) + codec.encode_data("ConsumerProtocolAssignment", 3, body)


def join(
    conv: Conversation,
    ts: int,
    member: str,
    gen: int,
    topics: tuple[str, ...] = ("orders",),
    ptype: str = "consumer",
    offered: tuple[str, ...] = ("range",),
    chosen: str = "range",
    resp_type: str | None = "consumer",
    error: int = 0,
    members: list[dict[str, Any]] | None = None,
    version: int = 7,
) -> list[TapFrame]:
    req = {
        "GroupId": GROUP,
        "SessionTimeoutMs": 10000,
        "RebalanceTimeoutMs": 10000,
        "MemberId": "",
        "GroupInstanceId": None,
        "ProtocolType": ptype,
        "Protocols": [{"Name": n, "Metadata": subscription(*topics)} for n in offered],
    }
    resp: dict[str, Any] = {
        "ErrorCode": error,
        "GenerationId": gen,
        "ProtocolName": chosen,
        "Leader": member,
        "MemberId": member,
        "Members": members or [],
    }
    if version >= 7:
        resp["ProtocolType"] = resp_type
    return conv.exchange(JOIN, version, req, resp, ts)


def sync(
    conv: Conversation,
    ts: int,
    member: str,
    gen: int,
    mine: tuple[str, ...],
    assignments: dict[str, tuple[str, ...]] | None = None,
    ptype: str | None = "consumer",
    pname: str | None = "range",
    resp_type: str | None = "consumer",
    resp_name: str | None = "range",
    error: int = 0,
    version: int = 5,
) -> list[TapFrame]:
    req: dict[str, Any] = {
        "GroupId": GROUP,
        "GenerationId": gen,
        "MemberId": member,
        "GroupInstanceId": None,
        "Assignments": [
            {"MemberId": m, "Assignment": assignment(*t)} for m, t in (assignments or {}).items()
        ],
    }
    resp: dict[str, Any] = {"ErrorCode": error, "Assignment": assignment(*mine)}
    if version >= 5:
        req.update(ProtocolType=ptype, ProtocolName=pname)
        resp.update(ProtocolType=resp_type, ProtocolName=resp_name)
    return conv.exchange(SYNC, version, req, resp, ts)


def describe(
    conv: Conversation, ts: int, ptype: str, state: str = "Stable", members: Any = ()
) -> list[TapFrame]:
    group = {
        "ErrorCode": 0,
        "GroupId": GROUP,
        "GroupState": state,
        "ProtocolType": ptype,
        "ProtocolData": "range",
        "Members": list(members),
    }
    return conv.exchange(DESCRIBE, 5, {"Groups": [GROUP]}, {"Groups": [group]}, ts)


def rules_of(findings: list[Finding]) -> list[str]:
    return [f.rule for f in findings]


def healthy_rebalance(a: Conversation, b: Conversation, ts: int, gen: int = 1) -> list[TapFrame]:
    members = [
        {"MemberId": "m-a", "Metadata": subscription("orders")},
        {"MemberId": "m-b", "Metadata": subscription("orders", "refunds")},
    ]
    return [
        *join(a, ts, "m-a", gen, members=members),
        *join(b, ts + 10 * MS, "m-b", gen, topics=("orders", "refunds")),
        *sync(a, ts + 100 * MS, "m-a", gen, ("orders",), {"m-a": ("orders",), "m-b": ("orders", "refunds")}),
        *sync(b, ts + 110 * MS, "m-b", gen, ("orders", "refunds")),
    ]


def two() -> tuple[Conversation, Conversation]:
    a, b = Conversation(conn="ca"), Conversation(conn="cb", client="10.0.0.6:52000")
    shared_offsets(a, b)
    return a, b


def test_healthy_group_is_silent() -> None:
    a, b = two()
    frames = healthy_rebalance(a, b, SECOND)
    frames += describe(a, 2 * SECOND, "consumer")
    findings, monitor = run(frames)
    assert findings == []
    state = monitor.states[("group", GROUP)]
    assert state["ptype"] == "consumer" and state["pname"] == "range" and state["gen"] == 1


def test_broker_inconsistent_group_protocol_answer() -> None:
    a, b = two()
    frames = healthy_rebalance(a, b, SECOND)
    frames += join(b, 3 * SECOND, "", 0, ptype="connect", error=23, resp_type=None, chosen="")
    findings, _ = run(frames)
    assert rules_of(findings) == ["group.protocol_type_mismatch"]
    assert "INCONSISTENT_GROUP_PROTOCOL" in findings[0].summary and "'connect'" in findings[0].summary
    assert findings[0].subject == f"group:{GROUP}" and findings[0].severity == "warning"


def test_join_answer_type_differs_from_request() -> None:
    a = Conversation()
    findings, _ = run(join(a, SECOND, "m-a", 1, resp_type="connect"))
    assert rules_of(findings) == ["group.protocol_type_mismatch"]
    assert "names type 'connect'" in findings[0].summary


def test_join_answer_picks_protocol_not_offered() -> None:
    a = Conversation()
    findings, _ = run(join(a, SECOND, "m-a", 1, chosen="sticky"))
    assert rules_of(findings) == ["group.protocol_type_mismatch"]
    assert "did not offer" in findings[0].summary


def test_members_of_one_generation_disagree() -> None:
    a, b = two()
    frames = [
        *join(a, SECOND, "m-a", 4, offered=("range", "sticky"), chosen="range"),
        *join(b, SECOND + 5 * MS, "m-b", 4, offered=("range", "sticky"), chosen="sticky"),
    ]
    findings, _ = run(frames)
    assert rules_of(findings) == ["group.protocol_type_mismatch"]
    assert "generation 4" in findings[0].summary and "'sticky'" in findings[0].summary


def test_protocol_may_change_between_generations() -> None:
    a = Conversation()
    frames = [
        *join(a, SECOND, "m-a", 1, offered=("range", "cooperative-sticky"), chosen="range"),
        *join(a, 2 * SECOND, "m-a", 2, offered=("range", "cooperative-sticky"), chosen="cooperative-sticky"),
        *sync(
            a,
            2 * SECOND + 50 * MS,
            "m-a",
            2,
            ("orders",),
            pname="cooperative-sticky",
            resp_name="cooperative-sticky",
        ),
    ]
    findings, _ = run(frames)
    assert findings == []


def test_sync_request_and_answer_checked() -> None:
    a = Conversation()
    frames = [
        *join(a, SECOND, "m-a", 1),
        *sync(a, 2 * SECOND, "m-a", 1, ("orders",), pname="roundrobin", resp_name="range"),
    ]
    findings, _ = run(frames)
    assert rules_of(findings) == ["group.protocol_type_mismatch", "group.protocol_type_mismatch"]
    assert "SyncGroup request" in findings[0].summary and "SyncGroup answer" in findings[1].summary

    a = Conversation()
    frames = [*join(a, SECOND, "m-a", 1), *sync(a, 2 * SECOND, "m-a", 1, ("orders",), error=23)]
    findings, _ = run(frames)
    assert rules_of(findings) == ["group.protocol_type_mismatch"]
    assert "SyncGroup" in findings[0].summary and "INCONSISTENT_GROUP_PROTOCOL" in findings[0].summary


def test_sync_before_v5_and_null_fields_are_not_compared() -> None:
    a = Conversation()
    frames = [
        *join(a, SECOND, "m-a", 1),
        *sync(a, 2 * SECOND, "m-a", 1, ("orders",), ptype=None, pname=None, resp_type=None, resp_name=None),
        *sync(a, 3 * SECOND, "m-a", 1, ("orders",), version=4),
    ]
    findings, _ = run(frames)
    assert findings == []


def test_describe_groups_shows_another_type() -> None:
    a, b = two()
    frames = [*healthy_rebalance(a, b, SECOND), *describe(a, 2 * SECOND, "connect")]
    findings, _ = run(frames)
    assert rules_of(findings) == ["group.protocol_type_mismatch"]
    assert "DescribeGroups" in findings[0].summary
    # An empty group may be reused with another type.
    frames = [*healthy_rebalance(a, b, 3 * SECOND), *describe(a, 4 * SECOND, "connect", state="Empty")]
    findings, _ = run(frames)
    assert findings == []


def test_assignment_outside_subscription_from_leader_sync() -> None:
    a, b = two()
    members = [
        {"MemberId": "m-a", "Metadata": subscription("orders")},
        {"MemberId": "m-b", "Metadata": subscription("orders")},
    ]
    frames = [
        *join(a, SECOND, "m-a", 1, members=members),
        *join(b, SECOND + 10 * MS, "m-b", 1),
        *sync(
            a, SECOND + 100 * MS, "m-a", 1, ("orders",), {"m-a": ("orders",), "m-b": ("orders", "payroll")}
        ),
        # m-b's own SyncGroup answer carries the same assignment: the same finding, not a second one.
        *sync(b, SECOND + 110 * MS, "m-b", 1, ("orders", "payroll")),
    ]
    findings, _ = run(frames)
    assert rules_of(findings) == ["group.assignment_outside_subscription"]
    f = findings[0]
    assert f.evidence["member"] == "m-b" and f.evidence["assigned"] == ["orders", "payroll"]
    assert "payroll" in f.summary and f.severity == "warning"


def test_assignment_outside_subscription_pre_v5_sync_answer() -> None:
    # SyncGroup v3 carries no protocol type: the rule decodes the assignment once the group is "consumer".
    a = Conversation()
    frames = [*join(a, SECOND, "m-a", 1), *sync(a, 2 * SECOND, "m-a", 1, ("orders", "secrets"), version=3)]
    findings, _ = run(frames)
    assert rules_of(findings) == ["group.assignment_outside_subscription"]
    assert findings[0].evidence["subscribed"] == ["orders"]


def test_assignment_outside_subscription_in_describe_groups() -> None:
    a = Conversation()
    member = {
        "MemberId": "m-x",
        "GroupInstanceId": None,
        "ClientId": "c",
        "ClientHost": "/10.0.0.5",
        "MemberMetadata": subscription("orders"),
        "MemberAssignment": assignment("orders", "audit"),
    }
    findings, _ = run(describe(a, SECOND, "consumer", members=[member]))
    assert rules_of(findings) == ["group.assignment_outside_subscription"]
    ok = {**member, "MemberAssignment": assignment("orders")}
    findings, _ = run(describe(a, 2 * SECOND, "consumer", members=[ok]))
    assert findings == []


def test_non_consumer_groups_are_not_decoded() -> None:
    a = Conversation()
    frames = [
        *join(
            a, SECOND, "m-a", 1, ptype="connect", resp_type="connect", offered=("default",), chosen="default"
        ),
        *sync(
            a,
            2 * SECOND,
            "m-a",
            1,
            (),
            ptype="connect",
            pname="default",
            resp_type="connect",
            resp_name="default",
        ),
    ]
    findings, _ = run(frames)
    assert findings == []


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_findings_independent_of_arrival_order(data: st.DataObject) -> None:
    a, b = two()
    members = [
        {"MemberId": "m-a", "Metadata": subscription("orders")},
        {"MemberId": "m-b", "Metadata": subscription("orders")},
    ]
    frames = [
        *join(a, SECOND, "m-a", 1, members=members),
        *join(b, SECOND + 10 * MS, "m-b", 1),
        *sync(a, 2 * SECOND, "m-a", 1, ("orders",), {"m-a": ("orders",), "m-b": ("payroll",)}),
        *join(b, 12 * SECOND, "", 0, ptype="connect", error=23, resp_type=None, chosen=""),
        *join(a, 20 * SECOND, "m-a", 2, offered=("range", "sticky"), chosen="range"),
        *join(b, 20 * SECOND + 5 * MS, "m-b", 2, offered=("range", "sticky"), chosen="sticky"),
        *describe(a, 30 * SECOND, "connect"),
    ]
    expected = [f.to_dict() for f in run(frames)[0]]
    assert len(expected) == 4
    watermark = int(ChecksSettings().watermark_seconds * SECOND)
    jitters = data.draw(st.lists(st.integers(0, watermark - 1), min_size=len(frames), max_size=len(frames)))
    findings, monitor = run(arrival_order(frames, jitters))
    assert [f.to_dict() for f in findings] == expected
    assert monitor.stats.late_frames == 0


# -- KIP-848 consumer, KIP-932 share and KIP-1071 streams groups -----------------------------------------

CG_HEARTBEAT, CG_DESCRIBE, SHARE_HEARTBEAT, STREAMS_HEARTBEAT = 68, 69, 76, 88
FENCED_EPOCH, UNKNOWN_MEMBER, GROUP_NOT_FOUND, INCONSISTENT = 110, 25, 69, 23


def run_all(frames: list[TapFrame]) -> tuple[list[Finding], Monitor]:
    monitor = Monitor([GroupRule(), GroupProtocolRule()], Context(ChecksSettings()))
    out = monitor.feed_all(frames)
    out.extend(monitor.flush())
    return out, monitor


def heartbeat(
    conv: Conversation,
    ts: int,
    member: str,
    epoch: int,
    answer_epoch: int | None = None,
    error: int = 0,
    api: int = CG_HEARTBEAT,
    assignor: str | None = None,
) -> list[TapFrame]:
    """A heartbeat of ``api`` sent with ``epoch``, answered ``error`` (and ``answer_epoch`` on success)."""
    req: dict[str, Any] = {"GroupId": GROUP, "MemberId": member, "MemberEpoch": epoch}
    if api == CG_HEARTBEAT:
        req.update(RebalanceTimeoutMs=30000, SubscribedTopicNames=["orders"] if epoch == 0 else None)
        req.update(ServerAssignor=assignor)
    elif api == SHARE_HEARTBEAT:
        req.update(SubscribedTopicNames=["orders"] if epoch == 0 else None)
    else:
        req.update(RebalanceTimeoutMs=30000, ProcessId="p", ActiveTasks=None)
    resp = {
        "ErrorCode": error,
        "MemberId": member if error == 0 or api == STREAMS_HEARTBEAT else None,
        "MemberEpoch": answer_epoch if answer_epoch is not None else (epoch if error == 0 else -1),
        "HeartbeatIntervalMs": 5000,
    }
    version = {CG_HEARTBEAT: 1, SHARE_HEARTBEAT: 1, STREAMS_HEARTBEAT: 0}[api]
    return conv.exchange(api, version, req, resp, ts)


def test_kip848_member_that_keeps_its_fenced_epoch_is_reported() -> None:
    a = Conversation(client_id="cg-app")
    frames = [
        *heartbeat(a, SECOND, "m-a", 0, answer_epoch=3),
        *heartbeat(a, 2 * SECOND, "m-a", 3),
        *heartbeat(a, 3 * SECOND, "m-a", 3, error=FENCED_EPOCH),
        *heartbeat(a, 4 * SECOND, "m-a", 3, error=FENCED_EPOCH),  # keeps heartbeating with it
        *heartbeat(a, 5 * SECOND, "m-a", 3, error=FENCED_EPOCH),  # once per member and fenced epoch
    ]
    findings, _ = run_all(frames)
    assert rules_of(findings) == ["group.member_epoch_fenced"]
    ev = findings[0].evidence
    assert findings[0].subject == f"group:{GROUP}" and findings[0].ts_ns == 4 * SECOND
    assert (ev["member_id"], ev["member_epoch"], ev["fenced_epoch"], ev["fenced_error"]) == ("m-a", 3, 3, 110)
    assert (ev["protocol"], ev["client_id"], ev["fenced_client_id"]) == ("consumer", "cg-app", "cg-app")


def test_fenced_member_that_rejoins_with_epoch_zero_is_silent() -> None:
    a = Conversation()
    frames = [
        *heartbeat(a, SECOND, "m-a", 0, answer_epoch=3),
        *heartbeat(a, 3 * SECOND, "m-a", 3, error=UNKNOWN_MEMBER),
        *heartbeat(a, 4 * SECOND, "m-a", 0, answer_epoch=5),
        *heartbeat(a, 5 * SECOND, "m-a", 5),
        *heartbeat(a, 6 * SECOND, "m-a", -1, answer_epoch=-1),  # leaves
    ]
    findings, monitor = run_all(frames)
    assert findings == []
    state = monitor.states[("group_protocol", GROUP)]
    assert "m-a" not in state["members"]
    # What the report counts: one member, fenced once, then left.
    assert (state["n_seen"], state["n_left"], state["n_fenced"], state["max_epoch"]) == (1, 1, 1, 5)


def test_heartbeat_sent_before_the_fencing_answer_is_not_judged() -> None:
    a = Conversation()
    fence = heartbeat(a, 3 * SECOND, "m-a", 3, error=FENCED_EPOCH)
    early = heartbeat(a, 3 * SECOND + 1, "m-a", 3)  # sent while the fencing answer was on its way
    frames = [*heartbeat(a, SECOND, "m-a", 0, answer_epoch=3), fence[0], early[0], fence[1], early[1]]
    assert run_all(frames)[0] == []


def test_share_and_streams_members_are_fenced_alike() -> None:
    for api in (SHARE_HEARTBEAT, STREAMS_HEARTBEAT):
        a = Conversation()
        frames = [
            *heartbeat(a, SECOND, "m", 0, answer_epoch=1, api=api),
            *heartbeat(a, 2 * SECOND, "m", 1, error=FENCED_EPOCH, api=api),
            *heartbeat(a, 3 * SECOND, "m", 2, api=api),  # an epoch it was never given
        ]
        findings, _ = run_all(frames)
        assert rules_of(findings) == ["group.member_epoch_fenced"], api
        assert (
            findings[0].evidence["protocol"] == {SHARE_HEARTBEAT: "share", STREAMS_HEARTBEAT: "streams"}[api]
        )


def test_online_migration_between_classic_and_consumer_members_is_legal() -> None:
    """KIP-848: a classic member and a consumer-protocol member in one group; the broker allows it."""
    classic, modern = two()
    frames = [*join(classic, SECOND, "c-1", 1), *sync(classic, SECOND + 10 * MS, "c-1", 1, ("orders",))]
    frames += heartbeat(modern, 2 * SECOND, "m-1", 0, answer_epoch=2)
    frames += heartbeat(modern, 3 * SECOND, "m-1", 2)
    findings, monitor = run_all(frames)
    assert findings == []
    (row,) = group_rows(monitor.states)
    # Both members count: the classic one the classic frames showed, the consumer one its heartbeats.
    assert (row.group, row.protocol, row.generation, row.members) == (GROUP, "classic+consumer", 2, 2)
    assert (row.members_seen, row.members_left, row.members_fenced, row.member_epoch) == (2, 0, 0, 2)
    assert (row.state, row.state_from, row.protocol_name) == ("Stable", "members", "server default")


def test_mixed_protocol_the_broker_rejects_is_reported() -> None:
    classic, modern = two()
    frames = [*join(classic, SECOND, "c-1", 1, ptype="connect", resp_type="connect")]
    frames += heartbeat(modern, 2 * SECOND, "m-1", 0, error=GROUP_NOT_FOUND)
    frames += heartbeat(modern, 3 * SECOND, "m-1", 0, error=GROUP_NOT_FOUND)  # reported once
    frames += heartbeat(
        Conversation(conn="tap1-s"), 4 * SECOND, "s-1", 0, error=INCONSISTENT, api=SHARE_HEARTBEAT
    )
    findings, _ = run_all(frames)
    assert rules_of(findings) == ["group.mixed_protocol_rejected"] * 2
    first, share = (f.evidence for f in findings)
    assert (first["protocol"], first["broker_error"], first["group_protocols"]) == (
        "consumer",
        69,
        ["classic"],
    )
    assert "GROUP_ID_NOT_FOUND" in findings[0].summary and "classic" in findings[0].summary
    assert (share["protocol"], share["broker_error"]) == ("share", 23)


def test_report_rows_for_each_protocol() -> None:
    a, b = two()
    describe = a.exchange(
        CG_DESCRIBE,
        0,
        {"GroupIds": [GROUP], "IncludeAuthorizedOperations": False},
        {
            "Groups": [
                {
                    "ErrorCode": 0,
                    "GroupId": GROUP,
                    "GroupState": "Stable",
                    "GroupEpoch": 7,
                    "AssignmentEpoch": 7,
                    "AssignorName": "uniform",
                    "Members": [],
                }
            ]
        },
        3 * SECOND,
    )
    frames = [*heartbeat(a, SECOND, "m-1", 0, answer_epoch=7), *describe]
    _, monitor = run_all(frames)
    (row,) = group_rows(monitor.states)
    # The describe answer came last: its state and member count; the member asked for no assignor.
    assert (row.protocol, row.protocol_name, row.generation, row.members, row.state, row.state_from) == (
        "consumer",
        "uniform (server default)",
        7,
        0,
        "Stable",
        "describe",
    )
    share = [*heartbeat(b, SECOND, "s-1", 0, answer_epoch=1, api=SHARE_HEARTBEAT)]
    _, monitor = run_all(share)
    assert [(r.protocol, r.generation, r.members) for r in group_rows(monitor.states)] == [("share", 1, 1)]
    _, monitor = run_all([*join(a, SECOND, "c-1", 1), *sync(a, 2 * SECOND, "c-1", 1, ("orders",))])
    assert [(r.protocol, r.protocol_type) for r in group_rows(monitor.states)] == [("classic", "consumer")]


def test_group_protocol_label_order() -> None:
    assert group_protocol_label({"consumer": 1, "classic": 2}) == "classic+consumer"
    assert group_protocol_label({}) == "?"


def test_members_subscribed_alike_share_one_entry_and_state_round_trips() -> None:
    a, b = two()
    c = Conversation(conn="cc", client="10.0.0.7:52000")
    shared_offsets(a, b, c)
    members = [{"MemberId": m, "Metadata": subscription("orders")} for m in ("m-a", "m-b")]
    members.append({"MemberId": "m-c", "Metadata": subscription("orders", "refunds")})
    frames = [
        *join(a, SECOND, "m-a", 1, members=members),
        *join(b, SECOND + 10 * MS, "m-b", 1),
        *join(c, SECOND + 20 * MS, "m-c", 1, topics=("orders", "refunds")),
    ]
    findings, monitor = run(frames)
    subs = monitor.states[("group", GROUP)]["subs"]
    assert findings == [] and subs["m-a"] == subs["m-b"] == {"gen": 1, "topics": ["orders"]}
    assert subs["m-a"] is subs["m-b"] and subs["m-c"] == {"gen": 1, "topics": ["orders", "refunds"]}
    # Shared entries are plain data: saved and restored like any state, and the rule carries on alike.
    restored = Monitor.from_state(monitor.to_state(), [GroupRule()], Context(ChecksSettings()))
    assert restored.states == monitor.states
    outside = sync(a, 2 * SECOND, "m-a", 1, ("orders",), {"m-a": ("orders",), "m-b": ("orders", "payroll")})
    for m in (monitor, restored):
        found = m.feed_all(outside) + m.flush()
        assert rules_of(found) == ["group.assignment_outside_subscription"]
        assert found[0].evidence["subscribed"] == ["orders"]


def test_a_fenced_member_whose_rejoin_the_tap_may_have_lost_is_incomplete_info() -> None:
    """The member rejoined through a worker that died before mirroring it; it heartbeats on: the tap's
    loss after the fencing answer (``TapFrame.loss_ns``) makes the finding incomplete, at ``info``."""
    a = Conversation(client_id="cg-app")
    frames = [
        *heartbeat(a, SECOND, "m-a", 0, answer_epoch=3),
        *heartbeat(a, 3 * SECOND, "m-a", 3, error=FENCED_EPOCH),
    ]
    later = heartbeat(a, 5 * SECOND, "m-a", 4)
    for frame in later:
        frame.loss_ns = 4 * SECOND
    findings, _ = run_all([*frames, *later])
    assert [(f.rule, f.severity.value, f.incomplete) for f in findings] == [
        ("group.member_epoch_fenced", "info", True)
    ]
    assert "tap may have lost records" in findings[0].summary


# -- what the report shows of a group: what the frames saw --------------------------------------------

LEAVE_GROUP = 13


def test_classic_rows_count_members_seen_left_and_removed() -> None:
    a, b = two()
    frames = healthy_rebalance(a, b, SECOND)  # generation 1: m-a (leader) and m-b
    # Generation 2 without m-b, which never left: the coordinator removed it (its session timed out).
    frames += join(a, 5 * SECOND, "m-a", 2, members=[{"MemberId": "m-a", "Metadata": subscription("orders")}])
    frames += sync(a, 5 * SECOND + 10 * MS, "m-a", 2, ("orders",), {"m-a": ("orders",)})
    _, monitor = run(frames)
    (row,) = group_rows(monitor.states)
    assert (row.protocol, row.protocol_name, row.generation, row.members, row.state, row.state_from) == (
        "classic",
        "range",
        2,
        1,
        "Stable",
        "members",
    )
    assert (row.members_seen, row.members_left, row.members_fenced) == (2, 0, 1)
    # m-a leaves (LeaveGroup v3+, KIP-345: answered per member): the group is empty at the end.
    frames += a.exchange(
        LEAVE_GROUP,
        4,
        {"GroupId": GROUP, "Members": [{"MemberId": "m-a", "GroupInstanceId": None}]},
        {"ErrorCode": 0, "Members": [{"MemberId": "m-a", "GroupInstanceId": None, "ErrorCode": 0}]},
        6 * SECOND,
    )
    _, monitor = run(frames)
    (row,) = group_rows(monitor.states)
    assert (row.members, row.state, row.members_seen, row.members_left, row.members_fenced) == (
        0,
        "Empty",
        2,
        1,
        1,
    )
    # A describe answer after the last membership answer is the state at the end.
    _, monitor = run([*frames, *describe(a, 7 * SECOND, "consumer", state="Empty")])
    (row,) = group_rows(monitor.states)
    assert (row.state, row.state_from, row.members) == ("Empty", "describe", 0)


def test_member_epoch_rows_show_epochs_and_the_assignor_asked_for() -> None:
    a = Conversation()
    frames = [
        *heartbeat(a, SECOND, "m-a", 0, answer_epoch=4, assignor="range"),
        *heartbeat(a, 2 * SECOND, "m-a", 4, answer_epoch=6),
    ]
    frames += heartbeat(Conversation(conn="tap1-b"), 3 * SECOND, "m-b", 0, answer_epoch=5)
    _, monitor = run_all(frames)
    (row,) = group_rows(monitor.states)
    assert (row.protocol, row.protocol_name, row.generation, row.member_epoch) == ("consumer", "range", 6, 6)
    # Two members, at epochs 6 and 5: not every member has caught up yet.
    assert (row.members, row.members_seen, row.state, row.state_from) == (2, 2, "Reconciling", "members")
