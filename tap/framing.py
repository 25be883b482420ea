"""Sans-I/O frame boundary tracking and request/response correlation for the tap's hot path.

The tap forwards every byte as soon as it arrives; this module only watches the stream go by.
It finds the 4-byte size prefixes, keeps at most ``retain`` bytes of each frame (what mirroring
needs), and reports each frame once its last byte has passed. A 100 MB produce request therefore
costs the tap ``retain`` bytes of memory, not 100 MB.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final, NamedTuple

import codec.peek
from codec.errors import DecodeError
from codec.protocol import ApiKey
from codec.taprecord import Part
from tap.capture import FrameInfo, header_end

_INT32 = struct.Struct(">i")

#: Kafka's own default cap is socket.request.max.bytes = 100 MiB; responses (fetch) can be larger,
#: so the tap only refuses sizes no Kafka peer can mean.
DEFAULT_MAX_FRAME = 1 << 30


def starts_with_tls(data: bytes | bytearray | memoryview) -> bool:
    """Whether a stream's first bytes are a TLS record header (content type 20-23, version 3.x) rather
    than a Kafka size prefix. As a size those bytes would read 335 MB or more, far past any broker's
    ``socket.request.max.bytes``, so a Kafka stream never starts this way."""
    return len(data) >= 3 and 0x14 <= data[0] <= 0x17 and data[1] == 0x03 and data[2] <= 0x04


class FrameError(ValueError):
    """The stream is not Kafka framing (negative or absurd size); the connection must be closed."""


class WireFrame(NamedTuple):
    """A frame as it passed on the wire: its announced size and the bytes kept of it (not decoded)."""

    #: The frame's size as announced by its prefix (bytes after the prefix).
    size: int
    #: The first ``min(size, retain)`` bytes of the frame, without the size prefix.
    head: bytes

    @property
    def complete(self) -> bool:
        return len(self.head) == self.size


#: Bytes kept of a frame too large to be mirrored whole: it is mirrored as its header (capture.py),
#: and no Kafka request or response header comes near this (a client id is at most 32 KiB).
HEAD_BYTES = 65_536


class FrameSplitter:
    """Incremental splitter: ``feed(chunk)`` returns the frames that ended inside ``chunk``.

    A frame of at most ``retain`` bytes is kept whole; of a larger one only its first
    ``min(retain, head)`` bytes, since it can only be mirrored as its header. A kept frame costs one
    copy: a frame inside one chunk is sliced out of it; a frame spanning chunks is gathered as views
    of them (``bytes`` chunks are immutable, so a view stays valid) and joined once it is complete.
    """

    __slots__ = ("_head", "_keep", "_max", "_parts", "_prefix", "_remaining", "_retain", "_size")

    def __init__(self, retain: int, max_frame: int = DEFAULT_MAX_FRAME, head: int = HEAD_BYTES) -> None:
        self._retain = retain
        self._head = head
        self._max = max_frame
        self._prefix = bytearray()  # a size prefix split across chunks
        self._size = -1  # size of the frame being read; -1 while reading a prefix
        self._remaining = 0
        self._keep = 0  # bytes of the current frame still to keep
        self._parts: list[bytes | memoryview] = []

    @property
    def mid_frame(self) -> bool:
        """True when the stream stopped inside a frame (or a size prefix)."""
        return self._size >= 0 or bool(self._prefix)

    def set_retain(self, retain: int) -> None:
        self._retain = retain

    def feed(self, data: bytes | bytearray | memoryview) -> list[WireFrame]:
        out: list[WireFrame] = []
        view = memoryview(data)
        # Views into a caller's mutable buffer would change under us: those parts are copied.
        stable = isinstance(data, bytes)
        pos = 0
        end = len(view)
        while pos < end:
            if self._size < 0:
                if self._prefix or end - pos < 4:
                    need = 4 - len(self._prefix)
                    self._prefix += view[pos : pos + need]
                    pos += min(need, end - pos)
                    if len(self._prefix) < 4:
                        break
                    size = _INT32.unpack(self._prefix)[0]
                    self._prefix.clear()
                else:
                    size = _INT32.unpack_from(view, pos)[0]
                    pos += 4
                if size < 0 or size > self._max:
                    raise FrameError(f"frame size {size} outside 0..{self._max}")
                if size == 0:
                    out.append(WireFrame(0, b""))
                    continue
                keep = size if size <= self._retain else min(self._retain, self._head)
                if end - pos >= size:
                    # The whole frame is in this chunk: one slice, no gathering.
                    out.append(WireFrame(size, bytes(view[pos : pos + keep])))
                    pos += size
                    continue
                self._size = size
                self._remaining = size
                self._keep = keep
            take = min(self._remaining, end - pos)
            if self._keep > 0:
                kept = min(self._keep, take)
                part = view[pos : pos + kept]
                self._parts.append(part if stable else bytes(part))
                self._keep -= kept
            pos += take
            self._remaining -= take
            if self._remaining == 0:
                out.append(WireFrame(self._size, b"".join(self._parts)))
                self._parts.clear()
                self._size = -1
        return out


@dataclass(slots=True)
class Pending:
    api_key: int
    api_version: int
    #: Monotonic ns when the request's last byte was forwarded to the broker.
    forwarded_ns: int
    #: The response must be mirrored header-only (e.g. an Envelope around a secret-bearing request).
    sensitive: bool = False
    #: The request as it will be mirrored, held until its response completes the exchange record
    #: (None: not held, or already written alone).
    held: Part | None = None
    #: Bytes ``held`` counts against the bounds.
    held_bytes: int = 0


def expects_response(head: bytes, api_key: int, api_version: int) -> bool:
    """Whether a broker answers this request: every request but a Produce with acks=0. The tap (and
    every builder of tap records) writes an unanswered request alone at once instead of holding it."""
    if api_key != ApiKey.PRODUCE:
        return True
    try:
        body = header_end(head, FrameInfo("req", len(head), api_key, api_version))
    except DecodeError:
        return True
    return codec.peek.peek_produce_acks(head, api_version, body) != 0


#: Why a frame went out as a record of its own instead of in an exchange (``Unpaired.reason``).
LONE_REASONS: tuple[str, ...] = (
    "no_response",
    "unanswered",
    "in_flight_cap",
    "held_bytes",
    "held_age",
    "closed",
)


@dataclass(frozen=True, slots=True)
class Unpaired:
    """A held request written alone: its exchange could not be completed, or a bound was hit."""

    held: Part
    reason: str


class HeldBudget:
    """Bytes of held requests, shared by every connection of a tap: the bound on the whole tap."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


@dataclass(frozen=True, slots=True)
class HoldLimits:
    """Bounds on the requests a connection holds while their responses are due."""

    #: In-flight requests per connection (Kafka clients pipeline at most a handful).
    max_in_flight: int = 1_000
    #: Held bytes per connection.
    max_bytes: int = 8 * 1024 * 1024
    #: How long a request is held before it is written alone (its response may still come).
    max_age_ns: int = 30_000_000_000
    #: ...and a JoinGroup, which the coordinator answers only when the rebalance completes, up to the
    #: group's rebalance timeout (a consumer's ``max.poll.interval.ms``, 300 s by default). Written alone
    #: sooner, its answer would pair with nothing: a reader that sees records a batch at a time cannot
    #: pair two lone records, so none does (``TapFrame.lone``), and the group rules would miss it.
    max_rebalance_age_ns: int = 330_000_000_000


#: Requests held up to ``HoldLimits.max_rebalance_age_ns`` instead of ``max_age_ns``.
REBALANCE_WAITS: Final = frozenset({ApiKey.JOIN_GROUP})


class Correlations:
    """Per-connection map of in-flight requests: each response gets its request's API and version, and
    the request frame held for the exchange record (sans-I/O: the caller writes what it is handed).

    A broker answers one connection's requests in order, and never answers an acks=0 produce; so when
    a response arrives, entries queued before its correlation id are orphans and are dropped (their
    held frames handed back, reason ``unanswered``). Every bound hands held frames back rather than
    losing them: the in-flight count (the oldest entry is evicted), the connection's held bytes and the
    tap's (``HeldBudget``), and the age of a held frame (``expire``).
    """

    __slots__ = ("_budget", "_bytes", "_limits", "_next", "_pending")

    def __init__(self, limits: HoldLimits | None = None, budget: HeldBudget | None = None) -> None:
        self._pending: OrderedDict[int, tuple[int, Pending]] = OrderedDict()
        self._limits = limits or HoldLimits()
        self._budget = budget or HeldBudget(1 << 62)
        self._bytes = 0
        self._next = 0

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def add(self, corr: int, pending: Pending) -> list[Unpaired]:
        """Track a request; hold ``pending.held`` while the bounds allow. Returns what must be written
        alone now: evicted or displaced entries' frames, or this request's own when it cannot be held."""
        out: list[Unpaired] = []
        self._next += 1
        old = self._pending.pop(corr, None)  # a reused id moves to the back: it is the newest request
        if old is not None:
            self._release(old[1], "unanswered", out)
        held = pending.held
        if held is not None:
            size = len(held.value or b"")
            limits = self._limits
            while self._bytes + size > limits.max_bytes and self._release_oldest_held(out, "held_bytes"):
                pass
            if self._bytes + size > limits.max_bytes or not self._budget.take(size):
                pending.held = None
                out.append(Unpaired(held, "held_bytes"))
            else:
                pending.held_bytes = size
                self._bytes += size
        self._pending[corr] = (self._next, pending)
        if len(self._pending) > self._limits.max_in_flight:
            _, (_, evicted) = self._pending.popitem(last=False)
            self._release(evicted, "in_flight_cap", out)
        return out

    def peek(self, corr: int) -> Pending | None:
        entry = self._pending.get(corr)
        return None if entry is None else entry[1]

    def match(self, corr: int) -> tuple[Pending | None, list[Unpaired]]:
        """The request ``corr`` answers (its held frame, in ``held``, is the caller's now and no longer
        counted), and the older requests that will never be answered."""
        entry = self._pending.pop(corr, None)
        if entry is None:
            return None, []
        order, found = entry
        orphans: list[Unpaired] = []
        # Responses come in request order: anything older than this one will never be answered.
        while self._pending:
            oldest_corr, (oldest_order, oldest) = next(iter(self._pending.items()))
            if oldest_order > order:
                break
            del self._pending[oldest_corr]
            self._release(oldest, "unanswered", orphans)
        if found.held is not None:
            # No longer counted against the bounds; the caller takes the frame from ``found.held``.
            self._bytes -= found.held_bytes
            self._budget.give(found.held_bytes)
            found.held_bytes = 0
        return found, orphans

    def expire(self, now_ns: int) -> list[Unpaired]:
        """Held frames older than the age bound, handed back (their entries stay, so a late response
        still gets its API and version)."""
        out: list[Unpaired] = []
        cutoff = now_ns - self._limits.max_age_ns
        rebalance_cutoff = now_ns - self._limits.max_rebalance_age_ns
        for _, pending in self._pending.values():
            if pending.api_key in REBALANCE_WAITS:
                if pending.forwarded_ns > rebalance_cutoff:
                    continue
            elif pending.forwarded_ns > cutoff:
                # Entries are in the order they were forwarded: every later one is younger still.
                break
            if pending.held is not None:
                out.append(Unpaired(pending.held, "held_age"))
                self._unhold(pending)
        return out

    def drain(self) -> list[Unpaired]:
        """Every held frame, oldest first, and nothing tracked any more (the connection closed)."""
        out: list[Unpaired] = []
        for _, pending in self._pending.values():
            self._release(pending, "closed", out)
        self._pending.clear()
        return out

    def _unhold(self, pending: Pending) -> None:
        self._bytes -= pending.held_bytes
        self._budget.give(pending.held_bytes)
        pending.held = None
        pending.held_bytes = 0

    def _release(self, pending: Pending, reason: str, out: list[Unpaired]) -> None:
        held = pending.held
        if held is not None:
            self._unhold(pending)
            out.append(Unpaired(held, reason))

    def _release_oldest_held(self, out: list[Unpaired], reason: str) -> bool:
        for _, pending in self._pending.values():
            if pending.held is not None:
                self._release(pending, reason, out)
                return True
        return False


#: How many raw tokens each side sends after a SaslHandshake v0, per mechanism. The broker answers
#: every client token with one token. Unknown mechanisms (GSSAPI has a variable number of rounds)
#: stay in raw mode for the rest of the connection: the tap then never mirrors their content.
SASL_ROUNDS: dict[str, int] = {
    "PLAIN": 1,
    "OAUTHBEARER": 1,
    "SCRAM-SHA-256": 2,
    "SCRAM-SHA-512": 2,
}
FOREVER = 1 << 62


class SaslState:
    """Tracks the legacy (SaslHandshake v0) mode in which frames are raw SASL tokens, not requests."""

    __slots__ = ("_client_tokens", "_pending_mechanism", "_server_tokens")

    def __init__(self) -> None:
        self._client_tokens = 0  # raw client frames still expected
        self._server_tokens = 0  # raw server frames owed (one per client token)
        self._pending_mechanism: str | None = None

    def on_handshake_v0(self, mechanism: str | None) -> None:
        """A SaslHandshake v0 request went by; raw tokens follow its (successful) response."""
        self._pending_mechanism = mechanism or ""

    def on_handshake_response(self, error_code: int | None) -> None:
        mechanism = self._pending_mechanism
        self._pending_mechanism = None
        if mechanism is None:
            return
        if error_code == 0:
            self._client_tokens = SASL_ROUNDS.get(mechanism.upper(), FOREVER)

    def client_frame_is_token(self) -> bool:
        if self._client_tokens > 0:
            self._client_tokens -= 1
            self._server_tokens += 1
            return True
        return False

    def server_frame_is_token(self) -> bool:
        if self._server_tokens > 0:
            self._server_tokens -= 1
            return True
        return False
