"""Raw-socket helpers for tap tests: a fake broker that answers each request frame in order."""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import Iterable
from typing import Any

import codec
from codec.taprecord import Part, TapRecord, parse_records


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


class FakeBroker:
    """Answers every request with a response carrying its correlation id and ``reply`` bytes.

    Records a digest of every byte received, so tests can compare it with what the client sent.
    """

    def __init__(self, reply: bytes = b"\x00\x00") -> None:
        self.reply = reply
        self.received = hashlib.sha256()
        self.received_len = 0
        self.server: asyncio.Server | None = None
        self.port = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readexactly(4)
                (size,) = struct.unpack(">i", head)
                body = await reader.readexactly(size)
                self.received.update(head + body)
                self.received_len += 4 + size
                corr = struct.unpack_from(">i", body, 4)[0] if size >= 8 else 0
                writer.write(frame(struct.pack(">i", corr) + self.reply))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        for w in self.writers:
            w.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def api_versions_request(corr: int, client_id: str = "test") -> bytes:
    return codec.encode_request(
        18, 3, corr, client_id, {"ClientSoftwareName": "t", "ClientSoftwareVersion": "1"}
    )


def metric_sum(registry: Any, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of sample ``name`` over every series whose labels include ``labels`` (the tap's traffic
    series also carry broker_id and listener labels a test may not care about)."""
    wanted = labels or {}
    total = 0.0
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in wanted.items()):
                total += sample.value
    return total


def parsed(records: Iterable[Any]) -> list[TapRecord]:
    """Mirrored records (anything with the record's ``value``) parsed by the tap-record contract: the
    records they hold, in order (a schema-3 record holds several)."""
    return [entry for r in records for entry in parse_records(None, r.value)]


def parts(records: Iterable[Any]) -> list[tuple[TapRecord, Part]]:
    """Every frame (or lifecycle event) the records hold, with its record, in order."""
    return [(record, part) for record in parsed(records) for part in record.parts]
