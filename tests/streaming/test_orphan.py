"""A driver spark-submit's JVM started exits when that JVM dies (real processes, no Spark needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from streaming.orphan import GATEWAY_ENV, ORPHANED_EXIT, exit_with_the_jvm

ROOT = Path(__file__).resolve().parents[2]

#: The driver: watches its parent as the job does, records the status it exits with, then waits.
DRIVER = textwrap.dedent(
    """
    import logging, os, sys, time
    from streaming.orphan import exit_with_the_jvm

    def leave(code):
        with open(sys.argv[1], "w") as out:
            out.write(str(code))
        os._exit(code)

    logging.basicConfig(stream=sys.stderr)
    exit_with_the_jvm(poll_seconds=0.05, exit=leave)
    if sys.argv[2] == "stuck":
        # As a thread blocked writing to the dead JVM's pipe does: it holds the log handler's lock.
        logging.getLogger().handlers[0].acquire()
    print("watching", flush=True)
    time.sleep(120)
    """
)
#: The JVM's stand-in as the parent: starts the driver with spark-submit's variable, says its pid.
PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    env = dict(os.environ, PYSPARK_GATEWAY_PORT="1")
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "watching"
    print(child.pid, flush=True)
    time.sleep(120)
    """
)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in state


@pytest.mark.parametrize("logging_state", ["free", "stuck"])
def test_an_orphaned_driver_exits(tmp_path: Path, logging_state: str) -> None:
    """Also when its log line cannot be written: the exit is what lets the next driver start."""
    status = tmp_path / "status"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, DRIVER, str(status), logging_state],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    driver = int(parent.stdout.readline())
    try:
        assert not _gone(driver) and not status.exists()
        parent.send_signal(signal.SIGKILL)  # as a cluster kills the driver's JVM
        parent.wait(10)
        deadline = time.monotonic() + 30
        while not _gone(driver) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(driver)
        assert status.read_text() == str(ORPHANED_EXIT)
    finally:
        if not _gone(driver):
            os.kill(driver, signal.SIGKILL)


def test_a_driver_not_started_by_spark_submit_watches_nothing() -> None:
    """``python -m streaming`` starts its own JVM as its child: its parent is a shell or kpmon."""
    assert exit_with_the_jvm(environ={}) is None


def test_a_driver_with_its_jvm_alive_keeps_running() -> None:
    exits: list[int] = []
    watcher = exit_with_the_jvm(environ={GATEWAY_ENV: "1"}, poll_seconds=0.01, exit=exits.append)
    assert watcher is not None and watcher.daemon
    time.sleep(0.1)
    assert watcher.is_alive() and exits == []
