"""Tap records as a pcap file Wireshark opens: each connection's frames inside synthesized TCP/IP.

The tap mirrors Kafka frames, not packets, so the packets here are made up around them: per connection
a handshake at its ``open`` record, one or more TCP segments per frame (the frame's size prefix
restored) with consistent sequence and acknowledgement numbers, and a FIN at its ``close``. Addresses
and ports are the connection's own (the ``client`` and ``broker`` headers); a host name or an IPv6
address is mapped to a stable address in 198.18.0.0/15 (reserved for testing). Times are the tap's
``ts_ns``. Packets are built and written with scapy.

Frames mirrored header-only (``meta`` capture, or truncated as too large) have no bytes to write: they
are skipped and counted.
"""

from __future__ import annotations

import hashlib
import ipaddress
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from codec.taprecord import TapFrame

#: Bytes of Kafka data per synthesized segment (an IPv4 packet holds at most 65535 bytes).
SEGMENT = 60_000
_TCP_FLAGS = {"syn": "S", "synack": "SA", "ack": "A", "data": "PA", "fin": "FA"}


@dataclass
class ExportStats:
    connections: int = 0
    frames: int = 0
    packets: int = 0
    #: Header-only frames (no bytes were mirrored) that could not be written.
    header_only: int = 0
    broker_ports: set[int] = field(default_factory=set)


def _address(text: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) to an IPv4 address and port Wireshark can show."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        if ipaddress.ip_address(host).version == 4:
            return host, int(port)
    except ValueError:
        pass
    digest = hashlib.sha256(host.encode()).digest()
    base = int(ipaddress.IPv4Address("198.18.0.0"))
    return str(ipaddress.IPv4Address(base + int.from_bytes(digest[:2], "big") % (1 << 17))), int(port or 0)


@dataclass
class _Conn:
    client: tuple[str, int]
    broker: tuple[str, int]
    client_seq: int = 1000
    broker_seq: int = 5000
    opened: bool = False
    closed: bool = False


class PcapExport:
    """Write frames (any order across connections, in ``seq`` order within one) to ``path``."""

    def __init__(self, path: Path) -> None:
        from scapy.utils import PcapWriter

        self.writer = PcapWriter(str(path), linktype=1, sync=False)
        self.stats = ExportStats()
        self._conns: dict[str, _Conn] = {}

    def _packet(self, conn: _Conn, from_client: bool, flags: str, payload: bytes, ts_ns: int) -> None:
        from scapy.layers.inet import IP, TCP
        from scapy.layers.l2 import Ether

        src, dst = (conn.client, conn.broker) if from_client else (conn.broker, conn.client)
        seq, ack = (conn.client_seq, conn.broker_seq) if from_client else (conn.broker_seq, conn.client_seq)
        tcp = TCP(
            sport=src[1], dport=dst[1], flags=flags, seq=seq, ack=ack if "A" in flags else 0, window=65535
        )
        packet = Ether() / IP(src=src[0], dst=dst[0]) / tcp
        if payload:
            packet = packet / payload
        packet.time = ts_ns / 1e9
        self.writer.write(packet)
        self.stats.packets += 1
        advance = len(payload) + (1 if ("S" in flags or "F" in flags) else 0)
        if from_client:
            conn.client_seq += advance
        else:
            conn.broker_seq += advance

    def _open(self, frame: TapFrame) -> _Conn:
        conn = self._conns.get(frame.conn)
        if conn is None:
            conn = self._conns[frame.conn] = _Conn(
                _address(frame.client or "0.0.0.0:0"), _address(frame.broker)
            )
            self.stats.connections += 1
            self.stats.broker_ports.add(conn.broker[1])
        if not conn.opened:
            conn.opened = True
            self._packet(conn, True, "S", b"", frame.ts_ns)
            self._packet(conn, False, "SA", b"", frame.ts_ns)
            self._packet(conn, True, "A", b"", frame.ts_ns)
        return conn

    def add(self, frame: TapFrame) -> None:
        conn = self._open(frame)
        if frame.direction == "open":
            return
        from_client = frame.direction == "req"
        if frame.direction == "close":
            if not conn.closed:
                conn.closed = True
                self._packet(conn, True, "FA", b"", frame.ts_ns)
                self._packet(conn, False, "FA", b"", frame.ts_ns)
                self._packet(conn, True, "A", b"", frame.ts_ns)
            return
        if frame.raw is None:
            self.stats.header_only += 1
            return
        data = struct.pack(">i", len(frame.raw)) + frame.raw
        for start in range(0, len(data), SEGMENT):
            self._packet(conn, from_client, "PA", data[start : start + SEGMENT], frame.ts_ns)
        self.stats.frames += 1

    def close(self) -> ExportStats:
        self.writer.close()
        return self.stats


def export_pcap(frames: Iterable[TapFrame], path: Path) -> ExportStats:
    """Every frame to ``path``, ordered by event time (then connection and ``seq``)."""
    ordered = sorted(frames, key=lambda f: (f.ts_ns, f.conn, f.seq))
    export = PcapExport(path)
    try:
        for frame in ordered:
            export.add(frame)
    finally:
        stats = export.close()
    return stats
