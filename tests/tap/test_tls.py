"""TLS on both sides: the tap terminates client TLS and opens TLS to the broker; certs made here."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import struct
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kpmon.config import TapConfig, TapListenerConfig
from tap.app import listener_specs
from tap.mirror import MemoryMirror
from tap.proxy import ListenerSpec, Tap, TapSettings
from tests.tap.helpers import FakeBroker, api_versions_request, frame


def _cert(tmp: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 signed by it; returns (ca, cert, key) PEM paths."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name}-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = tmp / f"{name}-ca.pem", tmp / f"{name}.pem", tmp / f"{name}.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


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
        opened = json.loads(sink.records[0].value)
        assert opened["tls"]["version"].startswith("TLS")
        reqs = [r for r in sink.records if dict(r.headers)["dir"] == b"req"]
        assert len(reqs) == 3 and dict(reqs[0].headers)["listener"] == b"SSL"

    asyncio.run(run())
