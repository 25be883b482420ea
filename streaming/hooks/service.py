"""``AlertHooks``: the one object the streaming job (on the Spark driver) and the Airflow DAGs use.

``publish`` hands alerts to every configured hook and returns at once; each hook delivers from its own
thread (``HookWorker``), with its own spool file, pacing and retries, so a dead receiver only ever
delays itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from checks.alerts import Alert
from kpconfig.model import HookConfig, KpmonConfig
from streaming.hooks.core import ACTIVE, PENDING, Batch, DeliveryCore, Result
from streaming.hooks.factory import build_sender
from streaming.hooks.formatters import AlertDict, InvalidAlert, alert_payload
from streaming.hooks.metrics import HookMetrics
from streaming.hooks.policy import policy_for
from streaming.hooks.sender import Sender, SendResult
from streaming.hooks.spool import Spool, SpoolLock

log = logging.getLogger("kpmon.alerts.hooks")

_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
#: Upper bound on one idle wait, so a wrong wake-up estimate can only delay, never hang, a hook.
_MAX_IDLE_WAIT = 30.0
#: Pause after an unexpected error in the loop itself (a bug), so it cannot spin.
_ERROR_PAUSE = 1.0

STAT_KEYS = ("delivered", "failed_attempts", "retried", "dropped", "pending", "suppressed")


class HookWorker:
    """One hook's thread: runs its :class:`DeliveryCore` against the real clock, its sender and its
    spool. The lock is held only around core calls and spool appends, never around network I/O, so
    ``offer`` (the caller's thread) waits at most for a local fsync, however dead the receiver is."""

    def __init__(
        self,
        name: str,
        kind: str,
        core: DeliveryCore,
        sender: Sender,
        spool: Spool | None,
        metrics: HookMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], int] = time.time_ns,
    ) -> None:
        self.name = name
        self.kind = kind
        self.core = core
        self.sender = sender
        self.spool = spool
        self.metrics = metrics
        self.clock = clock
        self.wall = wall
        self.cond = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name=f"kpmon-hook-{name}", daemon=True)
        metrics.register_hook(name, kind)

    # ----- caller side ---------------------------------------------------------------------------------

    def start(self) -> None:
        with self.cond:
            self._apply()
        self.thread.start()

    def offer(self, alerts: Sequence[AlertDict]) -> None:
        with self.cond:
            if self.stopping:
                self.core.count_dropped("closed", len(alerts))
                self._apply()
                return
            now, wall = self.clock(), self.wall()
            for alert in alerts:
                self.core.offer(alert, now, wall)
            self._apply()
            self.cond.notify_all()

    def count_invalid(self, count: int) -> None:
        with self.cond:
            self.core.count_dropped("invalid", count)
            self._apply()

    def wait_idle(self, deadline: float) -> bool:
        """Block until nothing is pending or in flight, or until ``deadline`` (monotonic); True if idle."""
        with self.cond:
            while not self.core.idle:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.thread.is_alive():
                    return False
                self.cond.wait(min(remaining, 0.5))
            return True

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def join(self, timeout: float) -> bool:
        if self.thread.is_alive():
            self.thread.join(max(0.0, timeout))
        return not self.thread.is_alive()

    def stats(self) -> dict[str, int]:
        with self.cond:
            totals = dict(self.core.totals)
            totals["pending"] = len(self.core.pending)
        return {key: int(totals.get(key, 0)) for key in STAT_KEYS}

    # ----- effects -------------------------------------------------------------------------------------

    def _apply(self) -> None:
        """Carry out what the core asked for. Called with the lock held."""
        effects = self.core.drain()
        if effects.spool and self.spool is not None:
            try:
                self.spool.write(effects.spool)
            except OSError as exc:
                self.metrics.spool_errors.labels(self.name, self.kind).inc()
                log.error(
                    "alert hook %s: spool write failed, pending alerts kept in memory only: %s",
                    self.name,
                    exc,
                )
        for (outcome, reason), count in effects.counts.items():
            self.metrics.alerts.labels(self.name, self.kind, outcome, reason).inc(count)
        for result, count in effects.requests.items():
            self.metrics.requests.labels(self.name, self.kind, result).inc(count)
        histogram = self.metrics.latency.labels(self.name, self.kind)
        for seconds in effects.latencies:
            histogram.observe(seconds)
        for level, message in effects.notes:
            log.log(_LEVELS.get(level, logging.WARNING), "alert hook %s: %s", self.name, message)
        self.metrics.pending.labels(self.name, self.kind).set(len(self.core.pending))

    # ----- the thread ----------------------------------------------------------------------------------

    def _next_batch(self) -> Batch | None:
        """Wait for a batch to send; None when stopping."""
        with self.cond:
            while not self.stopping:
                now, wall = self.clock(), self.wall()
                batch = self.core.take(now, wall)
                self._apply()
                if batch is not None:
                    return batch
                wake = self.core.wakeup(now, wall)
                wait = _MAX_IDLE_WAIT if wake is None else min(_MAX_IDLE_WAIT, max(0.0, wake - now))
                # A zero wait would spin if the estimate is off by rounding; 1 ms costs nothing.
                self.cond.wait(max(wait, 0.001))
            return None

    def _send(self, batch: Batch) -> SendResult:
        try:
            return self.sender.send(batch.alerts)
        except Exception as exc:
            # Senders report delivery problems as results; an exception is a bug (say, in rendering this
            # alert), and re-sending the same alert would hit it again: a rejection, retried a few times.
            log.exception("alert hook %s: sender failed", self.name)
            return SendResult.all(Result.PERMANENT, len(batch.keys), f"{type(exc).__name__}: {exc}")

    def _run(self) -> None:
        try:
            while True:
                try:
                    batch = self._next_batch()
                    if batch is None:
                        return
                    sent = self._send(batch)
                    with self.cond:
                        self.core.complete(
                            batch,
                            sent.results,
                            self.clock(),
                            self.wall(),
                            error=sent.error,
                            retry_after=sent.retry_after,
                        )
                        self._apply()
                        self.cond.notify_all()
                except Exception:
                    log.exception("alert hook %s: unexpected error; continuing", self.name)
                    with self.cond:
                        self.core.abandon_in_flight()
                        self.cond.wait(_ERROR_PAUSE)
        finally:
            try:
                self.sender.close()
            except Exception:
                log.exception("alert hook %s: closing the sender failed", self.name)
            with self.cond:
                if self.spool is not None:
                    self.spool.close()
                self.cond.notify_all()


def _restorable(contents: dict[str, dict[str, dict[str, object]]], path: Path) -> None:
    """Drop spooled deliveries that no longer validate (hand-edited, or from an older format)."""
    pending = contents.get(PENDING, {})
    for key in list(pending):
        entry = pending[key]
        try:
            entry["alert"] = alert_payload(entry["alert"])
            int(entry["created_ns"])  # type: ignore[call-overload]
        except (InvalidAlert, KeyError, TypeError, ValueError) as exc:
            log.warning("alert spool %s: skipping unreadable delivery %s: %s", path, key, exc)
            del pending[key]


class AlertHooks:
    """Deliver alerts to the hooks in ``config.alerts.hooks``; pending deliveries persist in ``spool_dir``.

    One instance per spool directory (it is locked: :class:`~streaming.hooks.spool.SpoolLockedError`).
    """

    def __init__(
        self,
        config: KpmonConfig,
        spool_dir: Path,
        registry: CollectorRegistry | None = None,
        lock_wait_seconds: float = 0.0,
        lock_parent_pid: int | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = HookMetrics(self.registry)
        self.spool_dir = Path(spool_dir)
        self._lock = SpoolLock(self.spool_dir, lock_wait_seconds, lock_parent_pid)
        self._closed = False
        self.workers: list[HookWorker] = []
        try:
            for hook in config.alerts.hooks:
                self.workers.append(self._worker(hook, config))
        except BaseException:
            self._lock.release()
            raise
        for worker in self.workers:
            worker.start()

    def _worker(self, hook: HookConfig, config: KpmonConfig) -> HookWorker:
        policy = policy_for(hook)
        core = DeliveryCore(policy)
        spool: Spool | None = None
        if policy.spooled:
            spool = Spool(self.spool_dir / f"{hook.hook_name}.jsonl", durable=frozenset({PENDING, ACTIVE}))
            contents = spool.open()
            _restorable(contents, spool.path)
            core.restore(contents, time.monotonic())
            if core.pending:
                log.info("alert hook %s: %d spooled deliveries to re-send", hook.hook_name, len(core.pending))
        return HookWorker(hook.hook_name, hook.kind, core, build_sender(hook, config), spool, self.metrics)

    def publish(self, alerts: Sequence[Alert]) -> None:
        """Queue ``alerts`` on every hook. Never blocks on the network; never raises for delivery problems
        (an alert that does not follow the contract is logged and counted as dropped)."""
        payloads: list[AlertDict] = []
        invalid = 0
        for alert in alerts:
            try:
                payloads.append(alert_payload(alert))
            except InvalidAlert as exc:
                invalid += 1
                log.error("alert hooks: not delivering an invalid alert: %s", exc)
        for worker in self.workers:
            try:
                if invalid:
                    worker.count_invalid(invalid)
                if payloads:
                    worker.offer(payloads)
            except Exception:
                log.exception("alert hook %s: could not queue %d alert(s)", worker.name, len(payloads))

    def flush(self, timeout: float) -> bool:
        """Wait until no hook has anything pending or in flight; False if ``timeout`` ran out first."""
        deadline = time.monotonic() + timeout
        return all([worker.wait_idle(deadline) for worker in self.workers])

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what can be delivered within ``timeout``, then stop. Whatever is still pending stays in
        the spool for the next start."""
        if self._closed:
            return
        deadline = time.monotonic() + timeout
        if not self.flush(timeout):
            for name, stats in self.stats().items():
                if stats["pending"]:
                    log.warning("alert hook %s: %d deliveries left in the spool", name, stats["pending"])
        for worker in self.workers:
            worker.stop()
        stuck = [w.name for w in self.workers if not w.join(max(0.1, deadline - time.monotonic()))]
        if stuck:
            # Daemon threads: they end with their current request; they cannot hold the process.
            log.warning("alert hooks %s still in a request at close", ", ".join(stuck))
        self._lock.release()
        self._closed = True

    def stats(self) -> dict[str, dict[str, int]]:
        """Per hook name: delivered, failed_attempts, retried, dropped, pending, suppressed."""
        return {worker.name: worker.stats() for worker in self.workers}

    def __enter__(self) -> AlertHooks:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
