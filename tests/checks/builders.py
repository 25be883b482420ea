"""Build realistic frame sequences for the checker tests, through the real codec (encode, then decode)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import codec
from codec.taprecord import TapFrame

SECOND = 1_000_000_000


@dataclass
class Conversation:
    """One client connection through the tap: numbers seqs, correlation ids and tap offsets for you."""

    conn: str = "tap1-c1"
    client: str = "10.0.0.5:51000"
    broker: str = "127.0.0.1:9092"
    broker_id: int | None = 1
    listener: str | None = "PLAINTEXT"
    client_id: str = "app"
    partition: int = 0
    seq: int = 0
    corr: int = 0
    offsets: list[int] = field(default_factory=lambda: [0])
    #: The tap's count of this connection's lost records, stamped on every frame (``TapFrame.lost``).
    lost: int = 0

    def _next_offset(self) -> int:
        self.offsets[0] += 1
        return self.offsets[0]

    def _frame(self, direction: str, ts_ns: int, **kw: Any) -> TapFrame:
        frame = TapFrame(
            conn=self.conn,
            seq=self.seq,
            ts_ns=ts_ns,
            direction=direction,
            client=self.client,
            broker=self.broker,
            broker_id=self.broker_id,
            listener=self.listener,
            partition=self.partition,
            offset=self._next_offset(),
            lost=self.lost,
            **kw,
        )
        self.seq += 1
        return frame

    def lose(self, records: int) -> None:
        """The tap loses the next ``records`` records of this connection (its mirror queue is full):
        their numbers leave a gap, and every later frame says how many were lost."""
        self.seq += records
        self.lost += records

    def open(self, ts_ns: int) -> TapFrame:
        return self._frame("open", ts_ns)

    def close(self, ts_ns: int) -> TapFrame:
        return self._frame("close", ts_ns)

    def request(self, api_key: int, version: int, body: dict[str, Any], ts_ns: int) -> TapFrame:
        self.corr += 1
        raw = codec.encode_request(api_key, version, self.corr, self.client_id, body)
        message = codec.decode_request(raw)
        return self._frame(
            "req",
            ts_ns,
            api_key=api_key,
            api_version=version,
            correlation_id=self.corr,
            message=message,
            raw=raw,
        )

    def response(self, request: TapFrame, body: dict[str, Any], ts_ns: int) -> TapFrame:
        assert (
            request.api_key is not None
            and request.api_version is not None
            and request.correlation_id is not None
        )
        raw = codec.encode_response(request.api_key, request.api_version, request.correlation_id, body)
        message = codec.decode_response(raw, request.api_key, request.api_version, request=request.request)
        return self._frame(
            "resp",
            ts_ns,
            api_key=request.api_key,
            api_version=request.api_version,
            correlation_id=request.correlation_id,
            message=message,
            raw=raw,
        )

    def garbage(self, direction: str, data: bytes, ts_ns: int) -> TapFrame:
        try:
            message = codec.decode_request(data) if direction == "req" else None
            error = None
        except codec.DecodeError as exc:
            message, error = None, exc
        # As ingest does: a decodable request names its api, version and correlation id.
        ids = (
            {
                "api_key": message.api_key,
                "api_version": message.api_version,
                "correlation_id": message.correlation_id,
            }
            if message is not None
            else {}
        )
        return self._frame(direction, ts_ns, message=message, error=error, raw=data, **ids)

    def undecodable_request(self, api_key: int, version: int, body: bytes, ts_ns: int) -> TapFrame:
        """A request whose header is sound (header v1: api key, version, correlation id, client id) and
        whose body the codec cannot read, tagged as the tap tags it (api key and version from the
        frame's first bytes), with the DecodeError kept on the frame as ingest does."""
        self.corr += 1
        cid = self.client_id.encode()
        data = struct.pack(">hhih", api_key, version, self.corr, len(cid)) + cid + body
        try:
            codec.decode_request(data)
        except codec.DecodeError as exc:
            error = exc
        else:
            raise AssertionError("the codec decoded the body meant to be undecodable")
        ids = {"api_key": api_key, "api_version": version, "correlation_id": self.corr}
        return self._frame("req", ts_ns, error=error, raw=data, **ids)

    def header_only_request(self, api_key: int, version: int, ts_ns: int) -> TapFrame:
        """A request mirrored without its body (``meta`` capture): only the tap's header fields."""
        self.corr += 1
        ids = {"api_key": api_key, "api_version": version, "correlation_id": self.corr}
        return self._frame("req", ts_ns, capture="meta", **ids)

    def raw_response(self, request: TapFrame, data: bytes, ts_ns: int) -> TapFrame:
        """A response frame from raw bytes, decoded as ingest does (the error kept on the frame)."""
        assert request.api_key is not None and request.api_version is not None
        try:
            message = codec.decode_response(
                data, request.api_key, request.api_version, request=request.request
            )
            error = None
        except codec.DecodeError as exc:
            message, error = None, exc
        return self._frame(
            "resp",
            ts_ns,
            api_key=request.api_key,
            api_version=request.api_version,
            correlation_id=request.correlation_id,
            message=message,
            error=error,
            raw=data,
        )

    def exchange(
        self, api_key: int, version: int, req: dict[str, Any], resp: dict[str, Any], ts_ns: int
    ) -> list[TapFrame]:
        request = self.request(api_key, version, req, ts_ns)
        return [request, self.response(request, resp, ts_ns + 1_000_000)]


def shared_offsets(*conversations: Conversation) -> None:
    """Make conversations number tap offsets from one counter (one tap partition)."""
    counter = conversations[0].offsets
    for conv in conversations[1:]:
        conv.offsets = counter


def arrival_order(frames: list[TapFrame], jitters: list[int]) -> list[TapFrame]:
    """Reorder frames as a tap could deliver them: each delayed by its jitter (ns, below the watermark),
    each connection's in the order given.

    A frame delayed by less than the watermark never arrives after the watermark passed it, so the
    monitor must produce the same findings for any such order.
    """
    delays = jitters + [0] * (len(frames) - len(jitters))
    order = sorted(range(len(frames)), key=lambda i: (frames[i].ts_ns + delays[i], i))
    # One connection's records share a tap partition, which keeps them in the order the tap wrote
    # them: the jitter reorders connections, never one connection's frames.
    mine: dict[str, list[TapFrame]] = {}
    for frame in frames:
        mine.setdefault(frame.conn, []).append(frame)
    cursor = {conn: iter(own) for conn, own in mine.items()}
    return [next(cursor[frames[i].conn]) for i in order]
