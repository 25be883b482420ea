"""A decoded frame: the ``Request`` and ``Response`` values the codec returns (``codec.api``) and the
nested payloads hold (``codec.nested``).

Both are built for every decoded frame and copied for every routed one, so they write out their
``__init__`` (mypyc compiles a written one; the one ``dataclass`` generates runs as Python) and copy
themselves (``with_body``) instead of going through ``copy`` or ``dataclasses.replace``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from codec.schema import load_table


@dataclass(init=False)
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
    #: ``_unknown_tags``/``_tag_anomalies`` keys somewhere in the message, its decoded nested payloads
    #: included, and the sections a projected decode skips); None when not known (nested payloads that
    #: wait for the request, ``codec.api._waits_for_request``; a message restored from facts).
    tag_extras: bool | None = field(default=None, compare=False)

    def __init__(
        self,
        api_key: int,
        api_version: int,
        correlation_id: int,
        client_id: str | None,
        header: dict[str, Any],
        body: dict[str, Any],
        header_version: int,
        tag_extras: bool | None = None,
    ) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id = client_id
        self.header = header
        self.body = body
        self.header_version = header_version
        self.tag_extras = tag_extras

    @property
    def api_name(self) -> str:
        return load_table().api_name(self.api_key)

    def with_body(self, body: dict[str, Any]) -> Request:
        """This request with ``body`` in place of its own (the header is shared, not copied)."""
        return Request(
            self.api_key,
            self.api_version,
            self.correlation_id,
            self.client_id,
            self.header,
            body,
            self.header_version,
            self.tag_extras,
        )


@dataclass(init=False)
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

    def __init__(
        self,
        api_key: int,
        api_version: int,
        correlation_id: int,
        header: dict[str, Any],
        body: dict[str, Any],
        header_version: int,
        requested_version: int = -1,
        tag_extras: bool | None = None,
    ) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.header = header
        self.body = body
        self.header_version = header_version
        self.requested_version = requested_version
        self.tag_extras = tag_extras

    @property
    def api_name(self) -> str:
        return load_table().api_name(self.api_key)

    def with_body(self, body: dict[str, Any]) -> Response:
        """This response with ``body`` in place of its own (the header is shared, not copied)."""
        return Response(
            self.api_key,
            self.api_version,
            self.correlation_id,
            self.header,
            body,
            self.header_version,
            self.requested_version,
            self.tag_extras,
        )
