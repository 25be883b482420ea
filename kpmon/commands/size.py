"""``kpmon size``: what the monitor needs for a cluster's traffic, from the measured figures.

The computation is :mod:`kpmon.sizing`; this module reads the inputs (flags, a reference cluster or a
running tap's metrics), the figures (shipped with the package, or ``--results DIR``) and prints.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from kpconfig.model import ConfigError, load_config
from kpmon import sizing
from kpmon.figures import (
    BENCHMARKS_BEGIN,
    BENCHMARKS_END,
    Figure,
    figures_from_json,
    figures_to_json,
    headline_specs,
    pick,
    render_headlines,
)

#: The checkout this module runs from (``--refresh`` writes there).
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
SHIPPED = "sizing_figures.json"


def read_results(directory: Path) -> dict[str, dict[str, Any] | None]:
    """Every results file :data:`kpmon.sizing.FIGURES` and the benchmark headlines name, parsed (None
    where absent)."""
    found: dict[str, dict[str, Any] | None] = {}
    for name in sorted({spec.file for spec in (*sizing.FIGURES, *headline_specs())}):
        path = directory / name
        found[name] = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
    return found


def shipped_figures() -> dict[str, Figure]:
    text = resources.files("kpmon").joinpath(SHIPPED).read_text(encoding="utf-8")
    return figures_from_json(json.loads(text))


def refresh(root: Path) -> list[Path]:
    """Rewrite what is generated from ``root/benchmarks/results``: the shipped figures, the sizing block
    of docs/cluster-mode.md, the README's cost line and docs/benchmarks.md's table of current figures.
    Returns the files written."""
    results = read_results(root / "benchmarks" / "results")
    figures = sizing.extract(results)
    written = []
    shipped = root / "kpmon" / SHIPPED
    shipped.write_text(json.dumps(figures_to_json(figures), indent=1, ensure_ascii=False) + "\n")
    written.append(shipped)
    for path, begin, end, block in (
        (root / "docs" / "cluster-mode.md", sizing.DOCS_BEGIN, sizing.DOCS_END, sizing.render_docs(figures)),
        (root / "README.md", sizing.README_BEGIN, sizing.README_END, sizing.render_readme(figures)),
        (
            root / "docs" / "benchmarks.md",
            BENCHMARKS_BEGIN,
            BENCHMARKS_END,
            render_headlines(pick(headline_specs(), results)),
        ),
    ):
        text = path.read_text(encoding="utf-8")
        path.write_text(sizing.replace_block(text, begin, end, block), encoding="utf-8")
        written.append(path)
    return written


def scrape(urls: list[str], window: float) -> tuple[sizing.Traffic, float]:
    """Two scrapes of every endpoint, ``window`` seconds apart; the traffic and the seconds measured."""

    def fetch() -> list[str]:
        texts = []
        for url in urls:
            with urllib.request.urlopen(url, timeout=10) as resp:
                texts.append(resp.read().decode("utf-8"))
        return texts

    started = time.monotonic()
    before = fetch()
    time.sleep(window)
    after = fetch()
    seconds = time.monotonic() - started
    return sizing.traffic_from_metrics(before, after, seconds), seconds


def inputs_from_args(args: argparse.Namespace, queue_bytes: int) -> sizing.Inputs:
    base = sizing.EXAMPLES[args.example] if args.example else None
    if args.from_metrics:
        traffic, seconds = scrape(args.from_metrics, args.window)
        brokers = args.brokers or max(1, traffic.brokers_seen)
        # A trial that tapped some brokers only stands for the whole cluster at the same rate per broker.
        scale = brokers / max(1, traffic.brokers_seen)
        source = (
            f"measured over {seconds:.0f} s at {', '.join(args.from_metrics)}: {traffic.brokers_seen} "
            f"broker(s) seen" + (f", scaled x {sizing.num(scale)} to {brokers} brokers" if scale != 1 else "")
        )
        base = sizing.Inputs(
            brokers=brokers,
            produce_mb_s=traffic.produce_mb_s * scale,
            fetch_mb_s=traffic.fetch_mb_s * scale,
            requests_per_s=traffic.requests_per_s * scale,
            connections=round(traffic.connections * scale),
            source=source,
        )
    overrides = {
        name: getattr(args, name)
        for name in (
            "brokers",
            "produce_mb_s",
            "fetch_mb_s",
            "requests_per_s",
            "connections",
            "producers",
            "groups",
            "capture",
            "retention_hours",
            "replication_factor",
        )
        if getattr(args, name) is not None
    }
    if base is None:
        needed = ("brokers", "produce_mb_s", "fetch_mb_s", "requests_per_s", "connections")
        absent = [name for name in needed if name not in overrides]
        if absent:
            flags = ", ".join("--" + name.replace("_", "-") for name in absent)
            raise ValueError(f"give {flags}, or --example, or --from-metrics")
        base = sizing.Inputs(**overrides, source="given by hand")
    elif args.from_metrics:
        base = replace(base, **{k: v for k, v in overrides.items() if k != "brokers"})
    else:
        base = replace(base, **overrides, source=f"the {args.example} reference cluster")
    return replace(base, tap_queue_max_bytes=queue_bytes)


def run(args: argparse.Namespace) -> int:
    if args.refresh:
        if not (RESULTS.is_dir() and (ROOT / "docs").is_dir()):
            print("error: --refresh runs in a checkout (benchmarks/results, docs/)", file=sys.stderr)
            return 2
        for path in refresh(ROOT):
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        figures = sizing.extract(read_results(Path(args.results))) if args.results else shipped_figures()
        if args.capture is None:
            args.capture = config.tap.capture
        inputs = inputs_from_args(args, config.tap.queue_max_bytes)
        est = sizing.estimate(inputs, figures)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(est.to_json(), indent=1, ensure_ascii=False))
    elif args.markdown:
        sys.stdout.write(sizing.render_markdown(est))
    else:
        sys.stdout.write(sizing.render_text(est))
    return 0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "size",
        help="what the monitor needs (cores, memory, disk) for a cluster's traffic",
        description=(
            "Estimate, per part, what the monitor needs for a cluster's traffic: tap cores and memory per "
            "broker, tap-topic partitions, bytes/day and retention disk, executor cores and memory, state "
            "size, p95 alert latency, and the monitor's CPU next to the brokers'. Every number names the "
            "benchmark figure it comes from (benchmarks/results, file and key) and the CPU it was measured "
            "on; a figure not measured yet is said to be missing, never filled in. Traffic figures are "
            "cluster totals."
        ),
        epilog=(
            "examples:\n"
            "  kpmon size --brokers 3 --produce-mb-s 20 --fetch-mb-s 40 --requests-per-s 5000 "
            "--connections 300 --producers 1000 --groups 50\n"
            "  kpmon size --example large --json\n"
            "  kpmon size --from-metrics http://tap-0:9464/metrics --window 120 --brokers 12\n"
            "  kpmon size --refresh    # in a checkout, after a benchmark wrote benchmarks/results"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    given = parser.add_argument_group("the cluster's traffic (totals over all brokers)")
    given.add_argument("--brokers", type=int, help="brokers (one tap each)")
    given.add_argument("--produce-mb-s", type=float, help="client produce traffic, MB/s")
    given.add_argument("--fetch-mb-s", type=float, help="client fetch traffic (every consumer group), MB/s")
    given.add_argument("--requests-per-s", type=float, help="client requests/s (each is 2 wire frames)")
    given.add_argument("--connections", type=int, help="open client connections")
    given.add_argument("--producers", type=int, help="producer ids alive within checks.producer_ttl_seconds")
    given.add_argument("--groups", type=int, help="consumer groups alive within checks.group_ttl_seconds")
    given.add_argument(
        "--capture", choices=sizing.CAPTURES, help="the tap's capture policy (default: the config's)"
    )
    given.add_argument("--retention-hours", type=float, help="tap-topic retention (default 48)")
    given.add_argument("--replication-factor", type=int, help="tap-topic replication factor (default 3)")
    given.add_argument(
        "--example", choices=sorted(sizing.EXAMPLES), help="a reference cluster (flags above override it)"
    )
    given.add_argument(
        "--from-metrics",
        nargs="+",
        metavar="URL",
        help="measure the traffic from running taps' Prometheus endpoints, scraped twice --window apart; "
        "--brokers scales a trial's taps up to the whole cluster",
    )
    given.add_argument("--window", type=float, default=60.0, help="seconds between the scrapes (60)")
    parser.add_argument(
        "--results",
        metavar="DIR",
        help="read the figures from this results directory instead of the ones shipped with kpmon",
    )
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON, for automation")
    out.add_argument("--markdown", action="store_true", help="print a Markdown table, for docs")
    out.add_argument(
        "--refresh",
        action="store_true",
        help="in a checkout: regenerate kpmon/sizing_figures.json, docs/cluster-mode.md's sizing block "
        "the README's cost line and docs/benchmarks.md's figures from benchmarks/results",
    )
    parser.set_defaults(func=run)
