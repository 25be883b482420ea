"""A hook's spool: pending deliveries (and what was delivered) on disk, so a restarted process re-sends them.

The file is an append-only JSON Lines journal of puts and deletes on namespaced keys. Appends that
put into a *durable* namespace (pending deliveries) are fsynced, once per call (per publish, not per
alert); the rest (a delivery done, a delivered id remembered) are only flushed to the OS: losing them in a
power cut means a re-send, which at-least-once allows, and skipping the fsync keeps the hook's lock short
when a receiver acknowledges quickly. When the
journal is mostly dead entries it is rewritten atomically; it is also rewritten on open, which drops
a line torn by a crash (``kill -9`` mid-write) instead of letting the next append glue onto it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from kpconfig.proc import proc_stat
from streaming.hooks.core import SpoolOp

log = logging.getLogger("kpmon.alerts.hooks")

Contents = dict[str, dict[str, dict[str, Any]]]

#: Rewrite the journal once it holds this many lines and more than ``_DEAD_RATIO`` per live entry.
_COMPACT_MIN_LINES = 1000
_DEAD_RATIO = 4
#: A lock taken with a wait logs who holds it this often.
_WAIT_REPORT_SECONDS = 10.0


def _process_state(pid: int) -> str | None:
    """The process's state letter (``Z``: exited, not reaped), None when no process has the pid."""
    fields = proc_stat(pid)
    if fields is not None:
        return fields[0]
    try:
        os.kill(pid, 0)  # no /proc: alive or not, without the state
    except ProcessLookupError:
        return None
    except OSError:
        pass
    return "?"


def _parent_of(pid: int) -> int | None:
    fields = proc_stat(pid)
    return None if fields is None else int(fields[1])


class SpoolLockedError(RuntimeError):
    """Another process (or another AlertHooks) already uses this spool directory."""


class SpoolLock:
    """An exclusive lock on a spool directory: two writers would re-send and compact each other's entries.

    The holder writes who it is into the lock file, so a process that waits for it, or is refused, can
    say which process holds the spool."""

    def __init__(self, directory: Path, wait_seconds: float = 0.0, parent_pid: int | None = None) -> None:
        """``wait_seconds``: how long to wait for a holder to let go (a driver replacing one its cluster
        just killed: the old process exits once its JVM is gone, which a loaded host can delay by tens
        of seconds) before ``SpoolLockedError``. ``parent_pid``: the process this holder must not outlive
        (a driver's spark-submit JVM, ``streaming.orphan``); a later waiter ends a holder still running
        once that process is gone."""
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "lock"
        self._file: IO[str] | None = open(self.path, "a+")  # noqa: SIM115 - held until release()
        started = time.monotonic()
        deadline = started + wait_seconds
        next_report = started + _WAIT_REPORT_SECONDS
        while True:
            try:
                fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                orphan = self._orphaned_holder()
                if orphan is not None:
                    # Its JVM is gone, so nothing it does can still reach Spark; it should have exited
                    # (``streaming.orphan``) and holds the spool from the driver that replaces it.
                    log.warning(
                        "alert spool %s: its holder (%s) outlived the process it ran under; ending it",
                        directory,
                        self.holder(),
                    )
                    with contextlib.suppress(OSError):
                        os.kill(orphan, signal.SIGKILL)
                    time.sleep(0.2)
                    continue
                if self._holder_is_gone():
                    # The process that took the lock has exited, yet the lock is held: a process it
                    # forked kept the open file (flock locks belong to it, not to a pid). No spool
                    # writer is left; a fresh lock file takes over, and the leftover holds a dead one.
                    log.warning(
                        "alert spool %s: its holder (%s) has exited; taking the lock over",
                        directory,
                        self.holder(),
                    )
                    self._file.close()
                    self.path.unlink(missing_ok=True)
                    self._file = open(self.path, "a+")  # noqa: SIM115 - held until release()
                    continue
                now = time.monotonic()
                if now < deadline:
                    if now >= next_report:
                        next_report = now + _WAIT_REPORT_SECONDS
                        log.warning(
                            "alert spool %s is held by %s: waited %.0f s, waiting up to %.0f s more",
                            directory,
                            self.holder(),
                            now - started,
                            deadline - now,
                        )
                    time.sleep(0.2)
                    continue
                holder = self.holder()
                self._file.close()
                self._file = None
                raise SpoolLockedError(
                    f"alert spool {directory} is in use by another process ({holder})"
                ) from exc
        self._file.truncate(0)
        under = "" if parent_pid is None else f" under {parent_pid}"
        self._file.write(f"pid {os.getpid()} on {socket.gethostname()}{under}\n")
        self._file.flush()

    def _holder_pids(self) -> tuple[int, int | None] | None:
        """The holder's pid and the pid it runs under, when it wrote them on this host."""
        words = self.holder().split()
        if len(words) not in (4, 6) or words[:3:2] != ["pid", "on"] or not words[1].isdigit():
            return None
        if words[3] != socket.gethostname():
            return None
        if len(words) == 6:
            if words[4] != "under" or not words[5].isdigit():
                return None
            return int(words[1]), int(words[5])
        return int(words[1]), None

    def _holder_is_gone(self) -> bool:
        """Whether the holder wrote this host's name and a pid no process runs as any more."""
        pids = self._holder_pids()
        return pids is not None and _process_state(pids[0]) in (None, "Z", "X")

    def _orphaned_holder(self) -> int | None:
        """The holder's pid when it still runs but the process it ran under is gone (it was
        reparented): a driver whose JVM its cluster killed, stuck instead of exiting."""
        pids = self._holder_pids()
        if pids is None:
            return None
        pid, parent = pids
        if (
            parent is None
            or _process_state(pid) in (None, "Z", "X")
            or _process_state(parent) not in (None, "Z", "X")
        ):
            return None
        return pid if _parent_of(pid) != parent else None

    def holder(self) -> str:
        """Who holds the lock, as the holder wrote it."""
        try:
            return self.path.read_text().strip() or "a process that did not say"
        except OSError:
            return "a process that did not say"

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    def __init__(self, path: Path, durable: frozenset[str] = frozenset()) -> None:
        self.path = path
        self.durable = durable
        self.contents: Contents = {}
        self.lines = 0
        #: Lines skipped on open (torn or corrupt): reported, never fatal.
        self.bad_lines = 0
        self._file: IO[str] | None = None

    def open(self) -> Contents:
        """Read the journal, rewrite it compacted, and keep it open for appends. Returns its contents."""
        if self.path.exists():
            with open(self.path, encoding="utf-8", errors="replace") as journal:
                for number, line in enumerate(journal, 1):
                    self._replay(line, number)
        if self.bad_lines:
            log.warning("alert spool %s: skipped %d unreadable line(s)", self.path, self.bad_lines)
        self._rewrite()
        return self.contents

    def _replay(self, line: str, number: int) -> None:
        if not line.strip():
            return
        try:
            entry = json.loads(line)
            namespace, key, value = entry["ns"], entry["key"], entry.get("value")
            if not isinstance(namespace, str) or not isinstance(key, str):
                raise TypeError("ns and key must be strings")
        except (ValueError, KeyError, TypeError) as exc:
            self.bad_lines += 1
            log.debug("alert spool %s line %d: %s", self.path, number, exc)
            return
        self._apply_memory(SpoolOp(namespace, key, value))

    def _apply_memory(self, op: SpoolOp) -> None:
        space = self.contents.setdefault(op.namespace, {})
        if op.value is None:
            space.pop(op.key, None)
        else:
            space[op.key] = op.value

    @property
    def live(self) -> int:
        return sum(len(space) for space in self.contents.values())

    def _rewrite(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        with open(temporary, "w", encoding="utf-8") as out:
            for namespace, space in self.contents.items():
                for key, value in space.items():
                    out.write(_line(SpoolOp(namespace, key, value)))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)
        _fsync_dir(self.path.parent)
        self.lines = self.live
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for appends

    def write(self, ops: Sequence[SpoolOp]) -> None:
        """Append ``ops``. Raises OSError (disk full, ...): the caller counts and logs it."""
        if not ops or self._file is None:
            return
        for op in ops:
            self._apply_memory(op)
        self._file.write("".join(_line(op) for op in ops))
        self._file.flush()
        if any(op.value is not None and op.namespace in self.durable for op in ops):
            os.fsync(self._file.fileno())
        self.lines += len(ops)
        if self.lines >= _COMPACT_MIN_LINES and self.lines > _DEAD_RATIO * self.live:
            self._rewrite()

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


def _line(op: SpoolOp) -> str:
    entry: dict[str, Any] = {"ns": op.namespace, "key": op.key}
    if op.value is not None:
        entry["value"] = op.value
    return json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n"
