"""``kpmon report --pcap`` / ``kpmon decode --pcap``: real traffic captured by tcpdump gives the findings
the tap gives for the same traffic; Kafka is found on any port by itself, beside other TCP traffic;
retransmitted, reordered and cut captures are handled.

Clients run real violations through the real tap while ``tcpdump`` (Debian's, installed by ``make
setup``) captures the client side of the tap on loopback, on a port the kernel chose (not 9092), with
HTTP from python's ``http.server`` beside it. The same traffic is then checked twice: from the tap topic
and from the pcap. A Kafka 3.9 broker is captured directly, with no tap.
"""

from __future__ import annotations

import functools
import http.server
import itertools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import checks
from codec.taprecord import TapFrame
from deploy.local.stack import LocalStack
from kpmon.cli import main
from kpmon.pcap import frames_from_pcap
from kpmon.traffic import violations
from tests.checks import matrix
from tests.checks.tapped import read_tap_frames
from tests.tap.harness import TappedCluster, topic_end_offsets

pytestmark = [pytest.mark.integration]


def _findings(frames: list[TapFrame]) -> Counter[tuple[str, str]]:
    monitor = checks.new_monitor()
    found = monitor.feed_all(frames) + monitor.flush()
    return Counter((f.rule, f.severity.value) for f in found)


def _by_client(frames: list[TapFrame]) -> dict[str, list[tuple[str, int | None, int | None]]]:
    """Each connection's requests in order, then its responses in order. (Between the two directions
    the order depends on where one looks: the tap sees a response before the client's next request
    that the client, on the wire, had already sent.)"""
    out: dict[str, list[tuple[str, int | None, int | None]]] = {}
    for direction in ("req", "resp"):
        for f in frames:
            if f.direction == direction:
                out.setdefault(f.client, []).append((f.direction, f.api_key, f.correlation_id))
    return out


def _key(frames: list[TapFrame]) -> dict[str, list[tuple[str, int | None, int | None, bytes | None]]]:
    """Each connection's frames in order, by the client's address (stream numbers depend on which
    streams the capture holds; the order across connections is the capture's)."""
    out: dict[str, list[tuple[str, int | None, int | None, bytes | None]]] = {}
    for f in frames:
        if f.direction in ("req", "resp"):
            out.setdefault(f.client, []).append((f.direction, f.api_key, f.correlation_id, f.raw))
    return out


@dataclass
class Captured:
    pcap: Path
    tapped: list[TapFrame]
    #: The port clients reached the (tapped) broker on, and the HTTP server's.
    port: int
    http_port: int
    #: ``matrix.member_epoch_fencing``'s result and group: a KIP-848 member joined, was fenced, left.
    fencing: dict[str, Any]
    fenced_group: str
    mixed_group: str


@contextmanager
def _http_server(root: Path) -> Iterator[int]:
    """python's http.server on loopback, serving ``root``; yields its port."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "index.html").write_text("<p>not Kafka</p>" * 50)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _fetch(port: int) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html", timeout=10) as answer:
        assert b"not Kafka" in answer.read()


@contextmanager
def _tcpdump(pcap: Path, ports: list[int]) -> Iterator[None]:
    tcpdump = shutil.which("tcpdump")
    if tcpdump is None:
        pytest.fail("tcpdump is missing: `make setup` installs it (Debian package tcpdump)")
    expression = " or ".join(f"tcp port {p}" for p in ports)
    dump = subprocess.Popen(
        [tcpdump, "-i", "lo", "-U", "-w", str(pcap), expression], stderr=subprocess.PIPE, text=True
    )
    try:
        assert dump.stderr is not None
        assert "listening on" in dump.stderr.readline()
        yield
        time.sleep(1)  # tcpdump stops at once on SIGINT: give it the packets still in its buffer first
    finally:
        dump.send_signal(signal.SIGINT)
        dump.wait(30)


@pytest.fixture(scope="module")
def captured(tapped_cluster: TappedCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captured]:
    work = tmp_path_factory.mktemp("pcap")
    pcap = work / "clients.pcap"
    port = tapped_cluster.tap_addr[1]
    tap, topic = tapped_cluster.start_tap(capture="full")
    fenced_group, mixed_group = f"fence-{uuid.uuid4().hex[:6]}", f"mixed-{uuid.uuid4().hex[:6]}"
    try:
        with _http_server(work / "www") as http_port, _tcpdump(pcap, [port, http_port]):
            since = topic_end_offsets(tapped_cluster.mirror_bootstrap, topic)
            bootstrap = tapped_cluster.bootstrap
            _fetch(http_port)
            violations.out_of_range_versions(bootstrap)
            violations.zombie_producer(bootstrap, "pcap-zombie", f"tx-{uuid.uuid4().hex[:6]}")
            _fetch(http_port)
            violations.mixed_protocol_group(bootstrap, mixed_group, "pcap-mixed")
            fencing = matrix.member_epoch_fencing(bootstrap, "pcap-fence", fenced_group)
            # (Not envelope_from_client: the tap mirrors a client's Envelope header-only, as it may carry
            # another principal's secrets, so its findings differ from the whole frame's by design.)
            tap.wait_mirrored()
            time.sleep(1)
            tapped = read_tap_frames(tapped_cluster.mirror_bootstrap, topic, since)
    finally:
        tap.stop()
    yield Captured(pcap, tapped, port, http_port, fencing, fenced_group, mixed_group)


def test_a_tcpdump_capture_gives_the_findings_the_tap_gives(captured: Captured) -> None:
    # No port given: the broker's port is found from the streams' own bytes, the HTTP ones are skipped.
    frames, stats = frames_from_pcap(captured.pcap)
    assert stats.skipped_before_boundary == 0 and stats.unpaired_responses == 0, stats
    assert stats.found_ports == stats.broker_ports == {captured.port}, stats.summary()
    skipped = stats.skipped()
    assert len(skipped) == 2 and {v.broker for v in skipped} == {f"127.0.0.1:{captured.http_port}"}
    assert all("not Kafka" in v.reason and "GET /index.html" in v.reason for v in skipped), skipped
    # The same frames: the tap's connections are the capture's TCP streams.
    by_client_pcap = _by_client(frames)
    by_client_tap = _by_client(captured.tapped)
    differ = {}
    for client, expected in by_client_tap.items():
        got = by_client_pcap.get(client) or []
        if got == expected[: len(got)] and all(d == "resp" for d, _, _ in expected[len(got) :]):
            # Responses the tap read from the broker after the client had closed: mirrored, but the
            # client's RST came first, so they never crossed the wire tcpdump watched.
            continue
        if got != expected:
            at = next(
                (i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b),
                min(len(expected), len(got)),
            )
            differ[client] = (at, expected[at : at + 4], got[at : at + 4], len(expected), len(got))
    assert not differ, differ
    from_tap, from_pcap = _findings(captured.tapped), _findings(frames)
    assert {rule for rule, _sev in from_tap} >= {
        "apiversions.out_of_range",
        "apiversions.removed_version_rejected",
        "producer.stale_epoch_rejected",
        "group.protocol_type_mismatch",
        "group.member_epoch_fenced",
    }
    assert from_pcap == from_tap
    # --broker-port forces a port: given, the result is the same; given the HTTP port, it is read as Kafka.
    again, forced = frames_from_pcap(captured.pcap, [captured.port])
    assert _key(again) == _key(frames) and forced.given_ports == {captured.port}
    _, http_forced = frames_from_pcap(captured.pcap, [captured.http_port])
    assert http_forced.broker_ports == {captured.port, captured.http_port} and not http_forced.skipped()
    assert f"{captured.http_port} (given)" in http_forced.summary()


def test_retransmitted_and_reordered_segments_give_the_same_frames(
    captured: Captured, tmp_path: Path
) -> None:
    from scapy.layers.inet import TCP
    from scapy.utils import rdpcap, wrpcap

    pcap = captured.pcap
    packets = list(rdpcap(str(pcap)))
    data = [i for i, p in enumerate(packets) if TCP in p and len(p[TCP].payload) > 0]
    assert len(data) > 20
    mangled = list(packets)
    # Every 7th data segment is sent twice (a retransmission).
    for i in reversed(data[::7]):
        mangled.insert(i + 1, packets[i].copy())
    # Consecutive data segments of one direction, with nothing from the other side between them
    # (pipelined requests, a frame split in two), arrive swapped: out of order, as TCP can deliver them.
    flows: dict[tuple[int, int], list[int]] = {}
    for i in data:
        flows.setdefault((packets[i][TCP].sport, packets[i][TCP].dport), []).append(i)
    swapped = 0
    for (sport, dport), segments in flows.items():
        reverse = set(flows.get((dport, sport), []))
        for a, b in itertools.pairwise(segments):
            if any(r in reverse for r in range(a, b)) or packets[a][TCP].seq == packets[b][TCP].seq:
                continue
            x, y = mangled.index(packets[a]), mangled.index(packets[b])
            if y < x:
                continue
            first, second = mangled[x].copy(), mangled[y].copy()
            first.time, second.time = mangled[y].time, mangled[x].time  # capture times still run forward
            mangled[x], mangled[y] = second, first
            swapped += 1
    assert swapped >= 3, swapped
    out = tmp_path / "mangled.pcap"
    wrpcap(str(out), mangled)
    original, _ = frames_from_pcap(pcap)
    again, stats = frames_from_pcap(out)
    assert stats.found_ports == {captured.port}, stats.summary()
    whole, seen = _key(original), _key(again)
    differ = {
        conn: ([(d, k, c) for d, k, c, _ in frames], [(d, k, c) for d, k, c, _ in seen.get(conn, [])])
        for conn, frames in whole.items()
        if seen.get(conn) != frames
    }
    assert not differ, differ
    assert stats.unpaired_responses == 0


def test_a_capture_that_starts_mid_stream_skips_and_counts_what_precedes_a_frame_boundary(
    captured: Captured, tmp_path: Path
) -> None:
    from scapy.layers.inet import TCP
    from scapy.utils import rdpcap, wrpcap

    pcap, port = captured.pcap, captured.port
    packets = list(rdpcap(str(pcap)))
    # Start the capture in the middle of the busiest connection: its handshake and first segments are
    # gone, and its first remaining request segment lost its first 3 bytes (the capture begins mid-frame).
    requests = Counter(
        (p[TCP].sport, p[TCP].dport)
        for p in packets
        if TCP in p and len(p[TCP].payload) > 3 and p[TCP].dport == port
    )
    ((client_side, _count),) = requests.most_common(1)
    both = (client_side, client_side[::-1])
    own = [i for i, p in enumerate(packets) if TCP in p and (p[TCP].sport, p[TCP].dport) in both]
    sent = [i for i in own if packets[i][TCP].sport == client_side[0] and len(packets[i][TCP].payload) > 3]
    cut_at = sent[len(sent) // 2]
    first = packets[cut_at]
    payload = bytes(first[TCP].payload)
    half = first.copy()
    half[TCP].remove_payload()
    half[TCP].seq = first[TCP].seq + 3
    half = half / payload[3:]
    dropped = {i for i in own if i < cut_at}
    kept = [half if i == cut_at else p for i, p in enumerate(packets) if i not in dropped]
    out = tmp_path / "cut.pcap"
    wrpcap(str(out), kept)
    original, _ = frames_from_pcap(pcap)
    cut, stats = frames_from_pcap(out)
    assert stats.skipped_before_boundary >= 1, stats
    whole, partial = _key(original), _key(cut)
    # Every other connection is whole; the cut one keeps only frames from its end, in order.
    changed = [conn for conn in whole if partial.get(conn) != whole[conn]]
    assert len(changed) == 1, changed
    rest = partial.get(changed[0], [])
    assert len(rest) < len(whole[changed[0]])
    assert whole[changed[0]][len(whole[changed[0]]) - len(rest) :] == rest
    # The cut connection alone, beside the HTTP streams: no stream starts with its handshake on the
    # broker's port, so Kafka is found by the first frame boundary in the cut stream's own bytes.
    alone = [
        p
        for p in kept
        if TCP in p
        and ((p[TCP].sport, p[TCP].dport) in both or captured.http_port in (p[TCP].sport, p[TCP].dport))
    ]
    wrpcap(str(tmp_path / "alone.pcap"), alone)
    only, found = frames_from_pcap(tmp_path / "alone.pcap")
    assert found.found_ports == {port}, found.summary()
    (verdict,) = [v for v in found.verdicts if v.kafka]
    assert verdict.broker.endswith(f":{port}") and verdict.reason.startswith("frame boundary at byte"), (
        verdict
    )
    assert _key(only) == {changed[0]: rest}


def test_report_and_decode_read_a_pcap(
    captured: Captured, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pcap, port = captured.pcap, captured.port
    out, doc = tmp_path / "report.html", tmp_path / "report.json"
    code = main(["report", "--pcap", str(pcap), "--out", str(out), "--json", str(doc)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert f"pcap {pcap}" in text and "producer.stale_epoch_rejected" in text
    # The summary names where Kafka was found and what was skipped, and why.
    assert f"Kafka frames on ports {port} (found);" in text, text
    assert f"2 other TCP streams skipped (2 to 127.0.0.1:{captured.http_port}: not Kafka" in text, text
    assert main(["decode", "--pcap", str(pcap)]) == 0
    decoded = capsys.readouterr()
    assert '"api_name": "ApiVersions"' in decoded.out and f"ports {port} (found)" in decoded.err
    assert os.path.getsize(out) > 1000
    # The groups show what the capture saw, not what was left of them at the end.
    groups = {g["group"]: g for g in json.loads(doc.read_text())["summary"]["groups"]}
    fenced, epoch = groups[captured.fenced_group], captured.fencing["epoch"]
    assert epoch > 0 and captured.fencing["left"] == 0, captured.fencing
    assert fenced == {
        "group": captured.fenced_group,
        "protocol": "consumer",
        "protocol_type": None,
        "protocol_name": "server default",  # the member asked for no assignor
        "generation": epoch,
        "member_epoch": epoch,
        "members": 0,
        "state": "Empty",
        "state_from": "members",
        "members_seen": 1,
        "members_left": 1,
        "members_fenced": 1,
    }
    # The classic group: the kafka-python member's generation, the Connect member refused.
    mixed = groups[captured.mixed_group]
    assert (mixed["protocol"], mixed["protocol_type"], mixed["state_from"]) == (
        "classic",
        "consumer",
        "members",
    )
    assert mixed["generation"] >= 1 and mixed["members_seen"] >= 1, mixed
    assert mixed["members_seen"] == mixed["members"] + mixed["members_left"] + mixed["members_fenced"], mixed
    page = out.read_text()
    assert "members seen" in page and "server default" in page


def test_a_3x_broker_on_its_own_port_keeps_removed_versions_at_info(
    legacy_kafka_stack: LocalStack, tmp_path: Path
) -> None:
    """A 3.9 broker, captured directly (no tap) on the port it listens on: Kafka is found there, and
    the versions 4.0 removed are what a 3.x broker still serves: ``apiversions.removed_in_4_0`` (info),
    no warning. (In front of a 4.x broker they are ``apiversions.removed_version_rejected``: the test
    above.)"""
    (broker,) = legacy_kafka_stack.listen_endpoints
    pcap = tmp_path / "legacy.pcap"
    with _tcpdump(pcap, [broker.port]):
        sent = violations.out_of_range_versions(legacy_kafka_stack.bootstrap_servers)
    frames, stats = frames_from_pcap(pcap)
    assert stats.found_ports == {broker.port} and not stats.skipped(), stats.summary()
    monitor = checks.new_monitor()
    found = monitor.feed_all(frames) + monitor.flush()
    removed = {
        (f.evidence["api_key"], f.evidence["api_version"]): f.severity.value
        for f in found
        if f.rule == "apiversions.removed_in_4_0"
    }
    assert removed[(0, 2)] == "info" and removed[(1, 3)] == "info", (sent, removed)
    assert not [f for f in found if f.rule == "apiversions.removed_version_rejected"], sent
    # The 3.9 broker answered Produce v2 and Fetch v3 (it closed only on what it does not know).
    assert sent["broker"].endswith("answered/answered"), sent
