"""Which body fields a rule reads: message bodies that record every field looked at.

``recording_exchange`` copies an exchange with its request and response bodies wrapped. A wrapped
struct records the dotted path of every field read through ``get``, ``[]`` or ``in``, and wraps what
it hands out, so nested reads are recorded under their full path (list elements share their list's
path, as in a codec projection). Reading a struct whole (``items``, ``values``, iteration) records
``<path>.*``: the projection must then keep that struct whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from checks.model import Exchange
from codec.api import request_spec, response_spec
from codec.schema import FieldSpec, MessageSpec
from codec.taprecord import TapFrame


class Reads:
    """The paths read, per (api key, "request" | "response")."""

    def __init__(self) -> None:
        self.paths: dict[tuple[int, str], set[str]] = {}

    def add(self, api_key: int, side: str, path: str) -> None:
        self.paths.setdefault((api_key, side), set()).add(path)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class RecordingDict(dict[str, Any]):
    def __init__(self, data: dict[str, Any], note: Any, prefix: str) -> None:
        super().__init__(data)
        self._note = note
        self._prefix = prefix

    def _wrap(self, name: str, value: Any) -> Any:
        return wrap(value, self._note, _join(self._prefix, name))

    def get(self, key: str, default: Any = None) -> Any:
        self._note(_join(self._prefix, key))
        if dict.__contains__(self, key):
            return self._wrap(key, dict.__getitem__(self, key))
        return default

    def __getitem__(self, key: str) -> Any:
        self._note(_join(self._prefix, key))
        return self._wrap(key, dict.__getitem__(self, key))

    def __contains__(self, key: object) -> bool:
        self._note(_join(self._prefix, str(key)))
        return dict.__contains__(self, key)

    def _whole(self) -> None:
        self._note(_join(self._prefix, "*"))

    def items(self) -> Any:
        self._whole()
        return [(k, self._wrap(k, v)) for k, v in dict.items(self)]

    def values(self) -> Any:
        self._whole()
        return [self._wrap(k, v) for k, v in dict.items(self)]

    def keys(self) -> Any:
        self._whole()
        return dict.keys(self)

    def __iter__(self) -> Iterator[str]:
        self._whole()
        return dict.__iter__(self)


class RecordingList(list[Any]):
    def __init__(self, data: list[Any], note: Any, prefix: str) -> None:
        super().__init__(wrap(v, note, prefix) for v in data)


def wrap(value: Any, note: Any, prefix: str) -> Any:
    if type(value) is dict:
        return RecordingDict(value, note, prefix)
    if type(value) is list:
        return RecordingList(value, note, prefix)
    return value


def _recording_frame(frame: TapFrame | None, reads: Reads, side: str) -> TapFrame | None:
    if frame is None or frame.message is None:
        return frame
    message = frame.message
    api_key = int(message.api_key)
    body = RecordingDict(message.body, lambda path: reads.add(api_key, side, path), "")
    return replace(frame, message=replace(message, body=body))


def recording_exchange(ex: Exchange, reads: Reads) -> Exchange:
    return Exchange(
        _recording_frame(ex.request, reads, "request"),  # type: ignore[arg-type]
        _recording_frame(ex.response, reads, "response"),
        ex.envelope,
    )


def field_names(spec: MessageSpec) -> set[str]:
    """Every field name of a message at any depth, in any version the schema table defines."""
    names: set[str] = set()

    def walk(fields: tuple[FieldSpec, ...] | None) -> None:
        for field in fields or ():
            names.add(field.name)
            walk(field.fields)

    for segment in spec.segments:
        walk(segment.fields)
    return names


def exists(api_key: int, side: str, path: str) -> bool:
    """Whether every name on ``path`` is a field of that message (a rule may look for a field some
    other message has, e.g. the pre-v13 Fetch ``Topic``; pruning cannot lose what is never there)."""
    spec = request_spec(api_key) if side == "request" else response_spec(api_key)
    return set(path.split(".")) - {"*"} <= field_names(spec)
