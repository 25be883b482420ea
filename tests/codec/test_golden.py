"""Golden frames: the first requests that real clients (librdkafka, kafka-python, the Java client of
kafka-clients 4.4.0 and 3.9.2) sent to a loopback listener, recorded by tests/data/golden/capture.py.

Each frame decodes, its header and ApiVersions fields are what the client was configured with or
documents it sends, and ``encode(decode(x)) == x`` byte for byte. The listener answered ApiVersions
with a response built by our codec: each client going on to send Metadata shows it accepted that answer.
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


def test_every_client_has_golden_frames() -> None:
    clients = {path.stem for path in FILES}
    assert clients == {"librdkafka", "kafka-python", "java-4.4.0", "java-3.9.2"}
    for path in FILES:
        records = load(path)
        keys = [r["api_key"] for r in records]
        assert keys[0] == API_VERSIONS, f"{path.name}: a client starts with ApiVersions (KIP-35)"
        assert METADATA in keys, f"{path.name}: the client accepted our ApiVersions answer and went on"


@pytest.mark.parametrize(("client", "index", "record"), FRAMES, ids=[f"{c}-{i}" for c, i, _ in FRAMES])
def test_golden_frame_decodes_to_what_the_client_sent(
    client: str, index: int, record: dict[str, Any]
) -> None:
    raw = bytes.fromhex(record["hex"])
    expect = record["expect"]
    request = codec.decode_request(raw)
    assert (request.api_key, request.api_version) == (record["api_key"], record["api_version"])
    assert request.correlation_id == record["correlation_id"]
    assert request.client_id == expect["client_id"]
    assert request.header["ClientId"] == expect["client_id"]
    # Every API version these clients use is flexible: request header v2, client id still int16-length.
    assert request.header_version == 2
    assert raw[8:10] == struct.pack(">h", len(expect["client_id"]))
    trailing = request.body.get("_trailing", b"")
    assert trailing in KNOWN_TRAILING.get((client, request.api_key, request.api_version), {b""})
    assert "_unknown_tags" not in request.body
    if request.api_key == API_VERSIONS and request.api_version >= 3:
        assert request.body["ClientSoftwareName"] == expect["software_name"]
        assert request.body["ClientSoftwareVersion"] == expect["software_version"]
    assert codec.encode(request) == raw


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_golden_frames_decode_the_same_projected(path: Path) -> None:
    for record in load(path):
        raw = bytes.fromhex(record["hex"])
        full = codec.decode_request(raw)
        if full.api_key == API_VERSIONS and full.api_version >= 3:
            projected = codec.decode_request(raw, fields=["ClientSoftwareName"])
            assert projected.body == {"ClientSoftwareName": full.body["ClientSoftwareName"]}


@pytest.mark.java
def test_kafka_decodes_golden_frames_like_kpmon() -> None:
    from tests.codec.test_java_differential import Frame, compare
    from tests.java import harness

    frames = [
        Frame("request", r["api_key"], r["api_version"], i, raw, codec.decode_request(raw))
        for i, (_, _, r) in enumerate(FRAMES)
        for raw in [bytes.fromhex(r["hex"])]
    ]
    try:
        lines = harness.run_diff("4.4.0", (f"request {f.api_key} {f.version} {f.raw.hex()}" for f in frames))
    except harness.JavaUnavailable as exc:
        pytest.skip(str(exc))
    mismatches = [d for f, line in zip(frames, lines, strict=True) for d in compare(f, json.loads(line))]
    assert not mismatches, "\n".join(mismatches)
