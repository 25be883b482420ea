"""What every benchmark's results file starts with, and writing it (``benchmarks/results/*.json``)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from codec import native


def cpu_model() -> str | None:
    """The CPU as ``/proc/cpuinfo`` names it: model name, family and model numbers, clock and cache
    (None where there is none). A virtual machine may only say "AMD EPYC", and runs on different
    dates have landed on different hosts behind the same "2 cores" (a full codec decode took 2.6 µs on one and 4.5-8.9 on
    another), so a figure is only comparable with figures from the same CPU."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    first = text.split("\n\n", 1)[0]
    fields = dict(
        (key.strip(), value.strip()) for key, _, value in (line.partition(":") for line in first.splitlines())
    )
    name = fields.get("model name")
    if name is None:
        return None
    details = [
        f"family {fields.get('cpu family', '?')} model {fields.get('model', '?')}",
        f"{float(fields['cpu MHz']):.0f} MHz" if "cpu MHz" in fields else None,
        f"cache {fields['cache size']}" if "cache size" in fields else None,
    ]
    return f"{name} ({', '.join(d for d in details if d)})"


def compiled_cores() -> dict[str, Any]:
    """Whether a process started now runs the compiled per-frame cores (``codec.native``), and if not,
    why: a figure of plain Python is not one of the compiled build."""
    refused, _ = native.refusal()
    return {"used": refused is None, "why": refused or "compiled"}


def cores_changed(at_start: dict[str, Any]) -> str | None:
    """Why figures measured since ``at_start`` (``compiled_cores()`` then) are not all the compiled
    build's, when the cores were usable then and are not now: a source edited during the run makes
    every process started after it (Spark's Python workers, a tap) run plain Python, with only a
    warning in its own log. None when nothing changed."""
    if not at_start.get("used"):
        return None
    now = compiled_cores()
    if now["used"]:
        return None
    return (
        f"the compiled cores went out of use during the run ({now['why']}): processes started after "
        "that ran plain Python, so these figures are not the compiled build's; run kpmon deploy native "
        "(make native), leave the sources alone, and run again"
    )


def machine() -> dict[str, Any]:
    """The machine a benchmark ran on, its load average (1, 5, 15 min) as the run starts, and whether
    it runs the compiled cores."""
    return {
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_before": os.getloadavg(),
        "compiled_cores": compiled_cores(),
    }


def header(benchmark: str) -> dict[str, Any]:
    """The benchmark's name, when it ran (UTC) and the machine it ran on."""
    return {
        "benchmark": benchmark,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
    }


def write(path: Path, record: dict[str, Any], root: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path.relative_to(root)}")
