"""``kpmon.sizing``: every estimate recomputed here by hand from the committed JSON, so a drift in the
code's formulas or in the figures it reads fails; the shipped figures and the generated docs agree with
``benchmarks/results``."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from kpmon import sizing
from kpmon.commands.size import read_results, shipped_figures
from kpmon.figures import BENCHMARKS_BEGIN, BENCHMARKS_END, headline_specs, pick, render_headlines

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

#: cost_bench.json in the shape benchmarks/cost_bench.py (issue 26) writes: the frame-heavy workload's
#: ratios at the top, every workload's figures and ratios under ``workloads``. Values made up for the test.
COST_BENCH: dict[str, Any] = {
    "benchmark": "cost_bench",
    "measured_at": "2026-11-29T10:00:00Z",
    "machine": {"cpu_model": "Test CPU (family 1 model 2)", "cpus": 2},
    "records_per_wire_frame": 0.55,
    "ratios": {"tap_over_broker": 0.3, "job_over_broker": 0.25, "broker_mirroring_over_direct": 1.08},
    "workloads": {
        "frame_heavy": {"figures": {"tap": {"us_per_frame": 48.0, "ms_per_mib": 310.0}}},
        "byte_heavy": {
            "ratios": {"tap_over_broker": 0.12, "job_over_broker": 0.05, "broker_mirroring_over_direct": 1.02}
        },
    },
}


def load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


def key(record: dict[str, Any], dotted: str) -> float:
    node: Any = record
    for part in dotted.split("."):
        node = node[part]
    return float(node)


def results_with_cost() -> dict[str, dict[str, Any] | None]:
    results = read_results(RESULTS)
    results["cost_bench.json"] = COST_BENCH
    return results


def expected(inputs: sizing.Inputs) -> dict[str, float]:
    """The estimate by hand, from the JSON files and the fixture, formula by formula."""
    tap, topic = load("tap_bench.json"), load("tap_topic_size.json")
    stream, checks = load("stream_bench.json"), load("checks_bench.json")
    cap = inputs.capture
    b = inputs.brokers
    by_bytes = (
        inputs.produce_mb_s / b * key(tap, f"summary.{cap}.produce.tap_mcores_per_mb_s")
        + inputs.fetch_mb_s / b * key(tap, f"summary.{cap}.consume.tap_mcores_per_mb_s")
    ) / 1000
    by_frames = (
        2
        * inputs.requests_per_s
        / b
        * COST_BENCH["workloads"]["frame_heavy"]["figures"]["tap"]["us_per_frame"]
        / 1e6
    )
    records = 2 * inputs.requests_per_s * COST_BENCH["records_per_wire_frame"]
    bytes_s = (inputs.produce_mb_s + inputs.fetch_mb_s) * 1e6 * key(
        topic, f"mixes.produce_fetch_heavy.{cap}_value_ratio"
    ) + records * key(topic, "record_overhead_bytes")
    load_at_p95 = key(stream, "latency.rate_frames_per_second") / key(stream, "job.wire_frames_per_second")
    # The job's CPU is per wire frame (two per request), whatever the records hold.
    wire = 2 * inputs.requests_per_s
    cores = max(1, math.ceil(wire * key(stream, "job.cpu_us_per_wire_frame") / 1e6 / load_at_p95))
    prod = key(checks, "memory.producers.per_10k_bytes.held_after_close") / 10_000
    prod_open = key(checks, "memory.producers.per_10k_bytes.held") / 10_000
    group = key(checks, "memory.groups.per_10k_bytes.held_after_close") / 10_000
    r, rb = COST_BENCH["ratios"], COST_BENCH["workloads"]["byte_heavy"]["ratios"]
    return {
        "tap cores per broker, by bytes": by_bytes,
        "tap cores per broker, by frames": by_frames,
        "tap cores per broker": max(by_bytes, by_frames),
        "tap workers per broker": max(1, math.ceil(max(by_bytes, by_frames))),
        "tap memory per broker": (
            max(1, math.ceil(max(by_bytes, by_frames))) * inputs.tap_queue_max_bytes + 256 * 2**20
        )
        / 2**20,
        "tap records/s": records,
        "tap-topic bytes/day": bytes_s * 86_400,
        "tap-topic retention disk": bytes_s * inputs.retention_hours * 3600 * inputs.replication_factor,
        "executor cores": cores,
        "executor memory": math.ceil(cores / 2) * (4 + 1),
        "tap-topic partitions": 3 * cores,
        "state size": (inputs.producers or 0) * prod
        + (inputs.groups or 0) * group
        + inputs.connections * (prod_open - prod),
        "p95 alert latency": key(stream, "latency.p95_seconds"),
        "monitor CPU / broker CPU, frame-heavy": r["tap_over_broker"]
        + r["job_over_broker"]
        + r["broker_mirroring_over_direct"]
        - 1,
        "monitor CPU / broker CPU, byte-heavy": rb["tap_over_broker"]
        + rb["job_over_broker"]
        + rb["broker_mirroring_over_direct"]
        - 1,
    }


@pytest.mark.parametrize("name", ["small", "medium", "large"])
def test_each_reference_cluster_matches_the_json_by_hand(name: str) -> None:
    inputs = sizing.EXAMPLES[name]
    est = sizing.estimate(inputs, sizing.extract(results_with_cost()))
    got = {line.what: line.value for line in est.lines}
    want = expected(inputs)
    assert set(got) == set(want)
    for what, value in want.items():
        assert got[what] == pytest.approx(value, rel=1e-9), what


def test_the_reference_clusters_are_the_issues() -> None:
    small, large = sizing.EXAMPLES["small"], sizing.EXAMPLES["large"]
    assert (small.brokers, small.produce_mb_s, small.requests_per_s) == (3, 20.0, 5_000)
    assert (large.brokers, large.produce_mb_s, large.requests_per_s) == (30, 3_000.0, 1_000_000)


def test_the_small_cluster_is_sized_by_frames_and_the_large_by_bytes() -> None:
    """The two tap estimates cross over: small requests make the frames count, big batches the bytes."""
    figures = sizing.extract(results_with_cost())
    small = sizing.estimate(replace(sizing.EXAMPLES["small"], produce_mb_s=1, fetch_mb_s=1), figures)
    assert small.value("tap cores per broker") == small.value("tap cores per broker, by frames")
    large = sizing.estimate(replace(sizing.EXAMPLES["large"], requests_per_s=1_000), figures)
    assert large.value("tap cores per broker") == large.value("tap cores per broker, by bytes")


def test_every_line_names_a_figure_with_its_file_key_and_host() -> None:
    figures = sizing.extract(results_with_cost())
    est = sizing.estimate(sizing.EXAMPLES["medium"], figures)
    design = {"tap memory per broker", "executor memory"}
    for line in est.lines:
        if line.what in design:
            assert "not measured" in line.how, line.what
            continue
        assert line.sources, line.what
        for source in line.sources:
            assert source.split()[0].endswith(".json"), source
    cited = " ".join(s for line in est.lines for s in line.sources)
    assert "tap_bench.json summary.headers.produce.tap_mcores_per_mb_s (AMD EPYC" in cited
    assert "cost_bench.json ratios.tap_over_broker (Test CPU (family 1 model 2))" in cited
    # The committed results name their CPU as each run recorded it (older runs: the model name only).
    assert "Test CPU (family 1 model 2)" in est.hosts
    assert all(
        h.startswith(("AMD EPYC", "Intel(R) Xeon(R)"))
        for h in est.hosts
        if h != "Test CPU (family 1 model 2)"
    )
    assert any("different CPUs" in w for w in est.warnings)


def test_a_missing_cost_bench_is_said_missing_never_filled_in() -> None:
    results = read_results(RESULTS)
    results["cost_bench.json"] = None
    est = sizing.estimate(sizing.EXAMPLES["small"], sizing.extract(results))
    for what in (
        "tap cores per broker, by frames",
        "monitor CPU / broker CPU, frame-heavy",
        "monitor CPU / broker CPU, byte-heavy",
    ):
        assert est.value(what) is None
        line = next(line for line in est.lines if line.what == what)
        assert "cost_bench.json does not exist" in line.how
    assert est.value("tap cores per broker") == est.value("tap cores per broker, by bytes")
    assert any("CPU per frame is not measured" in w for w in est.warnings)
    assert "not measured" in sizing.render_text(est)


def test_a_latency_run_that_never_kept_up_sizes_no_executors() -> None:
    """stream_bench writes no latency figures when the live job fell behind at every rate it tried: the
    executors, sized at the load the job kept up with, are then not measured, and nothing fills in."""
    results = results_with_cost()
    bench = results["stream_bench.json"]
    assert bench is not None
    results["stream_bench.json"] = {
        **bench,
        "latency": {"kept_up": False, "p95_seconds": None, "rate_frames_per_second": None},
    }
    est = sizing.estimate(sizing.EXAMPLES["small"], sizing.extract(results))
    for what in ("executor cores", "p95 alert latency"):
        assert est.value(what) is None
        line = next(line for line in est.lines if line.what == what)
        assert "stream_bench.json has no number at latency." in line.how, line.how
    shipped = sizing.estimate(sizing.EXAMPLES["small"], sizing.extract(results_with_cost()))
    assert shipped.value("executor cores") is not None and shipped.value("p95 alert latency") is not None


def test_a_quick_cost_bench_run_is_no_measurement() -> None:
    results = results_with_cost()
    results["cost_bench.json"] = {**COST_BENCH, "quick": True}
    figures = sizing.extract(results)
    assert figures["cost.tap_over_broker"].value is None
    assert "--quick" in (figures["cost.tap_over_broker"].missing or "")


def test_inputs_beyond_the_measured_range_warn_and_name_the_figure() -> None:
    figures = sizing.extract(results_with_cost())
    tap = load("tap_bench.json")
    measured = key(tap, "summary.headers.produce.tap_mb_per_sec")
    inside = sizing.estimate(sizing.EXAMPLES["small"], figures)
    assert not any("produce per broker" in w for w in inside.warnings)
    large = sizing.estimate(sizing.EXAMPLES["large"], figures)
    assert measured < 3_000 / 30
    assert any(
        "produce per broker" in w and "summary.headers.produce.tap_mb_per_sec" in w for w in large.warnings
    )
    assert any("executor cores" in w for w in large.warnings)
    assert any("kpmon_tap_mirror_queue_depth" in w for w in large.watch)
    assert any("kpmon_stream_lag_records" in w for w in large.watch)


def test_bad_inputs_are_refused() -> None:
    figures = shipped_figures()
    with pytest.raises(ValueError, match="capture"):
        sizing.estimate(replace(sizing.EXAMPLES["small"], capture="off"), figures)
    with pytest.raises(ValueError, match="brokers"):
        sizing.estimate(replace(sizing.EXAMPLES["small"], brokers=0), figures)


# ----- one source of truth -----------------------------------------------------------------------


def test_the_shipped_figures_are_benchmarks_results() -> None:
    """Fails when a benchmark rewrote its JSON and `kpmon size --refresh` was not run."""
    assert shipped_figures() == sizing.extract(read_results(RESULTS))


def test_the_shipped_figures_are_package_data() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert 'kpmon = ["sizing_figures.json"]' in text


def test_the_cluster_mode_sizing_block_is_generated_from_the_json() -> None:
    text = (ROOT / "docs" / "cluster-mode.md").read_text(encoding="utf-8")
    start = text.index(sizing.DOCS_BEGIN)
    stop = text.index(sizing.DOCS_END) + len(sizing.DOCS_END)
    assert text[start:stop] == sizing.render_docs(sizing.extract(read_results(RESULTS)))
    assert "3,000 tap records/s" not in text and "3 cores per 100 MB/s" not in text


def test_the_readme_cost_line_is_generated_from_the_json() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(sizing.README_BEGIN)
    stop = text.index(sizing.README_END) + len(sizing.README_END)
    assert text[start:stop] == sizing.render_readme(sizing.extract(read_results(RESULTS)))


def test_the_benchmarks_figures_table_is_generated_from_the_json() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    start = text.index(BENCHMARKS_BEGIN)
    stop = text.index(BENCHMARKS_END) + len(BENCHMARKS_END)
    assert text[start:stop] == render_headlines(pick(headline_specs(), read_results(RESULTS)))
    # stream_bench.json job.cpu_us_per_wire_frame (38.2), read by hand.
    assert "| whole job, per wire frame, local[2] | 38.2 µs CPU/frame |" in text[start:stop]


def test_the_docs_block_changes_with_a_figure() -> None:
    """The docs test above can fail: a changed figure changes the block."""
    results = read_results(RESULTS)
    before = sizing.render_docs(sizing.extract(results))
    stream = json.loads(json.dumps(results["stream_bench.json"]))
    stream["latency"]["p95_seconds"] = 99.0
    results["stream_bench.json"] = stream
    after = sizing.render_docs(sizing.extract(results))
    assert before != after and "99 s" in after


def test_the_executor_shape_is_the_manifests() -> None:
    manifest = yaml.safe_load((ROOT / "deploy" / "k8s" / "spark" / "sparkapplication.yaml").read_text())
    executor = manifest["spec"]["executor"]
    assert executor["cores"] == sizing.EXECUTOR_CORES
    assert executor["memory"] == f"{sizing.EXECUTOR_MEMORY_GIB:g}g"
    assert executor["memoryOverhead"] == f"{sizing.EXECUTOR_OVERHEAD_GIB:g}g"


# ----- traffic from a tap's metrics --------------------------------------------------------------


def test_traffic_from_two_expositions_of_real_tap_metrics() -> None:
    from prometheus_client import generate_latest

    from codec.protocol import ApiKey
    from tap.metrics import TapMetrics

    metrics = TapMetrics()
    one, two = metrics.listener(1, "plain"), metrics.listener(2, "plain")
    one.frame("req", int(ApiKey.PRODUCE), 9, 1_000)
    first = generate_latest(metrics.registry).decode()
    for _ in range(30):
        one.frame("req", int(ApiKey.PRODUCE), 9, 10_000)
        one.frame("resp", int(ApiKey.PRODUCE), 9, 100)
        two.frame("req", int(ApiKey.FETCH), 12, 100)
        two.frame("resp", int(ApiKey.FETCH), 12, 50_000)
    one.connections.set(3)
    two.connections.set(4)
    second = generate_latest(metrics.registry).decode()
    traffic = sizing.traffic_from_metrics([first], [second], 10.0)
    assert traffic.requests_per_s == pytest.approx(60 / 10)
    assert traffic.produce_mb_s == pytest.approx(30 * 10_000 / 10 / 1e6)
    assert traffic.fetch_mb_s == pytest.approx(30 * 50_000 / 10 / 1e6)
    assert traffic.connections == 7
    assert traffic.brokers_seen == 2


def test_a_count_of_one_reads_in_the_singular() -> None:
    assert sizing.show(1, "executor cores") == "1 executor core"
    assert sizing.show(1, "partitions") == "1 partition"
    assert sizing.show(2, "cores") == "2 cores"
    assert sizing.show(1, "GiB") == "1 GiB"
    assert sizing.show(1, "s") == "1 s"
    assert sizing.show(1, "records/s") == "1 records/s"
    assert sizing.show(2, "workers") == "2 workers"
