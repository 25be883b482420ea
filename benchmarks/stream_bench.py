"""Streaming monitor throughput and alert latency, against Spark's raw read of the same topic.

Pre-loads a tap topic with a fleet of synthetic client sessions (handshake, metadata, an idempotent
producer's InitProducerId and Produce exchanges with real v2 batches, fetches, close), each frame a tap
record per the tap topic contract, then measures on ``local[2]`` in one run:

1. **raw**: Spark's Kafka source alone (``count`` per batch): the ceiling;
2. **rows**: raw + the job's ``mapInArrow`` stage (``streaming.job.frame_bundles``: the tap-record rows,
   decoded once and routed with no state into a bundle per bucket, ``streaming.router``);
3. **job**: the whole monitor (that stage, the one stateful stage, alert book, Great Expectations,
   hooks);
   frames/s, and the batch-time breakdown from Spark's progress (state operator time, GX time); and
   ``stage``: the rows the job's router handed its stateful stage per wire frame, from its own counters
   (``wire_frames``, ``stage_rows``, ``stage_header_exchanges`` engine events);
4. **latency**: the job live on a 1 s trigger while frames arrive at half its sustained rate, with
   violations injected; p50/p95 from a violating frame's ``ts_ns`` to webhook receipt, over the whole
   run (the verdict) and after the first 15 s of traffic (the job starts cold), with every alert's
   figure in ``series``, and ``beyond_lateness``: the same less the lateness
   (``checks.watermark_seconds``, 2 s here), which every entity finding waits for by design. A live job
   pays each micro-batch's fixed cost, and here shares the host with the broker and the feeder, so it
   may not keep up where the backlog's rate says it should: a run
   *kept up* when, over its batches after the first 15 s, Spark processed rows at least as fast as
   they arrived (median ``processedRowsPerSecond`` >= median ``inputRowsPerSecond``). Otherwise its
   latencies measure a growing backlog, not the job, and the run is repeated at 0.6x the rate (up to
   ``--latency-attempts`` runs; a ``--latency-rate`` given is kept). ``latency`` is the first run that
   kept up (with no figures when none did); ``latency_attempts`` lists every run.

All three throughput runs use ``availableNow`` over the same backlog and the same
``maxOffsetsPerTrigger``; rates are rows over the sum of batch durations (start-up excluded).

    python benchmarks/stream_bench.py [--frames 2000000] [--latency-seconds 60] [--quick]
                                      [--live-connections N]

``--live-connections N`` preloads N long-lived connections written round-robin instead of short
sessions one after another: every micro-batch then touches every connection's and producer's state,
as a fleet's traffic does (the short sessions' state mostly lives and dies inside one batch).

Writes ``benchmarks/results/stream_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import codec  # noqa: E402
from benchmarks.results_file import cores_changed, machine  # noqa: E402
from codec import taprecord  # noqa: E402
from codec.records import build_record_batch  # noqa: E402
from deploy.local.stack import LocalStack  # noqa: E402
from kpconfig.model import KpmonConfig  # noqa: E402
from tap.flush import FlushBuffer, FlushLimits  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "stream_bench.json"


#: The tap-record schema the backlog and the latency feed are written in (``--schema``).
SCHEMA = {"version": 3}
#: The connection fields of every synthetic session, as a schema-2 tap packs them once per connection.
_CLIENT, _BROKER = "10.1.0.1:40000", "127.0.0.1:9092"


def _static(conn: str) -> bytes:
    return taprecord.pack_static(taprecord.Connection(conn, _CLIENT, _BROKER, 1, "PLAINTEXT", "", "headers"))


def _exchange(conn: str, seq: int, request: taprecord.Part, response: taprecord.Part) -> tuple:
    """One schema-2 record: a request and its response, numbered as the tap numbers records."""
    return (
        conn.encode(),
        taprecord.pack_record(taprecord.EXCHANGE, seq, _static(conn), [request, response]),
        None,
    )


class _Flushes:
    """One connection's schema-3 records, gathered by the tap's own flush buffer under its default
    bounds, the clock being each entry's frame time; the rest when the connection closes."""

    def __init__(self, conn: str) -> None:
        self.conn = conn
        self.buffer = FlushBuffer(FlushLimits())

    def add(self, kind: str, seq: int, parts: list[taprecord.Part]) -> Iterator[tuple]:
        for entries in self.buffer.add(kind, seq, parts, parts[0].ts_ns):
            yield self._record(entries)

    def flush(self) -> Iterator[tuple]:
        if len(self.buffer):
            yield self._record(self.buffer.take())

    def _record(self, entries: list[taprecord.Entry]) -> tuple:
        return self.conn.encode(), taprecord.pack_flush(_static(self.conn), entries), None


def _lifecycle(conn: str, seq: int, ts: int, direction: str) -> tuple:
    part = taprecord.Part(direction, ts, None, None, None, b"")
    return conn.encode(), taprecord.pack_record(direction, seq, _static(conn), [part]), None


def _record(conn: str, seq: int, ts: int, direction: str, raw: bytes, api: tuple[int, int, int]) -> tuple:
    """One schema-1 record (a frame, its metadata in Kafka headers)."""
    headers = [
        ("dir", direction),
        ("conn", conn),
        ("seq", str(seq)),
        ("ts_ns", str(ts)),
        ("client", "10.1.0.1:40000"),
        ("broker", "127.0.0.1:9092"),
        ("broker_id", "1"),
        ("listener", "PLAINTEXT"),
        ("capture", "headers"),
    ]
    if direction == "resp":
        headers += [("api_key", str(api[0])), ("api_version", str(api[1])), ("corr_id", str(api[2]))]
    return conn.encode(), raw, headers


def session(
    index: int, start_ns: int, zombie: bool = False, produces: int = 18, step_ns: int = 1_000_000
) -> Iterator[tuple]:
    """One client connection's frames, an exchange every ``step_ns`` (1 ms): ``produces`` Produce
    exchanges after the handshake. ``zombie``: the last write with an older epoch."""
    conn = f"bench-{index}"
    pid = 100_000 + index
    seq, corr, ts = 0, 0, start_ns
    packed = SCHEMA["version"] >= 2
    flushes = _Flushes(conn) if SCHEMA["version"] == 3 else None

    def pair(api: int, version: int, req: dict[str, Any], resp: dict[str, Any]) -> Iterator[tuple]:
        nonlocal seq, corr, ts
        corr += 1
        if packed:
            seq += 1
            request = taprecord.Part(
                "req", ts, api, version, corr, codec.encode_request(api, version, corr, "bench", req)
            )
            response = taprecord.Part(
                "resp", ts + 500_000, api, version, corr, codec.encode_response(api, version, corr, resp)
            )
            if flushes is not None:
                yield from flushes.add(taprecord.EXCHANGE, seq, [request, response])
            else:
                yield _exchange(conn, seq, request, response)
            ts += step_ns
            return
        yield _record(
            conn, seq, ts, "req", codec.encode_request(api, version, corr, "bench", req), (api, version, corr)
        )
        yield _record(
            conn,
            seq + 1,
            ts + 500_000,
            "resp",
            codec.encode_response(api, version, corr, resp),
            (api, version, corr),
        )
        seq += 2
        ts += step_ns

    yield from pair(18, 3, {"ClientSoftwareName": "bench", "ClientSoftwareVersion": "1.0"}, API_VERSIONS)
    yield from pair(
        3,
        12,
        {"Topics": None, "AllowAutoTopicCreation": False, "IncludeTopicAuthorizedOperations": False},
        {"Brokers": [], "Topics": []},
    )
    yield from pair(
        22,
        5,
        {"TransactionalId": None, "TransactionTimeoutMs": 60000, "ProducerId": -1, "ProducerEpoch": -1},
        {"ErrorCode": 0, "ProducerId": pid, "ProducerEpoch": 1},
    )
    for n in range(produces):
        epoch = 0 if zombie and n == produces - 1 else 1
        batch = build_record_batch(
            [(None, b"x" * 16)], producer_id=pid, producer_epoch=epoch, base_sequence=n
        )
        req = {
            "TransactionalId": None,
            "Acks": -1,
            "TimeoutMs": 30000,
            "TopicData": [{"Name": "orders", "PartitionData": [{"Index": 0, "Records": batch}]}],
        }
        resp = {
            "Responses": [
                {"Name": "orders", "PartitionResponses": [{"Index": 0, "ErrorCode": 0, "BaseOffset": n}]}
            ]
        }
        yield from pair(0, 9, req, resp)
    if flushes is not None:
        yield from flushes.add("close", seq + 1, [taprecord.Part("close", ts, None, None, None, b"")])
        yield from flushes.flush()
    elif packed:
        yield _lifecycle(conn, seq + 1, ts, "close")
    else:
        yield _record(conn, seq, ts, "close", b"", (0, 0, 0))


API_VERSIONS = {
    "ErrorCode": 0,
    "ApiKeys": [
        {"ApiKey": k, "MinVersion": 0, "MaxVersion": codec.supported_versions(k)[1]}
        for k in (0, 1, 3, 18, 22)
    ],
}


#: Event-time rate of a ``--live-connections`` backlog: a fleet that sends 20k frames/s.
FLEET_FRAMES_PER_S = 20_000


def _parts(record: tuple) -> list[str]:
    """The directions of a backlog record's parts: one for schema 1, an exchange's two for schema 2,
    every entry's for schema 3."""
    _, value, headers = record
    if headers is not None:
        return [str(dict(headers)["dir"])]
    return [part.direction for entry in taprecord.parse_records(None, value) for part in entry.parts]


def wire_frames(record: tuple) -> int:
    """Requests and responses in a backlog record."""
    return sum(1 for direction in _parts(record) if direction in ("req", "resp"))


def fleet(frames: int, start_ns: int, live: int) -> Iterator[tuple]:
    """The backlog's records in topic order. ``live`` 0: short sessions one after another (43 frames,
    ~20 ms each), so a connection's state rarely outlives a micro-batch. ``live`` N: N long-lived
    connections written round-robin, as a fleet's producers are (every micro-batch touches every
    connection and every producer id), at ``FLEET_FRAMES_PER_S`` of event time between them."""
    if not live:
        # Whole sessions, until the count is reached.
        index, written = 0, 0
        while written < frames:
            for record in session(index, start_ns + index * 200_000):
                written += len(_parts(record))
                yield record
            index += 1
        return
    per_session = -(-frames // live)
    produces = max(1, (per_session - 7) // 2)
    step_ns = live * 2 * 10**9 // FLEET_FRAMES_PER_S  # each connection's exchange interval
    sessions = [
        session(index, start_ns + index * step_ns // live, produces=produces, step_ns=step_ns)
        for index in range(live)
    ]
    written = 0
    while sessions and written < frames:
        for running in list(sessions):
            try:
                record = next(running)
            except StopIteration:
                sessions.remove(running)
                continue
            yield record
            written += len(_parts(record))
            if written >= frames:
                return


def preload(bootstrap: str, topic: str, frames: int, start_ns: int, live: int = 0) -> dict[str, int]:
    """Writes ``frames`` tap records' worth of sessions to ``topic``: the records and the wire frames."""
    from confluent_kafka import Producer

    from kpmon.traffic.workload import create_topic

    create_topic(bootstrap, topic, partitions=2)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.num.messages": 10000,
            "compression.type": "lz4",
        }
    )
    written = wire = 0
    for record in fleet(frames, start_ns, live):
        key, value, headers = record
        wire += wire_frames(record)
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers)
                break
            except BufferError:
                producer.poll(0.1)
        written += 1
        if written % 100_000 == 0:
            producer.poll(0)
            print(f"  preloaded {written:,} frames", flush=True)
    producer.flush(120)
    return {"records": written, "wire_frames": wire}


#: ``--spark-conf`` properties, applied to every query of the run (``stream.spark_conf``).
SPARK_CONF: dict[str, str] = {}
#: ``--state-buckets``: ``stream.state_buckets`` for every query of the run (None: the job's default).
STATE_BUCKETS: dict[str, int] = {}


def _config(state: Path, bootstrap: str, topic: str, webhook: str | None = None) -> KpmonConfig:
    hooks: list[dict[str, Any]] = [{"kind": "log", "min_severity": "critical"}]
    if webhook:
        hooks.append({"kind": "webhook", "url": webhook})
    return KpmonConfig.model_validate(
        {
            "state_dir": str(state),
            "kafka": {"bootstrap_servers": bootstrap},
            "tap": {"topic": topic},
            "stream": {
                "master": "local[2]",
                "shuffle_partitions": 2,
                "metrics_port": None,
                "max_offsets_per_trigger": 200_000,
                "spark_conf": SPARK_CONF,
                **STATE_BUCKETS,
            },
            "checks": {"watermark_seconds": 2.0},
            "alerts": {"hooks": hooks},
        }
    )


def summarize(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Rates over the batches that read rows: start-up and empty batches excluded."""
    busy = [e for e in events if e.get("numInputRows")]
    rows = sum(e["numInputRows"] for e in busy)
    ms = sum((e.get("durationMs") or {}).get("triggerExecution", 0) for e in busy)
    state_ms = sum(
        op.get("allUpdatesTimeMs", 0) + op.get("commitTimeMs", 0)
        for e in busy
        for op in e.get("stateOperators") or []
    )
    add_ms = sum((e.get("durationMs") or {}).get("addBatch", 0) for e in busy)
    return {
        "rows": rows,
        "batches": len(busy),
        "busy_seconds": ms / 1000,
        "rows_per_second": rows / (ms / 1000) if ms else 0.0,
        "add_batch_seconds": add_ms / 1000,
        "state_operator_seconds": state_ms / 1000,
    }


#: Every batch's full StreamingQueryProgress per run, for ``--progress`` (durations, state operators).
PROGRESS: dict[str, list[dict[str, Any]]] = {}


class CpuMeter:
    """CPU seconds used by this process (the driver: planning, the sink, Great Expectations) and every
    Spark process it started (the JVM and its Python workers, all its descendants) while a run lasts;
    the Kafka broker is not counted, nor another program's Spark on a shared host. Polled from /proc, keeping each process's last reading, so a worker that exits mid-run still counts
    up to its last poll. Unlike rows per second, this hardly moves with what else the machine runs.

    ``split`` says where it went: the driver, the Spark JVM (and, within it, its JIT compiler threads,
    read per thread), and the Python workers."""

    TICK = os.sysconf("SC_CLK_TCK")
    #: Thread names of HotSpot's JIT compilers (``C2 CompilerThre``, ``C1 CompilerThre``: 15 characters).
    JIT_THREADS = (b"C1 Compiler", b"C2 Compiler")

    def __init__(self) -> None:
        self.kinds: dict[int, str] = {}
        self.start = self._read()
        self.last = dict(self.start)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _ticks(self, stat: str) -> float:
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.TICK

    def _read(self) -> dict[tuple[int, int], float]:
        """CPU seconds per (pid, 0) for each process, and per (pid, tid) for the JVM's JIT threads."""
        out: dict[tuple[int, int], float] = {}
        for pid in self._descendants():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if pid != os.getpid() and b"pyspark" not in cmdline:
                    continue
                out[(pid, 0)] = self._ticks(Path(f"/proc/{pid}/stat").read_text())
            except OSError:
                continue
            if pid == os.getpid():
                self.kinds[pid] = "driver"
            elif b"java" in cmdline.split(b"\0", 1)[0]:
                self.kinds[pid] = "spark_jvm"
                out.update(self._jit_threads(pid))
            else:
                self.kinds[pid] = "python_workers"
        return out

    @staticmethod
    def _descendants() -> list[int]:
        """This process and every process below it (pyspark's JVM is its child, the Python workers the
        JVM's); another program's Spark on the same host is not."""
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
        out, todo = [], [os.getpid()]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children.get(pid, ()))
        return out

    def _jit_threads(self, pid: int) -> dict[tuple[int, int], float]:
        out: dict[tuple[int, int], float] = {}
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return out
        for tid in tids:
            try:
                if Path(f"/proc/{pid}/task/{tid}/comm").read_bytes().startswith(self.JIT_THREADS):
                    out[(pid, int(tid))] = self._ticks(Path(f"/proc/{pid}/task/{tid}/stat").read_text())
            except OSError:
                continue
        return out

    def _poll(self) -> None:
        while not self.done.wait(0.25):
            self.last.update(self._read())

    def stop(self) -> float:
        self.done.set()
        self.thread.join()
        self.last.update(self._read())
        return sum(self._used(key) for key in self.last if key[1] == 0)

    def _used(self, key: tuple[int, int]) -> float:
        return self.last[key] - self.start.get(key, 0.0)

    @property
    def split(self) -> dict[str, float]:
        """CPU seconds per kind of process (after ``stop``); ``jit`` is part of ``spark_jvm``."""
        out = dict.fromkeys(("driver", "spark_jvm", "jit", "python_workers"), 0.0)
        for key in self.last:
            kind = self.kinds.get(key[0], "python_workers") if key[1] == 0 else "jit"
            out[kind] += self._used(key)
        return {kind: round(seconds, 1) for kind, seconds in out.items()}


def rate_line(run: dict[str, Any]) -> str:
    split = ", ".join(
        f"{kind} {seconds} s" for kind, seconds in run.get("cpu_seconds_by_process", {}).items()
    )
    return (
        f"    {run['rows_per_second']:,.0f} frames/s, {run['cpu_us_per_frame']} us of CPU per frame "
        f"(CPU: {split})"
    )


def run_available_now(df: Any, sink: Any, checkpoint: Path) -> dict[str, Any]:
    meter = CpuMeter()
    query = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception():
        raise RuntimeError(str(query.exception()))
    cpu_seconds = meter.stop()
    events = [json.loads(p.json) if hasattr(p, "json") else p for p in query.recentProgress]
    PROGRESS[checkpoint.name] = events
    summary = summarize(events)
    summary["cpu_seconds"] = round(cpu_seconds, 1)
    summary["cpu_us_per_frame"] = round(cpu_seconds / summary["rows"] * 1e6, 1) if summary["rows"] else None
    summary["cpu_seconds_by_process"] = meter.split
    return summary


def run_job(spark: Any, config: KpmonConfig, stream_dir: Path, checkpoint: Path) -> dict[str, Any]:
    """The whole monitor over the topic's backlog (``run_available_now``): decode and route, the stateful stage,
    alert book, Great Expectations, hooks; ``stream_dir`` holds its alert book and spool. Shared with
    ``cost_bench.py``, so both measure the same job the same way."""
    from streaming.hooks import AlertHooks
    from streaming.job import checks_pipeline, frame_bundles
    from streaming.paths import StreamPaths
    from streaming.quality import QualityGate
    from streaming.sink import BatchSink

    paths = StreamPaths(stream_dir)
    paths.make()
    hooks = AlertHooks(config, paths.spool)
    gate = QualityGate(config.quality, None)
    quality_seconds: list[float] = []
    sink_seconds: list[float] = []
    counted = dict.fromkeys(STAGE_COUNTERS, 0)

    def on_result(result: Any) -> None:
        quality_seconds.append(result.quality_seconds)
        sink_seconds.append(result.seconds)
        for name in counted:
            counted[name] += result.stats.get(name, 0)

    sink = BatchSink(paths, hooks, gate, on_result=on_result)
    try:
        out = run_available_now(checks_pipeline(frame_bundles(spark, config), config), sink, checkpoint)
    finally:
        hooks.close()
    out["quality_seconds"] = round(sum(quality_seconds), 3)
    out["sink_seconds_per_batch"] = [round(s, 3) for s in sink_seconds]
    out["stage"] = stage_figures(counted)
    return out


#: The router's counters (``streaming.router.route_frames``, engine events) the ``stage`` figures read.
STAGE_COUNTERS = ("wire_frames", "stage_rows", "stage_header_exchanges")


def stage_figures(counted: dict[str, int]) -> dict[str, Any]:
    """Rows the job's bundles handed its stateful stage per wire frame (issue 35's
    ``stage.rows_per_wire_frame``), and the exchanges its connection rows carried by their headers."""
    wire = counted["wire_frames"]

    def per_wire_frame(name: str) -> float | None:
        return round(counted[name] / wire, 4) if wire else None

    return {
        "rows_per_wire_frame": per_wire_frame("stage_rows"),
        "header_exchanges_per_wire_frame": per_wire_frame("stage_header_exchanges"),
        "wire_frames": wire,
        "rows": counted["stage_rows"],
    }


def measure_latency(
    spark: Any, config: KpmonConfig, bootstrap: str, rate: float, seconds: float
) -> dict[str, Any]:
    """The job live on a 1 s trigger; frames at ``rate``/s; a zombie session every 2 s."""
    from confluent_kafka import Producer

    from kpmon.traffic.workload import create_topic
    from streaming.job import start
    from tests.streaming.hooks.receiver import Receiver, Reply

    arrivals: list[tuple[dict[str, Any], float]] = []

    def record(request: Any) -> Reply:
        arrivals.append((request.body, time.time()))
        return Reply()

    receiver = Receiver(script=record).start()
    topic = f"kpmon.bench.live.{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions=2)
    live = _config(Path(tempfile.mkdtemp(prefix="kpmon-bench-live-")), bootstrap, topic, receiver.url)
    live = live.model_copy(update={"stream": live.stream.model_copy(update={"starting_offsets": "latest"})})
    job = start(live, spark=spark)
    stop = threading.Event()

    def feed() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        index, sent, t0 = 10_000_000, 0, time.monotonic()
        next_zombie = t0 + 2
        while not stop.is_set():
            zombie = time.monotonic() >= next_zombie
            if zombie:
                next_zombie += 2
            for record in session(index, time.time_ns(), zombie=zombie):
                key, value, headers = record
                producer.produce(topic, key=key, value=value, headers=headers)
                sent += wire_frames(record)
            index += 1
            ahead = sent / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
            producer.poll(0)
        producer.flush(30)

    feeder = threading.Thread(target=feed, daemon=True)
    time.sleep(15)  # let the query start before traffic (starting offsets: latest)
    fed_from = time.time()
    feeder.start()
    time.sleep(seconds)
    stop.set()
    feeder.join(60)
    receiver.wait_for(lambda reqs: False, timeout=15)
    progress = [json.loads(p.json) for p in job.query.recentProgress]
    PROGRESS.setdefault("live", []).extend(progress)
    job.stop_gracefully()
    job.close()
    # (seconds of traffic before the violating frame, its latency), in the order the violations came.
    series = sorted(
        (body["first_seen"] / 1e9 - fed_from, at - body["first_seen"] / 1e9)
        for body, at in arrivals
        if body.get("rule", "").startswith("producer.stale_epoch") and body.get("status") == "firing"
    )
    receiver.stop()
    latencies = sorted(latency for _, latency in series)
    # The job meets its first traffic cold (new query, Python workers, JIT) and catches up for a few
    # batches: reported beside the whole run's figures, never instead of them.
    steady = sorted(latency for at, latency in series if at >= LATENCY_WARMUP_SECONDS)
    lateness = live.checks.watermark_seconds
    beyond = [latency - lateness for latency in latencies]
    return {
        "rate_frames_per_second": rate,
        **kept_up(progress, fed_from + LATENCY_WARMUP_SECONDS),
        # An entity's frame is judged once the batch clock passes it by the lateness, so every
        # latency holds the lateness; what is beyond it is the job's: the wait for the batch that
        # carries that clock, the batch, the hook.
        "lateness_seconds": lateness,
        "beyond_lateness": {
            "p50_seconds": statistics.median(beyond) if beyond else None,
            "p95_seconds": _p95(beyond),
        },
        "alerts": len(latencies),
        "p50_seconds": statistics.median(latencies) if latencies else None,
        "p95_seconds": _p95(latencies),
        "after_warmup": {
            "warmup_seconds": LATENCY_WARMUP_SECONDS,
            "alerts": len(steady),
            "p50_seconds": statistics.median(steady) if steady else None,
            "p95_seconds": _p95(steady),
        },
        "series": [[round(at, 3), round(latency, 3)] for at, latency in series],
    }


#: Seconds of live traffic whose alerts the ``after_warmup`` latency figures leave out.
LATENCY_WARMUP_SECONDS = 15.0
#: A run that did not keep up is repeated at this fraction of its rate.
LATENCY_STEP_DOWN = 0.6


def kept_up(progress: list[dict[str, Any]], after: float) -> dict[str, Any]:
    """Whether a live query kept up with its input: over its batches that started ``after`` (epoch
    seconds) and read rows, the median rate Spark processed rows at against the median they arrived at.
    A job that falls behind takes longer over each batch than the data in it took to arrive, so it
    processes slower than rows arrive, and its batches and latencies grow with the run's length."""
    steady = [
        p
        for p in progress
        if p.get("numInputRows")
        and datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() >= after
    ]
    if not steady:
        return {"kept_up": False, "batches_after_warmup": 0}
    arrived = statistics.median(float(p.get("inputRowsPerSecond") or 0.0) for p in steady)
    processed = statistics.median(float(p.get("processedRowsPerSecond") or 0.0) for p in steady)
    return {
        "kept_up": processed >= arrived,
        "batches_after_warmup": len(steady),
        "median_input_rows_per_second": round(arrived, 1),
        "median_processed_rows_per_second": round(processed, 1),
        "median_batch_ms": statistics.median(int(p["durationMs"]["triggerExecution"]) for p in steady),
    }


def _keeping(latency: dict[str, Any]) -> str:
    if not latency.get("batches_after_warmup"):
        return "no batch after the warm-up: not kept up"
    verdict = "kept up" if latency["kept_up"] else "fell behind"
    return (
        f"{verdict} (median rows/s processed {latency['median_processed_rows_per_second']:,.0f} against "
        f"{latency['median_input_rows_per_second']:,.0f} arriving, batches {latency['median_batch_ms']} ms)"
    )


def _p95(ordered: list[float]) -> float | None:
    return ordered[int(0.95 * (len(ordered) - 1))] if ordered else None


def _secs(value: float | None) -> str:
    return "n/a (no alert)" if value is None else f"{value:.2f} s"


def _spark_stages(spark: Any) -> list[dict[str, Any]]:
    """Spark's per-stage task metrics (run and CPU time, shuffle, GC) from its monitoring API."""
    import urllib.request

    url = spark.sparkContext.uiWebUrl
    if not url:
        return []
    app = spark.sparkContext.applicationId
    with urllib.request.urlopen(f"{url}/api/v1/applications/{app}/stages", timeout=30) as reply:
        return list(json.loads(reply.read()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=2_000_000)
    parser.add_argument("--latency-seconds", type=float, default=60.0)
    parser.add_argument(
        "--latency-rate",
        type=float,
        help="wire frames/s offered in the latency run (default: half the whole job's measured rate); a fixed "
        "rate compares builds whose throughput differs",
    )
    parser.add_argument(
        "--latency-attempts",
        type=int,
        default=3,
        help="latency runs at most: a run that does not keep up is repeated at 0.6x its rate (3)",
    )
    parser.add_argument(
        "--live-connections",
        type=int,
        default=0,
        metavar="N",
        help="backlog of N long-lived connections written round-robin (every batch touches each), instead "
        "of short sessions one after another",
    )
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra Spark property for the run's session (repeatable), e.g. JVM options to compare",
    )
    parser.add_argument(
        "--state-buckets",
        type=int,
        metavar="N",
        help="stream.state_buckets for the run (default: the job's default, 4 x shuffle partitions)",
    )
    parser.add_argument(
        "--schema",
        type=int,
        choices=(1, 2, 3),
        default=3,
        help="tap-record schema of the job's backlog and the latency feed: 3 (one record per connection "
        "flush, what taps write), 2 (one per exchange) or 1 (one per frame); the raw read always reads a "
        "schema-1 backlog of the same sessions, so job_over_raw compares across builds",
    )
    parser.add_argument("--quick", action="store_true", help="50k frames, 20 s of latency")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--progress", type=Path, help="write every batch's query progress (JSON) here")
    args = parser.parse_args()
    if args.quick:
        args.frames, args.latency_seconds = 50_000, 20.0
    for item in args.spark_conf:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("spark."):
            parser.error(f"--spark-conf wants spark.KEY=VALUE, got {item!r}")
        SPARK_CONF[key] = value
    if args.state_buckets is not None:
        STATE_BUCKETS["state_buckets"] = args.state_buckets
    from pyspark.sql import functions as F

    from streaming.job import frame_bundles
    from streaming.session import build_session

    home = Path(tempfile.mkdtemp(prefix="kpmon-stream-bench-"))
    stack = LocalStack(home / "stack")
    stack.up()
    out: dict[str, Any] = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "spark_conf": dict(SPARK_CONF),
        "state_buckets": STATE_BUCKETS.get("state_buckets"),
        "live_connections": args.live_connections,
        # kpmon.figures cites no figure from a smoke run.
        "quick": args.quick,
    }
    try:
        bootstrap = stack.bootstrap_servers
        topic, anchor_topic = "kpmon.bench.tap", "kpmon.bench.tap.schema1"
        start_ns = time.time_ns() - 3600 * 10**9
        t0 = time.monotonic()
        SCHEMA["version"] = 1
        anchor = preload(bootstrap, anchor_topic, args.frames, start_ns, args.live_connections)
        SCHEMA["version"] = args.schema
        backlog = (
            anchor
            if args.schema == 1
            else preload(bootstrap, topic, args.frames, start_ns, args.live_connections)
        )
        if args.schema == 1:
            topic = anchor_topic
        out["schema"] = args.schema
        out["preload"] = {
            **backlog,
            "anchor_records": anchor["records"],
            "seconds": round(time.monotonic() - t0, 1),
        }
        print(
            f"preloaded {backlog['wire_frames']:,} wire frames as {backlog['records']:,} schema-{args.schema} "
            f"records (and {anchor['records']:,} schema-1 records for the raw read) in {out['preload']['seconds']} s"
        )
        config = _config(home / "state", bootstrap, topic)
        spark = build_session(config, "kpmon-stream-bench")
        totals: dict[str, int] = {}

        def count(df: Any, batch_id: int) -> None:
            totals[str(batch_id)] = df.count()

        from streaming.job import source_rows

        print("1/3 raw read of the schema-1 backlog (one record per frame) ...", flush=True)
        anchor_config = _config(home / "state", bootstrap, anchor_topic)
        out["raw"] = run_available_now(source_rows(spark, anchor_config), count, home / "ck-raw")
        print(rate_line(out["raw"]))
        print("2/3 raw + the mapInArrow stage (decode and route, no state) ...", flush=True)
        rows = frame_bundles(spark, config).select(F.col("bucket"), F.length("bundle").alias("bytes"))
        out["rows"] = run_available_now(rows, count, home / "ck-rows")
        print(rate_line(out["rows"]))
        print("3/3 the whole job ...", flush=True)
        out["job"] = run_job(spark, config, home / "state" / "stream", home / "ck-job")
        if args.progress:
            PROGRESS["spark_stages"] = _spark_stages(spark)
        print(rate_line(out["job"]))
        # Per wire frame (a request or a response), whatever the records hold: the unit the raw read of
        # the schema-1 backlog (one record per frame) and both builds share.
        per_record = backlog["wire_frames"] / max(backlog["records"], 1)
        job = out["job"]
        job["wire_frames_per_second"] = round(job["rows_per_second"] * per_record)
        job["cpu_us_per_wire_frame"] = round(job["cpu_seconds"] / max(backlog["wire_frames"], 1) * 1e6, 1)
        out["ratios"] = {
            "job_over_raw": job["wire_frames_per_second"] / out["raw"]["rows_per_second"],
            "rows_over_raw": out["rows"]["rows_per_second"] * per_record / out["raw"]["rows_per_second"],
        }
        print(
            f"    {job['wire_frames_per_second']:,} wire frames/s, {job['cpu_us_per_wire_frame']} us of CPU per "
            f"wire frame; job / raw read {out['ratios']['job_over_raw']:.3f}x"
        )
        out["stage"] = stage = job.pop("stage")
        traffic = (
            f"{args.live_connections} long-lived connections" if args.live_connections else "short sessions"
        )
        print(
            f"    rows into the stateful stage: {stage['rows_per_wire_frame']} per wire frame "
            f"({stage['rows']:,} for {stage['wire_frames']:,}; {stage['header_exchanges_per_wire_frame']} "
            f"exchanges by their headers per wire frame), {traffic}"
        )
        rate = args.latency_rate or max(job["wire_frames_per_second"] * 0.5, 100.0)
        if args.latency_seconds > 0:
            attempts: list[dict[str, Any]] = []
            for _ in range(max(1, args.latency_attempts)):
                print(f"latency at {rate:,.0f} frames/s for {args.latency_seconds:.0f} s ...", flush=True)
                latency = measure_latency(spark, config, bootstrap, rate, args.latency_seconds)
                attempts.append(latency)
                steady = latency["after_warmup"]
                print(
                    f"    p50 {_secs(latency['p50_seconds'])}, p95 {_secs(latency['p95_seconds'])} over "
                    f"{latency['alerts']} alerts (p95 {_secs(latency['beyond_lateness']['p95_seconds'])} beyond "
                    f"the {latency['lateness_seconds']:g} s lateness); after the first "
                    f"{steady['warmup_seconds']:.0f} s of traffic: "
                    f"p50 {_secs(steady['p50_seconds'])}, p95 {_secs(steady['p95_seconds'])} over "
                    f"{steady['alerts']}; {_keeping(latency)}",
                    flush=True,
                )
                if latency["kept_up"] or args.latency_rate:
                    break
                rate = round(rate * LATENCY_STEP_DOWN)
            # A run that fell behind measured its own length, not the job: no latency figure then.
            out["latency"] = next(
                (a for a in attempts if a["kept_up"]),
                {"kept_up": False, "p95_seconds": None, "rate_frames_per_second": None},
            )
            out["latency_attempts"] = [{k: v for k, v in a.items() if k != "series"} for a in attempts]
        else:
            out["latency"] = {"p95_seconds": None}
        out["machine"]["load_after"] = os.getloadavg()
        spark.stop()
    finally:
        stack.down()
    out["targets"] = {
        "job_over_raw >= 0.55": out["ratios"]["job_over_raw"] >= 0.55,
        "p95 latency <= 3 s": bool(out["latency"].get("kept_up"))
        and (out["latency"]["p95_seconds"] or 1e9) <= 3.0,
    }
    print(json.dumps(out, indent=2, default=str))
    if args.progress:
        args.progress.write_text(json.dumps(PROGRESS, indent=2, default=str))
    changed = cores_changed(out["machine"]["compiled_cores"])
    if changed:
        print(f"stream_bench: not written: {changed}", file=sys.stderr)
        return 1
    if not args.no_write:
        RESULTS.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
