"""What every benchmark's results file starts with, and writing it (``benchmarks/results/*.json``)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any


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


def machine() -> dict[str, Any]:
    """The machine a benchmark ran on, and its load average (1, 5, 15 min) as the run starts."""
    return {
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_before": os.getloadavg(),
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
