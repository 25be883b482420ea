"""A connection's tap-record entries, gathered into one schema-3 record per flush (sans-I/O).

The tap writes a connection's exchanges, lone frames and lifecycle events as *entries*, each with its
own ``seq``, and packs the entries gathered since the last flush into one record
(``codec.taprecord.pack_flush``, by the caller): the connection's metadata once per record, and one ``produce()``,
one delivery and one appended record on the tap-topic cluster per flush instead of per exchange.
A flush is due when the entries reach a size, a count or an age bound (``FlushLimits``), and at once
when the connection closes (its ``close`` entry last) or the tap stops. The age bound is what the
gathering adds to alert latency; client traffic never waits for it (the tap forwards first).

The caller passes the clock and arms a timer for ``due_ns``; ``FlushBuffer`` never reads a clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from codec.taprecord import Entry, Part

#: What the msgpack metadata of one entry and one part costs at most, beside the parts' bytes: enough
#: to keep a flush of ``max_bytes`` of payload under the mirror producer's ``message.max.bytes``.
_ENTRY_OVERHEAD = 16
_PART_OVERHEAD = 64


@dataclass(frozen=True, slots=True)
class FlushLimits:
    """When a connection's gathered entries are written as one record (``tap.flush_*`` settings)."""

    #: Payload bytes gathered: a record stays well under the producer's 1.1 MB ``message.max.bytes``.
    max_bytes: int = 256 * 1024
    #: Entries gathered (exchanges, lone frames, lifecycle events).
    max_entries: int = 64
    #: Age of the oldest gathered entry: what the tap adds to alert latency, at most.
    max_age_ns: int = 50_000_000


class FlushBuffer:
    """The entries of one connection since its last flush. It hands back the entries of each record
    that is due, and the caller packs them (``pack_flush``) with the loss count as of that moment, so
    a record refused just before another still counts in the next one's ``lost``."""

    __slots__ = ("_bytes", "_entries", "_first_ns", "_limits")

    def __init__(self, limits: FlushLimits) -> None:
        self._limits = limits
        self._entries: list[Entry] = []
        self._bytes = 0
        self._first_ns = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def due_ns(self) -> int | None:
        """When the oldest gathered entry reaches the age bound (None while nothing is gathered)."""
        return self._first_ns + self._limits.max_age_ns if self._entries else None

    def add(self, kind: str, seq: int, parts: Sequence[Part], now_ns: int) -> list[list[Entry]]:
        """Gather one entry; the entries of the records now due, oldest first (none, or one or two
        when a bound was reached)."""
        size = sum(len(p.value or b"") + _PART_OVERHEAD for p in parts) + _ENTRY_OVERHEAD
        out: list[list[Entry]] = []
        limits = self._limits
        if self._entries and (
            self._bytes + size > limits.max_bytes or now_ns >= self._first_ns + limits.max_age_ns
        ):
            # The entry would overfill the record, or the record is due anyway: it goes first.
            out.append(self._take())
        if not self._entries:
            self._first_ns = now_ns
        self._entries.append((kind, seq, parts))
        self._bytes += size
        if len(self._entries) >= limits.max_entries or self._bytes >= limits.max_bytes:
            out.append(self._take())
        return out

    def take(self) -> list[Entry]:
        """Everything gathered (the age bound passed, the connection closed, the tap stops)."""
        return self._take() if self._entries else []

    def _take(self) -> list[Entry]:
        entries, self._entries, self._bytes = self._entries, [], 0
        return entries
