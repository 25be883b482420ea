"""A decoded frame: the ``Request`` and ``Response`` values the codec returns (``codec.api``) and the
nested payloads hold (``codec.nested``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from codec.schema import load_table


@dataclass
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    #: Every header field, including tagged ones (``_unknown_tags`` for tags this codec does not know).
    header: dict[str, Any]
    body: dict[str, Any]
    header_version: int
    #: Whether some tagged section of the header or body held unknown tags or anomalies (the
    #: ``_unknown_tags``/``_tag_anomalies`` keys somewhere in the message), as the decode saw it; None
    #: when not known (nested payloads, which may be decoded later; a message restored from facts).
    tag_extras: bool | None = field(default=None, compare=False)

    @property
    def api_name(self) -> str:
        return load_table().api_name(self.api_key)


@dataclass
class Response:
    api_key: int
    #: The version the body was decoded with; an ApiVersions error-35 answer is decoded (and re-encoded) as v0.
    api_version: int
    correlation_id: int
    header: dict[str, Any]
    body: dict[str, Any]
    header_version: int
    requested_version: int = field(default=-1)
    #: As ``Request.tag_extras``.
    tag_extras: bool | None = field(default=None, compare=False)

    @property
    def api_name(self) -> str:
        return load_table().api_name(self.api_key)
