"""``AlertHooks``: the one object the streaming job (on the Spark driver) and the Airflow DAGs use.

``publish`` hands alerts to every configured hook and returns at once; each hook delivers from its own
thread, with its own spool file, pacing and retries, so a dead receiver only ever delays itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from checks.alerts import Alert
from kpconfig.model import HookConfig, KpmonConfig
from streaming.hooks.core import ACTIVE, PENDING, DeliveryCore
from streaming.hooks.factory import build_sender
from streaming.hooks.formatters import AlertDict, InvalidAlert, alert_payload
from streaming.hooks.metrics import HookMetrics
from streaming.hooks.policy import policy_for
from streaming.hooks.spool import Spool, SpoolLock
from streaming.hooks.worker import HookWorker

log = logging.getLogger("kpmon.alerts.hooks")


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
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = HookMetrics(self.registry)
        self.spool_dir = Path(spool_dir)
        self._lock = SpoolLock(self.spool_dir, lock_wait_seconds)
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
