"""Summaries of runs of ordinary exchanges (``checks.summaries``) leave every keyed shard exactly as the
routes they stand for would: the same saved state, byte for byte (rule state and its order, trimmed
windows, touch times, sweep times, held requests), and the same findings.

The traffic: one producer id (idempotent or transactional) written on pipelined connections (three
requests in flight), with
the events a summary must not swallow mixed in: gaps, retries of acknowledged batches, errors, a
fence by another client (its zombie keeps writing), a second connection of the same client writing
the same stream, idle stretches past the key's TTL, writes a second apart (a run then spans a batch's
watermark), several partitions. And two members of a KIP-848
group heartbeating, with epoch bumps, fencing (and heartbeats after it), rejoins, leaves, assignors
asked for, a share-group heartbeat under the same id and idle stretches.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import replace
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

import checks.sharding as sharding
from checks.engine import Dispatched
from checks.model import Finding
from checks.routes import Route
from checks.settings import ChecksSettings
from checks.sharding import KeyedShard, Router
from checks.summaries import release_key
from codec.taprecord import TapFrame
from tests.checks import test_groups as gr
from tests.checks import test_producers as pr
from tests.checks.builders import SECOND, Conversation, arrival_order, shared_offsets
from tests.checks.exchanges import entry_of, exchange_records, flatten, held_back, micro_batches, released

CONFIG = ChecksSettings(watermark_seconds=2.0, producer_ttl_seconds=30.0, group_ttl_seconds=30.0)
LATENESS_NS = int(CONFIG.watermark_seconds * 1e9)
MS = 1_000_000

STEPS = st.sampled_from(
    ["next"] * 8
    + ["pipeline"] * 4
    + ["gap", "retry", "error", "fence", "zombie", "twin", "overlap", "idle", "partition", "other"]
    # Runs that span the lateness: a batch's watermark can then fall inside one while another
    # connection's route inside it is due (what ``split_held`` holds back).
    + ["slow"] * 2
)


def traffic(steps: list[str], sizes: list[int], txn_id: str | None = None) -> list[TapFrame]:
    """Frames (tap order) of a producer's life as ``steps`` say; ``sizes``: record counts to draw from;
    ``txn_id``: a transactional producer's (its batches transactional)."""
    app = Conversation(conn="tap1-app", client="10.0.0.7:40000", client_id="app")
    twin = Conversation(conn="tap1-twin", client="10.0.0.7:40001", client_id="app")
    other = Conversation(conn="tap1-other", client="10.0.0.8:40000", client_id="other")
    shared_offsets(app, twin, other)
    frames = [*pr.init_pid(app, 0, epoch=0, txn_id=txn_id)]
    seqs: dict[tuple[int, int], int] = defaultdict(int)  # (epoch, partition) -> next
    acked: list[tuple[int, int, int]] = []
    epoch, t = 0, SECOND
    size = itertools.cycle(sizes or [1])

    def write(
        conv: Conversation, at: int, partition: int = 0, base: int | None = None, error: int = 0
    ) -> None:
        count = next(size)
        start = seqs[(epoch, partition)] if base is None else base
        batch = pr.batch(epoch, start, count, txn=txn_id is not None)
        request = pr.produce(conv, at, [(partition, batch)], txn_id=txn_id)
        frames.extend([request, pr.answer(conv, request, at + 2 * MS, [(partition, error, at // MS)])])
        if base is None:
            seqs[(epoch, partition)] = start + count
            acked.append((epoch, partition, start))

    for step in steps:
        t += 5 * MS
        if step == "next":
            write(app, t)
        elif step == "pipeline":
            # Several requests in flight on one connection, answered in order.
            requests = []
            for i in range(3):
                count = next(size)
                batch = pr.batch(epoch, seqs[(epoch, 0)], count, txn=txn_id is not None)
                requests.append(pr.produce(app, t + i * MS, [(0, batch)], txn_id=txn_id))
                seqs[(epoch, 0)] += count
            frames += requests
            for i, request in enumerate(requests):
                frames.append(pr.answer(app, request, t + (4 + i) * MS, [(0, 0, t // MS + i)]))
            t += 8 * MS
        elif step == "gap":
            seqs[(epoch, 0)] += 3
            write(app, t)
        elif step == "retry" and acked:
            e, partition, base = acked[-1]
            if e == epoch:
                write(app, t, partition, base=base, error=pr.DUPLICATE)
        elif step == "error":
            write(app, t, error=pr.NOT_LEADER)
        elif step == "fence":
            # Another instance takes the producer id over: the old one is a zombie from now on.
            frames.extend(pr.init_pid(other, t, epoch=epoch + 1, txn_id=txn_id))
            t += 5 * MS
            write(app, t)
            epoch += 1
        elif step == "zombie":
            # Another instance takes over and the old one keeps writing at its epoch, unaware.
            frames.extend(pr.init_pid(other, t, epoch=epoch + 1 + steps.count("zombie"), txn_id=txn_id))
        elif step == "twin":
            write(twin, t)
        elif step == "overlap":
            # Two connections' exchanges in flight at once: the twin's request comes between the
            # app's request and its answer.
            write(app, t)
            write(twin, t + MS)
            t += 3 * MS
        elif step == "idle":
            t += int(CONFIG.producer_ttl_seconds * 1e9) + SECOND
        elif step == "slow":
            t += LATENESS_NS // 2
            write(app, t)
        elif step == "partition":
            write(app, t, partition=1)
        elif step == "other":
            write(other, t)
    return sorted(frames, key=lambda f: (f.ts_ns, f.conn, f.seq))


#: How ``run`` treats a summary: applies it (``SUMMARIES``); holds it as the stage does, then feeds the
#: routes it stands for where it would have been applied (``HELD_ROUTES``); or buffers those routes
#: instead, as a job without summaries would (``ROUTES``).
SUMMARIES, HELD_ROUTES, ROUTES = "summaries", "held routes", "routes"


def run(
    records: list[list[TapFrame]],
    cuts: list[int],
    summarise: str,
    kind: str = "producer|",
    config: ChecksSettings = CONFIG,
    dispatched: dict[str, list[tuple[int, str, int]]] | None = None,
) -> tuple[list[Finding], list[bytes], dict[str, bytes]]:
    """The keys of ``kind`` fed micro-batch by micro-batch, as ``tests.checks.test_sharding``
    drives them, each summary as ``summarise`` says. Returns the findings, every key's saved state
    after each batch, and each key's state at the end; ``dispatched`` gets, per key, where each frame
    its engine dispatched to the rules sorts (release order)."""
    states: dict[str, bytes] = {}
    buffers: dict[str, list[Route]] = defaultdict(list)
    findings: list[Finding] = []
    saved: list[bytes] = []
    max_ts = 0

    def release(key: str, upto: int | None) -> None:
        # A waiting summary holds back what sorts after its start, as in the stage.
        ready, buffers[key] = released(buffers[key], upto)
        shard = KeyedShard(config, key, states.get(key))
        crossed = [entry_of(r).route(key) if r.summary is not None else r for r in ready]
        if summarise == HELD_ROUTES:
            flat = [x for r in crossed for x in (r.summary.expand() if r.summary is not None else [r])]
            crossed = sorted(flat, key=lambda r: release_key(r.frame))
        if dispatched is not None:
            shard.monitor.dispatched = []
        findings.extend(shard.feed(crossed))
        findings.extend(shard.advance(upto if upto is not None else max_ts, held_back(buffers[key])))
        if dispatched is not None:
            dispatched[key] += [release_key(_dispatched_frame(d)) for d in shard.monitor.take_dispatched()]
        states[key] = shard.export()
        saved.append(states[key])

    for per_conn in micro_batches(records, cuts):
        max_ts = max(max_ts, *(f.ts_ns for mine in per_conn.values() for f in mine))
        for mine in per_conn.values():
            for route in Router(config).route(mine):
                if not route.key.startswith(kind):
                    continue
                if route.summary is not None and summarise == ROUTES:
                    buffers[route.key].extend(route.summary.expand())
                else:
                    buffers[route.key].append(route)
        for key in sorted(buffers.keys() | states.keys()):
            release(key, max_ts - LATENESS_NS)
    for key in sorted(buffers.keys() | states.keys()):
        release(key, None)
    return findings, saved, states


def _dispatched_frame(event: Dispatched) -> TapFrame:
    """The frame that made the engine dispatch ``event``: the answer for ``on_response``, else the request."""
    response = event.exchange.response
    return response if event.hook == "on_response" and response is not None else event.exchange.request


def ids(findings: list[Finding]) -> list[tuple[str, str, str, bool]]:
    return sorted((f.id, f.rule, f.severity.value, f.incomplete) for f in findings)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(STEPS, min_size=1, max_size=40),
    st.lists(st.integers(1, 3), max_size=5),
    st.sampled_from([None, "tx"]),
    # Bounds the streams a summary starts can reach (the traffic writes up to four), and the default.
    st.sampled_from([2, 3, CONFIG.max_entries_per_key]),
    st.data(),
)
def test_summaries_leave_the_state_and_findings_of_every_route(
    steps: list[str], sizes: list[int], txn_id: str | None, bound: int, data: Any
) -> None:
    records = exchange_records(traffic(steps, sizes, txn_id))
    jitters = data.draw(st.lists(st.integers(0, LATENESS_NS // 2), max_size=len(records)))
    by_last = {id(record[-1]): record for record in records}
    arrived = [by_last[id(f)] for f in arrival_order([record[-1] for record in records], jitters)]
    cuts = data.draw(st.lists(st.integers(0, len(records)), max_size=6))
    assert_exact(arrived, cuts, replace(CONFIG, max_entries_per_key=bound))


def assert_exact(records: list[list[TapFrame]], cuts: list[int], config: ChecksSettings = CONFIG) -> None:
    """Summaries applied leave the findings and every saved state of their routes fed where they were
    held, and the findings and final states of a job without summaries (a held summary only delays
    what it holds)."""
    summarised, states, final = run(records, cuts, SUMMARIES, config=config)
    whole, whole_states, _ = run(records, cuts, HELD_ROUTES, config=config)
    assert ids(summarised) == ids(whole)
    assert states == whole_states
    unsummarised, _, unsummarised_final = run(records, cuts, ROUTES, config=config)
    assert ids(summarised) == ids(unsummarised)
    assert final == unsummarised_final


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from(["next", "slow", "slow", "zombie", "fence", "twin"]), min_size=2, max_size=12),
    st.lists(st.integers(0, 30), max_size=3),
)
@example(["next", "slow", "zombie", "slow", "slow"], [])
def test_a_run_spanning_a_takeover_is_held_with_what_falls_inside_it(
    steps: list[str], cuts: list[int]
) -> None:
    """Writes a second apart around another instance's takeover: a run then spans the takeover's
    routes, and a batch's watermark can pass those before the run's end (``split_held``)."""
    assert_exact(exchange_records(traffic(steps, [])), cuts)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(STEPS, min_size=1, max_size=40),
    st.sampled_from([SUMMARIES, ROUTES]),
    st.data(),
)
def test_a_keyed_shard_hands_its_rules_requests_and_answers_in_release_order(
    steps: list[str], summarise: str, data: Any
) -> None:
    """The router pairs an exchange and routes it whole; the keyed shard still hands its rules each
    request and each answer where it sorts among every other connection's (an answer waits for the
    requests sent before it), in any micro-batching and arrival order within the lateness."""
    records = exchange_records(traffic(steps, [1]))
    jitters = data.draw(st.lists(st.integers(0, LATENESS_NS // 2), max_size=len(records)))
    by_last = {id(record[-1]): record for record in records}
    arrived = [by_last[id(f)] for f in arrival_order([record[-1] for record in records], jitters)]
    cuts = data.draw(st.lists(st.integers(0, len(records)), max_size=6))
    order: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
    run(arrived, cuts, summarise, dispatched=order)
    for released_order in order.values():
        assert released_order == sorted(released_order)


def test_an_answer_held_by_the_shard_waits_behind_a_summary_that_starts_before_it() -> None:
    """A write answered three seconds late, with an error (no summary holds it): its request is released in the first micro-batch and
    its answer held. The next batch brings another connection's run of writes, which started before
    that answer and ends after the watermark: the summary waits, and the answer waits behind it."""
    app = Conversation(conn="tap1-app", client="10.0.0.7:40000", client_id="app")
    twin = Conversation(conn="tap1-twin", client="10.0.0.7:40001", client_id="app")
    shared_offsets(app, twin)
    frames = [*pr.init_pid(app, 0, epoch=0, txn_id=None)]
    slow = pr.produce(app, 10 * SECOND, [(0, pr.batch(0, 0))])
    frames += [slow, pr.answer(app, slow, 13 * SECOND, [(0, pr.NOT_LEADER, -1)])]
    for i in range(10):
        at = 11 * SECOND + SECOND // 2 + i * SECOND // 2
        write = pr.produce(twin, at, [(1, pr.batch(0, i))])
        frames += [write, pr.answer(twin, write, at + 2 * MS, [(1, 0, i)])]
    records = exchange_records(sorted(frames, key=lambda f: (f.ts_ns, f.conn, f.seq)))
    # The slow write's record (written at its answer, 13 s) arrives before the twin's: the first
    # batch's watermark (11 s) passes its request and not its answer.
    late = next(r for r in records if r[0].ts_ns == slow.ts_ns and r[0].conn == slow.conn)
    arrived = [r for r in records if r[0].conn == "tap1-app" and r is not late] + [late]
    arrived += [r for r in records if r[0].conn == "tap1-twin"]
    order: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
    summarised, _, _ = run(arrived, [len(arrived) - 10], SUMMARIES, dispatched=order)
    assert order["producer|4000"] == sorted(order["producer|4000"])
    whole, _, _ = run(arrived, [len(arrived) - 10], ROUTES)
    assert ids(summarised) == ids(whole)


def _in_release_order(routes: list[Route]) -> list[Route]:
    return sorted(routes, key=lambda r: r.summary.first if r.summary is not None else release_key(r.frame))


def test_a_summary_the_shard_cannot_apply_feeds_its_routes_as_the_router_sends_them_alone() -> None:
    """The router sends a summary's routes whole (``checks.routes.summary_entry`` carries them as their
    frames' bytes); a keyed shard that cannot apply the summary feeds them projected for its kind, as
    the router projects a route it sends alone: the same findings and the same state, the answer it
    still holds included."""
    frames = flatten(exchange_records(traffic(["next"] * 6 + ["pipeline"] * 2, [1, 2])))
    summarised = [r for r in Router(CONFIG).route(frames) if r.key.startswith("producer|")]
    one_by_one = Router(CONFIG)
    alone = [r for f in frames for r in one_by_one.route([f]) if r.key.startswith("producer|")]
    assert any(r.summary is not None for r in summarised)
    assert not any(r.summary is not None for r in alone)
    key = summarised[0].key
    shard, plain = KeyedShard(CONFIG, key), KeyedShard(CONFIG, key)
    assert shard.feed(_in_release_order(summarised)) == plain.feed(_in_release_order(summarised))
    assert shard.export() == plain.export()
    # Fed again, the summary no longer fits the state (its streams moved past it).
    found = shard.feed(_in_release_order(summarised))
    assert (shard.summaries_applied, shard.summaries_expanded) == (1, 1)
    assert found == plain.feed(_in_release_order(alone))
    assert shard.answers and shard.export() == plain.export()


def test_a_run_of_continuations_is_one_summary_and_is_applied() -> None:
    """The property above is not vacuous: ordinary runs become summaries, and the shard applies them."""
    records = exchange_records(traffic(["next"] * 6 + ["pipeline"] * 3 + ["next"] * 4, [1, 2]))
    routes = [r for r in Router(CONFIG).route(flatten(records)) if r.key.startswith("producer|")]
    summaries = [r.summary for r in routes if r.summary is not None]
    # The InitProducerId goes whole (one route carrying its answer); the 19 writes after it, the
    # stream's first among them, are one run.
    assert len(routes) == 1 + 1
    assert len(summaries) == 1 and len(summaries[0].expand()) == 19
    assert all(r.answer is not None for r in summaries[0].expand())
    order = sorted(routes, key=lambda r: (r.frame.ts_ns, r.frame.conn, r.frame.seq))
    shard = KeyedShard(CONFIG, routes[0].key)
    assert shard.feed(order) == []
    assert (shard.summaries_applied, shard.summaries_expanded) == (1, 0)
    whole = KeyedShard(CONFIG, routes[0].key)
    whole.feed([x for r in order for x in (r.summary.expand() if r.summary is not None else [r])])
    # Fed the routes, the shard holds the last answer until event time reaches it.
    assert len(whole.answers) == 1 and not shard.answers
    end = max(f.ts_ns for record in records for f in record)
    assert shard.advance(end) == whole.advance(end) == []
    assert shard.export() == whole.export()


def test_exchanges_of_a_connection_with_lost_records_go_whole() -> None:
    """A run's routes are incomplete where the tap lost records of their connection: they go whole,
    so the keyed shard reports its findings about that connection incomplete as it would unsummarised
    (a gap later in the traffic is one)."""
    records = exchange_records(traffic(["next"] * 6 + ["gap"] + ["next"] * 3, [1]))
    lossy = [
        [replace(f, lost=1) if f.conn == "tap1-app" and i > 2 else f for f in r]
        for i, r in enumerate(records)
    ]
    routes = [r for r in Router(CONFIG).route(flatten(lossy)) if r.key.startswith("producer|")]
    assert any(r.incomplete for r in routes)
    assert not [o for r in routes if r.summary is not None for o in r.summary.expand() if o.incomplete]
    assert_exact(lossy, [])
    assert any(r.summary is not None for r in Router(CONFIG).route(flatten(records)))


def test_a_summary_starts_the_streams_its_run_starts_within_the_bound() -> None:
    """A run whose first write starts a stream (a new partition) is applied, starting it, while the
    key's streams stay within ``max_entries_per_key``; past it the run goes as its routes, which trim."""
    records = exchange_records(traffic(["next"] * 3, [1]))
    later = exchange_records(traffic(["next"] * 3 + ["partition"] * 3, [1]))[len(records) :]
    for bound, applied in ((2, 1), (1, 0)):
        config = replace(CONFIG, max_entries_per_key=bound)
        shard = KeyedShard(config, "producer|4000")
        whole = KeyedShard(config, "producer|4000")
        for batch in (records, later):
            routes = [r for r in Router(config).route(flatten(batch)) if r.key.startswith("producer|")]
            order = sorted(routes, key=lambda r: (r.frame.ts_ns, r.frame.conn, r.frame.seq))
            assert shard.feed(order) == []
            whole.feed([x for r in order for x in (r.summary.expand() if r.summary is not None else [r])])
        assert shard.summaries_applied == 1 + applied
        # The routes' last answer is released when event time reaches it, as the run's end is.
        end = max(f.ts_ns for record in later for f in record)
        assert shard.advance(end) == whole.advance(end) == []
        assert shard.export() == whole.export()


GROUP_STEPS = st.sampled_from(
    ["beat"] * 8 + ["beat2"] * 4 + ["bump", "fence", "rejoin", "leave", "assignor", "idle", "share"]
)


def group_traffic(steps: list[str]) -> list[TapFrame]:
    """Frames (tap order) of a two-member consumer group as ``steps`` say."""
    one = Conversation(conn="tap1-m1", client="10.0.0.7:40000", client_id="m1")
    two = Conversation(conn="tap1-m2", client="10.0.0.8:40000", client_id="m2")
    shared_offsets(one, two)
    epochs = {"m1": 1, "m2": 1}
    frames = [
        *gr.heartbeat(one, 0, "m1", 0, answer_epoch=1, assignor="uniform"),
        *gr.heartbeat(two, MS, "m2", 0, answer_epoch=1),
    ]
    t = SECOND
    for step in steps:
        t += 5 * MS
        if step == "beat":
            frames += gr.heartbeat(one, t, "m1", epochs["m1"])
        elif step == "beat2":
            frames += gr.heartbeat(two, t, "m2", epochs["m2"])
        elif step == "bump":
            frames += gr.heartbeat(one, t, "m1", epochs["m1"], answer_epoch=epochs["m1"] + 1)
            epochs["m1"] += 1
        elif step == "fence":
            # The member keeps its epoch afterwards: its next heartbeats are fenced ones.
            frames += gr.heartbeat(one, t, "m1", epochs["m1"], error=gr.FENCED_EPOCH)
        elif step == "rejoin":
            frames += gr.heartbeat(one, t, "m1", 0, answer_epoch=epochs["m1"] + 1)
            epochs["m1"] += 1
        elif step == "leave":
            frames += gr.heartbeat(one, t, "m1", -1, answer_epoch=-1)
        elif step == "assignor":
            frames += gr.heartbeat(one, t, "m1", epochs["m1"], assignor="range")
        elif step == "idle":
            t += int(CONFIG.group_ttl_seconds * 1e9) + SECOND
        elif step == "share":
            frames += gr.heartbeat(two, t, "m2", epochs["m2"], api=gr.SHARE_HEARTBEAT)
    return sorted(frames, key=lambda f: (f.ts_ns, f.conn, f.seq))


@settings(max_examples=60, deadline=None)
@given(st.lists(GROUP_STEPS, min_size=1, max_size=40), st.data())
def test_heartbeat_summaries_leave_the_state_and_findings_of_every_route(steps: list[str], data: Any) -> None:
    records = exchange_records(group_traffic(steps))
    jitters = data.draw(st.lists(st.integers(0, LATENESS_NS // 2), max_size=len(records)))
    by_last = {id(record[-1]): record for record in records}
    arrived = [by_last[id(f)] for f in arrival_order([record[-1] for record in records], jitters)]
    cuts = data.draw(st.lists(st.integers(0, len(records)), max_size=6))
    summarised, states, _ = run(arrived, cuts, SUMMARIES, kind="group|")
    whole, whole_states, _ = run(arrived, cuts, HELD_ROUTES, kind="group|")
    assert ids(summarised) == ids(whole)
    assert states == whole_states


def test_steady_heartbeats_are_one_summary_and_applied() -> None:
    frames = [f for f in flatten(exchange_records(group_traffic(["beat"] * 5))) if f.conn == "tap1-m1"]
    routes = [r for r in Router(CONFIG).route(frames) if r.key.startswith("group|")]
    # The join (epoch 0) goes whole; the five steady heartbeats are one run.
    assert [len(r.summary.expand()) if r.summary is not None else 0 for r in routes] == [0, 5]
    shard, whole = KeyedShard(CONFIG, routes[0].key), KeyedShard(CONFIG, routes[0].key)
    assert shard.feed(routes) == []
    assert (shard.summaries_applied, shard.summaries_expanded) == (1, 0)
    whole.feed([x for r in routes for x in (r.summary.expand() if r.summary is not None else [r])])
    end = frames[-1].ts_ns
    assert shard.advance(end) == whole.advance(end) == []
    assert shard.export() == whole.export()


def test_a_key_kind_with_a_rule_that_does_not_accept_a_summary_gets_every_route() -> None:
    """The transaction rule declares no summary: a transactional producer's run is one summary for its
    producer id, and every route for its transactional id."""
    frames = [f for f in flatten(exchange_records(traffic(["next"] * 6, [1], "tx"))) if f.conn == "tap1-app"]
    routes = Router(CONFIG).route(frames)
    by_kind = {
        kind: [r.summary is not None for r in routes if r.key.startswith(kind)]
        for kind in ("producer|", "txn|")
    }
    assert by_kind["producer|"].count(True) == 1
    assert by_kind["txn|"] and not any(by_kind["txn|"])
    assert len(by_kind["txn|"]) == 1 + 6  # the InitProducerId and the six writes, each with its answer
    assert (
        sharding._accepted([r for r in sharding._catalogue().keyed_rules if r.key_kind == "txn"])
        == frozenset()
    )


def test_a_due_summary_whose_run_reaches_past_a_waiting_ones_start_waits_with_it() -> None:
    """Three pipelined writes, the first alone in the first micro-batch (a run of its own), the other
    two and the writes a second later in the next: when the watermark passes the first run, the second
    still waits, and it started before the first ended (its requests were sent before the first one's
    answer). Released alone, the first would be applied before those requests: with two requests kept
    per connection, the third would not have trimmed the first, and its answer would count as acked."""
    records = exchange_records(traffic(["pipeline", "slow", "slow"], []))
    assert_exact(records, [2], replace(CONFIG, max_entries_per_key=2))
