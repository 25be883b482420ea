"""A stub broker and a synthetic client load, in one process, for tap_bench's ``scale`` mode.

The stub answers every request frame at once with a prebuilt response of the same API (its
correlation id patched in); the clients keep ``depth`` requests in flight on each connection and
count what comes back. All requests of a load have one size and all responses another, so neither
side parses frames: per exchange they cost a small fraction of what the tap spends (which finds
frames, peeks headers, correlates and counts), and the tap, not this process, is what saturates.
Loads:

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


class StubBroker(asyncio.Protocol):
    """Answers each request with ``response``, its correlation id copied from the request.

    Every request of a load has the same size, so the stream is cut into requests by arithmetic,
    not parsed: per request this costs one slice and three list items.
    """

    def __init__(self, request_size: int, response: bytes) -> None:
        self.size = request_size
        self.response_head = response[:4]
        self.response_tail = response[8:]
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buffer + data if self.buffer else data
        whole = len(buf) - len(buf) % self.size
        head, tail = self.response_head, self.response_tail
        out: list[bytes] = []
        for at in range(8, whole, self.size):
            out += (head, buf[at : at + 4], tail)
        self.buffer = buf[whole:]
        if out and self.transport is not None:
            self.transport.writelines(out)


@dataclass
class LoadStats:
    exchanges: int = 0  # responses received (each one exchange: two frames through the tap)
    bytes: int = 0  # request and response bytes through the tap
    started: float = field(default_factory=time.monotonic)


#: Requests with distinct correlation ids that a client cycles through (more than it ever has in flight).
_RING = 4096


class LoadClient(asyncio.Protocol):
    """Keeps ``depth`` requests in flight; new ones go out as responses complete.

    Requests come from a prebuilt ring with distinct correlation ids, and responses (all of one size)
    are counted by their bytes: the client parses nothing.
    """

    def __init__(self, request: bytes, response_size: int, depth: int, stats: LoadStats) -> None:
        self.size = len(request)
        self.ring = b"".join(request[:8] + _INT32.pack(corr) + request[12:] for corr in range(1, _RING + 1))
        self.next = 0
        self.response_size = response_size
        self.depth = depth
        self.stats = stats
        self.received = 0
        self.transport: asyncio.Transport | None = None
        self.stopping = False

    def _send(self, n: int) -> None:
        assert self.transport is not None
        start = self.next
        stop = start + n
        if stop <= _RING:
            self.transport.write(self.ring[start * self.size : stop * self.size])
        else:
            self.transport.writelines(
                [self.ring[start * self.size :], self.ring[: (stop - _RING) * self.size]]
            )
        self.next = stop % _RING

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._send(self.depth)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        done, self.received = divmod(self.received, self.response_size)
        self.stats.bytes += len(data) + done * self.size
        if done:
            self.stats.exchanges += done
            if not self.stopping:
                self._send(done)


async def run_load(
    port: int,
    request: bytes,
    response_size: int,
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
        _, client = await loop.create_connection(
            lambda: LoadClient(request, response_size, depth, stats), "127.0.0.1", port
        )
        clients.append(client)
    await asyncio.sleep(warmup)
    if probe is not None:
        probe()
    frames0, bytes0, t0, cpu0 = stats.exchanges, stats.bytes, time.monotonic(), time.process_time()
    await asyncio.sleep(seconds)
    frames, moved, wall = stats.exchanges - frames0, stats.bytes - bytes0, time.monotonic() - t0
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


async def start_stub(request_size: int, response: bytes) -> tuple[asyncio.Server, int]:
    server = await asyncio.get_running_loop().create_server(
        lambda: StubBroker(request_size, response), "127.0.0.1", 0
    )
    return server, int(server.sockets[0].getsockname()[1])
