"""Differential test: every frame our codec encodes, Kafka's own generated Java classes decode to the
same values, re-encode to the same bytes, and rebuild (from their JSON form) into bytes we decode back.

Frames cover every API x version x request/response the schema table defines (four seeds each,
``codec.samples`` bodies without unknown tags, real record batches in ``records`` fields; plus a fifth
with unknown tags, checked for values and byte-identical re-encoding). Each version
goes to the kafka-clients jar its definition came from (4.4.0, or 3.9.2 for the versions 4.0 removed),
one JVM per jar (tests/java/harness.py).
"""

from __future__ import annotations

import base64
import json
import random
import uuid
from collections import Counter
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest

import codec
from codec.api import request_spec, response_spec
from codec.samples import BodyBuilder
from codec.schema import FieldSpec, load_table
from tests.codec.strategies import ALL_MESSAGES, records_value
from tests.java import harness

pytestmark = pytest.mark.java

SEEDS = 4
JARS = ("4.4.0", "3.9.2")
API_VERSIONS = 18
UNSUPPORTED_VERSION = 35


@dataclass
class JavaFrame:
    kind: str
    api_key: int
    version: int
    seed: int
    raw: bytes
    message: codec.Request | codec.Response
    unknown_tags: bool = False

    @property
    def label(self) -> str:
        extra = ", unknown tags" if self.unknown_tags else ""
        name = codec.api_name(self.api_key)
        return f"{name} {self.kind} v{self.version} (key {self.api_key}, seed {self.seed}{extra})"


def release_of(kind: str, api_key: int, version: int) -> str:
    spec = request_spec(api_key) if kind == "request" else response_spec(api_key)
    seg = spec.segment(version)
    assert seg is not None
    return seg.release


def build(kind: str, api_key: int, version: int, seed: int, unknown_tags: bool = False) -> JavaFrame:
    rng = random.Random(f"java-diff/{kind}/{api_key}/{version}/{seed}/{unknown_tags}")
    builder = BodyBuilder(rng, unknown_tags=unknown_tags, records=records_value)
    if kind == "request":
        body = builder.body(request_spec(api_key), version)
        raw = codec.encode_request(api_key, version, rng.randint(-(2**31), 2**31 - 1), "kpmon-diff", body)
        message: codec.Request | codec.Response = codec.decode_request(raw)
    else:
        body = builder.body(response_spec(api_key), version)
        if api_key == API_VERSIONS and body.get("ErrorCode") == UNSUPPORTED_VERSION:
            # Such a body is read as v0 by design (tests/codec/test_edge_cases.py); Java reads it as asked.
            body["ErrorCode"] = 0
        raw = codec.encode_response(api_key, version, rng.randint(0, 2**31 - 1), body)
        message = codec.decode_response(raw, api_key, version)
    return JavaFrame(kind, api_key, version, seed, raw, message, unknown_tags)


@cache
def frames_for(jar: str) -> list[JavaFrame]:
    """``SEEDS`` frames per (kind, api, version) of this jar, plus one whose flexible structs may carry
    unknown tagged fields: the converters do not show those, but Kafka keeps them and must re-encode
    them to the same bytes."""
    return [
        build(kind, key, version, seed, unknown_tags=seed == SEEDS)
        for kind, key, version in ALL_MESSAGES
        if release_of(kind, key, version) == jar
        for seed in range(SEEDS + 1)
    ]


def kafka_uuid(value: uuid.UUID) -> str:
    """Kafka's ``Uuid.toString()``: URL-safe base64 of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(value.bytes).decode().rstrip("=")


_TYPE_DEFAULTS: dict[str, Any] = {
    "int8": 0,
    "int16": 0,
    "uint16": 0,
    "int32": 0,
    "uint32": 0,
    "int64": 0,
    "float64": 0.0,
    "bool": False,
    "string": "",
    "bytes": b"",
    "uuid": uuid.UUID(int=0),
}


def is_default(f: FieldSpec, value: Any, version: int) -> bool:
    """Whether ``value`` is the field's default (a tagged field with its default is not on the wire,
    and the Java converters leave it out of their JSON)."""
    if f.has_default:
        return value == f.default
    if f.is_array:
        return value == []
    if f.is_struct:
        return isinstance(value, dict) and all(
            is_default(sub, value.get(sub.name), version) for sub in f.fields or () if sub.present(version)
        )
    if f.type == "bytes":
        return value is not None and bytes(value) == b""
    return value == _TYPE_DEFAULTS.get(f.type, object())


def to_java(fields: tuple[FieldSpec, ...], version: int, value: dict[str, Any], records: str = "size") -> Any:
    """Our decoded struct in the shape of Kafka's ``*JsonConverter.write(..., serializeRecords=false)``.

    Names lose their capital first letter; tagged fields holding their default are left out; a record
    set ``X`` becomes ``xSizeInBytes`` with its byte count (``records="size"``, what the converter
    writes) or a marker (``records="opaque"``, for bodies rebuilt from JSON, whose record sets come back
    empty).
    """
    out: dict[str, Any] = {}
    for f in fields:
        if not f.present(version):
            continue
        item = value[f.name]
        if f.tagged_at(version) and is_default(f, item, version):
            continue
        name = f.name[0].lower() + f.name[1:]
        if f.type == "records" and item is not None:
            if records == "size":
                out[name + "SizeInBytes"] = len(bytes(item))
            else:
                out[name] = "<records>"
        elif f.is_struct and item is not None:
            sub = f.fields or ()
            out[name] = (
                [to_java(sub, version, x, records) for x in item]
                if f.is_array
                else to_java(sub, version, item, records)
            )
        else:
            out[name] = scalar(item)
    return out


def scalar(value: Any) -> Any:
    if isinstance(value, list):
        return [scalar(item) for item in value]
    if isinstance(value, uuid.UUID):
        return kafka_uuid(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    # bytes, and payloads decoded from bytes fields (Envelope frames, consumer protocol) keep their raw bytes.
    return base64.b64encode(bytes(value)).decode()


def header_fields(kind: str, header_version: int) -> tuple[FieldSpec, ...]:
    spec = load_table().by_name["RequestHeader" if kind == "request" else "ResponseHeader"]
    seg = spec.segment(header_version)
    assert seg is not None
    return seg.fields


def body_fields(kind: str, api_key: int, version: int) -> tuple[FieldSpec, ...]:
    spec = request_spec(api_key) if kind == "request" else response_spec(api_key)
    seg = spec.segment(version)
    assert seg is not None
    return seg.fields


def opaque_records(java_json: Any) -> Any:
    """Java JSON with record-set sizes replaced like ``to_java(..., records="opaque")`` does."""
    if isinstance(java_json, dict):
        out: dict[str, Any] = {}
        for key, item in java_json.items():
            if key.endswith("SizeInBytes") and isinstance(item, int):
                out[key.removesuffix("SizeInBytes")] = "<records>"
            else:
                out[key] = opaque_records(item)
        return out
    if isinstance(java_json, list):
        return [opaque_records(item) for item in java_json]
    return java_json


def differences(ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Every path where the two JSON-shaped values differ (empty when they agree)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        found: list[str] = []
        for key in sorted(ours.keys() | theirs.keys()):
            where = f"{path}.{key}" if path else key
            if key not in theirs:
                found.append(f"{where}: only kpmon has it ({ours[key]!r})")
            elif key not in ours:
                found.append(f"{where}: only Kafka has it ({theirs[key]!r})")
            else:
                found += differences(ours[key], theirs[key], where)
        return found
    if isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            return [f"{path}: kpmon has {len(ours)} items, Kafka {len(theirs)}"]
        found = []
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            found += differences(a, b, f"{path}[{i}]")
        return found
    if isinstance(ours, float) or isinstance(theirs, float):
        if isinstance(ours, int | float) and isinstance(theirs, int | float) and float(ours) == float(theirs):
            return []
    elif type(ours) is type(theirs) and ours == theirs:
        return []
    return [f"{path}: kpmon {ours!r} != Kafka {theirs!r}"]


def compare(frame: JavaFrame, output: dict[str, Any]) -> list[str]:
    """Mismatches between our decode and Kafka's for one frame, each prefixed with api/version/path."""
    if "error" in output:
        return [f"{frame.label}: Kafka cannot read it: {output['error']} (hex {frame.raw.hex()})"]
    message = frame.message
    fields = body_fields(frame.kind, frame.api_key, frame.version)
    head = header_fields(frame.kind, message.header_version)
    found = differences(to_java(head, message.header_version, message.header), output["header"], "header")
    found += differences(to_java(fields, frame.version, message.body), output["body"], "body")
    trailing = bytes(message.body.get("_trailing", b""))
    if output.get("trailing", "") != trailing.hex():
        found.append(
            f"bytes after the body: Kafka {output.get('trailing', '')!r} != kpmon {trailing.hex()!r}"
        )
    exact = frame.raw[: len(frame.raw) - len(trailing)].hex()
    if output["reencoded"] != exact:
        found.append(f"encoding: Kafka {output['reencoded']} != kpmon {exact}")
    if "from_json_error" in output:
        found.append(f"Kafka could not rebuild the message from its JSON: {output['from_json_error']}")
    else:
        # The reverse direction: bytes Kafka encoded (from its JSON form), decoded by us.
        rebuilt = bytes.fromhex(output["from_json"])
        try:
            if frame.kind == "request":
                again: codec.Request | codec.Response = codec.decode_request(rebuilt)
            else:
                again = codec.decode_response(rebuilt, frame.api_key, frame.version)
        except codec.DecodeError as exc:
            found.append(f"kpmon cannot decode Kafka's encoding {rebuilt.hex()}: {exc}")
        else:
            found += [
                f"from_json {d}"
                for d in differences(
                    to_java(fields, frame.version, again.body, records="opaque"),
                    opaque_records(output["body"]),
                    "body",
                )
            ]
    return [f"{frame.label}: {d}" for d in found]


@pytest.fixture(scope="module", params=JARS)
def java_run(request: pytest.FixtureRequest) -> tuple[str, list[JavaFrame], list[dict[str, Any]]]:
    jar = request.param
    frames = frames_for(jar)
    try:
        lines = harness.run_diff(jar, (f"{f.kind} {f.api_key} {f.version} {f.raw.hex()}" for f in frames))
    except harness.JavaUnavailable as exc:
        pytest.skip(str(exc))
    assert len(lines) == len(frames), "KpmonDiff answers one line per frame"
    return jar, frames, [json.loads(line) for line in lines]


def test_kafka_decodes_every_frame_like_kpmon(
    java_run: tuple[str, list[JavaFrame], list[dict[str, Any]]],
) -> None:
    jar, frames, outputs = java_run
    mismatches: list[str] = []
    per_api: Counter[str] = Counter()
    for frame, output in zip(frames, outputs, strict=True):
        found = compare(frame, output)
        mismatches += found
        if not found:
            per_api[codec.api_name(frame.api_key)] += 1
    print(f"\nkafka-clients {jar}: {len(frames)} frames, {sum(per_api.values())} agree on every field")
    print("  " + ", ".join(f"{name} {n}" for name, n in sorted(per_api.items())))
    assert not mismatches, f"{len(mismatches)} mismatches with kafka-clients {jar}:\n" + "\n".join(
        mismatches[:60]
    )


def test_frames_cover_every_api_and_version() -> None:
    covered = {(kind, key, version) for kind, key, version in ALL_MESSAGES}
    by_jar = {jar: {(k, key, v) for k, key, v in covered if release_of(k, key, v) == jar} for jar in JARS}
    assert by_jar["4.4.0"] | by_jar["3.9.2"] == covered
    assert {key for _, key, _ in covered} == set(codec.api_keys())
    # KIP-896 removed versions are only in 3.9.2: Produce v0-v2 requests among them.
    assert ("request", 0, 0) in by_jar["3.9.2"]


def test_comparison_reports_a_changed_field_with_its_path() -> None:
    # No JVM: a fabricated Kafka answer that differs in one nested field, one encoded byte and one name.
    frame = build("request", 3, 12, 0)
    fields = body_fields("request", 3, 12)
    body = to_java(fields, 12, frame.message.body)
    body["topics"] = [{"topicId": kafka_uuid(uuid.UUID(int=1)), "name": "a"}]
    header = to_java(header_fields("request", 2), 2, frame.message.header)
    header["clientId"] = "other"
    output = {
        "header": header,
        "body": body,
        "reencoded": frame.raw.hex() + "00",
        "from_json": frame.raw.hex(),
    }
    found = compare(frame, output)
    assert any("header.clientId: kpmon 'kpmon-diff' != Kafka 'other'" in d for d in found)
    assert any("body.topics" in d for d in found)
    assert any("encoding: Kafka" in d for d in found)
    assert all(d.startswith("Metadata request v12 (key 3, seed 0): ") for d in found)


#: (kind, api key, version) whose 3.9.2 definition differs on the wire from the 4.4.0 one the codec uses.
#: ReadShareGroupStateSummary v0 (KIP-932, inter-broker) was unstable in 3.9 (``latestVersionUnstable``)
#: and 4.x added ``LeaderEpoch`` to its results, so 3.9.2's classes read 4.4.0's v0 responses short.
RELEASE_DIVERGENCES = {("response", 87, 0)}


def test_kafka_3_9_reads_the_versions_it_shares_with_4_4_identically() -> None:
    # The codec takes a version both releases define from 4.4.0; a 3.9 broker or client uses its own
    # definition. They must agree on the wire: 3.9.2's classes read every such frame completely and
    # write back the same bytes (field names may differ between releases; bytes may not).
    frames = frames_for("4.4.0")
    try:
        lines = harness.run_diff("3.9.2", (f"{f.kind} {f.api_key} {f.version} {f.raw.hex()}" for f in frames))
    except harness.JavaUnavailable as exc:
        pytest.skip(str(exc))
    shared = 0
    diverged: set[tuple[str, int, int]] = set()
    mismatches: list[str] = []
    for frame, line in zip(frames, lines, strict=True):
        output = json.loads(line)
        if output.get("unsupported"):
            continue
        shared += 1
        if "error" in output:
            problem = f"3.9.2 cannot read it: {output['error']}"
        elif output.get("trailing"):
            problem = f"3.9.2 leaves {output['trailing']} after the body"
        elif output["reencoded"] != frame.raw.hex():
            problem = f"3.9.2 re-encodes it as {output['reencoded']}"
        else:
            continue
        key = (frame.kind, frame.api_key, frame.version)
        diverged.add(key)
        if key not in RELEASE_DIVERGENCES:
            mismatches.append(f"{frame.label}: {problem} (hex {frame.raw.hex()})")
    print(f"\n{shared} frames of versions that 4.4.0 and 3.9.2 both define; divergent: {sorted(diverged)}")
    assert shared > 2000
    assert not mismatches, "\n".join(mismatches[:40])
    assert diverged == RELEASE_DIVERGENCES, "a listed divergence no longer shows: update RELEASE_DIVERGENCES"
