"""A stub broker and a synthetic client load, in one process, for tap_bench's ``scale`` mode.

The stub answers every request frame at once with a prebuilt response of the same API (its
correlation id patched in); the clients keep ``depth`` requests in flight on each connection and
count what comes back. Both only find frame boundaries, so per frame they cost a fraction of what
the tap spends (which peeks headers, correlates, counts and mirrors): with enough connections the
tap, not this process, is what saturates. Loads:

- ``produce``: Produce v9 requests, each one magic-2 batch of ``frame_kb`` 1 KiB records (acks=1),
  answered by a small Produce response;
- ``fetch``: small Fetch v16 requests answered by a Fetch response of ``frame_kb`` KiB of batches
  (the consume path).
"""

from __future__ import annotations

import asyncio
import os
import random
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import codec
from codec.records import build_record_batch
from codec.samples import random_request_body, random_response_body

_INT32 = struct.Struct(">i")


def _framed(payload: bytes) -> bytes:
    return _INT32.pack(len(payload)) + payload


def _batches(kib: int) -> bytes:
    batch = build_record_batch([(b"key", os.urandom(1000)) for _ in range(16)])
    return batch * max(1, kib * 1024 // len(batch))


def exchange(load: str, frame_kb: int) -> tuple[bytes, bytes]:
    """(request, response) of ``load``, each with its size prefix; correlation id 0."""
    rng = random.Random(27)
    if load == "produce":
        batch = build_record_batch([(b"key", os.urandom(1000)) for _ in range(max(1, frame_kb))])
        request = {
            "TransactionalId": None,
            "Acks": 1,
            "TimeoutMs": 30_000,
            "TopicData": [{"Name": "bench", "PartitionData": [{"Index": 0, "Records": batch}]}],
        }
        response = random_response_body(0, 9, rng)
        response["ThrottleTimeMs"] = 0
        response["Responses"] = [
            {
                "Name": "bench",
                "PartitionResponses": [
                    {
                        "Index": 0,
                        "ErrorCode": 0,
                        "BaseOffset": 1,
                        "LogAppendTimeMs": -1,
                        "LogStartOffset": 0,
                        "RecordErrors": [],
                        "ErrorMessage": None,
                    }
                ],
            }
        ]
        return (
            _framed(codec.encode_request(0, 9, 0, "tap-bench", request)),
            _framed(codec.encode_response(0, 9, 0, response)),
        )
    if load == "fetch":
        body = random_response_body(1, 16, rng)
        body.update(ThrottleTimeMs=0, ErrorCode=0, SessionId=0, NodeEndpoints=[])
        topic = body["Responses"][0] if body["Responses"] else {"_unknown_tags": {}}
        partition = random_response_body(1, 16, random.Random(1))["Responses"][0]["Partitions"][0]
        partition.update(ErrorCode=0, AbortedTransactions=None, PreferredReadReplica=-1)
        partition["Records"] = _batches(frame_kb)
        body["Responses"] = [{**topic, "TopicId": uuid.UUID(int=27), "Partitions": [partition]}]
        return (
            _framed(codec.encode_request(1, 16, 0, "tap-bench", random_request_body(1, 16, rng))),
            _framed(codec.encode_response(1, 16, 0, body)),
        )
    raise ValueError(f"unknown load {load!r}")


class _Frames:
    """Frame boundaries of a byte stream, without keeping the frames."""

    __slots__ = ("_left", "_prefix")

    def __init__(self) -> None:
        self._prefix = b""
        self._left = 0  # bytes of the current frame still to come

    def feed(self, data: bytes) -> list[int]:
        """The offsets in ``data`` where a frame begins after its 4-byte prefix, for complete frames
        (offset -1 for a frame whose header began in an earlier chunk)."""
        done: list[int] = []
        pos, end = 0, len(data)
        while pos < end:
            if self._left:
                take = min(self._left, end - pos)
                self._left -= take
                pos += take
                if not self._left:
                    done.append(-1)
                continue
            if self._prefix or end - pos < 4:
                need = 4 - len(self._prefix)
                self._prefix += data[pos : pos + need]
                pos += min(need, end - pos)
                if len(self._prefix) < 4:
                    break
                size = _INT32.unpack(self._prefix)[0]
                self._prefix = b""
            else:
                size = _INT32.unpack_from(data, pos)[0]
                pos += 4
            if end - pos >= size:
                done.append(pos)
                pos += size
            else:
                self._left = size - (end - pos)
                pos = end
        return done


class StubBroker(asyncio.Protocol):
    """Answers each request frame with ``response`` (correlation id copied from the request)."""

    def __init__(self, response: bytes) -> None:
        self.response_head = response[:4]
        self.response_tail = response[8:]
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        # Requests are small and whole frames are answered; a partial one waits for the rest.
        buf = self.buffer + data if self.buffer else data
        out: list[bytes] = []
        pos = 0
        while len(buf) - pos >= 4:
            size = _INT32.unpack_from(buf, pos)[0]
            if len(buf) - pos - 4 < size:
                break
            out += (self.response_head, buf[pos + 8 : pos + 12], self.response_tail)
            pos += 4 + size
        self.buffer = buf[pos:]
        if out and self.transport is not None:
            self.transport.writelines(out)


@dataclass
class LoadStats:
    frames: int = 0  # responses received (each one exchange: two frames through the tap)
    bytes: int = 0  # request and response bytes through the tap
    started: float = field(default_factory=time.monotonic)


class LoadClient(asyncio.Protocol):
    """Keeps ``depth`` requests in flight; a new one goes out for each response that completes."""

    def __init__(self, request: bytes, depth: int, stats: LoadStats) -> None:
        self.request = request
        self.depth = depth
        self.stats = stats
        self.frames = _Frames()
        self.transport: asyncio.Transport | None = None
        self.stopping = False
        self.corr = 0

    def _requests(self, n: int) -> list[bytes]:
        out: list[bytes] = []
        for _ in range(n):
            self.corr += 1
            out += (self.request[:8], _INT32.pack(self.corr), self.request[12:])
        return out

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.writelines(self._requests(self.depth))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        done = len(self.frames.feed(data))
        self.stats.bytes += len(data)
        if done:
            self.stats.frames += done
            self.stats.bytes += done * len(self.request)
            if not self.stopping and self.transport is not None:
                self.transport.writelines(self._requests(done))


async def run_load(
    port: int,
    request: bytes,
    connections: int,
    depth: int,
    warmup: float,
    seconds: float,
    probe: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Drive ``connections`` clients at 127.0.0.1:``port`` for ``warmup`` then ``seconds``; the rates
    over the measured part (exchanges/s, frames/s and MB/s through the tap, this process's CPU).
    ``probe`` is called as the measured part starts and as it ends (to read the tap's CPU)."""
    loop = asyncio.get_running_loop()
    stats = LoadStats()
    clients = []
    for _ in range(connections):
        _, client = await loop.create_connection(lambda: LoadClient(request, depth, stats), "127.0.0.1", port)
        clients.append(client)
    await asyncio.sleep(warmup)
    if probe is not None:
        probe()
    frames0, bytes0, t0, cpu0 = stats.frames, stats.bytes, time.monotonic(), time.process_time()
    await asyncio.sleep(seconds)
    frames, moved, wall = stats.frames - frames0, stats.bytes - bytes0, time.monotonic() - t0
    cpu = time.process_time() - cpu0
    if probe is not None:
        probe()
    for client in clients:
        client.stopping = True
        if client.transport is not None:
            client.transport.close()
    return {
        "seconds": round(wall, 3),
        "exchanges_per_sec": round(frames / wall, 1),
        "frames_per_sec": round(2 * frames / wall, 1),
        "mb_per_sec": round(moved / wall / 2**20, 2),
        "load_process_cores": round(cpu / wall, 3),
    }


async def start_stub(response: bytes) -> tuple[asyncio.Server, int]:
    server = await asyncio.get_running_loop().create_server(lambda: StubBroker(response), "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])
