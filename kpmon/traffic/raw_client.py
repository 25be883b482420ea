"""A minimal blocking Kafka client over a raw socket, speaking through the codec.

Real clients refuse to send what the violation scenarios need (a request above the advertised version,
an Envelope from a client, a group member with another protocol type), so the scenarios use this.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import codec
from codec.protocol import ApiKey

_SIZE = struct.Struct(">i")


class RawClientError(ConnectionError):
    """The broker closed the connection or answered with something that is not a frame."""


class RawKafkaClient:
    def __init__(self, bootstrap: str, client_id: str = "kpmon-raw", timeout: float = 10.0) -> None:
        host, _, port = bootstrap.split(",")[0].rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.client_id = client_id
        self.correlation_id = 0
        self.versions: dict[int, tuple[int, int]] = {}

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawKafkaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_frame(self, frame: bytes) -> None:
        self.sock.sendall(_SIZE.pack(len(frame)) + frame)

    def _read_exact(self, n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = self.sock.recv(n - len(chunks))
            if not chunk:
                raise RawClientError("broker closed the connection")
            chunks += chunk
        return bytes(chunks)

    def read_frame(self) -> bytes:
        (size,) = _SIZE.unpack(self._read_exact(4))
        if size < 0 or size > 100 * 1024 * 1024:
            raise RawClientError(f"bad response size {size}")
        return self._read_exact(size)

    def request(
        self, api_key: int, api_version: int, body: dict[str, Any], expect_response: bool = True
    ) -> codec.Response | None:
        """Send one request; return its decoded response (None if ``expect_response`` is False)."""
        self.correlation_id += 1
        self.send_frame(codec.encode_request(api_key, api_version, self.correlation_id, self.client_id, body))
        if not expect_response:
            return None
        raw = self.read_frame()
        return codec.decode_response(raw, api_key, api_version)

    def handshake(self, version: int = 3) -> dict[int, tuple[int, int]]:
        """ApiVersions, as every modern client does first; remembers the advertised ranges."""
        body = {"ClientSoftwareName": "kpmon-raw", "ClientSoftwareVersion": "1"} if version >= 3 else {}
        response = self.request(ApiKey.API_VERSIONS, version, body)
        assert response is not None
        self.versions = {k["ApiKey"]: (k["MinVersion"], k["MaxVersion"]) for k in response.body["ApiKeys"]}
        return self.versions
