"""Tap-topic volume per capture policy: bytes the tap mirrors for each byte of client traffic.

Runs ``tap.capture.capture`` (what the tap runs on every frame) over the codec benchmark's workload
(benchmarks/codec_bench.py: the same 13 frames and the same two mixes) and reports, per policy, the
mirrored value size against the frame size. A size figure, not a timing: it is deterministic.

    python -m benchmarks.tap_topic_size          # writes benchmarks/results/tap_topic_size.json

The record key and headers come on top of the value: the tap writes 15 headers per frame record
(tap/proxy.py ``_mirror``). ``RECORD_OVERHEAD`` estimates their size with typical values.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.codec_bench import MIXES, build_frames
from tap.capture import FrameInfo, Policy, capture

POLICIES: tuple[Policy, ...] = ("full", "headers", "meta")
MAX_MIRRORED = 900_000
#: Key (connection id) and the 15 headers of a frame record, with typical values, plus the v2 record
#: framing (lengths, offsets and timestamp deltas). An estimate; the values are measured.
SAMPLE_HEADERS = {
    "dir": "req",
    "seq": "123456",
    "ts_ns": "1763840894123456789",
    "api_key": "0",
    "api_version": "9",
    "corr_id": "123456",
    "redacted": "",
    "conn": "tap-7f3a9c2e-12345",
    "client": "10.12.34.56:51234",
    "broker": "kafka-0.kafka-headless.kafka.svc.cluster.local:9092",
    "broker_id": "0",
    "listener": "PLAINTEXT",
    "tap": "tap-7f3a9c2e",
    "capture": "headers",
    "schema": "1",
}
RECORD_OVERHEAD = (
    len(SAMPLE_HEADERS["conn"])
    + sum(len(k) + len(v) + 2 for k, v in SAMPLE_HEADERS.items())
    + 12  # record length, attributes, timestamp and offset deltas, key/value lengths, header count
)


def measure() -> dict[str, Any]:
    frames = {f.name: f for f in build_frames()}
    per_frame: dict[str, dict[str, int]] = {}
    for name, spec in frames.items():
        info = FrameInfo("req" if spec.is_request else "resp", len(spec.data), spec.api_key, spec.version)
        per_frame[name] = {"frame": len(spec.data)}
        for policy in POLICIES:
            per_frame[name][policy] = len(capture(spec.data, info, policy, MAX_MIRRORED).value)
    mixes: dict[str, dict[str, float]] = {}
    for mix, weights in MIXES.items():
        count = sum(weights.values())
        client = sum(per_frame[n]["frame"] * w for n, w in weights.items())
        mixes[mix] = {"frames": count, "client_bytes": client}
        for policy in POLICIES:
            values = sum(per_frame[n][policy] * w for n, w in weights.items())
            mixes[mix][f"{policy}_value_ratio"] = values / client
            mixes[mix][f"{policy}_record_ratio"] = (values + RECORD_OVERHEAD * count) / client
    return {"per_frame": per_frame, "mixes": mixes, "record_overhead_bytes": RECORD_OVERHEAD}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    result = measure()
    print(f"record key + headers: about {result['record_overhead_bytes']} bytes per frame")
    print(f"{'frame':<28}{'bytes':>9}" + "".join(f"{p:>10}" for p in POLICIES))
    for name, sizes in result["per_frame"].items():
        print(f"{name:<28}{sizes['frame']:>9,}" + "".join(f"{sizes[p]:>10,}" for p in POLICIES))
    for mix, figures in result["mixes"].items():
        ratios = ", ".join(
            f"{p} {figures[f'{p}_value_ratio']:.4f} (with headers {figures[f'{p}_record_ratio']:.4f})"
            for p in POLICIES
        )
        print(f"mix {mix}: mirrored/client bytes: {ratios}")
    if not args.no_write:
        out = Path(__file__).resolve().parent / "results" / "tap_topic_size.json"
        meta = {
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": platform.python_version(),
        }
        out.write_text(json.dumps({"benchmark": "tap_topic_size", **meta, **result}, indent=1) + "\n")
        print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
