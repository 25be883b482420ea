"""What ``kpmon run`` started, kept on disk, and a watchdog that stops it when ``kpmon run`` dies.

``kpmon run`` stops its parts itself on every signal it can catch. SIGKILL (``kill -9``, the OOM
killer) it cannot catch, and its children live in sessions of their own (so a terminal's Ctrl-C does
not reach them before ``kpmon run`` decides the order), so nothing else would stop them.

- :class:`RunRegistry` (``<state_dir>/run/processes.json``) lists, in start order, every process group
  the run started (leader pid and its start time, so a reused pid is never mistaken for it), the
  local stack's home, and whether the run stopped cleanly.
- The watchdog (``python -m kpmon.runner.watchdog REGISTRY``) is started first, in its own session,
  reading a pipe whose only writer is ``kpmon run``. When ``kpmon run`` ends for any reason the kernel
  closes that pipe; if the registry does not say the run stopped, the watchdog stops what is listed,
  newest first (stream job, tap), then the local stack.
- The next ``kpmon run`` on the same state directory does the same for anything still left (a
  watchdog killed too), before it starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kpconfig.proc import proc_stat
from kpmon.runner.children import group_members

RUNNING = "running"
STOPPED = "stopped"


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22); None if it is gone
    or a zombie. With the pid it identifies one process: pids are reused, start times are not."""
    fields = proc_stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def same_process(pid: int, started: int | None) -> bool:
    return started is not None and start_time(pid) == started


class RunRegistry:
    """``processes.json``: the run's owner, its process groups in start order, its local stack."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _write(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.path)

    def begin(self) -> None:
        pid = os.getpid()
        self._write({"owner": {"pid": pid, "start": start_time(pid)}, "state": RUNNING, "groups": []})

    def add_group(self, name: str, pid: int) -> None:
        data = self.read() or {"groups": []}
        data["groups"].append({"name": name, "pid": pid, "start": start_time(pid)})
        self._write(data)

    def set_stack(self, home: Path) -> None:
        """The local stack in ``home`` is this run's to stop (not set with ``--keep-stack``)."""
        data = self.read() or {"groups": []}
        data["stack_home"] = str(home)
        self._write(data)

    def finish(self) -> None:
        data = self.read() or {"groups": []}
        data["state"] = STOPPED
        self._write(data)

    def live_owner(self) -> int | None:
        """The pid of the ``kpmon run`` that owns this registry, if it is still running (and not us)."""
        data = self.read()
        if not data or data.get("state") != RUNNING:
            return None
        owner = data.get("owner") or {}
        pid = int(owner.get("pid") or 0)
        if pid and pid != os.getpid() and same_process(pid, owner.get("start")):
            return pid
        return None

    def leftovers(self) -> list[dict[str, Any]]:
        """Groups of a run that did not stop cleanly and still have live members, newest first."""
        data = self.read()
        if not data or data.get("state") != RUNNING:
            return []
        return [g for g in reversed(data.get("groups", [])) if _group_alive(g)]


def _members(group: dict[str, Any]) -> list[int]:
    """Live members of a recorded group that are not younger than... the group's leader: a process group
    id is the leader's pid, so only processes started after the leader can belong to the recorded one."""
    pid, started = int(group["pid"]), group.get("start")
    members = group_members(pid)
    if started is None:
        return []
    return [m for m in members if (start_time(m) or 0) >= started]


def _group_alive(group: dict[str, Any]) -> bool:
    return bool(_members(group))


def stop_group(group: dict[str, Any], grace: float, say: Callable[[str], None]) -> None:
    """SIGTERM the recorded group (its leader stops gracefully: the job after its running batch, the
    tap after flushing its mirror), wait up to ``grace`` s, then SIGKILL what is left."""
    name, pid = group["name"], int(group["pid"])
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        members = _members(group)
        if not members:
            return
        say(f"{name} (process group {pid}, {len(members)} process(es)): {sig.name}")
        for member in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(member, sig)
        deadline = time.monotonic() + wait
        while _members(group) and time.monotonic() < deadline:
            time.sleep(0.2)


def clean_up(registry: RunRegistry, say: Callable[[str], None], grace: float = 60.0) -> bool:
    """Stop what a run that did not stop cleanly left: its groups newest first, then its local stack.
    Returns whether there was anything to do."""
    data = registry.read()
    if not data or data.get("state") != RUNNING:
        return False
    for group in registry.leftovers():
        stop_group(group, grace, say)
    home = data.get("stack_home")
    if home:
        from deploy.local.stack import LocalStack, StackError

        try:
            stack = LocalStack.open(Path(home))
            if stack.is_running():
                say(f"Kafka: stopping the local stack in {home}")
                stack.down()
        except StackError as exc:
            say(f"Kafka: cannot stop the local stack in {home}: {exc}")
    registry.finish()
    return True


class Watchdog:
    """The watchdog process, from ``kpmon run``'s side: start it, and tell it the run stopped cleanly."""

    def __init__(self, registry: RunRegistry, log_path: Path) -> None:
        self.registry = registry
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._write_end: int | None = None

    def start(self) -> Watchdog:
        read_end, write_end = os.pipe()  # not inheritable (PEP 446): no other child holds the write end
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.log_path.open("ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "kpmon.runner.watchdog", str(self.registry.path)],
                    stdin=read_end,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
        finally:
            os.close(read_end)
        self._write_end = write_end
        return self

    def close(self, timeout: float = 5.0) -> None:
        """The run is over: let the watchdog go. It exits at once when the registry says the run stopped;
        otherwise (the stop itself failed) it stops what is left, on its own: it is not waited for."""
        if self._write_end is not None:
            os.close(self._write_end)
            self._write_end = None
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    registry = RunRegistry(Path(args[0]))
    # The terminal's signals are for kpmon run, which decides the stop order; this process only acts
    # when kpmon run is gone.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    stdin = sys.stdin.buffer
    while stdin.read(4096):
        pass

    def say(message: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} kpmon run watchdog: {message}", flush=True)

    data = registry.read() or {}
    if data.get("state") == RUNNING:
        owner = (data.get("owner") or {}).get("pid")
        say(f"kpmon run (pid {owner}) ended without stopping what it started: stopping it now")
        clean_up(registry, say)
        say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
