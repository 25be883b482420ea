"""A projected decode returns exactly the named fields, equal to the full decode's values."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings

import codec
from codec.api import parse_projection, request_spec, response_spec
from codec.schema import FieldSpec
from tests.codec.strategies import build_frame, decode_frame, messages, seeds


def _paths(fields: tuple[FieldSpec, ...], version: int, rng: random.Random, prefix: str = "") -> list[str]:
    out: list[str] = []
    for f in fields:
        if not f.present(version) or rng.random() < 0.5:
            continue
        path = prefix + f.name
        if f.is_struct and rng.random() < 0.7:
            sub = _paths(f.fields or (), version, rng, path + ".")
            out.extend(sub or [path])
        else:
            out.append(path)
    return out


def _restrict(value: Any, proj: Any) -> Any:
    if proj is None or value is None:
        return value
    if isinstance(value, list):
        return [_restrict(v, proj) for v in value]
    return {k: _restrict(value[k], sub) for k, sub in proj.items() if k in value}


@settings(max_examples=300, deadline=None)
@given(message=messages, seed=seeds)
def test_projection_equals_restricted_full_decode(message: tuple[str, int, int], seed: int) -> None:
    kind, api_key, version = message
    frame = build_frame(kind, api_key, version, seed, unknown_tags=False)
    spec = request_spec(api_key) if kind == "request" else response_spec(api_key)
    seg = spec.segment(version)
    assert seg is not None
    paths = _paths(seg.fields, version, random.Random(seed))
    full = decode_frame(kind, frame, api_key, version)
    projected: codec.Request | codec.Response
    if kind == "request":
        projected = codec.decode_request(frame, fields=paths)
    else:
        projected = codec.decode_response(frame, api_key, version, fields=paths)
    proj = parse_projection(frozenset(paths))
    expected = _restrict({k: v for k, v in full.body.items() if not k.startswith("_")}, proj)
    assert projected.body == expected


def test_projected_produce_keeps_only_batch_headers_path() -> None:
    from codec.records import build_record_batch

    batch = build_record_batch([(None, b"v" * 50)], producer_id=42, producer_epoch=3, base_sequence=7)
    body = {
        "TransactionalId": "tx",
        "Acks": -1,
        "TimeoutMs": 30000,
        "TopicData": [{"Name": "t", "PartitionData": [{"Index": 0, "Records": batch}]}],
    }
    frame = codec.encode_request(0, 9, 5, "p", body)
    projected = codec.decode_request(frame, fields={"TransactionalId", "TopicData.PartitionData.Records"})
    assert set(projected.body) == {"TransactionalId", "TopicData"}
    partition = projected.body["TopicData"][0]["PartitionData"][0]
    assert set(partition) == {"Records"}
    (header,) = partition["Records"].batches
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 7)
