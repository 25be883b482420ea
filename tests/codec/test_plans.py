"""Decode plans: what a decode call resolves once and reuses, and the generated source it runs.

These tests check which plan and decoder a call picks, never how long it takes.
"""

from __future__ import annotations

import ast
import linecache
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import codec
from codec import api, bodies
from codec.api import projection, request_plan, request_spec, response_plan, response_spec
from codec.compiler import normalize_projection

PRODUCE, METADATA, API_VERSIONS, END_TXN = 0, 3, 18, 26

ROOT = Path(__file__).resolve().parents[2]


def _top_level(spec_fields: Any, version: int) -> set[str]:
    return {f.name for f in spec_fields if f.present(version)}


def _produce_v9_frame() -> bytes:
    body = {
        "TransactionalId": "txn-1",
        "Acks": -1,
        "TimeoutMs": 30000,
        "TopicData": [{"Name": "orders", "PartitionData": [{"Index": 0, "Records": None}]}],
    }
    return codec.encode_request(PRODUCE, 9, 7, "client", body)


def test_projection_keeping_every_top_level_field_reuses_the_full_plan() -> None:
    seg = request_spec(PRODUCE).segment(9)
    assert seg is not None
    everything = frozenset(_top_level(seg.fields, 9))
    full = request_plan(PRODUCE, 9)
    assert request_plan(PRODUCE, 9, everything) is full
    assert request_plan(PRODUCE, 9, everything).body.decoder is full.body.decoder
    assert full.body.projection is None


def test_projection_naming_every_nested_field_also_reuses_the_full_plan() -> None:
    # Every field of TopicData's elements, spelled out down to PartitionData, is still everything.
    fields = {"TransactionalId", "Acks", "TimeoutMs", "TopicData.Name", "TopicData.PartitionData"}
    assert request_plan(PRODUCE, 9, fields) is request_plan(PRODUCE, 9)
    # A path below a records field selects the whole field.
    deeper = fields - {"TopicData.PartitionData"} | {
        "TopicData.PartitionData.Index",
        "TopicData.PartitionData.Records.BaseOffset",
    }
    assert request_plan(PRODUCE, 9, deeper) is request_plan(PRODUCE, 9)


def test_projection_that_drops_a_field_gets_its_own_decoder() -> None:
    fields = frozenset({"TransactionalId", "TopicData.PartitionData.Records"})
    plan = request_plan(PRODUCE, 9, fields)
    full = request_plan(PRODUCE, 9)
    assert plan.body.decoder is not full.body.decoder
    assert plan.body.projection == {
        "TransactionalId": None,
        "TopicData": {"PartitionData": {"Records": None}},
    }
    # Header version and decoder are resolved once, the same for every projection.
    assert (plan.header_version, plan.header) == (full.header_version, full.header)


def test_every_form_of_fields_maps_to_one_resolved_projection() -> None:
    paths = ["TransactionalId", "Acks"]
    resolved = projection(frozenset(paths))
    for form in (set(paths), tuple(paths), list(paths), frozenset(paths), resolved):
        assert projection(form) is resolved
    assert projection(None) is projection(None)
    frame = _produce_v9_frame()
    forms = (set(paths), tuple(paths), list(paths), iter(paths), frozenset(paths), resolved)
    bodies = [codec.decode_request(frame, fields=form).body for form in forms]
    assert all(body == {"TransactionalId": "txn-1", "Acks": -1} for body in bodies)


def test_repeated_decodes_reuse_their_plan() -> None:
    frame = _produce_v9_frame()
    fields = frozenset({"TransactionalId"})
    codec.decode_request(frame, fields=fields)
    resolved = projection(fields)
    plan = resolved.requests[(PRODUCE << 16) | 9]
    plans_before = dict(resolved.requests)
    for _ in range(3):
        codec.decode_request(frame, fields=fields)
    assert resolved.requests == plans_before and resolved.requests[(PRODUCE << 16) | 9] is plan


def test_names_absent_at_a_version_do_not_change_the_decoder() -> None:
    seg = request_spec(METADATA).segment(1)
    assert seg is not None
    plain = normalize_projection(seg.fields, 1, {"Topics": None})
    # IncludeClusterAuthorizedOperations only exists from v8 on.
    widened = normalize_projection(
        seg.fields, 1, {"Topics": None, "IncludeClusterAuthorizedOperations": None}
    )
    assert plain == widened


def test_api_versions_plan_keeps_the_v0_fallback_for_projections() -> None:
    plan = response_plan(API_VERSIONS, 3, {"ErrorCode"})
    assert plan.api_versions_v0 is not None and plan.api_versions_v0.version == 0
    v0_body = codec.encode_response(API_VERSIONS, 0, 1, {"ErrorCode": 35, "ApiKeys": []})
    resp = codec.decode_response(v0_body, API_VERSIONS, 3, fields={"ErrorCode"})
    assert (resp.api_version, resp.requested_version, resp.body) == (0, 3, {"ErrorCode": 35})


def test_all_field_response_projection_reuses_the_full_plan() -> None:
    seg = response_spec(END_TXN).segment(4)
    assert seg is not None
    everything = _top_level(seg.fields, 4)
    assert response_plan(END_TXN, 4, everything) is response_plan(END_TXN, 4)


def test_only_apis_with_nested_payloads_are_expanded() -> None:
    assert request_plan(11, 9).expand and not request_plan(PRODUCE, 9).expand
    assert response_plan(15, 5).expand and not response_plan(END_TXN, 4).expand


@pytest.mark.parametrize(
    "function", [api.decode_request, api.decode_response, bodies.decode_body, bodies.decode_data]
)
def test_decode_functions_import_nothing_per_call(function: Callable[..., Any]) -> None:
    # Read from the source: compiled by mypyc, the function has no bytecode to look at.
    source = ROOT / f"{function.__module__.replace('.', '/')}.py"
    tree = ast.parse(source.read_text())
    (definition,) = [
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function.__name__
    ]
    imports = [node for node in ast.walk(definition) if isinstance(node, ast.Import | ast.ImportFrom)]
    assert imports == []


def test_out_of_range_api_key_in_a_plan_request_is_a_decode_error() -> None:
    # Plans key requests on the frame's first four bytes; a key outside int16 must not alias one.
    with pytest.raises(codec.DecodeError, match="out of int16 range"):
        request_plan(PRODUCE + (1 << 16), 9)


def test_error_in_generated_code_shows_the_generated_line() -> None:
    frame = _produce_v9_frame()
    with pytest.raises(codec.DecodeError) as info:
        codec.decode_request(frame[:30])
    err = info.value
    assert (err.api_key, err.api_version) == (PRODUCE, 9)
    generated = [
        frame
        for frame in traceback.extract_tb(err.__traceback__)
        if frame.filename.startswith("<kpmon:codec ProduceRequest v9")
    ]
    assert generated, "the generated decoder's frames are missing from the traceback"
    innermost = generated[-1]
    line = linecache.getline(innermost.filename, innermost.lineno or 0)
    assert line.strip() and innermost.line == line.strip()
    assert line.strip() in "".join(traceback.format_exception(err))
    # The source registered for the frame is the source that ran: its function is defined in it.
    assert f"def {innermost.name}(" in "".join(linecache.getlines(innermost.filename))


def test_fixed_width_arrays_of_any_length_decode_and_only_short_ones_cache_a_struct() -> None:
    replicas = list(range(300))
    partition: dict[str, Any] = {"ErrorCode": 0, "PartitionIndex": 0, "LeaderId": 1, "LeaderEpoch": 0}
    partition |= {"ReplicaNodes": replicas, "IsrNodes": replicas[:3], "OfflineReplicas": []}
    topic = {"ErrorCode": 0, "Name": "t", "IsInternal": False, "Partitions": [partition]}
    frame = codec.encode_response(METADATA, 12, 1, {"Brokers": [], "Topics": [topic]})
    decoded = codec.decode_response(frame, METADATA, 12).body["Topics"][0]["Partitions"][0]
    assert decoded["ReplicaNodes"] == replicas and decoded["IsrNodes"] == [0, 1, 2]
    assert decoded["OfflineReplicas"] == []
    # Arrays of up to 126 elements (one-byte compact length) use the prebuilt Structs; longer ones
    # the per-count cache, which keeps counts below the limit only.
    assert len(bodies.COMPILED.ns["_AL_i"]) == 127
    long_replicas = list(range(200))
    partition["ReplicaNodes"] = long_replicas
    frame = codec.encode_response(METADATA, 12, 1, {"Brokers": [], "Topics": [topic]})
    decoded = codec.decode_response(frame, METADATA, 12).body["Topics"][0]["Partitions"][0]
    assert decoded["ReplicaNodes"] == long_replicas
    cached_counts = bodies.COMPILED.ns["_A_i"]
    assert 200 in cached_counts and 300 not in cached_counts


def test_short_fixed_width_array_past_the_frame_is_a_decode_error() -> None:
    partition: dict[str, Any] = {"ErrorCode": 0, "PartitionIndex": 0, "LeaderId": 1, "LeaderEpoch": 0}
    partition |= {"ReplicaNodes": [1, 2, 3], "IsrNodes": [1], "OfflineReplicas": []}
    topic = {"ErrorCode": 0, "Name": "t", "IsInternal": False, "Partitions": [partition]}
    frame = codec.encode_response(METADATA, 12, 1, {"Brokers": [], "Topics": [topic]})
    at = frame.index(bytes([4, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3]))  # ReplicaNodes: length 3 + 1
    bad = frame[:at] + bytes([100]) + frame[at + 1 :]  # claims 99 replicas
    with pytest.raises(codec.DecodeError) as info:
        codec.decode_response(bad, METADATA, 12)
    assert info.value.offset == at + 1


def test_one_shot_iterator_of_fields_projects_like_the_same_set() -> None:
    frame = _produce_v9_frame()
    paths = ["TransactionalId", "Acks"]
    from_generator = codec.decode_request(frame, fields=(path for path in paths)).body
    assert (
        from_generator
        == codec.decode_request(frame, fields=set(paths)).body
        == {
            "TransactionalId": "txn-1",
            "Acks": -1,
        }
    )


def test_inline_fixed_width_elements_fall_back_for_an_element_with_tags() -> None:
    # ApiKeys elements are all fixed-width, so the generated loop decodes them inline; the second one
    # carries an unknown tag, which only the element's own decoder keeps.
    keys = [
        {"ApiKey": 0, "MinVersion": 3, "MaxVersion": 13},
        {"ApiKey": 1, "MinVersion": 4, "MaxVersion": 17},
    ]
    tagged = [keys[0], dict(keys[1], _unknown_tags={7: b"\x01\x02"})]
    frame = codec.encode_response(API_VERSIONS, 3, 1, {"ErrorCode": 0, "ApiKeys": tagged})
    full = codec.decode_response(frame, API_VERSIONS, 3)
    assert full.body["ApiKeys"] == tagged
    assert codec.encode(full) == frame
    projected = codec.decode_response(frame, API_VERSIONS, 3, fields={"ApiKeys.ApiKey", "ApiKeys.MaxVersion"})
    assert projected.body == {"ApiKeys": [{"ApiKey": 0, "MaxVersion": 13}, {"ApiKey": 1, "MaxVersion": 17}]}
    with pytest.raises(codec.DecodeError):
        codec.decode_response(frame[:12], API_VERSIONS, 3)
