"""``kpmon export --pcap``: what the tap mirrored, as a pcap that tshark dissects as Kafka.

Real clients through the real tap; the tap topic is read back as a capture file, exported, and
``tshark`` (Debian's, installed by ``make setup``) must dissect every exported frame as Kafka with the
api key, version and correlation id the tap recorded.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from checks.report import record_to_json
from codec.taprecord import headers_dict
from kpmon.cli import main
from kpmon.traffic import violations, workload
from tests.tap.harness import TappedCluster, read_topic_range, topic_end_offsets

pytestmark = [pytest.mark.integration]


def _tshark() -> str:
    found = shutil.which("tshark")
    if found is None:
        pytest.fail("tshark is missing: `make setup` installs it (Debian package tshark)")
    return found


def test_tshark_dissects_every_exported_frame_as_kafka(tapped_cluster: TappedCluster, tmp_path: Path) -> None:
    tap, topic = tapped_cluster.start_tap(capture="full")
    try:
        since = topic_end_offsets(tapped_cluster.mirror_bootstrap, topic)
        workload.clean_round(tapped_cluster.bootstrap, f"pcap-{uuid.uuid4().hex[:6]}", "pcap-group")
        violations.out_of_range_versions(tapped_cluster.bootstrap)
        tap.wait_mirrored()
        records = read_topic_range(tapped_cluster.mirror_bootstrap, topic, since)
    finally:
        tap.stop()
    capture = tmp_path / "tap.jsonl"
    capture.write_text(
        "".join(
            record_to_json(headers_dict(r.headers), r.value, r.partition, r.offset) + "\n" for r in records
        )
    )
    pcap = tmp_path / "tap.pcap"
    assert main(["export", "--capture", str(capture), "--pcap", str(pcap)]) == 0

    from kpmon.commands.report import frames_from_capture

    frames = [f for f in frames_from_capture(capture) if f.direction in ("req", "resp") and f.raw is not None]
    requests = [f for f in frames if f.direction == "req" and f.api_key is not None]
    assert len(requests) >= 20
    port = int(requests[0].broker.rpartition(":")[2])
    fields = [
        "tcp.srcport",
        "kafka.correlation_id",
        "kafka.request_key",
        "kafka.api_version",
        "_ws.malformed",
    ]
    done = subprocess.run(
        [_tshark(), "-r", str(pcap), "-d", f"tcp.port=={port},kafka", "-Y", "kafka", "-T", "fields"]
        + [arg for name in fields for arg in ("-e", name)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    dissected = [line.split("\t") for line in done.stdout.splitlines() if line.strip()]
    # One Kafka PDU per exported frame (every frame fits one segment here).
    assert len(dissected) == len(frames), (len(dissected), len(frames))
    seen = {
        (int(corr), int(key), int(version))
        for src, corr, key, version, _malformed in dissected
        if int(src) != port and corr and key and version
    }
    expected = {
        (f.correlation_id, f.api_key, f.api_version) for f in requests if f.correlation_id is not None
    }
    assert expected <= seen, sorted(expected - seen)[:10]
