"""Figures picked out of the benchmarks' results files (``benchmarks/results/*.json``), sans-I/O.

A figure is the number at a dotted key of one results file, with the CPU model of the run that wrote it
(the file's ``machine`` record) and when it ran. A figure the file does not hold, or a file that is a
``--quick`` smoke run, is carried as missing with the reason, never filled in from elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class FigureSpec:
    """Where a figure lives: a results file and a dotted key in it."""

    name: str
    file: str
    key: str
    unit: str
    what: str
    #: Byte counts computed from frames do not depend on the CPU they were computed on.
    host_independent: bool = False


@dataclass(frozen=True)
class Figure:
    name: str
    file: str
    key: str
    unit: str
    what: str
    value: float | None
    #: The CPU model of the run (``machine.cpu_model``), or why there is none.
    host: str
    measured_at: str | None
    #: Why ``value`` is None.
    missing: str | None = None

    def cite(self) -> str:
        """``file key`` and the host, as every number's source reads."""
        return f"{self.file} {self.key} ({self.host})"


def _lookup(record: Mapping[str, Any], key: str) -> Any:
    node: Any = record
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _host(record: Mapping[str, Any]) -> str:
    machine = record.get("machine")
    model = machine.get("cpu_model") if isinstance(machine, Mapping) else None
    return str(model) if model else "CPU model not recorded"


def pick(specs: Iterable[FigureSpec], results: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Figure]:
    """The figures ``specs`` name, out of parsed results files (file name -> JSON, None if absent)."""
    figures: dict[str, Figure] = {}
    for spec in specs:
        record = results.get(spec.file)
        value: float | None = None
        missing: str | None = None
        if record is None:
            missing = f"benchmarks/results/{spec.file} does not exist"
            host, when = "not measured", None
        else:
            host = "host-independent" if spec.host_independent else _host(record)
            raw_when = record.get("measured_at") or record.get("when") or record.get("generated_at")
            when = str(raw_when) if raw_when else None
            raw = _lookup(record, spec.key)
            if record.get("quick"):
                missing = f"{spec.file} is a --quick smoke run, not a measurement"
            elif isinstance(raw, bool) or not isinstance(raw, int | float):
                missing = f"{spec.file} has no number at {spec.key}"
            else:
                value = float(raw)
        figures[spec.name] = Figure(
            spec.name, spec.file, spec.key, spec.unit, spec.what, value, host, when, missing
        )
    return figures


def figures_to_json(figures: Mapping[str, Figure]) -> dict[str, Any]:
    return {"figures": {name: asdict(fig) for name, fig in sorted(figures.items())}}


def figures_from_json(data: Mapping[str, Any]) -> dict[str, Figure]:
    return {name: Figure(**fields) for name, fields in data["figures"].items()}


def _spec(file: str, key: str, unit: str, what: str) -> FigureSpec:
    return FigureSpec(f"{file}:{key}", file, key, unit, what)


#: Each benchmark's headline figures, each with the anchor measured in the same run (the figure it is
#: compared with, so that it reads across hosts), for docs/benchmarks.md's table.
HEADLINES: tuple[tuple[FigureSpec, FigureSpec | None], ...] = (
    (
        _spec(
            "stream_bench.json",
            "job.cpu_us_per_wire_frame",
            "µs CPU/frame",
            "whole job, per wire frame, local[2]",
        ),
        _spec("stream_bench.json", "raw.cpu_us_per_frame", "µs CPU/frame", "Spark's raw read of the topic"),
    ),
    (
        _spec("stream_bench.json", "ratios.job_over_raw", "x", "whole job's rate over the raw read's"),
        None,
    ),
    (
        _spec("stream_bench.json", "latency.p95_seconds", "s", "p95 alert latency, 1 s trigger"),
        _spec(
            "stream_bench.json",
            "latency.rate_frames_per_second",
            "frames/s",
            "live rate the job kept up with",
        ),
    ),
    (
        _spec(
            "stages_bench.json",
            "us_per_frame.route_and_stage",
            "µs/frame",
            "routing and the stage, pure steps",
        ),
        _spec("stages_bench.json", "us_per_frame.full_decode_comparison", "µs/frame", "a full codec decode"),
    ),
    (
        _spec(
            "source_bench.json",
            "warm_median.with_headers_cpu_us_per_frame",
            "µs CPU/frame",
            "raw read with headers",
        ),
        _spec(
            "source_bench.json",
            "warm_median.without_headers_cpu_us_per_frame",
            "µs CPU/frame",
            "without headers",
        ),
    ),
    (
        _spec(
            "batch_floor_bench.json",
            "results.one_stage.trigger_ms",
            "ms",
            "a live batch, one stateful stage",
        ),
        _spec("batch_floor_bench.json", "results.shuffle.trigger_ms", "ms", "a plain shuffle"),
    ),
    (
        _spec(
            "state_api_bench.json",
            "ratios.per_key_over_one_value_write",
            "x",
            "per-key map writes over one value",
        ),
        None,
    ),
    (
        _spec(
            "checks_bench.json",
            "mixes.fleet.trackers_records_per_s",
            "records/s",
            "checks engine, every rule",
        ),
        _spec(
            "checks_bench.json", "mixes.fleet.projected_decode_records_per_s", "records/s", "projected decode"
        ),
    ),
    (
        _spec(
            "codec_bench.json",
            "ratios.produce_fetch_heavy.ours/kafka-python",
            "x",
            "full decode over kafka-python",
        ),
        _spec(
            "codec_bench.json",
            "mixes.produce_fetch_heavy.kafka_python.frames_per_s",
            "frames/s",
            "kafka-python",
        ),
    ),
    (
        _spec(
            "codec_bench.json",
            "ratios.balanced.projected/full",
            "x",
            "projected over full decode, balanced mix",
        ),
        _spec("codec_bench.json", "mixes.balanced.kpmon_full.frames_per_s", "frames/s", "full decode"),
    ),
    (
        _spec(
            "tap_bench.json",
            "summary.headers.produce.tap_mcores_per_mb_s",
            "mcores per MB/s",
            "tap, produce, `headers`",
        ),
        _spec("tap_bench.json", "summary.headers.produce.direct_mb_per_sec", "MB/s", "the broker direct"),
    ),
    (
        _spec(
            "tap_bench.json",
            "summary.headers.produce.throughput_ratio",
            "x",
            "produce throughput through the tap",
        ),
        None,
    ),
    (
        _spec(
            "tap_topic_size.json",
            "mixes.produce_fetch_heavy.headers_record_ratio",
            "x",
            "tap-topic bytes per client byte, `headers`",
        ),
        None,
    ),
    (
        _spec("quality_bench.json", "gate.typical_no_findings.median_ms", "ms", "quality gate per batch"),
        None,
    ),
    (
        _spec("hooks_bench.json", "summary.alertmanager_alerts_per_s", "alerts/s", "Alertmanager hook"),
        _spec("hooks_bench.json", "summary.webhook_alerts_per_s", "alerts/s", "webhook hook"),
    ),
    (
        _spec("cost_bench.json", "ratios.tap_over_broker", "x", "tap CPU per frame over the broker's"),
        None,
    ),
    (
        _spec("cost_bench.json", "ratios.job_over_broker", "x", "job CPU per frame over the broker's"),
        None,
    ),
)

BENCHMARKS_BEGIN = (
    "<!-- kpmon size --refresh writes this table from benchmarks/results: do not edit it by hand -->"
)
BENCHMARKS_END = "<!-- end of the table kpmon size --refresh writes -->"


def headline_specs() -> list[FigureSpec]:
    return [spec for pair in HEADLINES for spec in pair if spec is not None]


def render_headlines(figures: Mapping[str, Figure]) -> str:
    """docs/benchmarks.md's table of current figures (``figures``: :func:`pick` of
    :func:`headline_specs`)."""
    out = [
        BENCHMARKS_BEGIN,
        "",
        "| figure | value | anchor, same run | file, key | host | measured |",
        "|---|---|---|---|---|---|",
    ]
    for spec, anchor in HEADLINES:
        fig = figures[spec.name]
        value = "not measured yet" if fig.value is None else _with_unit(fig.value, fig.unit)
        base = "" if anchor is None else figures[anchor.name]
        anchored = (
            ""
            if not isinstance(base, Figure)
            else f"{base.what}: {'not measured' if base.value is None else _with_unit(base.value, base.unit)}"
        )
        out.append(
            f"| {fig.what} | {value} | {anchored} | `{fig.file}` `{fig.key}` | {fig.host} | "
            f"{fig.measured_at or 'not recorded'} |"
        )
    out += ["", BENCHMARKS_END]
    return "\n".join(out)


def _with_unit(value: float, unit: str) -> str:
    return f"{num(value)}x" if unit == "x" else f"{num(value)} {unit}"


def num(x: float) -> str:
    """Three significant digits, thousands separated."""
    if float(x).is_integer() and abs(x) >= 1:
        return f"{int(x):,}"
    if x == 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{round(x, digits):,.{digits}f}"
