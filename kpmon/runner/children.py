"""Subprocesses of ``kpmon run``, each in its own session so that it and everything it starts (the
Spark JVM, Python workers) form one process group: stopped as a whole, never left behind.

Own sessions also keep a terminal's Ctrl-C away from them: ``kpmon run`` alone decides the stop order.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def group_members(pgid: int) -> list[int]:
    """Pids of live (not zombie) processes in process group ``pgid``, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        # After the command: state, ppid, pgrp.
        if len(fields) > 2 and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


class Child:
    """One subprocess: the leader of its own process group."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        env: dict[str, str],
        log_path: Path,
        pipe_stdout: bool = False,
    ) -> None:
        self.name = name
        self.cmd = cmd
        self.env = env
        self.log_path = log_path
        self.pipe_stdout = pipe_stdout
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> Child:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a", encoding="utf-8") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if self.pipe_stdout else log,
                stderr=log,
                start_new_session=True,
                text=True,
                bufsize=1,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was not started"
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal_leader(self, sig: signal.Signals) -> None:
        if self.running():
            os.kill(self.pid, sig)

    def signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(
        self,
        request: Callable[[], None] | None,
        grace: float,
        hurry: Callable[[], bool] = lambda: False,
        term_grace: float = 10.0,
    ) -> int | None:
        """``request`` a graceful stop (default: SIGTERM to the leader), wait ``grace`` seconds (less if
        ``hurry()`` turns true), then SIGTERM and at last SIGKILL the whole group. Returns the leader's
        exit code (None if it never started)."""
        if self.proc is None:
            return None
        if self.running():
            try:
                (request or (lambda: self.signal_leader(signal.SIGTERM)))()
            except OSError:
                pass
            self._wait(grace, hurry)
        # The leader may be gone while its group lives on (a JVM it started): end the group too.
        for sig, wait in ((signal.SIGTERM, term_grace), (signal.SIGKILL, 10.0)):
            if not self.running() and not group_members(self.pid):
                break
            self.signal_group(sig)
            self._wait(wait, hurry if sig == signal.SIGTERM else lambda: False, whole_group=True)
        try:
            return self.proc.wait(5)
        except subprocess.TimeoutExpired:
            return None

    def _wait(self, seconds: float, hurry: Callable[[], bool], whole_group: bool = False) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not hurry():
            alive = self.running() or (whole_group and bool(group_members(self.pid)))
            if not alive:
                return
            time.sleep(0.2)

    def tail(self, lines: int = 20, path: Path | None = None) -> str:
        try:
            text = (path or self.log_path).read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])
