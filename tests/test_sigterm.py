"""tests/conftest.py: a run stopped by SIGTERM tears its session fixtures down (the local stack's brokers
run in process groups of their own and would outlive it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HELD = """
import pathlib, time
import pytest

OUT = pathlib.Path(__file__).parent


@pytest.fixture(scope="session")
def held():
    try:
        yield
    finally:
        (OUT / "torn-down").write_text("yes")


def test_held(held):
    (OUT / "started").write_text("yes")
    time.sleep(60)
"""


def test_a_run_stopped_by_sigterm_tears_its_session_fixtures_down(tmp_path: Path) -> None:
    (tmp_path / "test_held.py").write_text(HELD)
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.conftest",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            assert run.poll() is None and time.monotonic() < deadline, "the held test never started"
            time.sleep(0.1)
        run.terminate()
        output = run.communicate(timeout=60)[0].decode()
    finally:
        run.kill()
    assert run.returncode == 2, output  # interrupted: the run still fails
    assert (tmp_path / "torn-down").read_text() == "yes", output
