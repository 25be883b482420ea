"""Each rule declares its transitions, and the summaries the stages send instead of frames are exact.

A connection's key gets its row (``checks.sharding.connection_row``): the frames some connection-scoped
rule names whole, and every other exchange by its headers (``HeaderExchange``). A shard fed the rows
must end every micro-batch in the same state, byte for byte (rule state and its trim order, last-seen
times and so the TTL sweep, pending requests, timers, counters), and report the same findings as a
shard fed every frame.
"""

from __future__ import annotations

import itertools
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checks.model import Exchange
from checks.projections import CONNECTION_BODIES, TRANSITIONS, project_for_connection
from checks.rule import Rule
from checks.rules import all_rules
from checks.settings import ChecksSettings
from checks.sharding import (
    ConnectionShard,
    Route,
    Router,
    UndeclaredTransitions,
    check_transitions,
    connection_row,
    projected_originals,
)
from codec.protocol import ApiKey
from codec.taprecord import TapFrame, pack_frame, unpack_frame
from tests.checks import test_apiversions as av
from tests.checks import test_flexible as fl
from tests.checks import test_groups as gr
from tests.checks.builders import SECOND, Conversation
from tests.checks.exchanges import exchange_records, flatten
from tests.checks.test_sharding import CONFIG, with_headers_only
from tests.checks.test_sharding import tap_loss as tap_loss_frames


def test_every_rule_declares_its_transitions() -> None:
    rules = all_rules()
    check_transitions(rules)
    assert {r.name for r in rules} == set(TRANSITIONS)
    # What the connection shard's rules need whole reaches them whole.
    for rule in rules:
        declared = TRANSITIONS[rule.name]
        if rule.key_kind == "conn" and not declared.in_router:
            assert declared.apis <= CONNECTION_BODIES, rule.name


class _Forgetful(Rule):
    name = "forgetful"
    key_kind = "group"
    api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.HEARTBEAT})

    def keys(self, ex: Exchange) -> list[str]:
        return ["g"]


class _Partial(_Forgetful):
    name = "group"  # declares JoinGroup and the rest, not Heartbeat


def test_a_rule_that_does_not_declare_its_transitions_is_refused() -> None:
    with pytest.raises(UndeclaredTransitions, match="forgetful"):
        check_transitions([*all_rules(), _Forgetful()])
    with pytest.raises(UndeclaredTransitions, match="does not declare"):
        check_transitions([_Partial()])


ADVERTISED = [av.STANDARD, {"ApiVersions": (0, 4), "Metadata": (0, 5), "Produce": (0, 12)}]
PRODUCE_V2 = av.PRODUCE_V2


def _event(conv: Conversation, kind: str, arg: int, ts: int) -> list[TapFrame]:
    if kind == "open":
        return [conv.open(ts)]
    if kind == "handshake":
        return av.handshake(conv, ts, ADVERTISED[arg % len(ADVERTISED)])
    if kind == "metadata":
        return av.metadata(conv, arg % 13, ts)
    if kind == "unanswered":
        return [conv.request(av.METADATA, arg % 13, {"Topics": [], "AllowAutoTopicCreation": False}, ts)]
    if kind == "fetch":
        request = {"ReplicaId": -1, "MaxWaitMs": 1, "MinBytes": 1, "IsolationLevel": arg % 2, "Topics": []}
        return conv.exchange(ApiKey.FETCH, 12, request, {"Responses": []}, ts)
    if kind == "removed":
        return conv.exchange(av.PRODUCE, 2, PRODUCE_V2, {"Responses": []}, ts)
    if kind == "tags":
        raw = fl.metadata_raw(12, corr=1000 + arg)
        tags = bytes([2, 7, 1, ord("a"), 3, 1, ord("b")])
        return [conv.garbage("req", raw[: fl.HEADER_END] + tags + raw[fl.HEADER_END + 1 :], ts)]
    if kind == "undecodable":
        return [conv.undecodable_request(av.METADATA, 99, b"\x00\x00\x00\x00", ts)]
    if kind == "lose":
        conv.lose(1 + arg % 2)
        return []
    assert kind == "close"
    return [conv.close(ts)]


KINDS: tuple[str, ...] = ("open", "handshake", "metadata", "metadata", "metadata", "unanswered", "removed")
KINDS += ("tags", "undecodable", "lose", "close", "fetch")
EVENTS = st.lists(
    st.tuples(
        st.integers(0, 1),
        st.sampled_from(KINDS),
        st.integers(0, 40),
        st.sampled_from([1, 100_000_000, SECOND, 4 * SECOND, 40 * SECOND]),
    ),
    min_size=1,
    max_size=40,
)


def _traffic(events: list[tuple[int, str, int, int]]) -> list[TapFrame]:
    convs = [Conversation(conn=f"tap1-t{i}", client_id=fl.CLIENT_ID) for i in range(2)]
    frames: list[TapFrame] = []
    ts = SECOND
    for which, kind, arg, step in events:
        ts += step
        frames += _event(convs[which], kind, arg, ts)
    return frames


def _across(frame: TapFrame) -> TapFrame:
    """A frame as the stage gets it: projected for its connection, packed and read back."""
    return unpack_frame(pack_frame(project_for_connection(frame)))


@given(
    events=EVENTS,
    cuts=st.lists(st.integers(0, 80), max_size=6),
    ttl=st.sampled_from([3.0, 30.0, 3600.0]),
    entries=st.sampled_from([1, 2, 10_000]),
)
@settings(max_examples=150, deadline=None)
def test_a_connection_row_ends_in_the_state_every_frame_does(
    events: list[tuple[int, str, int, int]], cuts: list[int], ttl: float, entries: int
) -> None:
    config = ChecksSettings(connection_ttl_seconds=ttl, max_entries_per_key=entries)
    records = exchange_records(_traffic(events))
    every: dict[str, bytes] = {}
    rows: dict[str, bytes] = {}
    bounds = [0, *sorted({c for c in cuts if c < len(records)}), len(records)]
    for lo, hi in itertools.pairwise(bounds):
        per_conn: dict[str, list[TapFrame]] = {}
        for frame in flatten(records[lo:hi]):
            per_conn.setdefault(frame.conn, []).append(frame)
        for conn, mine in per_conn.items():
            mine.sort(key=lambda f: f.seq)
            reference = ConnectionShard(config, every.get(conn))
            expected = reference.feed(_across(f) for f in mine)
            shard = ConnectionShard(config, rows.get(conn))
            row = connection_row(mine)
            row.frames = [unpack_frame(pack_frame(f)) for f in row.frames]
            found = shard.feed_row(row)
            assert [f.to_dict() for f in found] == [f.to_dict() for f in expected]
            assert shard.ctx.stats == reference.ctx.stats
            every[conn], rows[conn] = reference.export(), shard.export()
            assert rows[conn] == every[conn]


def test_most_exchanges_travel_by_their_headers() -> None:
    """A connection's ordinary traffic after its handshake: only the handshake goes whole."""
    conv = Conversation(conn="tap1-plain")
    frames = [conv.open(0), *av.handshake(conv, SECOND)]
    for i in range(20):
        frames += av.metadata(conv, 12, 2 * SECOND + i)
    mine = flatten(exchange_records(frames))
    row = connection_row(mine)
    assert [f.direction for f in row.frames] == ["open", "req", "resp"]
    assert len(row.exchanges) == 20
    assert list(row.feed_order()) != [] and len(list(row.feed_order())) == len(mine)


def test_a_consumer_groups_exchanges_travel_by_their_headers() -> None:
    """JoinGroup and SyncGroup carry consumer-protocol payloads the decode unwraps and counts: with no
    tagged-field evidence in them, they go by their headers like any other exchange, and the
    connection's key does not pair them again."""
    conv = Conversation(conn="tap1-group")
    frames = [conv.open(0), *av.handshake(conv, SECOND)]
    frames += gr.join(
        conv, 2 * SECOND, "m-1", 1, members=[{"MemberId": "m-1", "Metadata": gr.subscription("orders")}]
    )
    frames += gr.sync(conv, 3 * SECOND, "m-1", 1, ("orders",), {"m-1": ("orders",)})
    mine = flatten(exchange_records(frames))
    row = connection_row(mine)
    assert [f.direction for f in row.frames] == ["open", "req", "resp"]
    assert [ex.api_key for ex in row.exchanges] == [ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP]


def _routes(routes: list[Route]) -> list[tuple[object, ...]]:
    """The routes of each key in order, each summary as the routes it stands for, as its keyed shard
    is fed them (fed one frame at a time, the router finds no run; a summary sits where its first
    route was)."""
    flat = [x for r in routes for x in (projected_originals(r.summary, r.key) if r.summary else [r])]
    by_key = sorted(flat, key=lambda r: r.key)
    return [(r.key, pack_frame(r.frame), r.at_ns, r.incomplete, r.request_only) for r in by_key]


@given(data=st.data(), events=EVENTS)
@settings(max_examples=40, deadline=None)
def test_the_router_reads_the_taps_pairs_as_the_engine_pairs_them(
    data: st.DataObject, events: list[tuple[int, str, int, int]]
) -> None:
    """The router routes an exchange the tap wrote as one entry as the engine, pairing the two frames
    it is fed one at a time, routes it: same routes, same projected facts, same order."""
    frames = sorted(
        with_headers_only() + _traffic(events) + tap_loss_frames(), key=lambda f: (f.ts_ns, f.conn, f.seq)
    )
    records = exchange_records(frames)
    cut = data.draw(st.integers(0, len(records)))
    for part in (records[:cut], records[cut:]):
        per_conn: dict[str, list[TapFrame]] = {}
        for frame in flatten(part):
            per_conn.setdefault(frame.conn, []).append(frame)
        for mine in per_conn.values():
            mine.sort(key=lambda f: f.seq)
            paired = Router(CONFIG).route(mine)
            one_by_one = Router(CONFIG)
            alone = [r for f in mine for r in one_by_one.route([f])]
            assert _routes(paired) == _routes(alone)
