"""Generate ``codec/schema_table.json`` from the message definitions inside the pinned kafka-clients jars.

``python -m codec.generator --write JAR...`` (``make schemas``) rewrites the table from the given
kafka-clients jars; ``--check`` exits non-zero when the committed table differs from what they produce.
The caller names the jars (``make schemas`` asks ``python -m deploy.fetch --clients-jars`` for the pinned
releases'), because fetching them is deployment's business and the codec imports no adapter; each
jar says which release it is (``kafka/kafka-version.properties``).

The jars bundle ``common/message/*.json``: Kafka's own MessageGenerator input. Those files are JSON
with ``//`` comments, tags sometimes written as strings, hex defaults, per-field ``flexibleVersions``
overrides, ``commonStructs`` and ``latestVersionUnstable``. The table keeps only structure (names,
types, version ranges, nullable/tagged/flexible versions, tags, defaults, map keys) and none of the
prose. Every API version comes from the newest release that still defines it, so versions removed by
Kafka 4.0 (KIP-896) are decoded with the 3.9 definitions.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from codec.generated_file import write_or_check

TABLE_PATH = Path(__file__).with_name("schema_table.json")
TABLE_FORMAT = 1
#: An open-ended version range ("3+") is stored with this upper bound.
MAX_VERSION = 32767

_FIELD_KEYS_KEPT = (
    "name",
    "type",
    "versions",
    "nullableVersions",
    "taggedVersions",
    "tag",
    "flexibleVersions",
    "default",
    "mapKey",
    "ignorable",
)

Json = dict[str, Any]


class SpecError(ValueError):
    """An upstream definition this generator does not understand."""


def strip_comments(text: str) -> str:
    """Remove ``//`` comments outside string literals (the upstream files are not strict JSON)."""
    out: list[str] = []
    i, n = 0, len(text)
    in_string = False
    while i < n:
        ch = text[i]
        if in_string:
            out.append(ch)
            if ch == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
            out.append(ch)
        elif ch == "/" and i + 1 < n and text[i + 1] == "/":
            while i < n and text[i] != "\n":
                i += 1
            continue
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def parse_versions(spec: str | None) -> list[int] | None:
    """``"0+"`` → [0, MAX], ``"3-5"`` → [3, 5], ``"2"`` → [2, 2], ``"none"``/``""``/None → None."""
    if spec is None:
        return None
    spec = spec.strip()
    if spec in ("", "none"):
        return None
    if spec.endswith("+"):
        return [int(spec[:-1]), MAX_VERSION]
    if "-" in spec:
        lo, hi = spec.split("-", 1)
        return [int(lo), int(hi)]
    return [int(spec), int(spec)]


def _parse_default(value: Any, type_name: str) -> Any:
    if not isinstance(value, str):
        return value
    if value == "null":
        return None
    if type_name in ("int8", "int16", "int32", "int64", "uint16", "uint32"):
        return int(value, 0)
    if type_name == "float64":
        return float(value)
    if type_name == "bool":
        if value not in ("true", "false"):
            raise SpecError(f"bad bool default {value!r}")
        return value == "true"
    return value


def _normalize_field(field: Json, structs: dict[str, Json]) -> Json:
    out: Json = {}
    for key in _FIELD_KEYS_KEPT:
        if key not in field:
            continue
        value = field[key]
        if key in ("versions", "nullableVersions", "taggedVersions", "flexibleVersions"):
            value = parse_versions(value)
            if key == "flexibleVersions":
                # A field-level override; "none" (ClientId in RequestHeader) means never compact.
                out[key] = value if value is not None else "none"
                continue
            if value is None:
                continue
        elif key == "tag":
            value = int(value)
        elif key == "default":
            value = _parse_default(value, field["type"])
        elif key in ("mapKey", "ignorable") and not value:
            continue
        out[key] = value
    type_name: str = field["type"]
    element = type_name[2:] if type_name.startswith("[]") else type_name
    if "fields" in field:
        out["fields"] = [_normalize_field(f, structs) for f in field["fields"]]
    elif element in structs:
        # commonStructs are referenced by name; inline them so the runtime has one shape.
        out["fields"] = [_normalize_field(f, structs) for f in structs[element]["fields"]]
    elif element[:1].isupper():
        raise SpecError(f"struct type {element!r} of field {field['name']!r} has no definition")
    return out


def normalize_message(spec: Json, release: str) -> Json | None:
    """One upstream file → one segment of the table (structure only); None for a retired API."""
    structs = {s["name"]: s for s in spec.get("commonStructs", [])}
    valid = parse_versions(spec["validVersions"])
    if valid is None:
        # Kafka 4.x keeps retired APIs (ControlledShutdown, ...) with validVersions "none".
        return None
    segment: Json = {
        "release": release,
        "validVersions": valid,
        "flexibleVersions": parse_versions(spec.get("flexibleVersions")),
        "fields": [_normalize_field(f, structs) for f in spec["fields"]],
    }
    if spec.get("latestVersionUnstable"):
        segment["latestVersionUnstable"] = True
    return segment


def read_jar_specs(jar: Path) -> dict[str, Json]:
    """Parse every ``common/message/*.json`` in ``jar``, keyed by message name."""
    specs: dict[str, Json] = {}
    with zipfile.ZipFile(jar) as zf:
        for name in sorted(zf.namelist()):
            if not (name.startswith("common/message/") and name.endswith(".json")):
                continue
            spec = json.loads(strip_comments(zf.read(name).decode("utf-8")))
            specs[spec["name"]] = spec
    if not specs:
        raise SpecError(f"{jar} holds no common/message/*.json definitions")
    return specs


def _message_key(spec: Json) -> str:
    # Requests and responses are merged across releases by API key (a rename such as
    # ListClientMetricsResources → ListConfigResources keeps its key); the rest by name.
    if spec["type"] in ("request", "response"):
        return f"{spec['type']}:{int(spec['apiKey'])}"
    return f"{spec['type']}:{spec['name']}"


def build_table(jars: dict[str, Path]) -> Json:
    """Merge the releases in ``jars`` (newest first) into the normalized table."""
    merged: dict[str, Json] = {}
    sources: Json = {}
    for release, jar in jars.items():
        sources[release] = {
            "artifact": f"org.apache.kafka:kafka-clients:{release}",
            "sha256": hashlib.sha256(jar.read_bytes()).hexdigest(),
        }
        for spec in read_jar_specs(jar).values():
            key = _message_key(spec)
            segment = normalize_message(spec, release)
            if segment is None:
                continue
            entry = merged.get(key)
            if entry is None:
                entry = {"name": spec["name"], "type": spec["type"], "segments": []}
                if "apiKey" in spec:
                    entry["apiKey"] = int(spec["apiKey"])
                merged[key] = entry
            lo, hi = segment["validVersions"]
            covered: set[int] = set()
            for seg in entry["segments"]:
                covered.update(range(seg["validVersions"][0], seg["validVersions"][1] + 1))
            wanted = [v for v in range(lo, hi + 1) if v not in covered]
            if not wanted:
                continue
            # An older release contributes only the versions no newer release defines.
            segment["validVersions"] = [min(wanted), max(wanted)]
            if len(wanted) != max(wanted) - min(wanted) + 1:
                raise SpecError(f"{spec['name']}: {release} would fill a non-contiguous version gap")
            entry["segments"].append(segment)
    messages = dict(sorted(merged.items(), key=lambda kv: (kv[1]["type"], kv[1].get("apiKey", -1), kv[0])))
    return {"format": TABLE_FORMAT, "sources": sources, "messages": list(messages.values())}


def jar_release(jar: Path) -> str:
    """The Kafka release a kafka-clients jar was built as (its ``kafka/kafka-version.properties``)."""
    with zipfile.ZipFile(jar) as zf:
        try:
            text = zf.read("kafka/kafka-version.properties").decode()
        except KeyError:
            raise SpecError(f"{jar} is not a kafka-clients jar (no kafka/kafka-version.properties)") from None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "version":
            return value.strip()
    raise SpecError(f"{jar}: kafka/kafka-version.properties names no version")


def by_release(jars: Iterable[Path]) -> dict[str, Path]:
    """``jars`` keyed by their release, newest first (the order ``build_table`` merges in)."""
    found = {jar_release(jar): jar for jar in jars}
    return dict(sorted(found.items(), key=lambda kv: [int(p) for p in kv[0].split(".")], reverse=True))


def render(table: Json) -> str:
    # One message per line keeps diffs of the committed table readable and the file compact.
    lines = ["{", f'"format": {json.dumps(table["format"])},']
    lines.append(f'"sources": {json.dumps(table["sources"], sort_keys=True)},')
    lines.append('"messages": [')
    rendered = [json.dumps(m, separators=(",", ":")) for m in table["messages"]]
    lines.append(",\n".join(rendered))
    lines.append("]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return write_or_check(
        argv,
        path=TABLE_PATH,
        generate=lambda jars: render(build_table(by_release(jars))),
        command="python -m codec.generator",
        description=__doc__,
        errors=(SpecError, OSError),
        inputs="the kafka-clients jars of the pinned releases (python -m deploy.fetch --clients-jars)",
    )


if __name__ == "__main__":
    raise SystemExit(main())
