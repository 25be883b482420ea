"""Tap-topic volume per capture policy: bytes the tap mirrors for each byte of client traffic.

Runs ``tap.capture.capture`` (what the tap runs on every frame) over the codec benchmark's workload
(benchmarks/codec_bench.py: the same 13 frames and the same two mixes) and reports, per policy, the
mirrored value size against the frame size. A size figure, not a timing: it is deterministic.

    python -m benchmarks.tap_topic_size          # writes benchmarks/results/tap_topic_size.json

On top of the value, each tap record carries its key (the connection id), its Kafka record framing and
its packed metadata. A schema-3 record (what the tap writes) holds a connection's entries of one flush
(``tap/flush.py``: up to 64, or 256 KiB, or 50 ms), the connection's fields once, then per exchange
entry its kind, ``seq`` and the two frames' metadata (``codec.taprecord``). ``RECORD_OVERHEAD`` is
what one exchange costs beyond its frames' bytes in a full flush of typical exchanges, the record's
key and framing shared out over its entries.
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
from codec.taprecord import EXCHANGE, Connection, Part, pack_flush, pack_static
from tap.capture import FrameInfo, Policy, capture
from tap.flush import FlushLimits

POLICIES: tuple[Policy, ...] = ("full", "headers", "meta")
MAX_MIRRORED = 900_000
#: A connection's constant metadata, with typical values (packed into each of its records).
SAMPLE_CONNECTION = Connection(
    conn="kpmon-tap-0-7d9f8b6c4-x2x9q-1.k3j9a2-12345",
    client="10.12.34.56:51234",
    broker="kafka-0.kafka-headless.kafka.svc.cluster.local:9092",
    broker_id=0,
    listener="CLIENT",
    tap="kpmon-tap-0-7d9f8b6c4-x2x9q",
    capture="headers",
)
#: Kafka's v2 record framing around key and value: length, attributes, timestamp and offset deltas,
#: key and value lengths, header count (varints, typical sizes).
RECORD_FRAMING = 12


def record_overhead(
    connection: Connection = SAMPLE_CONNECTION, entries: int = FlushLimits().max_entries
) -> int:
    """Bytes per exchange of a full schema-3 flush beyond its frames' mirrored bytes: the record's key,
    framing and the connection's fields shared out over ``entries`` exchanges, plus each entry's own
    metadata (rounded up)."""
    flush = []
    payloads = 0
    for n in range(entries):
        ts = 1_763_840_894_123_456_789 + n * 700_000
        request = Part("req", ts, 0, 11, 123_456 + n, b"q" * 700)
        response = Part("resp", ts + 2_000_000, 0, 11, 123_456 + n, b"r" * 60)
        flush.append((EXCHANGE, 123_456 + n, [request, response]))
        payloads += 760
    value = pack_flush(pack_static(connection), flush)
    total = len(connection.conn.encode()) + RECORD_FRAMING + len(value) - payloads
    return -(-total // entries)


RECORD_OVERHEAD = record_overhead()


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
            # Per exchange (two wire frames) of a full schema-3 flush.
            mixes[mix][f"{policy}_record_ratio"] = (values + RECORD_OVERHEAD * count / 2) / client
    return {"per_frame": per_frame, "mixes": mixes, "record_overhead_bytes": RECORD_OVERHEAD}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    result = measure()
    print(f"record key, framing and metadata: about {result['record_overhead_bytes']} bytes per exchange")
    print(f"{'frame':<28}{'bytes':>9}" + "".join(f"{p:>10}" for p in POLICIES))
    for name, sizes in result["per_frame"].items():
        print(f"{name:<28}{sizes['frame']:>9,}" + "".join(f"{sizes[p]:>10,}" for p in POLICIES))
    for mix, figures in result["mixes"].items():
        ratios = ", ".join(
            f"{p} {figures[f'{p}_value_ratio']:.4f} (with key and metadata {figures[f'{p}_record_ratio']:.4f})"
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
