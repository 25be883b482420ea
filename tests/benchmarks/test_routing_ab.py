"""benchmarks/routing_ab.py runs both checkouts on their compiled cores and prints its ratio."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from codec import native

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not native.status()[0], reason="the compiled build is not in use")
def test_a_quick_run_compares_a_checkout_with_itself() -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/routing_ab.py", "--before", ".", "--after", ".", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "round 1 before" in done.stdout and "round 1 after" in done.stdout
    assert "after / before: routing" in done.stdout
