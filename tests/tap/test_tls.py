"""TLS on both sides: the tap terminates client TLS and opens TLS to the broker; certs made here."""

from __future__ import annotations

import asyncio
import json
import ssl
import struct
from pathlib import Path

from kpconfig.model import TapConfig, TapListenerConfig
from tap.app import listener_specs
from tap.mirror import MemoryMirror
from tap.proxy import ListenerSpec, Tap, TapSettings
from tests.certs import issue, make_ca
from tests.tap.helpers import FakeBroker, api_versions_request, frame, parts


def _cert(tmp: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 signed by it; returns (ca, cert, key) PEM paths."""
    ca = make_ca(tmp, name)
    issued = issue(tmp, ca, name)
    return ca.pem, issued.cert, issued.key


class TlsFakeBroker(FakeBroker):
    def __init__(self, ctx: ssl.SSLContext) -> None:
        super().__init__()
        self.ctx = ctx

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.ctx)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port


def test_tls_on_both_sides(tmp_path: Path) -> None:
    broker_ca, broker_cert, broker_key = _cert(tmp_path, "broker")
    _, tap_cert, tap_key = _cert(tmp_path, "tap")
    tap_ca = tmp_path / "tap-ca.pem"

    async def run() -> None:
        broker_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        broker_ctx.load_cert_chain(broker_cert, broker_key)
        broker = TlsFakeBroker(broker_ctx)
        bport = await broker.start()
        cfg = TapConfig(
            listeners=[
                TapListenerConfig(
                    listen="127.0.0.1:0",
                    broker=f"127.0.0.1:{bport}",
                    broker_id=1,
                    listener_name="SSL",
                    tls_certfile=str(tap_cert),
                    tls_keyfile=str(tap_key),
                    broker_tls=True,
                    broker_cafile=str(broker_ca),
                )
            ]
        )
        specs: list[ListenerSpec] = listener_specs(cfg)
        sink = MemoryMirror()
        tap = Tap(specs, sink, TapSettings(capture="full"))
        ((_, port),) = await tap.start()
        client_ctx = ssl.create_default_context(cafile=str(tap_ca))
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx)
        for corr in range(3):
            writer.write(frame(api_versions_request(corr)))
        await writer.drain()
        for corr in range(3):
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            assert struct.unpack_from(">i", await reader.readexactly(size))[0] == corr
        writer.close()
        await asyncio.sleep(0.1)
        await tap.stop()
        await broker.stop()
        opened = json.loads(parts(sink.records[:1])[0][1].value or b"")
        assert opened["tls"]["version"].startswith("TLS")
        reqs = [(r, p) for r, p in parts(sink.records) if p.direction == "req"]
        assert len(reqs) == 3 and reqs[0][0].connection.listener == "SSL"

    asyncio.run(run())
