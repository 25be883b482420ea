"""The always-on monitor: tap topic -> decode and route (no state) -> one stateful stage -> alerts.

    Kafka source (includeHeaders, bounded maxOffsetsPerTrigger)
      -> mapInArrow(streaming.bundles.bundler)     decode once, route (streaming.router): one bundle per
                                                   (source batch, bucket), plus the batch's aggregates
      -> withWatermark(event_time, checks.watermark_seconds)
      -> groupBy(bucket).transformWithStateInPandas(MonitorProcessor)   connection and entity entries
      -> foreachBatch(streaming.sink.BatchSink)     alert book, Great Expectations, hooks

The job stays on micro-batch triggers: Spark's real-time mode supports neither foreachBatch nor Python
stateful processing (docs/streaming.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from codec import native
from kpconfig.model import ConfigError, KpmonConfig, load_config
from streaming.compat import BUCKET
from streaming.orphan import exit_with_the_jvm, spark_submit_parent
from streaming.paths import StreamPaths

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from streaming.processors import MonitorProcessor

log = logging.getLogger("kpmon.stream")


def source_options(config: KpmonConfig) -> dict[str, str]:
    cluster = config.tap_cluster
    options = {
        "kafka.bootstrap.servers": cluster.bootstrap_servers,
        "subscribe": config.tap.topic,
        "includeHeaders": "true",
        "startingOffsets": config.stream.starting_offsets,
        "maxOffsetsPerTrigger": str(config.stream.max_offsets_per_trigger),
        "failOnDataLoss": str(config.stream.fail_on_data_loss).lower(),
        "kafka.fetch.max.wait.ms": str(config.stream.fetch_max_wait_ms),
    }
    # The Java client's names (sasl.jaas.config, ssl.truststore.*): kpconfig/model.py translates them. A
    # fetch setting among the cluster's properties wins over the stream's.
    options.update({f"kafka.{k}": v for k, v in cluster.java_client_properties().items()})
    return options


def source_rows(spark: SparkSession, config: KpmonConfig) -> DataFrame:
    """The tap topic's records as the Kafka source reads them: value, headers, partition, offset."""
    reader = spark.readStream.format("kafka")
    for key, value in source_options(config).items():
        reader = reader.option(key, value)
    return reader.load().select("value", "headers", "partition", "offset")


def frame_rows(spark: SparkSession, config: KpmonConfig) -> DataFrame:
    """The tap-record rows as a stream, one row per record (documented in docs/streaming.md): for
    reading the tap topic as the job reads it. The job itself reads them bundled (``frame_bundles``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from streaming.frames import FRAME_ROW_SCHEMA, frame_row_batches

    rows = source_rows(spark, config).mapInArrow(frame_row_batches, from_arrow_schema(FRAME_ROW_SCHEMA))
    # A record without a ts_ns header (not from a tap) still needs an event time: its arrival.
    event_time = F.coalesce(F.timestamp_micros(F.floor(F.col("ts_ns") / 1000)), F.current_timestamp())
    return rows.withColumn("event_time", event_time)


def frame_bundles(spark: SparkSession, config: KpmonConfig) -> DataFrame:
    """The stateful stage's input: each source batch decoded and routed, one bundle per bucket
    (``streaming.bundles``, ``streaming.router``)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from streaming.bundles import BUNDLE_SCHEMA

    return source_rows(spark, config).mapInArrow(bundle_function(config), from_arrow_schema(BUNDLE_SCHEMA))


def bundle_function(config: KpmonConfig) -> Any:
    """The ``mapInArrow`` function of ``frame_bundles``: its workers' collector tuned as the stateful
    stage's (``stream.worker_gc``), since routing allocates as much per frame as the stage."""
    from streaming.bundles import bundler

    labels = bucket_labels(config.stream.buckets, config.stream.shuffle_partitions)
    return bundler(
        config.checks.settings(), labels, config.stream.worker_gc, config.stream.route_batch_records
    )


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF


def spark_int_partition(value: int, partitions: int) -> int:
    """The shuffle partition Spark puts an int grouping value in: ``pmod(murmur3(value, seed 42),
    partitions)``, as Spark's ``HashPartitioning`` computes it (``Murmur3_x86_32.hashInt``)."""
    k1 = (value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    k1 = _rotl32(k1, 15) * 0x1B873593 & 0xFFFFFFFF
    h1 = _rotl32(42 ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & 0xFFFFFFFF
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & 0xFFFFFFFF
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & 0xFFFFFFFF
    h1 ^= h1 >> 16
    signed = h1 - (1 << 32) if h1 >= 1 << 31 else h1
    return signed % partitions


def bucket_labels(buckets: int, partitions: int) -> list[int]:
    """The grouping value of each bucket, chosen so that bucket ``b`` lands in shuffle partition
    ``b % partitions``: every partition (one task, one core) gets the same number of buckets.

    Grouping by the bucket number itself left it to Spark's hash: 8 buckets over 2 partitions fell
    5 and 3, so one core did 5/8 of each stateful stage while the other waited; 16 over 4 fell 6, 4,
    3 and 3. Deterministic, so a bucket keeps its label across restarts with the same settings."""
    labels: list[int] = []
    value = 0
    for bucket in range(buckets):
        while spark_int_partition(value, partitions) != bucket % partitions:
            value += 1
        labels.append(value)
        value += 1
    return labels


def stage_processor(config: KpmonConfig) -> MonitorProcessor:
    """The stateful stage's processor, as the job configures it."""
    from streaming.processors import MonitorProcessor

    return MonitorProcessor(config.checks.settings(), tune_gc=config.stream.worker_gc)


def checks_pipeline(bundles: DataFrame, config: KpmonConfig) -> DataFrame:
    """The stateful stage over its input (``frame_bundles``): the rows ``foreachBatch`` gets."""
    from streaming.processors import OUTPUT_DDL

    lateness = f"{int(config.checks.watermark_seconds * 1000)} milliseconds"
    return (
        bundles.withWatermark("event_time", lateness)
        .groupBy(BUCKET)
        .transformWithStateInPandas(stage_processor(config), OUTPUT_DDL, "Append", "EventTime")
    )


@dataclass
class RunningJob:
    spark: SparkSession
    query: StreamingQuery
    paths: StreamPaths
    config: KpmonConfig
    closers: list[Callable[[], object]] = field(default_factory=list)

    def stop_gracefully(self) -> None:
        """Finish the running batch, then stop (bounded by ``stream.stop_timeout_seconds``)."""
        deadline = time.monotonic() + self.config.stream.stop_timeout_seconds
        while (
            self.query.isActive and self.query.status.get("isTriggerActive") and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        if self.query.isActive:
            self.query.stop()

    def close(self) -> None:
        for closer in reversed(self.closers):
            try:
                closer()
            except Exception as exc:  # a failing closer must not keep the others from running
                log.warning("shutdown step failed: %s", exc)


def start(
    config: KpmonConfig,
    terminal: Callable[[str], None] | None = None,
    spark: SparkSession | None = None,
) -> RunningJob:
    """Build and start the query; returns at once with the running job."""
    from prometheus_client import CollectorRegistry

    from streaming.compat import refuse_incompatible
    from streaming.hooks import AlertHooks
    from streaming.observe import ProgressListener, StreamMetrics
    from streaming.quality import QualityGate
    from streaming.session import build_session
    from streaming.sink import BatchResult, BatchSink

    # Spark would resume a checkpoint of another shape and find its state under keys this build never
    # asks for: refuse before starting (the redeploy DAG and `kpmon run` ask the same question earlier).
    refuse_incompatible(
        config,
        "Start from a new checkpoint (stream.checkpoint_dir) or move this one aside, then start again.",
    )
    paths = StreamPaths.of(config)
    paths.make()
    paths.stop_marker.unlink(missing_ok=True)
    # Workers on this machine decide the same way; a cluster's workers decide on their own copy.
    log.info("per-frame cores: %s", native.status()[1])
    registry = CollectorRegistry()
    metrics = StreamMetrics(registry)
    metrics.serve(config.stream.metrics_port, config.stream.metrics_host)
    # A driver replacing one its cluster just killed waits for the old process to let the spool go
    # (it exits once its JVM is gone: streaming.orphan), and ends it if it outlives its JVM.
    hooks = AlertHooks(
        config,
        paths.spool,
        registry,
        lock_wait_seconds=config.stream.spool_lock_wait_seconds,
        lock_parent_pid=spark_submit_parent(),
    )
    gate = QualityGate(config.quality, paths.data_docs if config.quality.data_docs else None)
    last: dict[str, Any] = {}

    def on_result(result: BatchResult) -> None:
        metrics.on_result(result)
        last.update(
            findings=result.findings_by_rule,
            alerts=len(result.alerts),
            quality_success=result.quality_success,
            quality_seconds=round(result.quality_seconds, 4),
            sink_seconds=round(result.seconds, 4),
        )
        if terminal is not None:
            for alert in result.alerts:
                if alert.count == 1 or alert.status == "resolved":
                    terminal(
                        f"  ALERT {alert.status} {alert.severity.value}: {alert.rule} {alert.subject}: {alert.summary}"
                    )

    sink = BatchSink(
        paths,
        hooks,
        gate,
        config.stream.keep_batches,
        on_result,
        config.alerts.resolve_after_seconds,
        config.alert_context(),
    )
    spark = spark or build_session(config)
    listener = ProgressListener(paths, metrics, lambda: {**last, "hooks": hooks.stats()}, terminal)
    spark.streams.addListener(listener)
    pipeline = checks_pipeline(frame_bundles(spark, config), config)
    query = (
        pipeline.writeStream.queryName("kpmon")
        .foreachBatch(sink)
        .option("checkpointLocation", paths.checkpoint(config))
        .trigger(processingTime=f"{config.stream.trigger_seconds} seconds")
        .start()
    )
    paths.pid_file.write_text(f"{os.getpid()}\n")
    try:
        from streaming.compat import write_shape

        # A redeploy checks the next build against this before stopping us (docs/operations.md).
        write_shape(config)
    except Exception as exc:  # a missing shape makes redeploys ask for a fresh start; never stop the job
        log.warning("cannot record the query shape: %s", exc)
    job = RunningJob(spark, query, paths, config)
    job.closers.append(lambda: paths.pid_file.unlink(missing_ok=True))
    job.closers.append(lambda: spark.streams.removeListener(listener))
    job.closers.append(lambda: listener.mark_ended(_query_error(query)))
    job.closers.append(lambda: hooks.close(10.0))
    if config.quality.data_docs:
        job.closers.append(gate.build_docs)
    return job


def _query_error(query: StreamingQuery) -> str | None:
    failed = query.exception()
    return str(failed) if failed is not None else None


def run_until_stopped(job: RunningJob, poll_seconds: float = 0.5) -> int:
    """Block until SIGTERM/SIGINT, the stop marker, or a query failure. Returns the exit code."""
    stop = threading.Event()

    def request_stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping after the running batch", signum)
        stop.set()

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while job.query.isActive and not stop.is_set():
            if job.paths.stop_marker.exists():
                log.info("stop marker %s found: stopping after the running batch", job.paths.stop_marker)
                break
            stop.wait(poll_seconds)
        failed = job.query.exception()
        if failed is None:
            job.stop_gracefully()
        job.close()
        if failed is not None:
            log.error("the streaming query failed: %s", failed)
            return 1
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for spark-submit and ``python -m streaming``: ``--config FILE``."""
    parser = argparse.ArgumentParser(prog="kpmon-stream", description="Run the kpmon streaming monitor.")
    parser.add_argument("--config", help="YAML config (KPMON__SECTION__KEY env vars override it)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    exit_with_the_jvm()
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"kpmon: {exc}", file=sys.stderr)
        return 2
    try:
        job = start(config, terminal=lambda line: print(line, flush=True))
    except ConfigError as exc:
        print(f"kpmon: {exc}", file=sys.stderr)
        return 2
    return run_until_stopped(job)
