"""Layout runs: arrays of fixed-layout structs (Metadata partitions, ApiVersions keys...) decoded a run
of same-layout elements at a time (codec/compiler.py, ``_DecodeWriter.layout_runs``).

Each test holds the run decoder to the element-by-element decoder of the same schema (a second
``CompiledSchema`` compiled with runs switched off): same values, same errors, same offsets. They check
what is decoded and which path ran, never how long it takes.
"""

from __future__ import annotations

import linecache
import random
from collections.abc import Iterator
from typing import Any

import pytest

import codec
from codec import compiler
from codec.api import response_spec
from codec.compiler import CompiledSchema, Decoder, Projection
from codec.errors import DecodeError

METADATA, API_VERSIONS = 3, 18


def _partition(rng: random.Random, replicas: int, isr: int, offline: int) -> dict[str, Any]:
    return {
        "ErrorCode": rng.choice([0, 0, 0, 9]),
        "PartitionIndex": rng.randrange(10_000),
        "LeaderId": rng.randrange(-1, 50),
        "LeaderEpoch": rng.randrange(1 << 31),
        "ReplicaNodes": [rng.randrange(100) for _ in range(replicas)],
        "IsrNodes": [rng.randrange(100) for _ in range(isr)],
        "OfflineReplicas": [rng.randrange(100) for _ in range(offline)],
    }


def _metadata_body(partitions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "ThrottleTimeMs": 0,
        "Brokers": [{"NodeId": 1, "Host": "b1", "Port": 9092, "Rack": None}],
        "ClusterId": "c",
        "ControllerId": 1,
        "Topics": [{"ErrorCode": 0, "Name": "t", "IsInternal": False, "Partitions": partitions}],
    }


def _metadata_frames() -> Iterator[tuple[str, bytes]]:
    """MetadataResponse v12 frames: uniform runs of several lengths, runs broken by one partition of
    another layout, unknown tags in one partition, arrays too long for a run, and a null array."""
    rng = random.Random(10)
    for count in (1, 3, 4, 5, 63, 64, 65, 130):
        yield f"uniform-{count}", _encode([_partition(rng, 3, 3, 0) for _ in range(count)])
    for where in (0, 3, 4, 40, 69):
        parts = [_partition(rng, 3, 2, 1) for _ in range(70)]
        parts[where] = _partition(rng, 3, 1, 2)
        yield f"broken-at-{where}", _encode(parts)
        tagged = [_partition(rng, 3, 3, 0) for _ in range(70)]
        tagged[where]["_unknown_tags"] = {42: b"\x01\x02"}
        yield f"unknown-tag-at-{where}", _encode(tagged)
    yield "long-arrays", _encode([_partition(rng, 40, 33, 0) for _ in range(8)])
    yield "empty-arrays", _encode([_partition(rng, 0, 0, 0) for _ in range(8)])
    nulls = [_partition(rng, 2, 2, 0) for _ in range(8)]
    nulls[5]["OfflineReplicas"] = None
    yield "null-array", _encode(nulls, allow_null=True)


def _encode(partitions: list[dict[str, Any]], allow_null: bool = False) -> bytes:
    if not allow_null:
        return codec.encode_response(METADATA, 12, 1, _metadata_body(partitions))
    # OfflineReplicas is not nullable, so the encoder cannot write a null: write an empty array after
    # a marker value and turn its length byte (0x01, empty) into 0x00 (null).
    index = next(i for i, p in enumerate(partitions) if p["OfflineReplicas"] is None)
    partitions = [dict(p, OfflineReplicas=p["OfflineReplicas"] or []) for p in partitions]
    partitions[index]["IsrNodes"] = [_MARKER]
    frame = codec.encode_response(METADATA, 12, 1, _metadata_body(partitions))
    at = frame.index(_MARKER.to_bytes(4, "big")) + 4
    assert frame[at] == 1
    return frame[:at] + b"\x00" + frame[at + 1 :]


_MARKER = 0x7A6B5C4D


@pytest.fixture(scope="module")
def without_runs() -> CompiledSchema:
    """A second compiled schema whose decoders never take a run (the element-by-element reference)."""
    saved = compiler._RUN_MIN
    compiler._RUN_MIN = 1 << 30
    try:
        schema = CompiledSchema()
        # Compile what the tests use while runs are off.
        for proj in PROJECTIONS:
            _decoder(schema, METADATA, 12, proj)
        _decoder(schema, API_VERSIONS, 3, None)
    finally:
        compiler._RUN_MIN = saved
    return schema


PROJECTIONS: list[Projection | None] = [
    None,
    {"Topics": {"Partitions": {"ErrorCode": None}}},
    {"Topics": {"Name": None, "Partitions": {"IsrNodes": None, "LeaderId": None}}},
]


def _decoder(schema: CompiledSchema, api_key: int, version: int, proj: Projection | None) -> Decoder:
    seg = response_spec(api_key).segment(version)
    assert seg is not None
    return schema.decoder(seg, version, proj, f"test {api_key} v{version}")


def _outcome(decoder: Decoder, frame: bytes) -> Any:
    try:
        return decoder(frame, 5, len(frame))  # after the response header v1 (correlation id, tags)
    except DecodeError as exc:
        return ("error", exc.reason, exc.offset)


def _cuts(frame: bytes) -> list[bytes]:
    rng = random.Random(len(frame))
    out = [frame[:cut] for cut in sorted(rng.sample(range(5, len(frame)), min(20, len(frame) - 5)))]
    for _ in range(20):
        flipped = bytearray(frame)
        flipped[rng.randrange(5, len(frame))] = rng.randrange(256)
        out.append(bytes(flipped))
    return out


@pytest.mark.parametrize("proj", PROJECTIONS, ids=["full", "error-codes", "isr"])
def test_runs_decode_as_element_by_element(proj: Projection | None, without_runs: CompiledSchema) -> None:
    runs, reference = (
        _decoder(CompiledSchema(), METADATA, 12, proj),
        _decoder(without_runs, METADATA, 12, proj),
    )
    for name, frame in _metadata_frames():
        assert _outcome(runs, frame) == _outcome(reference, frame), name
        for broken in _cuts(frame):
            assert _outcome(runs, broken) == _outcome(reference, broken), name


def test_runs_are_taken_and_their_builders_are_in_linecache() -> None:
    schema = CompiledSchema()
    decoder = _decoder(schema, METADATA, 12, None)
    frame = dict(_metadata_frames())["uniform-130"]
    body, _ = decoder(frame, 5, len(frame))
    assert len(body["Topics"][0]["Partitions"]) == 130
    runs = [v for v in schema.ns.values() if isinstance(v, compiler._LayoutRuns)]
    assert len(runs) == 1
    plans = [plan for plan in runs[0].values() if plan]
    # 130 partitions of one layout: runs of 64, 64 and 2 (too short for a run: element by element).
    assert sorted(key & 255 for key, plan in runs[0].items() if plan) == [64]
    assert len(runs[0].builders) == 1
    build = plans[0][2]
    lines = linecache.getlines(build.__code__.co_filename)
    assert build.__code__.co_filename.startswith("<kpmon:codec ")
    assert "decode-run" in build.__code__.co_filename and any("ReplicaNodes" in line for line in lines)


def test_a_broken_run_falls_back_for_that_run_only() -> None:
    schema = CompiledSchema()
    decoder = _decoder(schema, METADATA, 12, None)
    frame = dict(_metadata_frames())["broken-at-69"]
    body, _ = decoder(frame, 5, len(frame))
    (runs,) = (v for v in schema.ns.values() if isinstance(v, compiler._LayoutRuns))
    # The first run (64 partitions) is one layout; the last 6 include the odd one and go one by one.
    assert [key & 255 for key, plan in runs.items() if plan] == [64, 6]
    partitions = body["Topics"][0]["Partitions"]
    assert [len(p["IsrNodes"]) for p in partitions] == [2] * 69 + [1]


def test_layout_caches_are_bounded(without_runs: CompiledSchema) -> None:
    schema = CompiledSchema()
    decoder, reference = _decoder(schema, METADATA, 12, None), _decoder(without_runs, METADATA, 12, None)
    rng = random.Random(3)
    for replicas in range(12):
        for isr in range(12):
            frame = _encode([_partition(rng, replicas, isr, r % 3) for r in range(rng.randrange(4, 40))])
            assert _outcome(decoder, frame) == _outcome(reference, frame)
    (runs,) = (v for v in schema.ns.values() if isinstance(v, compiler._LayoutRuns))
    assert len(runs) <= compiler._RUN_LAYOUTS
    assert len(runs.builders) == compiler._RUN_BUILDERS
    assert 0 < runs.cost <= compiler._RUN_VALUES
    assert runs.cost <= schema.ns.run_values <= compiler._RUN_VALUES_TOTAL


def test_plans_past_the_values_budget_are_not_made(
    without_runs: CompiledSchema, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Room for one plan of 64 partitions (3 replicas, 3 ISR, 0 offline: 10 values each, counted
    # as 11) and not for a second.
    monkeypatch.setattr(compiler, "_RUN_VALUES", 11 * 64 + 10)
    schema = CompiledSchema()
    decoder, reference = _decoder(schema, METADATA, 12, None), _decoder(without_runs, METADATA, 12, None)
    rng = random.Random(4)
    frames = [_encode([_partition(rng, 3, 3, 0) for _ in range(count)]) for count in (64, 63, 64)]
    for frame in frames:
        assert _outcome(decoder, frame) == _outcome(reference, frame)
    (runs,) = (v for v in schema.ns.values() if isinstance(v, compiler._LayoutRuns))
    assert [(key & 255, bool(plan)) for key, plan in runs.items()] == [(64, True), (63, False)]


def test_api_versions_keys_take_runs(without_runs: CompiledSchema) -> None:
    frame = codec.encode_response(
        API_VERSIONS,
        3,
        5,
        {
            "ErrorCode": 0,
            "ApiKeys": [{"ApiKey": k, "MinVersion": 0, "MaxVersion": k % 13} for k in range(90)],
            "ThrottleTimeMs": 0,
        },
    )
    # ApiVersions responses use header v0: the body starts after the correlation id.
    runs = _decoder(CompiledSchema(), API_VERSIONS, 3, None)
    reference = _decoder(without_runs, API_VERSIONS, 3, None)
    assert runs(frame, 4, len(frame)) == reference(frame, 4, len(frame))
    assert runs(frame, 4, len(frame))[0]["ApiKeys"][89] == {"ApiKey": 89, "MinVersion": 0, "MaxVersion": 11}
