"""checks/projections.py: the declarations name real keyed rules and fields, and a routed frame keeps
exactly the declared fields (the recording fixture in conftest.py proves the rules read no others)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import codec
from checks.projections import (
    CONNECTION_BODIES,
    ENGINE_READS,
    READS,
    covers,
    kind_tree,
    project_for_connection,
    project_frame,
    prune,
    tree_of,
)
from checks.rules import all_rules
from checks.sharding import is_connection_scoped
from codec.api import kept_whole, request_spec, response_spec
from codec.protocol import ApiKey
from codec.taprecord import TapFrame
from tests.checks.recording import field_names
from tests.codec.strategies import build_frame, decode_frame, messages, seeds
from tests.codec.test_facts import facts_view


def test_every_keyed_rule_declares_and_only_keyed_rules_do() -> None:
    keyed = {r.name: r for r in all_rules() if not is_connection_scoped(r)}
    assert set(READS) == set(keyed)
    for name, apis in READS.items():
        accepted = keyed[name].api_keys
        assert accepted is None or set(apis) <= set(accepted), name


def test_declared_paths_name_fields_of_the_message() -> None:
    for apis in (*READS.values(), ENGINE_READS):
        for api_key, (request, response) in apis.items():
            for spec, paths in ((request_spec(api_key), request), (response_spec(api_key), response)):
                known = field_names(spec)
                for path in paths:
                    assert set(path.split(".")) <= known, f"{ApiKey(api_key).name}: {path}"


def test_trees_keep_a_field_whole_when_a_path_ends_at_it() -> None:
    tree = tree_of(["A.B", "A", "C.D.E", "C.F"])
    assert tree == {"A": None, "C": {"D": {"E": None}, "F": None}}
    assert covers(tree, "A.B.X") and covers(tree, "C") and covers(tree, "C.D")
    assert not covers(tree, "C.G") and not covers(tree, "Z")


def test_prune_keeps_only_the_tree_through_lists() -> None:
    body = {
        "TransactionalId": "t",
        "Acks": -1,
        "TimeoutMs": 5,
        "TopicData": [{"Name": "x", "PartitionData": [{"Index": 1, "Records": None, "Other": 2}]}],
    }
    tree = tree_of(["Acks", "TopicData.Name", "TopicData.PartitionData.Index"])
    assert prune(body, tree) == {"Acks": -1, "TopicData": [{"Name": "x", "PartitionData": [{"Index": 1}]}]}


def test_a_routed_produce_keeps_what_producer_rules_read_and_its_header() -> None:
    from codec.records import build_record_batch

    batch = build_record_batch([(b"k", b"v" * 100)], producer_id=3, producer_epoch=1, base_sequence=0)
    raw = codec.encode_request(
        ApiKey.PRODUCE,
        9,
        7,
        "client",
        {
            "TransactionalId": None,
            "Acks": -1,
            "TimeoutMs": 30000,
            "TopicData": [{"Name": "t", "PartitionData": [{"Index": 0, "Records": batch}]}],
        },
    )
    message = codec.decode_request(raw)
    frame = TapFrame("c-1", 0, 1, "req", ApiKey.PRODUCE, 9, 7, message=message)
    routed = project_frame(frame, ("producer", "txn_pid"))
    assert routed.message is not None and routed.message.header == message.header
    assert set(routed.message.body) == {"TransactionalId", "Acks", "TopicData"}
    assert routed.message.body["TopicData"][0]["PartitionData"][0]["Records"] is not None
    assert frame.message is message and "TimeoutMs" in message.body  # the original is untouched
    assert kind_tree(("producer",), ApiKey.FETCH, False) == {}


#: The rules of each key kind (``checks.sharding``'s catalogue), and none: what the engine alone reads.
KIND_RULES = [(), ("apiversions.cluster",), ("group", "group_protocol"), ("producer", "txn_pid"), ("txn",)]


def test_the_kinds_tested_are_the_catalogues() -> None:
    from checks.sharding import _catalogue

    assert {tuple(rules) for rules in _catalogue().kind_rules.values()} | {()} == set(KIND_RULES)


@settings(max_examples=400, deadline=None)
@given(message=messages, seed=seeds, unknown_tags=st.booleans(), rules=st.sampled_from(KIND_RULES))
def test_a_projected_body_is_the_tree_pruned_body_and_shares_what_it_keeps_whole(
    message: tuple[str, int, int], seed: int, unknown_tags: bool, rules: tuple[str, ...]
) -> None:
    """Any frame of any API and version, for the rules of every key kind: the projection is exactly
    the declared fields (what ``prune`` keeps of the tree), and a field holding a struct the tree keeps
    every field of is the frame's own value, not a copy (a body kept whole: the frame itself). A body
    with tagged-field evidence (or none known yet: a response waiting for its request to expand) or
    bytes left over is pruned by the tree alone."""
    kind, api_key, version = message
    decoded = decode_frame(kind, build_frame(kind, api_key, version, seed, unknown_tags), api_key, version)
    direction = "req" if kind == "request" else "resp"
    frame = TapFrame("c-1", 0, 1, direction, api_key, version, decoded.correlation_id, message=decoded)
    projected = project_frame(frame, rules)
    assert projected.message is not None
    tree = kind_tree(rules, api_key, kind == "response")
    assert facts_view(projected.message.body) == facts_view(prune(decoded.body, tree))
    assert projected.message.header is decoded.header
    assert frame.message is decoded  # the frame routed is untouched
    if decoded.tag_extras is not False or "_trailing" in decoded.body:
        assert projected is not frame
        return
    normal = kept_whole(api_key, decoded.api_version, kind == "response", tree)
    if normal is None:
        assert projected is frame
        return
    for name, below in normal.items():
        value = decoded.body.get(name)
        if below is None and isinstance(value, dict | list):
            assert projected.message.body[name] is value, name


@settings(max_examples=200, deadline=None)
@given(message=messages, seed=seeds)
def test_a_connection_projection_keeps_what_the_engine_reads_or_the_whole_frame(
    message: tuple[str, int, int], seed: int
) -> None:
    kind, api_key, version = message
    decoded = decode_frame(kind, build_frame(kind, api_key, version, seed), api_key, version)
    direction = "req" if kind == "request" else "resp"
    frame = TapFrame("c-1", 0, 1, direction, api_key, version, decoded.correlation_id, message=decoded)
    projected = project_for_connection(frame)
    assert projected.message is not None
    if api_key in CONNECTION_BODIES or decoded.tag_extras is not False or "_trailing" in decoded.body:
        assert projected is frame
        return
    expected = prune(decoded.body, kind_tree((), api_key, kind == "response"))
    assert facts_view(projected.message.body) == facts_view(expected)
