"""checks/projections.py: the declarations name real keyed rules and fields, and a routed frame keeps
exactly the declared fields (the recording fixture in conftest.py proves the rules read no others)."""

from __future__ import annotations

import codec
from checks.projections import ENGINE_READS, READS, covers, kind_tree, project_frame, prune, tree_of
from checks.rules import all_rules
from checks.sharding import is_connection_scoped
from codec.api import request_spec, response_spec
from codec.protocol import ApiKey
from codec.taprecord import TapFrame
from tests.checks.recording import field_names


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
