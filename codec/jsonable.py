"""Render decoded values as JSON-compatible data (for the CLI, reports and logs).

bytes become lowercase hex strings; uuids their canonical string; record sets a list of batch headers;
embedded payloads their decoded value with the raw bytes alongside.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from codec.api import Request, Response
from codec.nested import EmbeddedRequest, EmbeddedResponse, VersionedData


def _batch(batch: Any) -> dict[str, Any]:
    to_dict = getattr(batch, "to_dict", None)
    if callable(to_dict):
        return {k: to_jsonable(v) for k, v in to_dict().items()}
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return {
            f.name: to_jsonable(getattr(batch, f.name)) for f in dataclasses.fields(batch) if f.name != "raw"
        }
    slots = getattr(type(batch), "__slots__", ())
    return {
        name: to_jsonable(getattr(batch, name)) for name in slots if name != "raw" and hasattr(batch, name)
    }


def to_jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, EmbeddedRequest):
        return {"request": message_to_jsonable(value.request) if value.request else None, **_error(value)}
    if isinstance(value, EmbeddedResponse):
        inner = message_to_jsonable(value.response) if value.response else None
        return {"response": inner, "raw": None if inner else value.raw.hex(), **_error(value)}
    if isinstance(value, VersionedData):
        return {"version": value.version, "value": to_jsonable(value.value), **_error(value)}
    if isinstance(value, Request | Response):
        return message_to_jsonable(value)
    batches = getattr(value, "batches", None)
    if batches is not None:
        return {"size": len(bytes(value)), "batches": [_batch(b) for b in batches]}
    return repr(value)


def _error(value: Any) -> dict[str, Any]:
    return {"error": str(value.error)} if value.error else {}


def message_to_jsonable(message: Request | Response) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "request" if isinstance(message, Request) else "response",
        "api_key": message.api_key,
        "api_name": message.api_name,
        "api_version": message.api_version,
        "correlation_id": message.correlation_id,
    }
    if isinstance(message, Request):
        out["client_id"] = message.client_id
    out["header_version"] = message.header_version
    out["header"] = to_jsonable(message.header)
    out["body"] = to_jsonable(message.body)
    return out
