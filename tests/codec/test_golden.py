"""Golden frames: the first requests that real clients (librdkafka, kafka-python, the Java client of
kafka-clients 4.4.0 and 3.9.2) sent to a loopback listener, and the answers they accepted, recorded by
tests/data/golden/capture.py.

Each request decodes, its header and ApiVersions fields are what the client was configured with or
documents it sends, and ``encode(decode(x)) == x`` byte for byte. The listener answered ApiVersions
and Metadata with responses built by our codec: each client going on to send Metadata shows it accepted
the ApiVersions answer. The ``*-old-broker`` runs answer ApiVersions v3+ as a broker that only knows
v0-v2 would (a v0 body with error 35), and every client retried at a lower version.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

import codec

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
FILES = sorted(GOLDEN.glob("*.jsonl"))
API_VERSIONS = 18
METADATA = 3

#: Bytes after the body that a client really sends. librdkafka 2.16.0's all-topics Metadata v13
#: request (Topics null) ends with 01 00 00 after the body's tagged section; Kafka's generated reader
#: and ours both stop before them (the broker ignores them), and kpmon keeps them to re-encode exactly.
KNOWN_TRAILING = {("librdkafka", METADATA, 13): {b"", bytes.fromhex("010000")}}


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


FRAMES = [(path.stem, i, record) for path in FILES for i, record in enumerate(load(path))]
REQUESTS = [frame for frame in FRAMES if frame[2]["direction"] == "request"]
RESPONSES = [frame for frame in FRAMES if frame[2]["direction"] == "response"]
CLIENTS = {"librdkafka", "kafka-python", "java-4.4.0", "java-3.9.2"}


def ids(frames: list[tuple[str, int, dict[str, Any]]]) -> list[str]:
    return [f"{client}-{i}" for client, i, _ in frames]


def requests_in(path: Path) -> list[dict[str, Any]]:
    return [r for r in load(path) if r["direction"] == "request"]


def test_every_client_has_golden_frames() -> None:
    assert {path.stem for path in FILES} == CLIENTS | {f"{c}-old-broker" for c in CLIENTS}
    for path in FILES:
        keys = [r["api_key"] for r in requests_in(path)]
        assert keys[0] == API_VERSIONS, f"{path.name}: a client starts with ApiVersions (KIP-35)"
        assert METADATA in keys, f"{path.name}: the client accepted our ApiVersions answer and went on"


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_clients_retry_after_the_v0_error_35_answer(client: str) -> None:
    # Against a broker that knows ApiVersions v0-v2 only, the first ApiVersions (v3+) got a v0 body with
    # error 35 built by our codec; each real client read it and retried at a version <= 2.
    records = load(GOLDEN / f"{client}-old-broker.jsonl")
    first, answer, retry = records[0], records[1], records[2]
    assert (first["direction"], first["api_key"]) == ("request", API_VERSIONS)
    assert first["api_version"] >= 3
    assert (answer["direction"], answer["correlation_id"]) == ("response", first["correlation_id"])
    decoded = codec.decode_response(bytes.fromhex(answer["hex"]), API_VERSIONS, first["api_version"])
    assert decoded.api_version == 0
    assert decoded.body["ErrorCode"] == 35
    assert decoded.body["ApiKeys"] == [{"ApiKey": API_VERSIONS, "MinVersion": 0, "MaxVersion": 2}]
    assert (retry["direction"], retry["api_key"]) == ("request", API_VERSIONS)
    assert retry["api_version"] <= 2


@pytest.mark.parametrize(("client", "index", "record"), REQUESTS, ids=ids(REQUESTS))
def test_golden_request_decodes_to_what_the_client_sent(
    client: str, index: int, record: dict[str, Any]
) -> None:
    raw = bytes.fromhex(record["hex"])
    expect = record["expect"]
    request = codec.decode_request(raw)
    assert (request.api_key, request.api_version) == (record["api_key"], record["api_version"])
    assert request.correlation_id == record["correlation_id"]
    assert request.client_id == expect["client_id"]
    assert request.header["ClientId"] == expect["client_id"]
    # Header v2 for flexible versions, v1 before; the client id has an int16 length in both.
    assert request.header_version == (2 if codec.is_flexible(request.api_key, request.api_version) else 1)
    assert raw[8:10] == struct.pack(">h", len(expect["client_id"]))
    trailing = request.body.get("_trailing", b"")
    client_name = record["client"]
    assert trailing in KNOWN_TRAILING.get((client_name, request.api_key, request.api_version), {b""})
    assert "_unknown_tags" not in request.body
    if request.api_key == API_VERSIONS and request.api_version >= 3:
        assert request.body["ClientSoftwareName"] == expect["software_name"]
        assert request.body["ClientSoftwareVersion"] == expect["software_version"]
    assert codec.encode(request) == raw


@pytest.mark.parametrize(("client", "index", "record"), RESPONSES, ids=ids(RESPONSES))
def test_golden_answers_decode_and_round_trip(client: str, index: int, record: dict[str, Any]) -> None:
    # The answers the clients accepted; the version is the one the request asked for.
    raw = bytes.fromhex(record["hex"])
    response = codec.decode_response(raw, record["api_key"], record["api_version"])
    assert response.correlation_id == record["correlation_id"]
    if record["api_key"] == API_VERSIONS:
        assert response.header_version == 0
    assert "_trailing" not in response.body
    assert codec.encode(response) == raw


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_golden_frames_decode_the_same_projected(path: Path) -> None:
    for record in requests_in(path):
        raw = bytes.fromhex(record["hex"])
        full = codec.decode_request(raw)
        if full.api_key == API_VERSIONS and full.api_version >= 3:
            projected = codec.decode_request(raw, fields=["ClientSoftwareName"])
            assert projected.body == {"ClientSoftwareName": full.body["ClientSoftwareName"]}


@pytest.mark.java
def test_kafka_decodes_golden_frames_like_kpmon() -> None:
    from tests.codec.test_java_differential import JavaFrame, compare
    from tests.java import harness

    frames: list[JavaFrame] = []
    for i, (_, _, r) in enumerate(FRAMES):
        raw = bytes.fromhex(r["hex"])
        if r["direction"] == "request":
            frames.append(
                JavaFrame("request", r["api_key"], r["api_version"], i, raw, codec.decode_request(raw))
            )
        else:
            response = codec.decode_response(raw, r["api_key"], r["api_version"])
            # An error-35 ApiVersions answer is a v0 body: Kafka's client reads it as v0 too.
            frames.append(JavaFrame("response", r["api_key"], response.api_version, i, raw, response))
    try:
        lines = harness.run_diff("4.4.0", (f"{f.kind} {f.api_key} {f.version} {f.raw.hex()}" for f in frames))
    except harness.JavaUnavailable as exc:
        pytest.skip(str(exc))
    mismatches = [d for f, line in zip(frames, lines, strict=True) for d in compare(f, json.loads(line))]
    assert not mismatches, "\n".join(mismatches)
