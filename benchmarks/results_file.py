"""What every benchmark's results file starts with, and writing it (``benchmarks/results/*.json``)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any


def header(benchmark: str) -> dict[str, Any]:
    """The benchmark's name, when it ran (UTC) and the machine it ran on."""
    return {
        "benchmark": benchmark,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
    }


def write(path: Path, record: dict[str, Any], root: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path.relative_to(root)}")
