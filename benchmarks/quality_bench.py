"""What the Great Expectations data-quality gate costs per micro-batch, and what it avoids.

Measured in one run, on the same decoded-frame rows:

- **gate** (what the job does): ``QualityGate.validate`` on the driver over small pandas inputs, the
  batch's per-(dir, api, version) aggregates and its findings. Reported alone (median and p95 ms per
  call, for a typical batch, a batch with findings, a failing batch and an empty one) and end to end
  with the Spark aggregation that produces ``frames_agg`` from the batch's rows.
- **naive per-row GX on Spark** (what it avoids): the same frame-level invariants written per row and
  validated by GX over the batch's Spark DataFrame (``context.data_sources.add_spark``), ``local[2]``.
  The findings suite is left out of this side: it is tiny in both designs.
- **Data Docs**: ``build_docs()`` with the kept validation results of a number of batches, the
  hand-off of a background render, and ``validate`` while one runs.

The three Spark-side cases run round-robin, so load drifting during the run (a shared machine)
weighs on each alike.

The rows are the real frames of ``tests/data/tap_frames.jsonl`` (real clients through the tap), decoded
by the codec, weighted towards the data plane (Produce/Fetch) and repeated to ``--rows`` (default
100,000) with 0.1 % undecodable frames. Both sides read the same cached DataFrame, which favours the
per-row side (no source or decode to recompute per metric).

    .venv/bin/python -m benchmarks.quality_bench            # about 2-4 minutes on 2 cores
    .venv/bin/python -m benchmarks.quality_bench --quick    # smoke run
    # --rows N --reps N (gate calls) --spark-reps N --docs-batches N --no-write

Writes ``benchmarks/results/quality_bench.json``. Figures, not a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

import codec  # noqa: E402
from benchmarks.results_file import machine  # noqa: E402
from checks.model import Finding, Severity  # noqa: E402
from kpconfig.model import QualityConfig  # noqa: E402
from streaming.quality_suites import FINDINGS_COLUMNS, FRAMES_AGG_COLUMNS  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "quality_bench.json"
CORPUS = ROOT / "tests" / "data" / "tap_frames.jsonl"
#: Copies of each corpus frame per API, so the mix looks like a busy cluster: mostly data plane.
WEIGHTS = {0: 40, 1: 40, 12: 8, 8: 6, 3: 4, 2: 3}
DECODE_ERROR_EVERY = 1000
AGG_COLUMNS = list(FRAMES_AGG_COLUMNS)
FINDING_COLUMNS = list(FINDINGS_COLUMNS)


# -- workload --------------------------------------------------------------------------------------


def corpus_rows() -> list[dict[str, Any]]:
    """One decoded-frame row per corpus frame: the columns the frame-level invariants read."""
    rows = []
    for line in CORPUS.read_text().splitlines():
        rec = json.loads(line)
        raw = bytes.fromhex(rec["hex"])
        key, version = int(rec["api_key"]), int(rec["api_version"])
        row: dict[str, Any] = {
            "dir": rec["dir"],
            "api_key": key,
            "api_name": codec.api_name(key),
            "api_version": version,
            "decode_error": None,
            "protocol_type": None,
            "error_code": None,
        }
        try:
            if rec["dir"] == "req":
                body = codec.decode_request(raw).body
            else:
                body = codec.decode_response(raw, key, version).body
                code = body.get("ErrorCode")
                row["error_code"] = int(code) if isinstance(code, int) else None
            protocol = body.get("ProtocolType")
            row["protocol_type"] = protocol if isinstance(protocol, str) else None
        except codec.DecodeError as exc:
            row["decode_error"] = str(exc)
        rows.append(row)
    return rows


def batch_rows(n: int) -> pd.DataFrame:
    base = corpus_rows()
    weighted = [r for r in base for _ in range(WEIGHTS.get(int(r["api_key"]), 1))]
    rows = []
    for i in range(n):
        if i % DECODE_ERROR_EVERY == DECODE_ERROR_EVERY - 1:
            rows.append(
                {
                    "dir": "req",
                    "api_key": None,
                    "api_name": None,
                    "api_version": None,
                    "decode_error": "truncated header",
                    "protocol_type": None,
                    "error_code": None,
                }
            )
        else:
            rows.append(weighted[i % len(weighted)])
    frame = pd.DataFrame(rows)
    return frame.astype({"api_key": "Int64", "api_version": "Int64", "error_code": "Int64"})


def aggregate_pandas(rows: pd.DataFrame) -> pd.DataFrame:
    """``frames_agg`` as the job hands it to the gate (computed here in pandas, for the gate-only runs)."""
    needs_type = (rows["dir"] == "resp") & (
        ((rows["api_key"] == 11) & (rows["api_version"] >= 7))
        | ((rows["api_key"] == 14) & (rows["api_version"] >= 5))
    )
    work = rows.assign(
        frames=1,
        decode_errors=rows["decode_error"].notna().astype("int64"),
        null_protocol_type=(needs_type.fillna(False) & rows["protocol_type"].isna()).astype("int64"),
        error_responses=(rows["error_code"].fillna(0) != 0).astype("int64"),
    )
    agg = work.groupby(["dir", "api_key", "api_version"], dropna=False, as_index=False).agg(
        api_name=("api_name", "first"),
        frames=("frames", "sum"),
        decode_errors=("decode_errors", "sum"),
        null_protocol_type=("null_protocol_type", "sum"),
        error_responses=("error_responses", "sum"),
    )
    return agg[AGG_COLUMNS]


def some_findings(n: int) -> pd.DataFrame:
    """Findings as the checkers raise them on a normal day: info and warnings, none the suites flag."""
    rules = [
        ("apiversions.no_handshake", Severity.INFO),
        ("producer.stale_epoch_rejected", Severity.WARNING),
        ("producer.sequence_gap", Severity.WARNING),
        ("apiversions.out_of_range", Severity.INFO),
        ("flex.tagged_fields", Severity.INFO),
    ]
    out = []
    for i in range(n):
        rule, severity = rules[i % len(rules)]
        f = Finding(
            rule, severity, f"conn:tap1-{i}", "bench", 1_700_000_000_000_000_000 + i, {"conn": "c", "seq": i}
        )
        out.append({k: v for k, v in f.to_dict().items() if k in FINDING_COLUMNS})
    return pd.DataFrame(out, columns=FINDING_COLUMNS)


# -- timing ----------------------------------------------------------------------------------------


def _figures(samples: list[float]) -> dict[str, float]:
    samples = sorted(samples)
    return {
        "median_ms": round(statistics.median(samples), 2),
        "p95_ms": round(samples[min(len(samples) - 1, int(0.95 * len(samples)))], 2),
        "min_ms": round(samples[0], 2),
        "reps": len(samples),
    }


def interleaved(
    cases: dict[str, Callable[[], Any]], reps: int, warmup: int = 1
) -> dict[str, dict[str, float]]:
    """Time the cases round-robin, so load that drifts during the run weighs on all of them alike."""
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(reps):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - start) * 1000)
    return {name: _figures(values) for name, values in samples.items()}


def timed(fn: Callable[[], Any], reps: int, warmup: int = 2) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return {
        "median_ms": round(statistics.median(samples), 2),
        "p95_ms": round(samples[min(len(samples) - 1, int(0.95 * len(samples)))], 2),
        "min_ms": round(samples[0], 2),
        "reps": reps,
    }


def bench_gate(rows: pd.DataFrame, reps: int) -> dict[str, Any]:
    from streaming.quality import QualityGate

    start = time.perf_counter()
    gate = QualityGate(QualityConfig(), None)
    init_ms = (time.perf_counter() - start) * 1000
    agg = aggregate_pandas(rows)
    findings = some_findings(10)
    failing = agg.copy()
    failing.loc[failing.index[0], "null_protocol_type"] = 1
    empty_agg, empty_findings = agg.iloc[0:0], findings.iloc[0:0]
    no_findings = findings.iloc[0:0]
    batch = [0]

    def run(a: pd.DataFrame, f: pd.DataFrame, expect: bool) -> Callable[[], None]:
        def call() -> None:
            batch[0] += 1
            result = gate.validate(batch[0], a, f)
            assert result.success is expect, result.findings

        return call

    return {
        "gate_init_ms": round(init_ms, 1),
        "agg_rows": len(agg),
        "typical_no_findings": timed(run(agg, no_findings, True), reps),
        "with_10_findings": timed(run(agg, findings, True), reps),
        "failing_one_expectation": timed(run(failing, no_findings, False), max(5, reps // 4)),
        "empty_batch": timed(run(empty_agg, empty_findings, True), reps),
    }


def bench_docs(rows: pd.DataFrame, batches: int, reps: int) -> dict[str, Any]:
    """Keeping results, rendering them, and what a background render costs the batches meanwhile."""
    from streaming.quality import QualityGate

    agg = aggregate_pandas(rows)
    no_findings = some_findings(0)
    with tempfile.TemporaryDirectory(prefix="kpmon-quality-bench-") as tmp:
        config = QualityConfig(docs_sample_every_batches=1, docs_every_batches=10**9, docs_keep_results=10**6)
        gate = QualityGate(config, Path(tmp))
        site = gate._docs
        assert site is not None
        keep = timed(lambda: gate.validate(0, agg, some_findings(10)), batches, warmup=0)
        kept = len(list((Path(tmp) / "results").rglob("*.json")))
        render = timed(lambda: gate.build_docs(), 3, warmup=0)
        size = sum(p.stat().st_size for p in (Path(tmp) / "site").rglob("*") if p.is_file())
        start = time.perf_counter()
        assert site.render_soon()
        handoff_ms = (time.perf_counter() - start) * 1000
        during: list[float] = []
        while site.rendering and len(during) < reps:
            t0 = time.perf_counter()
            gate.validate(0, agg, no_findings)
            during.append((time.perf_counter() - t0) * 1000)
        site.wait()
        background_s = site.last_render["elapsed_s"]
    return {
        "kept_results": kept,
        "validate_and_keep_median_ms": keep["median_ms"],
        "render_now": render,
        "render_soon_handoff_ms": round(handoff_ms, 2),
        "background_render_s": background_s,
        "validate_during_background_render_median_ms": round(statistics.median(during), 2)
        if during
        else None,
        "validate_during_background_render_calls": len(during),
        "site_bytes": size,
    }


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kpmon-quality-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.pyspark.python", sys.executable)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def aggregate_spark(sdf: Any) -> pd.DataFrame:
    """The job's side of the gate: one small aggregation over the batch's rows, collected to the driver."""
    from pyspark.sql import functions as F

    needs_type = (F.col("dir") == "resp") & (
        ((F.col("api_key") == 11) & (F.col("api_version") >= 7))
        | ((F.col("api_key") == 14) & (F.col("api_version") >= 5))
    )
    agg = sdf.groupBy("dir", "api_key", "api_version").agg(
        F.first("api_name").alias("api_name"),
        F.count(F.lit(1)).alias("frames"),
        F.sum(F.col("decode_error").isNotNull().cast("long")).alias("decode_errors"),
        F.sum((F.coalesce(needs_type, F.lit(False)) & F.col("protocol_type").isNull()).cast("long")).alias(
            "null_protocol_type"
        ),
        F.sum((F.coalesce(F.col("error_code"), F.lit(0)) != 0).cast("long")).alias("error_responses"),
    )
    frame = agg.toPandas()
    return frame.astype({"api_key": "Int64", "api_version": "Int64"})[AGG_COLUMNS]


def per_row_suite(context: Any, config: QualityConfig) -> Any:
    """The frame-level invariants written per decoded-frame row, as a naive job would validate them."""
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.expectations.row_conditions import Column

    suite = context.suites.add(gx.ExpectationSuite(name="kpmon.frames_per_row"))
    resp = Column("dir") == "resp"
    suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column="dir", value_set=["req", "resp"]))
    suite.add_expectation(
        gxe.ExpectColumnValuesToNotBeNull(
            column="protocol_type",
            row_condition=resp & (Column("api_key") == 11) & (Column("api_version") >= 7),
        )
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToNotBeNull(
            column="protocol_type",
            row_condition=resp & (Column("api_key") == 14) & (Column("api_version") >= 5),
        )
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToBeNull(column="decode_error", mostly=1 - config.max_decode_error_rate)
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToBeInSet(
            column="error_code", value_set=[0], mostly=1 - config.max_error_response_rate, row_condition=resp
        )
    )
    return suite


def bench_spark(rows: pd.DataFrame, reps: int) -> dict[str, Any]:
    import great_expectations as gx

    from streaming.quality import QualityGate
    from streaming.quality_docs import context_config

    spark = spark_session()
    try:
        sdf = spark.createDataFrame(rows).cache()
        assert sdf.count() == len(rows)
        config = QualityConfig()
        gate = QualityGate(config, None)
        no_findings = some_findings(0)
        batch = [0]

        def gate_path() -> None:
            batch[0] += 1
            assert gate.validate(batch[0], aggregate_spark(sdf), no_findings).success

        context = gx.get_context(project_config=context_config(), mode="ephemeral")
        asset = context.data_sources.add_spark("spark").add_dataframe_asset("frames")
        definition = asset.add_batch_definition_whole_dataframe("micro-batch")
        suite = per_row_suite(context, config)

        def per_row() -> None:
            result = definition.get_batch(batch_parameters={"dataframe": sdf}).validate(suite)
            assert result.success, result

        figures = interleaved(
            {
                "spark_aggregation_only": lambda: aggregate_spark(sdf),
                "gate_end_to_end": gate_path,
                "per_row_gx_on_spark": per_row,
            },
            reps,
        )
        return {
            "rows": len(rows),
            **figures,
            "per_row_expectations": len(suite.expectations),
        }
    finally:
        spark.stop()


# -- report ----------------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    from importlib.metadata import version

    return {
        **machine(),
        "great_expectations": version("great_expectations"),
        "pyspark": version("pyspark"),
        "pandas": version("pandas"),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="decoded-frame rows per batch")
    parser.add_argument("--reps", type=int, default=60, help="timed gate calls per case")
    parser.add_argument("--spark-reps", type=int, default=7, help="timed rounds per Spark-side case")
    parser.add_argument("--docs-batches", type=int, default=50, help="batches whose results are kept")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10k rows, few reps")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.reps, args.spark_reps, args.docs_batches = 10_000, 10, 2, 10

    start = time.perf_counter()
    import great_expectations  # noqa: F401

    import_s = time.perf_counter() - start
    rows = batch_rows(args.rows)
    report: dict[str, Any] = {"machine": machine_info(), "great_expectations_import_s": round(import_s, 2)}
    report["gate"] = bench_gate(rows, args.reps)
    report["data_docs"] = bench_docs(rows, args.docs_batches, args.reps)
    report["spark"] = bench_spark(rows, args.spark_reps)
    spark = report["spark"]
    naive = spark["per_row_gx_on_spark"]["median_ms"]
    report["ratios"] = {
        "per_row_over_gate_end_to_end": round(naive / spark["gate_end_to_end"]["median_ms"], 1),
        "per_row_over_gate_validate_only": round(
            naive / report["gate"]["typical_no_findings"]["median_ms"], 1
        ),
    }
    report["args"] = vars(args)

    g, d = report["gate"], report["data_docs"]
    print(f"GX import {report['great_expectations_import_s']} s; gate init {g['gate_init_ms']} ms")
    print(f"gate.validate, frames_agg of {g['agg_rows']} rows (median / p95 ms):")
    for case in ("typical_no_findings", "with_10_findings", "failing_one_expectation", "empty_batch"):
        print(f"  {case:28s} {g[case]['median_ms']:9.2f} / {g[case]['p95_ms']:.2f}")
    print(
        f"Data Docs, {d['kept_results']} kept results: build_docs {d['render_now']['median_ms']:.0f} ms; "
        f"background render {d['background_render_s']:.1f} s, hand-off {d['render_soon_handoff_ms']:.1f} ms, "
        f"validate meanwhile {d['validate_during_background_render_median_ms']} ms median; "
        f"site {d['site_bytes'] / 1e6:.1f} MB"
    )
    print(f"batch of {spark['rows']} decoded-frame rows on local[2] (median ms):")
    print(f"  Spark aggregation to frames_agg     {spark['spark_aggregation_only']['median_ms']:9.1f}")
    print(f"  gate end to end (aggregate + GX)    {spark['gate_end_to_end']['median_ms']:9.1f}")
    print(f"  per-row GX on Spark ({spark['per_row_expectations']} expectations) {naive:9.1f}")
    print(
        f"ratio per-row / gate: {report['ratios']['per_row_over_gate_end_to_end']}x end to end, "
        f"{report['ratios']['per_row_over_gate_validate_only']}x against validate() alone"
    )
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {RESULTS.relative_to(ROOT)}")
    return report


if __name__ == "__main__":
    main()
