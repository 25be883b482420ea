"""Demo traffic for ``kpmon run``: real clients through the tap, so the monitor has something to watch.

Three background threads:
- a steady clean workload (``workload.clean_round`` in a loop, with a pause between rounds);
- one catalogue violation made to happen for real every ``every`` seconds, rotating through
  ``SCENARIOS`` (the schedule is ``DemoSchedule``, pure);
- a consumer that keeps polling a quiet topic through the tap, as every live cluster has one: its
  Fetch long-polls keep the tap topic's event time, and so Spark's watermark, moving between rounds.
  It never reads the tap topic itself through the tap: each read would be mirrored into it again.

A failing step is reported and counted, and the demo carries on.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEMO_TOPIC = "kpmon-demo"
DEMO_GROUP = "kpmon-demo-group"
QUIET_TOPIC = "kpmon-demo-quiet"


@dataclass(frozen=True)
class Scenario:
    name: str
    label: str
    #: The rules the streaming job should raise alerts for.
    expect: tuple[str, ...]


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("zombie_producer", "zombie producer", ("producer.stale_epoch_rejected",)),
    Scenario("mixed_protocol_group", "mixed-protocol group", ("group.protocol_type_mismatch",)),
    # InitProducerId and Fetch v3 lie outside what a 4.x broker advertises; Produce v2 it still
    # advertises (KAFKA-18659), but closes the connection on (KIP-896).
    Scenario(
        "out_of_range_versions",
        "out-of-range versions",
        ("apiversions.out_of_range", "apiversions.removed_version_rejected"),
    ),
    Scenario("envelope_from_client", "Envelope from a client", ("envelope.untrusted_source",)),
    Scenario("malformed_frame", "malformed frame", ("frame.decode_error",)),
)


@dataclass(frozen=True)
class DemoSchedule:
    """When each violation is due, in seconds from the demo's start, and which one.

    The first comes after ``first_after`` (default: half a period, at most 20 s, so the first alert does
    not wait a whole period), then one per ``every``. A step that overruns its slot delays the next one
    rather than making a burst: the next slot is never earlier than the end of the previous step.
    """

    every: float
    first_after: float | None = None
    scenarios: tuple[Scenario, ...] = SCENARIOS

    def __post_init__(self) -> None:
        if self.every <= 0:
            raise ValueError("the violation period must be positive")
        if not self.scenarios:
            raise ValueError("no scenarios to rotate through")

    @property
    def first(self) -> float:
        return self.first_after if self.first_after is not None else min(self.every / 2, 20.0)

    def scenario(self, done: int) -> Scenario:
        return self.scenarios[done % len(self.scenarios)]

    def due_at(self, done: int, previous_end: float | None = None) -> float:
        """When the next violation is due after ``done`` of them, the last having ended at ``previous_end``."""
        slot = self.first + done * self.every
        return slot if previous_end is None else max(slot, previous_end)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def perform(scenario: Scenario, bootstrap: str) -> tuple[str, dict[str, Any]]:
    """Run one violation against ``bootstrap``; (what was targeted, what the scenario reported)."""
    from kpmon.traffic import violations

    if scenario.name == "zombie_producer":
        txn = unique("tx")
        return txn, violations.zombie_producer(bootstrap, f"{DEMO_TOPIC}-zombie", txn)
    if scenario.name == "mixed_protocol_group":
        group = unique("mixed")
        return group, violations.mixed_protocol_group(bootstrap, group, f"{DEMO_TOPIC}-mixed")
    if scenario.name == "out_of_range_versions":
        return "raw client", violations.out_of_range_versions(bootstrap)
    if scenario.name == "envelope_from_client":
        return "raw client", violations.envelope_from_client(bootstrap)
    if scenario.name == "malformed_frame":
        return "raw client", violations.malformed_frame(bootstrap)
    raise ValueError(f"unknown scenario {scenario.name!r}")


@dataclass
class DemoStats:
    clean_rounds: int = 0
    violations: list[str] = field(default_factory=list)
    failures: int = 0


class DemoTraffic:
    def __init__(
        self,
        bootstrap: str,
        schedule: DemoSchedule | None,
        say: Callable[[str], None],
        clean_pause: float = 10.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.schedule = schedule
        self.say = say
        self.clean_pause = clean_pause
        self.stats = DemoStats()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._guarded, args=(self._keep_polling,), name="demo-keepalive", daemon=True
            ),
            threading.Thread(target=self._guarded, args=(self._clean_loop,), name="demo-clean", daemon=True),
        ]
        if schedule is not None:
            self._threads.append(
                threading.Thread(
                    target=self._guarded, args=(self._violations,), name="demo-violations", daemon=True
                )
            )

    def start(self) -> DemoTraffic:
        from kpmon.traffic.workload import create_topic

        create_topic(self.bootstrap, QUIET_TOPIC)
        self._started = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float = 60.0) -> bool:
        """Ask every thread to stop after its current step; True when all ended within ``timeout``."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread.is_alive():
                thread.join(max(deadline - time.monotonic(), 0.0))
        return not any(thread.is_alive() for thread in self._threads)

    def _guarded(self, body: Callable[[], None]) -> None:
        try:
            body()
        except Exception as exc:  # a dead demo thread must be said, never crash the run
            self.stats.failures += 1
            self.say(f"demo: {threading.current_thread().name} stopped: {exc}")

    def _clean_loop(self) -> None:
        from kpmon.traffic.workload import clean_round

        while not self._stop.is_set():
            try:
                clean_round(self.bootstrap, DEMO_TOPIC, DEMO_GROUP)
                self.stats.clean_rounds += 1
                if self.stats.clean_rounds == 1:
                    self.say(
                        "demo: clean workload running (idempotent and transactional producers, a consumer "
                        f"group, kafka-python), one round every ~{self.clean_pause:.0f} s"
                    )
            except Exception as exc:  # the broker restarting, a timeout: say it and try the next round
                self.stats.failures += 1
                self.say(f"demo: clean round failed: {exc}")
            self._stop.wait(self.clean_pause)

    def _violations(self) -> None:
        assert self.schedule is not None
        done = 0
        previous_end: float | None = None
        while True:
            due = self.schedule.due_at(done, previous_end)
            if self._stop.wait(max(due - (time.monotonic() - self._started), 0.0)):
                return
            scenario = self.schedule.scenario(done)
            started = time.monotonic()
            try:
                target, outcome = perform(scenario, self.bootstrap)
            except Exception as exc:
                self.stats.failures += 1
                self.say(f"demo: {scenario.label} failed: {exc}")
            else:
                self.stats.violations.append(scenario.name)
                detail = ", ".join(
                    f"{k} {v}"
                    for k, v in outcome.items()
                    if k not in ("scenario", "transactional_id", "group")
                )
                self.say(
                    f"demo: {scenario.label} ({target}) done in {time.monotonic() - started:.1f} s "
                    f"[{detail}] - expect {', '.join(scenario.expect)}"
                )
            done += 1
            previous_end = time.monotonic() - self._started

    def _keep_polling(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": unique("kpmon-demo-keepalive"),
                "client.id": "kpmon-demo-keepalive",
                "fetch.wait.max.ms": 300,
                "topic.metadata.refresh.interval.ms": 2000,
            }
        )
        consumer.subscribe([QUIET_TOPIC])
        try:
            while not self._stop.is_set():
                consumer.poll(0.3)
        finally:
            consumer.close()
