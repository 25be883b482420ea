"""Metric names in the docs are the names Prometheus really scrapes.

A counter ``kpmon_tap_mirror_drops`` is exposed as ``kpmon_tap_mirror_drops_total``; a query copied
from the docs with the bare name finds nothing. The names come from the real registries of the tap,
the streaming job and the alert hooks, so a renamed metric fails here too.
"""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[2]
#: A kpmon metric name as the docs write one (``kpmon_stream`` alone is the Spark main file, not a metric).
METRIC = re.compile(r"\bkpmon_(?:tap|stream|alert_hook)_[a-z0-9_]*[a-z0-9]\b(?!\.py)")
#: The suffixes Prometheus adds to a family's name for each type.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("", "_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
}


def exposed_names() -> dict[str, str]:
    """Every series name the kpmon registries expose (name -> family type)."""
    from streaming.hooks.metrics import HookMetrics
    from streaming.observe import StreamMetrics
    from tap.metrics import TapMetrics
    from tap.workers import SupervisorMetrics

    registries = [
        TapMetrics().registry,
        CollectorRegistry(),
        CollectorRegistry(),
        SupervisorMetrics().registry,
    ]
    StreamMetrics(registries[1])
    HookMetrics(registries[2])
    names: dict[str, str] = {}
    for registry in registries:
        for family in registry.collect():
            for suffix in _SUFFIXES[family.type]:
                names[family.name + suffix] = family.type
    return names


def documented_names() -> dict[str, set[str]]:
    """Metric name -> the files (docs, README, deploy) that mention it."""
    found: dict[str, set[str]] = {}
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "deploy").rglob("*"))]
    for path in files:
        if path.is_file() and path.suffix in (".md", ".yaml", ".yml", ".json"):
            for name in METRIC.findall(path.read_text(encoding="utf-8")):
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_pattern_finds_metric_names_only() -> None:
    text = "`kpmon_tap_frames_total`, deploy/spark/kpmon_stream.py, kpmon_stream and kpmon_state_server"
    assert METRIC.findall(text) == ["kpmon_tap_frames_total"]


def test_the_registries_give_counters_their_total_suffix() -> None:
    names = exposed_names()
    assert names["kpmon_tap_mirror_drops_total"] == "counter"
    assert "kpmon_tap_mirror_drops" not in names
    assert names["kpmon_stream_batch_duration_seconds"] == "histogram"
    assert names["kpmon_alert_hook_pending"] == "gauge"


def test_every_documented_metric_name_is_exposed() -> None:
    documented = documented_names()
    assert len(documented) > 20, "the docs name hardly any metric: the pattern is broken"
    exposed = exposed_names()
    wrong = {name: sorted(files) for name, files in documented.items() if name not in exposed}
    hints = {name: f"{name}_total" for name in wrong if f"{name}_total" in exposed}
    assert not wrong, f"documented metric names that are not exposed: {wrong}; counters need _total: {hints}"
