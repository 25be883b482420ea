"""``kpmon report --pcap`` / ``kpmon decode --pcap``: real traffic captured by tcpdump gives the findings
the tap gives for the same traffic; retransmitted, reordered and cut captures are handled.

Clients run real violations through the real tap while ``tcpdump`` (Debian's, installed by ``make
setup``) captures the client side of the tap on loopback. The same traffic is then checked twice: from
the tap topic and from the pcap.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import checks
from codec.taprecord import TapFrame
from kpmon.cli import main
from kpmon.pcap import frames_from_pcap
from kpmon.traffic import violations
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


@pytest.fixture(scope="module")
def captured(
    tapped_cluster: TappedCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, list[TapFrame], int]]:
    tcpdump = shutil.which("tcpdump")
    if tcpdump is None:
        pytest.fail("tcpdump is missing: `make setup` installs it (Debian package tcpdump)")
    pcap = tmp_path_factory.mktemp("pcap") / "clients.pcap"
    port = tapped_cluster.tap_addr[1]
    tap, topic = tapped_cluster.start_tap(capture="full")
    dump = subprocess.Popen(
        [tcpdump, "-i", "lo", "-U", "-w", str(pcap), f"tcp port {port}"], stderr=subprocess.PIPE, text=True
    )
    try:
        assert dump.stderr is not None
        assert "listening on" in dump.stderr.readline()
        since = topic_end_offsets(tapped_cluster.mirror_bootstrap, topic)
        bootstrap = tapped_cluster.bootstrap
        violations.out_of_range_versions(bootstrap)
        violations.zombie_producer(bootstrap, "pcap-zombie", f"tx-{uuid.uuid4().hex[:6]}")
        violations.mixed_protocol_group(bootstrap, f"mixed-{uuid.uuid4().hex[:6]}", "pcap-mixed")
        # (Not envelope_from_client: the tap mirrors a client's Envelope header-only, as it may carry
        # another principal's secrets, so its findings differ from the whole frame's by design.)
        tap.wait_mirrored()
        time.sleep(1)
        tapped = read_tap_frames(tapped_cluster.mirror_bootstrap, topic, since)
    finally:
        dump.send_signal(signal.SIGINT)
        dump.wait(30)
        tap.stop()
    yield pcap, tapped, port


def test_a_tcpdump_capture_gives_the_findings_the_tap_gives(
    captured: tuple[Path, list[TapFrame], int],
) -> None:
    pcap, tapped, port = captured
    frames, stats = frames_from_pcap(pcap, [port])
    assert stats.skipped_before_boundary == 0 and stats.unpaired_responses == 0, stats
    # The same frames: the tap's connections are the capture's TCP streams.
    by_client_pcap = _by_client(frames)
    by_client_tap = _by_client(tapped)
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
    from_tap, from_pcap = _findings(tapped), _findings(frames)
    assert {rule for rule, _sev in from_tap} >= {
        "apiversions.out_of_range",
        "producer.stale_epoch_rejected",
        "group.protocol_type_mismatch",
    }
    assert from_pcap == from_tap


def test_retransmitted_and_reordered_segments_give_the_same_frames(
    captured: tuple[Path, list[TapFrame], int], tmp_path: Path
) -> None:
    from scapy.layers.inet import TCP
    from scapy.utils import rdpcap, wrpcap

    pcap, _tapped, port = captured
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
    original, _ = frames_from_pcap(pcap, [port])
    again, stats = frames_from_pcap(out, [port])
    whole, seen = _key(original), _key(again)
    differ = {
        conn: ([(d, k, c) for d, k, c, _ in frames], [(d, k, c) for d, k, c, _ in seen.get(conn, [])])
        for conn, frames in whole.items()
        if seen.get(conn) != frames
    }
    assert not differ, differ
    assert stats.unpaired_responses == 0


def test_a_capture_that_starts_mid_stream_skips_and_counts_what_precedes_a_frame_boundary(
    captured: tuple[Path, list[TapFrame], int], tmp_path: Path
) -> None:
    from scapy.layers.inet import TCP
    from scapy.utils import rdpcap, wrpcap

    pcap, _tapped, port = captured
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
    original, _ = frames_from_pcap(pcap, [port])
    cut, stats = frames_from_pcap(out, [port])
    assert stats.skipped_before_boundary >= 1, stats
    whole, partial = _key(original), _key(cut)
    # Every other connection is whole; the cut one keeps only frames from its end, in order.
    changed = [conn for conn in whole if partial.get(conn) != whole[conn]]
    assert len(changed) == 1, changed
    rest = partial.get(changed[0], [])
    assert len(rest) < len(whole[changed[0]])
    assert whole[changed[0]][len(whole[changed[0]]) - len(rest) :] == rest


def test_report_and_decode_read_a_pcap(
    captured: tuple[Path, list[TapFrame], int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pcap, _tapped, port = captured
    out = tmp_path / "report.html"
    code = main(["report", "--pcap", str(pcap), "--broker-port", str(port), "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert f"pcap {pcap}" in text and "producer.stale_epoch_rejected" in text
    assert main(["decode", "--pcap", str(pcap), "--broker-port", str(port)]) == 0
    decoded = capsys.readouterr()
    assert '"api_name": "ApiVersions"' in decoded.out and "TCP streams" in decoded.err
    assert os.path.getsize(out) > 1000
