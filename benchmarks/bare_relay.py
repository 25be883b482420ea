"""A bare TCP relay with the tap's shape and none of its work: the floor of a Python-driven relay.

The same event loop as the tap (asyncio on uvloop, ``tap.proxy.install_uvloop``), one protocol per
side, ``TCP_NODELAY``, each chunk written on as it arrives, flow control by pausing the other side's
reads, and nothing else: no framing, no pairing, no mirror, no metrics. ``cost_bench.py --floor``
runs it on the tap's port, so the clients and the broker see the same connections as through the
tap; its CPU per frame is what a tap whose per-frame work cost nothing would still spend with Python
driving the sockets (docs/decisions.md, "the tap's relay floor").

    python benchmarks/bare_relay.py LISTEN_PORT BROKER_HOST:BROKER_PORT
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tap.proxy import install_uvloop, parse_hostport


class _Side(asyncio.Protocol):
    """One side of a relayed connection: what it reads goes to ``peer`` unchanged."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, only alike.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.pending.append(data)
        else:
            peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


async def _relay(listen_port: int, broker: tuple[str, int]) -> None:
    loop = asyncio.get_running_loop()
    connecting: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks

    def accept() -> asyncio.Protocol:
        client = _Side()

        async def connect() -> None:
            try:
                _, upstream = await loop.create_connection(_Side, *broker)
            except OSError:
                if client.transport is not None:
                    client.transport.close()
                return
            client.peer, upstream.peer = upstream, client
            assert upstream.transport is not None
            for chunk in client.pending:
                upstream.transport.write(chunk)
            client.pending.clear()

        task = loop.create_task(connect())
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return client

    server = await loop.create_server(accept, "127.0.0.1", listen_port, reuse_address=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    install_uvloop()
    asyncio.run(_relay(int(argv[0]), parse_hostport(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
