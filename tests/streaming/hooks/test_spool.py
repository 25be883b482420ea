from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from streaming.hooks.core import DELIVERED, PENDING, SpoolOp
from streaming.hooks.spool import Spool, SpoolLock, SpoolLockedError


def _put(key: str, n: int = 0) -> SpoolOp:
    return SpoolOp(PENDING, key, {"alert": {"id": key}, "created_ns": n})


def test_round_trip_keeps_order_and_deletes(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "h.jsonl")
    assert spool.open() == {}
    spool.write([_put("b"), _put("a"), SpoolOp(DELIVERED, "x|firing", {"rank": 1})])
    spool.write([SpoolOp(PENDING, "b", None), _put("c"), _put("a", 5)])
    spool.close()
    again = Spool(tmp_path / "h.jsonl").open()
    assert list(again[PENDING]) == ["a", "c"]
    assert again[PENDING]["a"]["created_ns"] == 5
    assert again[DELIVERED] == {"x|firing": {"rank": 1}}


def test_torn_and_corrupt_lines_are_skipped_and_cleaned(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    spool = Spool(path)
    spool.open()
    spool.write([_put("a"), _put("b")])
    spool.close()
    with open(path, "a") as journal:
        journal.write('["not", "an", "entry"]\n{"ns": "pending", "key": "c", "val')  # torn by kill -9
    reopened = Spool(path)
    contents = reopened.open()
    assert list(contents[PENDING]) == ["a", "b"] and reopened.bad_lines == 2
    reopened.write([_put("d")])  # the torn line must not swallow the next append
    reopened.close()
    assert list(Spool(path).open()[PENDING]) == ["a", "b", "d"]
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_compaction_bounds_the_file(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    spool = Spool(path)
    spool.open()
    for n in range(1200):
        spool.write([_put(f"k{n}"), SpoolOp(PENDING, f"k{n}", None)])
    spool.write([_put("last")])
    spool.close()
    assert len(path.read_text().splitlines()) < 1100
    assert list(Spool(path).open()[PENDING]) == ["last"]


def test_one_owner_per_directory(tmp_path: Path) -> None:
    lock = SpoolLock(tmp_path)
    # The refusal names the holder: this process.
    with pytest.raises(SpoolLockedError, match=rf"in use by another process \(pid {os.getpid()} on "):
        SpoolLock(tmp_path)
    lock.release()
    SpoolLock(tmp_path).release()


def test_a_lock_waits_for_its_holder_to_let_go(tmp_path: Path) -> None:
    """A driver replacing a killed one waits for the old process to exit rather than refusing."""
    held = SpoolLock(tmp_path)
    threading.Timer(0.3, held.release).start()
    with pytest.raises(SpoolLockedError):
        SpoolLock(tmp_path, wait_seconds=0.0)
    taken = SpoolLock(tmp_path, wait_seconds=30.0)
    taken.release()


def test_a_lock_left_to_a_forked_child_of_an_exited_holder_is_taken_over(tmp_path: Path) -> None:
    """A driver that forked, then exited: its child keeps the open lock file (flock belongs to it, not to
    a pid), so the lock stays held by no spool writer. The next driver takes it over at once."""
    import subprocess
    import sys
    import time

    script = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from streaming.hooks.spool import SpoolLock\n"
        "lock = SpoolLock(Path(sys.argv[1]))\n"
        "if os.fork() == 0:\n"
        "    os.close(1)\n"  # so the run below sees its output end when the parent exits
        "    os.close(2)\n"
        "    time.sleep(60)\n"  # the child keeps the locked file open
        "    os._exit(0)\n"
        "print(os.getpid(), flush=True)\n"
        "os._exit(0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60, check=True
    )
    holder = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(holder, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    # Still held (by the forked child, for a minute), but the holder is gone: taken over, not waited for.
    taken = SpoolLock(tmp_path, wait_seconds=30.0)
    assert f"pid {os.getpid()} " in (tmp_path / "lock").read_text()
    taken.release()
    # A live holder is still waited for, then refused: only a gone one is taken over.
    held = SpoolLock(tmp_path)
    with pytest.raises(SpoolLockedError):
        SpoolLock(tmp_path, wait_seconds=0.0)
    held.release()


def test_a_holder_that_outlived_the_process_it_ran_under_is_ended_and_the_lock_taken(tmp_path: Path) -> None:
    """A driver whose JVM its cluster killed should exit (``streaming.orphan``); one that is stuck instead
    holds the spool from the driver that replaces it. The waiter ends it once its JVM is gone, and a
    holder whose JVM still runs is waited for, never ended."""
    import signal
    import subprocess
    import sys

    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from streaming.hooks.spool import SpoolLock\n"
        "lock = SpoolLock(Path(sys.argv[1]), parent_pid=int(sys.argv[2]))\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n"
    )
    jvm = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path), str(jvm.pid)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert f"under {jvm.pid}" in (tmp_path / "lock").read_text()
        # Its JVM runs: the holder is waited for, then the waiter is refused; nothing is ended.
        with pytest.raises(SpoolLockedError):
            SpoolLock(tmp_path, wait_seconds=0.5)
        assert holder.poll() is None
        jvm.kill()
        jvm.wait()
        taken = SpoolLock(tmp_path, wait_seconds=60.0)
        assert holder.wait(10) == -signal.SIGKILL
        assert f"pid {os.getpid()} " in (tmp_path / "lock").read_text()
        taken.release()
    finally:
        for process in (jvm, holder):
            if process.poll() is None:
                process.kill()
                process.wait()
