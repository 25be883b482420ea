"""What every benchmark's results file starts with, and writing it (``benchmarks/results/*.json``)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any


def cpu_model() -> str | None:
    """The CPU's model name from ``/proc/cpuinfo`` (None where there is none). Sessions have run on
    different hosts behind the same "2 cores" (a full codec decode took 2.6 µs on one and 4.5-8.9 on
    another), so a figure is only comparable with figures from the same model."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


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
