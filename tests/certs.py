"""Test certificates made with the ``cryptography`` package: CAs, server and client certificates.

Shared by the TLS tests of the tap (tests/tap/test_tls.py) and the secured-cluster tests
(tests/tap/test_secured_legs.py), which also need expired certificates and certificates from a CA
nobody trusts.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Ca:
    name: x509.Name
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    pem: Path


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path
    #: Key then certificate chain in one file: Kafka's ``ssl.keystore.type=PEM`` keystore.
    keystore: Path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def make_ca(directory: Path, name: str) -> Ca:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name}-ca")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=1))
        .not_valid_after(_now() + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = directory / f"{name}-ca.pem"
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Ca(subject, key, cert, pem)


def issue(directory: Path, ca: Ca, name: str, *, expired: bool = False, client: bool = False) -> Issued:
    """A certificate for ``name`` (CN) valid for 127.0.0.1 and localhost, signed by ``ca``."""
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = _now() - datetime.timedelta(hours=1) if expired else _now() + datetime.timedelta(days=1)
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(days=2))
        .not_valid_after(not_after)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    paths = Issued(directory / f"{name}.pem", directory / f"{name}.key", directory / f"{name}-keystore.pem")
    paths.cert.write_bytes(cert_pem)
    paths.key.write_bytes(key_pem)
    paths.keystore.write_bytes(key_pem + cert_pem)
    for path in (paths.key, paths.keystore):
        path.chmod(0o600)
    return paths
