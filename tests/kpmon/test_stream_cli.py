"""`kpmon stream stop` and `status` against a job's pid file, without Spark."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kpconfig.model import load_config
from kpmon.commands import stream
from streaming.paths import StreamPaths


def test_stop_counts_an_exited_job_its_parent_has_not_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job that exited is stopped even while it lingers as a zombie (its parent, here this test, like
    a supervisor or a test harness, has not reaped it yet): `stop` must not wait for its timeout."""
    monkeypatch.setenv("KPMON__STATE_DIR", str(tmp_path / "state"))
    paths = StreamPaths.of(load_config(None))
    paths.make()
    job = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 60
    while Path(f"/proc/{job.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.05)
    paths.pid_file.write_text(f"{job.pid}\n")
    try:
        code = stream.stop(argparse.Namespace(timeout=5.0))
    finally:
        job.wait()
    assert code == 0, capsys.readouterr().err
    assert f"job {job.pid} stopped" in capsys.readouterr().out
    assert paths.stop_marker.exists()


def test_stop_without_a_recorded_job_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KPMON__STATE_DIR", str(tmp_path / "state"))
    assert stream.stop(argparse.Namespace(timeout=1.0)) == 1
    assert "no running job recorded" in capsys.readouterr().err
