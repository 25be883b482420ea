"""``kpmon run`` cleans up whatever happens to it: its watchdog, the next run, and a dead output.

These use cheap process trees shaped like a run's (a leader per group with a grandchild, as ``kpmon
stream`` starts a JVM); tests/kpmon/test_run.py has the same cases with the real stack.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kpconfig.model import load_config
from kpmon.runner.children import Child, group_members
from kpmon.runner.watchdog import RUNNING, STOPPED, RunRegistry, clean_up, start_time

REPO = Path(__file__).resolve().parents[2]


def _wait_until(check: object, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


#: A stand-in for ``kpmon run``: registry, watchdog, two process groups (each a leader and a grandchild
#: that outlives a leader killed alone), then it waits to be killed.
FAKE_RUN = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from kpmon.runner.children import Child
    from kpmon.runner.watchdog import RunRegistry, Watchdog

    root = Path(sys.argv[1])
    registry = RunRegistry(root / "processes.json")
    registry.begin()
    watchdog = Watchdog(registry, root / "watchdog.log").start()
    for name in ("tap", "stream"):
        child = Child(name, ["sh", "-c", "sleep 300 & wait"], dict(os.environ), root / f"{name}.log").start()
        registry.add_group(name, child.pid)
    print("ready", watchdog.proc.pid, flush=True)
    time.sleep(300)
    """
)


def _groups(root: Path) -> list[int]:
    data = json.loads((root / "processes.json").read_text())
    return [int(g["pid"]) for g in data["groups"]]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_a_killed_run_is_cleaned_up_by_its_watchdog(tmp_path: Path) -> None:
    run = subprocess.Popen(
        [sys.executable, "-c", FAKE_RUN, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
        start_new_session=True,
    )
    try:
        assert run.stdout is not None
        ready, watchdog_pid = run.stdout.readline().split()
        assert ready == "ready"
        groups = _groups(tmp_path)
        assert len(groups) == 2
        assert _wait_until(lambda: all(len(group_members(g)) == 2 for g in groups))
        run.send_signal(signal.SIGKILL)  # nothing of kpmon run's own runs after this
        run.wait(10)
        assert _wait_until(lambda: not any(group_members(g) for g in groups)), [
            group_members(g) for g in groups
        ]
        assert _wait_until(lambda: start_time(int(watchdog_pid)) is None)  # the watchdog is done too
    finally:
        if run.poll() is None:
            run.kill()
        for pid in _groups(tmp_path):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    registry = RunRegistry(tmp_path / "processes.json")
    assert (registry.read() or {})["state"] == STOPPED
    log = (tmp_path / "watchdog.log").read_text()
    assert f"kpmon run (pid {run.pid}) ended without stopping what it started" in log
    assert "stream (process group" in log and "tap (process group" in log
    assert log.index("stream (process group") < log.index("tap (process group")  # newest first


def test_a_clean_stop_lets_the_watchdog_go_without_touching_anything(tmp_path: Path) -> None:
    from kpmon.runner.watchdog import Watchdog

    registry = RunRegistry(tmp_path / "processes.json")
    registry.begin()
    watchdog = Watchdog(registry, tmp_path / "watchdog.log").start()
    child = Child("tap", ["sleep", "300"], dict(os.environ), tmp_path / "tap.log").start()
    registry.add_group("tap", child.pid)
    try:
        registry.finish()  # what kpmon run does once it stopped everything itself
        watchdog.close()
        assert watchdog.proc is not None and watchdog.proc.returncode == 0
        assert child.running()  # stopped runs are none of the watchdog's business
    finally:
        child.stop(None, grace=5)
    assert "stopping" not in (tmp_path / "watchdog.log").read_text()


def test_the_next_run_stops_what_a_killed_run_and_its_watchdog_left(tmp_path: Path) -> None:
    registry = RunRegistry(tmp_path / "processes.json")
    owner = subprocess.Popen(["sleep", "300"])
    children = [
        Child(name, ["sh", "-c", "sleep 300 & wait"], dict(os.environ), tmp_path / f"{name}.log").start()
        for name in ("tap", "stream")
    ]
    try:
        registry._write(
            {
                "owner": {"pid": owner.pid, "start": start_time(owner.pid)},
                "state": RUNNING,
                "groups": [{"name": c.name, "pid": c.pid, "start": start_time(c.pid)} for c in children],
            }
        )
        assert registry.live_owner() == owner.pid  # that run is alive: a second one must not start
        owner.kill()
        owner.wait()
        assert registry.live_owner() is None
        assert _wait_until(lambda: all(len(group_members(c.pid)) == 2 for c in children))
        assert [g["name"] for g in registry.leftovers()] == ["stream", "tap"]
        said: list[str] = []
        assert clean_up(registry, said.append, grace=10)
        assert not any(group_members(c.pid) for c in children)
        assert registry.leftovers() == [] and (registry.read() or {})["state"] == STOPPED
        assert not clean_up(registry, said.append)  # nothing left to do
    finally:
        owner.kill()
        for child in children:
            child.stop(None, grace=1)


def test_a_reused_pid_is_never_taken_for_a_recorded_process(tmp_path: Path) -> None:
    child = Child("tap", ["sleep", "300"], dict(os.environ), tmp_path / "tap.log").start()
    registry = RunRegistry(tmp_path / "processes.json")
    try:
        started = start_time(child.pid)
        assert started is not None
        # Recorded with a later start time: the live process with that pid is someone else's.
        registry._write(
            {
                "owner": {"pid": 1, "start": 0},
                "state": RUNNING,
                "groups": [{"name": "tap", "pid": child.pid, "start": started + 10_000}],
            }
        )
        assert registry.leftovers() == []
        clean_up(registry, lambda _m: None, grace=1)
        assert child.running()
    finally:
        child.stop(None, grace=5)


# ----- output that goes away ----------------------------------------------------------------------------


def test_say_survives_a_closed_pipe_and_keeps_the_run_log(tmp_path: Path) -> None:
    from kpmon.runner.orchestrator import Orchestrator, RunOptions

    read_end, write_end = os.pipe()
    out = os.fdopen(write_end, "w")
    run = Orchestrator(load_config(None, {}), RunOptions(tmp_path, embedded=True), out=out)
    run.layout.root.mkdir(parents=True)
    run._run_log = run.layout.run_log.open("a", encoding="utf-8")
    run.say("before")
    os.close(read_end)  # `tee` died with the Ctrl-C
    run.say("stopping: demo traffic, streaming monitor, tap, Kafka")  # EPIPE: must not raise
    run.say("Kafka stopped")
    assert run._out_broken
    log = run.layout.run_log.read_text()
    assert "before" in log and "stopping: demo traffic" in log and "Kafka stopped" in log
    out.close()  # the descriptor now points at /dev/null: closing (flushing) it cannot fail


def test_a_second_run_on_the_same_state_dir_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kpmon.runner.orchestrator import Orchestrator, RunOptions

    owner = subprocess.Popen(["sleep", "300"])
    try:
        run = Orchestrator(load_config(None, {}), RunOptions(tmp_path, embedded=True))
        run.registry._write(
            {"owner": {"pid": owner.pid, "start": start_time(owner.pid)}, "state": RUNNING, "groups": []}
        )
        assert run.run() == 1
        assert f"another kpmon run (pid {owner.pid}) is using" in capsys.readouterr().err
        assert (run.registry.read() or {})["state"] == RUNNING  # the other run's record is untouched
    finally:
        owner.kill()
        owner.wait()
