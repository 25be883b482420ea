"""What Spark's ``transformWithStateInPandas`` state API costs per value, against one value holding as much.

The job's stateful stage keeps its state through the state API of ``transformWithStateInPandas``:
each value read or written is a message to the JVM's state server, which converts it (pickle, Spark
rows, the store's Avro encoding) and reads or writes RocksDB. This benchmark measures, inside one
processor call, on ``local[2]`` with the job's own session settings (``streaming.session``):

1. **per key**: ``N`` ``MapState.updateValue`` calls of ``S``-byte values, then ``N`` ``getValue``;
2. **one value** (the comparison): one ``ValueState.update`` of a value holding the same ``N x S``
   bytes, then one ``get``;
3. **list rows**: one ``ListState.appendList`` of ``N`` rows, then one ``get`` of them.

Each is timed in ``--rounds`` rounds; the first round warms the JVM up and is left out, and the
figure is the median of the others. The ratio is per-key time over one-value time: what it costs to
keep ``N`` entries as ``N`` values instead of one. docs/benchmarks.md ("State API") reads the
figures; docs/decisions.md holds the designs they decided (the due index, the bucket store).

    python benchmarks/state_api_bench.py [--keys 100] [--size 400] [--rounds 4] [--no-write]

Writes ``benchmarks/results/state_api_bench.json``.
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
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType  # noqa: E402

from benchmarks.results_file import header, write  # noqa: E402
from kpconfig.model import KpmonConfig  # noqa: E402
from streaming.session import build_session  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "state_api_bench.json"
KEY = StructType([StructField("key", StringType())])
VALUE = StructType([StructField("data", BinaryType()), StructField("at", LongType())])
ROW = StructType([StructField("key", StringType()), StructField("data", BinaryType())])
#: What each measurement does, in the order one round runs them.
OPERATIONS = ("map_write", "map_read", "value_write", "value_read", "list_append", "list_read")
OUTPUT_DDL = "round long, operation string, seconds double"


class StateCosts(StatefulProcessor):
    """Times the state operations for every (round, keys, size) input row, in one call."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.map = handle.getMapState("per_key", KEY, VALUE)
        self.value = handle.getValueState("one_value", VALUE)
        self.list = handle.getListState("list_rows", ROW)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        out: list[dict[str, Any]] = []
        for pdf in rows:
            for round_no, keys, size in zip(pdf["round"], pdf["keys"], pdf["size"], strict=True):
                out += self._round(int(round_no), int(keys), int(size))
        yield pd.DataFrame(out, columns=["round", "operation", "seconds"])

    def _round(self, round_no: int, keys: int, size: int) -> list[dict[str, Any]]:
        data = os.urandom(size)
        names = [f"key-{round_no}-{i}" for i in range(keys)]
        timings: dict[str, float] = {}

        def timed(operation: str, work: Any) -> None:
            start = time.perf_counter()
            work()
            timings[operation] = time.perf_counter() - start

        def map_write() -> None:
            for i, name in enumerate(names):
                self.map.updateValue((name,), (data, i))

        timed("map_write", map_write)
        timed("map_read", lambda: [self.map.getValue((n,)) for n in names])
        timed("value_write", lambda: self.value.update((data * keys, round_no)))
        timed("value_read", lambda: self.value.get())
        self.list.clear()
        timed("list_append", lambda: self.list.appendList([(n, data) for n in names]))
        timed("list_read", lambda: sum(1 for _ in self.list.get()))
        return [{"round": round_no, "operation": op, "seconds": timings[op]} for op in OPERATIONS]

    def close(self) -> None:
        pass


def measure(keys: int, size: int, rounds: int) -> list[dict[str, Any]]:
    """Every round's timings, from one streaming query with one group (one processor call)."""
    spark = build_session(KpmonConfig(), app_name="kpmon-state-api-bench")
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix="kpmon-state-api-bench-"))
    specs = pd.DataFrame([{"group": 0, "round": r, "keys": keys, "size": size} for r in range(rounds)])
    (work / "in").mkdir()
    specs.to_json(work / "in" / "specs.json", orient="records", lines=True)
    collected: list[dict[str, Any]] = []

    def collect(batch: Any, _batch_id: int) -> None:
        collected.extend(row.asDict() for row in batch.collect())

    query = (
        spark.readStream.schema("group long, round long, keys long, size long")
        .json(str(work / "in"))
        .groupBy("group")
        .transformWithStateInPandas(
            StateCosts(), outputStructType=OUTPUT_DDL, outputMode="Append", timeMode="None"
        )
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()
    return collected


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Median seconds per operation over the rounds after the first (the JVM's warm-up)."""
    warm = [r for r in rows if r["round"] > 0] or rows
    return {op: statistics.median(r["seconds"] for r in warm if r["operation"] == op) for op in OPERATIONS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=100, help="entries per measurement (N)")
    parser.add_argument("--size", type=int, default=400, help="bytes per entry (S)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds; the first is warm-up, left out")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()
    print(f"{args.rounds} rounds of {args.keys} entries of {args.size} bytes, local[2] ...", flush=True)
    seconds = summarize(measure(args.keys, args.size, args.rounds))
    load_after = os.getloadavg()
    per_key = {op: seconds[op] / args.keys * 1e6 for op in OPERATIONS}
    write_ratio = seconds["map_write"] / seconds["value_write"]
    read_ratio = seconds["map_read"] / seconds["value_read"]
    for op in OPERATIONS:
        print(
            f"  {op:12} {seconds[op] * 1e3:8.2f} ms for {args.keys} entries  ({per_key[op]:7.1f} µs per entry)"
        )
    print(f"  {args.keys} values against one value of {args.keys * args.size:,} bytes:")
    print(f"    writes {write_ratio:.1f}x, reads {read_ratio:.1f}x")
    print(f"  load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    if not args.no_write:
        record = header("state_api_bench")
        record["machine"].update(load_before=load_before, load_after=load_after)
        record.update(
            keys=args.keys,
            entry_bytes=args.size,
            rounds=args.rounds,
            median_seconds=seconds,
            us_per_entry=per_key,
            ratios={"per_key_over_one_value_write": write_ratio, "per_key_over_one_value_read": read_ratio},
        )
        write(RESULTS, record, ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
