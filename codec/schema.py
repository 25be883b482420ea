"""The schema table as typed objects: which fields a message has at a given version, and how they are encoded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

TABLE_PATH = Path(__file__).with_name("schema_table.json")

Range = tuple[int, int]

#: Fixed-width primitive types → struct format character.
FIXED_FORMATS = {
    "int8": "b",
    "int16": "h",
    "uint16": "H",
    "int32": "i",
    "uint32": "I",
    "int64": "q",
    "float64": "d",
    "bool": "?",
}
FIXED_SIZES = {"b": 1, "h": 2, "H": 2, "i": 4, "I": 4, "q": 8, "d": 8, "?": 1}


def _range(value: list[int] | None) -> Range | None:
    return (value[0], value[1]) if value is not None else None


def _within(rng: Range | None, version: int) -> bool:
    return rng is not None and rng[0] <= version <= rng[1]


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: str
    versions: Range | None
    nullable: Range | None
    tagged: Range | None
    tag: int | None
    #: A field-level flexibility override: None = follow the message, () = never flexible.
    flexible_override: Range | tuple[()] | None
    default: Any
    has_default: bool
    map_key: bool
    fields: tuple[FieldSpec, ...] | None

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def element(self) -> str:
        return self.type[2:] if self.is_array else self.type

    @property
    def is_struct(self) -> bool:
        return self.fields is not None

    def present(self, version: int) -> bool:
        return _within(self.versions, version)

    def nullable_at(self, version: int) -> bool:
        return _within(self.nullable, version)

    def tagged_at(self, version: int) -> bool:
        return _within(self.tagged, version)

    def flexible_at(self, version: int, message_flexible: bool) -> bool:
        if self.flexible_override is None:
            return message_flexible
        if self.flexible_override == ():
            return False
        return message_flexible and _within(self.flexible_override, version)  # type: ignore[arg-type]

    @staticmethod
    def from_json(raw: dict[str, Any]) -> FieldSpec:
        flex = raw.get("flexibleVersions")
        override: Range | tuple[()] | None
        if flex is None:
            override = None
        elif flex == "none":
            override = ()
        else:
            override = (flex[0], flex[1])
        return FieldSpec(
            name=raw["name"],
            type=raw["type"],
            versions=_range(raw.get("versions")),
            nullable=_range(raw.get("nullableVersions")),
            tagged=_range(raw.get("taggedVersions")),
            tag=raw.get("tag"),
            flexible_override=override,
            default=raw.get("default"),
            has_default="default" in raw,
            map_key=bool(raw.get("mapKey")),
            fields=tuple(FieldSpec.from_json(f) for f in raw["fields"]) if "fields" in raw else None,
        )


@dataclass(frozen=True)
class Segment:
    """The definition of a message for a contiguous range of versions, from one Kafka release."""

    release: str
    valid: Range
    flexible: Range | None
    fields: tuple[FieldSpec, ...]
    unstable_latest: bool

    def flexible_at(self, version: int) -> bool:
        return _within(self.flexible, version)


@dataclass(frozen=True)
class MessageSpec:
    name: str
    type: str
    api_key: int | None
    segments: tuple[Segment, ...]

    @property
    def min_version(self) -> int:
        return min(s.valid[0] for s in self.segments)

    @property
    def max_version(self) -> int:
        return max(s.valid[1] for s in self.segments)

    def segment(self, version: int) -> Segment | None:
        for seg in self.segments:
            if seg.valid[0] <= version <= seg.valid[1]:
                return seg
        return None

    def versions(self) -> list[int]:
        return sorted(v for s in self.segments for v in range(s.valid[0], s.valid[1] + 1))


@dataclass(frozen=True)
class SchemaTable:
    sources: dict[str, Any]
    by_name: dict[str, MessageSpec]
    requests: dict[int, MessageSpec]
    responses: dict[int, MessageSpec]

    def api_name(self, api_key: int) -> str:
        spec = self.requests.get(api_key)
        return spec.name.removesuffix("Request") if spec else f"Unknown{api_key}"


@cache
def load_table(path: Path = TABLE_PATH) -> SchemaTable:
    raw = json.loads(path.read_text())
    by_name: dict[str, MessageSpec] = {}
    requests: dict[int, MessageSpec] = {}
    responses: dict[int, MessageSpec] = {}
    for message in raw["messages"]:
        spec = MessageSpec(
            name=message["name"],
            type=message["type"],
            api_key=message.get("apiKey"),
            segments=tuple(
                Segment(
                    release=seg["release"],
                    valid=(seg["validVersions"][0], seg["validVersions"][1]),
                    flexible=_range(seg["flexibleVersions"]),
                    fields=tuple(FieldSpec.from_json(f) for f in seg["fields"]),
                    unstable_latest=bool(seg.get("latestVersionUnstable")),
                )
                for seg in message["segments"]
            ),
        )
        by_name[spec.name] = spec
        if spec.type == "request" and spec.api_key is not None:
            requests[spec.api_key] = spec
        elif spec.type == "response" and spec.api_key is not None:
            responses[spec.api_key] = spec
    return SchemaTable(sources=raw["sources"], by_name=by_name, requests=requests, responses=responses)
