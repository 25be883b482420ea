"""One record, as both formats of a ``records`` field hand it out: a magic-2 batch's records
(``codec.records``) and a legacy message set's messages (``codec.message_set``).
"""

from __future__ import annotations


class Record:
    """One record, with its batch's base offset and timestamp for absolute values (a legacy message:
    its own offset and timestamp, deltas 0)."""

    __slots__ = (
        "attributes",
        "base_offset",
        "base_timestamp",
        "headers",
        "key",
        "offset_delta",
        "timestamp_delta",
        "value",
    )

    def __init__(
        self,
        attributes: int,
        timestamp_delta: int,
        offset_delta: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
        base_offset: int = 0,
        base_timestamp: int = 0,
    ) -> None:
        self.attributes = attributes
        self.timestamp_delta = timestamp_delta
        self.offset_delta = offset_delta
        self.key = key
        self.value = value
        self.headers = headers
        self.base_offset = base_offset
        self.base_timestamp = base_timestamp

    @property
    def offset(self) -> int:
        return self.base_offset + self.offset_delta

    @property
    def timestamp(self) -> int:
        return self.base_timestamp + self.timestamp_delta

    def __repr__(self) -> str:
        return (
            f"Record(offset={self.offset}, key={self.key!r}, value={self.value!r}, headers={self.headers!r})"
        )
