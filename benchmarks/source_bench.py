"""What the tap record's Kafka headers cost Spark's raw read of the tap topic.

The tap puts a frame's metadata in Kafka record headers, one header per field (codec.taprecord). The
job reads them (``includeHeaders``), and so does ``stream_bench.py``'s raw read, the denominator of the
whole job's ratio. This benchmark reads the same backlog with Spark's Kafka source, ``availableNow``,
``count`` per batch, on ``local[2]``, in alternating rounds:

1. **with headers**: value, headers, partition and offset, as the job reads it;
2. **without headers**: value, partition and offset (``includeHeaders`` false): what a record that
   carried its metadata in fewer headers could approach.

It prints frames/s and CPU per frame of each, and the ratio, per round and as the median over the
warm rounds (the first round of each pays the JVM's warm-up and is reported, not counted).

    python benchmarks/source_bench.py [--frames 500000] [--rounds 3]

Writes ``benchmarks/results/source_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import stream_bench  # noqa: E402

from benchmarks.results_file import machine  # noqa: E402
from deploy.local.stack import LocalStack  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "source_bench.json"
TOPIC = "kpmon.bench.tap"
#: The two reads: name, columns selected, ``includeHeaders``.
READS = (
    ("with_headers", ("value", "headers", "partition", "offset"), True),
    ("without_headers", ("value", "partition", "offset"), False),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the first is warm-up")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the first round is the JVM's warm-up)")
    from streaming.job import source_options
    from streaming.session import build_session

    home = Path(tempfile.mkdtemp(prefix="kpmon-source-bench-"))
    stack = LocalStack(home / "stack")
    stack.up()
    out: dict[str, Any] = {"machine": machine()}
    try:
        bootstrap = stack.bootstrap_servers
        # The layout whose header cost this measures: one record per frame, metadata in headers.
        stream_bench.SCHEMA["version"] = 1
        frames = stream_bench.preload(bootstrap, TOPIC, args.frames, time.time_ns() - 3600 * 10**9)["records"]
        print(f"preloaded {frames:,} frames", flush=True)
        config = stream_bench._config(home / "state", bootstrap, TOPIC)
        spark = build_session(config, "kpmon-source-bench")

        def count(df: Any, batch_id: int) -> None:
            df.count()

        rounds: list[dict[str, Any]] = []
        for n in range(args.rounds):
            this: dict[str, Any] = {}
            for name, columns, headers in READS:
                options = {**source_options(config), "includeHeaders": str(headers).lower()}
                df = spark.readStream.format("kafka").options(**options).load().select(*columns)
                this[name] = stream_bench.run_available_now(df, count, home / f"ck-{n}-{name}")
                print(
                    f"round {n + 1}/{args.rounds} {name:16}{stream_bench.rate_line(this[name])}", flush=True
                )
            this["ratio"] = (
                this["without_headers"]["rows_per_second"] / this["with_headers"]["rows_per_second"]
            )
            rounds.append(this)
        spark.stop()
    finally:
        stack.down()
    warm = rounds[1:]
    out["rounds"] = rounds
    out["warm_median"] = {
        "with_headers_frames_per_second": statistics.median(
            r["with_headers"]["rows_per_second"] for r in warm
        ),
        "without_headers_frames_per_second": statistics.median(
            r["without_headers"]["rows_per_second"] for r in warm
        ),
        "with_headers_cpu_us_per_frame": statistics.median(
            r["with_headers"]["cpu_us_per_frame"] for r in warm
        ),
        "without_headers_cpu_us_per_frame": statistics.median(
            r["without_headers"]["cpu_us_per_frame"] for r in warm
        ),
        "ratio_without_over_with": statistics.median(r["ratio"] for r in warm),
    }
    out["machine"]["load_after"] = os.getloadavg()
    median = out["warm_median"]
    print(
        f"warm median: with headers {median['with_headers_frames_per_second']:,.0f} frames/s "
        f"({median['with_headers_cpu_us_per_frame']:.1f} us CPU/frame), without "
        f"{median['without_headers_frames_per_second']:,.0f} frames/s "
        f"({median['without_headers_cpu_us_per_frame']:.1f} us CPU/frame): "
        f"{median['ratio_without_over_with']:.2f}x"
    )
    if not args.no_write:
        RESULTS.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
