"""The streaming job's pure stage steps, no Spark: µs per frame for each part, against a full decode.

Runs the fleet workload of ``benchmarks/stream_bench.py`` (client sessions: ApiVersions, Metadata,
InitProducerId, 18 idempotent Produce exchanges with real v2 batches, close) through exactly what the
job's Python workers run, in micro-batches, with the job's default bucket count:

1. **route**: the ``mapInArrow`` stage (``streaming.bundles.bundle_batches``: the one decode, the
   stateless routing, a bundle per bucket) on Kafka-source Arrow batches of 10,000 records, and the
   stage's reading of the bundles (``streaming.router.read_bundle``); its two main parts, the decode
   and the routing of the decoded frames, are also timed apart (``route_parts``);
2. **stage**: the one stateful stage, ``streaming.stages.monitor_bucket`` per bucket (plus its timers).

Each bucket's state is kept as the job keeps it: in pages (``streaming.pages``) over an in-memory
backend that counts the state-server round trips the job would make, beside the count the per-key
layout before it would make (an entry read, written or removed each; the due index and the timer per
call). ``--store dict`` keeps plain dicts instead (the steps alone). ``--produces N`` makes each session
N Produce exchanges long, so connections live across many micro-batches as a fleet's do.

The comparison, measured in the same run on the same frames: one full codec decode per frame
(``codec.decode_request`` / ``codec.decode_response``), the floor of any design that decodes a frame
once. The earlier target for the stateful work (then two stages) was 25 µs per frame.

    python benchmarks/stages_bench.py [--sessions 2000] [--produces 18] [--batch 20000] [--repeats 3]
                                      [--store paged|dict] [--profile route|stage] [--default-gc]

Each figure is the fastest of ``--repeats`` runs of the whole workload (each on fresh state): on a shared
host the speed moves between runs a minute apart by more than a change may gain.

Writes ``benchmarks/results/stages_bench.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402

import codec  # noqa: E402
from benchmarks.results_file import header, write  # noqa: E402
from benchmarks.stream_bench import SCHEMA, session  # noqa: E402
from checks.settings import ChecksSettings  # noqa: E402
from codec import taprecord  # noqa: E402
from kpconfig.model import StreamConfig  # noqa: E402
from streaming.bundles import KAFKA_SOURCE_SCHEMA, batch_clock_ms, bundle_batches, joined  # noqa: E402
from streaming.frames import batch_frames  # noqa: E402
from streaming.job import bucket_labels  # noqa: E402
from streaming.pages import DictPageBackend, PagedBucketStore  # noqa: E402
from streaming.router import (  # noqa: E402
    PASS_BUCKET,
    Bundle,
    header_exchanges,
    read_bundle,
    route_frames,
    stage_rows,
)
from streaming.stages import BucketStore, DictBucketStore, LocalStages  # noqa: E402
from streaming.workergc import collector_paused, tune_worker_gc  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "stages_bench.json"
TARGET_US = 25.0
NS_PER_MS = 1_000_000
#: The checks' settings every run uses (the latency benchmark's lateness).
SETTINGS = ChecksSettings(watermark_seconds=2.0)


def tap_records(sessions: int, produces: int = 18) -> list[tuple[dict[str, str], bytes, int, int]]:
    """Sessions interleaved by the time the tap wrote each record, as (headers, value, partition,
    offset) on two tap partitions, in the schema ``stream_bench.SCHEMA`` names (``--schema``)."""
    out: list[tuple[int, dict[str, str], bytes, int]] = []
    start = 1_700_000_000 * 10**9
    for index in range(sessions):
        for key, raw, headers in session(index, start + index * 2_000_000, produces=produces):
            h = dict(headers or ())
            written = taprecord.record_time_ns(h, raw)
            assert written is not None, "the benchmark writes only tap records"
            out.append((written, h, raw, zlib.crc32(key) % 2))
    out.sort(key=lambda item: item[0])
    return [(h, raw, part, offset) for offset, (_, h, raw, part) in enumerate(out)]


def frames_of(records: list[tuple[dict[str, str], bytes, int, int]]) -> int:
    """The frames the records hold (one per schema-1 record, an exchange's two per schema-2 one, every
    entry's in a schema-3 flush)."""
    return sum(len(e.parts) for h, raw, _, _ in records for e in taprecord.parse_records(h, raw))


#: Records per Arrow batch the Kafka source hands ``mapInArrow`` (Spark's ``maxRecordsPerBatch``).
SOURCE_BATCH = 10_000
LABELS = bucket_labels(StreamConfig().buckets, StreamConfig().shuffle_partitions)


def source_batches(records: list[tuple[dict[str, str], bytes, int, int]]) -> list[pa.RecordBatch]:
    """Records as the Kafka source hands them to ``mapInArrow``: value, headers, partition, offset."""
    return [
        pa.RecordBatch.from_pylist(
            [
                {
                    "value": value,
                    "headers": [{"key": k, "value": v.encode()} for k, v in headers.items()],
                    "partition": partition,
                    "offset": offset,
                }
                for headers, value, partition, offset in records[start : start + SOURCE_BATCH]
            ],
            schema=KAFKA_SOURCE_SCHEMA,
        )
        for start in range(0, len(records), SOURCE_BATCH)
    ]


#: Bucket grouping value -> bucket number.
BUCKET_OF_LABEL = {label: index for index, label in enumerate(LABELS)}


#: Rows the bundles handed the stateful stage's entries so far (``streaming.router.stage_rows``), and the
#: exchanges the connection rows among them carried by their headers (``header_exchanges``).
STAGE_ROWS = [0, 0]
#: Whether the routing runs with the job workers' collector settings (``--default-gc`` clears it).
WORKER_GC = [True]


def routed(batches: list[pa.RecordBatch]) -> dict[int, list[Bundle]]:
    """The job's ``mapInArrow`` stage, then the stage reading what it made: each bucket's bundles (the
    passed aggregates are read too, as the stage passes them on)."""
    out: dict[int, list[Bundle]] = {}
    for bundled in bundle_batches(
        SETTINGS, LABELS, WORKER_GC[0], StreamConfig().route_batch_records, batches
    ):
        for label, data in zip(
            bundled.column("bucket").to_pylist(), bundled.column("bundle").to_pylist(), strict=True
        ):
            if label != PASS_BUCKET:
                bundle = read_bundle(data)
                STAGE_ROWS[0] += stage_rows(bundle)
                STAGE_ROWS[1] += header_exchanges(bundle)
                out.setdefault(BUCKET_OF_LABEL[label], []).append(bundle)
    return out


def full_decode(
    records: list[tuple[dict[str, str], bytes, int, int]], clock: Callable[[], float] = time.perf_counter
) -> float:
    """Seconds of ``clock`` the codec takes to decode every frame of ``records``: the comparison the
    routing is measured against, timed by the same clock as what it is compared with."""
    parts = [
        p for headers, raw, _, _ in records for e in taprecord.parse_records(headers, raw) for p in e.parts
    ]
    start = clock()
    for part in parts:
        if part.direction == "req":
            codec.decode_request(part.value or b"")
        elif part.direction == "resp":
            assert part.api_key is not None and part.api_version is not None
            codec.decode_response(part.value or b"", part.api_key, part.api_version)
    return clock() - start


class CountedDictStore:
    """A dict store that counts the round trips the per-key layout before the pages made: an entry read
    (of a key the due index names), written or removed each, and per call the due index and the timer
    read, and each written when they changed (counted as written). (A wrapper: the compiled
    ``DictBucketStore`` cannot be subclassed from interpreted code.)"""

    def __init__(self) -> None:
        self.store = DictBucketStore()
        self.round_trips = 0

    def begin(self) -> None:
        self.round_trips += 4  # due index and timer: read, and (at most) written back

    def finish(self) -> None:
        pass

    def get(self, key: str) -> tuple[Any, ...] | None:
        found = self.store.get(key)
        self.round_trips += found is not None
        return found

    def put(self, key: str, value: tuple[Any, ...]) -> None:
        self.round_trips += 1
        self.store.put(key, value)

    def remove(self, key: str) -> None:
        self.round_trips += key in self.store.entries
        self.store.remove(key)

    def items(self) -> Iterable[tuple[str, tuple[Any, ...]]]:
        return self.store.items()

    def due(self, watermark_ms: int) -> tuple[list[tuple[str, tuple[Any, ...]]], int | None]:
        ready, later = self.store.due(watermark_ms)
        self.round_trips += len(ready)
        return ready, later


class RoundTrips:
    """Makes each bucket's store for the timed run: the job's pages over a counting backend (or plain
    dicts), and adds up the round trips the pages made. The per-key layout's count for the same
    records comes from a second, untimed pass (``count_per_key_round_trips``)."""

    def __init__(self, paged: bool) -> None:
        self.paged = paged
        self.backends: list[DictPageBackend] = []

    def store(self) -> BucketStore:
        if not self.paged:
            return DictBucketStore()
        backend = DictPageBackend()
        self.backends.append(backend)
        return PagedBucketStore(backend)

    def paged_round_trips(self) -> int:
        return sum(backend.round_trips for backend in self.backends)


def count_per_key_round_trips(records: list[tuple[dict[str, str], bytes, int, int]], batch: int) -> int:
    """The per-key layout's round trips for the same run (an untimed second pass over counted dicts)."""
    stores: list[CountedDictStore] = []

    def counted() -> BucketStore:
        stores.append(CountedDictStore())
        return stores[-1]

    drive(records, batch, LocalStages(SETTINGS, StreamConfig().buckets, counted))
    return sum(store.round_trips for store in stores)


def routing_work(
    records: list[tuple[dict[str, str], bytes, int, int]], batch: int, now_ms: int
) -> list[tuple[pa.RecordBatch, int, int]]:
    """The batches the ``mapInArrow`` stage routes (Spark's, ``batch`` records per micro-batch, joined to
    ``stream.route_batch_records``): each batch, its frame count and its clock (ms; ``now_ms`` where the
    batch has no time of its own)."""
    work: list[tuple[pa.RecordBatch, int, int]] = []
    for start in range(0, len(records), batch):
        for joined_batch in joined(
            source_batches(records[start : start + batch]), StreamConfig().route_batch_records
        ):
            frames, times = batch_frames(joined_batch)
            work.append((joined_batch, len(frames), batch_clock_ms(times, now_ms)))
    return work


def route_parts(records: list[tuple[dict[str, str], bytes, int, int]], batch: int) -> dict[str, float]:
    """Seconds the two parts of the ``mapInArrow`` stage's Python work take apart, over the batches the
    stage routes (``routing_work``): the decode into frames (``streaming.frames.batch_frames``: reading
    the records and decoding their frames) and the routing of the decoded frames into bundles
    (``streaming.router.route_frames``), with the collector as the stage has it. What ``route`` adds to
    them is reading the Arrow batches in and packing and reading the bundles."""
    seconds = {"decode": 0.0, "routing": 0.0}
    for joined_batch, _, newest_ms in routing_work(records, batch, time.time_ns() // NS_PER_MS):
        with collector_paused(WORKER_GC[0]):
            t0 = time.perf_counter()
            frames, _ = batch_frames(joined_batch)
            t1 = time.perf_counter()
            route_frames(SETTINGS, frames, newest_ms, len(LABELS))
            t2 = time.perf_counter()
        seconds["decode"] += t1 - t0
        seconds["routing"] += t2 - t1
    return seconds


def drive(
    records: list[tuple[dict[str, str], bytes, int, int]],
    batch: int,
    stages: LocalStages,
    timed: Callable[..., Any] | None = None,
) -> None:
    """Feed the records through ``stages`` in micro-batches as the job does, through ``timed`` parts."""

    def untimed(part: str, work: Callable[..., Any], *args: Any) -> Any:
        return work(*args)

    step = timed or untimed
    lateness_ms = int(stages.config.watermark_seconds * 1000)
    watermark_ms, max_ms = 0, 0
    for start in [*range(0, len(records), batch), len(records)]:
        chunk = records[start : start + batch]
        if not chunk:
            watermark_ms = max_ms + 1  # the end: let the watermark pass everything
        sources = source_batches(chunk)
        bundles = step("route", routed, sources)
        step("stage", stages.stage, bundles, watermark_ms)
        if chunk:
            newest = max(taprecord.record_time_ns(headers, raw) or 0 for headers, raw, _, _ in chunk)
            max_ms = max(max_ms, newest // NS_PER_MS)
            watermark_ms = max(watermark_ms, max_ms - lateness_ms)


def run(
    records: list[tuple[dict[str, str], bytes, int, int]], batch: int, profile: str | None, trips: RoundTrips
) -> dict[str, float]:
    stages = LocalStages(SETTINGS, StreamConfig().buckets, trips.store)
    seconds = {"route": 0.0, "stage": 0.0}
    STAGE_ROWS[:] = [0, 0]
    profiler = cProfile.Profile() if profile else None

    def timed(part: str, work: Callable[..., Any], *args: Any) -> Any:
        if profiler is not None and part == profile:
            profiler.enable()
        t0 = time.perf_counter()
        result = work(*args)
        seconds[part] += time.perf_counter() - t0
        if profiler is not None and part == profile:
            profiler.disable()
        return result

    drive(records, batch, stages, timed)
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=2000, help="client sessions (43 frames each)")
    parser.add_argument("--produces", type=int, default=18, help="Produce exchanges per session")
    parser.add_argument(
        "--store",
        choices=["paged", "dict"],
        default="paged",
        help="each bucket's state: the job's pages (counting round trips), or plain dicts",
    )
    parser.add_argument("--batch", type=int, default=20_000, help="tap records per micro-batch")
    parser.add_argument("--profile", choices=["route", "stage"], help="cProfile one part")
    parser.add_argument(
        "--default-gc",
        action="store_true",
        help="keep CPython's collector settings (default: the job's workers' settings, stream.worker_gc)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="run the workload this many times and keep each part's fastest: a shared host's speed moves "
        "between runs by more than a change may gain (1 when profiling)",
    )
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--schema",
        type=int,
        choices=[1, 2, 3],
        default=3,
        help="tap-record schema: 3 (one record per connection flush, what taps write), 2 (one per exchange) or 1 (one per frame)",
    )
    args = parser.parse_args()
    SCHEMA["version"] = args.schema
    print(f"building {args.sessions} sessions (tap-record schema {args.schema})...", flush=True)
    records = tap_records(args.sessions, args.produces)
    worker_gc = not args.default_gc and StreamConfig().worker_gc
    WORKER_GC[0] = worker_gc
    if worker_gc:
        # As the job's stateful workers run (streaming/workergc.py), after the imports and the input.
        tune_worker_gc()
    frames = frames_of(records)
    load_before = os.getloadavg()
    repeats = 1 if args.profile else max(1, args.repeats)
    decode_s = min(full_decode(records) for _ in range(repeats))
    runs = []
    for _ in range(repeats):
        trips = RoundTrips(args.store == "paged")  # the last run's count: each run makes the same trips
        runs.append(run(records, args.batch, args.profile, trips))
    seconds = {part: min(r[part] for r in runs) for part in runs[0]}
    parts = [route_parts(records, args.batch) for _ in range(repeats)]
    split = {part: min(p[part] for p in parts) / frames * 1e6 for part in parts[0]}
    rows_per_frame = STAGE_ROWS[0] / frames
    headers_per_frame = STAGE_ROWS[1] / frames
    load_after = os.getloadavg()
    round_trips = None
    if trips.paged:
        round_trips = {
            "paged": trips.paged_round_trips(),
            "per_key": count_per_key_round_trips(records, args.batch),
        }
    us = {k: v / frames * 1e6 for k, v in seconds.items()}
    floor_us = decode_s / frames * 1e6
    stages_us = us["route"] + us["stage"]
    gc_label = "worker settings" if worker_gc else "CPython defaults"
    print(
        f"frames {frames} in {len(records)} schema-{args.schema} records ({args.sessions} sessions of {args.produces} Produce exchanges), batch {args.batch}, "
        f"buckets {StreamConfig().buckets}, store {args.store}, collector: {gc_label}, fastest of {repeats} runs"
    )
    print(f"  full codec decode (comparison)  {floor_us:7.1f} µs/frame")
    for name, label in (
        ("route", "mapInArrow + bundle read"),
        ("stage", "stateful stage"),
    ):
        print(f"  {label:31} {us[name]:7.1f} µs/frame  ({us[name] / floor_us:.2f}x a full decode)")
    print(
        f"  mapInArrow's parts apart: decode {split['decode']:.1f}, routing the decoded frames {split['routing']:.1f} µs/frame"
    )
    verdict = "met" if stages_us <= TARGET_US else "missed"
    print(
        f"  route and stage                 {stages_us:7.1f} µs/frame  (earlier target <= {TARGET_US}: {verdict})"
    )
    if round_trips is not None:
        per_1k = {k: v / frames * 1000 for k, v in round_trips.items()}
        print(
            f"  state round trips per 1k frames: pages {per_1k['paged']:.1f}, "
            f"an entry per key {per_1k['per_key']:.1f} ({round_trips['per_key'] / max(round_trips['paged'], 1):.1f}x)"
        )
    print(
        f"  rows into the stateful stage     {rows_per_frame:7.3f} per wire frame "
        f"(and {headers_per_frame:.3f} exchanges by their headers in the connections' rows)"
    )
    print(f"  load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    if args.profile:
        # The profiler's own cost inflates every figure above: a profiled run is never the record.
        print("profiled run: results not written")
    elif not args.no_write:
        record = header("stages_bench")
        record.update(
            load_average={"before": load_before, "after": load_after},
            frames=frames,
            schema=args.schema,
            records=len(records),
            sessions=args.sessions,
            produces=args.produces,
            store=args.store,
            state_round_trips=round_trips,
            batch=args.batch,
            repeats=repeats,
            buckets=StreamConfig().buckets,
            worker_gc=worker_gc,
            us_per_frame={
                **us,
                "route_and_stage": stages_us,
                "full_decode_comparison": floor_us,
                "route_decode": split["decode"],
                "route_routing": split["routing"],
            },
            stage={
                "rows_per_wire_frame": rows_per_frame,
                "header_exchanges_per_wire_frame": headers_per_frame,
            },
            target_us_route_and_stage=TARGET_US,
            verdict=verdict,
        )
        write(RESULTS, record, ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
