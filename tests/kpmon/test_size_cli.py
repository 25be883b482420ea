"""``kpmon size``: the CLI adapter over :mod:`kpmon.sizing` (inputs, figures, output formats, refresh)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kpmon import sizing
from kpmon.cli import main
from kpmon.commands.size import refresh, shipped_figures
from kpmon.figures import figures_from_json
from tests.kpmon.test_sizing import COST_BENCH, RESULTS, ROOT
from tests.tap.harness import free_port


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["size", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_output_is_the_estimate_from_the_shipped_figures(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "--example", "large")
    want = sizing.estimate(sizing.EXAMPLES["large"], shipped_figures()).to_json()
    assert out["lines"] == json.loads(json.dumps(want["lines"]))
    assert out["inputs"]["brokers"] == 30
    assert any("kpmon_tap_mirror_queue_depth" in w for w in out["watch"])


def test_hand_inputs_and_flags_over_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(
        capsys,
        *("--brokers", "3", "--produce-mb-s", "20", "--fetch-mb-s", "40", "--requests-per-s", "5000"),
        *("--connections", "300", "--capture", "full", "--retention-hours", "24"),
    )
    inputs = out["inputs"]
    assert (inputs["brokers"], inputs["capture"], inputs["retention_hours"]) == (3, "full", 24.0)
    assert inputs["producers"] is None and inputs["source"] == "given by hand"
    assert any("--producers" in w for w in out["warnings"])
    over = run_json(capsys, "--example", "small", "--brokers", "6")
    assert over["inputs"]["brokers"] == 6 and over["inputs"]["produce_mb_s"] == 20.0


def test_missing_hand_inputs_name_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["size", "--brokers", "3"]) == 1
    err = capsys.readouterr().err
    assert "--produce-mb-s" in err and "--connections" in err and "--brokers" not in err


def test_table_and_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["size", "--example", "small"]) == 0
    text = capsys.readouterr().out
    # The host the shipped figure was measured on, as its results file names it (it moves between runs).
    host = json.loads((RESULTS / "stream_bench.json").read_text())["machine"]["cpu_model"]
    assert "[executors]" in text
    assert f"from: stream_bench.json job.cpu_us_per_wire_frame ({host})" in text
    assert main(["size", "--example", "small", "--markdown"]) == 0
    md = capsys.readouterr().out
    assert "| part | quantity | estimate | how | source (file key, host) |" in md


def test_results_directory_with_a_cost_bench(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    (results / "cost_bench.json").write_text(json.dumps(COST_BENCH))
    out = run_json(capsys, "--example", "small", "--results", str(results))
    share = next(line for line in out["lines"] if line.get("what") == "monitor CPU / broker CPU, frame-heavy")
    r = COST_BENCH["ratios"]
    assert share["value"] == pytest.approx(
        r["tap_over_broker"] + r["job_over_broker"] + r["broker_mirroring_over_direct"] - 1
    )


def test_from_metrics_reads_a_real_tap_metrics_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    from codec.protocol import ApiKey
    from tap.metrics import TapMetrics

    metrics = TapMetrics()
    listener = metrics.listener(1, "plain")
    listener.frame("req", int(ApiKey.PRODUCE), 9, 1_000)
    listener.connections.set(5)
    port = free_port()
    metrics.serve(port)
    url = f"http://127.0.0.1:{port}/metrics"
    out = run_json(capsys, "--from-metrics", url, "--window", "0.05", "--brokers", "4", "--groups", "7")
    inputs = out["inputs"]
    # One broker seen, scaled to four: the open connections (a gauge) scale with it.
    assert inputs["brokers"] == 4 and inputs["connections"] == 20 and inputs["groups"] == 7
    assert url in inputs["source"] and "1 broker(s) seen" in inputs["source"]


def test_refresh_writes_the_figures_the_docs_and_the_readme(tmp_path: Path) -> None:
    (tmp_path / "benchmarks").mkdir()
    shutil.copytree(RESULTS, tmp_path / "benchmarks" / "results")
    (tmp_path / "benchmarks" / "results" / "cost_bench.json").write_text(json.dumps(COST_BENCH))
    (tmp_path / "docs").mkdir()
    (tmp_path / "kpmon").mkdir()
    shutil.copy(ROOT / "docs" / "cluster-mode.md", tmp_path / "docs")
    shutil.copy(ROOT / "docs" / "benchmarks.md", tmp_path / "docs")
    shutil.copy(ROOT / "README.md", tmp_path)
    written = refresh(tmp_path)
    assert {p.name for p in written} == {
        "sizing_figures.json",
        "cluster-mode.md",
        "README.md",
        "benchmarks.md",
    }
    figures = figures_from_json(json.loads((tmp_path / "kpmon" / "sizing_figures.json").read_text()))
    assert figures["cost.tap_over_broker"].value == COST_BENCH["ratios"]["tap_over_broker"]
    docs = (tmp_path / "docs" / "cluster-mode.md").read_text()
    assert "x the broker's own on a frame-heavy workload" in docs
    assert docs.count(sizing.DOCS_BEGIN) == 1
    table = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "| tap CPU per frame over the broker's | 0.300x |" in table
    share = sizing.num(0.3 + 0.25 + (1.08 - 1))
    assert f"brokers' is {share}x theirs per frame" in (tmp_path / "README.md").read_text()
