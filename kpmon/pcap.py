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
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
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
    #: Every port read as a broker's: the three kinds below together.
    broker_ports: set[int] = field(default_factory=set)
    #: Ports given (``--broker-port``), found from a stream's own bytes, announced in Metadata.
    given_ports: set[int] = field(default_factory=set)
    found_ports: set[int] = field(default_factory=set)
    announced_ports: set[int] = field(default_factory=set)
    #: Each TCP stream's verdict from its first bytes (``StreamVerdict``).
    verdicts: list[StreamVerdict] = field(default_factory=list)

    def skipped(self) -> list[StreamVerdict]:
        """Streams not read as Kafka: their own bytes did not look like it, and neither end is on a
        broker port."""
        return [
            v
            for v in self.verdicts
            if not v.kafka and not {_port(v.client), _port(v.broker)} & self.broker_ports
        ]

    def summary(self, limit: int = 6) -> str:
        """One paragraph for the report's source line: where Kafka was found, what was skipped and why."""
        how = [
            f"{port} ({', '.join(k for k, ports in self._kinds() if port in ports)})"
            for port in sorted(self.broker_ports)
        ]
        text = f"{self.streams} TCP streams, {self.pdus} Kafka frames on " + (
            f"ports {', '.join(how)}" if how else "no port: no Kafka found"
        )
        skipped = self.skipped()
        if skipped:
            groups: dict[tuple[str, str], int] = {}
            for v in skipped:
                groups[(v.broker, v.reason)] = groups.get((v.broker, v.reason), 0) + 1
            listed = [f"{n} to {server}: {reason}" for (server, reason), n in sorted(groups.items())[:limit]]
            if len(groups) > limit:
                listed.append(f"{sum(n for _, n in sorted(groups.items())[limit:])} more")
            text += f"; {len(skipped)} other TCP streams skipped ({'; '.join(listed)})"
        if not how:
            text += "; give --broker-port to read a port as Kafka"
        return (
            f"{text}; {self.skipped_before_boundary} frames skipped before the first frame boundary "
            f"(capture started mid-stream), {self.unpaired_responses} responses without their request"
        )

    def _kinds(self) -> list[tuple[str, set[int]]]:
        return [
            ("found", self.found_ports),
            ("given", self.given_ports),
            ("announced in Metadata", self.announced_ports),
        ]


def _port(endpoint: str) -> int:
    return int(endpoint.rpartition(":")[2])


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


def _in_sequence_order(path: Path, out: Path) -> tuple[Path, dict[frozenset[tuple[str, int]], _Flow]]:
    """``path`` rewritten with each TCP flow's data segments in sequence-number order, and each TCP
    stream's first bytes (``_Flow``), by its two endpoints.

    Wireshark's reassembly does not hand on a segment that arrives after a later one of its flow
    (tested: that frame is lost), so the capture is put in order first. Only the order of one flow's
    segments among the slots they already take changes; other packets, and every slot's capture time,
    stay where they are, so times still run forward. Read and written with scapy (pcap or pcapng in,
    pcap out).
    """
    from scapy.layers.inet import IP, TCP
    from scapy.layers.inet6 import IPv6
    from scapy.utils import PcapReader, PcapWriter

    try:
        with PcapReader(str(path)) as reader:
            packets = list(reader)
    except Exception as exc:  # scapy raises its own Scapy_Exception, or struct errors, on a bad file
        raise PcapError(f"cannot read {path} as a pcap or pcapng: {exc}") from None
    flows: dict[tuple[str, str, int, int], list[int]] = {}
    streams: dict[frozenset[tuple[str, int]], _Flow] = {}
    for index, packet in enumerate(packets):
        if TCP not in packet:
            continue
        layer = IP if IP in packet else IPv6 if IPv6 in packet else None
        if layer is None:
            continue
        ip, tcp = packet[layer], packet[TCP]
        src, dst = (str(ip.src), int(tcp.sport)), (str(ip.dst), int(tcp.dport))
        ends = frozenset((src, dst))
        if ends not in streams:
            streams[ends] = _Flow(src, dst)
        if "S" in str(tcp.flags) and "A" not in str(tcp.flags):
            streams[ends].syn_from = src
        if len(tcp.payload) > 0:
            flows.setdefault((ip.src, ip.dst, tcp.sport, tcp.dport), []).append(index)
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
        for index in sorted(slots, key=relative):
            packet = packets[index]
            layer = IP if IP in packet else IPv6
            src, dst = (
                (str(packet[layer].src), int(packet[TCP].sport)),
                (str(packet[layer].dst), int(packet[TCP].dport)),
            )
            streams[frozenset((src, dst))].add(src, int(packet[TCP].seq), bytes(packet[TCP].payload))
    writer = PcapWriter(str(out), sync=False)
    try:
        for packet in reordered:
            writer.write(packet)
    finally:
        writer.close()
    return out, streams


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


# ----- finding Kafka in a capture -------------------------------------------------------------------------

#: Bytes of each direction of a stream read to tell whether it is Kafka: enough for the first few
#: requests and answers (a client's ApiVersions and Metadata), and bounded however large the capture.
SNIFF_BYTES = 64 * 1024
#: Frame sizes taken as plausible while looking for Kafka (the broker's socket.request.max.bytes
#: default is 100 MiB).
MAX_FRAME = 100 << 20


@dataclass(frozen=True)
class StreamVerdict:
    """What the first bytes of one TCP stream say: Kafka (``kafka``, with its broker side) or not, why."""

    client: str
    broker: str
    kafka: bool
    reason: str


@dataclass
class _Flow:
    """One TCP stream's first contiguous bytes in each direction, in sequence order."""

    a: tuple[str, int]
    b: tuple[str, int]
    syn_from: tuple[str, int] | None = None
    data: dict[tuple[str, int], bytearray] = field(default_factory=dict)
    next_seq: dict[tuple[str, int], int] = field(default_factory=dict)
    holed: set[tuple[str, int]] = field(default_factory=set)

    def add(self, src: tuple[str, int], seq: int, payload: bytes) -> None:
        """A data segment from ``src``; segments arrive in sequence order (``_in_sequence_order``).
        Retransmitted bytes are dropped; a hole ends what is kept of that direction."""
        if src in self.holed:
            return
        buf = self.data.setdefault(src, bytearray())
        if len(buf) >= SNIFF_BYTES:
            return
        expected = self.next_seq.get(src, seq)
        skip = (expected - seq) % (1 << 32)
        if skip >= 1 << 31:  # the segment starts after the bytes kept so far: a hole
            self.holed.add(src)
            return
        if skip < len(payload):
            buf += payload[skip : skip + SNIFF_BYTES - len(buf)]
            self.next_seq[src] = (seq + len(payload)) % (1 << 32)


@cache
def _known_versions() -> dict[int, tuple[int, int]]:
    """Every api key the codec knows, with the versions it defines."""
    import codec

    return {api_key: codec.supported_versions(api_key) for api_key in codec.api_keys()}


def _request_at(data: bytes | bytearray, at: int, known: bool) -> tuple[int, int] | None:
    """(size, correlation id) of a request frame starting at ``at``, when its size prefix and header
    are consistent: a size that holds the header, an api key the codec knows at a version it defines
    (``known``; otherwise any version 0-127), a client id that fits the frame."""
    if at + 14 > len(data):
        return None
    size, api_key, version, corr, client_len = struct.unpack_from(">ihhih", data, at)
    if not 10 <= size <= MAX_FRAME or corr < 0 or client_len < -1 or 10 + max(client_len, 0) > size:
        return None
    versions = _known_versions().get(api_key)
    if versions is None:
        return None
    if not (versions[0] <= version <= versions[1] if known else 0 <= version < 128):
        return None
    return size, corr


#: Where a request frame may start, to look for one in a stream joined mid-stream: a size prefix of at
#: most ``MAX_FRAME`` (first byte 0-6), then an api key and a version below 256 (high bytes 0). A
#: regular expression finds these in C; text protocols (no NUL bytes) offer none.
_FRAME_START = re.compile(rb"(?=[\x00-\x06].{3}\x00.\x00)", re.DOTALL)


def _chain(data: bytes | bytearray, at: int) -> list[int] | None:
    """Correlation ids of the request frames from ``at`` on: the first must carry a known api key and
    version; the ones after it are followed while their headers are plausible (a legacy SASL token,
    sent unframed by Kafka's rules, ends the walk)."""
    first = _request_at(data, at, True)
    if first is None:
        return None
    corrs = [first[1]]
    at += 4 + first[0]
    while (found := _request_at(data, at, False)) is not None:
        corrs.append(found[1])
        at += 4 + found[0]
    return corrs


def _answered(data: bytes | bytearray, corrs: list[int], from_start: bool) -> bool:
    """Whether ``data`` (the other direction) holds a response frame with one of ``corrs``: a plausible
    size prefix, then the correlation id. From its first byte when the stream's start was captured."""
    if from_start:
        at = 0
        while at + 8 <= len(data):
            size, corr = struct.unpack_from(">ii", data, at)
            if not 4 <= size <= MAX_FRAME:
                return False
            if corr in corrs:
                return True
            at += 4 + size
        return False
    for corr in set(corrs):
        needle = struct.pack(">i", corr)
        at = data.find(needle, 4)
        while at >= 0:
            if 4 <= struct.unpack_from(">i", data, at - 4)[0] <= MAX_FRAME:
                return True
            at = data.find(needle, at + 1)
    return False


def _preview(data: bytes | bytearray) -> str:
    text = bytes(data[:24])
    return repr(text)[1:] if text.isascii() else text.hex(" ")


def _verdict(flow: _Flow) -> StreamVerdict:
    """Whether ``flow`` is Kafka: its client's first bytes are a request frame (a known api key and
    version, a consistent size), and a response with the same correlation id comes back. When the
    capture missed the stream's start, the first frame boundary is looked for in the bytes it has."""

    def name(end: tuple[str, int]) -> str:
        return f"{end[0]}:{end[1]}"

    sides = [flow.syn_from] if flow.syn_from is not None else [flow.a, flow.b]
    first = flow.syn_from or flow.a
    other_of = {flow.a: flow.b, flow.b: flow.a}
    client_data = flow.data.get(first, bytearray())
    if not any(flow.data.values()):
        return StreamVerdict(name(first), name(other_of[first]), False, "no TCP payload")
    if client_data[:2] == b"\x16\x03" and flow.syn_from is not None:
        return StreamVerdict(name(first), name(other_of[first]), False, "TLS: encrypted, cannot be read")
    unanswered = False
    for client in sides:
        server = other_of[client]
        sent, back = flow.data.get(client, bytearray()), flow.data.get(server, bytearray())
        starts = [0] if flow.syn_from is not None else (m.start() for m in _FRAME_START.finditer(sent))
        for at in starts:
            corrs = _chain(sent, at)
            if corrs is None:
                continue
            if _answered(back, corrs, flow.syn_from is not None):
                how = "request header at the stream's start" if at == 0 else f"frame boundary at byte {at}"
                return StreamVerdict(name(client), name(server), True, how)
            unanswered = True
    if unanswered:
        reason = "requests, but no response with their correlation id"
    elif flow.syn_from is not None:
        reason = f"not Kafka: the client's first bytes {_preview(client_data)} are not a request header"
    else:
        reason = "not Kafka: no request frame found (the capture starts mid-stream)"
    return StreamVerdict(name(first), name(other_of[first]), False, reason)


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

    Kafka is found on any port: a stream whose client's first bytes are a request frame (a known api key
    and version, a consistent size) answered by a response with the same correlation id makes its
    broker's port a broker port (``StreamVerdict``; a stream the capture joined mid-stream is searched
    for its first frame boundary). So are ``broker_ports``, and, with ``learn_ports``, every port the
    Metadata responses seen announce (the capture is read again when that finds new ones). Every stream
    with an end on a broker port is read; the others are skipped, each with its reason in the stats.

    Requests are what goes to a broker port, responses what comes from one; each response is paired
    with its stream's request by correlation id (as the tap does).
    """
    import tempfile

    if not path.is_file():
        raise PcapError(f"cannot read {path}: no such file")
    starts, ends = _stream_starts(path)
    with tempfile.TemporaryDirectory(prefix="kpmon-pcap-") as work:
        ordered, flows = _in_sequence_order(path, Path(work) / "ordered.pcap")
        verdicts = [_verdict(flow) for flow in flows.values()]
        given = set(broker_ports)
        found = {_port(v.broker) for v in verdicts if v.kafka}
        announced: set[int] = set()
        while True:
            ports = given | found | announced
            frames, stats = _frames(ordered, starts, ends, ports)
            new = (_metadata_ports(frames) if learn_ports else set()) - ports
            if not new:
                break
            announced |= new
    stats.broker_ports = ports
    stats.given_ports, stats.found_ports, stats.announced_ports = given, found, announced
    stats.verdicts = verdicts
    return frames, stats


def _frames(
    path: Path, starts: set[int], ends: set[int], ports: set[int]
) -> tuple[list[TapFrame], PcapStats]:
    """Each TCP stream's frames as the tap records them: every stream is fed, request and response
    PDUs in capture order, to a tap core of its own (``tap.core``, the tap's one framing, pairing and
    capture, ``full`` policy), and its schema-3 records are read back (``frames_from_record``). A
    request that gets no response (acks=0, the capture ends) is a record of its own. ``path`` is in
    sequence order (``_in_sequence_order``); ``starts`` and ``ends`` are ``_stream_starts``'.
    Returned in event-time order (``ts_ns``, connection, ``seq``), as a tap's topic is read."""
    import json

    from codec.taprecord import CLOSE, OPEN, Connection, Part, frames_from_record, pack_static
    from tap.core import CoreSettings, TapCore, capture_slow, new_core

    settings = CoreSettings(capture="full")
    stats = PcapStats()
    pdus = _pdus(path, ports) if ports else []
    frames: list[TapFrame] = []
    cores: dict[int, TapCore] = {}
    synced: set[int] = set(starts)
    last_ts: dict[int, tuple[int, str, str]] = {}
    #: Records read back so far: each record's stand-in offset, so every finding's anchor is unique.
    taken = [0]

    def read(value: bytes) -> None:
        frames.extend(frames_from_record(None, value, -1, taken[0]))
        taken[0] += 1

    def drain(core: TapCore, everything: bool = False) -> None:
        while (record := core.take_record(0, 0)) is not None:
            read(record[0])
        if everything and (record := core.flush(0, 0)) is not None:
            read(record[0])

    def lifecycle(core: TapCore, kind: str, ts_ns: int, client: str, broker: str) -> None:
        value = json.dumps({"client": client, "broker": broker}).encode()
        core.lifecycle(kind, Part(kind, ts_ns, None, None, None, value), ts_ns)

    def feed(core: TapCore, request: bool, data: bytes, ts_ns: int) -> None:
        core.feed(request, struct.pack(">i", len(data)) + data, ts_ns, ts_ns, 0)
        while (slow := core.slow()) is not None:
            core.resolve(*capture_slow(slow, settings))
            core.feed(request, b"", ts_ns, ts_ns, 0)
        drain(core)

    for pdu in pdus:
        src_port, dst_port = _port(pdu.src), _port(pdu.dst)
        if src_port not in ports and dst_port not in ports:
            continue  # Wireshark reads its own default ports as Kafka too: only the broker ports count
        stats.pdus += 1
        is_request = dst_port in ports and not (src_port in ports and dst_port not in ports)
        client, broker = (pdu.src, pdu.dst) if is_request else (pdu.dst, pdu.src)
        conn = f"pcap-{pdu.stream}"
        core = cores.get(pdu.stream)
        if core is None:
            static = pack_static(Connection(conn, client, broker, capture="full"))
            core = cores[pdu.stream] = new_core(settings, static)
            stats.streams += 1
            lifecycle(core, OPEN, pdu.ts_ns, client, broker)
        last_ts[pdu.stream] = (pdu.ts_ns, client, broker)
        if pdu.stream not in synced:
            # Mid-stream start: Wireshark's PDU boundaries are guesses until one request decodes.
            if not is_request or not _request_decodes(conn, pdu, client, broker):
                stats.skipped_before_boundary += 1
                continue
            synced.add(pdu.stream)
        feed(core, is_request, pdu.data, pdu.ts_ns)
    for stream in sorted(cores):
        core = cores[stream]
        ts_ns, client, broker = last_ts[stream]
        # Requests the capture never shows an answer to: records of their own, before the close.
        core.drain(ts_ns)
        if stream in ends:
            lifecycle(core, CLOSE, ts_ns, client, broker)
        drain(core, everything=True)
        stats.unpaired_responses += core.counters().lone.get("unknown_request", 0)
    frames.sort(key=lambda frame: (frame.ts_ns, frame.conn, frame.seq))
    return frames, stats


def _request_decodes(conn: str, pdu: _Pdu, client: str, broker: str) -> bool:
    """Whether ``pdu`` is a request whose header and body decode: a frame boundary for sure."""
    from codec.errors import DecodeError
    from codec.peek import peek_request_header
    from codec.taprecord import decode_frame

    try:
        peek_request_header(pdu.data)
    except DecodeError:
        return False
    probe = TapFrame(conn, 0, pdu.ts_ns, "req", client=client, broker=broker, capture="full")
    return decode_frame(probe, pdu.data).error is None
