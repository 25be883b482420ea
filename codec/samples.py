"""Random valid message bodies built from the schema table.

Used by the round-trip property tests, the differential test against Kafka's Java classes, the fuzz
tests and the benchmarks. Values stay small (short strings, arrays of up to ``max_items``) so thousands
of frames cost milliseconds, but every type, nullability, tagged field and unknown-tag path is reached.
"""

from __future__ import annotations

import random
import string
import uuid
from collections.abc import Callable
from typing import Any

from codec.api import request_spec, response_spec
from codec.schema import FieldSpec, MessageSpec

_TEXT = string.ascii_letters + string.digits + "._-é世"
_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
}

#: Builds a ``records`` value; the default makes empty or null record sets.
RecordsFactory = Callable[[random.Random], bytes | None]


class BodyBuilder:
    def __init__(
        self,
        rng: random.Random,
        max_items: int = 3,
        unknown_tags: bool = True,
        records: RecordsFactory | None = None,
    ) -> None:
        self.rng = rng
        self.max_items = max_items
        self.unknown_tags = unknown_tags
        self.records = records

    def body(self, spec: MessageSpec, version: int) -> dict[str, Any]:
        seg = spec.segment(version)
        if seg is None:
            raise ValueError(f"{spec.name} has no v{version}")
        return self.struct(seg.fields, version, seg.flexible_at(version), depth=0)

    def struct(
        self, fields: tuple[FieldSpec, ...], version: int, flexible: bool, depth: int
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        tags: set[int] = set()
        for f in fields:
            if not f.present(version):
                continue
            if f.tagged_at(version) and f.tag is not None:
                tags.add(f.tag)
            out[f.name] = self.value(f, version, flexible, depth)
        if flexible and self.unknown_tags and self.rng.random() < 0.15:
            base = max(tags, default=-1) + 1
            chosen = sorted(self.rng.sample(range(base, base + 40), self.rng.randint(1, 2)))
            out["_unknown_tags"] = {t: self.rng.randbytes(self.rng.randint(0, 4)) for t in chosen}
        return out

    def value(self, f: FieldSpec, version: int, flexible: bool, depth: int) -> Any:
        rng = self.rng
        nullable = f.nullable_at(version)
        if nullable and rng.random() < 0.2:
            return None
        if f.is_array:
            n = rng.randint(0, self.max_items if depth < 3 else 1)
            return [self.scalar(f, f.element, version, flexible, depth + 1) for _ in range(n)]
        return self.scalar(f, f.type, version, flexible, depth)

    def scalar(self, f: FieldSpec, type_name: str, version: int, flexible: bool, depth: int) -> Any:
        rng = self.rng
        if f.is_struct:
            return self.struct(f.fields or (), version, flexible, depth + 1)
        if type_name in _INT_RANGES:
            lo, hi = _INT_RANGES[type_name]
            pick = rng.random()
            if pick < 0.1:
                return lo
            if pick < 0.2:
                return hi
            if pick < 0.6:
                return rng.randint(max(lo, -2), min(hi, 100))
            return rng.randint(lo, hi)
        if type_name == "float64":
            return rng.choice([0.0, -1.5, 3.25, rng.uniform(-1e9, 1e9)])
        if type_name == "bool":
            return rng.random() < 0.5
        if type_name == "string":
            return "".join(rng.choice(_TEXT) for _ in range(rng.randint(0, 12)))
        if type_name == "bytes":
            return rng.randbytes(rng.randint(0, 16))
        if type_name == "uuid":
            return uuid.UUID(int=rng.getrandbits(128))
        if type_name == "records":
            return self.records(rng) if self.records else b""
        raise ValueError(f"unknown type {type_name}")


def random_request_body(api_key: int, version: int, rng: random.Random, **options: Any) -> dict[str, Any]:
    return BodyBuilder(rng, **options).body(request_spec(api_key), version)


def random_response_body(api_key: int, version: int, rng: random.Random, **options: Any) -> dict[str, Any]:
    return BodyBuilder(rng, **options).body(response_spec(api_key), version)
