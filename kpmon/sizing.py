"""What the monitor needs for a cluster's traffic, from the committed benchmark figures (sans-I/O).

Figures in, estimate out. The figures are values at named keys of ``benchmarks/results/*.json``
(:data:`FIGURES`); :func:`extract` picks them out of the parsed files, with the host each was measured
on, and :func:`estimate` turns a cluster's traffic (:class:`Inputs`) into one :class:`Line` per quantity,
each naming the figures it used. A figure a file does not hold is carried as missing, with the reason,
and every line that needs it says so instead of using a value from elsewhere.

The package ships the extracted figures (``kpmon/sizing_figures.json``, written by ``kpmon size
--refresh`` from a checkout) so that an installed ``kpmon size`` works without the benchmarks; a test
fails when that file, docs/cluster-mode.md's sizing block or the README's cost line disagree with
``benchmarks/results``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from kpmon.figures import Figure, FigureSpec, num, pick

CAPTURES = ("meta", "headers", "full")
MIB = 1024 * 1024


def _tap_specs() -> list[FigureSpec]:
    specs = []
    for cap in CAPTURES:
        specs += [
            FigureSpec(
                f"tap.produce_mcores_per_mb_s.{cap}",
                "tap_bench.json",
                f"summary.{cap}.produce.tap_mcores_per_mb_s",
                "mcores per MB/s",
                f"tap CPU per MB/s of produce traffic, capture {cap}",
            ),
            FigureSpec(
                f"tap.fetch_mcores_per_mb_s.{cap}",
                "tap_bench.json",
                f"summary.{cap}.consume.tap_mcores_per_mb_s",
                "mcores per MB/s",
                f"tap CPU per MB/s of fetch traffic, capture {cap}",
            ),
            FigureSpec(
                f"tap.produce_mb_s.{cap}",
                "tap_bench.json",
                f"summary.{cap}.produce.tap_mb_per_sec",
                "MB/s",
                f"the highest produce rate one tap was measured at, capture {cap}",
            ),
            FigureSpec(
                f"tap.fetch_mb_s.{cap}",
                "tap_bench.json",
                f"summary.{cap}.consume.tap_mb_per_sec",
                "MB/s",
                f"the highest fetch rate one tap was measured at, capture {cap}",
            ),
            FigureSpec(
                f"topic.value_ratio.{cap}",
                "tap_topic_size.json",
                f"mixes.produce_fetch_heavy.{cap}_value_ratio",
                "mirrored bytes per client byte",
                f"tap-topic value bytes per client byte, data-plane mix, capture {cap}",
                host_independent=True,
            ),
        ]
    return specs


#: Every figure :func:`estimate` reads. cost_bench.json (issue 26) holds the frame-heavy workload's
#: ratios under ``ratios`` and each workload's figures under ``workloads.<name>``; each ratio is a CPU
#: per wire frame over the broker's own CPU per frame direct, measured in the same run.
FIGURES: tuple[FigureSpec, ...] = (
    *_tap_specs(),
    FigureSpec(
        "topic.record_overhead_bytes",
        "tap_topic_size.json",
        "record_overhead_bytes",
        "B per record",
        "key, record framing and packed metadata of one schema-2 tap record (no Kafka headers)",
        host_independent=True,
    ),
    FigureSpec(
        "job.cpu_us_per_frame",
        "stream_bench.json",
        "job.cpu_us_per_wire_frame",
        "µs CPU per wire frame",
        "the whole streaming job's CPU (driver, JVM, Python workers) per wire frame (a request or a "
        "response) of a schema-2 backlog, local[2]",
    ),
    FigureSpec(
        "job.frames_per_s",
        "stream_bench.json",
        "job.wire_frames_per_second",
        "frames/s",
        "the job's sustained rate, in wire frames",
    ),
    FigureSpec(
        "job.cores",
        "stream_bench.json",
        "machine.cpus",
        "cores",
        "the cores the job was measured on",
    ),
    FigureSpec(
        "latency.rate_frames_per_s",
        "stream_bench.json",
        "latency.rate_frames_per_second",
        "frames/s",
        "the live rate the alert latency was measured at, the highest of the benchmark's that the job kept up with",
    ),
    FigureSpec(
        "latency.p95_s",
        "stream_bench.json",
        "latency.p95_seconds",
        "s",
        "p95 from a frame's arrival to its alert, 1 s trigger",
    ),
    FigureSpec(
        "state.producer_open_bytes_per_10k",
        "checks_bench.json",
        "memory.producers.per_10k_bytes.held",
        "B per 10k",
        "checker state of 10k producers on open connections",
    ),
    FigureSpec(
        "state.producer_bytes_per_10k",
        "checks_bench.json",
        "memory.producers.per_10k_bytes.held_after_close",
        "B per 10k",
        "checker state of 10k producers after their connections closed",
    ),
    FigureSpec(
        "state.group_bytes_per_10k",
        "checks_bench.json",
        "memory.groups.per_10k_bytes.held_after_close",
        "B per 10k",
        "checker state of 10k groups after their connections closed",
    ),
    FigureSpec(
        "state.keys_measured",
        "checks_bench.json",
        "memory.keys_measured",
        "keys",
        "producers (and groups) the state was measured with",
    ),
    FigureSpec(
        "cost.tap_over_broker",
        "cost_bench.json",
        "ratios.tap_over_broker",
        "x broker CPU per frame",
        "tap CPU per frame over the broker's, frame-heavy workload",
    ),
    FigureSpec(
        "cost.job_over_broker",
        "cost_bench.json",
        "ratios.job_over_broker",
        "x broker CPU per frame",
        "job CPU per frame over the broker's, frame-heavy workload",
    ),
    FigureSpec(
        "cost.broker_mirroring_over_direct",
        "cost_bench.json",
        "ratios.broker_mirroring_over_direct",
        "x broker CPU per frame",
        "the broker's CPU per frame while the tap mirrors to it, over direct, frame-heavy workload",
    ),
    FigureSpec(
        "cost.byte_heavy.tap_over_broker",
        "cost_bench.json",
        "workloads.byte_heavy.ratios.tap_over_broker",
        "x broker CPU per frame",
        "tap CPU per frame over the broker's, byte-heavy workload",
    ),
    FigureSpec(
        "cost.byte_heavy.job_over_broker",
        "cost_bench.json",
        "workloads.byte_heavy.ratios.job_over_broker",
        "x broker CPU per frame",
        "job CPU per frame over the broker's, byte-heavy workload",
    ),
    FigureSpec(
        "cost.byte_heavy.broker_mirroring_over_direct",
        "cost_bench.json",
        "workloads.byte_heavy.ratios.broker_mirroring_over_direct",
        "x broker CPU per frame",
        "the broker's CPU per frame while mirroring, over direct, byte-heavy workload",
    ),
    FigureSpec(
        "cost.tap_cpu_us_per_frame",
        "cost_bench.json",
        "workloads.frame_heavy.figures.tap.us_per_frame",
        "µs CPU per wire frame",
        "tap CPU per wire frame, frame-heavy workload (small records, linger.ms=0)",
    ),
    FigureSpec(
        "cost.records_per_wire_frame",
        "cost_bench.json",
        "records_per_wire_frame",
        "tap records per wire frame",
        "tap-topic records written per wire frame",
    ),
)

#: Design rules, not measurements; each names where it is set.
TAP_MEMORY_HEADROOM_BYTES = 256 * MIB  # docs/cluster-mode.md rule M: interpreter and stalled connections
EXECUTOR_CORES = 2  # deploy/k8s/spark/sparkapplication.yaml executor.cores
EXECUTOR_MEMORY_GIB = 4.0  # deploy/k8s/spark/sparkapplication.yaml executor.memory
EXECUTOR_OVERHEAD_GIB = 1.0  # deploy/k8s/spark/sparkapplication.yaml executor.memoryOverhead
PARTITIONS_PER_EXECUTOR_CORE = 3  # docs/cluster-mode.md rule P: 2-3 tasks per core, the upper end
#: Schema-1 tap records: one record per wire frame; used only when cost_bench.json does not say.
SCHEMA1_RECORDS_PER_WIRE_FRAME = 1.0

WATCH = (
    "`kpmon_tap_mirror_queue_depth` against `kpmon_tap_mirror_queue_capacity`: a tap short of CPU "
    "lets its mirror queue grow, then drops (`kpmon_tap_mirror_drops_total`)",
    "`kpmon_tap_inside_seconds`: the latency a tap adds grows before its throughput falls",
    "the job's batch lag, `kpmon_stream_lag_records`, and `kpmon_stream_batch_duration_seconds`: "
    "batches that take longer than the trigger mean too few executor cores",
)


def extract(results: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Figure]:
    """The figures of :data:`FIGURES` out of parsed results files (file name -> JSON, None if absent)."""
    return pick(FIGURES, results)


@dataclass(frozen=True)
class Inputs:
    """A cluster's traffic, totals over all brokers."""

    brokers: int
    produce_mb_s: float
    fetch_mb_s: float
    requests_per_s: float
    connections: int
    producers: int | None = None
    groups: int | None = None
    capture: str = "headers"
    retention_hours: float = 48.0
    replication_factor: int = 3
    tap_queue_max_bytes: int = 256 * MIB
    #: Where the traffic figures come from ("given by hand", or the metrics endpoints scraped).
    source: str = "given by hand"


#: Reference clusters: the issue's small and large ones and one in between. Fetch is twice produce
#: (two consumer groups per topic on average); one producer id per ten connections.
EXAMPLES: dict[str, Inputs] = {
    "small": Inputs(3, 20.0, 40.0, 5_000, 300, producers=1_000, groups=50),
    "medium": Inputs(9, 300.0, 600.0, 100_000, 5_000, producers=20_000, groups=500),
    "large": Inputs(30, 3_000.0, 6_000.0, 1_000_000, 50_000, producers=200_000, groups=5_000),
}


@dataclass(frozen=True)
class Line:
    part: str
    what: str
    value: float | None
    unit: str
    #: How the value follows from the inputs and figures, with the numbers filled in.
    how: str
    sources: tuple[str, ...] = ()


@dataclass
class Estimate:
    inputs: Inputs
    lines: list[Line] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    watch: tuple[str, ...] = WATCH
    #: The distinct hosts the figures used were measured on.
    hosts: list[str] = field(default_factory=list)

    def value(self, what: str) -> float | None:
        for line in self.lines:
            if line.what == what:
                return line.value
        raise KeyError(what)

    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": asdict(self.inputs),
            "lines": [asdict(line) for line in self.lines],
            "warnings": list(self.warnings),
            "watch": list(self.watch),
            "hosts": list(self.hosts),
        }


class _Book:
    """Collects lines and the figures they cite."""

    def __init__(self, figures: Mapping[str, Figure], est: Estimate) -> None:
        self.figures = figures
        self.est = est
        self.used: list[Figure] = []

    def fig(self, name: str) -> Figure:
        found = self.figures[name]
        self.used.append(found)
        return found

    def line(
        self, part: str, what: str, value: float | None, unit: str, how: str, *figs: Figure
    ) -> float | None:
        self.est.lines.append(Line(part, what, value, unit, how, tuple(f.cite() for f in figs)))
        return value


def _missing(*figs: Figure) -> str:
    reasons = sorted({f.missing for f in figs if f.missing})
    return "not measured: " + "; ".join(reasons)


def estimate(inputs: Inputs, figures: Mapping[str, Figure]) -> Estimate:
    """What the monitor needs for ``inputs``, by the ``figures`` (:func:`extract`)."""
    if inputs.capture not in CAPTURES:
        raise ValueError(f"capture must be one of {', '.join(CAPTURES)}")
    if inputs.brokers < 1:
        raise ValueError("brokers must be at least 1")
    est = Estimate(inputs)
    b = _Book(figures, est)
    cap = inputs.capture
    brokers = inputs.brokers
    wire_frames = 2 * inputs.requests_per_s  # a request and its response
    produce_b = inputs.produce_mb_s / brokers
    fetch_b = inputs.fetch_mb_s / brokers
    frames_b = wire_frames / brokers

    # Tap: by bytes (tap_bench, 1 KiB records, few large frames) and by frames (cost_bench, small
    # frames); each benchmark already pays the other's cost for its own traffic shape, so the larger
    # of the two is the estimate, not their sum.
    m_prod, m_fetch = b.fig(f"tap.produce_mcores_per_mb_s.{cap}"), b.fig(f"tap.fetch_mcores_per_mb_s.{cap}")
    by_bytes: float | None = None
    if m_prod.value is not None and m_fetch.value is not None:
        by_bytes = (produce_b * m_prod.value + fetch_b * m_fetch.value) / 1000
    tap_frame = b.fig("cost.tap_cpu_us_per_frame")
    by_frames = None if tap_frame.value is None else frames_b * tap_frame.value / 1e6
    b.line(
        "tap",
        "tap cores per broker, by bytes",
        by_bytes,
        "cores",
        f"({num(produce_b)} MB/s produce x {m_prod.value} + {num(fetch_b)} MB/s fetch x {m_fetch.value}) "
        "mcores per MB/s ÷ 1000"
        if by_bytes is not None
        else _missing(m_prod, m_fetch),
        m_prod,
        m_fetch,
    )
    b.line(
        "tap",
        "tap cores per broker, by frames",
        by_frames,
        "cores",
        f"{num(frames_b)} wire frames/s x {tap_frame.value} µs ÷ 10⁶"
        if by_frames is not None
        else _missing(tap_frame),
        tap_frame,
    )
    known = [v for v in (by_bytes, by_frames) if v is not None]
    tap_cores = max(known) if known else None
    b.line(
        "tap",
        "tap cores per broker",
        tap_cores,
        "cores",
        "the larger of the two"
        if len(known) == 2
        else "by bytes only: the tap's CPU per frame is not measured",
        m_prod,
        m_fetch,
        tap_frame,
    )
    if by_frames is None:
        est.warnings.append(
            "The tap's CPU per frame is not measured (cost_bench.json missing): tap_bench moves 1 KiB "
            "records in large batches, and small frames cost the tap far more per MB, so the tap cores "
            "may be underestimated for a cluster with many small requests."
        )
    # A worker is one process, one core: as many as the tap's cores, each with its own mirror queue.
    workers = 1 if tap_cores is None else max(1, math.ceil(tap_cores))
    b.line(
        "tap",
        "tap workers per broker",
        workers,
        "workers",
        "⌈tap cores per broker⌉, at least 1",
        m_prod,
        m_fetch,
        tap_frame,
    )
    tap_mem = (workers * inputs.tap_queue_max_bytes + TAP_MEMORY_HEADROOM_BYTES) / MIB
    b.line(
        "tap",
        "tap memory per broker",
        tap_mem,
        "MiB",
        f"{workers} workers x tap.queue_max_bytes {num(inputs.tap_queue_max_bytes / MIB)} MiB + "
        f"{TAP_MEMORY_HEADROOM_BYTES // MIB} MiB (rule M: a design bound, not measured)",
    )

    # The tap topic.
    per_frame = b.fig("cost.records_per_wire_frame")
    records_per_frame = per_frame.value if per_frame.value is not None else SCHEMA1_RECORDS_PER_WIRE_FRAME
    ratio, overhead = b.fig(f"topic.value_ratio.{cap}"), b.fig("topic.record_overhead_bytes")
    records_s = wire_frames * records_per_frame
    b.line(
        "tap topic",
        "tap records/s",
        records_s,
        "records/s",
        f"{num(wire_frames)} wire frames/s x {records_per_frame} records per frame"
        + ("" if per_frame.value is not None else " (schema 1; cost_bench.json does not say)"),
        per_frame,
    )
    topic_bytes_s: float | None = None
    if ratio.value is not None and overhead.value is not None:
        topic_bytes_s = (
            inputs.produce_mb_s + inputs.fetch_mb_s
        ) * 1e6 * ratio.value + records_s * overhead.value
    b.line(
        "tap topic",
        "tap-topic bytes/day",
        None if topic_bytes_s is None else topic_bytes_s * 86_400,
        "B",
        f"(({num(inputs.produce_mb_s + inputs.fetch_mb_s)} MB/s x {num(ratio.value)}) + "
        f"{num(records_s)} records/s x {num(overhead.value)} B) x 86,400 s"
        if topic_bytes_s is not None and ratio.value is not None and overhead.value is not None
        else _missing(ratio, overhead),
        ratio,
        overhead,
    )
    disk = (
        None
        if topic_bytes_s is None
        else topic_bytes_s * inputs.retention_hours * 3600 * inputs.replication_factor
    )
    b.line(
        "tap topic",
        "tap-topic retention disk",
        disk,
        "B",
        f"bytes/s x {num(inputs.retention_hours)} h retention x replication factor {inputs.replication_factor}",
        ratio,
        overhead,
    )

    # Executors: the job's CPU per wire frame at the utilisation its latency was measured at. Per wire
    # frame, not per tap record: a schema-2 record holds an exchange's two frames, and the job decodes
    # and checks each.
    job_us, job_rate = b.fig("job.cpu_us_per_frame"), b.fig("job.frames_per_s")
    lat_rate, p95 = b.fig("latency.rate_frames_per_s"), b.fig("latency.p95_s")
    cores: float | None = None
    load = lat_rate.value / job_rate.value if job_rate.value and lat_rate.value is not None else None
    if job_us.value is not None and job_rate.value and load is not None and lat_rate.value is not None:
        busy = wire_frames * job_us.value / 1e6
        cores = max(1, math.ceil(busy / load))
        how = (
            f"⌈{num(wire_frames)} wire frames/s x {job_us.value} µs ÷ 10⁶ = {num(busy)} busy cores, "
            f"÷ {num(load)} (the load the p95 was measured at: {num(lat_rate.value)} of "
            f"{num(job_rate.value)} frames/s)⌉"
        )
    else:
        how = _missing(job_us, job_rate, lat_rate)
    b.line("executors", "executor cores", cores, "cores", how, job_us, job_rate, lat_rate)
    executors = None if cores is None else math.ceil(cores / EXECUTOR_CORES)
    b.line(
        "executors",
        "executor memory",
        None if executors is None else executors * (EXECUTOR_MEMORY_GIB + EXECUTOR_OVERHEAD_GIB),
        "GiB",
        f"{executors} executors of {EXECUTOR_CORES} cores x ({num(EXECUTOR_MEMORY_GIB)} GiB + "
        f"{num(EXECUTOR_OVERHEAD_GIB)} GiB overhead), deploy/k8s/spark/sparkapplication.yaml (not measured)",
    )
    b.line(
        "executors",
        "tap-topic partitions",
        None if cores is None else PARTITIONS_PER_EXECUTOR_CORE * cores,
        "partitions",
        f"{PARTITIONS_PER_EXECUTOR_CORE} x executor cores (rule P), so that every core has a task",
        job_us,
    )

    # State: the trackers' heap per key; RocksDB's on-disk size is not measured.
    open_b, prod_b = b.fig("state.producer_open_bytes_per_10k"), b.fig("state.producer_bytes_per_10k")
    group_b = b.fig("state.group_bytes_per_10k")
    producers = inputs.producers or 0
    groups = inputs.groups or 0
    state: float | None = None
    if open_b.value is not None and prod_b.value is not None and group_b.value is not None:
        per_conn = (open_b.value - prod_b.value) / 10_000
        state = (
            producers * prod_b.value / 10_000
            + groups * group_b.value / 10_000
            + inputs.connections * per_conn
        )
        how = (
            f"{num(producers)} producers x {num(prod_b.value / 10_000)} B + {num(groups)} groups x "
            f"{num(group_b.value / 10_000)} B + {num(inputs.connections)} open connections x {num(per_conn)} B "
            "(the checkers' heap; RocksDB's own size on disk is not measured)"
        )
    else:
        how = _missing(open_b, prod_b, group_b)
    b.line("state", "state size", state, "B", how, prod_b, group_b, open_b)
    if inputs.producers is None or inputs.groups is None:
        est.warnings.append(
            "No --producers or --groups given: the state size counts only what is given (the tap's "
            "metrics do not count producer ids or groups)."
        )

    b.line(
        "latency",
        "p95 alert latency",
        p95.value if cores is not None else None,
        "s",
        f"measured at {num(lat_rate.value)} frames/s, {num(load)} of the job's sustained rate (the "
        "highest load the benchmark's live run kept up with, beside its broker and feeder), with a 1 s "
        "trigger; the executor cores above keep the job at that load"
        if p95.value is not None and lat_rate.value is not None and load is not None
        else _missing(p95, lat_rate),
        p95,
        lat_rate,
    )

    # The monitor next to the brokers: CPU per frame as a multiple of the broker's own, same run.
    for label, prefix in (("frame-heavy", "cost."), ("byte-heavy", "cost.byte_heavy.")):
        tap_r, job_r = b.fig(prefix + "tap_over_broker"), b.fig(prefix + "job_over_broker")
        mirror_r = b.fig(prefix + "broker_mirroring_over_direct")
        share: float | None = None
        if tap_r.value is not None and job_r.value is not None and mirror_r.value is not None:
            share = tap_r.value + job_r.value + (mirror_r.value - 1)
            how = (
                f"tap {tap_r.value} + job {job_r.value} + the broker's extra while mirroring "
                f"({mirror_r.value} - 1), each per frame over the broker's CPU per frame direct"
            )
        else:
            how = _missing(tap_r, job_r, mirror_r)
        b.line("cost", f"monitor CPU / broker CPU, {label}", share, "x", how, tap_r, job_r, mirror_r)

    _range_warnings(est, b, inputs, produce_b, fetch_b, cores)
    est.hosts = sorted({f.host for f in b.used if f.value is not None and f.host != "host-independent"})
    if len(est.hosts) > 1:
        est.warnings.append(
            "The figures come from runs on different CPUs (" + "; ".join(est.hosts) + "): they are "
            "comparable only within one model, so treat the sums as ±30 %."
        )
    return est


def _range_warnings(
    est: Estimate, b: _Book, inputs: Inputs, produce_b: float, fetch_b: float, cores: float | None
) -> None:
    cap = inputs.capture
    checks = [
        (produce_b, b.fig(f"tap.produce_mb_s.{cap}"), "produce per broker", "MB/s"),
        (fetch_b, b.fig(f"tap.fetch_mb_s.{cap}"), "fetch per broker", "MB/s"),
        (float(inputs.producers or 0), b.fig("state.keys_measured"), "producer ids", "keys"),
        (float(inputs.groups or 0), b.fig("state.keys_measured"), "groups", "keys"),
    ]
    if cores is not None:
        checks.append((cores, b.fig("job.cores"), "executor cores", "cores"))
    for value, limit, what, unit in checks:
        if limit.value is not None and value > limit.value:
            est.warnings.append(
                f"{what} {num(value)} {unit} is above the measured range ({num(limit.value)} {unit}, "
                f"{limit.cite()}): the estimate is extrapolated."
            )


# ----- rendering -------------------------------------------------------------------------------------


def show(value: float | None, unit: str) -> str:
    """A line's value with its unit, bytes in decimal units; "not measured" for None."""
    if value is None:
        return "not measured"
    if unit == "B":
        for scale, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if value >= scale:
                return f"{num(value / scale)} {name}"
        return f"{num(value)} B"
    if unit == "GiB":
        return f"{num(value)} GiB"
    if value == 1 and unit in _SINGULAR:
        return f"1 {_SINGULAR[unit]}"
    return f"{num(value)} {unit}"


#: The units that count things, and how one of them reads ("s" or "records/s" are no plurals).
_SINGULAR: Final = {
    "cores": "core",
    "executor cores": "executor core",
    "workers": "worker",
    "partitions": "partition",
}


def describe(inputs: Inputs) -> str:
    return (
        f"{inputs.brokers} brokers, {num(inputs.produce_mb_s)} MB/s produce, {num(inputs.fetch_mb_s)} MB/s "
        f"fetch, {num(inputs.requests_per_s)} requests/s, {num(inputs.connections)} connections, "
        f"{'?' if inputs.producers is None else num(inputs.producers)} producer ids, "
        f"{'?' if inputs.groups is None else num(inputs.groups)} groups, capture {inputs.capture}, "
        f"{num(inputs.retention_hours)} h retention at RF {inputs.replication_factor} ({inputs.source})"
    )


def render_text(est: Estimate) -> str:
    out = [f"kpmon size: {describe(est.inputs)}", ""]
    width = max(len(line.what) for line in est.lines)
    part = ""
    for line in est.lines:
        if line.part != part:
            part = line.part
            out.append(f"[{part}]")
        out.append(f"  {line.what:<{width}}  {show(line.value, line.unit)}")
        out.append(f"  {'':<{width}}  how: {line.how}")
        out.extend(f"  {'':<{width}}  from: {source}" for source in line.sources)
    if est.warnings:
        out += ["", "warnings:"] + [f"  - {w}" for w in est.warnings]
    out += ["", "to confirm the estimate, watch:"] + [f"  - {w.replace('`', '')}" for w in est.watch]
    return "\n".join(out) + "\n"


def render_markdown(est: Estimate) -> str:
    out = [
        f"Sizing for {describe(est.inputs)}.",
        "",
        "| part | quantity | estimate | how | source (file key, host) |",
        "|---|---|---|---|---|",
    ]
    for line in est.lines:
        sources = "<br>".join(f"`{s}`" for s in line.sources) or "design rule"
        out.append(f"| {line.part} | {line.what} | {show(line.value, line.unit)} | {line.how} | {sources} |")
    if est.warnings:
        out += ["", *[f"- {w}" for w in est.warnings]]
    out += ["", "To confirm the estimate, watch:", "", *[f"- {w}" for w in est.watch]]
    return "\n".join(out) + "\n"


DOCS_BEGIN = "<!-- kpmon size --refresh writes this block from benchmarks/results: do not edit it by hand -->"
DOCS_END = "<!-- end of the block kpmon size --refresh writes -->"
README_BEGIN = "<!-- kpmon size --refresh: cost -->"
README_END = "<!-- end cost -->"


def _cite(*figs: Figure) -> str:
    """A short citation: the files and hosts of ``figs`` (the figures table below gives the keys)."""
    named = dict.fromkeys(f"`{f.file}`, {f.host}" for f in figs if f.value is not None)
    return f" ({'; '.join(named)})" if named else ""


def _value(fig: Figure, scale: float = 1.0, unit: str | None = None) -> str:
    if fig.value is None:
        return f"not measured yet ({fig.missing})"
    return f"{num(fig.value * scale)} {fig.unit if unit is None else unit}".rstrip()


def render_docs(figures: Mapping[str, Figure]) -> str:
    """docs/cluster-mode.md's sizing block: one sentence per part, the reference clusters, the figures."""
    ests = {name: estimate(inputs, figures) for name, inputs in EXAMPLES.items()}
    f = figures
    medium = ests["medium"]
    frame_heavy = next(line for line in medium.lines if line.what == "monitor CPU / broker CPU, frame-heavy")
    share, share_b = frame_heavy.value, medium.value("monitor CPU / broker CPU, byte-heavy")
    tap_p, tap_f, tap_frame = (
        f["tap.produce_mcores_per_mb_s.headers"],
        f["tap.fetch_mcores_per_mb_s.headers"],
        f["cost.tap_cpu_us_per_frame"],
    )
    overhead, ratio, per_frame = (
        f["topic.record_overhead_bytes"],
        f["topic.value_ratio.headers"],
        f["cost.records_per_wire_frame"],
    )
    job_us, lat_rate, job_rate = (
        f["job.cpu_us_per_frame"],
        f["latency.rate_frames_per_s"],
        f["job.frames_per_s"],
    )
    prod, group, p95 = f["state.producer_bytes_per_10k"], f["state.group_bytes_per_10k"], f["latency.p95_s"]
    out = [
        DOCS_BEGIN,
        "",
        'What the monitor costs, one sentence per part (`headers` capture; "medium" is the reference '
        "cluster in the table):",
        "",
        f"- **Tap:** {_value(tap_p)} of produce traffic and {_value(tap_f)} of fetch traffic; per wire "
        f"frame, {_value(tap_frame)}{_cite(tap_p, tap_frame)}. The medium cluster's taps need "
        f"{show(medium.value('tap cores per broker'), 'cores')} per broker, and "
        f"one worker per core and workers x `tap.queue_max_bytes` + {TAP_MEMORY_HEADROOM_BYTES // MIB} MiB "
        "of memory (a design bound; the Kubernetes taps run 2 workers: a 768 MiB limit).",
        f"- **Tap topic:** each exchange (a request and its response) carries {_value(overhead, unit='B')} of key, framing and metadata in a full flush record (schema 3: a connection's exchanges, 64 at most, the connection's fields once), no Kafka headers, and a value "
        f"of {_value(ratio)} on a data-plane mix; tap records per wire frame before schema 3: {_value(per_frame, unit='')}"
        f"{_cite(overhead, per_frame)}. The medium cluster writes "
        f"{show(medium.value('tap-topic bytes/day'), 'B')} a day.",
        f"- **Executors:** the job spends {_value(job_us)}, planned at the load its latency was measured at "
        f"({_value(lat_rate, unit='')} of {_value(job_rate)}){_cite(job_us)}: "
        f"{show(medium.value('executor cores'), 'executor cores')} for the medium cluster.",
        f"- **State:** {_value(prod, 1e-4, 'B per producer id')} and {_value(group, 1e-4, 'B per group')} "
        f"after their connections close{_cite(prod)} (the checkers' heap; RocksDB's size on disk is not "
        "measured).",
        f"- **Latency:** p95 from a frame to its alert {_value(p95)} at that load{_cite(p95)}.",
        "- **Next to the brokers:** the whole monitor's CPU per frame is "
        + (
            f"{num(share)}x the broker's own on a frame-heavy workload"
            if share is not None
            else "not measured yet (" + frame_heavy.how.removeprefix("not measured: ") + ")"
        )
        + (f" and {num(share_b)}x on a byte-heavy one" if share_b is not None else "")
        + _cite(*(f[n] for n in ("cost.tap_over_broker", "cost.byte_heavy.tap_over_broker")))
        + ".",
        "",
        "| | " + " | ".join(EXAMPLES) + " |",
        "|---|" + "---|" * len(EXAMPLES),
        "| traffic | " + " | ".join(describe(i).split(", capture")[0] for i in EXAMPLES.values()) + " |",
    ]
    for index, line in enumerate(ests["small"].lines):
        values = [show(e.lines[index].value, e.lines[index].unit) for e in ests.values()]
        out.append(f"| {line.part}: {line.what} | " + " | ".join(values) + " |")
    warned: dict[str, list[str]] = {}
    for name, e in ests.items():
        for warning in e.warnings:
            warned.setdefault(warning, []).append(name)
    if warned:
        out += ["", "Where these estimates leave the measured range:", ""]
        out += [f"- {', '.join(names)}: {warning}" for warning, names in warned.items()]
    out += [
        "",
        "To confirm an estimate in production, watch:",
        "",
        *[f"- {w}" for w in WATCH],
        "",
        "Each figure's benchmark file, key, host and date: `kpmon size --json`, or the table in "
        "[benchmarks.md](benchmarks.md#current-figures).",
    ]
    out += ["", DOCS_END]
    return "\n".join(out)


def render_readme(figures: Mapping[str, Figure]) -> str:
    """The README's one "what it costs" line, for the small reference cluster."""
    inputs = EXAMPLES["small"]
    est = estimate(inputs, figures)
    share = est.value("monitor CPU / broker CPU, frame-heavy")
    by_frames = est.value("tap cores per broker, by frames")
    return (
        f"{README_BEGIN}\n**What it costs**, for {inputs.brokers} brokers at {num(inputs.produce_mb_s)} MB/s "
        f"produce and {num(inputs.requests_per_s)} requests/s: "
        f"{show(est.value('tap cores per broker'), 'cores')}"
        + (" (by bytes: its CPU per frame is not measured yet)" if by_frames is None else "")
        + f" and {show(est.value('tap memory per broker'), 'MiB')} per broker for the tap "
        f"({show(est.value('tap workers per broker'), 'workers')}), "
        f"{show(est.value('executor cores'), 'executor cores')} and "
        f"{show(est.value('executor memory'), 'GiB')} for the job, "
        f"{show(est.value('tap-topic retention disk'), 'B')} of tap topic for 48 h at RF 3, "
        f"p95 alert latency {show(est.value('p95 alert latency'), 's')}; the monitor's CPU next to the "
        + ("brokers' is not measured yet" if share is None else f"brokers' is {num(share)}x theirs per frame")
        + " (`kpmon size`, [docs/cluster-mode.md](docs/cluster-mode.md#sizing)).\n"
        + README_END
    )


def replace_block(text: str, begin: str, end: str, block: str) -> str:
    """``text`` with the block from ``begin`` to ``end`` (both included, both in ``block``) replaced."""
    start = text.index(begin)
    stop = text.index(end, start) + len(end)
    return text[:start] + block + text[stop:]


# ----- traffic from a tap's metrics ------------------------------------------------------------------


@dataclass(frozen=True)
class Traffic:
    """Rates derived from two scrapes of the tap metrics endpoints (tap/metrics.py)."""

    brokers_seen: int
    produce_mb_s: float
    fetch_mb_s: float
    requests_per_s: float
    connections: int


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def traffic_from_metrics(before: list[str], after: list[str], seconds: float) -> Traffic:
    """Rates between two scrapes of each endpoint (``before[i]`` and ``after[i]`` are one endpoint's
    expositions, ``seconds`` apart): request frames/s, Produce request and Fetch response bytes/s, the
    open connections at the second scrape and the broker ids seen."""
    if seconds <= 0:
        raise ValueError("the scrapes must be apart in time")
    requests = produce = fetch = 0.0
    connections = 0
    brokers: set[str] = set()
    for endpoint, (first, second) in enumerate(zip(before, after, strict=True)):
        old, new = _samples(first), _samples(second)
        for (name, labels), value in new.items():
            label = dict(labels)
            delta = value - old.get((name, labels), 0.0)
            if name == "kpmon_tap_frames_total" and label.get("dir") == "req":
                requests += delta
            elif name == "kpmon_tap_bytes_total":
                if label.get("dir") == "req" and label.get("api") == "PRODUCE":
                    produce += delta
                elif label.get("dir") == "resp" and label.get("api") == "FETCH":
                    fetch += delta
            elif name == "kpmon_tap_active_connections":
                connections += int(value)
                # A listener whose broker id is not known yet still fronts one broker.
                broker = label.get("broker_id", "none")
                brokers.add(broker if broker != "none" else f"{endpoint}/{label.get('listener')}")
    return Traffic(
        brokers_seen=len(brokers),
        produce_mb_s=produce / seconds / 1e6,
        fetch_mb_s=fetch / seconds / 1e6,
        requests_per_s=requests / seconds,
        connections=connections,
    )
