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
from typing import NamedTuple

_INT32 = struct.Struct(">i")

#: Kafka's own default cap is socket.request.max.bytes = 100 MiB; responses (fetch) can be larger,
#: so the tap only refuses sizes no Kafka peer can mean.
DEFAULT_MAX_FRAME = 1 << 30


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


class FrameSplitter:
    """Incremental splitter: ``feed(chunk)`` returns the frames that ended inside ``chunk``."""

    __slots__ = ("_buf", "_max", "_prefix", "_remaining", "_retain", "_size")

    def __init__(self, retain: int, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._retain = retain
        self._max = max_frame
        self._prefix = bytearray()  # a size prefix split across chunks
        self._size = -1  # size of the frame being read; -1 while reading a prefix
        self._remaining = 0
        self._buf = bytearray()

    @property
    def mid_frame(self) -> bool:
        """True when the stream stopped inside a frame (or a size prefix)."""
        return self._size >= 0 or bool(self._prefix)

    def set_retain(self, retain: int) -> None:
        self._retain = retain

    def feed(self, data: bytes | bytearray | memoryview) -> list[WireFrame]:
        out: list[WireFrame] = []
        view = memoryview(data)
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
                self._size = size
                self._remaining = size
                self._buf = bytearray()
                if size == 0:
                    out.append(WireFrame(0, b""))
                    self._size = -1
                    continue
            take = min(self._remaining, end - pos)
            room = min(self._retain, self._size) - len(self._buf)
            if room > 0:
                self._buf += view[pos : pos + min(room, take)]
            pos += take
            self._remaining -= take
            if self._remaining == 0:
                out.append(WireFrame(self._size, bytes(self._buf)))
                self._size = -1
                self._buf = bytearray()
        return out


@dataclass(slots=True)
class Pending:
    api_key: int
    api_version: int
    #: Monotonic ns when the request's last byte was forwarded to the broker.
    forwarded_ns: int
    #: The response must be mirrored header-only (e.g. an Envelope around a secret-bearing request).
    sensitive: bool = False


class Correlations:
    """Per-connection map of in-flight requests, so each response gets its request's API and version.

    A broker answers one connection's requests in order, and never answers an acks=0 produce; so when
    a response arrives, entries queued before its correlation id are orphans and are dropped. The map
    is also capped, so a client that pipelines without end cannot grow it.
    """

    __slots__ = ("_cap", "_next", "_pending")

    def __init__(self, cap: int = 10_000) -> None:
        self._pending: OrderedDict[int, tuple[int, Pending]] = OrderedDict()
        self._cap = cap
        self._next = 0

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, corr: int, pending: Pending) -> None:
        self._next += 1
        self._pending.pop(corr, None)  # a reused id moves to the back: it is the newest request
        self._pending[corr] = (self._next, pending)
        if len(self._pending) > self._cap:
            self._pending.popitem(last=False)

    def peek(self, corr: int) -> Pending | None:
        entry = self._pending.get(corr)
        return None if entry is None else entry[1]

    def match(self, corr: int) -> Pending | None:
        entry = self._pending.pop(corr, None)
        if entry is None:
            return None
        order, found = entry
        # Responses come in request order: anything older than this one will never be answered.
        while self._pending:
            oldest_corr, (oldest_order, _) = next(iter(self._pending.items()))
            if oldest_order > order:
                break
            del self._pending[oldest_corr]
        return found


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
