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
from typing import Any

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


# ----- pcap in ------------------------------------------------------------------------------------------

#: Kafka's default port: always dissected as Kafka, besides the ports given or found in Metadata.
DEFAULT_BROKER_PORT = 9092


class PcapError(ValueError):
    """A capture that cannot be read (no tshark, not a pcap/pcapng, tshark failed)."""


@dataclass
class PcapStats:
    streams: int = 0
    pdus: int = 0
    #: Frames of streams whose start the capture missed, before the first frame that decodes:
    #: the capture began mid-stream, so where frames begin is unknown until one decodes.
    skipped_before_boundary: int = 0
    #: Responses whose request is not in the capture.
    unpaired_responses: int = 0
    broker_ports: set[int] = field(default_factory=set)


@dataclass
class _Pdu:
    ts_ns: int
    stream: int
    src: str
    dst: str
    data: bytes


def _tshark() -> str:
    import shutil

    found = shutil.which("tshark")
    if found is None:
        raise PcapError("reading a pcap needs tshark (Debian package tshark; `make setup` installs it)")
    return found


def _run_tshark(args: list[str]) -> str:
    import subprocess

    done = subprocess.run([_tshark(), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise PcapError(f"tshark failed: {done.stderr.strip()[:500]}")
    return done.stdout


def _stream_starts(path: Path) -> tuple[set[int], set[int]]:
    """Streams whose SYN is in the capture, and streams that end (FIN or RST) in it."""
    text = _run_tshark(
        [
            "-r",
            str(path),
            "-n",
            "-Y",
            "tcp.flags.syn == 1 || tcp.flags.fin == 1 || tcp.flags.reset == 1",
            "-T",
            "fields",
            "-e",
            "tcp.stream",
            "-e",
            "tcp.flags.syn",
            "-e",
            "tcp.flags.ack",
            "-e",
            "tcp.flags.fin",
            "-e",
            "tcp.flags.reset",
        ]
    )
    starts: set[int] = set()
    ends: set[int] = set()
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) < 5 or not parts[0]:
            continue
        flag = {
            name: value in ("1", "True")
            for name, value in zip(("syn", "ack", "fin", "rst"), parts[1:], strict=False)
        }
        if flag["syn"] and not flag["ack"]:
            starts.add(int(parts[0]))
        if flag["fin"] or flag["rst"]:
            ends.add(int(parts[0]))
    return starts, ends


def _in_sequence_order(path: Path, out: Path) -> Path:
    """``path`` rewritten with each TCP flow's data segments in sequence-number order.

    Wireshark's reassembly does not hand on a segment that arrives after a later one of its flow
    (tested: that frame is lost), so the capture is put in order first. Only the order of one flow's
    segments among the slots they already take changes; other packets, and every slot's capture time,
    stay where they are, so times still run forward. Read and written with scapy (pcap or pcapng in,
    pcap out).
    """
    from scapy.layers.inet import IP, TCP
    from scapy.layers.inet6 import IPv6
    from scapy.utils import PcapReader, PcapWriter

    with PcapReader(str(path)) as reader:
        packets = list(reader)
    flows: dict[tuple[str, str, int, int], list[int]] = {}
    for index, packet in enumerate(packets):
        if TCP in packet and len(packet[TCP].payload) > 0:
            layer = IP if IP in packet else IPv6 if IPv6 in packet else None
            if layer is not None:
                ip = packet[layer]
                flows.setdefault((ip.src, ip.dst, packet[TCP].sport, packet[TCP].dport), []).append(index)
    reordered = list(packets)
    for slots in flows.values():
        base = packets[slots[0]][TCP].seq

        def relative(index: int, base: int = base) -> int:
            return ((packets[index][TCP].seq - base + (1 << 31)) % (1 << 32)) - (1 << 31)

        for slot, index in zip(slots, sorted(slots, key=relative), strict=True):
            if slot != index:
                moved = packets[index].copy()
                moved.time = packets[slot].time
                reordered[slot] = moved
    writer = PcapWriter(str(out), sync=False)
    try:
        for packet in reordered:
            writer.write(packet)
    finally:
        writer.close()
    return out


def _pdus(path: Path, ports: set[int]) -> list[_Pdu]:
    """Every Kafka PDU on ``ports``, reassembled by Wireshark's TCP engine (retransmissions dropped,
    out-of-order segments put in order, PDUs split over segments joined)."""
    import json

    decode_as = [arg for port in sorted(ports) for arg in ("-d", f"tcp.port=={port},kafka")]
    text = _run_tshark(
        [
            "-r",
            str(path),
            "-n",
            # Two passes: segments that arrive out of order are put in place before PDUs are cut.
            "-2",
            *decode_as,
            "-o",
            "tcp.desegment_tcp_streams:TRUE",
            "-o",
            "tcp.reassemble_out_of_order:TRUE",
            "-o",
            "tcp.analyze_sequence_numbers:TRUE",
            "-Y",
            "kafka",
            "-T",
            "json",
            "-x",
        ]
    )

    def keep_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # A frame that ends one Kafka PDU and holds another has two "kafka_raw" keys in tshark's JSON;
        # a plain dict would keep only the last one.
        merged: dict[str, Any] = {}
        for key, value in pairs:
            if key == "kafka_raw":
                merged.setdefault(key, []).extend([value] if value and isinstance(value[0], str) else value)
            else:
                merged[key] = value
        return merged

    out: list[_Pdu] = []
    for packet in json.loads(text or "[]", object_pairs_hook=keep_repeats):
        layers = packet["_source"]["layers"]
        ip = layers.get("ip") or layers.get("ipv6") or {}
        src_ip = ip.get("ip.src") or ip.get("ipv6.src") or "?"
        dst_ip = ip.get("ip.dst") or ip.get("ipv6.dst") or "?"
        tcp = layers["tcp"]
        raws = layers.get("kafka_raw") or []
        if raws and isinstance(raws[0], str):
            raws = [raws]
        seconds, _, fraction = str(layers["frame"]["frame.time_epoch"]).partition(".")
        ts_ns = int(seconds) * 1_000_000_000 + int((fraction + "000000000")[:9])
        for raw in raws:
            data = bytes.fromhex(raw[0])
            if len(data) < 4:
                continue
            out.append(
                _Pdu(
                    ts_ns,
                    int(tcp["tcp.stream"]),
                    f"{src_ip}:{tcp['tcp.srcport']}",
                    f"{dst_ip}:{tcp['tcp.dstport']}",
                    data[4:],
                )
            )
    return out


def _metadata_ports(frames: Iterable[TapFrame]) -> set[int]:
    """Broker ports the cluster announced in the Metadata responses seen."""
    found: set[int] = set()
    for frame in frames:
        response = frame.response
        if response is None or frame.api_key != 3:
            continue
        for broker in response.body.get("Brokers") or []:
            port = broker.get("Port") if isinstance(broker, dict) else None
            if isinstance(port, int) and 0 < port < 65536:
                found.add(port)
    return found


def frames_from_pcap(
    path: Path, broker_ports: Iterable[int] = (), learn_ports: bool = True
) -> tuple[list[TapFrame], PcapStats]:
    """A pcap or pcapng of client-broker traffic as tap frames, one connection per TCP stream.

    Requests are what goes to a broker port, responses what comes from one; each response is paired
    with its stream's request by correlation id (as the tap does). Broker ports are ``broker_ports``
    plus 9092 plus, with ``learn_ports``, every port the Metadata responses seen announce (the capture
    is read again when that finds new ones).
    """
    if not path.is_file():
        raise PcapError(f"cannot read {path}: no such file")
    ports = {DEFAULT_BROKER_PORT, *broker_ports}
    while True:
        frames, stats = _frames(path, ports)
        found = _metadata_ports(frames) if learn_ports else set()
        if found <= ports:
            stats.broker_ports = ports
            return frames, stats
        ports |= found


def _frames(path: Path, ports: set[int]) -> tuple[list[TapFrame], PcapStats]:
    """Each TCP stream's frames as the tap would have recorded them: a request and its response make
    one record (one ``seq``), paired by the tap's own ``tap.framing.Correlations``; a request that
    gets no response (acks=0, the capture ends) is a record of its own."""
    import tempfile

    from codec.errors import DecodeError
    from codec.peek import peek_request_header
    from codec.taprecord import Part, decode_frame
    from tap.framing import Correlations, Pending, Unpaired, expects_response

    starts, ends = _stream_starts(path)
    stats = PcapStats()
    with tempfile.TemporaryDirectory(prefix="kpmon-pcap-") as work:
        pdus = _pdus(_in_sequence_order(path, Path(work) / "ordered.pcap"), ports)
    frames: list[TapFrame] = []
    seqs: dict[int, int] = {}
    pending: dict[int, Correlations] = {}
    synced: set[int] = set(starts)
    last_ts: dict[int, tuple[int, str, str]] = {}

    def write(stream: int, parts: tuple[Part, ...]) -> None:
        """One record of ``stream``: its parts as frames, under the record's ``seq``."""
        seqs[stream] += 1
        _, client, broker = last_ts[stream]
        for part in parts:
            frame = TapFrame(
                f"pcap-{stream}", seqs[stream], part.ts_ns, part.direction, part.api_key, part.api_version,
                part.correlation_id, client=client, broker=broker, capture="full",
            )  # fmt: skip
            frames.append(decode_frame(frame, part.value))

    def write_alone(stream: int, unpaired: list[Unpaired]) -> None:
        for item in unpaired:
            write(stream, (item.held,))

    for pdu in pdus:
        stats.pdus += 1
        src_port = int(pdu.src.rpartition(":")[2])
        dst_port = int(pdu.dst.rpartition(":")[2])
        is_request = dst_port in ports and not (src_port in ports and dst_port not in ports)
        client, broker = (pdu.src, pdu.dst) if is_request else (pdu.dst, pdu.src)
        conn = f"pcap-{pdu.stream}"
        if pdu.stream not in seqs:
            seqs[pdu.stream] = 1
            stats.streams += 1
            frames.append(TapFrame(conn, 1, pdu.ts_ns, "open", client=client, broker=broker, capture="full"))
        last_ts[pdu.stream] = (pdu.ts_ns, client, broker)
        correlations = pending.setdefault(pdu.stream, Correlations())
        if is_request:
            try:
                header = peek_request_header(pdu.data)
            except DecodeError:
                header = None
            if pdu.stream not in synced:
                # Mid-stream start: Wireshark's PDU boundaries are guesses until one request decodes.
                probe = TapFrame(conn, 0, pdu.ts_ns, "req", client=client, broker=broker, capture="full")
                if header is None or decode_frame(probe, pdu.data).error is not None:
                    stats.skipped_before_boundary += 1
                    continue
                synced.add(pdu.stream)
            if header is None:
                write(pdu.stream, (Part("req", pdu.ts_ns, None, None, None, pdu.data),))
                continue
            part = Part("req", pdu.ts_ns, header.api_key, header.api_version, header.correlation_id, pdu.data)
            if not expects_response(pdu.data, header.api_key, header.api_version):
                write(pdu.stream, (part,))
                continue
            held = Pending(header.api_key, header.api_version, pdu.ts_ns, held=part)
            write_alone(pdu.stream, correlations.add(header.correlation_id, held))
        else:
            if len(pdu.data) < 4:
                stats.unpaired_responses += 1
                continue
            (corr,) = struct.unpack_from(">i", pdu.data)
            request, orphans = correlations.match(corr)
            write_alone(pdu.stream, orphans)
            if request is None:
                if pdu.stream in synced:
                    stats.unpaired_responses += 1
                else:
                    stats.skipped_before_boundary += 1
                continue
            response = Part("resp", pdu.ts_ns, request.api_key, request.api_version, corr, pdu.data)
            write(pdu.stream, (response,) if request.held is None else (request.held, response))
    for stream in sorted(seqs):
        # Requests the capture never shows an answer to: records of their own, before the close.
        write_alone(stream, pending[stream].drain() if stream in pending else [])
    for stream in sorted(ends & set(seqs)):
        ts_ns, client, broker = last_ts[stream]
        seqs[stream] += 1
        frames.append(
            TapFrame(
                f"pcap-{stream}", seqs[stream], ts_ns, "close", client=client, broker=broker, capture="full"
            )
        )
    return frames, stats
