"""What a live micro-batch of the job's Spark topology costs before its rows: the floor under the latency.

The live job's batches took ~2 s at 3,000 frames/s, ~1.5 s of it whatever the batch held
(docs/benchmarks.md). This benchmark asks how much of that is Spark's, not the monitor's: it runs the
job's query shape with processors that do next to nothing, on ``local[2]`` with the job's own session
settings (``streaming.session``: RocksDB state, changelog checkpoints, the checkpoint file manager), a
1 s trigger and Spark's ``rate`` source at ``--rate`` rows/s, one query after another:

1. **shuffle** (the comparison): the rows regrouped by bucket (one shuffle, as the stateful stage's input is),
   then ``foreachBatch`` collecting them to the driver, as the job's sink does;
2. **one stage**: the same with one ``transformWithStateInPandas`` stage grouped by bucket, event time
   and a watermark, whose processor does per call what a job bucket does at least: read its meta,
   write it back, move its timer, emit one row; the job's shape since ``87b60d9``;
3. **two stages**: a second such stage, grouped by bucket again, behind the first: the job's shape
   before ``87b60d9``, kept so the two compare in one run.

Each query runs ``--seconds``; the figures are the medians over the batches that read rows, after the
first ``--warmup`` batches: the trigger's wall time, and within it ``addBatch`` and query planning.
The per-stage cost is the difference against the shuffle query, measured in the same run.

    python benchmarks/batch_floor_bench.py [--rate 3000] [--seconds 40] [--buckets 8] [--no-write]

Writes ``benchmarks/results/batch_floor_bench.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pandas as pd  # noqa: E402
from pyspark.sql.streaming.stateful_processor import (  # noqa: E402
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType  # noqa: E402

from benchmarks.results_file import header, write  # noqa: E402
from kpconfig.model import KpmonConfig  # noqa: E402
from streaming.session import build_session  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "batch_floor_bench.json"
PAGE_KEY = StructType([StructField("page", IntegerType())])
BLOB = StructType([StructField("data", BinaryType())])
OUTPUT_DDL = "bucket int, event_time timestamp, rows long"
VARIANTS = ("shuffle", "one_stage", "two_stages")


class MinimalBucket(StatefulProcessor):
    """Per call, the least a job bucket does: its meta read and written, its timer moved, one row out."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        # Never read: declared so the stage registers the job's state variables (a map of pages beside the
        # meta), whose encoders the state server builds in every task.
        self.pages = handle.getMapState("pages", PAGE_KEY, BLOB)
        self.meta = handle.getValueState("meta", BLOB)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        count = 0
        newest = None
        for pdf in rows:
            count += len(pdf)
            newest = pdf["event_time"].max() if newest is None else max(newest, pdf["event_time"].max())
        value = self.meta.get()
        armed = int.from_bytes(value[0], "big") if value else None
        wanted = timerValues.getCurrentWatermarkInMs() + 60_000
        if armed is not None:
            self.handle.deleteTimer(armed)
        self.handle.registerTimer(wanted)
        self.meta.update((wanted.to_bytes(8, "big"),))
        yield pd.DataFrame([{"bucket": int(key[0]), "event_time": newest, "rows": count}])

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        self.meta.clear()
        yield from ()

    def close(self) -> None:
        pass


def _query(variant: str, rate: int, buckets: int, work: Path) -> Any:
    spark = build_session(_config(), app_name=f"kpmon-batch-floor-{variant}")
    spark.sparkContext.setLogLevel("ERROR")
    from pyspark.sql import functions as F

    rows = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .option("numPartitions", 2)
        .load()
        .select(
            F.col("timestamp").alias("event_time"), (F.col("value") % buckets).cast("int").alias("bucket")
        )
    )
    if variant == "shuffle":
        out = rows.repartition("bucket")
    else:
        out = (
            rows.withWatermark("event_time", "2 seconds")
            .groupBy("bucket")
            .transformWithStateInPandas(
                MinimalBucket(), OUTPUT_DDL, "Append", "EventTime", eventTimeColumnName="event_time"
            )
        )
        if variant == "two_stages":
            out = out.groupBy("bucket").transformWithStateInPandas(
                MinimalBucket(), OUTPUT_DDL, "Append", "EventTime"
            )

    def sink(batch: Any, _batch_id: int) -> None:
        batch.collect()

    query = (
        out.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(work / variant))
        .trigger(processingTime="1 second")
        .start()
    )
    return spark, query


def _config() -> KpmonConfig:
    return KpmonConfig.model_validate(
        {"stream": {"master": "local[2]", "shuffle_partitions": 2, "metrics_port": None}}
    )


def run(variant: str, rate: int, buckets: int, seconds: float, work: Path) -> list[dict[str, Any]]:
    """Every batch's progress (durations and input rows) of ``variant`` run for ``seconds``."""
    progress: list[dict[str, Any]] = []
    spark, query = _query(variant, rate, buckets, work)
    seen: set[int] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.5)
        for p in query.recentProgress:
            if p.batchId not in seen:
                seen.add(p.batchId)
                progress.append({"batch": p.batchId, "rows": p.numInputRows, "ms": dict(p.durationMs)})
    query.stop()
    spark.stop()
    return progress


def summarize(progress: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Medians over the batches that read rows, after the first ``warmup``."""
    steady = [p for p in progress if p["batch"] >= warmup and p["rows"]]
    if not steady:
        return {"batches": 0}

    def median(key: str) -> float:
        return float(statistics.median(p["ms"].get(key, 0) for p in steady))

    return {
        "batches": len(steady),
        "rows_per_batch": float(statistics.median(p["rows"] for p in steady)),
        "trigger_ms": median("triggerExecution"),
        "add_batch_ms": median("addBatch"),
        "planning_ms": median("queryPlanning"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=3000, help="rows/s from the rate source")
    parser.add_argument("--seconds", type=float, default=40.0, help="how long each query runs")
    parser.add_argument(
        "--buckets", type=int, default=8, help="grouping values (the job's default on 2 partitions)"
    )
    parser.add_argument("--warmup", type=int, default=5, help="batches left out at the start of each query")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="kpmon-batch-floor-bench-"))
    results: dict[str, Any] = {}
    for variant in VARIANTS:
        print(f"{variant}: {args.rate} rows/s, 1 s trigger, {args.seconds:.0f} s ...", flush=True)
        results[variant] = summarize(run(variant, args.rate, args.buckets, args.seconds, work), args.warmup)
        r = results[variant]
        if r["batches"]:
            print(
                f"    {r['trigger_ms']:.0f} ms per batch (addBatch {r['add_batch_ms']:.0f}, planning "
                f"{r['planning_ms']:.0f}) over {r['batches']} batches of ~{r['rows_per_batch']:.0f} rows"
            )
    load_after = os.getloadavg()
    base = results["shuffle"].get("trigger_ms")
    ratios = {v: results[v]["trigger_ms"] / base for v in VARIANTS if base and results[v].get("batches")}
    print("  per batch against the shuffle query: " + ", ".join(f"{v} {r:.2f}x" for v, r in ratios.items()))
    print(f"  load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    if not args.no_write:
        record = header("batch_floor_bench")
        record["machine"].update(load_before=load_before, load_after=load_after)
        record.update(
            rate=args.rate,
            seconds=args.seconds,
            buckets=args.buckets,
            warmup_batches=args.warmup,
            results=results,
            ratios_to_shuffle=ratios,
        )
        write(RESULTS, record, ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
